/*
 * avx512.c — the CPU kernels for AVX-512 F/BW/VL/DQ (16 f32 lanes, 32 ZMM registers), plus FMA and
 * F16C. Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c and nothing else
 * (CMakeLists.txt): run only after qmm_cpu_has_avx512(); the bf16 rows' functions add AVX512_BF16 by a target
 * attribute (BF16DP_TARGET) and run only after qmm_cpu_has_avx512bf16(). This file defines the vector vocabulary of
 * simd_kernels.h for 512-bit registers; the algorithms are there.
 */
#include "cpu.h"
#include "unpack.h"

#include <immintrin.h>

#define QMM_ISA(name) name##_avx512
#define LANES 16
/* GEMV: up to 8 rows of x per pass and 8 weight rows per block; at most 16 accumulators (rows of x ×
 * weight rows) of the 32 ZMM, which leaves the scale tables, the decoded codes and x in registers
 * too (16 rows of x × 1 weight row measured 10% slower at M = 16: each x vector fed one FMA, and
 * 16 rows × K = 1536 of x come from L2, not L1). GEMV_PF: prefetch distance
 * in bytes per weight row (8 rows × 1 KiB in flight per core covers ~100 ns of DRAM latency at
 * 13 GB/s per core several times over; 2 and 4 KiB measured the same on Zen 4, into L2: GEMV_PF_HINT). */
#define GEMV_R_MAX 8
#define GEMV_RW 8
#define GEMV_PF 1024
/* Vector registers, for the GEMV blocks' register budget (gemv_block.h). */
#define GEMV_VREGS 32
/* Tiled: 12 broadcast rows × 2 vectors = 24 accumulators of 32 ZMM. */
#define GEMM_R 12
typedef __m512 vf;

static inline vf v_zero(void) { return _mm512_setzero_ps(); }
static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf v_set1(float v) { return _mm512_set1_ps(v); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }

/* Tree sum, four roundings deep: 8 + 8, then 4 + 4, 2 + 2, 1 + 1. */
static inline float v_hsum(vf v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* f16 → f32 (vcvtph2ps, exact); bf16 → f32 is the 16 bits shifted into the high half (exact). */
static inline vf v_load_dtype(const void *array, qmm_dtype dtype, size_t i) {
    switch (dtype) {
    case QMM_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)array + i)));
    case QMM_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)array + i))), 16));
    default: return _mm512_loadu_ps((const float *)array + i);
    }
}

/* The first count (< LANES) elements i… of an f32/f16/bf16 array as f32, the other lanes 0; nothing past element
 * i + count − 1 is read (masked loads). */
static inline vf v_load_dtype_partial(const void *array, qmm_dtype dtype, size_t i, int count) {
    const __mmask16 mask = (__mmask16)((1u << count) - 1u);
    switch (dtype) {
    case QMM_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)array + i));
    case QMM_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)array + i)), 16));
    default: return _mm512_maskz_loadu_ps(mask, (const float *)array + i);
    }
}

/* 32 codes from 16 bytes: zero-extend each byte to a lane (vpmovzxbd), low nibbles = even codes,
 * high nibbles = odd codes; int → f32 is exact (codes < 256). */
static inline void v_decode4(const uint8_t *bytes, vf *lo, vf *hi) {
    const __m512i lanes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(lanes, _mm512_set1_epi32(0xF)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(lanes, 4));
}

/* The scale table of a group: lane q = s·q for q = 0…15, one rounding each (exactly v_mul(s, q)). */
static inline vf v_scale_table(vf s) {
    return _mm512_mul_ps(s, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* 32 codes from 16 bytes straight to s·q: zero-extend each byte to a lane (vpmovzxbd), then vpermps
 * looks each lane up in the scale table; vpermps reads only index bits 0–3, which are the low nibble
 * (even codes) as they stand and the high nibble after a shift by 4 (odd codes). 4 instructions for
 * 32 codes, no int → float conversion and no multiply. */
static inline void v_decode4_scaled(const uint8_t *bytes, vf table, vf *lo, vf *hi) {
    const __m512i lanes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
    *lo = _mm512_permutexvar_ps(lanes, table);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(lanes, 4), table);
}

/* qmm_n's direct form per group: lane q = fma(s, q, b) for q = 0…15 (exactly what fma(s, q, b) on
 * the converted code gives), looked up like v_decode4_scaled. */
static inline vf v_affine_table(vf s, vf b) {
    return _mm512_fmadd_ps(s, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), b);
}

