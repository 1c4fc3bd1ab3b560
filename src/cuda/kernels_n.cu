/*
 * kernels_n.cu — x·Ŵ (qmm_n, MLX quantized_matmul with transpose=False) on the tensor cores: the mma_tile_n rows
 * (docs/kernels.md §9.8). 4- and 8-bit codes, f16/bf16 activations, any M, any N (a multiple of the group), any K.
 *
 * Ŵ is [K, N], quantized along N: ŵ[k, n] = s[k, g]·q[k, n] + b[k, g] with g = n / group_size. The scale varies
 * along the reduction (k), so qmm_t's per-group epilogue (s·Σq·x + b·Σx) does not apply; instead the scale goes
 * into x:  out[m, n] = Σ_k q[k, n]·(x[m, k]·s[k, g]) + Σ_k b[k, g]·x[m, k].
 *  - x·s is exact in f32 (two 16-bit significands: ≤ 22 bits, f16; ≤ 16, bf16); scaled by 2^48 (exact) it is cut
 *    into bf16 parts (split_bf16_parts: 3 for f16, 2 for bf16), each a normal bf16 for every product of f16 values
 *    and of bf16 values down to 2^-150 (smaller ones underflow in the oracle's f32 arithmetic too). The codes are
 *    decoded to exact bf16 integers, and the tensor cores (mma.sync m16n8k16, f32 accumulate) sum exact products.
 *  - Σ_k b·x is one more MMA per k16 step with the biases as A (exact in their own dtype; the 16 rows of a warp's
 *    tile share a group, so every row of A is the same) and x as B — bf16: b·2^32 and x·2^16, exact and normal for
 *    every nonzero bf16 below 2^96 and 2^112 (no subnormal operand reaches the tensor core); f16 as they are (f16
 *    operands, subnormal ones included, give exact normal f32 products, as mma_decode's f16 codes rely on).
 *  - out = (Σq·x' + Σb·x [·2^48 for f16])·2^-48. An output that is not finite — an inf or NaN in x, or values so
 *    large that a scaled operand, a product or a sum overflows (|x·s| from about 2^72, |s| from 2^80, bf16 |b| from
 *    2^96 or |x| from 2^112) — is recomputed in the oracle's direct form in f64 (direct_output_n): never a wrong
 *    finite value.
 * The weights are read in the MLX layout as they are (no repack: the same weights serve qmm_t, whose tensor-core
 * rows read the repacked copy): a stage holds KS = 64 rows k of the block's BN columns (64 or 128), BN·bits/8 bytes
 * per row, copied with cp.async. A 16-row tile of the MMA takes 16 consecutive columns with rows g and
 * g + 8 on columns 2g and 2g + 1 (C's rows follow the same map), so a lane's two codes of one k sit in one byte
 * (4-bit) or two neighbouring bytes (8-bit) of the word of row k, and its k slots 2t, 2t + 1, 2t + 8, 2t + 9 are
 * the natural k order, which x, the scales and the biases follow.
 *
 * Split-K (grid.z > 1, where the blocks of N × M are too few for the SMs): split z takes a contiguous range of
 * stages and writes Σq·x' + Σb·x of its range to a workspace; the last split of a tile to arrive adds them in split
 * order and finishes the outputs (the mma_tile family's scheme, kernels_tile.cu).
 * Order (batch-invariant, docs/kernels.md §11): per output, k in steps of 16 in order; in each, the x' parts' MMAs
 * chained (hi, then lo …) into one accumulator and the bias MMA into another; then the sum and the scaling. The
 * tile shape, the warp and M do not enter it (one split in batch-invariant mode).
 */
#include "cuda_internal.h"
#include "mma_common.cuh"

