/*
 * kernels.cu — the CUDA kernels of qmm (DESIGN.md §2, docs/kernels.md §9) and their extern "C" launchers.
 *
 * Two families:
 *   generic   every format the oracle handles (bits 2–8, group 32/64/128, f32/f16/bf16, any M, N, K),
 *             plain CUDA-core f32 arithmetic, so that no valid call ever leaves the GPU.
 *   mma_gemv  decode and small M for 4- and 8-bit weights with f16/bf16 activations:
 *             the codes are decoded in registers into exact f16/bf16 values (bf16: the integers; f16: the
 *             subnormals c·2^-20 (4-bit) or c·2^-24 (8-bit), the scale carrying the power of two —
 *             mma_decode) and multiplied by x on the tensor cores (mma.sync m16n8k16, f32 accumulate),
 *             weights on the MMA's M side and the
 *             tokens on its N side (8, 16 or 32 of them per block; the 32-token tile takes larger M in chunks
 *             along grid.y). Per group the f32 result is scaled:
 *             acc = fma(s, Σq·x, fma(b, Σx, acc)), Σx from a second MMA with an all-ones A operand.
 *
 * Exactness (docs/kernels.md §2): q (≤ 255, or q·2^-20 / q·2^-24) and x are exact in f16/bf16, so every product is exact
 * and the tensor core accumulates it in f32; s·Σq·x, b·Σx and the running sum are f32 FMAs. No value is
 * ever rounded to f16/bf16 before the final store. An output whose f32 accumulator is ±inf or NaN is
 * recomputed in the direct form Σ(s·q + b)·x in f64 and rounded to f32 (the oracle's rule for non-finite
 * and near-overflow inputs, docs/kernels.md §2): rare, so it is a plain loop over K by one thread.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include <atomic>

#include "cuda_internal.h"
#include "mma_common.cuh"

/* ───────────────────────────── generic family ───────────────────────────── */

/* Rows of x per warp in the generic kernels: 8 independent f32 accumulators per lane. */
#define GENERIC_M 8
#define GENERIC_WARPS 8

/* out = x·Ŵᵀ in the oracle's arithmetic, bit for bit (qmm_ref_qmm_t): one thread per output feature n and
 * 8 rows of x; per group in order qdot += q·x and xsum += x in order, then acc += s·qdot + b·xsum, every
 * operation rounded to f32 (__fmul_rn/__fadd_rn: no fused multiply-add). Threads of a warp take
 * neighbouring rows, so the reads do not coalesce: this kernel is for coverage and for the seed's
 * exact-order tolerances, the mma family is for speed. */
