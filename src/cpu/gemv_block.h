/*
 * gemv_block.h — one GEMV register block (simd_kernels.h, "GEMV"), included once per
 * (GR rows of x, GNW weight rows, GFAST decode path) so that acc is an array of exactly GR × GNW
 * vectors: small fixed arrays indexed by constants after unrolling live in registers, where arrays
 * sized for the largest case would be kept on the stack (a load and a store per FMA).
 *
 * result[r·ld + w] = row m0 + r of x times weight row rows[w] (codes), with the block's scales and
 * biases already in f32: scales[w·gstride + g] (zero past groups, as p->xsum).
 *
 * Per group the codes are decoded straight to s·q (one rounding, shared by every row of x): 4-bit
 * through a 16-entry table of s·q (AVX-512: one vpermps per 16 codes, and the permute ignores the
 * index bits above 3, so no mask), 8-bit as q·s. Each row of x then costs one FMA per vector of
 * codes and no per-group fold, so an accumulator is one chain along all of K.
 * Prefetch (pf_stride ≠ 0): the rows of a block are read as GNW streams of row_bytes each, which at
 * K = 5120 (2.5 KiB per 4-bit row) end before the hardware stream prefetcher has ramped up; each row
 * therefore prefetches GEMV_PF bytes ahead of itself into L2 (GEMV_PF_HINT) and, near its end, the same
 * position in the row pf_stride bytes further on (the next block's row).
 */
#define GEMV_NAME_(r, nw, f) gemv_block_##r##_##nw##_##f
#define GEMV_NAME(r, nw, f) GEMV_NAME_(r, nw, f)

static void GEMV_NAME(GR, GNW, GFAST)(const gemv_plan *p, const uint8_t *const *rows, const float *scales,
                                      const float *biases, size_t m0, size_t pf_stride, float *result, size_t ld) {
    const size_t K = p->K, G = p->group_size, groups = p->groups, gstride = p->gstride;
    const size_t group_bytes = G * (size_t)GFAST / 8, row_bytes = K * (size_t)GFAST / 8;
    const float *x0 = p->xp + m0 * K;
    vf acc[GR][GNW];
#pragma GCC unroll 16
    for (int r = 0; r < GR; r++)
#pragma GCC unroll 8
        for (int w = 0; w < GNW; w++) acc[r][w] = v_zero();
    /* Tables one group ahead where the registers allow: acc, this and the next group's tables, the decoded codes
     * and x must fit (else gcc spills, e.g. 4 × 4 and 1 × 8 on AVX-512). */
#define GEMV_PIPELINE_TABLES (GR * GNW + 4 * GNW + 4 <= GEMV_VREGS)
#if GEMV_PIPELINE_TABLES
    vf next_table[GNW];
#pragma GCC unroll 8
    for (int w = 0; w < GNW; w++) next_table[w] = make_table(scales[(size_t)w * gstride]);
#endif
    for (size_t g = 0; g < groups; g++) {
        gemv_prefetch(rows, GNW, g * group_bytes, group_bytes, row_bytes, pf_stride);
        vf table[GNW];
#if GEMV_PIPELINE_TABLES
        /* This group's tables were made during the previous group; make the next group's now, so that the
         * broadcast-multiply's latency is off the path from the codes to the FMAs. */
        const size_t g_next = g + 1 < groups ? g + 1 : g;
#pragma GCC unroll 8
        for (int w = 0; w < GNW; w++) {
            table[w] = next_table[w];
            next_table[w] = make_table(scales[(size_t)w * gstride + g_next]);
        }
#else
#pragma GCC unroll 8
        for (int w = 0; w < GNW; w++) table[w] = make_table(scales[(size_t)w * gstride + g]);
#endif
        const size_t k_end = (g + 1) * G;
#if GFAST == 4
        for (size_t k = g * G; k < k_end; k += 2 * LANES) {
#if GR >= 4
            /* Many rows of x: decode the GNW weight rows first, then load each x vector once for
             * all of them (x of 8 rows × K = 1536 does not fit L1, so its loads come from L2). */
            vf lo[GNW], hi[GNW];
#pragma GCC unroll 8
            for (int w = 0; w < GNW; w++) v_decode4_scaled(rows[w] + k / 2, table[w], &lo[w], &hi[w]);
#pragma GCC unroll 16
            for (int r = 0; r < GR; r++) {
                vf x_lo = v_load(x0 + (size_t)r * K + k), x_hi = v_load(x0 + (size_t)r * K + k + LANES);
                /* Keep each x vector in a register for all GNW weight rows: without this barrier gcc folds the
                 * load into every FMA (a load per FMA, the load port then bounds the loop). */
                __asm__("" : "+v"(x_lo), "+v"(x_hi));
#pragma GCC unroll 8
                for (int w = 0; w < GNW; w++) {
                    acc[r][w] = v_fma(lo[w], x_lo, acc[r][w]);
                    acc[r][w] = v_fma(hi[w], x_hi, acc[r][w]);
                }
            }
#else
#pragma GCC unroll 8
            for (int w = 0; w < GNW; w++) {
                vf lo, hi;
                v_decode4_scaled(rows[w] + k / 2, table[w], &lo, &hi);
#pragma GCC unroll 16
                for (int r = 0; r < GR; r++) {
                    acc[r][w] = v_fma(lo, v_load(x0 + (size_t)r * K + k), acc[r][w]);
                    acc[r][w] = v_fma(hi, v_load(x0 + (size_t)r * K + k + LANES), acc[r][w]);
                }
            }
#endif
        }
#else
        for (size_t k = g * G; k < k_end; k += LANES) {
            vf q[GNW];
#pragma GCC unroll 8
            for (int w = 0; w < GNW; w++) q[w] = v_mul(v_decode8(rows[w] + k), table[w]);
#pragma GCC unroll 16
            for (int r = 0; r < GR; r++) {
                vf x = v_load(x0 + (size_t)r * K + k);
                __asm__("" : "+v"(x)); /* one load for all GNW weight rows (see the 4-bit loop) */
#pragma GCC unroll 8
                for (int w = 0; w < GNW; w++) acc[r][w] = v_fma(q[w], x, acc[r][w]);
            }
        }
#endif
    }
    GEMV_BIAS_AND_STORE(GR, GNW) /* b·Σx and the tree sums (simd_kernels.h) */
}

#undef GEMV_PIPELINE_TABLES
#undef GR
#undef GNW
#undef GFAST