static inline void v_decode4_affine(const uint8_t *bytes, vf table, vf s, vf b, vf *lo, vf *hi) {
    (void)s, (void)b;
    v_decode4_scaled(bytes, table, lo, hi);
}

static inline vf v_decode8(const uint8_t *bytes) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes)));
}

/* 32 floats → even-indexed and odd-indexed, one two-source permute each. */
static inline void v_deinterleave(const vf *pair, vf *even, vf *odd) {
    const __m512i even_index = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd_index = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    *even = _mm512_permutex2var_ps(pair[0], even_index, pair[1]);
    *odd = _mm512_permutex2var_ps(pair[0], odd_index, pair[1]);
}

/* The ordered GEMV's code words (simd_kernels.h). */
typedef __m512i vi;
/* (words >> shift) & mask as f32 (exact: a code is < 256). */
static inline vf v_code_field(vi words, int shift, int mask) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(words, (unsigned)shift), _mm512_set1_epi32(mask)));
}
/* A 4-bit code field as f32 by table: vpermps reads only index bits 0–3, so the shifted word needs no mask and
 * the lookup of 0.0f … 15.0f replaces the conversion (exact). */
static inline vf v_code4_field(vi words, int shift) {
    const vf table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_permutexvar_ps(shift ? _mm512_srli_epi32(words, (unsigned)shift) : words, table);
}
/* count (a multiple of 4) words from word `first` of LANES = 16 rows (row r at rows[r]) into count vectors:
 * words[i] lane r = rows[r][first + i]. Loads instead of gathers: each row's 4 words are one 16-byte load,
 * four rows fill a ZMM (one load, three inserts), and two two-source permutes and a blend per word pick the
 * word of all 16 rows (a 16×4 transpose) — about 40 instructions per 4 words against 4 gathers of 16
 * loads each. */
static inline void v_load_words(const uint32_t *const *rows, size_t first, int count, vi *words) {
    for (int w0 = 0; w0 < count; w0 += 4) {
        __m512i z[4];
        for (int a = 0; a < 4; a++) {
            z[a] = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rows[4 * a] + first + (size_t)w0)));
            z[a] = _mm512_inserti32x4(z[a], _mm_loadu_si128((const __m128i *)(rows[4 * a + 1] + first + (size_t)w0)), 1);
            z[a] = _mm512_inserti32x4(z[a], _mm_loadu_si128((const __m128i *)(rows[4 * a + 2] + first + (size_t)w0)), 2);
            z[a] = _mm512_inserti32x4(z[a], _mm_loadu_si128((const __m128i *)(rows[4 * a + 3] + first + (size_t)w0)), 3);
        }
        for (int i = 0; i < 4; i++) {
            /* lanes 0–7: word i of rows 0–3 (z[0]) and 4–7 (z[1]); lanes 8–15: rows 8–11 (z[2]), 12–15 (z[3]). */
            const __m512i low = _mm512_setr_epi32(i, 4 + i, 8 + i, 12 + i, 16 + i, 20 + i, 24 + i, 28 + i, i, 4 + i,
                                                  8 + i, 12 + i, 16 + i, 20 + i, 24 + i, 28 + i);
            const __m512i a = _mm512_permutex2var_epi32(z[0], low, z[1]);
            const __m512i b = _mm512_permutex2var_epi32(z[2], low, z[3]);
            words[w0 + i] = _mm512_mask_blend_epi32((__mmask16)0xFF00, a, b);
        }
    }
}

/* The bf16 dot-product GEMV (gemv_bf16.h; the row cpu.qmm_t.gemv_bf16.r8.avx512bf16): AVX-512 BF16's vdpbf16ps
 * multiplies codes decoded to bf16 (4-bit, or 2/3/5/6-bit unpacked to bytes) by bf16 x, two products per f32 lane per
 * instruction. Only the functions marked BF16DP_TARGET contain BF16 instructions; the row's supports() checks the CPU
 * for them first (qmm_cpu_has_avx512bf16). A chunk is 64 codes (32 bytes at 4 bits, 64 as bytes): lane i of its
 * products holds codes 4i … 4i + 3. */
