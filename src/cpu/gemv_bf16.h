/*
 * gemv_bf16.h — one GEMV register block on the bf16 dot product (simd_kernels.h, "GEMV, bf16 dot products"), for
 * 4-bit codes (GBYTES 0) or codes below 64 one a byte (GBYTES 1: 2-, 3-, 5- and 6-bit rows as unpack_codes leaves them)
 * and bf16 or f16 x on AVX-512 BF16; included once per (GR rows of x, GNW weight rows, GG group size, GPARTS parts of
 * x, GBYTES) by gemv_bf16_groups.h, so the arrays below are exact-size (registers) and the group size folds into the
 * scale broadcast.
 *
 * Byte codes: a chunk of 64 codes is 64 bytes, and v_decode6_bf16 gives the same lo/hi layout (below) by one shift and
 * two vpermi2w, so x and everything after the decode are the 4-bit blocks' own.
 *
 * result[r·ld + w] = row m0 + r of x times weight row rows[w], as gemv_block.h, but by chunks of 64 codes (32 bytes at
 * 4 bits, as drawn; 64 bytes as byte codes, see the top):
 *
 *   chunk c of a row (32 bytes)          two vectors of 32 bf16 codes               x in pair order (once per call)
 *   byte j = code 2j+1 : code 2j   ──▶   lo word j = bf16(code 2j)                 xlo word j = x(64c + 2j)
 *            (vpmovzxbw, vpermw)         hi word j = bf16(code 2j + 1)             xhi word j = x(64c + 2j + 1)
 *
 *   part[r][w] = dp(dp(0, lo, xlo[r]), hi, xhi[r])   (vdpbf16ps: lane i adds the 4 products of codes 4i … 4i + 3;
 *                                                     GPARTS = 2, f16 x: then the same with the tail's xlo, xhi)
 *   acc[r][w] += part[r][w] · s_lanes               (the lane's group scale: G = 32 → lanes 0–7 one group, 8–15 the next)
 *
 * Per chunk and weight row: a zero-extension, a shift and two vpermw (shared by the rows of x), then two vdpbf16ps and
 * one FMA per row of x — where the table decode of gemv_block.h spends two vpmovzxbd, a shift, four vpermps and four
 * FMAs on the same 64 codes (docs/PERF.md: the dot product path decodes and multiplies 2× faster per core on Zen 4).
 *
 * Exact, by the bound of docs/kernels.md §6. Each product q·x is exact in f32 (a code of at most 6 significant bits
 * times an x of 8: at most 14). vdpbf16ps
 * reads denormal inputs as 0 and flushes denormal results to 0, whatever MXCSR says, which §6 does not cover; the
 * caller runs these blocks for bf16 x only when every x is ±0, non-finite or ≥ 2^-118 in magnitude (gemv_bf16_x_ok;
 * f16 x needs no check: it, its head and its tail are multiples of 2^-24, and the argument below holds with 2^-24), and
 * then no denormal occurs: every such x is a multiple of 2^-125 (8 significant bits), so is every product with an integer
 * code, every exact sum of them, and every f32 rounding of such a sum (below 2^-101 the sum is representable, above it
 * f32's spacing is a multiple of 2^-125) — nonzero values are all ≥ 2^-125 > 2^-126, the smallest normal f32. Codes
 * are 0 or normal. Roundings per term: ≤ 3 in the part (4 products from 0; 7 for an f16 x's 8), ⌈K/64⌉ along acc
 * (each chunk's scale FMA), ⌈groups/LANES⌉ in the bias FMAs (GEMV_BIAS_AND_STORE), log2(LANES) in the tree sum: ≤ K + 2
 * for every K ≥ 32 (slack 1; b·x as gemv_block.h, from the f32 Σx per group). A row of x whose products overflow gives a
 * non-finite acc, which the non-finite rule recomputes (gemv_store), as on every row.
 *
 * Whole chunks run in the main loop; when K is an odd number of 32s the last chunk has 16 bytes, loaded masked, with
 * codes and x zero past K (and zero scales past the last group).
 */
