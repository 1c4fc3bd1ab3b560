/*
 * kernels_tile.cu — the mma_tile family: tensor-core tiles for M > 16 (batched decode through prefill),
 * 4- and 8-bit weights with f16/bf16 activations (docs/kernels.md §9.3), and f32 activations as three bf16 parts
 * (tile 4, the mma_tile_bf16x3 row, §9.7).
 *
 * A block computes BN = 16·WR·WN weight rows × BM = 8·WT·WM tokens. Its WN × WM warps each own a
 * 16·WR × 8·WT sub-tile: weights on the MMA's M side (m16), tokens on its N side (n8), as in mma_gemv,
 * so the same exact decoding (codes → f16/bf16 integers in registers) and the same per-group f32 scaling
 * acc += s·Σq·x + b·Σx apply. What the tile adds is reuse: each super-block of K (64 bytes per weight row,
 * 128 codes at 4 bits, 64 at 8) is staged once per block in shared memory by a multi-stage cp.async
 * pipeline — the repacked weight quarters (docs/kernels.md §9.1), the (scale, bias) pair of every 32-code
 * block, and the block's BM rows of x — and every decoded weight fragment feeds WT token tiles, every x
 * fragment WR row tiles.
 *
 * Shared-memory x is stored [token][16-byte chunk] with the chunk index XOR-ed by (token & 1) << 2: the 8
 * lanes of a 128-bit load phase read tokens g and g + 1 at the same chunk, which would otherwise hit the
 * same banks (rows are 128 or 256 bytes long).
 *
 * Split-K (grid.z = splits > 1): when BN × BM tiles are too few to fill the SMs, split z takes a contiguous
 * range of super-blocks and writes its f32 partial tile to a workspace; the last split of a tile to finish
 * (a per-tile arrival counter) adds the partials in split order 0, 1, … — so the result does not depend on
 * which block finished last — applies the non-finite rule and stores. With splits = 1 (always, in
 * batch-invariant mode) each output is reduced in one order that depends on neither M nor the tile shape:
 * super-blocks in order, within each the group segments in order, each segment's MMAs chained in k order.
 */
#include <type_traits>

#include "cuda_internal.h"
#include "mma_common.cuh"

/* What the tile multiplies for activations of type T: 16-bit x as it is (one part), f32 x as three bf16 parts
 * (split_bf16x3, docs/kernels.md §9.7) with the codes decoded to bf16 integers. */
template <typename T> struct tile_x {
    typedef T mma;
    static constexpr int parts = 1;
};
template <> struct tile_x<float> {
    typedef __nv_bfloat16 mma;
    static constexpr int parts = 3;
};

/* Group: tile_ungrouped (one product: grid (N tiles, M tiles, splits)) or a grouped launch's table
 * (qmm_cuda_grouped_table in the parameter, grouped_device_table uploaded: the gather's expert blocks) — then grid.z is
 * the product, whose entry offsets the pointers from the bases and gives its M; grid.y covers the largest product's M
 * tiles (a block past its product's M returns at once); no split-K. */
