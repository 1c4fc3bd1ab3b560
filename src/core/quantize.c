/*
 * quantize.c — affine quantization and dequantization, bit for bit as MLX does them (DESIGN.md §1).
 *
 * Quantize, per group of group_size values v (converted exactly to f32), all arithmetic in IEEE f32:
 *     s0 = max((max − min) / (2^bits − 1), 1e-7)
 *     if |min| > |max|: s = s0, e = min   else: s = −s0, e = max        (so scales are negative ~half the time)
 *     q0 = round(e / s); if q0 ≠ 0: s = e / q0, b = e   else: b = 0     (the edge lands exactly on code q0)
 *     q  = clamp(round((v − b) / s), 0, 2^bits − 1)                      (with the f32 s and b)
 * and s, b are stored rounded once (round to nearest, ties to even) to the weight dtype.
 * Two conventions (qmm_convention):
 *   CPU — mlx/backend/cpu/quantized.cpp quantize(): min/max start at ±inf, round = rint (ties to even).
 *   GPU — mlx/backend/metal/kernels/quantized.h affine_quantize: the running max starts at 0 and the running
 *         min at the dtype's largest finite value (so an all-negative group uses [min, 0]; an all-positive
 *         one still uses [min, max]), round = Metal round() (half away from zero), and the code is only
 *         clamped from above — it cannot be negative, because (v − b) has the sign of s for every v in the
 *         group, so the lower clamp below is a no-op there.
 * The CPU convention was checked against mx.quantize of mlx 0.32.4 for f32/f16/bf16, every bits and
 * group size. The GPU convention cannot run on Linux; it follows the Metal source line by line. MLX builds its
 * Metal kernels with -fno-fast-math (mlx/backend/metal/kernels/CMakeLists.txt); we take Metal's precise
 * division to be correctly rounded, i.e. the same as IEEE f32 division here.
 *
 * Dequantize, bit for bit as mx.dequantize on the CPU (mlx 0.32.4 computes it as two array ops, a multiply
 * then an add, each rounded to the scales' dtype T):
 *     ŵ = round_T( round_T(s · q) + b )
 * For f32 this is two f32 roundings — never a fused multiply-add (which would round once and differ in
 * about one element in twenty); for f16/bf16 s·q is exact in f32 (11 + 8 significant bits), rounded to T,
 * then the sum is formed in f32 and rounded to T (f32's 24 bits are at least 2p + 2 for a p-bit T, so that
 * double rounding equals a correctly rounded T addition). Checked against mx.dequantize for every dtype.
 * CMakeLists.txt builds this file with -ffp-contract=off, so no compiler fuses s·q + b into an FMA (GCC
 * contracts across statements by default in GNU mode, and on aarch64 or under -march flags with FMA it would).
 */

#include "internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The largest group (group_size ≤ 128): per-group scratch lives on the stack. */
enum { MAX_GROUP_SIZE = 128 };

/* The largest finite value of each weight dtype, as f32 — the GPU convention's starting running min
 * (Metal Limits<T>::max). bf16 0x7F7F = (2 − 2^-7)·2^127. */
static float dtype_max_finite(qmm_dtype dtype) {
    switch (dtype) {
    case QMM_F16: return 65504.0f;
    case QMM_BF16: return qmm_bf16_to_f32(0x7F7Fu);
    default: return FLT_MAX;
    }
}

/* Whether element i of a float array is NaN or ±Inf, from its bits (no FPU involvement). */
static bool element_nonfinite(const void *array, qmm_dtype dtype, size_t i) {
    switch (dtype) {
    case QMM_F16:
    case QMM_BF16: {
        uint16_t bits; /* memcpy: the array may be misaligned (a safetensors view, see qmm_load_f32) */
        memcpy(&bits, (const unsigned char *)array + i * sizeof bits, sizeof bits);
        return (bits & (dtype == QMM_F16 ? 0x7C00u : 0x7F80u)) == (dtype == QMM_F16 ? 0x7C00u : 0x7F80u);
    }
    default: {
        uint32_t bits;
        memcpy(&bits, (const unsigned char *)array + i * sizeof bits, sizeof bits);
        return (bits & 0x7F800000u) == 0x7F800000u;
    }
    }
}