#define GEMV_BF16DP 1
#define BF16DP_TARGET __attribute__((target("avx512bf16")))
typedef __m512i vh; /* 32 bf16 values, two per f32 lane */
/* bf16(0) … bf16(15) in words 0–15 and again in 16–31: vpermw's table for a 4-bit code in index bits 0–3. */
static inline __m512i v_bf16_codes4(void) {
    return _mm512_set_epi16(0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100, 0x40E0, 0x40C0, 0x40A0,
                            0x4080, 0x4040, 0x4000, 0x3F80, 0, 0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110,
                            0x4100, 0x40E0, 0x40C0, 0x40A0, 0x4080, 0x4040, 0x4000, 0x3F80, 0);
}
/* A chunk's 64 codes as bf16: lo word j = code 2j (byte j's low nibble), hi word j = code 2j + 1 (its high nibble).
 * One zero-extension of the 32 bytes to words, then vpermw looks each word up in a table of bf16(0) … bf16(15); the
 * permute reads only index bits 0–4, so the table is written twice (bit 4 is the high nibble's lowest bit in the
 * low lookup) and needs no mask. half = 1: only the first 16 bytes exist (the last chunk of a row whose K is an odd
 * number of 32s); they are loaded masked and the other codes are 0. Exact: bf16 holds every integer up to 256. */
static inline void v_decode4_bf16(const uint8_t *bytes, int half, vh *lo, vh *hi) {
    const __m512i table = v_bf16_codes4();
    const __m256i b = half ? _mm256_maskz_loadu_epi8((__mmask32)0xFFFF, bytes) : _mm256_loadu_si256((const __m256i *)bytes);
    const __m512i words = _mm512_cvtepu8_epi16(b);
    *lo = _mm512_permutexvar_epi16(words, table);
    *hi = _mm512_permutexvar_epi16(_mm512_srli_epi16(words, 4), table);
}
/* bf16(0) … bf16(63): v_decode6_bf16's table, its two 32-word halves. */
static const uint16_t bf16_codes6[64] __attribute__((aligned(64))) = {
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150,
    0x4160, 0x4170, 0x4180, 0x4188, 0x4190, 0x4198, 0x41A0, 0x41A8, 0x41B0, 0x41B8, 0x41C0, 0x41C8, 0x41D0, 0x41D8,
    0x41E0, 0x41E8, 0x41F0, 0x41F8, 0x4200, 0x4204, 0x4208, 0x420C, 0x4210, 0x4214, 0x4218, 0x421C, 0x4220, 0x4224,
    0x4228, 0x422C, 0x4230, 0x4234, 0x4238, 0x423C, 0x4240, 0x4244, 0x4248, 0x424C, 0x4250, 0x4254, 0x4258, 0x425C,
    0x4260, 0x4264, 0x4268, 0x426C, 0x4270, 0x4274, 0x4278, 0x427C};
/* The same layout from 64 byte codes below 64 (2-, 3-, 5- and 6-bit rows unpacked to bytes by unpack_codes, one code a
 * byte): lo word j = code 2j, hi word j = code 2j + 1. The 64 bytes are 32 words, byte 2j the low half of word j;
 * vpermi2w looks each word up in the two halves of bf16_codes6 by its index bits 0–5 (bits 6–15 are ignored): the low
 * byte gives code 2j, the word shifted right by 8 code 2j + 1 — one shift and two permutes for 64 codes, no
 * zero-extension. half = 1: only the first 32 bytes exist (loaded masked; the other codes are 0). Exact (bf16 holds
 * every integer up to 256). */
