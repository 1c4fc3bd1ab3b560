/*
 * simd_kernels.h — the CPU kernels' algorithms, written once (cpu.h, docs/kernels.md "CPU kernels").
 *
 * Included by avx2.c and avx512.c after they define, for their register width:
 *   LANES             f32 lanes per vector (8 or 16)
 *   vf                the f32 vector type
 *   v_zero v_load v_store v_set1 v_fma(a,b,c)=a·b+c (one rounding) v_add v_mul v_hsum (a log2(LANES)-deep tree)
 *   v_load_dtype(array, dtype, i)     LANES elements i… of an f32/f16/bf16 array as f32 (exact)
 *   v_load_dtype_partial(array, dtype, i, count)  the first count < LANES of them, the other lanes 0 (reads no further)
 *   v_decode4(bytes, &lo, &hi)        2·LANES 4-bit codes from LANES bytes: lane i of lo = code 2i,
 *                                     lane i of hi = code 2i+1 (one byte holds two codes)
 *   v_decode8(bytes)                  LANES 8-bit codes from LANES bytes, in order
 *   v_deinterleave(src, &even, &odd)  2·LANES floats → the even-indexed ones and the odd-indexed ones
 *   QMM_ISA(name)                     name with the ISA suffix (entry points are per ISA)
 *   GEMV_R_MAX, GEMV_RW               rows of x per pass, and rows of x × weight rows in registers
 *   GEMV_VREGS                        vector registers (32 ZMM / 16 YMM)
 *   GEMM_R                            broadcast rows of the tiled micro-kernel (see there)
 * Everything here is static except the entry points, so the two inclusions never collide.
 *
 * Decode order. 4-bit codes are unpacked a byte per lane (zero-extend), then the low nibble gives
 * the even codes and the high nibble the odd ones: 3 instructions for 2·LANES codes and no shuffle.
 * The codes then sit in "deinterleaved" order inside each block of 2·LANES. The other operand is
 * brought into the same order once per call (x for qmm_t, by v_deinterleave), so every dot product
 * pairs the right code with the right x; only the summation order changes. 8-bit codes are in order.
 * 2, 3, 5 and 6-bit codes are unpacked into bytes by the ISA file's unpack_codes (unpack.h: vpermb +
 * vpmultishiftqb or pdep), which are then exactly an 8-bit packed row, and take the 8-bit path.
 */
#ifndef LANES
#error "define the vector vocabulary (avx2.c, avx512.c) before including simd_kernels.h"
#endif
/* GEMV_PLANES 1: the ISA file also defines the nibble-plane vocabulary (vi, v_load_chunk, v_load_chunk_partial,
 * v_nibble, v_chunk_scale, v_planes_of_chunk, v_same) and the M ≤ 2 4-bit GEMV uses it (gemv_planes.h). */
#ifndef GEMV_PLANES
#define GEMV_PLANES 0
#endif
/* GEMV_BF16DP 1: the ISA file also defines the bf16 dot-product vocabulary (vh, BF16DP_TARGET, v_decode4_bf16,
 * v_load_bf16, v_split_bf16, v_dpbf16, v_bf16_deinterleave, v_chunk_scale_bf16 for the bf16 GEMV row, gemv_bf16.h;
 * v_pairs4_bf16, v_pairs8_bf16, v_broadcast_pair, v_store_pairs, v_pairs_to_f32 for the bf16 tiled row). */
#ifndef GEMV_BF16DP
#define GEMV_BF16DP 0
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The GEMV blocks' software prefetch of the weights (GEMV_PF bytes ahead in each row) goes to L2, not L1: on Zen 4 a
 * block's 8 rows prefetched into L1 (prefetcht0) held one core to 10–11 GB/s of cold weights, against 22 GB/s that
 * the core reads alone; into L2 (prefetcht1) more lines are in flight at once, and the GEMV takes 0.88–0.91× the time
 * at M = 1 (docs/PERF.md, thirty-sixth session, CPU). The lines reach L1 when the block loads them. */
#define GEMV_PF_HINT _MM_HINT_T1

/* The decode path of a format: 4 and 8 read the packed words directly; any other width is first
 * unpacked to bytes (8). */
static int fast_bits(int bits) { return bits == 4 ? 4 : 8; }

/* Codes [c0, c0 + count) of packed row `row` as the decode paths read them: 4- and 8-bit in place (two codes a byte,
 * one), the other widths unpacked into `bytes` (count of scratch, then an 8-bit row). */
static const uint8_t *row_codes(const qmm_call *call, const uint32_t *row, size_t c0, size_t count, uint8_t *bytes) {
    if (call->bits == 4) return (const uint8_t *)row + c0 / 2;
    if (call->bits == 8) return (const uint8_t *)row + c0;
    unpack_codes(row + c0 * (size_t)call->bits / 32, count, call->bits, bytes);
    return bytes;
}

/* Row m of x as f32 in the decode order of `fast` (see the top): dst[K]. */
static void convert_x_row(const qmm_call *call, size_t m, int fast, float *dst) {
    const size_t K = call->K;
    if (fast == 4) {
        for (size_t k = 0; k < K; k += 2 * LANES) { /* K is a multiple of 32 ≥ 2·LANES */
            vf even, odd, pair[2];
            pair[0] = v_load_dtype(call->x, call->dtype, m * K + k);
            pair[1] = v_load_dtype(call->x, call->dtype, m * K + k + LANES);
            v_deinterleave(pair, &even, &odd);
            v_store(dst + k, even);
            v_store(dst + k + LANES, odd);
        }
    } else {
        for (size_t k = 0; k < K; k += LANES) v_store(dst + k, v_load_dtype(call->x, call->dtype, m * K + k));
    }
}

/* GEMV_RW (4 or 8) f32 results to out[i…] in dtype, when every one is finite (returns 1), narrowed as
 * qmm_store_f32 narrows (f16: vcvtps2ph with round-to-nearest-even, which is exactly qmm_f32_to_f16 on
 * finite values, subnormal and overflowing results included; bf16: the same integer rounding as
 * qmm_f32_to_bf16); else stores nothing and returns 0 (the caller then takes each output through the
 * non-finite rule). 128/256-bit AVX2 + F16C code, which both ISA files are built with. out may be at any
 * address (unaligned stores). */