template <typename T>
__global__ void __launch_bounds__(GENERIC_WARPS * 32)
    generic_qmm_t_kernel(const T *__restrict__ x, const uint32_t *__restrict__ w, const T *__restrict__ scales,
                         const T *__restrict__ biases, T *__restrict__ out, size_t M, size_t N, size_t K, int bits,
                         int group_size) {
    const size_t n = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const size_t words_per_row = K * (size_t)bits / 32, groups = K / (size_t)group_size;
    const uint32_t *row = w + n * words_per_row;
    const size_t m_blocks = (M + GENERIC_M - 1) / GENERIC_M;
    for (size_t mb = blockIdx.y; mb < m_blocks; mb += gridDim.y) {
        const size_t m0 = mb * GENERIC_M;
        const int rows = (int)(M - m0 < GENERIC_M ? M - m0 : GENERIC_M);
        float acc[GENERIC_M];
#pragma unroll
        for (int r = 0; r < GENERIC_M; r++) acc[r] = 0.0f;
        for (size_t g = 0; g < groups; g++) {
            const float s = load_f32(scales, n * groups + g), b = load_f32(biases, n * groups + g);
            float qdot[GENERIC_M], xsum[GENERIC_M];
#pragma unroll
            for (int r = 0; r < GENERIC_M; r++) qdot[r] = xsum[r] = 0.0f;
            const size_t k0 = g * (size_t)group_size;
            for (int i = 0; i < group_size; i++) {
                const float q = (float)code_at(row, k0 + i, bits);
#pragma unroll
                for (int r = 0; r < GENERIC_M; r++) {
                    if (r < rows) {
                        const float xv = load_f32(x, (m0 + r) * K + k0 + i);
                        qdot[r] = __fadd_rn(qdot[r], __fmul_rn(q, xv));
                        xsum[r] = __fadd_rn(xsum[r], xv);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < GENERIC_M; r++)
                if (r < rows) acc[r] = __fadd_rn(acc[r], __fadd_rn(__fmul_rn(s, qdot[r]), __fmul_rn(b, xsum[r])));
        }
#pragma unroll
        for (int r = 0; r < GENERIC_M; r++) {
            if (r < rows) {
                if (!isfinite(acc[r]))
                    acc[r] = direct_output_t(x + (m0 + r) * K, row, scales + n * groups, biases + n * groups, bits, K,
                                             group_size);
                store_f32(out, (m0 + r) * N + n, acc[r]);
            }
        }
    }
}

/* out = x·Ŵ with Ŵ [K, N] quantized along N. One thread per output column n and 8 rows of x; for
 * k = 0, 1, ... it forms ŵ = s·q + b and adds x[m, k]·ŵ (MLX CPU's order, the oracle's). Threads of a
 * warp read neighbouring codes of the same row: the weight reads coalesce. */
template <typename T>
__global__ void __launch_bounds__(256)
    generic_qmm_n_kernel(const T *__restrict__ x, const uint32_t *__restrict__ w, const T *__restrict__ scales,
                         const T *__restrict__ biases, T *__restrict__ out, size_t M, size_t N, size_t K, int bits,
                         int group_size) {
    const size_t n = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const size_t words_per_row = N * (size_t)bits / 32, groups = N / (size_t)group_size, g = n / (size_t)group_size;
    const size_t m_blocks = (M + GENERIC_M - 1) / GENERIC_M;
    for (size_t mb = blockIdx.y; mb < m_blocks; mb += gridDim.y) {
        const size_t m0 = mb * GENERIC_M;
        const int rows = (int)(M - m0 < GENERIC_M ? M - m0 : GENERIC_M);
        float acc[GENERIC_M];
#pragma unroll
        for (int r = 0; r < GENERIC_M; r++) acc[r] = 0.0f;
        for (size_t k = 0; k < K; k++) {
            const float s = load_f32(scales, k * groups + g), b = load_f32(biases, k * groups + g);
            /* ŵ = s·q + b formed first, then x·ŵ, each rounded (MLX CPU's order, the oracle's: bit for bit in f32) */
            const float wv = __fadd_rn(__fmul_rn(s, (float)code_at(w + k * words_per_row, n, bits)), b);
#pragma unroll
            for (int r = 0; r < GENERIC_M; r++)
                if (r < rows) acc[r] = __fadd_rn(acc[r], __fmul_rn(load_f32(x, (m0 + r) * K + k), wv));
        }
#pragma unroll
        for (int r = 0; r < GENERIC_M; r++) {
            if (r < rows) {
                if (!isfinite(acc[r]))
                    acc[r] = direct_output_n(x + (m0 + r) * K, w, scales, biases, bits, N, K, group_size, n);
                store_f32(out, (m0 + r) * N + n, acc[r]);
            }
        }
    }
}

/* ───────────────────────────── mma_gemv family ───────────────────────────── */

/*
 * The repacked weights (built once at weights-create time by qmm_cuda_repack, docs/kernels.md §9).
 * A row of K codes is cut into 64-byte super-blocks of S = 512/bits codes (4-bit: 128 codes = 4 blocks
 * of 32; 8-bit: 64 codes = 2 blocks), stored in tiles of 16 rows (packed_tiled_quad: each super-block of a
 * tile's 16 rows is one contiguous 1 KB run). Lane t (0..3) of a 4-lane quad loads the super-block's 16-byte
 * quarter t with one 128-bit load; quarter t holds "its" 8 codes (codes 8t..8t+7) of every block:
 *
 *   4-bit, original words of one super-block:  b0w0 b0w1 b0w2 b0w3 | b1w0 .. b1w3 | b2w0 .. | b3w0 .. b3w3
 *          repacked:                            b0w0 b1w0 b2w0 b3w0 | b0w1 b1w1 b2w1 b3w1 | ...  (quarter t = bjwt)
 *   8-bit, original: b0w0..b0w7 | b1w0..b1w7;  repacked quarter t = b0w(2t) b0w(2t+1) b1w(2t) b1w(2t+1)
 *
 * In the MMA (m16n8k16, A row-major 16×16 = 16 weight rows × 16 k), lane (g = lane/4, t = lane%4) supplies
 * k slots {2t, 2t+1, 2t+8, 2t+9} of rows g and g+8. A dot product does not care which physical k sits in
 * which slot as long as A and B agree, so lane t feeds its own 8 codes of a block (two MMAs of k16 per
 * block) and loads the 8 matching x values with one 128-bit load: the pairing below is what the lop3
 * decoding produces — (c0,c4) (c1,c5) (c2,c6) (c3,c7) for 4-bit, (c0,c2) (c1,c3) (c4,c6) (c5,c7) for 8-bit.
 * A block (32 codes) never crosses a group, so each MMA's 16 k lie in one group.
 */


/*
 * One block: 16·RT weight rows (n) × 8·TT tokens (m), NW warps splitting the super-blocks of K
 * (warp w takes super-blocks w, w+NW, ...), then a fixed-order sum of the NW partial results through
 * shared memory (deterministic; the order does not depend on M).
 */

/* Compile-time tuning of the mma_gemv family (measured choices in docs/PERF.md): pipeline stages per row
 * tile size, and the blocks per SM the register allocation must allow. */
#ifndef QMM_MMA_STAGES_RT1
#define QMM_MMA_STAGES_RT1 4
#endif
#ifndef QMM_MMA_STAGES_RT2
#define QMM_MMA_STAGES_RT2 3
#endif
#ifndef QMM_MMA_STAGES_RT3 /* m8n48 and m16n48: as the 64-row tiles (not swept for them; forty-seventh/eighth sessions) */
#define QMM_MMA_STAGES_RT3 2
#endif
#ifndef QMM_MMA_STAGES_RT4
#define QMM_MMA_STAGES_RT4 2
#endif
#ifndef QMM_MMA_X_FIRST /* 0: x after the weight copies in every row (the A/B of the thirteenth session) */
#define QMM_MMA_X_FIRST 1
#endif
#ifndef QMM_MMA_MIN_BLOCKS
#define QMM_MMA_MIN_BLOCKS 2
#endif

#ifndef QMM_MMA_M16N64_WARPS /* m16n64's and m16n48's most warps per block, one block per SM at the launch bounds
                              * (65536 / 32·w registers; 16 = 128 registers: spills 24–328 bytes and took 1.33× the
                              * time of 12, docs/PERF.md fourteenth session) */
#define QMM_MMA_M16N64_WARPS 12
#endif

/* Warps per block: up to 16 for the 8-token tiles and m16n32 (so that a grid of few row tiles can still spread K
 * over every warp an SM holds), at a register cap the same as 2 blocks of 8 warps (65536 / 512 = 128 per thread);
 * up to 8 for the 32-token tile, one block per SM (255 registers); up to 12 for m16n64 (168 registers: its 64
 * accumulators and one super-block of x; sm_90a spills only at 4-bit groups of 32: bf16 24 bytes, f16 40; sm_80 56 at
 * 4-bit bf16 gs32 and f16 gs64, 8 at f16 gs32). The launcher picks the count (gemv_warps). m16n64 held x one
 * super-block ahead at 242 registers, 8 warps per SM, until the fourteenth session: 12 warps without that prefetch
 * took 0.78–0.94× the time at M = 16 where it is selected (docs/PERF.md). */
template <int RT, int TT> struct mma_gemv_limits {
    /* m16n64 and m16n48 (its three-row-tile form, forty-eighth session): the 16-token tiles of ≥ 48 rows, whose
     * accumulators do not fit the 128-register cap of 16 warps */
    static constexpr bool wide16 = RT >= 3 && TT == 2;
    static constexpr bool large = TT >= 4;
    static constexpr int max_warps = wide16 ? QMM_MMA_M16N64_WARPS : large ? 8 : 16;
    static constexpr int min_blocks = wide16 || large ? 1 : (QMM_MMA_MIN_BLOCKS * 8 + max_warps - 1) / max_warps;
};

/* The staged tiles: the 8-token tiles of 64 rows (m8n64) and 48 rows (m8n48) — x through shared memory (STAGED_X),
 * the lean code below. m8n48 is m8n64 with three row tiles: where 64-row blocks are fewer than the SMs (5120 rows: 80
 * blocks on 132 SMs) its 107 blocks spread the same bytes over more SMs (docs/PERF.md, forty-seventh session). */
template <int RT, int TT> constexpr bool staged_tile = (RT == 3 || RT == 4) && TT == 1;

/* Whether a staged tile gets its lean code at this format — the copies without row checks, the
 * one-token epilogue at M = 1 (mma_gemv_body.cuh): not at 4-bit groups of 32, where
 * ptxas spilled 8–112 bytes under the 128-register cap with them (docs/PERF.md, nineteenth session). */
template <int BITS, int GS> constexpr bool staged_lean = !(BITS == 4 && GS == 32);

/* STAGED_X (the staged tiles only): x comes through the weights' cp.async pipeline instead of 16-byte loads
 * at the top of each step — the launcher's choice (launch_mma_gemv); ONE_TOKEN (with STAGED_X, at M = 1): one token's
 * x and epilogue. The body: mma_gemv_body.cuh. */
template <int BITS, typename T, int RT, int TT, int S, int GS, bool STAGED_X, bool ONE_TOKEN>
__global__ void __launch_bounds__(mma_gemv_limits<RT, TT>::max_warps * 32, mma_gemv_limits<RT, TT>::min_blocks)
    mma_gemv_kernel(const T *__restrict__ x, const uint4 *__restrict__ packed, const uint32_t *__restrict__ sb,
                    const uint32_t *__restrict__ w_orig, const T *__restrict__ scales, const T *__restrict__ biases,
                    T *__restrict__ out, int M, int N, int K) {
#include "mma_gemv_body.cuh"
}

/* m8n64_48 (forty-eighth session): the 8-token staged tile in blocks of two heights — the first `tall_blocks` blocks of
 * 64 rows (the m8n64 body), the rest of 48 (the m8n48 body), each output computed as those rows compute it. Where
 * 64-row blocks would leave the busiest SMs with one block more than the others (14336 rows: 224 blocks on 132 SMs, 92
 * SMs with 128 rows and 40 with 64), the launcher picks the two counts so that every SM gets the same number of
 * blocks and at most one more 64-row block than another (14336: 104 of 64 and 160 of 48, two per SM: 112 rows at
 * most against 128) — docs/kernels.md §9.1. Both bodies use the 64-row tile's shared memory layout sizes (the
 * 48-row one fits in it) and its stages (QMM_MMA_STAGES_RT3 = RT4). */
static_assert(QMM_MMA_STAGES_RT3 == QMM_MMA_STAGES_RT4, "m8n64_48 runs both heights with one stage count");
/* MIXED_TT: 1 (m8n64_48, M ≤ 8) or 2 (m16n64_48, forty-ninth session, M ≤ 16: the m16n64 and m16n48 bodies, one chunk
 * of 16 rows of x — the body's chunk offsets are skipped under QMM_GEMV_N_BASE; the grid is the row blocks alone). */
template <int BITS, typename T, int S, int GS, bool STAGED_X, bool ONE_TOKEN, int MIXED_TT = 1>
__global__ void __launch_bounds__(mma_gemv_limits<4, MIXED_TT>::max_warps * 32, mma_gemv_limits<4, MIXED_TT>::min_blocks)
    mma_gemv_mixed_kernel(const T *__restrict__ x, const uint4 *__restrict__ packed, const uint32_t *__restrict__ sb,
                          const uint32_t *__restrict__ w_orig, const T *__restrict__ scales,
                          const T *__restrict__ biases, T *__restrict__ out, int M, int N, int K, int tall_blocks) {
    if ((int)blockIdx.x < tall_blocks) {
        constexpr int RT = 4, TT = MIXED_TT;
        const int mixed_n_base = (int)blockIdx.x * 64;
#define QMM_GEMV_N_BASE mixed_n_base
#include "mma_gemv_body.cuh"
    } else {
        constexpr int RT = 3, TT = MIXED_TT;
        const int mixed_n_base = tall_blocks * 64 + ((int)blockIdx.x - tall_blocks) * 48;
#include "mma_gemv_body.cuh"
#undef QMM_GEMV_N_BASE
    }
}

/* The mixed tiles' blocks (m8n64_48, m16n64_48) for N rows on `sms` SMs: the least k blocks per SM with 4·k·sms ≥
 * the row tiles of 16; then, when the tiles are at least 3·k·sms and at most (4·k − 1)·sms, tall = tiles − 3·k·sms
 * blocks of 64 rows and k·sms − tall of 48 (tall·4 + short·3 = tiles: the blocks end at the last row tile); otherwise
 * (or the SMs unknown) every block 64 rows, as m8n64 / m16n64. The upper end: an SM then has ⌈tall ÷ sms⌉ 64-row
 * blocks at most, 48·k + 16·⌈tall ÷ sms⌉ rows, fewer than 64-row blocks' 64·k only while tall ≤ (k − 1)·sms — past it
 * (one wave of 100–131 blocks of 64 rows, the top of each later wave) the split would cost 48-row blocks' dearer bytes
 * and shorten no SM's work. */
static void mixed_blocks(size_t N, int sms, size_t *tall, size_t *short_blocks) {
    const size_t tiles = (N + 15) / 16;
    *tall = (tiles + 3) / 4, *short_blocks = 0;
    if (sms <= 0) return;
    const size_t per = 4 * (size_t)sms, blocks = (tiles + per - 1) / per * (size_t)sms;
    if (tiles >= 3 * blocks && tiles <= 4 * blocks - (size_t)sms)
        *tall = tiles - 3 * blocks, *short_blocks = blocks - *tall;
}

/* Many products of one shape (N, K) in one launch — the expert blocks of a gather (cuda.gather.blocks.auto):
 * grid.z = the product, grouped_entry(table, z) its offsets from the bases and its rows of x (M ≤ 8·TT: no chunks),
 * grid (row tiles, 1, products). Each product is computed by the same algorithm as a launch of m8n32 / m16n32 on it
 * alone, within the same bound; not always with the same bits — the warps per block are chosen for the whole grid
 * (unless launch->warps fixes them, as the gather's batch-invariant mode does: gather_piece_end in cuda_backend.c), and
 * they set how K is split among a block's warps. */
template <int BITS, typename T, int RT, int TT, int S, int GS, typename Table>
__global__ void __launch_bounds__(mma_gemv_limits<RT, TT>::max_warps * 32, mma_gemv_limits<RT, TT>::min_blocks)
    mma_gemv_grouped_kernel(const __grid_constant__ Table table, const T *__restrict__ x_base,
                            const uint4 *__restrict__ packed_base, const uint32_t *__restrict__ sb_base,
                            const uint32_t *__restrict__ w_base, const T *__restrict__ scales_base,
                            const T *__restrict__ biases_base, T *__restrict__ out_base, int N, int K) {
    static_assert(TT <= 2 && !(RT == 4 && TT == 2), "a grouped product has no chunks of rows of x");
    constexpr bool STAGED_X = false, ONE_TOKEN = false;
    const auto &e = grouped_entry(table, blockIdx.z); /* __grid_constant__: never copied to local memory */
    const T *__restrict__ x = x_base + e.x;
    const uint4 *__restrict__ packed = packed_base + e.packed;
    const uint32_t *__restrict__ sb = sb_base + e.sb;
    const uint32_t *__restrict__ w_orig = w_base + e.w;
    const T *__restrict__ scales = scales_base + e.scales;
    const T *__restrict__ biases = biases_base + e.scales;
    T *__restrict__ out = out_base + e.out;
    int M = (int)e.M;
#include "mma_gemv_body.cuh"
}

/* ───────────────────────────── launchers ───────────────────────────── */

template <typename T> static int launch_generic_t(const qmm_cuda_launch *c) {
    const size_t m_blocks = (c->M + GENERIC_M - 1) / GENERIC_M;
    dim3 grid((unsigned)((c->N + GENERIC_WARPS * 32 - 1) / (GENERIC_WARPS * 32)), (unsigned)(m_blocks < 65535 ? m_blocks : 65535));
    cudaGetLastError(); /* an earlier failure, already reported, must not be blamed on this launch */
    generic_qmm_t_kernel<T><<<grid, GENERIC_WARPS * 32, 0, (cudaStream_t)c->stream>>>(
        (const T *)c->x, c->w, (const T *)c->scales, (const T *)c->biases, (T *)c->out, c->M, c->N, c->K, c->bits,
        c->group_size);
    return (int)cudaGetLastError();
}

template <typename T> static int launch_generic_n(const qmm_cuda_launch *c) {
    const size_t m_blocks = (c->M + GENERIC_M - 1) / GENERIC_M;
    dim3 grid((unsigned)((c->N + 255) / 256), (unsigned)(m_blocks < 65535 ? m_blocks : 65535));
    cudaGetLastError();
    generic_qmm_n_kernel<T><<<grid, 256, 0, (cudaStream_t)c->stream>>>((const T *)c->x, c->w, (const T *)c->scales,
                                                                       (const T *)c->biases, (T *)c->out, c->M, c->N,
                                                                       c->K, c->bits, c->group_size);
    return (int)cudaGetLastError();
}

extern "C" int qmm_cuda_generic_qmm_t(const qmm_cuda_launch *c) {
    switch (c->dtype) {
    case 0: return launch_generic_t<float>(c);
    case 1: return launch_generic_t<__half>(c);
    default: return launch_generic_t<__nv_bfloat16>(c);
    }
}

extern "C" int qmm_cuda_generic_qmm_n(const qmm_cuda_launch *c) {
    switch (c->dtype) {
    case 0: return launch_generic_n<float>(c);
    case 1: return launch_generic_n<__half>(c);
    default: return launch_generic_n<__nv_bfloat16>(c);
    }
}

/* Warps per block for an mma_gemv launch of `blocks` blocks (docs/kernels.md §9.1, "Warps per block").
 * The model (model == 1, the default; bench/probes/gemv_warps_model.py, fitted to the twenty-sixth session's sweeps):
 * the count w of 4 … max_warps with the least modelled time of the busiest SM — it holds ceil(blocks / SMs) blocks,
 * r(w) at a time (the occupancy below), each warp of a block taking ceil(super_blocks / w) super-blocks of K plus 3
 * steps of fixed cost, the SM running k blocks' steps at max(1, k·w / Wsat) times a lone warp's step time; ties to
 * the more warps. Wsat, the warps that saturate an SM: 16 for a tile of ≥ 4 16×8 MMA tiles per k-step (m8n64,
 * m16n32, m16n64, m32n16); 16·4 / (its MMA tiles) for the smaller ones, whose warps each do less per step (32 for
 * m8n32, 64 for m8n16: with 16 the model gave them fewer warps than the rule and cost up to 1.16× and 1.36×).
 * Where the grid does not fit one wave it takes more, smaller blocks per SM. Measured on the H200 against the
 * one-wave rule, every row at every seed and Qwen3 cell (docs/PERF.md, twenty-seventh session): the selector's row
 * 0.81–0.85× the time at M = 32–48 on the large shapes (m16n64 at 27648×5120), 0.89–0.93× at M = 16 there, the
 * other cells at M ≤ 16 within ±4 % (geomean 1.000); the gather 0.75–0.97× at 8–128 tokens.
 * The one-wave rule (model == 0, QMM_CUDA_GEMV_WARPS_MODEL=0, for A/B runs): the most warps (≤ max_warps) for which
 * every block is resident at once, as long as that leaves ≥ 4 warps per block; else 8 (several waves) — the sixth
 * session's rule (1024×5120: 64 blocks of 16 warps 2.8 µs, of 8 warps 3.5).
 * gemv_launch_warps then caps the count at the super-blocks.
 * occupancy[w] caches the blocks of w warps one SM holds (per instantiation and device; NULL: ask each time). */
template <typename Kernel>
static int gemv_resident(Kernel kernel, int w, size_t shared_per_warp, std::atomic<int> *occupancy) {
    int resident = occupancy ? occupancy[w].load(std::memory_order_relaxed) : 0;
    if (resident == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, w * 32, shared_per_warp * (size_t)w) !=
            cudaSuccess) {
            cudaGetLastError();
            resident = -1;
        }
        if (resident == 0) resident = -1; /* cached as "does not fit" */
        if (occupancy) occupancy[w].store(resident, std::memory_order_relaxed);
    }
    return resident;
}

