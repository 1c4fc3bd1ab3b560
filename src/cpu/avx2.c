/*
 * avx2.c — the CPU kernels for AVX2 + FMA + F16C (8 f32 lanes, 16 YMM registers). Built with
 * -mavx2 -mfma -mf16c and nothing else (CMakeLists.txt): run only after qmm_cpu_has_avx2().
 * This file defines the vector vocabulary of simd_kernels.h for 256-bit registers; the algorithms
 * are there.
 */
#include "cpu.h"
#include "unpack.h"

#include <immintrin.h>

#define QMM_ISA(name) name##_avx2
#define LANES 8
/* GEMV: up to 8 rows of x per pass and 4 weight rows per block; at most 8 accumulators of the 16
 * YMM registers, the rest the scales, the decoded codes and x. GEMV_PF: prefetch distance in bytes
 * per weight row (avx512.c says why). */
#define GEMV_R_MAX 8
#define GEMV_RW 4
#define GEMV_PF 1024
/* Vector registers, for the GEMV blocks' register budget (gemv_block.h). */
#define GEMV_VREGS 16
/* Tiled: 6 broadcast rows × 2 vectors = 12 accumulators of 16 YMM. */
#define GEMM_R 6
typedef __m256 vf;

static inline vf v_zero(void) { return _mm256_setzero_ps(); }
static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf v_set1(float v) { return _mm256_set1_ps(v); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }

/* Tree sum: (4 + 4), (2 + 2), (1 + 1): three roundings deep. */
static inline float v_hsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* f16 → f32 with F16C (exact); bf16 → f32 is the 16 bits shifted into the high half (exact). */
static inline vf v_load_dtype(const void *array, qmm_dtype dtype, size_t i) {
    switch (dtype) {
    case QMM_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)array + i)));
    case QMM_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)array + i))), 16));
    default: return _mm256_loadu_ps((const float *)array + i);
    }
}

/* The first count (< LANES) elements i… of an f32/f16/bf16 array as f32, the other lanes 0; nothing past element
 * i + count − 1 is read (f32: a masked load; f16/bf16, which AVX2 cannot mask: copied into a zeroed vector). */
static inline vf v_load_dtype_partial(const void *array, qmm_dtype dtype, size_t i, int count) {
    if (dtype == QMM_F16 || dtype == QMM_BF16) {
        uint16_t padded[LANES] = {0};
        for (int j = 0; j < count; j++) padded[j] = ((const uint16_t *)array)[i + (size_t)j];
        return v_load_dtype(padded, dtype, 0);
    }
    return _mm256_maskload_ps((const float *)array + i,
                              _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* 16 codes from 8 bytes: zero-extend each byte to a lane (vpmovzxbd), low nibbles = even codes,
 * high nibbles = odd codes; int → f32 is exact (codes < 256). */
static inline void v_decode4(const uint8_t *bytes, vf *lo, vf *hi) {
    uint64_t eight;
    memcpy(&eight, bytes, sizeof eight);
    const __m256i lanes = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)eight));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(lanes, _mm256_set1_epi32(0xF)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(lanes, 4));
}

/* AVX2 has no 16-entry permute of one register: the "table" is s itself and the codes are converted,
 * then multiplied: the same s·q, rounded once, as AVX-512's table lookup. */
static inline vf v_scale_table(vf s) { return s; }

static inline void v_decode4_scaled(const uint8_t *bytes, vf s, vf *lo, vf *hi) {
    vf q_lo, q_hi;
    v_decode4(bytes, &q_lo, &q_hi);
    *lo = _mm256_mul_ps(q_lo, s);
    *hi = _mm256_mul_ps(q_hi, s);
}

/* qmm_n's direct form: fma(s, q, b) on the converted codes (AVX-512 looks the same values up). */
static inline vf v_affine_table(vf s, vf b) {
    (void)b;
    return s;
}

static inline void v_decode4_affine(const uint8_t *bytes, vf table, vf s, vf b, vf *lo, vf *hi) {
    vf q_lo, q_hi;
    (void)table;
    v_decode4(bytes, &q_lo, &q_hi);
    *lo = _mm256_fmadd_ps(s, q_lo, b);
    *hi = _mm256_fmadd_ps(s, q_hi, b);
}

static inline vf v_decode8(const uint8_t *bytes) {
    uint64_t eight;
    memcpy(&eight, bytes, sizeof eight);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)eight)));
}

/* [a0..a7], [b0..b7] → [a0 a2 a4 a6 b0 b2 b4 b6], [a1 a3 ... b7]: shufps within 128-bit halves, then
 * a 64-bit lane permute puts the halves in order. */