struct tile_ungrouped {};
template <int BITS, typename T, int GS, int WR, int WT, int WN, int WM, int S, int MIN_BLOCKS, typename Group>
__global__ void __launch_bounds__(32 * WN * WM, MIN_BLOCKS)
    mma_tile_kernel(const __grid_constant__ Group group, const T *__restrict__ x, const uint4 *__restrict__ packed,
                    const uint32_t *__restrict__ sb, const uint32_t *__restrict__ w_orig,
                    const T *__restrict__ scales, const T *__restrict__ biases, T *__restrict__ out,
                    float *__restrict__ partials, unsigned *__restrict__ counters, int M, int N, int K,
                    int sb_per_split) {
    constexpr bool GROUPED = !std::is_same<Group, tile_ungrouped>::value;
    if constexpr (GROUPED) {
        const auto &e = grouped_entry(group, blockIdx.z); /* __grid_constant__: never copied to local memory */
        M = (int)e.M;
        if ((int)blockIdx.y * (8 * WT * WM) >= M) return;
        x += e.x, packed += e.packed, sb += e.sb, w_orig += e.w, scales += e.scales, biases += e.scales;
        out += e.out;
    }
    constexpr int BPS = BITS == 4 ? 4 : 2; /* 32-code blocks per super-block */
    constexpr int WPB = BITS / 4;          /* words per lane per block */
    constexpr int BPG = GS / 32;           /* blocks per group */
    constexpr int BN = 16 * WR * WN, BM = 8 * WT * WM;
    typedef typename tile_x<T>::mma MT;          /* the MMA's operand type */
    constexpr int XP = tile_x<T>::parts;         /* x parts per value: 1, or 3 for f32 */
    constexpr bool F32 = XP == 3;
    constexpr int XB = (int)sizeof(T) / 2;       /* x and (scale, bias) size in 16-bit units: 1, or 2 for f32 */
    constexpr int XCH = BPS * 4 * XB;            /* 16-byte chunks of x per token and super-block */
    constexpr int XSW = F32 ? 1 : 4;             /* the swizzle's chunk bit (see x_dst) */
    constexpr int THREADS = 32 * WN * WM;
    extern __shared__ uint4 smem[];
    uint4 *ws = smem;                                           /* [S][BN][4] weight quarters */
    uint4 *xs = ws + S * BN * 4;                                /* [S][BM][XCH] x, swizzled */
    constexpr int GSB = sb_pairs_per_super_block(BITS, GS);          /* pairs per row and super-block */
    constexpr int GSBW = GSB * XB;                                   /* their 32-bit words (f32: scale, bias) */
    uint32_t *sbs = reinterpret_cast<uint32_t *>(xs + S * BM * XCH); /* [S][BN][GSBW] (scale, bias) pairs */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wn = warp % WN, wm = warp / WN, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int blocks = K / 32, super_blocks = (blocks + BPS - 1) / BPS, groups = K / GS;
    const int sb_begin = GROUPED ? 0 : (int)blockIdx.z * sb_per_split;
    const int sb_end = min(super_blocks, sb_begin + sb_per_split);
    const int count = max(0, sb_end - sb_begin);
    const uint32_t ones[4] = {mma_traits<MT>::ones, mma_traits<MT>::ones, mma_traits<MT>::ones, mma_traits<MT>::ones};

    /* Copies of the block's i-th super-block into stage i % S (always commits a group, maybe empty). Rows
     * past N, tokens past M and blocks past K are zero-filled (src-size 0): no branch depends on data. Each
     * thread copies fixed rows, tokens and chunks (the counts divide evenly: static_asserts below), so its
     * source pointers are computed once here and only move along K per super-block. */
    /* x: BM·XCH chunks; with fewer chunks than threads (the 16-token tiles at 8 bits) the threads past them copy none */
    constexpr int W_COPIES = BN * 4 / THREADS, X_COPIES = (BM * XCH + THREADS - 1) / THREADS;
    constexpr bool X_ALL = BM * XCH >= THREADS; /* every thread copies x */
    constexpr int SB_CHUNKS = BN / 16 * 4 * GSBW; /* 16-byte chunks of pairs: BN/16 runs of 16·GSBW words */
    static_assert(BN * 4 % THREADS == 0 && W_COPIES >= 1 && (BM * XCH % THREADS == 0 || THREADS % (BM * XCH) == 0),
                  "every thread copies the same number of weight chunks, and of x chunks or none");
    const int w_row = threadIdx.x >> 2, w_quad = threadIdx.x & 3;          /* + k·THREADS/4 rows */
    const int x_tok = threadIdx.x / XCH, x_chunk = threadIdx.x % XCH;      /* + k·THREADS/XCH tokens */
    /* row w_row + k·THREADS/4 of the block: tile (n0 + w_row)/16 + k·THREADS/64, the same row within its tile
     * (the tiled layout, packed_tiled_quad); rows past N clamped to a valid address (not read) */
    static_assert(THREADS % 64 == 0, "the copies step whole row tiles");
    const uint4 *w_src = packed + packed_tiled_quad<size_t>((size_t)min(n0 + w_row, N - 1), (size_t)super_blocks, 0) + w_quad;
    const T *x_src = x + (size_t)min(m0 + x_tok, M - 1) * K + x_chunk * (16 / (int)sizeof(T));
    const int sb_tile = n0 / 16 + (int)threadIdx.x / (4 * GSBW), row_tiles = (N + 15) / 16; /* + k·THREADS/(4·GSBW) */
    const unsigned w_dst = (unsigned)__cvta_generic_to_shared(ws + w_row * 4 + w_quad);
    /* swizzle: a lane's x of block j is chunk 4j + t (16-bit x) or chunks 2(4j + t) and + 1 (f32); the 8 lanes of a
     * 128-bit load phase read tokens g and g + 1, whose rows would put those chunks in the same banks */
    const unsigned x_dst = (unsigned)__cvta_generic_to_shared(xs + x_tok * XCH + (x_chunk ^ ((x_tok & 1) * XSW)));
    const unsigned sb_dst = (unsigned)__cvta_generic_to_shared(sbs + 4 * threadIdx.x);
    auto issue = [&](int i) {
        if (i < count) {
            const int sbk = sb_begin + i, stage = i % S;
#pragma unroll
            for (int k = 0; k < W_COPIES; k++) {
                const bool ok = n0 + w_row + k * (THREADS / 4) < N;
                /* 32-bit: < ceil(N/16)·16·super_blocks·4 < 2^31 16-byte units (supports()) */
                const uint4 *src = w_src + (ok ? ((unsigned)k * (THREADS / 64) * (unsigned)super_blocks + (unsigned)sbk) * 64u : 0u);
                const unsigned dst = w_dst + (unsigned)((stage * BN + k * (THREADS / 4)) * 4 * 16);
                cp_async_16(dst, src, ok);
            }
            const bool x_in_k = sbk * BPS + x_chunk / (4 * XB) < blocks;
#pragma unroll
            for (int k = 0; k < X_COPIES && (X_ALL || x_tok < BM); k++) {
                /* THREADS/XCH is even, so (token & 1) and the swizzle are the same for every k */
                const bool ok = x_in_k && m0 + x_tok + k * (THREADS / XCH) < M;
                const T *src = x_src + (ok ? (size_t)k * (THREADS / XCH) * K + (size_t)sbk * (BPS * 32) : 0);
                const unsigned dst = x_dst + (unsigned)((stage * BM + k * (THREADS / XCH)) * XCH * 16);
                cp_async_16(dst, src, ok);
            }
#pragma unroll
            for (int c0 = 0; c0 < SB_CHUNKS; c0 += THREADS) { /* the sb_tiled layout (docs/kernels.md §9) */
                if (c0 + (int)threadIdx.x < SB_CHUNKS) {
                    const int tile = sb_tile + c0 / (4 * GSBW);
                    const bool ok = tile < row_tiles;
                    const uint4 *src =
                        reinterpret_cast<const uint4 *>(sb + (ok ? 4 * sb_tiled_run<size_t>(tile, super_blocks, sbk, GSBW) : 0)) +
                        (ok ? (threadIdx.x % (4 * GSBW)) : 0);
                    const unsigned dst = sb_dst + (unsigned)((stage * BN * GSBW + 4 * c0) * 4);
                    cp_async_16(dst, src, ok);
                }
            }
        }
        asm volatile("cp.async.commit_group;");
    };
    static_assert((THREADS / XCH) % 2 == 0, "the x swizzle needs an even token step");

    float acc[WR][WT][4];
#pragma unroll
    for (int r = 0; r < WR; r++)
#pragma unroll
        for (int tt = 0; tt < WT; tt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[r][tt][e] = 0.0f;

#pragma unroll
    for (int i = 0; i < S - 1; i++) issue(i);

    const int row_base = wn * 16 * WR, tok_base = wm * 8 * WT;
    for (int i = 0; i < count; i++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 2)); /* this thread's copies of super-block i landed */
        __syncthreads(); /* everyone's have, and everyone finished super-block i − 1 */
        issue(i + S - 1); /* into the stage of super-block i − 1 */
        const int stage = i % S;
        float cq[WR][WT][4], cx[WT][4];
#pragma unroll
        for (int j = 0; j < BPS; j++) {
            if (j % BPG == 0) { /* a segment (group ∩ super-block) starts */
#pragma unroll
                for (int tt = 0; tt < WT; tt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        cx[tt][e] = 0.0f;
#pragma unroll
                        for (int r = 0; r < WR; r++) cq[r][tt][e] = 0.0f;
                    }
            }
            uint32_t b[WT][XP][4]; /* B pairs per token tile and x part */
#pragma unroll
            for (int tt = 0; tt < WT; tt++) {
                const int tok = tok_base + 8 * tt + g;
                if constexpr (F32) {
                    const float4 *row = reinterpret_cast<const float4 *>(xs + (stage * BM + tok) * XCH);
                    const int c = 2 * (4 * j + t), sw = tok & 1;
                    const float4 v0 = row[c ^ sw], v1 = row[(c + 1) ^ sw];
                    const float f[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
                    x_pairs_bf16x3<BITS>(f, b[tt]);
                } else {
                    x_pairs<BITS>(xs[(stage * BM + tok) * XCH + ((4 * j + t) ^ ((tok & 1) << 2))], b[tt][0]);
                }
#pragma unroll
                for (int p = 0; p < XP; p++) {
                    mma_16816(cx[tt], ones, b[tt][p][0], b[tt][p][1], MT());
                    mma_16816(cx[tt], ones, b[tt][p][2], b[tt][p][3], MT());
                }
            }
#pragma unroll
            for (int r = 0; r < WR; r++) {
                /* the lane's words of block j, rows g and g + 8 (read here, not held across blocks: registers) */
                const uint32_t *w0 = reinterpret_cast<const uint32_t *>(ws + (stage * BN + row_base + 16 * r + g) * 4 + t);
                const uint32_t *w1 = reinterpret_cast<const uint32_t *>(ws + (stage * BN + row_base + 16 * r + 8 + g) * 4 + t);
                uint32_t a[2][4];
                block_a_fragments<BITS, MT>(w0 + j * WPB, w1 + j * WPB, a);
#pragma unroll
                for (int tt = 0; tt < WT; tt++)
#pragma unroll
                    for (int p = 0; p < XP; p++) { /* f32: part p over both k16 steps, parts in order hi, mid, lo */
                        mma_16816(cq[r][tt], a[0], b[tt][p][0], b[tt][p][1], MT());
                        mma_16816(cq[r][tt], a[1], b[tt][p][2], b[tt][p][3], MT());
                    }
            }
            if ((j + 1) % BPG == 0 || j == BPS - 1) { /* the segment ends: acc += s·Σq·x + b·Σx */
                if constexpr (F32) { /* Σx and Σq·x of x·2^24 (split_bf16x3): back by 2^-24, exactly */
#pragma unroll
                    for (int tt = 0; tt < WT; tt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            if (e < 2) cx[tt][e] *= 0x1p-24f; /* rows g and g + 8 of the all-ones product agree */
#pragma unroll
                            for (int r = 0; r < WR; r++) cq[r][tt][e] *= 0x1p-24f;
                        }
                }
#pragma unroll
                for (int r = 0; r < WR; r++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint32_t *pair = sbs + (stage * BN + row_base + 16 * r + 8 * h + g) * GSBW + XB * (j / BPG);
                        float s, bias;
                        if constexpr (F32) {
                            s = __uint_as_float(pair[0]), bias = __uint_as_float(pair[1]);
                        } else {
                            const float2 s_b = scale_bias(pair[0], T());
                            s = s_b.x * mma_decode<BITS, T>::code_scale; /* exact: a power of two */
                            bias = s_b.y;
                        }
#pragma unroll
                        for (int tt = 0; tt < WT; tt++)
#pragma unroll
                            for (int e = 0; e < 2; e++)
                                acc[r][tt][2 * h + e] =
                                    __fmaf_rn(s, cq[r][tt][2 * h + e], __fmaf_rn(bias, cx[tt][e], acc[r][tt][2 * h + e]));
                    }
            }
        }
    }
    asm volatile("cp.async.wait_all;");

    /* C fragment: e = 2h + e' is row 16r + 8h + g, token 8tt + 2t + e'. */
    if (GROUPED || gridDim.z == 1) {
#pragma unroll
        for (int r = 0; r < WR; r++)
#pragma unroll
            for (int tt = 0; tt < WT; tt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int n = n0 + row_base + 16 * r + 8 * (e >> 1) + g, m = m0 + tok_base + 8 * tt + 2 * t + (e & 1);
                    if (n < N && m < M) {
                        float v = acc[r][tt][e];
                        if (!isfinite(v))
                            v = direct_output_t(x + (size_t)m * K, w_orig + (size_t)n * (K / 32 * BITS),
                                                scales + (size_t)n * groups, biases + (size_t)n * groups, BITS,
                                                (size_t)K, GS);
                        store_f32(out, (size_t)m * N + n, v);
                    }
                }
        return;
    }

    /* Split-K: this split's partial tile, then the last split of the tile to arrive adds them in order. */
    const unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
    float *mine = partials + ((size_t)tile * gridDim.z + blockIdx.z) * (BM * BN);
#pragma unroll
    for (int r = 0; r < WR; r++)
#pragma unroll
        for (int tt = 0; tt < WT; tt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = row_base + 16 * r + 8 * (e >> 1) + g, tok = tok_base + 8 * tt + 2 * t + (e & 1);
                mine[tok * BN + row] = acc[r][tt][e];
            }
    if (!split_arrived_last(counters, tile)) return;
    reduce_splits<BITS, T, GS, BM, BN, THREADS>(reinterpret_cast<const float4 *>(partials + (size_t)tile * gridDim.z * (BM * BN)),
                                                 gridDim.z, x, w_orig, scales, biases, out, M, N, K, n0, m0);
    if (threadIdx.x == 0) counters[tile] = 0; /* ready for the next launch on the stream */
}