template <typename Kernel>
static int gemv_warps(Kernel kernel, size_t blocks, int super_blocks, int mma_tiles, size_t shared_per_warp,
                      int max_warps, int multiprocessors, int model, std::atomic<int> *occupancy) {
    if (multiprocessors <= 0) multiprocessors = 1;
    int chosen = 0;
    if (model) {
        const size_t busiest = (blocks + (size_t)multiprocessors - 1) / (size_t)multiprocessors;
        const double saturating = mma_tiles < 4 ? 64.0 / (double)(mma_tiles > 0 ? mma_tiles : 1) : 16.0;
        /* k resident blocks of w warps run each step at max(1, k·w / Wsat) times a lone warp's step time */
        const auto pace = [&](size_t k, int w) {
            const double shared = (double)k * w / saturating;
            return shared > 1.0 ? shared : 1.0;
        };
        double best = 0.0;
        for (int w = max_warps; w >= 4; w--) {
            const int resident = gemv_resident(kernel, w, shared_per_warp, occupancy);
            if (resident <= 0) continue;
            const size_t full = busiest / (size_t)resident, rest = busiest % (size_t)resident;
            const double steps = (double)((super_blocks + w - 1) / w) + 3.0;
            const double time = steps * ((double)full * pace((size_t)resident, w) + (rest ? pace(rest, w) : 0.0));
            if (!chosen || time < best - 1e-9) chosen = w, best = time;
        }
    } else {
        for (int w = max_warps; w >= 4 && !chosen; w--) {
            const int resident = gemv_resident(kernel, w, shared_per_warp, occupancy);
            if (resident > 0 && (size_t)resident * (size_t)multiprocessors >= blocks) chosen = w;
        }
    }
    return chosen ? chosen : max_warps < 8 ? max_warps : 8;
}