static int store_run(void *out, qmm_dtype dtype, size_t i, const float *v) {
#if GEMV_RW == 8
    const __m256 f = _mm256_loadu_ps(v);
    const __m256i bits = _mm256_castps_si256(f), exponent = _mm256_set1_epi32(0x7F800000);
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent))) return 0;
    switch (dtype) {
    case QMM_F16:
        _mm_storeu_si128((__m128i *)((uint16_t *)out + i), _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
    case QMM_BF16: {
        /* (x + 0x7FFF + ((x >> 16) & 1)) >> 16, then the 8 low halves packed (packus keeps them: all ≤ 0xFFFF) */
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
        const __m256i h = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
        _mm_storeu_si128((__m128i *)((uint16_t *)out + i), _mm256_castsi256_si128(packed));
        break;
    }
    default: _mm256_storeu_ps((float *)out + i, f); break;
    }
#elif GEMV_RW == 4
    const __m128 f = _mm_loadu_ps(v);
    const __m128i bits = _mm_castps_si128(f), exponent = _mm_set1_epi32(0x7F800000);
    if (_mm_movemask_epi8(_mm_cmpeq_epi32(_mm_and_si128(bits, exponent), exponent))) return 0;
    switch (dtype) {
    case QMM_F16:
        _mm_storel_epi64((__m128i *)((uint16_t *)out + i), _mm_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
    case QMM_BF16: {
        const __m128i odd = _mm_and_si128(_mm_srli_epi32(bits, 16), _mm_set1_epi32(1));
        const __m128i h = _mm_srli_epi32(_mm_add_epi32(bits, _mm_add_epi32(odd, _mm_set1_epi32(0x7FFF))), 16);
        _mm_storel_epi64((__m128i *)((uint16_t *)out + i), _mm_packus_epi32(h, h));
        break;
    }
    default: _mm_storeu_ps((float *)out + i, f); break;
    }
#else
#error "store_run: GEMV_RW must be 4 or 8"
#endif
    return 1;
}

/* ═════════════════════════════ GEMV: qmm_t for small M ═════════════════════════════
 *
 * out[m, n] = Σ_g ( Σ_{k∈g} (s_g·q_k)·x_k + b_g·Σ_{k∈g} x_k ): the seed's split with the scale folded
 * into the decoded codes, vectorised along K.
 * Memory: decode is bound by reading W (N·K·bits/8 bytes, larger than the LLC for real layers), so
 * every weight byte is loaded once per call: a block of GEMV_RW weight rows is decoded in registers
 * and multiplied with up to GEMV_R_MAX rows of x (from L1/L2) before the next block; for
 * M > GEMV_R_MAX the passes over x reuse the block from L1, and the next block is prefetched.
 * Decode: per group the codes become s·q directly (AVX-512: a 16-entry table of s·q looked up with
 * vpermps; AVX2: converted and multiplied by s — the same value, rounded once), so each row of x
 * costs one FMA per vector of codes and there is no per-group fold: acc[r][w] is one chain along K.
 * Registers (per x row r, weight row w): acc[r][w], at most 16 of them; with 4 or more rows of x
 * each x vector is loaded once for all the block's weight rows. The bias part b·Σx does not depend
 * on the codes: Σx per (row of x, group) is computed once per call (xsum) and b·xsum is a vector
 * dot product over the groups.
 * Roundings per term (docs/kernels.md §2, need ≤ K + 2): s·q·x: 1 for s·q, K/LANES along the lane's
 * FMA chain, 1 adding the bias vector, log2(LANES) in the tree sum, 1 adding the bias tail — at most
 * K/LANES + 7; b·x: Σx in a tree (≤ log2(G/LANES) + log2(LANES) ≤ 7), 1 fused into the bias dot,
 * groups/LANES along it, 1 + log2(LANES) + 1 → ≤ 14 + groups/LANES. Both stay ≤ K + 2 for every
 * K ≥ 32, so the row's slack is 1.
 * Non-finite: a sum that became inf or NaN stays so, hence a finite output had no overflow; an output
 * that is not finite is replaced by the f64 direct form (qmm_cpu_finite_or_direct, docs/kernels.md §2).
 */

typedef struct gemv_plan {
    const qmm_call *call;
    size_t K, group_size, groups;
    size_t gstride;     /* groups rounded up to LANES: the row stride of xsum and group_f32 (zero-padded) */
    size_t words;       /* packed words per weight row */
    int fast;           /* decode path: 4 or 8 */
    const float *xp;    /* [Mpad][K] x in decode order, or [Mpad][xstride] in nibble-plane order (planes) */
    size_t xstride;     /* planes: K rounded up to a whole chunk of 8·LANES codes (zero-padded) */
    int planes;         /* 1: 4-bit, M ≤ 2, x exact in plane order: the nibble-plane blocks (gemv_planes.h) */
    int bf16dp;         /* the bf16 dot-product blocks (gemv_bf16.h; 4-bit rows, or codes below 64 unpacked to bytes —
                         * fast tells which): 1 part of x (bf16 x with no value under
                         * 2^-118), 2 parts (f16 x as a bf16 head and tail); 0: not */
    const uint16_t *xb; /* bf16dp: [Mread][bf16dp][kpad] x in pair order (gemv_prepare_x_bf16) */
    size_t kpad;        /* bf16dp: K rounded up to a whole chunk of 64 codes (x zero-padded) */
    const float *xsum;  /* [Mpad][gstride] Σx per group, 0 past groups */
    uint8_t *unpacked;  /* generic widths: [threads][GEMV_RW][K] codes as bytes; else NULL */
    float *group_f32;   /* [threads][2][GEMV_RW][gstride]: the block's scales and biases in f32, 0 past groups */
} gemv_plan;

/* The end of every GEMV register block (gemv_block.h, gemv_planes.h): acc[r][w] += b·Σx, LANES groups at a time into
 * the same lanes (biases and xsum are zero-padded to gstride, so the last groups % LANES need no scalar tail), then
 * the tree sum of each accumulator into result[r·ld + w]. A macro, not a function: acc is the block's exact-size
 * register array. */
#define GEMV_BIAS_AND_STORE(GR_, GNW_)                                                                          \
    _Pragma("GCC unroll 8") for (int w = 0; w < (GNW_); w++) {                                                \
        const float *b_row = biases + (size_t)w * gstride;                                                    \
        for (size_t g = 0; g < gstride; g += LANES) {                                                         \
            const vf b = v_load(b_row + g);                                                                   \
            _Pragma("GCC unroll 16") for (int r = 0; r < (GR_); r++)                                          \
                acc[r][w] = v_fma(b, v_load(p->xsum + (m0 + (size_t)r) * gstride + g), acc[r][w]);            \
        }                                                                                                     \
        _Pragma("GCC unroll 16") for (int r = 0; r < (GR_); r++) result[(size_t)r * ld + w] = v_hsum(acc[r][w]); \
    }

/* The GEMV blocks' prefetch (gemv_block.h per group, gemv_planes.h and gemv_bf16.h per chunk) as a block reaches bytes
 * [begin, begin + bytes) of each of its nw rows: the lines that start GEMV_PF further on; past the row's end, the same
 * place in the next block's row (pf_stride bytes on). pf_stride 0: none (gemv_run_block says when). */
ALWAYS_INLINE void gemv_prefetch(const uint8_t *const *rows, int nw, size_t begin, size_t bytes, size_t row_bytes,
                                 size_t pf_stride) {
    if (!pf_stride) return;
    const size_t at = begin + GEMV_PF;
    for (size_t line = (at + 63) & ~(size_t)63; line < at + bytes; line += 64) {
        const size_t ahead = line < row_bytes ? line : line - row_bytes + pf_stride;
#pragma GCC unroll 8
        for (int w = 0; w < nw; w++) _mm_prefetch((const char *)rows[w] + ahead, GEMV_PF_HINT);
    }
}

/* A group's scale table from its scale: 4-bit codes are looked up in v_scale_table(s), 8-bit codes multiplied
 * by s (gemv_block.h). */
#define make_table(s) (GFAST == 4 ? v_scale_table(v_set1(s)) : v_set1(s))

/* The register blocks: (rows of x, weight rows) = (R, GEMV_RW / R, at least 1) for whole blocks and
 * (R, 1) for the last rows of N, for each decode path. */
#if GEMV_RW == 8
#define GEMV_NW_1 8
#define GEMV_NW_2 4
#define GEMV_NW_4 4
#define GEMV_NW_8 2
#else
#define GEMV_NW_1 4
#define GEMV_NW_2 2
#define GEMV_NW_4 1
#define GEMV_NW_8 1
#endif
#define GR 1
#define GNW GEMV_NW_1
#define GFAST 4
#include "gemv_block.h"
#define GR 2
#define GNW GEMV_NW_2
#define GFAST 4
#include "gemv_block.h"
#define GR 4
#define GNW GEMV_NW_4
#define GFAST 4
#include "gemv_block.h"
#define GR 8
#define GNW GEMV_NW_8
#define GFAST 4
#include "gemv_block.h"
#if GEMV_R_MAX >= 16
#define GR 16
#define GNW 1
#define GFAST 4
#include "gemv_block.h"
#endif
#define GR 1
#define GNW 1
#define GFAST 4
#include "gemv_block.h"
#define GR 2
#define GNW 1
#define GFAST 4
#include "gemv_block.h"
#if GEMV_NW_4 != 1
#define GR 4
#define GNW 1
#define GFAST 4
#include "gemv_block.h"
#endif
#if GEMV_NW_8 != 1
#define GR 8
#define GNW 1
#define GFAST 4
#include "gemv_block.h"
#endif
#define GR 1
#define GNW GEMV_NW_1
#define GFAST 8
#include "gemv_block.h"
#define GR 2
#define GNW GEMV_NW_2
#define GFAST 8
#include "gemv_block.h"
#define GR 4
#define GNW GEMV_NW_4
#define GFAST 8
#include "gemv_block.h"
#define GR 8
#define GNW GEMV_NW_8
#define GFAST 8
#include "gemv_block.h"
#if GEMV_R_MAX >= 16
#define GR 16
#define GNW 1
#define GFAST 8
#include "gemv_block.h"
#endif
#define GR 1
#define GNW 1
#define GFAST 8
#include "gemv_block.h"
#define GR 2
#define GNW 1
#define GFAST 8
#include "gemv_block.h"
#if GEMV_NW_4 != 1
#define GR 4
#define GNW 1
#define GFAST 8
#include "gemv_block.h"
#endif
#if GEMV_NW_8 != 1
#define GR 8
#define GNW 1
#define GFAST 8
#include "gemv_block.h"
#endif

#define GEMV_CASE(r, nw)                                                                                      \
    if (R == (r) && NW == (nw)) {                                                                             \
        if (p->fast == 4) GEMV_NAME(r, nw, 4)(p, rows, scales, biases, m0, pf_stride, result, ld);            \
        else GEMV_NAME(r, nw, 8)(p, rows, scales, biases, m0, pf_stride, result, ld);                         \
        return;                                                                                               \
    }

#if GEMV_PLANES
/* The nibble-plane blocks (4-bit, 1 or 2 rows of x; gemv_planes.h), one per group size. Weight rows per block:
 * v, part and acc per weight row, x, the plane and the masks must fit the registers. */
#ifndef PLANES_NW_1
#define PLANES_NW_1 GEMV_NW_1
#endif
#ifndef PLANES_NW_2
#define PLANES_NW_2 GEMV_NW_2
#endif
#define GR 1
#define GNW PLANES_NW_1
#define GG 32
#include "gemv_planes.h"
#define GR 2
#define GNW PLANES_NW_2
#define GG 32
#include "gemv_planes.h"
#define GR 1
#define GNW 1
#define GG 32
#include "gemv_planes.h"
#define GR 2
#define GNW 1
#define GG 32
#include "gemv_planes.h"
#define GR 1
#define GNW PLANES_NW_1
#define GG 64
#include "gemv_planes.h"
#define GR 2
#define GNW PLANES_NW_2
#define GG 64
#include "gemv_planes.h"
#define GR 1
#define GNW 1
#define GG 64
#include "gemv_planes.h"
#define GR 2
#define GNW 1
#define GG 64
#include "gemv_planes.h"
#define GR 1
#define GNW PLANES_NW_1
#define GG 128
#include "gemv_planes.h"
#define GR 2
#define GNW PLANES_NW_2
#define GG 128
#include "gemv_planes.h"
#define GR 1
#define GNW 1
#define GG 128
#include "gemv_planes.h"
#define GR 2
#define GNW 1
#define GG 128
#include "gemv_planes.h"

#define GEMV_PLANES_CASE(r, nw)                                                                               \
    if (R == (r) && NW == (nw)) {                                                                             \
        if (p->group_size == 32) GEMV_PLANES_NAME(r, nw, 32)(p, rows, scales, biases, m0, pf_stride, result, ld); \
        else if (p->group_size == 64) GEMV_PLANES_NAME(r, nw, 64)(p, rows, scales, biases, m0, pf_stride, result, ld); \
        else GEMV_PLANES_NAME(r, nw, 128)(p, rows, scales, biases, m0, pf_stride, result, ld);               \
        return;                                                                                               \
    }
#endif

#if GEMV_BF16DP
/* The bf16 dot-product blocks (gemv_bf16.h): for the default blocks' (rows of x, weight rows), each group size, x in 1
 * part (bf16) or 2 (f16: a bf16 head and tail), and 4-bit rows or byte codes below 64 (2, 3, 5, 6 bits unpacked). */
#if GEMV_NW_1 == 1 || GEMV_NW_2 == 1 || GEMV_NW_4 == 1 || GEMV_NW_8 == 1
#error "the bf16 GEMV blocks are instantiated for weight-row counts above 1 (AVX-512's GEMV_NW_*)"
#endif
#define GR 1
#define GNW GEMV_NW_1
#define GPARTS 1
#include "gemv_bf16_groups.h"
#define GR 2
#define GNW GEMV_NW_2
#define GPARTS 1
#include "gemv_bf16_groups.h"
#define GR 4
#define GNW GEMV_NW_4
#define GPARTS 1
#include "gemv_bf16_groups.h"
#define GR 8
#define GNW GEMV_NW_8
#define GPARTS 1
#include "gemv_bf16_groups.h"
#define GR 1
#define GNW 1
#define GPARTS 1
#include "gemv_bf16_groups.h"
#define GR 2
#define GNW 1
#define GPARTS 1
#include "gemv_bf16_groups.h"
#define GR 4
#define GNW 1
#define GPARTS 1
#include "gemv_bf16_groups.h"
#define GR 8
#define GNW 1
#define GPARTS 1
#include "gemv_bf16_groups.h"
#define GR 1
#define GNW GEMV_NW_1
#define GPARTS 2
#include "gemv_bf16_groups.h"
#define GR 2
#define GNW GEMV_NW_2
#define GPARTS 2
#include "gemv_bf16_groups.h"
#define GR 4
#define GNW GEMV_NW_4
#define GPARTS 2
#include "gemv_bf16_groups.h"
#define GR 8
#define GNW GEMV_NW_8
#define GPARTS 2
#include "gemv_bf16_groups.h"
#define GR 1
#define GNW 1
#define GPARTS 2
#include "gemv_bf16_groups.h"
#define GR 2
#define GNW 1
#define GPARTS 2
#include "gemv_bf16_groups.h"
#define GR 4
#define GNW 1
#define GPARTS 2
#include "gemv_bf16_groups.h"
#define GR 8
#define GNW 1
#define GPARTS 2
#include "gemv_bf16_groups.h"
#if GEMV_R_MAX > 8
#error "the bf16 GEMV blocks are instantiated for passes of up to 8 rows of x"
#endif

#define GEMV_BF16_GROUPS(r, nw, parts, bytes)                                                                 \
    do {                                                                                                      \
        if (p->group_size == 32) GEMV_BF16_NAME(r, nw, 32, parts, bytes)(p, rows, scales, biases, m0, pf_stride, result, ld); \
        else if (p->group_size == 64) GEMV_BF16_NAME(r, nw, 64, parts, bytes)(p, rows, scales, biases, m0, pf_stride, result, ld); \
        else GEMV_BF16_NAME(r, nw, 128, parts, bytes)(p, rows, scales, biases, m0, pf_stride, result, ld);   \
    } while (0)
#define GEMV_BF16_CASE(r, nw)                                                                                 \
    if (R == (r) && NW == (nw)) {                                                                             \
        if (p->bf16dp == 2) {                                                                                 \
            if (p->fast == 4) GEMV_BF16_GROUPS(r, nw, 2, 0);                                                  \
            else GEMV_BF16_GROUPS(r, nw, 2, 1);                                                               \
        } else {                                                                                              \
            if (p->fast == 4) GEMV_BF16_GROUPS(r, nw, 1, 0);                                                  \
            else GEMV_BF16_GROUPS(r, nw, 1, 1);                                                               \
        }                                                                                                     \
        return;                                                                                               \
    }
#endif

static void gemv_dispatch(const gemv_plan *p, const uint8_t *const *rows, const float *scales, const float *biases,
                          size_t m0, int R, int NW, size_t pf_stride, float *result, size_t ld) {
#if GEMV_BF16DP
    if (p->bf16dp) {
        GEMV_BF16_CASE(1, GEMV_NW_1)
        GEMV_BF16_CASE(2, GEMV_NW_2)
        GEMV_BF16_CASE(4, GEMV_NW_4)
        GEMV_BF16_CASE(8, GEMV_NW_8)
        GEMV_BF16_CASE(1, 1)
        GEMV_BF16_CASE(2, 1)
        GEMV_BF16_CASE(4, 1)
        GEMV_BF16_CASE(8, 1)
        return; /* every (R, NW) of the passes is above; never the f32 blocks on bf16 pairs */
    }
#endif
#if GEMV_PLANES
    if (p->planes) {
        GEMV_PLANES_CASE(1, PLANES_NW_1)
        GEMV_PLANES_CASE(2, PLANES_NW_2)
        GEMV_PLANES_CASE(1, 1)
        GEMV_PLANES_CASE(2, 1)
        return; /* every (R, NW) of the passes is above; never the table blocks on x in plane order */
    }
#endif
    GEMV_CASE(1, GEMV_NW_1)
    GEMV_CASE(2, GEMV_NW_2)
    GEMV_CASE(4, GEMV_NW_4)
    GEMV_CASE(8, GEMV_NW_8)
#if GEMV_R_MAX >= 16
    GEMV_CASE(16, 1)
#endif
    GEMV_CASE(1, 1)
    GEMV_CASE(2, 1)
#if GEMV_NW_4 != 1
    GEMV_CASE(4, 1)
#endif
#if GEMV_NW_8 != 1
    GEMV_CASE(8, 1)
#endif
}

/* Rows of x in the pass that starts with `remaining` rows left: all of them up to GEMV_R_MAX, rounded
 * up to a power of two (the padding rows of xp are zero and their results are dropped). */
static int gemv_pass_rows(size_t remaining) {
    int R = 1;
    while (R < GEMV_R_MAX && (size_t)R < remaining) R *= 2;
    return R;
}

/* Rows of x (and of xp, xsum) the passes over M rows read: whole passes of GEMV_R_MAX, then the last pass's rows
 * rounded up to a power of two; the padding rows among them must be zero. */
static size_t gemv_rows_read(size_t M) {
    const size_t rest = M % GEMV_R_MAX;
    return M - rest + (rest ? (size_t)gemv_pass_rows(rest) : 0);
}

/* Weight rows per register block for R rows of x (at most 16 accumulators, see GEMV_NW_*). */
static int gemv_block_rows(const gemv_plan *p, int R) {
#if GEMV_PLANES
    if (p->planes) return R == 1 ? PLANES_NW_1 : PLANES_NW_2;
#endif
    return R == 1 ? GEMV_NW_1 : R == 2 ? GEMV_NW_2 : R == 4 ? GEMV_NW_4 : GEMV_NW_8;
}

/* The outputs of one pass over a block: tile[r·GEMV_RW + w] = out[m0 + r, n0 + w] for the rows of x that
 * exist and the `width` weight rows of the block. A whole block's GEMV_RW outputs of one row of x are
 * contiguous in out: when all are finite they are narrowed together (store_run); otherwise, and for the
 * last, narrower block of N, each output goes through the non-finite rule and qmm_store_f32 one by one. */
static void gemv_store(const gemv_plan *p, size_t n0, size_t m0, int R, size_t width, const float *tile) {
    const qmm_call *call = p->call;
    for (int r = 0; r < R && m0 + (size_t)r < call->M; r++) {
        const size_t m = m0 + (size_t)r;
        const float *v = tile + (size_t)r * GEMV_RW;
        if (width == GEMV_RW && store_run(call->out, call->dtype, m * call->N + n0, v)) continue;
        for (size_t w = 0; w < width; w++)
            qmm_store_f32(call->out, call->dtype, m * call->N + n0 + w, qmm_cpu_finite_or_direct(call, v[w], m, n0 + w));
    }
}

/* Σx per group of one row of x (any order inside each group: the order does not change Σx's error bound) into
 * dst[0 … groups): LANES-wide partial sums, then the tree of v_hsum. */
static void gemv_group_sums(const gemv_plan *p, const float *row, float *dst) {
    for (size_t g = 0; g < p->groups; g++) {
        vf sum = v_zero();
        for (size_t k = g * p->group_size; k < (g + 1) * p->group_size; k += LANES) sum = v_add(sum, v_load(row + k));
        dst[g] = v_hsum(sum);
    }
}

#if GEMV_PLANES
/* Rows 0…M−1 of x in nibble-plane order (gemv_planes.h) into p->xp (row stride xstride, zero past K) and Σx per
 * group into p->xsum; the rows up to Mread (what the passes read, gemv_rows_read) and the groups up to gstride zero.
 * Chunk c of a row, plane j, lane i holds x(c·8·LANES + 8i + j)·16^-j (plane 7 unscaled), which the plane's codes
 * q·16^j meet: the product is exactly q·x when x·16^-j is exact, i.e. not rounded into the subnormal range (|x| ≥
 * 2^-102, or 0). Returns 0 — and the caller takes the table decode for the whole call — if some scaled x is not
 * (NaN or ±inf in planes 1–6 fail the check too; in planes 0 and 7, which are not scaled, they reach the output as
 * NaN or ±inf, and the non-finite rule recomputes it, as on the table decode). Row Mread of xp is the scratch for the row in natural order (f32, zero-padded to
 * xstride), from which the planes are transposed. Σx sums the natural order. */
static int gemv_prepare_x_planes(const gemv_plan *p, size_t M, size_t Mread) {
    static const float down[7] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f};
    static const float up[7] = {1.0f, 0x1p4f, 0x1p8f, 0x1p12f, 0x1p16f, 0x1p20f, 0x1p24f};
    const qmm_call *call = p->call;
    const size_t K = p->K, xstride = p->xstride, chunk = 8 * LANES;
    float *xp = (float *)p->xp, *xsum = (float *)p->xsum, *natural = xp + Mread * xstride;
    memset(xp + M * xstride, 0, (Mread - M) * xstride * sizeof(float));
    memset(xsum, 0, Mread * p->gstride * sizeof(float));
    memset(natural + K, 0, (xstride - K) * sizeof(float));
    int exact = 1;
    for (size_t m = 0; m < M; m++) {
        for (size_t k = 0; k < K; k += LANES) v_store(natural + k, v_load_dtype(call->x, call->dtype, m * K + k));
        gemv_group_sums(p, natural, xsum + m * p->gstride);
        float *dst = xp + m * xstride;
        for (size_t c = 0; c < xstride; c += chunk) {
            vf plane[8];
            v_planes_of_chunk(natural + c, plane);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                vf v = plane[j];
                if (j > 0 && j < 7) {
                    const vf scaled = v_mul(v, v_set1(down[j]));
                    exact &= v_same(v_mul(scaled, v_set1(up[j])), v);
                    v = scaled;
                }
                v_store(dst + c + (size_t)j * LANES, v);
            }
        }
    }
    return exact;
}
#endif