/* ───────────────────────────── launcher ───────────────────────────── */

/* The tiles the table uses: id → (WR, WT, WN, WM, stages, blocks per SM the registers must allow). */
#ifndef QMM_TILE0_STAGES
#define QMM_TILE0_STAGES 3
#endif
#ifndef QMM_TILE0_MIN_BLOCKS
#define QMM_TILE0_MIN_BLOCKS 3
#endif
/* F32: the tile takes f32 activations (bf16x3, tile_x<float>) and only those; the others f16 and bf16. */
template <int ID> struct tile_config;
template <> struct tile_config<0> { /* m64n64: 4 warps of 32 rows × 32 tokens, 3 blocks per SM */
    static constexpr int WR = 2, WT = 4, WN = 2, WM = 2, S = QMM_TILE0_STAGES, MIN_BLOCKS = QMM_TILE0_MIN_BLOCKS;
    static constexpr bool F32 = false;
};
template <> struct tile_config<1> { /* m64n128: 8 warps of 32 rows × 32 tokens (64 rows per warp spill at 4 bits) */
    static constexpr int WR = 2, WT = 4, WN = 4, WM = 2, S = 4, MIN_BLOCKS = 1;
    static constexpr bool F32 = false;
};
/* The small-M tiles (the selector takes m16n256 for batch-invariant calls at M 17–32 with N ≥ 12288 — in the default
 * mode mma_gemv m16n64, first in the table, takes those; m32n256 is for tuning and forcing):
 * every warp of the block takes all BM tokens and its own 32 rows, so the block's x — read from L2 once per 256
 * weight rows, not once per warp as in mma_gemv (whose 16-row warps at 32 tokens read 8 bytes of x per byte of
 * weights) — is shared through shared memory by 8 warps. */