/* The warps of an mma_gemv launch: QMM_CUDA_WARPS where set (≤ max_warps), else gemv_warps; then at most the
 * super-blocks (warp w takes super-blocks w, w + W, ...: none left idle) and at least 1. */
template <typename Kernel>
static int gemv_launch_warps(const qmm_cuda_launch *c, Kernel kernel, size_t blocks, int super_blocks, int mma_tiles,
                             size_t per_warp, int max_warps, std::atomic<int> *occupancy) {
    int warps = c->warps > 0 ? (c->warps < max_warps ? c->warps : max_warps)
                             : gemv_warps(kernel, blocks, super_blocks, mma_tiles, per_warp, max_warps,
                                          c->multiprocessors, c->gemv_warps_model, occupancy);
    if (warps > super_blocks) warps = super_blocks;
    return warps < 1 ? 1 : warps;
}

template <int BITS, typename T, int RT, int TT, int GS, bool STAGED_X, bool ONE_TOKEN = false, bool MIXED = false>
static int launch_mma_gemv_as(const qmm_cuda_launch *c) {
    static_assert(!MIXED || (RT == 4 && (TT == 1 || TT == 2)), "m8n64_48 and m16n64_48 are sized as the 64-row tiles");
    /* Pipeline depth (S − 1 super-blocks in flight per warp): the H200 sweep of docs/PERF.md found 4/3/2
     * stages faster than deeper pipelines with fewer warps resident (27648×5120 M=1: 38.5 → 32.6 µs) — more
     * warps resident hide the MMA and decode latency better. m16n64 (RT = 4, TT = 2, then one block of 8 warps per SM)
     * also ran best with 2 (the twelfth session: 2 stages 0.989× the time of 3 and 0.980× that of 4, geomeans; not
     * measured again at its 12 warps). */
    constexpr int S = RT == 1   ? QMM_MMA_STAGES_RT1
                      : RT == 2 ? QMM_MMA_STAGES_RT2
                      : RT == 3 ? QMM_MMA_STAGES_RT3
                                : QMM_MMA_STAGES_RT4;
    /* shared memory per warp: the weight and pair stages, the reduction, and (STAGED_X) the stages of x of the
     * min(M, 8) tokens, 64·BPS bytes each per super-block */
    constexpr size_t x_token = STAGED_X ? (size_t)S * 512 / BITS * 2 : 0;
    constexpr size_t per_warp_base = (size_t)S * RT * 2 * 32 * (16 + 4) + (size_t)RT * TT * 4 * 32 * sizeof(float);
    const int mx = STAGED_X ? (int)(c->M < 8 ? c->M : 8) : 0;
    const size_t per_warp = per_warp_base + (size_t)mx * x_token;
    /* at most mma_gemv_limits' warps (16; 8 for the 32-token tile, 12 for m16n64), and no more than the device's
     * shared memory holds (16 warps of the 64-row tile take 192 KB, 200 KB with one token's x staged, 256 KB with
     * eight: an H100/H200 has 227, an A100 163; 12 warps of m16n64 168 KB: 11 fit on an A100, 7 in the 99 KB of
     * sm_86/89) */
    const auto fit = [&](size_t bytes) { /* the device's opt-in is always known (sharedMemPerBlockOptin) */
        int w = mma_gemv_limits<RT, TT>::max_warps;
        if (c->shared_optin > 0 && (size_t)w * bytes > c->shared_optin) w = (int)(c->shared_optin / bytes);
        return w < 1 ? 1 : w; /* 8 warps of every unstaged tile but m16n64 fit in 99 KB */
    };
    const int max_warps = fit(per_warp);
    auto kernel = [] {
        if constexpr (MIXED) return mma_gemv_mixed_kernel<BITS, T, S, GS, STAGED_X, ONE_TOKEN, TT>;
        else return mma_gemv_kernel<BITS, T, RT, TT, S, GS, STAGED_X, ONE_TOKEN>;
    }();
    /* the most any launch of this instantiation uses: fit() rounds the warps down, so the largest block is not
     * always the one with 8 rows of x — take the largest over 0 … 8 (0 for the unstaged tiles) */
    size_t most = 0;
    for (int rows = 0; rows <= (STAGED_X ? 8 : 0); rows++) {
        const size_t bytes = per_warp_base + (size_t)rows * x_token, block = (size_t)fit(bytes) * bytes;
        most = block > most ? block : most;
    }
    static unsigned long long opted_in = 0;
    const int opt_in = shared_memory_opt_in(kernel, most, &opted_in);
    if (opt_in) return opt_in;
    const int super_blocks = (int)((c->K / 32 + (BITS == 4 ? 3 : 1)) / (BITS == 4 ? 4 : 2));
    /* grid: (row tiles, the 32-token tile's chunks of 32 rows of x); m16n64: (its chunks of 16 rows of x, row tiles) */
    size_t tall = 0, short_blocks = 0;
    if constexpr (MIXED) mixed_blocks(c->N, c->multiprocessors, &tall, &short_blocks);
    const unsigned row_blocks = MIXED ? (unsigned)(tall + short_blocks) : (unsigned)((c->N + 16 * RT - 1) / (16 * RT));
    const dim3 blocks = RT == 4 && TT == 2 && !MIXED ? dim3((unsigned)((c->M + 15) / 16), row_blocks)
                                           : dim3(row_blocks, TT == 4 ? (unsigned)((c->M + 31) / 32) : 1u);
    /* per device (the first 8; others ask every launch) and rows of x staged: blocks of w warps one SM holds, 0 = not
     * asked yet */
    static std::atomic<int> occupancy[8][STAGED_X ? 9 : 1][mma_gemv_limits<RT, TT>::max_warps + 1];
    int device = 0;
    if (c->warps <= 0 && cudaGetDevice(&device) != cudaSuccess) cudaGetLastError(), device = -1;
    const int warps = gemv_launch_warps(c, kernel, (size_t)blocks.x * blocks.y, super_blocks, RT * TT, per_warp,
                                        max_warps, device >= 0 && device < 8 ? occupancy[device][mx] : nullptr);
    const auto launch = [&](auto... tall_blocks) { /* m8n64_48's kernel takes its count of 64-row blocks last */
        return launch_kernel(kernel, blocks, dim3(warps * 32), (size_t)warps * per_warp, c->stream, c->pdl != 0,
                             (const T *)c->x, (const uint4 *)c->packed, (const uint32_t *)c->sb, c->w,
                             (const T *)c->scales, (const T *)c->biases, (T *)c->out, (int)c->M, (int)c->N, (int)c->K,
                             tall_blocks...);
    };
    if constexpr (MIXED) return launch((int)tall);
    else return launch();
}

