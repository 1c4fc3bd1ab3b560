/*
 * dtype.c — element types and exact f16/bf16 <-> f32 conversion.
 *
 * Narrowing is round-to-nearest, ties to even, on the bit patterns (no FPU mode dependence); NaN stays a
 * quiet NaN with its sign; subnormal results are produced exactly; overflow gives ±Inf. Widening is exact.
 * Source: IEEE 754-2019 §4.3.1 (roundTiesToEven); bfloat16 = the top 16 bits of binary32.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    const char *alias;
    size_t size;
} dtype_table[QMM_DTYPE_COUNT] = {
    [QMM_F32] = {"f32", "float32", 4},  [QMM_F16] = {"f16", "float16", 2}, [QMM_BF16] = {"bf16", "bfloat16", 2},
    [QMM_F64] = {"f64", "float64", 8},  [QMM_U8] = {"u8", "uint8", 1},     [QMM_I8] = {"i8", "int8", 1},
    [QMM_U16] = {"u16", "uint16", 2},   [QMM_I16] = {"i16", "int16", 2},   [QMM_U32] = {"u32", "uint32", 4},
    [QMM_I32] = {"i32", "int32", 4},    [QMM_U64] = {"u64", "uint64", 8},  [QMM_I64] = {"i64", "int64", 8},
    [QMM_BOOL] = {"bool", "bool", 1},
};

size_t qmm_dtype_size(qmm_dtype dtype) {
    return (unsigned)dtype < QMM_DTYPE_COUNT ? dtype_table[dtype].size : 0;
}

const char *qmm_dtype_name(qmm_dtype dtype) {
    return (unsigned)dtype < QMM_DTYPE_COUNT ? dtype_table[dtype].name : "?";
}

qmm_status qmm_dtype_parse(const char *name, qmm_dtype *dtype) {
    if (!name || !dtype) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_dtype_parse: null argument");
    for (int i = 0; i < QMM_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0 || strcmp(name, dtype_table[i].alias) == 0) {
            *dtype = (qmm_dtype)i;
            return QMM_OK;
        }
    }
    char shown[QMM_PRINTABLE_SIZE]; /* the caller's bytes, escaped (qmm_printable) */
    return qmm_error(QMM_ERR_INVALID_ARGUMENT, "unknown dtype \"%s\" (known: f32, f16, bf16, f64, u8, i8, u16, i16, u32, "
                     "i32, u64, i64, bool, or their long names float32, float16, bfloat16, float64, uint8, …)",
                     qmm_printable(name, strlen(name), shown, sizeof shown));
}

static uint32_t f32_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static float f32_from_bits(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

uint16_t qmm_f32_to_f16(float value) {
    uint32_t x = f32_bits(value);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exponent = (x >> 23) & 0xFFu;
    uint32_t mantissa = x & 0x7FFFFFu;
    if (exponent == 0xFFu) { /* Inf or NaN: keep NaN-ness (quiet bit set), keep the top payload bits */
        if (mantissa == 0) return sign | 0x7C00u;
        return (uint16_t)(sign | 0x7E00u | (mantissa >> 13));
    }
    int e = (int)exponent - 127 + 15; /* f16 biased exponent */
    if (e >= 31) return sign | 0x7C00u; /* overflow (rounding cannot bring it back) */
    if (e <= 0) {                       /* subnormal f16 or zero */
        if (e < -10) return sign;       /* below half the smallest subnormal: rounds to ±0 */
        uint32_t m = mantissa | 0x800000u; /* implicit 1 */
        unsigned shift = (unsigned)(14 - e); /* 13 mantissa bits + (1 - e) */
        uint32_t half = m >> shift;
        uint32_t rest = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rest > halfway || (rest == halfway && (half & 1u))) half++;
        return (uint16_t)(sign | half); /* a carry into bit 10 yields the smallest normal, correctly */
    }
    uint32_t half = ((uint32_t)e << 10) | (mantissa >> 13);
    uint32_t rest = mantissa & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) half++; /* carry may round up to Inf: correct */
    return (uint16_t)(sign | half);
}