#if GEMV_BF16DP
/* Whether the bf16 dot-product blocks may multiply this call's x (gemv_bf16.h): every value ±0, ±inf, NaN or of
 * magnitude ≥ 2^-118 (biased exponent ≥ 9), so that vdpbf16ps meets no denormal (2^-119 would do, multiples of
 * 2^-126; one binade of margin). Realistic activations always are; one smaller value sends the whole call to the f32
 * rows (the caller says which). */
static int gemv_bf16_x_ok(const qmm_call *call) {
    const uint16_t *x = call->x;
    const size_t count = call->M * call->K;
    unsigned bad = 0;
    for (size_t i = 0; i < count; i++) bad |= ((x[i] & 0x7F80u) < (9u << 7)) & ((x[i] & 0x7FFFu) != 0);
    return !bad;
}

/* Rows 0…M−1 of x in pair order (gemv_bf16.h) into p->xb and Σx per group into p->xsum; the rows up to Mread and the
 * groups up to gstride zero. Row m holds p->bf16dp parts of kpad values (zero past K): bf16 x itself; or an f16 x
 * as head = its f32 value's upper 16 bits (a bf16) and tail = x − head, which is exact and fits a bf16 too (f16 has
 * 11 significant bits, the head takes 8, the tail the other 3), so head + tail = x exactly and each product with a
 * code is exact. natural: scratch of 2·kpad floats (the row in f32, for Σx, and the parts before pairing). */
static void gemv_prepare_x_bf16(const gemv_plan *p, size_t M, size_t Mread, float *natural) {
    const qmm_call *call = p->call;
    const size_t K = p->K, kpad = p->kpad, parts = (size_t)p->bf16dp;
    uint16_t *xb = (uint16_t *)p->xb, *split = (uint16_t *)(natural + kpad); /* [parts][kpad] */
    float *xsum = (float *)p->xsum;
    memset(xb + M * parts * kpad, 0, (Mread - M) * parts * kpad * sizeof(uint16_t));
    memset(xsum, 0, Mread * p->gstride * sizeof(float));
    memset(split, 0, parts * kpad * sizeof(uint16_t));
    for (size_t m = 0; m < M; m++) {
        for (size_t k = 0; k < K; k += LANES) v_store(natural + k, v_load_dtype(call->x, call->dtype, m * K + k));
        gemv_group_sums(p, natural, xsum + m * p->gstride);
        if (parts == 1) {
            memcpy(split, (const uint16_t *)call->x + m * K, K * sizeof(uint16_t));
        } else {
            for (size_t k = 0; k < K; k += LANES) v_split_bf16(v_load(natural + k), split + k, split + kpad + k);
        }
        for (size_t j = 0; j < parts; j++)
            for (size_t c = 0; c < kpad; c += 64) v_bf16_deinterleave(split + j * kpad + c, xb + (m * parts + j) * kpad + c);
    }
}
#endif

/* Rows 0…M−1 of x in decode order into p->xp and their Σx per group into p->xsum; the padding rows up to Mread
 * (what the passes read, gemv_rows_read) and the padding groups up to gstride zero. */
static void gemv_prepare_x(gemv_plan *p, size_t M, size_t Mread) {
    const qmm_call *call = p->call;
    const size_t K = p->K;
    float *xp = (float *)p->xp, *xsum = (float *)p->xsum;
#if GEMV_BF16DP
    if (p->bf16dp) {
        /* xp holds the pairs (Mread·parts·kpad bf16), then 2·kpad floats of scratch */
        p->xb = (const uint16_t *)xp;
        gemv_prepare_x_bf16(p, M, Mread, xp + Mread * (size_t)p->bf16dp * p->kpad / 2);
        return;
    }
#endif
#if GEMV_PLANES
    if (p->planes) {
        if (gemv_prepare_x_planes(p, M, Mread)) return;
        p->planes = 0; /* an x value that 16^-j would round: the table decode for this call (each thread decides
                        * on the same x, so all alike) */
    }
#endif
    memset(xp + M * K, 0, (Mread - M) * K * sizeof(float));
    memset(xsum, 0, Mread * p->gstride * sizeof(float));
    for (size_t m = 0; m < M; m++) {
        convert_x_row(call, m, p->fast, xp + m * K);
        gemv_group_sums(p, xp + m * K, xsum + m * p->gstride);
    }
}