template <> struct tile_config<2> { /* m16n256: 8 warps of 32 rows × 16 tokens */
    static constexpr int WR = 2, WT = 2, WN = 8, WM = 1, S = 4, MIN_BLOCKS = 2;
    static constexpr bool F32 = false;
};
template <> struct tile_config<3> { /* m32n256: 8 warps of 32 rows × 32 tokens (one block per SM: two would spill) */
    static constexpr int WR = 2, WT = 4, WN = 8, WM = 1, S = 4, MIN_BLOCKS = 1;
    static constexpr bool F32 = false;
};
/* f32 activations (docs/kernels.md §9.7): m32n128, 4 warps of 64 rows × 16 tokens, 2 blocks per SM. Each x value is
 * split into three bf16 parts by every warp that reads it, so a warp takes 4 row tiles per token tile (the split and
 * the Σx products amortised over 64 rows); x takes 4 bytes a value in shared memory, so 32 tokens per stage (16 KB
 * at 4 bits) and 3 stages keep two blocks on an SM. */
#ifndef QMM_TILE4_STAGES
#define QMM_TILE4_STAGES 3
#endif
template <> struct tile_config<4> {
    static constexpr int WR = 4, WT = 2, WN = 2, WM = 2, S = QMM_TILE4_STAGES, MIN_BLOCKS = 2;
    static constexpr bool F32 = true;
};