/* x staged through shared memory (the staged tiles: 64 or 48 rows, 8 tokens) at M ≤ 4, and at M ≤ 8 when the grid
 * leaves SMs idle (fewer blocks than SMs, i.e. N ≤ 16·RT·(SMs − 1)). Measured on the H200 (docs/PERF.md, eleventh
 * session; m8n64 forced, seed and Qwen3 shapes, M = 1–8, against x loaded at the top of each step): at M ≤ 4
 * 0.79–1.03× (5120×5120 M = 1 bf16 9.1 → 7.7 µs, 5120×14336 21.0 → 18.6, 14336×5120 15.7 → 14.6, 27648×5120 29.0 →
 * 28.8); at M = 8, where eight tokens' stages leave room for 14 warps instead of 16, 0.86–1.03× on the 80-block
 * shapes but up to 1.25× elsewhere. QMM_CUDA_GEMV_STAGED_X=1/0 forces it on/off (launch->staged_x). */
template <int BITS, typename T, int RT, int TT, int GS, bool MIXED = false>
static int launch_mma_gemv(const qmm_cuda_launch *c) {
    if constexpr (staged_tile<RT, TT>) {
        size_t blocks = (c->N + 16 * RT - 1) / (16 * RT), short_blocks = 0;
        if constexpr (MIXED) mixed_blocks(c->N, c->multiprocessors, &blocks, &short_blocks);
        const bool fewer_blocks_than_sms = c->multiprocessors > 0 && blocks + short_blocks < (size_t)c->multiprocessors;
        if (c->staged_x > 0 || (c->staged_x == 0 && (c->M <= 4 || fewer_blocks_than_sms))) {
            if constexpr (staged_lean<BITS, GS>)
                if (c->M == 1) return launch_mma_gemv_as<BITS, T, RT, TT, GS, true, true, MIXED>(c);
            return launch_mma_gemv_as<BITS, T, RT, TT, GS, true, false, MIXED>(c);
        }
    }
    return launch_mma_gemv_as<BITS, T, RT, TT, GS, false, false, MIXED>(c);
}

