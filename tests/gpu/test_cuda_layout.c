/*
 * test_cuda_layout.c — the repacked layouts the CUDA tensor-core kernels read (docs/kernels.md §9.1), checked on
 * the host, so it runs wherever the CUDA backend is built, GPU or not: qmm_cuda_repack's weights in tiles of 16
 * rows and qmm_cuda_repack_sb's (scale, bias) pairs, each against an independent reading of the documented
 * layout — every word of a row lands in the 16 bytes the kernels load for it, rows past N and the tail of K
 * are zero, and nothing is written past the allocation the backend makes.
 */
#include "check.h"
#include "cuda_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GUARD_WORDS 64u
#define POISON 0xDEADBEEFu

/* Word w of quarter t of super-block s of row n in the documented layout (docs/kernels.md §9.1): [ceil(N/16) row
 * tiles][super-blocks][16 rows][4 quarters][4 words]. */
static size_t tiled_word(size_t n, size_t super_blocks, size_t s, size_t t, size_t w) {
    return (((n / 16) * super_blocks + s) * 16 + n % 16) * 16 + 4 * t + w;
}

/* What the kernels expect there: 4-bit, quarter t = word t of each of the super-block's 4 blocks; 8-bit, quarter
 * t = words 2t, 2t+1 of each of its 2 blocks; zero past K. mlx: row n of the MLX-layout words. */
static uint32_t expected_word(const uint32_t *mlx, size_t K, int bits, size_t s, size_t t, size_t w) {
    const size_t blocks_per_super = bits == 4 ? 4 : 2, words_per_lane = (size_t)bits / 4;
    const size_t block = s * blocks_per_super + w / words_per_lane, e = w % words_per_lane;
    if (block >= K / 32) return 0;
    return mlx[block * (size_t)bits + t * words_per_lane + e];
}

static void test_weights(check_rng *rng) {
    static const size_t ns[] = {1, 15, 16, 17, 100};
    static const size_t ks[] = {32, 64, 96, 160, 640, 1088};
    static const int bits_list[] = {4, 8};
    for (size_t b = 0; b < 2; b++)
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++) {
                const int bits = bits_list[b];
                const size_t N = ns[a], K = ks[c], words = K * (size_t)bits / 32;
                const size_t per_row = qmm_cuda_packed_words_per_row(K, bits), super_blocks = per_row / 16;
                const size_t allocated = (N + 15) / 16 * 16 * per_row; /* the backend's allocation, in words */
                uint32_t *mlx = malloc(N * words * sizeof *mlx), *out = malloc((allocated + GUARD_WORDS) * sizeof *out);
                if (!mlx || !out) {
                    CHECK(false, "out of memory");
                    free(mlx);
                    free(out);
                    return;
                }
                for (size_t i = 0; i < N * words; i++) mlx[i] = (uint32_t)check_rng_next(rng) | 1u; /* never 0 */
                for (size_t i = 0; i < allocated + GUARD_WORDS; i++) out[i] = POISON;
                qmm_cuda_repack(mlx, N, K, bits, out);
                size_t wrong = 0, nonzero_pad = 0, guard = 0;
                for (size_t n = 0; n < (N + 15) / 16 * 16; n++)
                    for (size_t s = 0; s < super_blocks; s++)
                        for (size_t t = 0; t < 4; t++)
                            for (size_t w = 0; w < 4; w++) {
                                const uint32_t got = out[tiled_word(n, super_blocks, s, t, w)];
                                if (n >= N) nonzero_pad += got != 0;
                                else wrong += got != expected_word(mlx + n * words, K, bits, s, t, w);
                            }
                for (size_t i = allocated; i < allocated + GUARD_WORDS; i++) guard += out[i] != POISON;
                CHECK(wrong == 0, "repack %d-bit N=%zu K=%zu: %zu words not where the kernels read them", bits, N, K, wrong);
                CHECK(nonzero_pad == 0, "repack %d-bit N=%zu K=%zu: %zu nonzero words in the rows past N", bits, N, K,
                      nonzero_pad);
                CHECK(guard == 0, "repack %d-bit N=%zu K=%zu: %zu words written past the allocation", bits, N, K, guard);
                free(mlx);
                free(out);
            }
}