/* Dynamic shared memory of a tile's block: S stages of the BN rows' weight quarters, the BM tokens' x (64 bytes per
 * 32 codes, twice that for f32) and the pairs (room for 4 per row and super-block at 4 bits, 2 at 8; 4 or 8 bytes
 * each). */
template <int ID> static constexpr size_t tile_shared(int bits) {
    typedef tile_config<ID> C;
    constexpr int XB = C::F32 ? 2 : 1;
    return (size_t)C::S * (16 * C::WR * C::WN * 64 + 8 * C::WT * C::WM * (bits == 4 ? 4 : 2) * 64 * XB +
                           16 * C::WR * C::WN * (bits == 4 ? 4 : 2) * 4 * XB);
}

template <int ID> static void tile_shape(int bits, int *bn, int *bm, int *threads, int *resident, size_t *shared) {
    typedef tile_config<ID> C;
    *bn = 16 * C::WR * C::WN;
    *bm = 8 * C::WT * C::WM;
    *threads = 32 * C::WN * C::WM;
    *resident = C::MIN_BLOCKS;
    *shared = tile_shared<ID>(bits);
}

template <int BITS, typename T, int GS, int ID> static int launch_tile(const qmm_cuda_launch *c) {
    typedef tile_config<ID> C;
    constexpr int BPS = BITS == 4 ? 4 : 2, BN = 16 * C::WR * C::WN, BM = 8 * C::WT * C::WM;
    constexpr size_t shared = tile_shared<ID>(BITS);
    auto kernel = mma_tile_kernel<BITS, T, GS, C::WR, C::WT, C::WN, C::WM, C::S, C::MIN_BLOCKS, tile_ungrouped>;
    static unsigned long long opted_in = 0;
    const int opt_in = shared_memory_opt_in(kernel, shared, &opted_in);
    if (opt_in) return opt_in;
    const int super_blocks = (int)((c->K / 32 + BPS - 1) / BPS);
    const unsigned tiles_n = (unsigned)((c->N + BN - 1) / BN), tiles_m = (unsigned)((c->M + BM - 1) / BM);
    int per_split;
    const int splits = split_count(super_blocks, c->splits, &per_split);
    dim3 grid(tiles_n, tiles_m, (unsigned)splits);
    cudaGetLastError(); /* an earlier failure, already reported, must not be blamed on this launch */
    kernel<<<grid, 32 * C::WN * C::WM, shared, (cudaStream_t)c->stream>>>(
        tile_ungrouped{}, (const T *)c->x, (const uint4 *)c->packed, (const uint32_t *)c->sb, c->w,
        (const T *)c->scales, (const T *)c->biases, (T *)c->out, c->partials, c->counters, (int)c->M, (int)c->N, (int)c->K, per_split);
    return (int)cudaGetLastError();
}