namespace {

/* A warp takes 32 columns (two 16-row MMA tiles, WR) × 8·WT tokens; a block WN × WM warps. Two shapes (tile_n_config):
 * m32n64 (2 × 2 warps of 16 tokens) and, for decode, m8n128 (4 warps side by side, 8 tokens: no work on empty
 * token tiles at M ≤ 8). */
constexpr int WR = 2;
constexpr int KS = 64; /* rows k per pipeline stage */
constexpr int STAGES = 4;
constexpr float X_SCALE = 281474976710656.0f; /* 2^48 */
constexpr float X_UNSCALE = 1.0f / X_SCALE;

template <typename T> struct n_traits;
template <> struct n_traits<__half> {
    static constexpr int parts = 3; /* x·s: ≤ 22 significant bits */
    static __device__ __forceinline__ float2 widen(uint32_t pair) {
        return __half22float2(*reinterpret_cast<const __half2 *>(&pair));
    }
    /* the bias MMA's A and B: b and x as they are (f16 products of f16 values are normal f32 numbers) */
    static __device__ __forceinline__ uint32_t bias_a(uint32_t pair) { return pair; }
    static __device__ __forceinline__ uint32_t bias_b(uint32_t pair) { return pair; }
    static constexpr float bias_unscale = X_SCALE; /* Σb·x brought to the scale of Σq·x' */
};
template <> struct n_traits<__nv_bfloat16> {
    static constexpr int parts = 2; /* x·s: ≤ 16 significant bits */
    static __device__ __forceinline__ float2 widen(uint32_t pair) {
        return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&pair));
    }
    /* b·2^32 and x·2^16 in bf16: exact, normal for every nonzero bf16 (≥ 2^-133), and b·x·2^48 like Σq·x'; beyond
     * bf16's range inf, and the output takes the f64 rule */
    static __device__ __forceinline__ uint32_t scaled(uint32_t pair, float factor) {
        __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&pair), __float2bfloat162_rn(factor));
        return *reinterpret_cast<uint32_t *>(&r);
    }
    static __device__ __forceinline__ uint32_t bias_a(uint32_t pair) { return scaled(pair, 4294967296.0f); } /* 2^32 */
    static __device__ __forceinline__ uint32_t bias_b(uint32_t pair) { return scaled(pair, 65536.0f); }      /* 2^16 */
    static constexpr float bias_unscale = 1.0f;
};

/* Codes as exact bf16 integers from two words of rows ka, kb: byte `byte` of each (4-bit: the low nibble is
 * column 2g, the high one 2g + 1; 8-bit: bytes byte and byte + 1). lo: (q[ka][2g], q[kb][2g]), hi: the same for
 * column 2g + 1, each a bf16x2 pair in k order. */
template <int BITS> __device__ __forceinline__ void column_pairs(uint32_t wa, uint32_t wb, int byte, uint32_t &lo,
                                                                 uint32_t &hi);
template <> __device__ __forceinline__ void column_pairs<4>(uint32_t wa, uint32_t wb, int byte, uint32_t &lo,
                                                            uint32_t &hi) {
    const uint32_t both = __byte_perm(wa, wb, (unsigned)(byte | (byte + 4) << 8)); /* bytes: wa's, -, wb's, - */
    lo = sub_magic(and_or(both, 0x000F000Fu, mma_traits<__nv_bfloat16>::magic), __nv_bfloat16());
    hi = sub_magic(and_or(both >> 4, 0x000F000Fu, mma_traits<__nv_bfloat16>::magic), __nv_bfloat16());
}
template <> __device__ __forceinline__ void column_pairs<8>(uint32_t wa, uint32_t wb, int byte, uint32_t &lo,
                                                            uint32_t &hi) {
    /* 8-bit codes through f32 (byte_code, exact), then packed: bf16 holds every integer ≤ 255 */
    const float a0 = byte_code(wa, byte), b0 = byte_code(wb, byte);
    const float a1 = byte_code(wa, byte + 1), b1 = byte_code(wb, byte + 1);
    __nv_bfloat162 l = __floats2bfloat162_rn(a0, b0), h = __floats2bfloat162_rn(a1, b1);
    lo = *reinterpret_cast<uint32_t *>(&l), hi = *reinterpret_cast<uint32_t *>(&h);
}

template <int ID> struct tile_n_config;
template <> struct tile_n_config<0> { static constexpr int WT = 2, WN = 2, WM = 2; }; /* m32n64 */
template <> struct tile_n_config<1> { static constexpr int WT = 1, WN = 4, WM = 1; }; /* m8n128 */