/* One group: values[n] (f32) -> codes[n], *scale, *bias (f32, before rounding to the dtype). The comparisons
 * mirror std::min/std::max (CPU) and Metal min/max (GPU); they agree on the finite inputs allowed here. */
static void quantize_group(const float *values, int n, int bits, qmm_convention convention, float gpu_min_start,
                           uint8_t *codes, float *scale_out, float *bias_out) {
    const float n_bins = (float)((1 << bits) - 1);
    const float eps = (float)1e-7; /* MLX: `float eps = 1e-7;` — the double literal converted to f32 */
    const bool gpu = convention == QMM_CONVENTION_GPU;

    float w_min = gpu ? gpu_min_start : INFINITY;
    float w_max = gpu ? 0.0f : -INFINITY;
    for (int i = 0; i < n; i++) {
        float v = values[i];
        if (w_max < v) w_max = v;
        if (v < w_min) w_min = v;
    }

    float scale = (w_max - w_min) / n_bins;
    if (scale < eps) scale = eps; /* a constant group would otherwise get scale 0 */
    bool min_side = fabsf(w_min) > fabsf(w_max);
    if (!min_side) scale = -scale;
    float edge = min_side ? w_min : w_max;

    /* CPU: std::rint under the default rounding mode (ties to even; qmm never changes the mode).
     * GPU: Metal round(), half away from zero = C roundf. */
    float q0 = gpu ? roundf(edge / scale) : rintf(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
    }

    for (int i = 0; i < n; i++) {
        float x = (values[i] - bias) / scale;
        float q = gpu ? roundf(x) : rintf(x);
        /* !(q >= 0) also catches NaN: a constant group whose |value| is beyond FLT_MAX·1e-7 (f32 or bf16
         * weights above ~3.4e31) has edge/s0 overflow to ±Inf, so q0 = ±Inf, s = edge/q0 = ±0 and
         * x = 0/0. MLX's (uint8_t) cast of that NaN is undefined behaviour that gives 0 on x86; code 0 is
         * also the exact answer (ŵ = 0·q + b = b = the group's value), so it is stored without the cast. */
        if (!(q >= 0.0f)) q = 0.0f;
        if (q > n_bins) q = n_bins;
        codes[i] = (uint8_t)q;
    }
    *scale_out = scale;
    *bias_out = bias;
}

static qmm_status quantize_rows(const void *w, qmm_dtype dtype, size_t rows, size_t cols, int bits, int group_size,
                                qmm_convention convention, uint32_t *out_w, void *out_scales, void *out_biases);