static inline void v_decode6_bf16(const uint8_t *bytes, int half, vh *lo, vh *hi) {
    const __m512i low = _mm512_load_si512(bf16_codes6), high = _mm512_load_si512(bf16_codes6 + 32);
    const __m512i words = half ? _mm512_maskz_loadu_epi8((__mmask64)0xFFFFFFFFu, bytes) : _mm512_loadu_si512(bytes);
    *lo = _mm512_permutex2var_epi16(low, words, high);
    *hi = _mm512_permutex2var_epi16(low, _mm512_srli_epi16(words, 8), high);
}
static inline vh v_load_bf16(const uint16_t *p) { return _mm512_loadu_si512(p); }
/* 16 f32 values that are f16 values, as bf16 head (the upper 16 bits) and tail (x − head, exact with at most 3
 * significant bits, its upper 16 bits: exact too) into head[0 … 15] and tail[0 … 15]. ±inf: tail NaN (the non-finite
 * rule recomputes such outputs). */
static inline void v_split_bf16(vf x, uint16_t *head, uint16_t *tail) {
    const __m512i bits = _mm512_castps_si512(x), upper = _mm512_and_si512(bits, _mm512_set1_epi32((int)0xFFFF0000u));
    const __m512i rest = _mm512_castps_si512(_mm512_sub_ps(x, _mm512_castsi512_ps(upper)));
    _mm256_storeu_si256((__m256i *)head, _mm512_cvtepi32_epi16(_mm512_srli_epi32(upper, 16)));
    _mm256_storeu_si256((__m256i *)tail, _mm512_cvtepi32_epi16(_mm512_srli_epi32(rest, 16)));
}
/* acc + a·b over the pairs of bf16 in each f32 lane (vdpbf16ps: products exact, each added with round-to-nearest-even;
 * denormal inputs read as 0 and denormal results flushed to 0, whatever MXCSR says — gemv_bf16.h says why none occurs). */
static inline BF16DP_TARGET vf v_dpbf16(vf acc, vh a, vh b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
/* 64 bf16 values of x (a chunk, in order) → dst[0 … 31] = the even-indexed ones, dst[32 … 63] = the odd-indexed ones:
 * the pairs (x 4i, x 4i+2) and (x 4i+1, x 4i+3) that lane i of v_decode4_bf16's lo and hi meet. */
static inline void v_bf16_deinterleave(const uint16_t *src, uint16_t *dst) {
    const __m512i a = _mm512_loadu_si512(src), b = _mm512_loadu_si512(src + 32);
    const __m512i even = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24,
                                          22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));
    _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, even, b));
    _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(a, odd, b));
}
/* The tiled bf16 row's A operand: codes in natural order as bf16 pairs, lane i = bf16(code 2i) | bf16(code 2i + 1) << 16
 * — v_pairs4_bf16: 32 4-bit codes from 16 bytes (byte i holds codes 2i and 2i + 1: its two nibbles looked up as in
 * v_decode4_bf16, the dword's upper word 0, which the table maps to bf16 0); v_pairs8_bf16: 32 8-bit codes from 32
 * bytes (int → f32 is exact, and so is its upper half as bf16: a code < 256 has at most 8 significant bits). */
static inline vh v_pairs4_bf16(const uint8_t *bytes) {
    const __m512i table = v_bf16_codes4();
    const __m512i dwords = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
    const __m512i lo = _mm512_permutexvar_epi16(dwords, table);
    const __m512i hi = _mm512_permutexvar_epi16(_mm512_srli_epi32(dwords, 4), table);
    return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}
