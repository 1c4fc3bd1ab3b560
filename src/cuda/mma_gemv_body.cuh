/*
 * mma_gemv_body.cuh — the body of the mma GEMV kernels (kernels.cu): one block's products of 16·RT weight rows with
 * 8·TT rows of x. Included as the body of mma_gemv_kernel (one product per launch) and of mma_gemv_grouped_kernel
 * (a product per grid.z), each of which defines x, packed, sb, w_orig, scales, biases, out, M, N and K and the
 * template parameters BITS, T, RT, TT, S, GS, STAGED_X and ONE_TOKEN (mma_gemv_mixed_kernel: RT and TT as constants of
 * each of its two branches, and QMM_GEMV_N_BASE the block's first row). Not a __device__ function: inlined as one, ptxas scheduled
 * the 32-token tile's bf16 instantiations differently, 3–7 % slower on the H200 (docs/PERF.md, sixteenth session);
 * included, the single-product kernel's SASS is what it was.
 */
    constexpr int BPS = BITS == 4 ? 4 : 2; /* 32-code blocks per 64-byte super-block */
    constexpr int WPB = BITS / 4;          /* words per lane per block */
    constexpr int BPG = GS / 32;           /* blocks per group: 1, 2 or 4 */
    /* Dynamic shared memory: [NW][S][RT][2][32] uint4 weight stages, [NW][S][RT][2][32] uint32 (scale, bias)
     * stages, [NW][RT][TT][4][32] floats for the final reduction, then (STAGED_X) [NW][S][MX][4·BPS] uint4 x stages:
     * the MX = min(M, 8) tokens' x of the step's super-block, 16-byte chunk q of token m at q ^ 4(m & 1). */
    extern __shared__ uint4 shared_quads[];
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, NW = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    /* m16n64 (RT = 4, TT = 2) takes M = 17–64 in one grid: grid.x the chunks of 16 rows of x, grid.y the row tiles —
     * the chunks of one row tile are neighbours in launch order, run side by side, and the later ones find its weights
     * in L2 (the launcher may instead launch each chunk alone, M ≤ 16 each: grid.x is then 1). */
#ifdef QMM_GEMV_N_BASE /* mma_gemv_mixed_kernel: the block's first row, its blocks being of two heights; one chunk of
                        * x (M ≤ 16 at 16 tokens) */
    int n_base = QMM_GEMV_N_BASE;
#else
    int n_base = blockIdx.x * 16 * RT;
    if constexpr (RT == 4 && TT == 2) {
        const int m0 = blockIdx.x * 16;
        n_base = blockIdx.y * 16 * RT;
        x += (size_t)m0 * K;
        out += (size_t)m0 * N;
        M -= m0;
    }