/* One block of GEMV_RW weight rows (the last one may be narrower) against all M rows of x. */
static void gemv_run_block(const gemv_plan *p, size_t block, size_t blocks) {
    const gemv_plan plan = *p;
    const qmm_call *call = plan.call;
    const size_t M = call->M, N = call->N, K = plan.K;
    const size_t n_begin = block * GEMV_RW, n_end = n_begin + GEMV_RW < N ? n_begin + GEMV_RW : N;
    const uint8_t *rows[GEMV_RW];
    for (size_t n = n_begin; n < n_end; n++) {
        uint8_t *bytes = plan.unpacked ? plan.unpacked + (QMM_CPU_THREAD_ID() * (size_t)GEMV_RW + (n - n_begin)) * K
                                       : NULL;
        rows[n - n_begin] = row_codes(call, call->w + n * plan.words, 0, K, bytes);
    }
    /* The block's scales and biases in f32, once for all passes over x: the inner loop then
     * broadcasts straight from L1 instead of converting a scalar per group per row. */
    float *scales = plan.group_f32 + (size_t)QMM_CPU_THREAD_ID() * 2 * GEMV_RW * plan.gstride;
    float *biases = scales + GEMV_RW * plan.gstride;
    for (size_t n = n_begin; n < n_end; n++) {
        const size_t base = n * plan.groups, at = (n - n_begin) * plan.gstride;
        size_t g = 0;
        for (; g + LANES <= plan.groups; g += LANES) {
            v_store(scales + at + g, v_load_dtype(call->scales, call->dtype, base + g));
            v_store(biases + at + g, v_load_dtype(call->biases, call->dtype, base + g));
        }
        if (g < plan.groups) { /* the last groups % LANES, zero-padded to a whole vector */
            const int rest = (int)(plan.groups - g);
            v_store(scales + at + g, v_load_dtype_partial(call->scales, call->dtype, base + g, rest));
            v_store(biases + at + g, v_load_dtype_partial(call->biases, call->dtype, base + g, rest));
        }
    }
    /* Prefetch the next block while this one is computed (gemv_block.h): only for rows read in
     * place from W, long enough that GEMV_PF bytes ahead stays inside the row or the next one. */
    const size_t row_bytes = K * (size_t)plan.fast / 8;
    const size_t pf_stride = !plan.unpacked && block + 1 < blocks && row_bytes >= 2 * GEMV_PF ? GEMV_RW * row_bytes : 0;
    /* One pass's outputs of the whole block (rows of x × GEMV_RW), stored together after its last register
     * block: a row of x's GEMV_RW outputs are contiguous in out. */
    float tile[GEMV_R_MAX * GEMV_RW];
    for (size_t m0 = 0; m0 < M; m0 += GEMV_R_MAX) {
        const int R = gemv_pass_rows(M - m0), NW = gemv_block_rows(&plan, R);
        size_t n = n_begin;
        for (; n + (size_t)NW <= n_end; n += (size_t)NW) {
            const size_t at = (n - n_begin) * plan.gstride;
            gemv_dispatch(&plan, rows + (n - n_begin), scales + at, biases + at, m0, R, NW, pf_stride,
                          tile + (n - n_begin), GEMV_RW);
        }
        for (; n < n_end; n++) {
            const size_t at = (n - n_begin) * plan.gstride;
            gemv_dispatch(&plan, rows + (n - n_begin), scales + at, biases + at, m0, R, 1, 0, tile + (n - n_begin),
                          GEMV_RW);
        }
        gemv_store(&plan, n_begin, m0, R, n_end - n_begin, tile);
    }
}

/* bf16dp: the parts of x for the bf16 dot-product blocks (1: bf16 x, the caller checked gemv_bf16_x_ok; 2: f16 x),
 * 0 for the others; the caller checked the ISA and the format. */
static qmm_status gemv_qmm_t(const qmm_call *call, int bf16dp) {
    const size_t M = call->M, N = call->N, K = call->K;
    const int threads = qmm_cpu_threads_for(call);
    gemv_plan plan = {.call = call, .K = K, .group_size = (size_t)call->group_size,
                      .groups = K / (size_t)call->group_size, .words = qmm_packed_words(K, call->bits),
                      .fast = fast_bits(call->bits)};
    plan.gstride = (plan.groups + LANES - 1) / LANES * LANES;
    const size_t Mpad = (M + GEMV_R_MAX - 1) / GEMV_R_MAX * GEMV_R_MAX;
    /* M ≤ 2 (one pass of 1 or 2 rows of x), 4-bit, where the ISA has it: decode by nibble planes (gemv_planes.h).
     * There the table decode binds the time (M = 1: 7–8 GB/s of weights per core, well under a core's share of
     * the memory); from 4 rows of x on its cost is shared by the rows and it stays (docs/PERF.md). */
    plan.bf16dp = bf16dp;
    plan.planes = GEMV_PLANES && !bf16dp && call->bits == 4 && M <= 2;
    plan.xstride = (K + 8 * LANES - 1) / (8 * LANES) * (8 * LANES);
    plan.kpad = (K + 63) / 64 * 64;
    /* Room for the layout of x: Mpad·K (decode order); or Mread rows of xstride in plane order and the row in
     * natural order that gemv_prepare_x_planes builds them from; or Mread rows of kpad bf16 in pair order and the
     * row in f32 (gemv_prepare_x_bf16). */
    const size_t Mread = gemv_rows_read(M);
    const size_t xp_per_thread = plan.bf16dp   ? (Mread * (size_t)plan.bf16dp * plan.kpad / 2 + 2 * plan.kpad + 15) / 16 * 16
                                 : plan.planes ? (Mread + 1) * plan.xstride
                                               : Mpad * K;
    qmm_status status = QMM_OK;
    /* x in decode order and its group sums: one copy per thread, each made by its thread. One shared copy
     * written by the first thread before the team starts costs the others a cache-line transfer per line
     * read (the line last held by the other core), and the team waits for it: ≈ 6 µs per call on two cores
     * here (the fixture's layers, M = 16), against ≈ 2 µs for each thread to convert x itself in parallel. */
    float *xp = qmm_cpu_scratch((size_t)threads * xp_per_thread, sizeof(float), "x in decode order");
    float *xsum = qmm_cpu_scratch((size_t)threads * Mpad * plan.gstride, sizeof(float), "x group sums");
    uint8_t *unpacked = NULL;
    float *group_f32 = qmm_cpu_scratch((size_t)threads * 2 * GEMV_RW * plan.gstride, sizeof(float), "block scales");
    if (!xp || !xsum || !group_f32) {
        status = QMM_ERR_OUT_OF_MEMORY; /* message set by qmm_cpu_scratch */
        goto cleanup;
    }
    if (call->bits != 4 && call->bits != 8 &&
        !(unpacked = qmm_cpu_scratch((size_t)threads * GEMV_RW * K, 1, "unpacked codes"))) {
        status = QMM_ERR_OUT_OF_MEMORY;
        goto cleanup;
    }
    plan.unpacked = unpacked;
    plan.group_f32 = group_f32;

    const size_t blocks = (N + GEMV_RW - 1) / GEMV_RW;
    QMM_CPU_FP_CALLER(caller_fp);
#pragma omp parallel num_threads(threads) if (threads > 1 && blocks > 1)
    {
        QMM_CPU_FP_ENTER(caller_fp);
        const size_t me = (size_t)QMM_CPU_THREAD_ID();
        gemv_plan mine = plan;
        mine.xp = xp + me * xp_per_thread;
        mine.xsum = xsum + me * Mpad * plan.gstride;
        gemv_prepare_x(&mine, M, Mread);
#pragma omp for schedule(static) nowait
        for (size_t block = 0; block < blocks; block++) gemv_run_block(&mine, block, blocks);
        QMM_CPU_FP_LEAVE(caller_fp);
    }

cleanup:
    free(xp);
    free(xsum);
    free(unpacked);
    free(group_f32);
    return status;
}

/* unpack_codes for test_cpu (through qmm_cpu_unpack_codes_for_test). */
void QMM_ISA(qmm_cpu_unpack_codes)(const uint32_t *in, size_t count, int bits, uint8_t *codes) {
    unpack_codes(in, count, bits, codes);
}

qmm_status QMM_ISA(qmm_cpu_gemv_qmm_t)(const qmm_call *call) { return gemv_qmm_t(call, 0); }

#if GEMV_BF16DP
static qmm_status gemm_qmm_t(const qmm_call *call, int bf16);

/* The row cpu.qmm_t.gemv_bf16 (backend.c: bf16 or f16 x, 2- to 6-bit codes, AVX-512 BF16): the bf16 dot-product blocks —
 * f16 x in two parts, which never meet a denormal (every part and product is a multiple of 2^-24); bf16 x in one.
 * A bf16 call whose x has a value under 2^-118 (gemv_bf16_x_ok) runs the f32 row the selector takes without this one:
 * the table decode up to QMM_CPU_GEMV_MAX_M, the f32 tiles above (the same bits as those rows). */
qmm_status QMM_ISA(qmm_cpu_gemv_bf16_qmm_t)(const qmm_call *call) {
    if (call->dtype == QMM_F16) return gemv_qmm_t(call, 2);
    if (gemv_bf16_x_ok(call)) return gemv_qmm_t(call, 1);
    return call->M <= QMM_CPU_GEMV_MAX_M ? gemv_qmm_t(call, 0) : gemm_qmm_t(call, 0);
}
#endif

/* ═════════════════════════════ tiled: qmm_t and qmm_n for large M ═════════════════════════════
 *
 * Above the GEMV crossover the FMA units, not memory, bound the time, so the weights are decoded
 * once per panel into an f32 buffer that stays in L1/L2, ŵ = fma(s, q, b), and a register-blocked
 * micro-kernel does one FMA per loaded-and-broadcast pair (BLIS's micro-kernel contract, with the
 * decode in the packing step). Both ops use the same micro-kernel:
 *
 *     C[GEMM_R][2·LANES] += A[GEMM_R][kc] (one scalar per row, broadcast) · B[kc][2·LANES] (2 vectors)
 *
 *     qmm_t: A = decoded weight rows (n), B = xᵀ (m along the lanes), C = outᵀ block
 *     qmm_n: A = rows of x (m),           B = decoded weight rows (n along the lanes), C = out block
 *
 * GEMM_R × 2 accumulators (AVX-512: 12 × 2 = 24 of 32 ZMM; AVX2: 6 × 2 = 12 of 16 YMM) leave room for
 * the two B vectors and the broadcast; per k the kernel issues 2·GEMM_R FMAs for 2 loads and GEMM_R
 * broadcasts, so the two FMA pipes, not the load ports, are the limit.
 * Blocking (per work item, one thread each, items spread over N and M):
 *     AC = 4·GEMM_R rows of A, BC lanes of B, KC = 256 along K
 *     A panel AC × KC (AVX-512: 48 KiB) and the B micro-panel KC × 2·LANES (32 KiB) sit in L1/L2;
 *     C (AC × BC f32) stays in L2 across the K blocks; the xᵀ copy (qmm_t) is shared by all threads.
 * Exactness: ŵ = fma(s, q, b) rounds once, then each product joins one f32 chain along K (C is
 * reloaded exactly between K blocks): every term sees at most K + 1 roundings ≤ K + 2, slack 1.
 * Non-finite: both ops' epilogues replace an output whose f32 accumulator is ±inf or NaN by the f64
 * direct form (qmm_cpu_finite_or_direct, docs/kernels.md §2): even the f32 direct form can overflow a
 * partial sum (3e38 + 3e38 − 3e38) where the product is finite.
 */

#define GEMM_VL (2 * LANES)
#define GEMM_AC (4 * GEMM_R)
#define GEMM_KC 256