qmm_status qmm_quantize(const void *w, qmm_dtype dtype, size_t rows, size_t cols, int bits, int group_size,
                        qmm_convention convention, uint32_t *out_w, void *out_scales, void *out_biases) {
    /* The outputs form a qmm_qmatrix in the weight dtype: its sizing is the shape, format, dtype and
     * overflow check of this call too (it also covers rows·cols of the input). */
    const qmm_qmatrix out = {out_w, out_scales, out_biases, dtype, rows, cols, bits, group_size};
    size_t w_bytes, group_bytes;
    qmm_status status = qmm_qmatrix_bytes(&out, &w_bytes, &group_bytes);
    if (status != QMM_OK) return status;
    if (convention != QMM_CONVENTION_CPU && convention != QMM_CONVENTION_GPU)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_quantize: convention=%d is not one of CPU (0), GPU (1)",
                         (int)convention);
    if (!w || !out_w || !out_scales || !out_biases)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_quantize: %s is NULL",
                         !w ? "w" : !out_w ? "out_w" : !out_scales ? "out_scales" : "out_biases");
    if ((status = qmm_check_u32_aligned("qmm_quantize", "out_w", out_w)) != QMM_OK) return status;
    /* outputs that share bytes cannot all hold their values */
    if (qmm_overlap(out_w, w_bytes, out_scales, group_bytes) || qmm_overlap(out_w, w_bytes, out_biases, group_bytes) ||
        qmm_overlap(out_scales, group_bytes, out_biases, group_bytes))
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_quantize: out_w (%zu bytes), out_scales and out_biases (%zu each) "
                         "overlap; they must be separate arrays", w_bytes, group_bytes);
    const size_t count = rows * cols; /* fits: checked by the validation */

    /* NaN/Inf anywhere is an error; checked before anything is written, so a failed call leaves the outputs
     * untouched. MLX would silently produce NaN scales (or all-zero codes with an Inf scale). */
    for (size_t i = 0; i < count; i++) {
        if (element_nonfinite(w, dtype, i))
            return qmm_error(QMM_ERR_NUMERIC, "qmm_quantize: w[row %zu, column %zu] = %g; quantization needs finite values",
                             i / cols, i % cols, (double)qmm_load_f32(w, dtype, i));
    }

    /* w overlapping an output (in place): read from a copy */
    const size_t in_bytes = count * qmm_dtype_size(dtype); /* ≤ the f32 bytes the validation sized */
    const void *outputs[3] = {out_w, out_scales, out_biases};
    const size_t output_bytes[3] = {w_bytes, group_bytes, group_bytes};
    void *copy = NULL;
    for (int k = 0; k < 3 && !copy; k++)
        if ((status = qmm_copy_if_overlapping("qmm_quantize", "w", w, in_bytes, outputs[k], output_bytes[k], &copy)) !=
            QMM_OK)
            return status;
    if (copy) w = copy;
    status = quantize_rows(w, dtype, rows, cols, bits, group_size, convention, out_w, out_scales, out_biases);
    free(copy);
    return status;
}

/* qmm_quantize's work on a w that overlaps no output. */
static qmm_status quantize_rows(const void *w, qmm_dtype dtype, size_t rows, size_t cols, int bits, int group_size,
                                qmm_convention convention, uint32_t *out_w, void *out_scales, void *out_biases) {
    const size_t words_per_row = qmm_packed_words(cols, bits);
    const size_t groups_per_row = qmm_groups(cols, group_size);
    const size_t words_per_group = qmm_packed_words((size_t)group_size, bits);
    const float gpu_min_start = dtype_max_finite(dtype);
    float values[MAX_GROUP_SIZE];
    uint8_t codes[MAX_GROUP_SIZE];

    for (size_t r = 0; r < rows; r++) {
        for (size_t g = 0; g < groups_per_row; g++) {
            size_t first = r * cols + g * (size_t)group_size;
            for (int i = 0; i < group_size; i++) values[i] = qmm_load_f32(w, dtype, first + (size_t)i);
            float scale, bias;
            quantize_group(values, group_size, bits, convention, gpu_min_start, codes, &scale, &bias);
            /* Only a range max − min beyond FLT_MAX (f32 or bf16 weights near ±3.4e38) gets here; MLX would
             * store an Inf scale and all-zero codes. Outputs of earlier groups are already written then. */
            if (!isfinite(scale))
                return qmm_error(QMM_ERR_NUMERIC,
                                 "qmm_quantize: row %zu, columns %zu..%zu: max - min overflows f32, so the scale is not finite",
                                 r, g * (size_t)group_size, (g + 1) * (size_t)group_size - 1);
            qmm_pack_stream(codes, (size_t)group_size, bits, out_w + r * words_per_row + g * words_per_group);
            qmm_store_f32(out_scales, dtype, r * groups_per_row + g, scale);
            qmm_store_f32(out_biases, dtype, r * groups_per_row + g, bias);
        }
    }
    return QMM_OK;
}

/* ŵ for code q with scale s and bias b of dtype (both given exactly as f32), as an f32 that is exactly a value
 * of dtype: round_T(round_T(s·q) + b). */
static float dequantize_value(float s, float b, unsigned q, qmm_dtype dtype) {
    float product = s * (float)q;
    switch (dtype) {
    case QMM_F16: {
        float p = qmm_f16_to_f32(qmm_f32_to_f16(product));
        return qmm_f16_to_f32(qmm_f32_to_f16(p + b));
    }
    case QMM_BF16: {
        float p = qmm_bf16_to_f32(qmm_f32_to_bf16(product));
        return qmm_bf16_to_f32(qmm_f32_to_bf16(p + b));
    }
    default: return product + b; /* two f32 roundings; FP contraction is off in this file */
    }
}