/* The pairs: [ceil(N/16) row tiles][super-blocks][16 rows][G] pairs, G = max(1, 512/bits/group_size), the group of
 * pair i in super-block s being s·(512/bits)/group_size + i. 16-bit scales (f16/bf16): a pair is one uint32, scale
 * in the low half, bias in the high; f32: two uint32, scale then bias. */
static void test_pairs(check_rng *rng) {
    static const int bits_list[] = {4, 8}, group_sizes[] = {32, 64, 128}, scale_sizes[] = {2, 4};
    static const size_t N = 37, K = 1152;
    for (size_t b = 0; b < 2; b++)
        for (size_t g = 0; g < 3; g++)
            for (size_t z = 0; z < 2; z++) {
                const int bits = bits_list[b], group_size = group_sizes[g], size = scale_sizes[z];
                const size_t groups = K / (size_t)group_size, codes = 512 / (size_t)bits, per = (size_t)size / 2;
                const size_t super_blocks = qmm_cuda_packed_words_per_row(K, bits) / 16;
                const size_t pairs_per = codes / (size_t)group_size > 1 ? codes / (size_t)group_size : 1;
                const size_t words = qmm_cuda_sb_words(N, K, bits, group_size, size);
                /* scales and biases as raw words of the dtype's size (any bits: the repack copies them) */
                uint32_t *scales = malloc(N * groups * 4), *biases = malloc(N * groups * 4);
                uint32_t *out = malloc((words + GUARD_WORDS) * sizeof *out);
                if (!scales || !biases || !out) {
                    CHECK(false, "out of memory");
                    free(scales), free(biases), free(out);
                    return;
                }
                for (size_t i = 0; i < N * groups; i++) {
                    scales[i] = (uint32_t)check_rng_next(rng) | 1u;
                    biases[i] = (uint32_t)check_rng_next(rng) | 1u;
                }
                /* the dtype's view: uint16 or uint32 elements */
                uint16_t *scales16 = (uint16_t *)scales, *biases16 = (uint16_t *)biases;
                for (size_t i = 0; i < words + GUARD_WORDS; i++) out[i] = POISON;
                qmm_cuda_repack_sb(scales, biases, N, K, bits, group_size, size, out);
                size_t wrong = 0, guard = 0;
                CHECK(words == (N + 15) / 16 * super_blocks * 16 * pairs_per * per, "pairs %d-bit gs%d %d-byte: %zu words",
                      bits, group_size, size, words);
                for (size_t n = 0; n < (N + 15) / 16 * 16; n++)
                    for (size_t s = 0; s < super_blocks; s++)
                        for (size_t i = 0; i < pairs_per; i++) {
                            const size_t group = s * codes / (size_t)group_size + i, at = n * groups + group;
                            const bool in = n < N && group < groups;
                            const size_t first = ((((n / 16) * super_blocks + s) * 16 + n % 16) * pairs_per + i) * per;
                            if (size == 2)
                                wrong += out[first] != (in ? (uint32_t)scales16[at] | (uint32_t)biases16[at] << 16 : 0u);
                            else
                                wrong += out[first] != (in ? scales[at] : 0u) || out[first + 1] != (in ? biases[at] : 0u);
                        }
                for (size_t i = words; i < words + GUARD_WORDS; i++) guard += out[i] != POISON;
                CHECK(wrong == 0, "pairs %d-bit gs%d %d-byte N=%zu K=%zu: %zu pairs misplaced", bits, group_size, size, N,
                      K, wrong);
                CHECK(guard == 0, "pairs %d-bit gs%d %d-byte: %zu words written past the array", bits, group_size, size,
                      guard);
                free(scales), free(biases), free(out);
            }
}

int main(void) {
    check_rng rng = check_rng_make(0x1a70u);
    test_weights(&rng);
    test_pairs(&rng);
    return check_finish("test_cuda_layout");
}
