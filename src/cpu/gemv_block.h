/*
 * gemv_block.h — one GEMV register block (simd_kernels.h, "GEMV"), included once per
 * (GR rows of x, GNW weight rows, GFAST decode path) so that qdot and acc are arrays of exactly
 * GR × GNW vectors: small fixed arrays indexed by constants after unrolling live in registers, where
 * arrays sized for the largest case would be kept on the stack (a load and a store per FMA).
 *
 * result[r·GNW + w] = row m0 + r of x times weight row rows[w] (codes), with the block's scales and
 * biases already in f32: scales[w·groups + g].
 */
#define GEMV_NAME_(r, nw, f) gemv_block_##r##_##nw##_##f
#define GEMV_NAME(r, nw, f) GEMV_NAME_(r, nw, f)

static void GEMV_NAME(GR, GNW, GFAST)(const gemv_plan *p, const uint8_t *const *rows, const float *scales,
                                      const float *biases, size_t m0, float *result) {
    const size_t K = p->K, G = p->group_size, groups = p->groups;
    const float *x0 = p->xp + m0 * K;
    vf acc[GR][GNW];
#pragma GCC unroll 8
    for (int r = 0; r < GR; r++)
#pragma GCC unroll 8
        for (int w = 0; w < GNW; w++) acc[r][w] = v_zero();
    for (size_t g = 0; g < groups; g++) {
        vf qdot[GR][GNW];
#pragma GCC unroll 8
        for (int r = 0; r < GR; r++)
#pragma GCC unroll 8
            for (int w = 0; w < GNW; w++) qdot[r][w] = v_zero();
        const size_t k_end = (g + 1) * G;
#if GFAST == 4
        for (size_t k = g * G; k < k_end; k += 2 * LANES) {
#pragma GCC unroll 8
            for (int w = 0; w < GNW; w++) {
                vf lo, hi;
                v_decode4(rows[w] + k / 2, &lo, &hi);
#pragma GCC unroll 8
                for (int r = 0; r < GR; r++) {
                    qdot[r][w] = v_fma(lo, v_load(x0 + (size_t)r * K + k), qdot[r][w]);
                    qdot[r][w] = v_fma(hi, v_load(x0 + (size_t)r * K + k + LANES), qdot[r][w]);
                }
            }
        }
#else
        for (size_t k = g * G; k < k_end; k += LANES) {
#pragma GCC unroll 8
            for (int w = 0; w < GNW; w++) {
                const vf q = v_decode8(rows[w] + k);
#pragma GCC unroll 8
                for (int r = 0; r < GR; r++) qdot[r][w] = v_fma(q, v_load(x0 + (size_t)r * K + k), qdot[r][w]);
            }
        }
#endif
#pragma GCC unroll 8
        for (int w = 0; w < GNW; w++) {
            const vf s = v_set1(scales[(size_t)w * groups + g]);
#pragma GCC unroll 8
            for (int r = 0; r < GR; r++) acc[r][w] = v_fma(s, qdot[r][w], acc[r][w]);
        }
    }
    /* b·Σx: LANES groups at a time into the same lanes, the remainder scalar. */
#pragma GCC unroll 8
    for (int w = 0; w < GNW; w++) {
        const float *b_row = biases + (size_t)w * groups;
        size_t g = 0;
        for (; g + LANES <= groups; g += LANES) {
            const vf b = v_load(b_row + g);
#pragma GCC unroll 8
            for (int r = 0; r < GR; r++) acc[r][w] = v_fma(b, v_load(p->xsum + (m0 + (size_t)r) * groups + g), acc[r][w]);
        }
        float tail[GR];
#pragma GCC unroll 8
        for (int r = 0; r < GR; r++) tail[r] = 0.0f;
        for (; g < groups; g++)
#pragma GCC unroll 8
            for (int r = 0; r < GR; r++) tail[r] += b_row[g] * p->xsum[(m0 + (size_t)r) * groups + g];
#pragma GCC unroll 8
        for (int r = 0; r < GR; r++) result[r * GNW + w] = v_hsum(acc[r][w]) + tail[r];
    }
}

#undef GR
#undef GNW
#undef GFAST
