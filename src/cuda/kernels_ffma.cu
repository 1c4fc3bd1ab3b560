/*
 * kernels_ffma.cu — the ffma_gemv family: f32 activations (x, scales, biases and out in f32) with 4- and
 * 8-bit weights, on the CUDA cores (docs/kernels.md §9.4). The tensor cores multiply f16/bf16 only, and the
 * generic kernel (the oracle's order, one thread per output, uncoalesced) is 100× slower than the HBM floor;
 * this kernel reads the MLX layout as it is (no repacking), coalesced, each weight byte once (decode measured
 * at 2.4–4.0× the floor on the H200, docs/PERF.md).
 *
 * A warp owns RPW = 4 weight rows; lane l takes the 16-byte words (quads: 32 codes at 4 bits, 16 at 8)
 * l, l + 32, l + 64, … of each row, so the warp's loads of a row are contiguous and every weight byte is
 * read once, the next quad of each row in flight while one is decoded. A quad never crosses a group (groups are ≥ 32
 * codes, aligned). Per code: the code to f32 exactly (byte permute into the mantissa of 2^23, minus 2^23),
 * ŵ = fma(s, q, b) (one rounding), then acc[m] = fma(ŵ, x[m, k], acc[m]) for the MT rows of x of the block
 * (grid.y walks M in chunks of MT): the direct form, each x value loaded once per warp for its 4 rows. The
 * lanes' sums meet in a butterfly of shuffles (a fixed order), lane 0 stores.
 *
 * Exactness (docs/kernels.md §2, §6): every operation is an f32 FMA or add rounded to nearest; an output's
 * terms pass through at most K/32 + 32 (the lane's chain) + 1 (ŵ) + 5 (the butterfly) ≤ K + 2 roundings
 * for K ≥ 32, inside the one bound every kernel meets. A non-finite sum is recomputed in the direct form in
 * f64 (direct_output_t), as everywhere.
 */
#include "cuda_internal.h"
#include "mma_common.cuh"

#define FFMA_WARPS 4 /* warps per block */
#define FFMA_RPW 4   /* weight rows per warp */
#define FFMA_U 1     /* quads of each row per round; the next round is in flight while one is decoded */

/* Byte c (0..3) of `bytes` (a code ≤ 255) as an exact f32: the byte permuted into the low mantissa byte of
 * 2^23 (0x4B0000cc = 2^23 + code), minus 2^23. One PRMT and one FADD. */
__device__ __forceinline__ float code_from_byte(uint32_t bytes, int c) {
    const uint32_t bits = __byte_perm(bytes, 0x4Bu, (uint32_t)(0x4550 | c)); /* bytes: [c], 0, 0, 0x4B */
    return __uint_as_float(bits) - 8388608.0f;
}