template <int BITS, typename T, int RT, int TT, bool MIXED = false> static int dispatch_group(const qmm_cuda_launch *c) {
    switch (c->group_size) {
    case 32: return launch_mma_gemv<BITS, T, RT, TT, 32, MIXED>(c);
    case 64: return launch_mma_gemv<BITS, T, RT, TT, 64, MIXED>(c);
    default: return launch_mma_gemv<BITS, T, RT, TT, 128, MIXED>(c);
    }
}

template <int RT, int TT, bool MIXED = false> static int dispatch_mma_gemv(const qmm_cuda_launch *c) {
    if (c->bits == 4)
        return c->dtype == 1 ? dispatch_group<4, __half, RT, TT, MIXED>(c) : dispatch_group<4, __nv_bfloat16, RT, TT, MIXED>(c);
    return c->dtype == 1 ? dispatch_group<8, __half, RT, TT, MIXED>(c) : dispatch_group<8, __nv_bfloat16, RT, TT, MIXED>(c);
}

/* The grouped launch (the gather's expert blocks): m8n32 (token_tiles 1) or m16n32 (2), x never staged. Warps and
 * shared memory as launch_mma_gemv_as for the unstaged tile, counting every product's blocks. */
template <int BITS, typename T, int TT, int GS, typename Table>
static int launch_mma_gemv_grouped(const qmm_cuda_launch *c, const Table &table, int count) {
    constexpr int RT = 2, S = QMM_MMA_STAGES_RT2;
    constexpr size_t per_warp = (size_t)S * RT * 2 * 32 * (16 + 4) + (size_t)RT * TT * 4 * 32 * sizeof(float);
    int max_warps = mma_gemv_limits<RT, TT>::max_warps;
    if (c->shared_optin > 0 && (size_t)max_warps * per_warp > c->shared_optin) max_warps = (int)(c->shared_optin / per_warp);
    if (max_warps < 1) max_warps = 1;
    auto kernel = mma_gemv_grouped_kernel<BITS, T, RT, TT, S, GS, Table>;
    static unsigned long long opted_in = 0;
    const int opt_in = shared_memory_opt_in(kernel, (size_t)max_warps * per_warp, &opted_in);
    if (opt_in) return opt_in;
    const int super_blocks = (int)((c->K / 32 + (BITS == 4 ? 3 : 1)) / (BITS == 4 ? 4 : 2));
    const dim3 blocks((unsigned)((c->N + 16 * RT - 1) / (16 * RT)), 1u, (unsigned)count);
    static std::atomic<int> occupancy[8][mma_gemv_limits<RT, TT>::max_warps + 1];
    int device = 0;
    if (c->warps <= 0 && cudaGetDevice(&device) != cudaSuccess) cudaGetLastError(), device = -1;
    const int warps = gemv_launch_warps(c, kernel, (size_t)blocks.x * blocks.z, super_blocks, RT * TT, per_warp,
                                        max_warps, device >= 0 && device < 8 ? occupancy[device] : nullptr);
    return launch_kernel(kernel, blocks, dim3(warps * 32), (size_t)warps * per_warp, c->stream, false, table,
                         (const T *)c->x, (const uint4 *)c->packed, (const uint32_t *)c->sb, c->w, (const T *)c->scales,
                         (const T *)c->biases, (T *)c->out, (int)c->N, (int)c->K);
}

