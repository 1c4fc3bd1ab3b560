/*
 * gemv_planes.h — one GEMV register block on the nibble-plane decode (simd_kernels.h, "GEMV, nibble planes"),
 * for 4-bit codes and GR ≤ 2 rows of x; included once per (GR rows of x, GNW weight rows, GG group size) so the
 * arrays below are exact-size (registers) and the group size folds into the scale broadcast.
 *
 * result[r·ld + w] = row m0 + r of x times weight row rows[w], as gemv_block.h, but decoded by chunks of
 * 8·LANES codes (one vector of dwords; code 8i + j of the chunk is nibble j of dword i):
 *
 *   chunk c of a row (AVX-512: 64 bytes)      nibble plane j (one AND, one conversion)      x in plane order
 *   dword i = codes 8i+7 … 8i+1 8i+0   ──▶   lane i: q(8i + j)·16^j  (j = 7: shifted, q)   lane i: x(8i + j)·16^-j
 *
 *   part[r][w] = Σ_j plane_j · xplane_j   (a chain of 8 FMAs per lane: Σ q·x over the lane's 8 codes, each product
 *                                          q·x: 16^j·16^-j = 1 and x·16^-j was exact, gemv_prepare_x_planes)
 *   acc[r][w] += part[r][w] · s_lanes     (the lane's group scale: G = 64 → lanes 0–7 one group, 8–15 the next)
 *
 * A 64-byte chunk costs, per weight row, 8 AND/shift + 8 conversions (shared by the rows of x) and 9 FMAs per row
 * of x, and no cross-lane shuffle: the table decode of gemv_block.h spends a vpmovzxbd and, on AVX-512, two
 * vpermps per 16 bytes, and at M = 1 the decode, not memory, bound it (docs/PERF.md). x is loaded once per plane
 * for all GNW weight rows. Roundings per term: the product, ≤ 7 more in the lane's chain, 1 in the scale FMA,
 * ⌈K/(8·LANES)⌉ along acc, ⌈groups/LANES⌉ in the bias dot, log2(LANES) in the tree sum: ≤ K + 2 for every K ≥ 32
 * (slack 1; b·x as gemv_block.h). Whole chunks run in the main loop; the last chunk of a row whose K is not a
 * multiple of 8·LANES is loaded masked (its codes past K are 0, and so is x there).
 */
#define GEMV_PLANES_NAME_(r, nw, g) gemv_planes_##r##_##nw##_##g
#define GEMV_PLANES_NAME(r, nw, g) GEMV_PLANES_NAME_(r, nw, g)

static void GEMV_PLANES_NAME(GR, GNW, GG)(const gemv_plan *p, const uint8_t *const *rows, const float *scales,
                                          const float *biases, size_t m0, size_t pf_stride, float *result,
                                          size_t ld) {
    const size_t K = p->K, gstride = p->gstride, xstride = p->xstride;
    const size_t chunk = 8 * LANES, chunk_bytes = 4 * LANES, row_bytes = K / 2;
    const size_t whole = K / chunk;
    const float *x0 = p->xp + m0 * xstride;
    vf acc[GR][GNW];
#pragma GCC unroll 8
    for (int r = 0; r < GR; r++)
#pragma GCC unroll 8
        for (int w = 0; w < GNW; w++) acc[r][w] = v_zero();
    for (size_t c = 0; c <= whole; c++) {
        vi v[GNW];
        if (c < whole) {
            gemv_prefetch(rows, GNW, c * chunk_bytes, chunk_bytes, row_bytes, pf_stride);
#pragma GCC unroll 8
            for (int w = 0; w < GNW; w++) v[w] = v_load_chunk(rows[w] + c * chunk_bytes);
        } else {
            if (whole * chunk == K) break;
#pragma GCC unroll 8
            for (int w = 0; w < GNW; w++)
                v[w] = v_load_chunk_partial(rows[w] + c * chunk_bytes, (int)((row_bytes - c * chunk_bytes) / 4));
        }
        const float *xc = x0 + c * chunk;
        vf part[GR][GNW];
        /* Plane 7 (a shift) first, so the last plane's AND may overwrite v: v, part and acc then fit the registers. */
#pragma GCC unroll 8
        for (int jj = 0; jj < 8; jj++) {
            const int j = (jj + 7) % 8;
            vf x[GR];
#pragma GCC unroll 8
            for (int r = 0; r < GR; r++) x[r] = v_load(xc + (size_t)r * xstride + (size_t)j * LANES);
#pragma GCC unroll 8
            for (int w = 0; w < GNW; w++) {
                const vf q = v_nibble(v[w], j);
#pragma GCC unroll 8
                for (int r = 0; r < GR; r++) part[r][w] = jj == 0 ? v_mul(q, x[r]) : v_fma(q, x[r], part[r][w]);
            }
        }
#pragma GCC unroll 8
        for (int w = 0; w < GNW; w++) {
            const vf s = v_chunk_scale(scales + (size_t)w * gstride, c, GG);
#pragma GCC unroll 8
            for (int r = 0; r < GR; r++) acc[r][w] = v_fma(part[r][w], s, acc[r][w]);
        }
    }
    GEMV_BIAS_AND_STORE(GR, GNW) /* b·Σx and the tree sums, as gemv_block.h */
}

#undef GR
#undef GNW
#undef GG