#endif
    /* grid.y (the 32-token tile only): chunks of 32 rows of x, each an independent product on the same
     * weights, for M > 32 — every output is computed the same way whatever chunk it falls in. Not in the
     * other tiles: the offsets cost the gs32 instantiations of m8n64 and m16n32 spills under their
     * 128-register cap; the 8-token tiles serve M ≤ 8, and m16n32 takes M = 17–64 as one launch per
     * 16 rows of x (the host's mma_gemv_launch). */
    if (TT == 4) {
        const int m0 = blockIdx.y * 8 * TT;
        x += (size_t)m0 * K;
        out += (size_t)m0 * N;
        M -= m0;
    }
    const int blocks = K / 32, super_blocks = (blocks + BPS - 1) / BPS, groups = K / GS;
    /* HOISTED: the staged tiles' copies (m8n64, m8n48; below, with the measurements). (Its f16 sums in units of
     * 1/code_scale — Σx through an all-2^-24 / 2^-20 A operand, one FMUL per row pair and segment fewer, argued to change
     * no rounding — gave other bits than m8n32 in 3 of 7 cases on the H200, test_cuda's staged-x section; removed in the
     * twentieth session, docs/PERF.md.) */
    constexpr bool HOISTED = staged_tile<RT, TT> && staged_lean<BITS, GS>;
    const uint32_t ones[4] = {mma_traits<T>::ones, mma_traits<T>::ones, mma_traits<T>::ones, mma_traits<T>::ones};
    uint4 *stage_w = shared_quads + (size_t)warp * S * RT * 2 * 32;
    uint32_t *stage_sb = reinterpret_cast<uint32_t *>(shared_quads + (size_t)NW * S * RT * 2 * 32) + warp * S * RT * 2 * 32;
    float *partial = reinterpret_cast<float *>(shared_quads + (size_t)NW * S * RT * 2 * 32) + NW * S * RT * 2 * 32;
    static_assert(!STAGED_X || staged_tile<RT, TT>, "x is staged by the 48- and 64-row, 8-token tiles only");
    /* ONE_TOKEN (M = 1, x staged): the epilogue updates only the accumulators of even token columns (e = 0: token
     * 2t + 0 of the lane's pair; the odd ones are tokens ≥ 1, never stored) — 32 of the step's FFMAs fewer at 4 row
     * tiles and groups of 64 (24 at 3). */
    static_assert(!ONE_TOKEN || STAGED_X, "the one-token epilogue is an instantiation of the staged tiles");
    constexpr int XQ = 4 * BPS; /* 16-byte chunks of one token's x per super-block */
    const int MX = STAGED_X ? (ONE_TOKEN ? 1 : min(M, 8)) : 0; /* ONE_TOKEN: M = 1, known when compiled */
    uint4 *stage_x = reinterpret_cast<uint4 *>(partial + NW * RT * TT * 4 * 32) + (size_t)warp * S * MX * XQ;

    float acc[RT][TT][4];
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[r][tt][e] = 0.0f;

    /* Warp w takes super-blocks w, w + NW, w + 2·NW, ... through an S-stage cp.async pipeline in its own
     * shared memory: the weight quarters (L2 only: each weight byte is read once) and the (scale, bias)
     * pairs of S − 1 super-blocks are in flight while one is computed. A lane reads back the weight quarters
     * it copied itself; the pairs come as 16-byte chunks that other lanes read, so the warp synchronises
     * (__syncwarp) after its wait for a stage and before it overwrites the stage read the step before.
     * Blocks past the end of K are computed on zeros (zero-filled copies, zero pairs, zero x). */
    const int count = warp < super_blocks ? (super_blocks - warp + NW - 1) / NW : 0;
    constexpr int GSB = sb_pairs_per_super_block(BITS, GS); /* (scale, bias) pairs per row and super-block */
    constexpr int SB_CHUNKS = 4 * RT * GSB;                   /* 16-byte chunks of them per warp and super-block */
    const int row_tile0 = n_base / 16, row_tiles = (N + 15) / 16;
    /* HOISTED (the staged tiles, m8n64 and m8n48): the copies' addresses worked out once — a lane's source advances by
     * one super-block run per step of the warp (w_lane, sb_lane[]: 32-bit offsets of super-block 0 of its rows), the row
     * tiles r are tile_quads apart and the halves 512 bytes (immediates), the destination moves with the stage — and no
     * row checked against N: the arrays carry QMM_CUDA_PAD_ROW_TILES zero tiles after the last (cuda_internal.h), so
     * rows past N are computed on zeros (in a gather's expert slice, on the next expert's rows) and never stored.
     * 58 of the step's 623 instructions fewer (sm_90a, f16, groups of 64, x staged); measured on the H200 (docs/PERF.md,
     * nineteenth session): m8n64 0.94–0.98× the time at M = 1 on the large shapes, 0.976 over its 60 cells at M = 1
     * and 8. The same change made m16n64 1.03× slower (bf16 up to 1.09×: scheduled differently at its 168 registers)
     * and the 16-row tiles up to 1.07× on small shapes, so the other rows keep the per-copy offsets and checks — as do
     * m8n64's 4-bit groups of 32, where the held offsets made ptxas spill (8–12 bytes; not measured). */
    const unsigned tile_quads = (unsigned)super_blocks * 64u; /* 16-byte units from one row tile to the next */
    const unsigned w_lane = packed_tile_quad<unsigned>((unsigned)row_tile0, (unsigned)g, (unsigned)super_blocks, 0u) + (unsigned)t;
    const unsigned w_dst = (unsigned)__cvta_generic_to_shared(stage_w + lane);
    constexpr int SB_ROUNDS = (SB_CHUNKS + 31) / 32;
    unsigned sb_lane[SB_ROUNDS];