ALWAYS_INLINE void gemm_micro(const float *A, const float *B, size_t b_stride, float *C, size_t c_stride, size_t kc,
                              bool first) {
    vf acc[GEMM_R][2];
#pragma GCC unroll 16
    for (int r = 0; r < GEMM_R; r++) {
        acc[r][0] = first ? v_zero() : v_load(C + (size_t)r * c_stride);
        acc[r][1] = first ? v_zero() : v_load(C + (size_t)r * c_stride + LANES);
    }
    for (size_t k = 0; k < kc; k++) {
        const vf b0 = v_load(B + k * b_stride), b1 = v_load(B + k * b_stride + LANES);
#pragma GCC unroll 16
        for (int r = 0; r < GEMM_R; r++) {
            const vf a = v_set1(A[(size_t)r * GEMM_KC + k]);
            acc[r][0] = v_fma(a, b0, acc[r][0]);
            acc[r][1] = v_fma(a, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < GEMM_R; r++) {
        v_store(C + (size_t)r * c_stride, acc[r][0]);
        v_store(C + (size_t)r * c_stride + LANES, acc[r][1]);
    }
}

/* Group g's terms into C: C[r][·] (+)= fma(s[r], qdot[r][·], b[r]·X[g][·]) — the oracle's association, the group's
 * term first, then into C (zero: C's first group, stored, not added). */
ALWAYS_INLINE void gemm_group_into_c(vf qdot[GEMM_R][2], size_t g, float *C, size_t c_stride, const float *scales,
                                     const float *biases, const float *X, size_t x_stride, bool zero) {
    const vf x0 = v_load(X + g * x_stride), x1 = v_load(X + g * x_stride + LANES);
#pragma GCC unroll 16
    for (int r = 0; r < GEMM_R; r++) {
        const vf s = v_set1(scales[g * GEMM_AC + (size_t)r]), b = v_set1(biases[g * GEMM_AC + (size_t)r]);
        float *c = C + (size_t)r * c_stride;
        const vf t0 = v_fma(s, qdot[r][0], v_mul(b, x0)), t1 = v_fma(s, qdot[r][1], v_mul(b, x1));
        v_store(c, zero ? t0 : v_add(v_load(c), t0));
        v_store(c + LANES, zero ? t1 : v_add(v_load(c + LANES), t1));
    }
}

/* qmm_t's micro-kernel in the split form (the seed's and the oracle's order, so the tiled rows agree
 * with the GEMV rows and the seed's f32 tolerance of 1e-3 at outputs of 2·10^4): A holds codes q as
 * f32, and per group g of the K block
 *     qdot[r][·] = Σ_{k∈g} q[r][k]·B[k][·]              (registers, G fused roundings)
 *     C[r][·]   += fma(s[r], qdot[r][·], b[r]·X[g][·])     (the oracle's association)
 * X[g][·] = Σ_{k∈g} x (per m lane) and s, b per (group, row) come from per-call / per-block arrays.
 * C is reloaded once per group (2·GEMM_R vectors per G·2·GEMM_R FMAs: ≤ 3% extra traffic, in L1).
 * Roundings per term: s·q·x: G + 1 + groups; b·x: (G − 1) + 2 + groups; both ≤ K + 2 = G·groups + 2
 * for G ≥ 2 (the split form's count, docs/kernels.md §6). */
ALWAYS_INLINE void gemm_micro_split(const float *A, const float *B, size_t b_stride, float *C, size_t c_stride,
                                    size_t kc, size_t G, const float *scales, const float *biases, const float *X,
                                    size_t x_stride, bool first) {
    for (size_t g = 0; g * G < kc; g++) {
        vf qdot[GEMM_R][2];
#pragma GCC unroll 16
        for (int r = 0; r < GEMM_R; r++) qdot[r][0] = qdot[r][1] = v_zero();
        for (size_t k = g * G; k < (g + 1) * G; k++) {
            const vf b0 = v_load(B + k * b_stride), b1 = v_load(B + k * b_stride + LANES);
#pragma GCC unroll 16
            for (int r = 0; r < GEMM_R; r++) {
                const vf a = v_set1(A[(size_t)r * GEMM_KC + k]);
                qdot[r][0] = v_fma(a, b0, qdot[r][0]);
                qdot[r][1] = v_fma(a, b1, qdot[r][1]);
            }
        }
        gemm_group_into_c(qdot, g, C, c_stride, scales, biases, X, x_stride, first && g == 0);
    }
}

#if GEMV_BF16DP
/* gemm_micro_split on bf16 pairs (the tiled bf16 row, cpu.qmm_t.gemm_bf16): A holds the codes as bf16 pairs,
 * [GEMM_AC][GEMM_KC / 2] (pair p of a row = codes 2p and 2p + 1 of the K block, decode_pairs_bf16), B holds x as bf16
 * pairs, [kc / 2][GEMM_VL] (dword (p, m) = x(m, 2p) | x(m, 2p + 1) << 16), and vdpbf16ps adds both products of a
 * pair into each lane: half the instructions of the f32 kernel for the same k. The group's terms go into C as there.
 * Exact under the same condition as the bf16 GEMV (gemv_bf16.h: every x 0, non-finite or ≥ 2^-118, so no denormal
 * reaches the instruction); roundings per term ≤ G in qdot (each product of a pair adds with one rounding), then as
 * gemm_micro_split: ≤ G + 1 + groups ≤ K + 2. */
BF16DP_TARGET static void gemm_micro_split_bf16(const uint32_t *A, const uint32_t *B, float *C, size_t c_stride,
                                                size_t kc, size_t G, const float *scales, const float *biases,
                                                const float *X, size_t x_stride, bool first) {
    for (size_t g = 0; g * G < kc; g++) {
        vf qdot[GEMM_R][2];
#pragma GCC unroll 16
        for (int r = 0; r < GEMM_R; r++) qdot[r][0] = qdot[r][1] = v_zero();
        for (size_t p = g * G / 2; p < (g + 1) * G / 2; p++) {
            const vh b0 = v_load_bf16((const uint16_t *)(B + p * GEMM_VL)),
                     b1 = v_load_bf16((const uint16_t *)(B + p * GEMM_VL + LANES));
#pragma GCC unroll 16
            for (int r = 0; r < GEMM_R; r++) {
                const vh a = v_broadcast_pair(A + (size_t)r * (GEMM_KC / 2) + p);
                qdot[r][0] = v_dpbf16(qdot[r][0], a, b0);
                qdot[r][1] = v_dpbf16(qdot[r][1], a, b1);
            }
        }
        gemm_group_into_c(qdot, g, C, c_stride, scales, biases, X, x_stride, first && g == 0);
    }
}

/* Codes [c0, c0 + count) of packed row `row` (multiples of 32) as bf16 pairs in natural order into dst[count / 2]
 * (4-bit: v_pairs4_bf16; 8-bit and, unpacked to bytes, the other widths: v_pairs8_bf16). */
static void decode_pairs_bf16(const qmm_call *call, const uint32_t *row, size_t c0, size_t count, uint8_t *bytes,
                              uint32_t *dst) {
    if (call->bits == 4) {
        for (size_t j = 0; j < count; j += 32) v_store_pairs(dst + j / 2, v_pairs4_bf16((const uint8_t *)row + (c0 + j) / 2));
        return;
    }
    const uint8_t *codes = row_codes(call, row, c0, count, bytes);
    for (size_t j = 0; j < count; j += 32) v_store_pairs(dst + j / 2, v_pairs8_bf16(codes + j));
}
#endif

/* Codes [c0, c0 + count) of packed row `row` (count and c0 multiples of 32) decoded into dst in
 * decode order, ŵ = fma(s, q, b) with s, b of each group from scales/biases row `group_row`.
 * bytes: scratch of count bytes for the generic widths. panel_stride 0: dst[j]; else the micro-kernel's
 * panel layout, element j at dst[(j / GEMM_VL)·panel_stride + j % GEMM_VL]. */
static inline float *panel_at(float *dst, size_t panel_stride, size_t j) {
    return panel_stride ? dst + j / GEMM_VL * panel_stride + j % GEMM_VL : dst + j;
}

static void decode_segment(const qmm_call *call, const uint32_t *row, size_t group_row, size_t groups_per_row,
                           size_t c0, size_t count, bool affine, uint8_t *bytes, float *dst, size_t panel_stride) {
    const size_t G = (size_t)call->group_size;
    const int fast = fast_bits(call->bits);
    const uint8_t *codes = row_codes(call, row, c0, count, bytes);
    for (size_t j0 = 0; j0 < count; j0 += G) {
        /* affine: ŵ = fma(s, q, b); else the codes alone (s = 1, b = 0 is exact: q·1 + 0 = q). */
        const size_t g = group_row * groups_per_row + (c0 + j0) / G;
        const vf s = v_set1(affine ? qmm_load_f32(call->scales, call->dtype, g) : 1.0f);
        const vf b = v_set1(affine ? qmm_load_f32(call->biases, call->dtype, g) : 0.0f);
        if (fast == 4) {
            for (size_t j = j0; j < j0 + G; j += 2 * LANES) {
                vf lo, hi;
                v_decode4(codes + j / 2, &lo, &hi);
                v_store(panel_at(dst, panel_stride, j), v_fma(s, lo, b));
                v_store(panel_at(dst, panel_stride, j + LANES), v_fma(s, hi, b));
            }
        } else {
            for (size_t j = j0; j < j0 + G; j += LANES)
                v_store(panel_at(dst, panel_stride, j), v_fma(s, v_decode8(codes + j), b));
        }
    }
}

/* Position in natural order of decode-order index j (inside 2·LANES blocks for 4-bit). */
static inline size_t natural_index(int fast, size_t j) {
    if (fast != 4) return j;
    const size_t block = j / (2 * LANES) * (2 * LANES), i = j % (2 * LANES);
    return block + (i < LANES ? 2 * i : 2 * (i - LANES) + 1);
}

typedef struct gemm_scratch {
    float *scales;  /* [GEMM_KC / 32][GEMM_AC] qmm_t: s of each (group of the K block, row) */
    float *biases;  /* the same for b */
    float *a;       /* [GEMM_AC][GEMM_KC] */
    float *b;       /* [GEMM_KC][bc] (qmm_n) */
    float *c;       /* [GEMM_AC][bc] */
    uint8_t *bytes; /* unpacked codes of one segment */
} gemm_scratch;

/* Per-thread scratch carved out of one allocation; every piece stays 64-byte aligned. */
#define GEMM_GROUP_FLOATS (GEMM_KC / 32 * GEMM_AC)
static size_t gemm_scratch_floats(size_t bc) {
    return 2 * GEMM_GROUP_FLOATS + GEMM_AC * GEMM_KC + GEMM_KC * bc + GEMM_AC * bc + (bc > GEMM_KC ? bc : GEMM_KC) / 4 + 16;
}

static gemm_scratch gemm_scratch_of(float *base, size_t bc, int thread) {
    float *mine = base + (size_t)thread * gemm_scratch_floats(bc);
    gemm_scratch s = {.scales = mine, .biases = mine + GEMM_GROUP_FLOATS};
    mine += 2 * GEMM_GROUP_FLOATS;
    s.a = mine;
    s.b = mine + GEMM_AC * GEMM_KC;
    s.c = mine + GEMM_AC * GEMM_KC + GEMM_KC * bc;
    s.bytes = (uint8_t *)(s.c + GEMM_AC * bc);
    return s;
}

static size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

/* qmm_t: A = weight rows n (decoded per K block), B = xᵀ [K][Mpad] in decode order along K. bf16 (the tiled bf16 row):
 * A = the codes as bf16 pairs and B = x as bf16 pairs [K / 2][Mpad] in natural order (gemm_micro_split_bf16). */
#define GEMM_T_BC (8 * GEMM_VL)

static void gemm_t_item(const qmm_call *call, const float *xt, const float *xg, size_t Mpad, size_t a0, size_t b0,
                        gemm_scratch s, int bf16) {
    const size_t N = call->N, K = call->K, M = call->M, G = (size_t)call->group_size, groups = K / G;
    const size_t words = qmm_packed_words(K, call->bits);
    const size_t a_valid = N - a0 < GEMM_AC ? N - a0 : GEMM_AC;
    const size_t a_rows = round_up(a_valid, GEMM_R);
    const size_t b_lanes = Mpad - b0 < GEMM_T_BC ? Mpad - b0 : GEMM_T_BC; /* a multiple of GEMM_VL */
    for (size_t pc = 0; pc < K; pc += GEMM_KC) {
        const size_t kc = K - pc < GEMM_KC ? K - pc : GEMM_KC, block_groups = kc / G;
        for (size_t i = 0; i < a_rows; i++) {
            if (bf16) {
#if GEMV_BF16DP
                uint32_t *pairs = (uint32_t *)s.a + i * (GEMM_KC / 2); /* half of the row's f32 room */
                if (i < a_valid) decode_pairs_bf16(call, call->w + (a0 + i) * words, pc, kc, s.bytes, pairs);
                else memset(pairs, 0, kc / 2 * sizeof(uint32_t));
#endif
            } else {
                float *dst = s.a + i * GEMM_KC;
                if (i < a_valid) decode_segment(call, call->w + (a0 + i) * words, a0 + i, groups, pc, kc, false, s.bytes, dst, 0);
                else memset(dst, 0, kc * sizeof(float));
            }
            for (size_t g = 0; g < block_groups; g++) {
                const size_t index = (a0 + i) * groups + pc / G + g;
                s.scales[g * GEMM_AC + i] = i < a_valid ? qmm_load_f32(call->scales, call->dtype, index) : 0.0f;
                s.biases[g * GEMM_AC + i] = i < a_valid ? qmm_load_f32(call->biases, call->dtype, index) : 0.0f;
            }
        }
        for (size_t jr = 0; jr < b_lanes; jr += GEMM_VL)
            for (size_t ir = 0; ir < a_rows; ir += GEMM_R) {
                const size_t panel = (b0 + jr) / GEMM_VL;
                const float *X = xg + (panel * groups + pc / G) * GEMM_VL;
#if GEMV_BF16DP
                if (bf16) {
                    gemm_micro_split_bf16((const uint32_t *)s.a + ir * (GEMM_KC / 2),
                                          (const uint32_t *)xt + (panel * (K / 2) + pc / 2) * GEMM_VL,
                                          s.c + ir * GEMM_T_BC + jr, GEMM_T_BC, kc, G, s.scales + ir, s.biases + ir, X,
                                          GEMM_VL, pc == 0);
                    continue;
                }
#endif
                gemm_micro_split(s.a + ir * GEMM_KC, xt + (panel * K + pc) * GEMM_VL, GEMM_VL, s.c + ir * GEMM_T_BC + jr,
                                 GEMM_T_BC, kc, G, s.scales + ir, s.biases + ir, X, GEMM_VL, pc == 0);
            }
    }
    /* outᵀ block → out, row m of out at a time: its a_valid outputs gathered from the column of C, then stored
     * GEMV_RW at a time with the dtype narrowing in vectors (store_run); a run with a non-finite value, and the
     * tail, go one by one through the non-finite rule. (Element by element along C's rows, the stores walked
     * out with stride N and a dtype switch per output: ≈ 10 % of the M = 512 time, perf.) */
    const size_t m_end = b0 + b_lanes < M ? b0 + b_lanes : M;
    float run[GEMM_AC];
    for (size_t m = b0; m < m_end; m++) {
        for (size_t i = 0; i < a_valid; i++) run[i] = s.c[i * GEMM_T_BC + (m - b0)];
        size_t i = 0;
        for (; i + GEMV_RW <= a_valid; i += GEMV_RW)
            if (!store_run(call->out, call->dtype, m * N + a0 + i, run + i))
                for (size_t j = i; j < i + GEMV_RW; j++)
                    qmm_store_f32(call->out, call->dtype, m * N + a0 + j, qmm_cpu_finite_or_direct(call, run[j], m, a0 + j));
        for (; i < a_valid; i++)
            qmm_store_f32(call->out, call->dtype, m * N + a0 + i, qmm_cpu_finite_or_direct(call, run[i], m, a0 + i));
    }
}

/* bf16: 1 for the tiled bf16 row's pairs (the caller checked the ISA, the dtype and gemv_bf16_x_ok). */
static qmm_status gemm_qmm_t(const qmm_call *call, int bf16) {
    const size_t M = call->M, N = call->N, K = call->K, G = (size_t)call->group_size, groups = K / G;
    const int threads = qmm_cpu_threads_for(call);
    const int fast = fast_bits(call->bits);
    const size_t Mpad = round_up(M, GEMM_VL);
    qmm_status status = QMM_OK;
    float *xt = qmm_cpu_scratch(Mpad * K, sizeof(float), "xᵀ");
    float *xg = qmm_cpu_scratch(Mpad * groups, sizeof(float), "x group sums");
    float *scratch = qmm_cpu_scratch((size_t)threads * gemm_scratch_floats(GEMM_T_BC), sizeof(float), "tiles");
    if (!xt || !xg || !scratch) {
        status = QMM_ERR_OUT_OF_MEMORY;
        goto cleanup;
    }
    /* xᵀ in decode order along K, packed in panels of GEMM_VL columns (m): panel p holds
     * [K][GEMM_VL], so the micro-kernel reads its B operand as one contiguous stream (a row stride of
     * Mpad floats would map every row to the same few L1 sets once Mpad is a large power of two).
     * Zero in the padding columns m ≥ M. Σx per (group, m) is summed down each panel the same way.
     * One pass over x per call, shared by every item; threads take whole panels. */
    const size_t panels = Mpad / GEMM_VL;
    QMM_CPU_FP_CALLER(caller_fp);
#pragma omp parallel num_threads(threads) if (threads > 1 && M * K >= 65536)
    {
        QMM_CPU_FP_ENTER(caller_fp);
#pragma omp for schedule(static)
        for (size_t panel = 0; panel < panels; panel++) {
            float *panel_x = xt + panel * K * GEMM_VL, *panel_sum = xg + panel * groups * GEMM_VL;
            const size_t m0 = panel * GEMM_VL, m_end = M - m0 < GEMM_VL ? M : m0 + GEMM_VL;
#if GEMV_BF16DP
            if (bf16) { /* x in bf16 pairs (a panel of K / 2 rows of GEMM_VL dwords: half the f32 panel's room) */
                uint32_t *pairs = (uint32_t *)xt + panel * (K / 2) * GEMM_VL;
                const uint16_t *x = call->x;
                memset(pairs, 0, K / 2 * GEMM_VL * sizeof(uint32_t));
                for (size_t m = m0; m < m_end; m++)
                    for (size_t p = 0; p < K / 2; p++)
                        pairs[p * GEMM_VL + m - m0] = (uint32_t)x[m * K + 2 * p] | (uint32_t)x[m * K + 2 * p + 1] << 16;
                for (size_t g = 0; g < groups; g++) {
                    vf sum[2] = {v_zero(), v_zero()};
                    for (size_t p = g * G / 2; p < (g + 1) * G / 2; p++)
                        for (int h = 0; h < 2; h++) {
                            vf low, high;
                            v_pairs_to_f32(v_load_bf16((const uint16_t *)(pairs + p * GEMM_VL + h * LANES)), &low, &high);
                            sum[h] = v_add(v_add(sum[h], low), high);
                        }
                    v_store(panel_sum + g * GEMM_VL, sum[0]);
                    v_store(panel_sum + g * GEMM_VL + LANES, sum[1]);
                }
                continue;
            }
#endif
            memset(panel_x, 0, K * GEMM_VL * sizeof(float));
            for (size_t m = m0; m < m_end; m++)
                for (size_t k = 0; k < K; k++)
                    panel_x[k * GEMM_VL + m - m0] = qmm_load_f32(call->x, call->dtype, m * K + natural_index(fast, k));
            for (size_t g = 0; g < groups; g++) {
                vf sum[2] = {v_zero(), v_zero()};
                for (size_t k = g * G; k < (g + 1) * G; k++) {
                    sum[0] = v_add(sum[0], v_load(panel_x + k * GEMM_VL));
                    sum[1] = v_add(sum[1], v_load(panel_x + k * GEMM_VL + LANES));
                }
                v_store(panel_sum + g * GEMM_VL, sum[0]);
                v_store(panel_sum + g * GEMM_VL + LANES, sum[1]);
            }
        }
        QMM_CPU_FP_LEAVE(caller_fp);
    }
    const size_t a_items = (N + GEMM_AC - 1) / GEMM_AC, b_items = (Mpad + GEMM_T_BC - 1) / GEMM_T_BC;
    const size_t items = a_items * b_items;
#pragma omp parallel num_threads(threads) if (threads > 1 && items > 1)
    {
        QMM_CPU_FP_ENTER(caller_fp);
#pragma omp for schedule(dynamic)
        for (size_t item = 0; item < items; item++)
            gemm_t_item(call, xt, xg, Mpad, item / b_items * GEMM_AC, item % b_items * GEMM_T_BC,
                        gemm_scratch_of(scratch, GEMM_T_BC, QMM_CPU_THREAD_ID()), bf16);
        QMM_CPU_FP_LEAVE(caller_fp);
    }

cleanup:
    free(xt);
    free(xg);
    free(scratch);
    return status;
}

qmm_status QMM_ISA(qmm_cpu_gemm_qmm_t)(const qmm_call *call) { return gemm_qmm_t(call, 0); }

#if GEMV_BF16DP
/* The row cpu.qmm_t.gemm_bf16 (backend.c: bf16 x, any width, AVX-512 BF16): the bf16 pairs, or the f32 tiles for a
 * call whose x has a value under 2^-118 (gemv_bf16_x_ok). */
qmm_status QMM_ISA(qmm_cpu_gemm_bf16_qmm_t)(const qmm_call *call) {
    return gemm_qmm_t(call, call->dtype == QMM_BF16 && gemv_bf16_x_ok(call));
}
#endif

/* qmm_n: A = rows of x (m), B = weight rows k decoded along N (lanes), C = out block. */
#define GEMM_N_BC (8 * GEMM_VL)

static void gemm_n_item(const qmm_call *call, size_t a0, size_t b0, gemm_scratch s) {
    const size_t N = call->N, K = call->K, M = call->M, groups = N / (size_t)call->group_size;
    const size_t words = qmm_packed_words(N, call->bits);
    const int fast = fast_bits(call->bits);
    const size_t a_valid = M - a0 < GEMM_AC ? M - a0 : GEMM_AC;
    const size_t a_rows = round_up(a_valid, GEMM_R);
    const size_t b_valid = N - b0 < GEMM_N_BC ? N - b0 : GEMM_N_BC; /* a multiple of group_size */
    const size_t b_lanes = round_up(b_valid, GEMM_VL);
    for (size_t pc = 0; pc < K; pc += GEMM_KC) {
        const size_t kc = K - pc < GEMM_KC ? K - pc : GEMM_KC;
        for (size_t i = 0; i < a_rows; i++) {
            float *dst = s.a + i * GEMM_KC;
            if (i < a_valid) {
                /* K is qmm_n's free dimension: any length, so the last few are converted one by one. */
                size_t k = 0;
                for (; k + LANES <= kc; k += LANES)
                    v_store(dst + k, v_load_dtype(call->x, call->dtype, (a0 + i) * K + pc + k));
                for (; k < kc; k++) dst[k] = qmm_load_f32(call->x, call->dtype, (a0 + i) * K + pc + k);
            } else {
                memset(dst, 0, kc * sizeof(float));
            }
        }
        /* Decoded weight rows in panels of GEMM_VL lanes, [panel][KC][GEMM_VL]: contiguous B streams
         * for the micro-kernel (see qmm_t's xᵀ). */
        for (size_t k = 0; k < kc; k++) {
            float *dst = s.b + k * GEMM_VL;
            decode_segment(call, call->w + (pc + k) * words, pc + k, groups, b0, b_valid, true, s.bytes, dst,
                           GEMM_KC * GEMM_VL);
            for (size_t j = b_valid; j < b_lanes; j += LANES) v_store(panel_at(dst, GEMM_KC * GEMM_VL, j), v_zero());
        }
        for (size_t jr = 0; jr < b_lanes; jr += GEMM_VL)
            for (size_t ir = 0; ir < a_rows; ir += GEMM_R)
                gemm_micro(s.a + ir * GEMM_KC, s.b + jr / GEMM_VL * GEMM_KC * GEMM_VL, GEMM_VL,
                           s.c + ir * GEMM_N_BC + jr, GEMM_N_BC, kc, pc == 0);
    }
    /* The non-finite rule (cpu.h): an accumulator that overflowed or met a non-finite input. */
    for (size_t i = 0; i < a_valid; i++)
        for (size_t j = 0; j < b_valid; j++) {
            const size_t n = b0 + natural_index(fast, j);
            qmm_store_f32(call->out, call->dtype, (a0 + i) * N + n,
                          qmm_cpu_finite_or_direct(call, s.c[i * GEMM_N_BC + j], a0 + i, n));
        }
}

qmm_status QMM_ISA(qmm_cpu_gemm_qmm_n)(const qmm_call *call) {
    const size_t M = call->M, N = call->N;
    const int threads = qmm_cpu_threads_for(call);
    float *scratch = qmm_cpu_scratch((size_t)threads * gemm_scratch_floats(GEMM_N_BC), sizeof(float), "tiles");
    if (!scratch) return QMM_ERR_OUT_OF_MEMORY;
    const size_t a_items = (M + GEMM_AC - 1) / GEMM_AC, b_items = (N + GEMM_N_BC - 1) / GEMM_N_BC;
    const size_t items = a_items * b_items;
    QMM_CPU_FP_CALLER(caller_fp);
#pragma omp parallel num_threads(threads) if (threads > 1 && items > 1)
    {
        QMM_CPU_FP_ENTER(caller_fp);
#pragma omp for schedule(dynamic)
        for (size_t item = 0; item < items; item++)
            gemm_n_item(call, item / b_items * GEMM_AC, item % b_items * GEMM_N_BC,
                        gemm_scratch_of(scratch, GEMM_N_BC, QMM_CPU_THREAD_ID()));
        QMM_CPU_FP_LEAVE(caller_fp);
    }
    free(scratch);
    return QMM_OK;
}

/* ═════════════════════════════ GEMV: qmm_n for small M ═════════════════════════════
 *
 * out[m, n] = Σ_k x[m, k]·ŵ[k, n], W [K, N·bits/32] quantized along N (MLX transpose=False).
 * Memory: each row k of W is contiguous along N, so the kernel walks K in blocks of QMV_N_KB rows
 * (that many sequential streams, which the hardware prefetcher follows; walking a column slab down K
 * instead reads one line per 2 KiB stride and waits on DRAM latency for each) over a chunk of
 * columns whose accumulators out[M][chunk] stay in L1 (≤ 16 KiB). Per vector of columns: the
 * QMV_N_KB rows' codes are decoded once, then each row of x loads its accumulator, adds its
 * QMV_N_KB products in k order and stores it — one load and one store per QMV_N_KB FMAs.
 * Threads take disjoint column ranges (whole 2·LANES blocks), so every output has one owner.
 * ŵ is MLX's direct form, fma(s, q, b) rounded once (AVX-512: a 16-entry table of fma(s, q, b) per
 * (row k, group) looked up with vpermps), then one f32 chain per output along K in order k = 0, 1, …:
 * the tiled qmm_n rows' order exactly, so both give the same bits. Roundings per term: 1 + K ≤ K + 2,
 * slack 1. Non-finite: an output whose f32 accumulator is not finite is replaced by the f64 direct
 * form (qmm_cpu_finite_or_direct), as in the tiled rows.
 * Output columns are in decode order inside each 2·LANES block and are put in order at the store.
 */
#define QMV_N_KB 4

static inline float load_f32_of(const void *array, qmm_dtype dtype, size_t i) {
    return dtype == QMM_F32 ? ((const float *)array)[i] : qmm_load_f32(array, dtype, i);
}
#define QMV_N_ACC_FLOATS 4096 /* 16 KiB of accumulators per thread */

/* Columns [n0, n0 + width) (width a multiple of 32) for all M rows of x (xf: [M][K] f32) into
 * acc[M][width]; bytes: scratch of QMV_N_KB·width for the generic widths. */
static void qmv_n_chunk(const qmm_call *call, const float *xf, size_t n0, size_t width, uint8_t *bytes, float *acc) {
    const size_t K = call->K, N = call->N, M = call->M, G = (size_t)call->group_size, groups = N / G;
    const size_t words = qmm_packed_words(N, call->bits);
    const int fast = fast_bits(call->bits);
    const size_t step = fast == 4 ? 2 * LANES : LANES;
    memset(acc, 0, M * width * sizeof(float));
    for (size_t k0 = 0; k0 < K; k0 += QMV_N_KB) {
        const int kb = K - k0 < QMV_N_KB ? (int)(K - k0) : QMV_N_KB;
        const uint8_t *codes[QMV_N_KB];
        for (int i = 0; i < kb; i++) {
            uint8_t *scratch = bytes ? bytes + (size_t)i * width : NULL; /* NULL for 4- and 8-bit */
            codes[i] = row_codes(call, call->w + (k0 + (size_t)i) * words, n0, width, scratch);
        }
        vf table[QMV_N_KB], s[QMV_N_KB], b[QMV_N_KB];
#pragma GCC unroll 4
        for (int i = 0; i < QMV_N_KB; i++) table[i] = s[i] = b[i] = v_zero(); /* set at j = 0 */
        for (size_t j = 0; j < width; j += step) {
            if (j == 0 || (n0 + j) % G == 0) { /* a new group (n0 is a multiple of 32, not always of G) */
                const size_t g = (n0 + j) / G;
#pragma GCC unroll 4
                for (int i = 0; i < QMV_N_KB; i++) {
                    if (i >= kb) break;
                    s[i] = v_set1(load_f32_of(call->scales, call->dtype, (k0 + (size_t)i) * groups + g));
                    b[i] = v_set1(load_f32_of(call->biases, call->dtype, (k0 + (size_t)i) * groups + g));
                    table[i] = fast == 4 ? v_affine_table(s[i], b[i]) : s[i];
                }
            }
            vf w_lo[QMV_N_KB], w_hi[QMV_N_KB];
#pragma GCC unroll 4
            for (int i = 0; i < QMV_N_KB; i++) {
                w_lo[i] = w_hi[i] = v_zero(); /* rows past kb: never read */
                if (i >= kb) continue;
                if (fast == 4) v_decode4_affine(codes[i] + j / 2, table[i], s[i], b[i], &w_lo[i], &w_hi[i]);
                else w_lo[i] = v_fma(s[i], v_decode8(codes[i] + j), b[i]);
            }
            for (size_t m = 0; m < M; m++) {
                float *a = acc + m * width + j;
                const float *x = xf + m * K + k0;
                vf a_lo = v_load(a), a_hi = fast == 4 ? v_load(a + LANES) : v_zero();
#pragma GCC unroll 4
                for (int i = 0; i < QMV_N_KB; i++) {
                    if (i >= kb) break;
                    const vf xv = v_set1(x[i]);
                    a_lo = v_fma(xv, w_lo[i], a_lo);
                    if (fast == 4) a_hi = v_fma(xv, w_hi[i], a_hi);
                }
                v_store(a, a_lo);
                if (fast == 4) v_store(a + LANES, a_hi);
            }
        }
    }
}

qmm_status QMM_ISA(qmm_cpu_gemv_qmm_n)(const qmm_call *call) {
    const size_t M = call->M, N = call->N, K = call->K;
    const int threads = qmm_cpu_threads_for(call);
    const int fast = fast_bits(call->bits);
    /* Columns per chunk: accumulators of all M rows within QMV_N_ACC_FLOATS, whole 32-column blocks. */
    size_t chunk = QMV_N_ACC_FLOATS / M / 32 * 32;
    if (chunk < 32) chunk = 32;
    qmm_status status = QMM_OK;
    float *xf = qmm_cpu_scratch(M * K, sizeof(float), "x in f32");
    float *acc = qmm_cpu_scratch((size_t)threads * M * chunk, sizeof(float), "accumulators");
    uint8_t *bytes = NULL;
    if (!xf || !acc) {
        status = QMM_ERR_OUT_OF_MEMORY; /* message set by qmm_cpu_scratch */
        goto cleanup;
    }
    if (call->bits != 4 && call->bits != 8 &&
        !(bytes = qmm_cpu_scratch((size_t)threads * QMV_N_KB * chunk, 1, "unpacked codes"))) {
        status = QMM_ERR_OUT_OF_MEMORY;
        goto cleanup;
    }
    for (size_t i = 0; i < M * K; i++) xf[i] = qmm_load_f32(call->x, call->dtype, i);
    /* Each thread owns one contiguous range of whole 32-column blocks, cut into chunks. */
    const size_t blocks = N / 32;
    QMM_CPU_FP_CALLER(caller_fp);
#pragma omp parallel num_threads(threads) if (threads > 1 && blocks > 1)
    {
        QMM_CPU_FP_ENTER(caller_fp);
        const size_t team = (size_t)qmm_cpu_team_size(), me = (size_t)QMM_CPU_THREAD_ID();
        const size_t first = blocks * me / team * 32, last = blocks * (me + 1) / team * 32;
        float *mine = acc + me * M * chunk;
        uint8_t *my_bytes = bytes ? bytes + me * QMV_N_KB * chunk : NULL;
        for (size_t n0 = first; n0 < last; n0 += chunk) {
            const size_t width = last - n0 < chunk ? last - n0 : chunk;
            qmv_n_chunk(call, xf, n0, width, my_bytes, mine);
            /* The non-finite rule (docs/kernels.md §2): an accumulator that overflowed is replaced by the
             * f64 direct form. */
            for (size_t m = 0; m < M; m++)
                for (size_t j = 0; j < width; j++) {
                    const size_t n = n0 + natural_index(fast, j);
                    qmm_store_f32(call->out, call->dtype, m * N + n,
                                  qmm_cpu_finite_or_direct(call, mine[m * width + j], m, n));
                }
        }
        QMM_CPU_FP_LEAVE(caller_fp);
    }

cleanup:
    free(xf);
    free(acc);
    free(bytes);
    return status;
}

/* ═════════════════════════════ ordered GEMV: qmm_t for small M in the tiled rows' order ═════════════════════════════
 *
 * Batch-invariant mode (docs/kernels.md §11) needs, at M ≤ 16, a row that reduces each output exactly as
 * the tiled qmm_t row of the same ISA does (order "split-fma-d32" / "split-fma-d16"), since that row sets
 * the order at every larger M; the GEMV rows above split K across lanes and sum with a tree, another order.
 * Per output (n, m) and group g, in the tiled row's arithmetic (gemm_micro_split):
 *     qdot = 0; for each position j of the group in decode order (2·LANES-code blocks: even codes, then
 *            odd; 8-bit and unpacked widths in order): qdot = fma(q[n][k(j)], x[m][k(j)], qdot)
 *     X    = 0; for the same j: X = X + x[m][k(j)]
 *     t = fma(s, qdot, b·X);  acc = (g = 0) ? t : acc + t;   then the non-finite rule
 * Vectorised across N instead of M or K: LANES weight rows sit in the lanes, so each lane is one output's own
 * chain and M pads nothing. The packed words of LANES rows at one decode block are loaded and transposed
 * (v_load_words: AVX-512 loads 16 bytes a row and permutes, AVX2 gathers; 4-bit: 8 codes a word, 8-bit and
 * unpacked widths: 4), then each column is a shift and a table lookup (AVX-512, 4-bit) or a shift, a mask and
 * a conversion: 2.4× the GEMV rows' time at M = 1 on 4096² (docs/PERF.md), where the tiled row decodes the
 * weights to f32 panels and uses 1 of its 2·LANES lanes (21×).
 * Rows of x: ORDERED_R at a time share each column's codes (R accumulators).
 */
#define ORDERED_R 4
/* Blocks of LANES weight rows run together (NB) at M = 1 with 4-bit codes: each lane's chain is sequential (the
 * order), so one block and one row of x is a single FMA chain per vector; ORDERED_NB_MAX blocks (each decoding its
 * own codes, all against the same x) give the core independent chains. Measured on the Zen 4 VM (docs/PERF.md,
 * thirty-ninth session), M = 1: AVX-512 0.91x the time (geomean of three seed shapes, 0.85-1.01), AVX2 0.78x
 * (0.76-0.82); M = 2 and 4 unchanged (1.00-1.02). The FMA latency was not the main bound, the decode is. Two
 * blocks of two rows at M = 2 took 1.04-1.26x one block's time, so from M = 2 one block takes up to ORDERED_R rows.
 * 8-bit and byte codes keep one block: with two, 4096² took 1.16-1.25x the time (a row of 4 KiB puts every row's line
 * in one L1 set), 5120² 0.81x. AVX2 has 16 registers: two blocks at most. */
#define ORDERED_NB_MAX (LANES == 16 ? 4 : 2)
/* Prefetch distance along each weight row, in words (1 KiB, as the GEMV rows): LANES rows are LANES streams,
 * more than the hardware prefetcher follows well. */
#define ORDERED_PF_WORDS 256

typedef struct ordered_plan {
    const qmm_call *call;
    size_t K, G, groups, words;
    int fast;
    const float *xd; /* [M][K] x in decode order */
    const float *xg; /* [M][groups] Σx per group in decode order, sequential */
    float *sb;       /* [threads][ORDERED_NB_MAX][2][groups][LANES] the blocks' scales, then biases */
    uint8_t *bytes;  /* generic widths: [threads][LANES][K] codes as bytes (one block: nb = 1); else NULL */
} ordered_plan;

/* R rows of x from m0 against NB blocks of LANES weight rows (rows[b·LANES + lane]; block b's scales and biases
 * at sb + b·2·groups·LANES): acc[b·RMAX + r] = the outputs' f32 accumulators, RMAX = ORDERED_R / NB. FAST (4 or 8)
 * and NB are constants, so once the positions of a decode block are unrolled, the word, shift and x offset of each
 * are constants too: the words stay in registers. The words are loaded 4 at a time where the decode order allows
 * (8-bit and byte codes: in order), all of the decode block's at once for 4-bit (even codes, then odd). x is
 * broadcast inside each FMA (AVX-512: an embedded-broadcast memory operand; a broadcast kept in a register for the
 * NB blocks cost an instruction per FMA at NB = 1, 1.3x the time). Each chain takes the positions in decode order
 * whatever NB: the bits do not depend on it. */
#define ORDERED_ROWS(NAME, FAST, NB)                                                                             \
    ALWAYS_INLINE void NAME(const ordered_plan *p, const uint32_t *const *rows, size_t m0, int R, const float *sb, \
                            vf *acc) {                                                                           \
        const size_t K = p->K, G = p->G, groups = p->groups;                                                     \
        enum { PER_WORD = FAST == 4 ? 8 : 4, WIDTH = FAST == 4 ? 4 : 8, MASK = FAST == 4 ? 0xF : 0xFF,           \
               WORDS = 2 * LANES / PER_WORD, PART = FAST == 4 ? WORDS : 4, RMAX = ORDERED_R / NB };              \
        for (size_t g = 0; g < groups; g++) {                                                                    \
            vf qdot[NB][RMAX];                                                                                   \
            _Pragma("GCC unroll 4") for (int b = 0; b < NB; b++)                                                 \
                _Pragma("GCC unroll 4") for (int r = 0; r < RMAX; r++) qdot[b][r] = v_zero();                    \
            for (size_t c0 = g * G; c0 < (g + 1) * G; c0 += 2 * LANES) {                                         \
                if (m0 == 0 && c0 % (16 * PER_WORD) == 0) /* a new 64-byte line of every row: fetch one ahead */ \
                    for (int lane = 0; lane < NB * LANES; lane++)                                                \
                        __builtin_prefetch(rows[lane] + c0 / PER_WORD + ORDERED_PF_WORDS);                       \
                const float *x = p->xd + m0 * K + c0;                                                            \
                _Pragma("GCC unroll 8") for (int h = 0; h < WORDS; h += PART) {                                  \
                    vi words[NB][PART];                                                                          \
                    _Pragma("GCC unroll 4") for (int b = 0; b < NB; b++)                                         \
                        v_load_words(rows + b * LANES, c0 / PER_WORD + (size_t)h, PART, words[b]);               \
                    _Pragma("GCC unroll 32") for (int j = h * PER_WORD; j < (h + PART) * PER_WORD; j++) {         \
                        const int k = (int)natural_index(FAST, (size_t)j) - h * PER_WORD;                        \
                        _Pragma("GCC unroll 4") for (int b = 0; b < NB; b++) {                                   \
                            const vf q = FAST == 4 ? v_code4_field(words[b][k / PER_WORD], (k % PER_WORD) * WIDTH) \
                                                   : v_code_field(words[b][k / PER_WORD], (k % PER_WORD) * WIDTH, MASK); \
                            _Pragma("GCC unroll 4") for (int r = 0; r < RMAX; r++) if (r < R) qdot[b][r] =       \
                                v_fma(v_set1(x[(size_t)r * K + (size_t)j]), q, qdot[b][r]);                      \
                        }                                                                                        \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
            _Pragma("GCC unroll 4") for (int b = 0; b < NB; b++) {                                               \
                const float *block_sb = sb + (size_t)b * 2 * groups * LANES;                                     \
                const vf s = v_load(block_sb + g * LANES), bias = v_load(block_sb + (groups + g) * LANES);      \
                _Pragma("GCC unroll 4") for (int r = 0; r < RMAX; r++) {                                         \
                    if (r >= R) continue;                                                                        \
                    const vf t = v_fma(s, qdot[b][r], v_mul(bias, v_set1(p->xg[(m0 + (size_t)r) * groups + g]))); \
                    acc[b * RMAX + r] = g == 0 ? t : v_add(acc[b * RMAX + r], t);                                \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
    }
ORDERED_ROWS(ordered_rows_4, 4, 1)
ORDERED_ROWS(ordered_rows_8, 8, 1)
ORDERED_ROWS(ordered_rows_4_blocks, 4, ORDERED_NB_MAX) /* M = 1, 4-bit */

/* The nb blocks of LANES weight rows from n0 (blocks past N repeat its last row; their results are dropped). fast and
 * nb are constants in each of the three functions below, so each holds only its own kernel: one function holding the
 * one-block and the blocks kernels made the one-block path 1.06-1.10x slower at M = 2 (AVX2), and the split alone made
 * 8-bit M = 1 (the same kernel as before) 0.79-0.81x the time (Zen 4 VM; code generation, not arithmetic). */
ALWAYS_INLINE void ordered_block(const ordered_plan *p, size_t n0, float *sb, uint8_t *bytes, const int fast,
                                 const int nb) {
    const qmm_call *call = p->call;
    const size_t N = call->N, M = call->M, K = p->K, groups = p->groups;
    const int rows_here = N - n0 < (size_t)(nb * LANES) ? (int)(N - n0) : nb * LANES;
    /* Scales and biases of the blocks' rows, lane-major per group, block after block (rows past N repeat the last). */
    for (int b = 0; b < nb; b++)
        for (size_t g = 0; g < groups; g++)
            for (int lane = 0; lane < LANES; lane++) {
                const int row = b * LANES + lane;
                const size_t n = n0 + (size_t)(row < rows_here ? row : rows_here - 1);
                float *block_sb = sb + (size_t)b * 2 * groups * LANES;
                block_sb[g * LANES + (size_t)lane] = qmm_load_f32(call->scales, call->dtype, n * groups + g);
                block_sb[(groups + g) * LANES + (size_t)lane] = qmm_load_f32(call->biases, call->dtype, n * groups + g);
            }
    /* Where the codes come from: packed 4- or 8-bit rows in place, else each row unpacked to bytes (= 8-bit). */
    const uint32_t *base;
    size_t stride;
    if (fast == 4 || call->bits == 8) {
        base = call->w + n0 * p->words;
        stride = p->words;
    } else {
        for (int row = 0; row < rows_here; row++)
            unpack_codes(call->w + (n0 + (size_t)row) * p->words, K, call->bits, bytes + (size_t)row * K);
        base = (const uint32_t *)bytes;
        stride = K / 4;
    }
    const uint32_t *rows[ORDERED_NB_MAX * LANES];
    for (int row = 0; row < nb * LANES; row++)
        rows[row] = base + (size_t)(row < rows_here ? row : rows_here - 1) * stride;
    float result[LANES];
    const int rmax = ORDERED_R / nb;
    for (size_t m0 = 0; m0 < M; m0 += (size_t)rmax) {
        const int R = M - m0 < (size_t)rmax ? (int)(M - m0) : rmax;
        vf acc[ORDERED_R];
        if (fast != 4) ordered_rows_8(p, rows, m0, R, sb, acc); /* nb = 1 */
        else if (nb == 1) ordered_rows_4(p, rows, m0, R, sb, acc);
        else ordered_rows_4_blocks(p, rows, m0, R, sb, acc);
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < R; r++) {
                const size_t m = m0 + (size_t)r;
                v_store(result, acc[b * rmax + r]);
                for (int lane = 0; lane < LANES && b * LANES + lane < rows_here; lane++) {
                    const size_t n = n0 + (size_t)(b * LANES + lane);
                    qmm_store_f32(call->out, call->dtype, m * N + n,
                                  qmm_cpu_finite_or_direct(call, result[lane], m, n));
                }
            }
    }
}
static __attribute__((noinline)) void ordered_block_4(const ordered_plan *p, size_t n0, float *sb, uint8_t *bytes) {
    ordered_block(p, n0, sb, bytes, 4, 1);
}
static __attribute__((noinline)) void ordered_block_8(const ordered_plan *p, size_t n0, float *sb, uint8_t *bytes) {
    ordered_block(p, n0, sb, bytes, 8, 1);
}
static __attribute__((noinline)) void ordered_block_4_many(const ordered_plan *p, size_t n0, float *sb,
                                                           uint8_t *bytes) {
    ordered_block(p, n0, sb, bytes, 4, ORDERED_NB_MAX);
}

qmm_status QMM_ISA(qmm_cpu_gemv_ordered_qmm_t)(const qmm_call *call) {
    const size_t M = call->M, N = call->N, K = call->K, G = (size_t)call->group_size, groups = K / G;
    const int threads = qmm_cpu_threads_for(call);
    ordered_plan plan = {.call = call, .K = K, .G = G, .groups = groups, .words = qmm_packed_words(K, call->bits),
                         .fast = fast_bits(call->bits)};
    /* Blocks of LANES weight rows run together: ORDERED_NB_MAX at M = 1 with 4-bit codes, where there are enough of
     * them for every thread, else 1 (the bits are the same either way: each output's chain does not depend on it). */
    const int nb = M == 1 && plan.fast == 4 && N >= (size_t)threads * ORDERED_NB_MAX * LANES ? ORDERED_NB_MAX : 1;
    qmm_status status = QMM_OK;
    float *xd = qmm_cpu_scratch(M * K, sizeof(float), "x in decode order");
    float *xg = qmm_cpu_scratch(M * groups, sizeof(float), "x group sums");
    float *sb = qmm_cpu_scratch((size_t)threads * ORDERED_NB_MAX * 2 * groups * LANES, sizeof(float), "block scales");
    uint8_t *bytes = NULL;
    if (!xd || !xg || !sb) {
        status = QMM_ERR_OUT_OF_MEMORY; /* message set by qmm_cpu_scratch */
        goto cleanup;
    }
    if (plan.fast != 4 && call->bits != 8 &&
        !(bytes = qmm_cpu_scratch((size_t)threads * LANES * K, 1, "unpacked codes"))) {
        status = QMM_ERR_OUT_OF_MEMORY;
        goto cleanup;
    }
    /* x in decode order and Σx per group, summed in that order from 0 as the tiled row sums its panel. */
    for (size_t m = 0; m < M; m++) {
        for (size_t j = 0; j < K; j++) xd[m * K + j] = qmm_load_f32(call->x, call->dtype, m * K + natural_index(plan.fast, j));
        for (size_t g = 0; g < groups; g++) {
            float sum = 0.0f;
            for (size_t j = g * G; j < (g + 1) * G; j++) sum = sum + xd[m * K + j];
            xg[m * groups + g] = sum;
        }
    }
    plan.xd = xd;
    plan.xg = xg;
    plan.sb = sb;
    plan.bytes = bytes;
    const size_t rows_per = (size_t)nb * LANES, blocks = (N + rows_per - 1) / rows_per;
    QMM_CPU_FP_CALLER(caller_fp);
#pragma omp parallel num_threads(threads) if (threads > 1 && blocks > 1)
    {
        QMM_CPU_FP_ENTER(caller_fp);
#pragma omp for schedule(static)
        for (size_t block = 0; block < blocks; block++) {
            const size_t me = (size_t)QMM_CPU_THREAD_ID();
            float *my_sb = sb + me * ORDERED_NB_MAX * 2 * groups * LANES;
            uint8_t *my_bytes = bytes ? bytes + me * LANES * K : NULL; /* byte codes: nb = 1 */
            if (plan.fast != 4) ordered_block_8(&plan, block * rows_per, my_sb, my_bytes);
            else if (nb == 1) ordered_block_4(&plan, block * rows_per, my_sb, my_bytes);
            else ordered_block_4_many(&plan, block * rows_per, my_sb, my_bytes);
        }
        QMM_CPU_FP_LEAVE(caller_fp);
    }

cleanup:
    free(xd);
    free(xg);
    free(sb);
    free(bytes);
    return status;
}