/* Split-K's last split: the sum of a tile's partials ([split][BM tokens][BN columns] f32 from `all`) in split order
 * 0 + p0 + p1 + …, each output finished as the unsplit kernel finishes it (× X_UNSCALE; the f64 direct form where
 * that is not finite). RUN outputs a thread at a time, the loads of two splits of the run issued together before
 * their adds (reduce_splits' pattern, mma_common.cuh: one L2 round trip per two splits of a run where one output at
 * a time waited one per split). Only the partials' token rows the tile has are loaded (M − m0 of BM). Not inlined:
 * its registers stay out of the main loop's. m32n64's only: m8n128 keeps one output at a time (below). */
template <int BITS, typename T, int GS, int BM, int BN, int THREADS>
__device__ __noinline__ void reduce_splits_n(const float *__restrict__ all, unsigned splits, const T *__restrict__ x,
                                             const uint32_t *__restrict__ w, const T *__restrict__ scales,
                                             const T *__restrict__ biases, T *__restrict__ out, int M, int N, int K,
                                             int n0, int m0) {
    constexpr int ELEMS = BM * BN, RUN = 4;
    for (int base = threadIdx.x; base < ELEMS; base += RUN * THREADS) {
        float v[RUN];
#pragma unroll
        for (int r = 0; r < RUN; r++) v[r] = 0.0f;
#pragma unroll 2
        for (unsigned z = 0; z < splits; z++) {
            float p[RUN];
#pragma unroll
            for (int r = 0; r < RUN; r++) {
                const int i = base + r * THREADS;
                p[r] = i < ELEMS && m0 + i / BN < M ? __ldcg(all + (size_t)z * ELEMS + i) : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < RUN; r++) v[r] += p[r];
        }
#pragma unroll
        for (int r = 0; r < RUN; r++) {
            const int i = base + r * THREADS, m = m0 + i / BN, n = n0 + i % BN;
            if (i >= ELEMS || m >= M || n >= N) continue;
            float o = v[r] * X_UNSCALE;
            if (!isfinite(o))
                o = direct_output_n(x + (size_t)m * K, w, scales, biases, BITS, (size_t)N, (size_t)K, GS, (size_t)n);
            store_f32(out, (size_t)m * N + n, o);
        }
    }
}