#pragma unroll
    for (int k = 0; k < SB_ROUNDS; k++) { /* chunk c of the warp's RT runs of 4·GSB chunks: run r = c / (4·GSB) */
        const int c = 32 * k + lane;
        sb_lane[k] = sb_tiled_run<unsigned>((unsigned)(row_tile0 + c / (4 * GSB)), (unsigned)super_blocks, 0u, GSB) +
                     (unsigned)(c % (4 * GSB));
    }
    const unsigned sb_dst = (unsigned)__cvta_generic_to_shared(stage_sb + 4 * lane);
    auto issue = [&](int i) { /* copies of the warp's i-th super-block into stage i % S (the caller commits) */
        if (i < count && HOISTED) {
            const unsigned sbk = (unsigned)(warp + i * NW), stage = (unsigned)(i % S);
            const unsigned w_step = w_lane + sbk * 64u;
#pragma unroll
            for (int r = 0; r < RT; r++) {
                const uint4 *src = packed + (w_step + r * tile_quads); /* the halves: + 32 units, an immediate */
#pragma unroll
                for (int h = 0; h < 2; h++) cp_async_16(w_dst + (stage * RT + r) * 1024u + h * 512u, src + 32 * h, true);
            }
            /* the pairs of the warp's 16·RT rows: RT runs of 16·GSB pairs (sb_tiled layout, docs/kernels.md §9) */
#pragma unroll
            for (int k = 0; k < SB_ROUNDS; k++)
                if (32 * k + lane < SB_CHUNKS)
                    cp_async_16(sb_dst + stage * (RT * 16 * GSB * 4u) + k * 512u,
                                reinterpret_cast<const uint4 *>(sb) + (sb_lane[k] + sbk * (4u * GSB)), true);
        } else if (i < count) {
            const int sbk = warp + i * NW, stage = i % S;
#pragma unroll
            for (int r = 0; r < RT; r++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int n = n_base + 16 * r + 8 * h + g;
                    const bool row = n < N;
                    /* n is row 8h + g of row tile row_tile0 + r (n_base is a multiple of 16: no division, which
                     * cost registers); 32-bit offsets: < ceil(N/16)·16·super_blocks·4 16-byte units < 2^31
                     * (supports()) */
                    const uint4 *src_w =
                        packed + (row ? packed_tile_quad<unsigned>((unsigned)(row_tile0 + r), (unsigned)(8 * h + g),
                                                                   (unsigned)super_blocks, (unsigned)sbk) + (unsigned)t
                                      : 0u);
                    const unsigned dst_w = (unsigned)__cvta_generic_to_shared(stage_w + ((stage * RT + r) * 2 + h) * 32 + lane);
                    cp_async_16(dst_w, src_w, row);
                }
            /* the pairs of the warp's 16·RT rows: RT runs of 16·GSB pairs (sb_tiled layout, docs/kernels.md §9) */
#pragma unroll
            for (int c0 = 0; c0 < SB_CHUNKS; c0 += 32) {
                const int c = c0 + lane, r = c / (4 * GSB), tile = row_tile0 + r;
                if (c < SB_CHUNKS) {
                    const bool ok = tile < row_tiles;
                    /* 32-bit offsets, as the weights' (supports()) */
                    const uint4 *src = reinterpret_cast<const uint4 *>(sb) +
                                       (ok ? sb_tiled_run<unsigned>(tile, super_blocks, sbk, GSB) + (unsigned)(c % (4 * GSB)) : 0u);
                    const unsigned dst = (unsigned)__cvta_generic_to_shared(stage_sb + stage * RT * 16 * GSB + 4 * c);
                    cp_async_16(dst, src, ok);
                }
            }
        }
    };
    /* STAGED_X: the x chunks of the warp's i-th super-block into stage i % S — tokens < MX only (the lanes of the
     * others use zeros), chunks past K zero-filled. After pdl_wait only: x may be the kernel before this one's output.
     * Lane l copies chunk q = l % XQ of tokens m = l / XQ + (32 / XQ)·r, r < 8·XQ / 32 (those < MX): its source and
     * destination advance by constants along r and K (the same chunk position, the same swizzle parity); lane (g, t)
     * reads token g's chunk 4j + t of block j at (4j + t) ^ 4(g & 1), i.e. 4j + t + 4(g & 1) for even j, − for odd. */
    constexpr int X_TPR = 32 / XQ, X_ROUNDS = 8 * XQ / 32; /* tokens per round of the warp's copies, rounds for 8 */
    const int x_q = lane % XQ, x_m0 = lane / XQ;
    const T *x_src = x + (size_t)x_m0 * K + 8 * x_q;
    const unsigned x_dst = (unsigned)__cvta_generic_to_shared(stage_x + x_m0 * XQ + (x_q ^ ((x_m0 & 1) << 2)));
    const uint4 *x_read_even = stage_x + g * XQ + t + 4 * (g & 1), *x_read_odd = stage_x + g * XQ + t - 4 * (g & 1);
    auto issue_x = [&](int i) {
        if (STAGED_X && i < count) {
            const int sbk = warp + i * NW;
            const bool ok = sbk * BPS + x_q / 4 < blocks;
            const T *src = ok ? x_src + (size_t)sbk * 32 * BPS : x;
            const unsigned dst = x_dst + (unsigned)((i % S) * MX * XQ * 16);
#pragma unroll
            for (int r = 0; r < (ONE_TOKEN ? 1 : X_ROUNDS); r++)
                if (x_m0 + X_TPR * r < MX) cp_async_16(dst + r * X_TPR * XQ * 16, ok ? src + (size_t)r * X_TPR * K : x, ok);
        }
    };
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        issue(i);
        asm volatile("cp.async.commit_group;");
    }
    pdl_wait(); /* x and out may belong to the kernel before this one (the weights' first stages are in flight) */
    if (STAGED_X) { /* the first stages' x, one group after theirs (the first step waits for it below) */
#pragma unroll
        for (int i = 0; i < S - 1; i++) issue_x(i);
        asm volatile("cp.async.commit_group;");
    }

    /* x of a super-block: for up to 2 token tiles loaded in registers at the top of the step (PRELOAD); with 4 token
     * tiles (m32n16), block by block (the up-front copy would take 16·TT registers and spill under its 255-register
     * cap, with the accumulators of 32 tokens). Until the fourteenth session m8n16, m8n32 and m16n64 also loaded the
     * next super-block's x a step ahead in registers; without that (x first, below) they took 0.89×, 0.95–0.97× and
     * 0.90× the time (geomeans over the seed and Qwen3 shapes at M = 1–16, H200, docs/PERF.md): the registers the
     * copy held cost more resident warps than its early loads hid. */
    constexpr bool PRELOAD = TT <= 2 && !STAGED_X;
    auto load_x = [&](int sbk, int j, uint4 *dst) {
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            const int m = tt * 8 + g, blk = sbk * BPS + j;
            dst[tt] = m < M && blk < blocks ? *reinterpret_cast<const uint4 *>(x + m * K + blk * 32 + 8 * t)
                                            : make_uint4(0, 0, 0, 0);
        }
    };