/* Only the dtypes a tile takes are instantiated (CI compiles every instantiation on 2 cores). */
template <int ID> static int dispatch_tile(const qmm_cuda_launch *c) {
#define QMM_TILE_GS(BITS, T)                                                                                      \
    (c->group_size == 32 ? launch_tile<BITS, T, 32, ID>(c)                                                        \
                         : c->group_size == 64 ? launch_tile<BITS, T, 64, ID>(c) : launch_tile<BITS, T, 128, ID>(c))
    if constexpr (tile_config<ID>::F32) {
        if (c->dtype != 0) return (int)cudaErrorInvalidValue; /* supports() refuses these */
        return c->bits == 4 ? QMM_TILE_GS(4, float) : QMM_TILE_GS(8, float);
    } else {
        if (c->dtype == 0) return (int)cudaErrorInvalidValue;
        const bool f16 = c->dtype == 1;
        if (c->bits == 4) return f16 ? QMM_TILE_GS(4, __half) : QMM_TILE_GS(4, __nv_bfloat16);
        return f16 ? QMM_TILE_GS(8, __half) : QMM_TILE_GS(8, __nv_bfloat16);
    }
#undef QMM_TILE_GS
}

extern "C" int qmm_cuda_mma_tile_qmm_t(const qmm_cuda_launch *c, int tile) {
    switch (tile) {
    case 0: return dispatch_tile<0>(c);
    case 1: return dispatch_tile<1>(c);
    case 2: return dispatch_tile<2>(c);
    case 3: return dispatch_tile<3>(c);
    default: return dispatch_tile<4>(c);
    }
}