/* The products into the launch's parameter (host_products, ≤ QMM_CUDA_GROUPED_MAX) or their device array. */
template <int BITS, typename T, int TT, int GS>
static int launch_mma_gemv_grouped_from(const qmm_cuda_launch *c, const qmm_cuda_gemv_product *host_products,
                                        const qmm_cuda_gemv_product *device_products, int count) {
    if (!host_products == !device_products || count < 1 || count > (host_products ? QMM_CUDA_GROUPED_MAX : 65535))
        return (int)cudaErrorInvalidValue;
    if (device_products) return launch_mma_gemv_grouped<BITS, T, TT, GS>(c, grouped_device_table{device_products}, count);
    return launch_mma_gemv_grouped<BITS, T, TT, GS>(c, grouped_parameter_table(host_products, count), count);
}

template <int BITS, typename T, int TT>
static int dispatch_grouped_group(const qmm_cuda_launch *c, const qmm_cuda_gemv_product *host,
                                  const qmm_cuda_gemv_product *device, int count) {
    switch (c->group_size) {
    case 32: return launch_mma_gemv_grouped_from<BITS, T, TT, 32>(c, host, device, count);
    case 64: return launch_mma_gemv_grouped_from<BITS, T, TT, 64>(c, host, device, count);
    default: return launch_mma_gemv_grouped_from<BITS, T, TT, 128>(c, host, device, count);
    }
}

template <int TT>
static int dispatch_grouped(const qmm_cuda_launch *c, const qmm_cuda_gemv_product *host,
                            const qmm_cuda_gemv_product *device, int count) {
    if (c->bits == 4)
        return c->dtype == 1 ? dispatch_grouped_group<4, __half, TT>(c, host, device, count)
                             : dispatch_grouped_group<4, __nv_bfloat16, TT>(c, host, device, count);
    return c->dtype == 1 ? dispatch_grouped_group<8, __half, TT>(c, host, device, count)
                         : dispatch_grouped_group<8, __nv_bfloat16, TT>(c, host, device, count);
}

extern "C" int qmm_cuda_mma_gemv_grouped(const qmm_cuda_launch *c, const qmm_cuda_gemv_product *host_products,
                                         const qmm_cuda_gemv_product *device_products, int count, int token_tiles) {
    return token_tiles == 2 ? dispatch_grouped<2>(c, host_products, device_products, count)
                            : dispatch_grouped<1>(c, host_products, device_products, count);
}