#pragma unroll 1
    for (int i = 0; i < count; i++) {
        uint4 xv[PRELOAD ? BPS : 1][TT];
        /* X_FIRST (every row with x in registers: m8n16, m8n32, m8n64 unstaged, m16n32, m16n64): this step's x
         * requested before the weight copies of step i + S − 1, not after them — the first use of x was the largest
         * single stall (ncu, the thirteenth session: 25 % of m8n64's samples at M = 8). Measured on the H200 (docs/PERF.md,
         * thirteenth session): 0.86–1.0× the time on the large shapes at M = 8 and 16 (27648×5120 M = 8 bf16 31.2 →
         * 27.2 µs), up to 4 % slower for f16 m16n32 on 1024–4096 rows. Not at group 32, where x held across the copies
         * spills (m16n32 60–68 bytes). The step's index comes first in these rows only: computed there in every row, it
         * cost the staged m8n64's group-32 instantiations a spill. */
        constexpr bool X_FIRST = QMM_MMA_X_FIRST && PRELOAD && GS != 32;
        const int sbk_top = warp + i * NW, stage_top = i % S;
        if (X_FIRST) {
#pragma unroll
            for (int j = 0; j < BPS; j++) load_x(sbk_top, j, xv[PRELOAD ? j : 0]);
        }
        __syncwarp(); /* every lane has read the stage issue() now refills (the (scale, bias) pairs are shared) */
        issue(i + S - 1);
        issue_x(i + S - 1);
        asm volatile("cp.async.commit_group;");
        if (STAGED_X && S > 2 && i == 0) /* the group of the first stages' x is among the newest S − 1 */
            asm volatile("cp.async.wait_group 1;");
        else
            asm volatile("cp.async.wait_group %0;" ::"n"(S - 1)); /* the i-th super-block's copies have landed */
        __syncwarp(); /* ... those of every lane */
        const int sbk = X_FIRST ? sbk_top : warp + i * NW, stage = X_FIRST ? stage_top : i % S;
        uint4 wq[RT][2];
#pragma unroll
        for (int r = 0; r < RT; r++)
#pragma unroll
            for (int h = 0; h < 2; h++) wq[r][h] = stage_w[((stage * RT + r) * 2 + h) * 32 + lane];
        const uint32_t *sb_stage = stage_sb + stage * RT * 16 * GSB; /* [16·RT rows][GSB] pairs */
        if (PRELOAD && !X_FIRST) {
#pragma unroll
            for (int j = 0; j < BPS; j++) load_x(sbk, j, xv[PRELOAD ? j : 0]);
        }
        float cq[RT][TT][4], cx[TT][4];
#pragma unroll
        for (int j = 0; j < BPS; j++) {
            if (j % BPG == 0 || j == 0) { /* a segment (group ∩ super-block) starts */
#pragma unroll
                for (int tt = 0; tt < TT; tt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        cx[tt][e] = 0.0f;
#pragma unroll
                        for (int r = 0; r < RT; r++) cq[r][tt][e] = 0.0f;
                    }
            }
            uint32_t b[TT][4];
            if (STAGED_X) /* token g's chunk (4j + t) ^ 4(g & 1) = 4j + t ± 4(g & 1) of this stage (TT = 1) */
                xv[0][0] = g < MX ? (j % 2 ? x_read_odd : x_read_even)[stage * MX * XQ + 4 * j] : make_uint4(0, 0, 0, 0);
            else if (!PRELOAD)
                load_x(sbk, j, xv[0]);
#pragma unroll
            for (int tt = 0; tt < TT; tt++) x_pairs<BITS>(xv[PRELOAD ? j : 0][tt], b[tt]);
#pragma unroll
            for (int tt = 0; tt < TT; tt++) {
                mma_16816(cx[tt], ones, b[tt][0], b[tt][1], T());
                mma_16816(cx[tt], ones, b[tt][2], b[tt][3], T());
            }
#pragma unroll
            for (int r = 0; r < RT; r++) {
                uint32_t a[2][4];
                block_a_fragments<BITS, T>(reinterpret_cast<const uint32_t *>(&wq[r][0]) + j * WPB,
                                           reinterpret_cast<const uint32_t *>(&wq[r][1]) + j * WPB, a);
#pragma unroll
                for (int tt = 0; tt < TT; tt++) {
                    mma_16816(cq[r][tt], a[0], b[tt][0], b[tt][1], T());
                    mma_16816(cq[r][tt], a[1], b[tt][2], b[tt][3], T());
                }
            }
            if ((j + 1) % BPG == 0 || j == BPS - 1) { /* the segment ends: acc += s·Σq·x + b·Σx */
#pragma unroll
                for (int r = 0; r < RT; r++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint32_t *at = sb_stage + (16 * r + 8 * h + g) * GSB + j / BPG;
                        uint32_t pair = *at;
                        if (GSB == 4) { /* groups of 32 at 4 bits: read here, not hoisted to the top of the step
                                         * (asm volatile stays among the MMAs): 4 segments × 8 pairs held at once
                                         * spilled m8n64's registers (144 bytes; 24 this way) */
                            asm volatile("ld.shared.b32 %0, [%1];" : "=r"(pair) : "r"((unsigned)__cvta_generic_to_shared(at)));
                        }
                        const float2 s_b = scale_bias(pair, T());
                        const float s = s_b.x * mma_decode<BITS, T>::code_scale; /* exact: a power of two */
#pragma unroll
                        for (int tt = 0; tt < TT; tt++)
#pragma unroll
                            for (int e = 0; e < (ONE_TOKEN ? 1 : 2); e++) /* two FMAs (the tile family's order) */
                                acc[r][tt][2 * h + e] =
                                    __fmaf_rn(s, cq[r][tt][2 * h + e], __fmaf_rn(s_b.y, cx[tt][e], acc[r][tt][2 * h + e]));
                    }
            }
        }
    }
    asm volatile("cp.async.wait_all;");

    /* Fixed-order reduction over the NW warps. */
    constexpr int per_warp = RT * TT * 4 * 32;
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
#pragma unroll
            for (int e = 0; e < 4; e++) partial[warp * per_warp + ((r * TT + tt) * 4 + e) * 32 + lane] = acc[r][tt][e];
    __syncthreads();
    for (int i = threadIdx.x; i < per_warp; i += blockDim.x) {
        float sum = 0.0f;
        for (int v = 0; v < NW; v++) sum += partial[v * per_warp + i];
        const int l = i & 31, e = (i >> 5) & 3, rt = i >> 7;
        const int r = rt / TT, tt = rt % TT;
        const int n = n_base + 16 * r + 8 * (e >> 1) + (l >> 2);
        const int m = tt * 8 + 2 * (l & 3) + (e & 1);
        if (n < N && m < M) {
            if (!isfinite(sum))
                sum = direct_output_t(x + (size_t)m * K, w_orig + (size_t)n * (K / 32 * BITS), scales + (size_t)n * groups,
                                      biases + (size_t)n * groups, BITS, (size_t)K, GS);
            store_f32(out, (size_t)m * N + n, sum);
        }
    }