template <int BITS, typename T, int GS, int WT, int WN, int WM>
__global__ void __launch_bounds__(32 * WN * WM, 4)
    mma_tile_n_kernel(const T *__restrict__ x, const uint32_t *__restrict__ w, const T *__restrict__ scales,
                      const T *__restrict__ biases, T *__restrict__ out, int M, int N, int K, int x_vectors,
                      float *__restrict__ partials, unsigned *__restrict__ counters, int stages_per_split) {
    constexpr int THREADS = 32 * WN * WM;
    constexpr int BN = 16 * WR * WN, BM = 8 * WT * WM; /* columns × tokens per block */
    constexpr int P = n_traits<T>::parts;
    constexpr int WROW = BN * BITS / 32 + 4; /* words per staged row k: the block's columns + 4 of padding (banks) */
    constexpr int WCH = BN * BITS / 128;     /* 16-byte chunks of a row's columns: 2 (4-bit) or 4 (8-bit) */
    constexpr int NG = BN / GS > 1 ? BN / GS : 1; /* groups the block's columns touch */
    __shared__ __align__(16) uint32_t ws[STAGES][KS][WROW];
    __shared__ __align__(16) T xs[STAGES][BM][KS]; /* 16-byte chunk c of token m stored at chunk c ^ (m & 7) */
    __shared__ __align__(16) float ss[STAGES][NG][KS]; /* s·2^48 */
    __shared__ __align__(16) T bs[STAGES][NG][KS];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wn = warp % WN, wm = warp / WN, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int words_per_row = N / 32 * BITS, groups = N / GS, g0 = n0 / GS;
    /* split z (grid.z) takes stages [z·stages_per_split, …) of the ceil(K/KS) */
    const int stage_begin = blockIdx.z * stages_per_split;
    const int count = max(0, min((K + KS - 1) / KS - stage_begin, stages_per_split));

    /* The copies of stage i (rows k = i·KS …): codes and x by cp.async (zeros past K, N and M); the scales and biases
     * (any alignment) through registers into `pending`, stored to shared memory by store_pending. */
    constexpr int SB_PER = (NG * KS + THREADS - 1) / THREADS; /* (scale, bias) entries per thread and stage */
    float s_pending[SB_PER];
    T b_pending[SB_PER];
    int pending_stage = -1;
    /* entry j of this thread: index threadIdx.x + j·THREADS < NG·KS, group index / KS, row index % KS */
    auto issue = [&](int i) {
        if (i < count) {
            const int stage = i % STAGES, k_base = (stage_begin + i) * KS;
#pragma unroll
            for (int c = threadIdx.x; c < KS * WCH; c += THREADS) {
                const int row = c / WCH, chunk = c % WCH, k = k_base + row;
                const int word = n0 / 32 * BITS + 4 * chunk; /* first word of the chunk's columns in row k */
                const bool ok = k < K && word < words_per_row;
                const uint32_t *src = w + (ok ? (size_t)k * (size_t)words_per_row + (size_t)word : 0);
                cp_async_16((unsigned)__cvta_generic_to_shared(&ws[stage][row][4 * chunk]), src, ok);
            }
#pragma unroll
            for (int c = threadIdx.x; c < BM * (KS / 8); c += THREADS) {
                const int tok = c / (KS / 8), chunk = c % (KS / 8), m = m0 + tok, k = k_base + 8 * chunk;
                T *dst = &xs[stage][tok][8 * (chunk ^ (tok & 7))];
                if (x_vectors) { /* K % 8 == 0 and x 16-byte aligned: whole chunks */
                    const bool ok = m < M && k < K;
                    cp_async_16((unsigned)__cvta_generic_to_shared(dst), x + (ok ? (size_t)m * K + k : 0), ok);
                } else { /* any K: element by element, zeros past K and M */
#pragma unroll
                    for (int e = 0; e < 8; e++) dst[e] = m < M && k + e < K ? x[(size_t)m * K + k + e] : T();
                }
            }
#pragma unroll
            for (int j = 0; j < SB_PER; j++) {
                const int index = threadIdx.x + j * THREADS, group = g0 + index / KS, k = k_base + index % KS;
                const bool ok = index < NG * KS && k < K && group < groups;
                s_pending[j] = ok ? load_f32(scales, (size_t)k * groups + group) * X_SCALE : 0.0f;
                b_pending[j] = ok ? biases[(size_t)k * groups + group] : T();
            }
            pending_stage = stage;
        }
        asm volatile("cp.async.commit_group;");
    };
    auto store_pending = [&]() {
        if (pending_stage >= 0) {
#pragma unroll
            for (int j = 0; j < SB_PER; j++) {
                const int index = threadIdx.x + j * THREADS;
                if (index < NG * KS) {
                    ss[pending_stage][index / KS][index % KS] = s_pending[j];
                    bs[pending_stage][index / KS][index % KS] = b_pending[j];
                }
            }
            pending_stage = -1;
        }
    };

    float acc[WR][WT][4], accb[WT][4];
#pragma unroll
    for (int tt = 0; tt < WT; tt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            accb[tt][e] = 0.0f;
#pragma unroll
            for (int r = 0; r < WR; r++) acc[r][tt][e] = 0.0f;
        }

#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) {
        issue(i);
        store_pending();
    }

    const int col_base = wn * 16 * WR, tok_base = wm * 8 * WT;
    const int group_slot = BN / GS > 1 ? col_base / GS : 0; /* the warp's 32 columns lie in one group */
    for (int i = 0; i < count; i++) {
        store_pending(); /* stage (i + STAGES − 2) % STAGES: free since iteration i − 1's barrier */
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
        __syncthreads();
        issue(i + STAGES - 1);
        const int stage = i % STAGES;
#pragma unroll
        for (int kk = 0; kk < KS / 16; kk++) {
            const int k0 = 16 * kk;
            /* A: the codes of the warp's two 16-column tiles, k slots 2t, 2t + 1 (a0, a1) and 2t + 8, 2t + 9 (a2, a3) */
            uint32_t a[WR][4];
#pragma unroll
            for (int r = 0; r < WR; r++) { /* columns 2g, 2g + 1 of tile r: byte `byte` of word `word` of a row k */
                const int col = col_base + 16 * r + 2 * g, word = col * BITS / 32, byte = (col * BITS % 32) / 8;
                column_pairs<BITS>(ws[stage][k0 + 2 * t][word], ws[stage][k0 + 2 * t + 1][word], byte, a[r][0], a[r][1]);
                column_pairs<BITS>(ws[stage][k0 + 2 * t + 8][word], ws[stage][k0 + 2 * t + 9][word], byte, a[r][2],
                                   a[r][3]);
            }
            /* the biases of the warp's group at the lane's k slots: the bias MMA's A (every row the same) */
            const uint32_t b01 = n_traits<T>::bias_a(*reinterpret_cast<const uint32_t *>(&bs[stage][group_slot][k0 + 2 * t]));
            const uint32_t b89 =
                n_traits<T>::bias_a(*reinterpret_cast<const uint32_t *>(&bs[stage][group_slot][k0 + 2 * t + 8]));
            const uint32_t ab[4] = {b01, b01, b89, b89};
            const float2 s01 = *reinterpret_cast<const float2 *>(&ss[stage][group_slot][k0 + 2 * t]);
            const float2 s89 = *reinterpret_cast<const float2 *>(&ss[stage][group_slot][k0 + 2 * t + 8]);
#pragma unroll
            for (int tt = 0; tt < WT; tt++) {
                const int tok = tok_base + 8 * tt + g;
                const T *row = xs[stage][tok];
                const int e01 = k0 + 2 * t, e89 = e01 + 8; /* elements; chunk e/8 is stored at (e/8) ^ (tok & 7) */
                const uint32_t x01 = *reinterpret_cast<const uint32_t *>(row + 8 * ((e01 >> 3) ^ (tok & 7)) + (e01 & 7));
                const uint32_t x89 = *reinterpret_cast<const uint32_t *>(row + 8 * ((e89 >> 3) ^ (tok & 7)) + (e89 & 7));
                mma_16816(accb[tt], ab, n_traits<T>::bias_b(x01), n_traits<T>::bias_b(x89), T());
                const float2 f01 = n_traits<T>::widen(x01), f89 = n_traits<T>::widen(x89);
                uint32_t p01[P], p89[P]; /* x·s·2^48 (exact in f32) in bf16 parts */
                split_bf16_parts<P>(f01.x * s01.x, f01.y * s01.y, p01);
                split_bf16_parts<P>(f89.x * s89.x, f89.y * s89.y, p89);
#pragma unroll
                for (int r = 0; r < WR; r++)
#pragma unroll
                    for (int p = 0; p < P; p++) mma_16816(acc[r][tt], a[r], p01[p], p89[p], __nv_bfloat16());
            }
        }
    }
    asm volatile("cp.async.wait_all;");

    /* C: e = 2h + e' is MMA row g + 8h — column col_base + 16r + 2g + h — and token 8tt + 2t + e'. The output is
     * (Σq·x' + Σb·x)·2^-48, or the f64 direct form where that is not finite. */
    auto finish = [&](int m, int n, float sum) {
        float v = sum * X_UNSCALE;
        if (!isfinite(v))
            v = direct_output_n(x + (size_t)m * K, w, scales, biases, BITS, (size_t)N, (size_t)K, GS, (size_t)n);
        store_f32(out, (size_t)m * N + n, v);
    };
    if (gridDim.z == 1) {
#pragma unroll
        for (int r = 0; r < WR; r++)
#pragma unroll
            for (int tt = 0; tt < WT; tt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int n = n0 + col_base + 16 * r + 2 * g + (e >> 1), m = m0 + tok_base + 8 * tt + 2 * t + (e & 1);
                    if (n < N && m < M) finish(m, n, acc[r][tt][e] + accb[tt][e & 1] * n_traits<T>::bias_unscale);
                }
        return;
    }
    /* Split-K: this split's sums to the workspace; the last split of the tile to arrive adds them in split order
     * 0, 1, … (the result does not depend on which block finished last) and finishes the outputs. */
    const unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
    float *mine = partials + ((size_t)tile * gridDim.z + blockIdx.z) * (BM * BN);