static inline void v_deinterleave(const vf *pair, vf *even, vf *odd) {
    const __m256 e = _mm256_shuffle_ps(pair[0], pair[1], _MM_SHUFFLE(2, 0, 2, 0));
    const __m256 o = _mm256_shuffle_ps(pair[0], pair[1], _MM_SHUFFLE(3, 1, 3, 1));
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* The ordered GEMV's code words (simd_kernels.h). */
typedef __m256i vi;
/* (words >> shift) & mask as f32 (exact: a code is < 256). */
static inline vf v_code_field(vi words, int shift, int mask) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words, shift), _mm256_set1_epi32(mask)));
}
/* A 4-bit code field as f32 (AVX-512 looks it up in a table instead). */
static inline vf v_code4_field(vi words, int shift) { return v_code_field(words, shift, 0xF); }
/* count words from word `first` of LANES = 8 rows into count vectors (words[i] lane r = rows[r][first + i]):
 * one gather each (AVX-512 transposes loads instead). */
static inline void v_load_words(const uint32_t *const *rows, size_t first, int count, vi *words) {
    const __m256i index = _mm256_setr_epi32(0, (int)(rows[1] - rows[0]), (int)(rows[2] - rows[0]), (int)(rows[3] - rows[0]),
                                            (int)(rows[4] - rows[0]), (int)(rows[5] - rows[0]), (int)(rows[6] - rows[0]),
                                            (int)(rows[7] - rows[0]));
    for (int i = 0; i < count; i++) words[i] = _mm256_i32gather_epi32((const int *)(rows[0] + first + (size_t)i), index, 4);
}

/* The nibble-plane decode of the M ≤ 2 GEMV (gemv_planes.h): a chunk is 8·LANES = 64 codes = 32 bytes = 8 dwords;
 * code 8i + j of the chunk is nibble j of dword i. */
#define GEMV_PLANES 1
static inline vi v_load_chunk(const uint8_t *bytes) { return _mm256_loadu_si256((const __m256i *)bytes); }
/* The first `words` (< 8) dwords of a chunk, the rest 0; reads nothing past them. */
static inline vi v_load_chunk_partial(const uint8_t *bytes, int words) {
    return _mm256_maskload_epi32((const int *)bytes, _mm256_cmpgt_epi32(_mm256_set1_epi32(words), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}
/* Nibble j of every dword as f32: j < 7 masked in place, (v & 0xF << 4j) = q·16^j, exact in f32 (4 significant
 * bits, < 2^28 < 2^31: the signed conversion is right); j = 7 shifted down (q·2^28 would not fit a signed int).
 * One integer op and one conversion, no shuffle; x carries the 16^-j (gemv_prepare_x_planes). */
static inline vf v_nibble(vi v, int j) {
    return _mm256_cvtepi32_ps(j == 7 ? _mm256_srli_epi32(v, 28) : _mm256_and_si256(v, _mm256_set1_epi32((int)(0xFu << (4 * j)))));
}
/* The scales of chunk c's lanes: lane i holds codes 8i … 8i + 7, i.e. group (64c + 8i)/G of the row (s = the row's
 * scales in f32, zero-padded to whole vectors of groups). group_size is a constant where this is inlined. */
static inline vf v_chunk_scale(const float *s, size_t c, size_t group_size) {
    if (group_size == 128) return _mm256_set1_ps(s[c / 2]);
    if (group_size == 64) return _mm256_set1_ps(s[c]);
    return _mm256_insertf128_ps(_mm256_set1_ps(s[2 * c]), _mm_set1_ps(s[2 * c + 1]), 1);
}
/* The 8 planes of a chunk of x: lane i of plane[j] = src[8i + j] (an 8 × 8 transpose: 24 shuffles, where 8 gathers
 * would load every element on its own). */
static inline void v_planes_of_chunk(const float *src, vf plane[8]) {
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + 8 * i);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* r_i0 r_(i+1)0 r_i1 r_(i+1)1 | the same for elements 4, 5 */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* elements 2, 3 | 6, 7 */
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; h++) {
            u[i + 2 * h] = _mm256_shuffle_ps(t[i + h], t[i + 2 + h], _MM_SHUFFLE(1, 0, 1, 0));
            u[i + 2 * h + 1] = _mm256_shuffle_ps(t[i + h], t[i + 2 + h], _MM_SHUFFLE(3, 2, 3, 2));
        }
    /* u[0..3]: rows 0–3 of elements 0, 1, 2, 3 (low half) and 4, 5, 6, 7 (high half); u[4..7] rows 4–7. */
    for (int j = 0; j < 4; j++) {
        plane[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        plane[j + 4] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}
/* Every lane of a equals (==, so NaN never does) the same lane of b. */
static inline int v_same(vf a, vf b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)) == 0xFF; }

/* 2/3/5/6-bit codes to bytes: pdep where it is one instruction, else the scalar stream reader (unpack.h). */
static void unpack_codes(const uint32_t *in, size_t count, int bits, uint8_t *codes) {
    unpack_codes_rest(in, 0, count, bits, codes);
}

#include "simd_kernels.h"