template <int BITS, int MT>
__global__ void __launch_bounds__(FFMA_WARPS * 32)
    ffma_gemv_kernel(const float *__restrict__ x, const uint4 *__restrict__ w, const float *__restrict__ scales,
                     const float *__restrict__ biases, float *__restrict__ out, int M, int N, int K, int group_shift) {
    constexpr int CPQ = 128 / BITS; /* codes per quad */
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n0 = (blockIdx.x * FFMA_WARPS + warp) * FFMA_RPW, m0 = blockIdx.y * MT;
    const int quads = K / CPQ, groups = K >> group_shift;
    const uint4 *row[FFMA_RPW];
    const float *s_row[FFMA_RPW], *b_row[FFMA_RPW];
#pragma unroll
    for (int r = 0; r < FFMA_RPW; r++) { /* rows past N read row N − 1 (valid memory) and are not stored */
        const size_t n = (size_t)min(n0 + r, N - 1);
        row[r] = w + n * (size_t)quads;
        s_row[r] = scales + n * (size_t)groups;
        b_row[r] = biases + n * (size_t)groups;
    }
    const float *x_row[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) x_row[m] = x + (size_t)min(m0 + m, M - 1) * (size_t)K; /* past M: not stored */

    float acc[FFMA_RPW][MT];
#pragma unroll
    for (int r = 0; r < FFMA_RPW; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) acc[r][m] = 0.0f;

    /* Software pipeline: the next round's quads are loaded before this round's are decoded, so a warp waits
     * for HBM once at the start instead of once per round (the warps of an SM otherwise start together, load
     * together and stall together). */
    uint4 next[FFMA_U][FFMA_RPW];
    auto load_round = [&](int i0, uint4 (&dst)[FFMA_U][FFMA_RPW]) {
#pragma unroll
        for (int u = 0; u < FFMA_U; u++)
#pragma unroll
            for (int r = 0; r < FFMA_RPW; r++)
                dst[u][r] = i0 + 32 * u < quads ? __ldcs(row[r] + i0 + 32 * u) : make_uint4(0, 0, 0, 0);
    };
    load_round(lane, next);
    pdl_wait(); /* x and out may belong to the kernel before this one (the first weights are in flight) */
    for (int i0 = lane; i0 < quads; i0 += 32 * FFMA_U) {
        uint4 q[FFMA_U][FFMA_RPW];
#pragma unroll
        for (int u = 0; u < FFMA_U; u++)
#pragma unroll
            for (int r = 0; r < FFMA_RPW; r++) q[u][r] = next[u][r];
        load_round(i0 + 32 * FFMA_U, next);
#pragma unroll
        for (int u = 0; u < FFMA_U; u++) {
            const int i = i0 + 32 * u;
            if (i >= quads) break;
            const int k0 = i * CPQ, g = k0 >> group_shift;
            float s[FFMA_RPW], b[FFMA_RPW];
#pragma unroll
            for (int r = 0; r < FFMA_RPW; r++) s[r] = __ldg(s_row[r] + g), b[r] = __ldg(b_row[r] + g);
#pragma unroll
            for (int j = 0; j < CPQ / 4; j++) { /* codes k0 + 4j … k0 + 4j + 3 */
                float wv[FFMA_RPW][4];
#pragma unroll
                for (int r = 0; r < FFMA_RPW; r++) {
                    const uint32_t words[4] = {q[u][r].x, q[u][r].y, q[u][r].z, q[u][r].w};
                    float c0, c1, c2, c3;
                    if (BITS == 8) { /* word j holds codes 4j … 4j + 3, a byte each */
                        c0 = code_from_byte(words[j & 3], 0), c1 = code_from_byte(words[j & 3], 1);
                        c2 = code_from_byte(words[j & 3], 2), c3 = code_from_byte(words[j & 3], 3);
                    } else { /* word j/2 holds codes 8(j/2) … + 7 as nibbles: even codes in lo's bytes, odd in hi's */
                        const uint32_t lo = words[j >> 1] & 0x0F0F0F0Fu, hi = (words[j >> 1] >> 4) & 0x0F0F0F0Fu;
                        const int at = 2 * (j & 1);
                        c0 = code_from_byte(lo, at), c1 = code_from_byte(hi, at);
                        c2 = code_from_byte(lo, at + 1), c3 = code_from_byte(hi, at + 1);
                    }
                    wv[r][0] = __fmaf_rn(s[r], c0, b[r]);
                    wv[r][1] = __fmaf_rn(s[r], c1, b[r]);
                    wv[r][2] = __fmaf_rn(s[r], c2, b[r]);
                    wv[r][3] = __fmaf_rn(s[r], c3, b[r]);
                }
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const float4 xv = __ldg(reinterpret_cast<const float4 *>(x_row[m] + k0) + j);
#pragma unroll
                    for (int r = 0; r < FFMA_RPW; r++) {
                        acc[r][m] = __fmaf_rn(wv[r][0], xv.x, acc[r][m]);
                        acc[r][m] = __fmaf_rn(wv[r][1], xv.y, acc[r][m]);
                        acc[r][m] = __fmaf_rn(wv[r][2], xv.z, acc[r][m]);
                        acc[r][m] = __fmaf_rn(wv[r][3], xv.w, acc[r][m]);
                    }
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < FFMA_RPW; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) {
            float v = acc[r][m];
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
            acc[r][m] = v;
        }
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < FFMA_RPW; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const int n = n0 + r, mm = m0 + m;
            if (n >= N || mm >= M) continue;
            float v = acc[r][m];
            if (!isfinite(v))
                v = direct_output_t(x + (size_t)mm * K, reinterpret_cast<const uint32_t *>(w) + (size_t)n * (K / 32 * BITS),
                                    scales + (size_t)n * groups, biases + (size_t)n * groups, BITS, (size_t)K,
                                    1 << group_shift);
            out[(size_t)mm * N + n] = v;
        }
}

template <int BITS, int MT> static int launch_ffma(const qmm_cuda_launch *c) {
    int group_shift = 0;
    while ((1 << group_shift) < c->group_size) group_shift++;
    const unsigned rows_per_block = FFMA_WARPS * FFMA_RPW;
    const dim3 grid((unsigned)((c->N + rows_per_block - 1) / rows_per_block), (unsigned)((c->M + MT - 1) / MT));
    return launch_kernel(ffma_gemv_kernel<BITS, MT>, grid, dim3(FFMA_WARPS * 32), 0, c->stream, c->pdl != 0, (const float *)c->x,
                         (const uint4 *)c->w, (const float *)c->scales, (const float *)c->biases, (float *)c->out, (int)c->M,
                         (int)c->N, (int)c->K, group_shift);
}

template <int BITS> static int dispatch_ffma(const qmm_cuda_launch *c) {
    if (c->M <= 1) return launch_ffma<BITS, 1>(c);
    if (c->M <= 2) return launch_ffma<BITS, 2>(c);
    if (c->M <= 4) return launch_ffma<BITS, 4>(c);
    return launch_ffma<BITS, 8>(c);
}

extern "C" int qmm_cuda_ffma_gemv_qmm_t(const qmm_cuda_launch *c) {
    return c->bits == 4 ? dispatch_ffma<4>(c) : dispatch_ffma<8>(c);
}