/* The tiles the table uses (each is 12 instantiations: bits × dtype × group size). */
extern "C" int qmm_cuda_mma_gemv_qmm_t(const qmm_cuda_launch *c, int row_tiles, int token_tiles) {
    if (token_tiles == 4) return dispatch_mma_gemv<1, 4>(c);
    if (token_tiles == 2)
        return row_tiles == 4 ? dispatch_mma_gemv<4, 2>(c)
               : row_tiles == 3 ? dispatch_mma_gemv<3, 2>(c)
                                : dispatch_mma_gemv<2, 2>(c);
    if (row_tiles == 1) return dispatch_mma_gemv<1, 1>(c);
    if (row_tiles == 2) return dispatch_mma_gemv<2, 1>(c);
    if (row_tiles == 3) return dispatch_mma_gemv<3, 1>(c);
    return dispatch_mma_gemv<4, 1>(c);
}

/* Whether mixed_blocks cuts N rows on `sms` SMs into blocks of both heights (the rows' selector rule, cuda_backend.c). */
extern "C" int qmm_cuda_mixed_splits(size_t N, int sms) {
    size_t tall = 0, short_blocks = 0;
    mixed_blocks(N, sms, &tall, &short_blocks);
    return short_blocks > 0;
}

/* m8n64_48 (token_tiles 1: M ≤ 8) and m16n64_48 (2: M ≤ 16): blocks of 64 and 48 rows (mma_gemv_mixed_kernel). */
extern "C" int qmm_cuda_mma_gemv_mixed_qmm_t(const qmm_cuda_launch *c, int token_tiles) {
    return token_tiles == 2 ? dispatch_mma_gemv<4, 2, true>(c) : dispatch_mma_gemv<4, 1, true>(c);
}

/* ───────────────────────────── gather (MoE) ───────────────────────────── */

/* dst row i = src row indices[i], rows of row_quads 16-byte words (K·dtype size is a multiple of 64 bytes:
 * K is a multiple of 32). One block per row, looping over the row's words. */
__global__ void __launch_bounds__(128) gather_rows_kernel(const uint4 *__restrict__ src, const uint32_t *__restrict__ indices,
                                                          uint4 *__restrict__ dst, size_t row_quads) {
    const uint4 *from = src + (size_t)indices[blockIdx.x] * row_quads;
    uint4 *to = dst + (size_t)blockIdx.x * row_quads;
    for (size_t i = threadIdx.x; i < row_quads; i += blockDim.x) to[i] = from[i];
}

extern "C" int qmm_cuda_gather_rows(const void *src, const uint32_t *indices, void *dst, size_t rows, size_t row_bytes,
                                    void *stream) {
    cudaGetLastError();
    gather_rows_kernel<<<(unsigned)rows, 128, 0, (cudaStream_t)stream>>>((const uint4 *)src, indices, (uint4 *)dst,
                                                                         row_bytes / 16);
    return (int)cudaGetLastError();
}

/* ───────────────────────────── host-side repack ───────────────────────────── */

extern "C" size_t qmm_cuda_packed_words_per_row(size_t K, int bits) {
    const size_t codes_per_super_block = 512 / (size_t)bits; /* 64 bytes */
    return (K + codes_per_super_block - 1) / codes_per_super_block * 16;
}

extern "C" size_t qmm_cuda_sb_words(size_t N, size_t K, int bits, int group_size, int scale_bytes) {
    const size_t super_blocks = qmm_cuda_packed_words_per_row(K, bits) / 16;
    return (N + 15) / 16 * super_blocks * 16 * (size_t)sb_pairs_per_super_block(bits, group_size) *
           (size_t)(scale_bytes / 2);
}

extern "C" void qmm_cuda_repack_sb(const void *scales, const void *biases, size_t N, size_t K, int bits, int group_size,
                                   int scale_bytes, uint32_t *out) {
    const size_t super_blocks = qmm_cuda_packed_words_per_row(K, bits) / 16, groups = K / (size_t)group_size;
    const size_t gsb = (size_t)sb_pairs_per_super_block(bits, group_size), codes = 512 / (size_t)bits;
    const size_t size = (size_t)scale_bytes, words = size / 2; /* 32-bit words per pair: 1 (16-bit), 2 (f32) */
    const unsigned char *s = (const unsigned char *)scales, *b = (const unsigned char *)biases;
    for (size_t tile = 0; tile < (N + 15) / 16; tile++)
        for (size_t sbk = 0; sbk < super_blocks; sbk++)
            for (size_t row = 0; row < 16; row++)
                for (size_t i = 0; i < gsb; i++) {
                    const size_t n = 16 * tile + row, group = sbk * codes / (size_t)group_size + i;
                    unsigned char pair[8] = {0}; /* rows past N and groups past K: zero */
                    if (n < N && group < groups) { /* the arrays may sit at any byte offset (safetensors views) */
                        memcpy(pair, s + size * (n * groups + group), size);
                        memcpy(pair + size, b + size * (n * groups + group), size);
                    }
                    memcpy(&out[4 * sb_tiled_run<size_t>(tile, super_blocks, sbk, (int)(gsb * words)) + (row * gsb + i) * words],
                           pair, 4 * words);
                }
}

extern "C" void qmm_cuda_repack(const uint32_t *w, size_t N, size_t K, int bits, uint32_t *out) {
    const size_t words = K * (size_t)bits / 32, packed = qmm_cuda_packed_words_per_row(K, bits);
    const size_t super_blocks = packed / 16, blocks_per_super = bits == 4 ? 4 : 2, words_per_lane = (size_t)bits / 4;
    memset(out, 0, (N + 15) / 16 * 16 * packed * sizeof(uint32_t)); /* the zero tail of K and rows past N */
    for (size_t n = 0; n < N; n++) {
        const uint32_t *src = w + n * words;
        for (size_t block = 0; block < K / 32; block++) {
            const size_t super = block / blocks_per_super, j = block % blocks_per_super;
            uint32_t *dst = out + 4 * packed_tiled_quad<size_t>(n, super_blocks, super);
            for (size_t t = 0; t < 4; t++)
                for (size_t e = 0; e < words_per_lane; e++)
                    dst[4 * t + j * words_per_lane + e] = src[block * (size_t)bits + t * words_per_lane + e];
        }
    }
}