#pragma unroll
    for (int r = 0; r < WR; r++)
#pragma unroll
        for (int tt = 0; tt < WT; tt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                mine[(tok_base + 8 * tt + 2 * t + (e & 1)) * BN + col_base + 16 * r + 2 * g + (e >> 1)] =
                    acc[r][tt][e] + accb[tt][e & 1] * n_traits<T>::bias_unscale;
    if (!split_arrived_last(counters, tile)) return;
    if constexpr (WT == 1) { /* m8n128: one output at a time. With reduce_splits_n its kernels took 100 registers (from
                              * 94–96), five blocks an SM became four: 1.14–1.37× the time at M ≤ 4; held to five by the
                              * launch bounds (79–86 registers) still 1.02–1.22× at M = 1 (docs/PERF.md, thirty-fifth
                              * session) */
        const float *all = partials + (size_t)tile * gridDim.z * (BM * BN);
        for (int i = threadIdx.x; i < BM * BN; i += THREADS) {
            const int m = m0 + i / BN, n = n0 + i % BN;
            if (m >= M || n >= N) continue;
            float sum = 0.0f;
            for (unsigned z = 0; z < gridDim.z; z++) sum += __ldcg(all + (size_t)z * (BM * BN) + i);
            finish(m, n, sum);
        }
    } else {
        reduce_splits_n<BITS, T, GS, BM, BN, THREADS>(partials + (size_t)tile * gridDim.z * (BM * BN), gridDim.z, x, w,
                                                      scales, biases, out, M, N, K, n0, m0);
    }
    if (threadIdx.x == 0) counters[tile] = 0; /* ready for the next launch on the stream */
}