float qmm_f16_to_f32(uint16_t bits) {
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1Fu;
    uint32_t mantissa = bits & 0x3FFu;
    if (exponent == 0x1Fu) return f32_from_bits(sign | 0x7F800000u | (mantissa << 13));
    if (exponent == 0) {
        if (mantissa == 0) return f32_from_bits(sign);
        /* subnormal: mantissa · 2^-24, exact in f32 */
        int shift = 0;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            shift++;
        }
        mantissa &= 0x3FFu;
        return f32_from_bits(sign | ((uint32_t)(127 - 15 + 1 - shift) << 23) | (mantissa << 13));
    }
    return f32_from_bits(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

uint16_t qmm_f32_to_bf16(float value) {
    uint32_t x = f32_bits(value);
    if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu)) /* NaN: quiet, sign kept */
        return (uint16_t)((x >> 16) | 0x0040u);
    uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u); /* ties to even; overflow carries into Inf */
    return (uint16_t)((x + rounding) >> 16);
}

float qmm_bf16_to_f32(uint16_t bits) { return f32_from_bits((uint32_t)bits << 16); }

qmm_status qmm_convert(const void *src, qmm_dtype src_dtype, void *dst, qmm_dtype dst_dtype, size_t count) {
    if (!qmm_is_float_dtype(src_dtype) || !qmm_is_float_dtype(dst_dtype))
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_convert: dtypes %s -> %s; only f32, f16, bf16 convert",
                         qmm_dtype_name(src_dtype), qmm_dtype_name(dst_dtype));
    if (count == 0) return QMM_OK;
    if (!src || !dst) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_convert: null %s", src ? "dst" : "src");
    size_t bytes, src_bytes; /* both arrays' byte counts: the wider one overflows first */
    if (!qmm_mul_size(count, qmm_dtype_size(dst_dtype), &bytes) ||
        !qmm_mul_size(count, qmm_dtype_size(src_dtype), &src_bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "qmm_convert: count=%zu elements of %s overflow a byte count", count,
                         qmm_dtype_size(src_dtype) > qmm_dtype_size(dst_dtype) ? qmm_dtype_name(src_dtype)
                                                                              : qmm_dtype_name(dst_dtype));
    if (src_dtype == dst_dtype) {
        memmove(dst, src, bytes);
        return QMM_OK;
    }
    /* Overlapping arrays (in place, or shifted): element by element is right where every write lands on source
     * bytes already read — forward when dst starts at or before src and its elements are no wider (narrowing in
     * place), backward when dst starts at or after src and its elements are no narrower (widening in place).
     * Any other overlap reads a copy of the source. */
    const size_t src_size = qmm_dtype_size(src_dtype), dst_size = qmm_dtype_size(dst_dtype);
    const bool overlap = qmm_overlap(src, src_bytes, dst, bytes);
    const bool forward = !overlap || ((uintptr_t)dst <= (uintptr_t)src && dst_size <= src_size);
    const bool backward = !forward && (uintptr_t)dst >= (uintptr_t)src && dst_size >= src_size;
    void *copy = NULL;
    if (!forward && !backward) {
        qmm_status status = qmm_copy_if_overlapping("qmm_convert", "the source", src, src_bytes, dst, bytes, &copy);
        if (status != QMM_OK) return status;
        src = copy;
    }
    if (backward) {
        for (size_t i = count; i-- > 0;) qmm_store_f32(dst, dst_dtype, i, qmm_load_f32(src, src_dtype, i));
    } else {
        for (size_t i = 0; i < count; i++) qmm_store_f32(dst, dst_dtype, i, qmm_load_f32(src, src_dtype, i));
    }
    free(copy);
    return QMM_OK;
}