#define GEMV_BF16_NAME_(r, nw, g, parts, bytes) gemv_bf16_##r##_##nw##_##g##_##parts##_##bytes
#define GEMV_BF16_NAME(r, nw, g, parts, bytes) GEMV_BF16_NAME_(r, nw, g, parts, bytes)

/* x of every row in registers for the whole chunk (loaded once for all GNW weight rows) where it fits beside acc
 * and the chunk's codes, scale and part; else loaded per weight row (from L1). */
#define GEMV_BF16_X_IN_REGISTERS (2 * GPARTS * GR + GR * GNW + 6 <= GEMV_VREGS)

BF16DP_TARGET static void GEMV_BF16_NAME(GR, GNW, GG, GPARTS, GBYTES)(const gemv_plan *p, const uint8_t *const *rows,
                                                              const float *scales, const float *biases, size_t m0,
                                                              size_t pf_stride, float *result, size_t ld) {
    const size_t K = p->K, gstride = p->gstride, kpad = p->kpad, xrow = GPARTS * kpad;
    const size_t chunk = 64, chunk_bytes = GBYTES ? 64 : 32, row_bytes = GBYTES ? K : K / 2, chunks = kpad / chunk;
    const uint16_t *x0 = p->xb + m0 * xrow;
    const vf zero = v_zero();
    vf acc[GR][GNW];
#pragma GCC unroll 8
    for (int r = 0; r < GR; r++)
#pragma GCC unroll 8
        for (int w = 0; w < GNW; w++) acc[r][w] = v_zero();
    for (size_t c = 0; c < chunks; c++) {
        const int half = (c + 1) * chunk > K;
        gemv_prefetch(rows, GNW, c * chunk_bytes, chunk_bytes, row_bytes, pf_stride);
        /* x of row r, part j (0: x or its bf16 head; 1: an f16 x's tail), chunk c: xlo at xc(r, j), xhi 32 on */
#define XC(r, j) (x0 + (size_t)(r) * xrow + (size_t)(j) * kpad + c * chunk)
#if GEMV_BF16_X_IN_REGISTERS
        vh xlo[GR][GPARTS], xhi[GR][GPARTS];
#pragma GCC unroll 8
        for (int r = 0; r < GR; r++)
#pragma GCC unroll 2
            for (int j = 0; j < GPARTS; j++) {
                xlo[r][j] = v_load_bf16(XC(r, j));
                xhi[r][j] = v_load_bf16(XC(r, j) + 32);
                /* one load for all GNW weight rows (see gemv_block.h) */
                __asm__("" : "+v"(xlo[r][j]), "+v"(xhi[r][j]));
            }
#endif
#pragma GCC unroll 8
        for (int w = 0; w < GNW; w++) {
            vh lo, hi;
#if GBYTES
            v_decode6_bf16(rows[w] + c * chunk_bytes, half, &lo, &hi);
#else
            v_decode4_bf16(rows[w] + c * chunk_bytes, half, &lo, &hi);
#endif
            const vf s = v_chunk_scale_bf16(scales + (size_t)w * gstride, c, GG);
#pragma GCC unroll 8
            for (int r = 0; r < GR; r++) {
                vf part = zero;
#pragma GCC unroll 2
                for (int j = 0; j < GPARTS; j++) {
#if GEMV_BF16_X_IN_REGISTERS
                    part = v_dpbf16(v_dpbf16(part, lo, xlo[r][j]), hi, xhi[r][j]);
#else
                    part = v_dpbf16(v_dpbf16(part, lo, v_load_bf16(XC(r, j))), hi, v_load_bf16(XC(r, j) + 32));
#endif
                }
                acc[r][w] = v_fma(part, s, acc[r][w]);
            }
        }
#undef XC
    }
    GEMV_BIAS_AND_STORE(GR, GNW) /* b·Σx and the tree sums, as gemv_block.h */
}

#undef GEMV_BF16_X_IN_REGISTERS
#undef GG /* GR, GNW, GPARTS and GBYTES stay for the next group size (gemv_bf16_groups.h) */