static void dequantize_rows(const qmm_qmatrix *matrix, void *out, qmm_dtype out_dtype);

qmm_status qmm_dequantize(const qmm_qmatrix *matrix, void *out, qmm_dtype out_dtype) {
    qmm_status status = qmm_qmatrix_validate(matrix);
    if (status != QMM_OK) return status;
    if (!qmm_is_float_dtype(out_dtype))
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_dequantize: out dtype %s (%d) is not supported (allowed: f32, f16, bf16)",
                         qmm_dtype_name(out_dtype), (int)out_dtype);
    if (!out) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_dequantize: out is NULL");
    size_t w_bytes, group_bytes;
    if ((status = qmm_qmatrix_bytes(matrix, &w_bytes, &group_bytes)) != QMM_OK) return status;
    /* fits: qmm_qmatrix_bytes sized the matrix in f32 */
    const size_t out_bytes = matrix->rows * matrix->cols * qmm_dtype_size(out_dtype);
    /* out overlapping an input (in place): that input is read from a copy */
    qmm_qmatrix m = *matrix;
    void *w_copy = NULL, *scales_copy = NULL, *biases_copy = NULL;
    if ((status = qmm_copy_if_overlapping("qmm_dequantize", "w", m.w, w_bytes, out, out_bytes, &w_copy)) == QMM_OK &&
        (status = qmm_copy_if_overlapping("qmm_dequantize", "scales", m.scales, group_bytes, out, out_bytes,
                                          &scales_copy)) == QMM_OK &&
        (status = qmm_copy_if_overlapping("qmm_dequantize", "biases", m.biases, group_bytes, out, out_bytes,
                                          &biases_copy)) == QMM_OK) {
        if (w_copy) m.w = w_copy;
        if (scales_copy) m.scales = scales_copy;
        if (biases_copy) m.biases = biases_copy;
        dequantize_rows(&m, out, out_dtype);
    }
    free(w_copy), free(scales_copy), free(biases_copy);
    return status;
}

/* qmm_dequantize's work on arrays that do not overlap out. */
static void dequantize_rows(const qmm_qmatrix *matrix, void *out, qmm_dtype out_dtype) {
    const qmm_dtype dtype = matrix->dtype;
    const int bits = matrix->bits;
    const int group_size = matrix->group_size;
    const size_t cols = matrix->cols;
    const size_t words_per_row = qmm_packed_words(cols, bits);
    const size_t groups_per_row = qmm_groups(cols, group_size);
    const size_t words_per_group = qmm_packed_words((size_t)group_size, bits);
    const unsigned levels = 1u << bits;
    /* When a group has at least as many values as there are codes, decode the 2^bits possible values once per
     * group and look them up (the f16/bf16 roundings are the expensive part); otherwise decode each value. */
    const bool use_table = levels <= (unsigned)group_size;
    float table[256];
    uint8_t codes[MAX_GROUP_SIZE];

    for (size_t r = 0; r < matrix->rows; r++) {
        for (size_t g = 0; g < groups_per_row; g++) {
            size_t group_index = r * groups_per_row + g;
            float s = qmm_load_f32(matrix->scales, dtype, group_index);
            float b = qmm_load_f32(matrix->biases, dtype, group_index);
            qmm_unpack_stream(matrix->w + r * words_per_row + g * words_per_group, (size_t)group_size, bits, codes);
            size_t first = r * cols + g * (size_t)group_size;
            if (use_table) {
                for (unsigned q = 0; q < levels; q++) table[q] = dequantize_value(s, b, q, dtype);
                for (int i = 0; i < group_size; i++) qmm_store_f32(out, out_dtype, first + (size_t)i, table[codes[i]]);
            } else {
                for (int i = 0; i < group_size; i++)
                    qmm_store_f32(out, out_dtype, first + (size_t)i, dequantize_value(s, b, codes[i], dtype));
            }
        }
    }
}