/* The grouped launch of tile 0 (m64n64; the gather's tile class off Hopper, cuda_backend.c): grid
 * (N tiles, the largest product's M tiles = ceil(launch->M / 64), products), at most 65535 products a launch. */
template <int BITS, typename T, int GS, typename Table>
static int launch_tile_grouped(const qmm_cuda_launch *c, const Table &table, int count) {
    typedef tile_config<0> C;
    constexpr int BPS = BITS == 4 ? 4 : 2, BN = 16 * C::WR * C::WN, BM = 8 * C::WT * C::WM;
    constexpr size_t shared = tile_shared<0>(BITS);
    auto kernel = mma_tile_kernel<BITS, T, GS, C::WR, C::WT, C::WN, C::WM, C::S, C::MIN_BLOCKS, Table>;
    static unsigned long long opted_in = 0;
    const int opt_in = shared_memory_opt_in(kernel, shared, &opted_in);
    if (opt_in) return opt_in;
    const int super_blocks = (int)((c->K / 32 + BPS - 1) / BPS);
    const dim3 grid((unsigned)((c->N + BN - 1) / BN), (unsigned)((c->M + BM - 1) / BM), (unsigned)count);
    cudaGetLastError(); /* an earlier failure, already reported, must not be blamed on this launch */
    kernel<<<grid, 32 * C::WN * C::WM, shared, (cudaStream_t)c->stream>>>(
        table, (const T *)c->x, (const uint4 *)c->packed, (const uint32_t *)c->sb, c->w, (const T *)c->scales,
        (const T *)c->biases, (T *)c->out, nullptr, nullptr, 0, (int)c->N, (int)c->K, super_blocks);
    return (int)cudaGetLastError();
}

template <int BITS, typename T, int GS>
static int launch_tile_grouped_from(const qmm_cuda_launch *c, const qmm_cuda_gemv_product *host_products,
                                    const qmm_cuda_gemv_product *device_products, int count) {
    if (device_products) return launch_tile_grouped<BITS, T, GS>(c, grouped_device_table{device_products}, count);
    return launch_tile_grouped<BITS, T, GS>(c, grouped_parameter_table(host_products, count), count);
}

extern "C" int qmm_cuda_mma_tile_grouped(const qmm_cuda_launch *c, const qmm_cuda_gemv_product *host_products,
                                         const qmm_cuda_gemv_product *device_products, int count) {
    if (!host_products == !device_products || c->dtype == 0 || (c->bits != 4 && c->bits != 8) || count < 1 ||
        count > (host_products ? QMM_CUDA_GROUPED_MAX : 65535))
        return (int)cudaErrorInvalidValue; /* the gather groups only what tile 0 takes */
#define QMM_TILE_GROUPED_GS(BITS, T)                                                                              \
    (c->group_size == 32   ? launch_tile_grouped_from<BITS, T, 32>(c, host_products, device_products, count)      \
     : c->group_size == 64 ? launch_tile_grouped_from<BITS, T, 64>(c, host_products, device_products, count)      \
                           : launch_tile_grouped_from<BITS, T, 128>(c, host_products, device_products, count))
    const bool f16 = c->dtype == 1;
    if (c->bits == 4) return f16 ? QMM_TILE_GROUPED_GS(4, __half) : QMM_TILE_GROUPED_GS(4, __nv_bfloat16);
    return f16 ? QMM_TILE_GROUPED_GS(8, __half) : QMM_TILE_GROUPED_GS(8, __nv_bfloat16);
#undef QMM_TILE_GROUPED_GS
}

extern "C" void qmm_cuda_mma_tile_shape(int tile, int bits, int *bn, int *bm, int *threads, int *resident,
                                        size_t *shared) {
    switch (tile) {
    case 0: tile_shape<0>(bits, bn, bm, threads, resident, shared); break;
    case 1: tile_shape<1>(bits, bn, bm, threads, resident, shared); break;
    case 2: tile_shape<2>(bits, bn, bm, threads, resident, shared); break;
    case 3: tile_shape<3>(bits, bn, bm, threads, resident, shared); break;
    default: tile_shape<4>(bits, bn, bm, threads, resident, shared); break;
    }
}