static inline vh v_pairs8_bf16(const uint8_t *bytes) {
    const __m512i a = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes))));
    const __m512i b =
        _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(bytes + 16)))));
    /* word j = the upper word of code j as f32 (codes 0–15 in a, 16–31 in b): word 2j + 1 of a, of b past 16 */
    const __m512i upper = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                                           25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(a, upper, b);
}
static inline vh v_broadcast_pair(const uint32_t *pair) { return _mm512_set1_epi32((int)*pair); }
static inline void v_store_pairs(uint32_t *p, vh v) { _mm512_storeu_si512(p, v); }
/* 16 pairs of bf16 (lanes of dwords) as f32: the low halves (the even elements) and the high halves (exact). */
static inline void v_pairs_to_f32(vh v, vf *low, vf *high) {
    *low = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *high = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* The scales of chunk c's lanes (lanes 0–7 hold codes 0–31 of the chunk, lanes 8–15 codes 32–63): s = the row's scales
 * in f32, zero-padded to whole vectors of groups. group_size is a constant where this is inlined. */
static inline vf v_chunk_scale_bf16(const float *s, size_t c, size_t group_size) {
    if (group_size == 128) return _mm512_set1_ps(s[c / 2]);
    if (group_size == 64) return _mm512_set1_ps(s[c]);
    return _mm512_insertf32x8(_mm512_set1_ps(s[2 * c]), _mm256_set1_ps(s[2 * c + 1]), 1);
}

/* vpermb's indices (qword k ← bytes k·b … k·b + 7) and vpmultishiftqb's controls (byte i of a qword ← its bits
 * i·b … i·b + 7) for b = 2, 3, 5, 6 (rows 0–3). */
#define UNPACK_TAKE8(k, b) (k) * (b), (k) * (b) + 1, (k) * (b) + 2, (k) * (b) + 3, (k) * (b) + 4, (k) * (b) + 5, \
                           (k) * (b) + 6, (k) * (b) + 7
#define UNPACK_TAKE(b)                                                                                            \
    {UNPACK_TAKE8(0, b), UNPACK_TAKE8(1, b), UNPACK_TAKE8(2, b), UNPACK_TAKE8(3, b),                              \
     UNPACK_TAKE8(4, b), UNPACK_TAKE8(5, b), UNPACK_TAKE8(6, b), UNPACK_TAKE8(7, b)}
#define UNPACK_SHIFT8(b) 0, (b), 2 * (b), 3 * (b), 4 * (b), 5 * (b), 6 * (b), 7 * (b)
#define UNPACK_SHIFT(b)                                                                                           \
    {UNPACK_SHIFT8(b), UNPACK_SHIFT8(b), UNPACK_SHIFT8(b), UNPACK_SHIFT8(b),                                      \
     UNPACK_SHIFT8(b), UNPACK_SHIFT8(b), UNPACK_SHIFT8(b), UNPACK_SHIFT8(b)}
static const uint8_t unpack_take[4][64] = {UNPACK_TAKE(2), UNPACK_TAKE(3), UNPACK_TAKE(5), UNPACK_TAKE(6)};
static const uint8_t unpack_shift[4][64] = {UNPACK_SHIFT(2), UNPACK_SHIFT(3), UNPACK_SHIFT(5), UNPACK_SHIFT(6)};

__attribute__((target("avx512vbmi"))) static size_t unpack_codes_vbmi(const uint8_t *stream, size_t count, int bits,
                                                                     uint8_t *codes) {
    const size_t chunk_bytes = 8 * (size_t)bits; /* 64 codes */
    const __mmask64 load = _cvtu64_mask64((1ull << chunk_bytes) - 1u); /* bits ≤ 6: at most 48 bytes */
    const int row = bits == 2 ? 0 : bits == 3 ? 1 : bits == 5 ? 2 : 3;
    const __m512i take_v = _mm512_loadu_si512(unpack_take[row]), shift_v = _mm512_loadu_si512(unpack_shift[row]);
    const __m512i mask = _mm512_set1_epi8((char)((1u << bits) - 1u));
    size_t j = 0;
    for (; j + 64 <= count; j += 64) {
        const __m512i bytes = _mm512_maskz_loadu_epi8(load, stream + (j / 8) * (size_t)bits);
        const __m512i fields = _mm512_multishift_epi64_epi8(shift_v, _mm512_permutexvar_epi8(take_v, bytes));
        _mm512_storeu_si512(codes + j, _mm512_and_si512(fields, mask));
    }
    return j;
}

/* 2/3/5/6-bit codes to bytes (unpack.h): 64 at a time by vpermb + vpmultishiftqb where the CPU has AVX512_VBMI, the
 * rest (or all, without VBMI) by pdep where it is one instruction, else the scalar stream reader. */
static void unpack_codes(const uint32_t *in, size_t count, int bits, uint8_t *codes) {
    const bool vbmi = unpack_width(bits) && qmm_cpu_features_get()->avx512vbmi;
    unpack_codes_rest(in, vbmi ? unpack_codes_vbmi((const uint8_t *)in, count, bits, codes) : 0, count, bits, codes);
}

#include "simd_kernels.h"
