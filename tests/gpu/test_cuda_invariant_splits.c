/*
 * test_cuda_invariant_splits.c — batch-invariant mode's split count on the default wgmma rows
 * (qmm_cuda_wgmma_invariant_splits, docs/kernels.md §11), checked on the host, so it runs wherever the CUDA backend
 * is built, GPU or not. The count is part of the mode's bits: a change to the model that picks it (the costs in
 * cuda_backend.c) changes the mode's outputs for the same weights on the same device, so the documented counts are
 * pinned here, and the rules every count must keep are checked over a grid of shapes and SM counts.
 */
#include "check.h"
#include "cuda_internal.h"

#include <stddef.h>

/* The counts cuda_backend.c documents for 132 SMs (the H200), 4-bit, N × K as in bench/shapes; and the test_cuda
 * product's (N = 1000, K = 2048 and 2112) on other SM counts, which test_cuda's comments rely on. */
static void test_documented(void) {
    static const struct {
        size_t N, K;
        int sms, splits;
    } cases[] = {
        {5120, 5120, 132, 3},   {5120, 14336, 132, 3},  {5120, 17408, 132, 3},  {4096, 12288, 132, 4},
        {1024, 4096, 132, 4},   {1024, 5120, 132, 4},   {768, 2048, 132, 4},    {1000, 2048, 132, 4},
        {4096, 4096, 132, 2},   {14336, 5120, 132, 1},  {12288, 4096, 132, 1},  {17408, 5120, 132, 1},
        {27648, 5120, 132, 1},  {2048, 768, 132, 1},    {1000, 2112, 132, 4},   {1000, 2048, 78, 2},
        {1000, 2048, 95, 2},    {1000, 2048, 96, 3},    {1000, 2048, 127, 3},   {1000, 2048, 128, 4},
        {1000, 2112, 78, 2},    {1000, 2112, 114, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int got = qmm_cuda_wgmma_invariant_splits(cases[i].N, cases[i].K, 4, cases[i].sms);
        CHECK(got == cases[i].splits, "N=%zu K=%zu 4-bit on %d SMs: %d splits, documented %d", cases[i].N, cases[i].K,
              cases[i].sms, got, cases[i].splits);
    }
}

/* Every count: 1 … 8 (a cluster's most), each split at least 4 super-blocks of K, and few enough splits that one row
 * of 128-token tiles fits the split-K workspace (the way wgmma_invariant_run takes where no cluster runs:
 * QMM_TILE_PARTIAL_FLOATS, 128 × 128 a tile and split). */
static void test_rules(void) {
    static const size_t ns[] = {1, 128, 1000, 4096, 5120, 14336, 27648, 65536};
    static const size_t ks[] = {64, 256, 768, 2048, 2112, 5120, 14336, 32768};
    static const int sms_list[] = {1, 16, 78, 114, 132, 144, 200};
    static const int bits_list[] = {2, 3, 4, 5, 6, 8};
    size_t bad = 0, cases = 0;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++)
            for (size_t c = 0; c < sizeof sms_list / sizeof sms_list[0]; c++)
                for (size_t d = 0; d < sizeof bits_list / sizeof bits_list[0]; d++) {
                    const size_t N = ns[a], K = ks[b];
                    const int bits = bits_list[d], splits = qmm_cuda_wgmma_invariant_splits(N, K, bits, sms_list[c]);
                    const size_t super_blocks = qmm_cuda_packed_words_per_row(K, bits) / 16, row_tiles = (N + 127) / 128;
                    const bool ok = splits >= 1 && splits <= 8 &&
                                    (splits == 1 || (super_blocks / (size_t)splits >= 4 &&
                                                     row_tiles * (size_t)splits * 128 * 128 <= QMM_TILE_PARTIAL_FLOATS));
                    cases++;
                    if (!ok && bad++ < 5)
                        CHECK(false, "N=%zu K=%zu %d-bit on %d SMs: %d splits (%zu super-blocks, %zu row tiles)", N, K,
                              bits, sms_list[c], splits, super_blocks, row_tiles);
                }
    CHECK(bad == 0, "%zu of %zu shapes break the split count's rules", bad, cases);
}

int main(void) {
    test_documented();
    test_rules();
    return check_finish("test_cuda_invariant_splits");
}