template <int BITS, typename T, int GS, int ID> int launch_n(const qmm_cuda_launch *c) {
    typedef tile_n_config<ID> C;
    constexpr int BN = 16 * WR * C::WN, BM = 8 * C::WT * C::WM;
    int per_split;
    const int splits = split_count((int)((c->K + KS - 1) / KS), c->splits, &per_split);
    dim3 grid((unsigned)((c->N + BN - 1) / BN), (unsigned)((c->M + BM - 1) / BM), (unsigned)splits);
    const int x_vectors = c->K % 8 == 0 && (uintptr_t)c->x % 16 == 0;
    return launch_kernel(mma_tile_n_kernel<BITS, T, GS, C::WT, C::WN, C::WM>, grid, dim3(32 * C::WN * C::WM), 0,
                         c->stream, false, (const T *)c->x, c->w, (const T *)c->scales, (const T *)c->biases,
                         (T *)c->out, (int)c->M, (int)c->N, (int)c->K, x_vectors, c->partials, c->counters, per_split);
}

template <int ID> int dispatch_n(const qmm_cuda_launch *c) {
    const bool f16 = c->dtype == 1;
#define QMM_N_GS(BITS, T)                                                                                         \
    (c->group_size == 32 ? launch_n<BITS, T, 32, ID>(c)                                                           \
                         : c->group_size == 64 ? launch_n<BITS, T, 64, ID>(c) : launch_n<BITS, T, 128, ID>(c))
    if (c->dtype == 0) return (int)cudaErrorInvalidValue; /* supports() refuses f32 */
    if (c->bits == 4) return f16 ? QMM_N_GS(4, __half) : QMM_N_GS(4, __nv_bfloat16);
    return f16 ? QMM_N_GS(8, __half) : QMM_N_GS(8, __nv_bfloat16);
#undef QMM_N_GS
}

} // namespace

extern "C" int qmm_cuda_mma_tile_qmm_n(const qmm_cuda_launch *c, int tile) {
    return tile == 0 ? dispatch_n<0>(c) : dispatch_n<1>(c);
}

extern "C" void qmm_cuda_mma_tile_n_shape(int tile, int *bn, int *bm, int *bk) {
    const int wn = tile == 0 ? tile_n_config<0>::WN : tile_n_config<1>::WN;
    const int tokens = tile == 0 ? tile_n_config<0>::WT * tile_n_config<0>::WM : tile_n_config<1>::WT * tile_n_config<1>::WM;
    *bn = 16 * WR * wn, *bm = 8 * tokens, *bk = KS;
}
