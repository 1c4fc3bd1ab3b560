/*
 * test_quantize.c — qmm_quantize / qmm_dequantize (src/core/quantize.c, DESIGN.md §1).
 *
 *  - random data, every bits × group_size × dtype × convention: quantize → dequantize stays within the step
 *    (|ŵ − w| ≤ |s|/2, or ≤ |s| for a code clipped at the far end — see bound_holds), every scale follows
 *    MLX's sign rule, and f16/bf16 inputs quantize exactly as their f32 values do (arithmetic is f32);
 *  - determinism; the fraction of negative scales on symmetric data;
 *  - hand-worked groups for both conventions (exact ramp, ties, all-negative, constant, zero, clipping);
 *  - qmm_dequantize against the formula ŵ = round_T(round_T(s·q) + b) for every dtype and out dtype, and a
 *    case where a fused multiply-add would give a different answer;
 *  - NaN/Inf and every bad argument, with the exact status and a message;
 *  - a constant group too large for the 1e-7 scale floor (0/0 inside the quantizer), arrays at odd addresses, and
 *    arrays that overlap (in place).
 * The hand-worked CPU cases were confirmed with mx.quantize / mx.dequantize (mlx 0.32.4) during development;
 * this file needs no Python.
 */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT_FAIL(call, status)                                                                            \
    do {                                                                                                     \
        qmm_error_clear();                                                                                   \
        CHECK_STATUS(call, status);                                                                          \
    } while (0)
#define EXPECT_MESSAGE(text)                                                                                 \
    CHECK(strstr(qmm_last_error(), text) != NULL, "message \"%s\" should mention \"%s\"", qmm_last_error(), text)

static const int all_bits[] = {2, 3, 4, 5, 6, 8};
static const int all_group_sizes[] = {32, 64, 128};
static const qmm_dtype all_dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
static const qmm_convention all_conventions[] = {QMM_CONVENTION_CPU, QMM_CONVENTION_GPU};

static const char *convention_name(qmm_convention convention) {
    return convention == QMM_CONVENTION_GPU ? "gpu" : "cpu";
}

/* Unit roundoff of a dtype, and half its smallest subnormal (the absolute error floor of one rounding). */
static double unit_roundoff(qmm_dtype dtype) {
    return dtype == QMM_F16 ? 0x1p-11 : dtype == QMM_BF16 ? 0x1p-8 : 0x1p-24;
}
static double half_smallest_subnormal(qmm_dtype dtype) {
    return dtype == QMM_F16 ? 0x1p-25 : dtype == QMM_BF16 ? 0x1p-134 : 0x1p-150;
}

/* A quantized matrix with its own storage. */
typedef struct owned_quantized {
    uint32_t *w;
    void *scales;
    void *biases;
    float *dequantized;
    uint8_t *codes;
} owned_quantized;

static bool owned_alloc(owned_quantized *q, size_t rows, size_t cols, int bits, int group_size, qmm_dtype dtype) {
    size_t words = rows * qmm_packed_words(cols, bits), groups = rows * (cols / (size_t)group_size);
    q->w = malloc(words * sizeof *q->w);
    q->scales = malloc(groups * qmm_dtype_size(dtype));
    q->biases = malloc(groups * qmm_dtype_size(dtype));
    q->dequantized = malloc(rows * cols * sizeof(float));
    q->codes = malloc(rows * cols);
    return q->w && q->scales && q->biases && q->dequantized && q->codes;
}

static void owned_free(owned_quantized *q) {
    free(q->w), free(q->scales), free(q->biases), free(q->dequantized), free(q->codes);
    memset(q, 0, sizeof *q);
}

/* Fills w[rows, cols] (dtype) group by group with a mix of shapes: symmetric normal data over many magnitudes,
 * all-positive, all-negative, constant, a coarse grid (exact ties), and an outlier group. */
static void fill_groups(check_rng *rng, void *w, qmm_dtype dtype, size_t rows, size_t cols, int group_size) {
    for (size_t r = 0; r < rows; r++) {
        for (size_t g = 0; g < cols / (size_t)group_size; g++) {
            int kind = (int)(check_rng_next(rng) % 6);
            float magnitude = powf(10.0f, check_rng_uniform(rng, -4.0f, 2.0f)); /* ≤ 100·6·40 < f16 max */
            float constant = check_rng_uniform(rng, -2.0f, 2.0f) * magnitude;
            float low = check_rng_uniform(rng, 0.1f, 1.0f) * magnitude;
            for (int i = 0; i < group_size; i++) {
                float v;
                switch (kind) {
                case 0: v = check_rng_normal(rng) * magnitude; break;
                case 1: v = check_rng_uniform(rng, low, 3.0f * low); break;
                case 2: v = -check_rng_uniform(rng, low, 3.0f * low); break;
                case 3: v = constant; break;
                case 4: v = (float)((int)(check_rng_next(rng) % 41) - 20) * 0.25f; break;
                default: v = (i == 5 ? 40.0f : 1.0f) * check_rng_normal(rng) * magnitude; break;
                }
                qmm_store_f32(w, dtype, r * cols + g * (size_t)group_size + (size_t)i, v);
            }
        }
    }
}

/* The per-element bound of quantize → dequantize with stored scale s and bias b:
 *   |ŵ − w| ≤ |s|/2 + slack        for every code below the far end,
 *   |ŵ − w| ≤ |s|   + slack        for the far-end code 2^bits − 1.
 * The far end can clip: after the edge refinement s = e/q0 (|q0| = round(|e|/s0) may exceed |e|/s0 by ½) the
 * other end of the range can map up to one step past 2^bits − 1 (hand-worked in test_hand_worked_cpu, and the
 * same in MLX). slack covers the roundings: s and b stored in the dtype, s·q and the sum rounded, and the f32
 * arithmetic of the quantizer, all relative to the largest magnitude involved, plus the subnormal floor. */
static bool bound_holds(float w, float dequantized, float s, float b, unsigned code, int bits, qmm_dtype dtype,
                        double *excess) {
    double n_bins = (double)((1 << bits) - 1);
    double magnitude = n_bins * fabs((double)s) + fabs((double)b) + fabs((double)w);
    double slack = 4.0 * (unit_roundoff(dtype) + 0x1p-24) * magnitude + (n_bins + 2.0) * half_smallest_subnormal(dtype);
    double steps = code == (1u << bits) - 1u ? 1.0 : 0.5;
    double error = fabs((double)dequantized - (double)w);
    *excess = error - (steps * fabs((double)s) + slack);
    return *excess <= 0.0;
}

static void test_random_round_trip(void) {
    check_rng rng = check_rng_make(31);
    const size_t rows = 5, cols = 384;
    void *w = malloc(rows * cols * sizeof(float));
    float *widened = malloc(rows * cols * sizeof(float));
    owned_quantized q = {0}, again = {0}, from_f32 = {0};
    if (!w || !widened) goto cleanup;
    for (size_t d = 0; d < 3; d++) {
        for (size_t c = 0; c < 2; c++) {
            for (size_t bi = 0; bi < 6; bi++) {
                for (size_t gi = 0; gi < 3; gi++) {
                    qmm_dtype dtype = all_dtypes[d];
                    qmm_convention convention = all_conventions[c];
                    int bits = all_bits[bi], group_size = all_group_sizes[gi];
                    size_t groups_per_row = cols / (size_t)group_size;
                    if (!owned_alloc(&q, rows, cols, bits, group_size, dtype) ||
                        !owned_alloc(&again, rows, cols, bits, group_size, dtype) ||
                        !owned_alloc(&from_f32, rows, cols, bits, group_size, QMM_F32)) {
                        CHECK(false, "out of memory");
                        goto cleanup;
                    }
                    fill_groups(&rng, w, dtype, rows, cols, group_size);
                    CHECK_OK(qmm_quantize(w, dtype, rows, cols, bits, group_size, convention, q.w, q.scales, q.biases));
                    qmm_qmatrix m = {q.w, q.scales, q.biases, dtype, rows, cols, bits, group_size};
                    memset(q.dequantized, 0xFF, rows * cols * sizeof(float)); /* NaN poison */
                    CHECK_OK(qmm_dequantize(&m, q.dequantized, QMM_F32));
                    CHECK_OK(qmm_unpack(q.w, rows, cols, bits, q.codes));

                    size_t outside = 0, sign_wrong = 0, first = 0;
                    double worst = -INFINITY;
                    for (size_t i = 0; i < rows * cols; i++) {
                        size_t group = (i / cols) * groups_per_row + (i % cols) / (size_t)group_size;
                        float s = qmm_load_f32(q.scales, dtype, group), b = qmm_load_f32(q.biases, dtype, group);
                        double excess;
                        if (!bound_holds(qmm_load_f32(w, dtype, i), q.dequantized[i], s, b, q.codes[i], bits, dtype,
                                         &excess) &&
                            outside++ == 0)
                            first = i;
                        if (excess > worst) worst = excess;
                    }
                    /* MLX's sign rule per group: s > 0 iff |min| > |max| (GPU: max taken with 0 included). */
                    for (size_t r = 0; r < rows; r++) {
                        for (size_t g = 0; g < groups_per_row; g++) {
                            float lo = INFINITY, hi = convention == QMM_CONVENTION_GPU ? 0.0f : -INFINITY;
                            for (int i = 0; i < group_size; i++) {
                                float v = qmm_load_f32(w, dtype, r * cols + g * (size_t)group_size + (size_t)i);
                                lo = fminf(lo, v);
                                hi = fmaxf(hi, v);
                            }
                            float s = qmm_load_f32(q.scales, dtype, r * groups_per_row + g);
                            if ((s > 0.0f) != (fabsf(lo) > fabsf(hi)) || s == 0.0f) sign_wrong++;
                        }
                    }
                    CHECK(outside == 0,
                          "%s %s bits=%d gs=%d: %zu elements outside the step bound, first [%zu] w=%a dequantized=%a code=%u",
                          qmm_dtype_name(dtype), convention_name(convention), bits, group_size, outside, first,
                          (double)qmm_load_f32(w, dtype, first), (double)q.dequantized[first], q.codes[first]);
                    CHECK(sign_wrong == 0, "%s %s bits=%d gs=%d: %zu scales break the sign rule", qmm_dtype_name(dtype),
                          convention_name(convention), bits, group_size, sign_wrong);

                    /* determinism: the same input gives the same bits */
                    CHECK_OK(qmm_quantize(w, dtype, rows, cols, bits, group_size, convention, again.w, again.scales,
                                          again.biases));
                    size_t words = rows * qmm_packed_words(cols, bits), scale_bytes = rows * groups_per_row * qmm_dtype_size(dtype);
                    CHECK(memcmp(q.w, again.w, words * 4) == 0 && memcmp(q.scales, again.scales, scale_bytes) == 0 &&
                              memcmp(q.biases, again.biases, scale_bytes) == 0,
                          "%s %s bits=%d gs=%d: a second quantize differs", qmm_dtype_name(dtype), convention_name(convention),
                          bits, group_size);

                    /* f16/bf16 weights quantize exactly as their (exact) f32 values, with s and b rounded once */
                    if (dtype != QMM_F32) {
                        for (size_t i = 0; i < rows * cols; i++) widened[i] = qmm_load_f32(w, dtype, i);
                        CHECK_OK(qmm_quantize(widened, QMM_F32, rows, cols, bits, group_size, convention, from_f32.w,
                                              from_f32.scales, from_f32.biases));
                        size_t differ = memcmp(q.w, from_f32.w, words * 4) != 0;
                        for (size_t g = 0; g < rows * groups_per_row; g++) {
                            uint16_t s16 = ((uint16_t *)q.scales)[g], b16 = ((uint16_t *)q.biases)[g];
                            float s32 = ((float *)from_f32.scales)[g], b32 = ((float *)from_f32.biases)[g];
                            uint16_t s_want = dtype == QMM_F16 ? qmm_f32_to_f16(s32) : qmm_f32_to_bf16(s32);
                            uint16_t b_want = dtype == QMM_F16 ? qmm_f32_to_f16(b32) : qmm_f32_to_bf16(b32);
                            differ += (s16 != s_want) + (b16 != b_want);
                        }
                        CHECK(differ == 0, "%s %s bits=%d gs=%d: quantizing the widened f32 values differs (%zu)",
                              qmm_dtype_name(dtype), convention_name(convention), bits, group_size, differ);
                    }
                    owned_free(&q), owned_free(&again), owned_free(&from_f32);
                }
            }
        }
    }
cleanup:
    owned_free(&q), owned_free(&again), owned_free(&from_f32);
    free(w), free(widened);
}

/* On symmetric data the larger |edge| is the max about half the time, so about half the scales are negative. */
static void test_negative_scale_fraction(void) {
    check_rng rng = check_rng_make(32);
    enum { ROWS = 64, COLS = 4096, GROUP = 64 };
    float *w = malloc(sizeof(float) * ROWS * COLS), *scales = malloc(sizeof(float) * ROWS * COLS / GROUP),
          *biases = malloc(sizeof(float) * ROWS * COLS / GROUP);
    uint32_t *packed = malloc(sizeof(uint32_t) * ROWS * COLS / 8);
    if (!w || !scales || !biases || !packed) {
        CHECK(false, "out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < (size_t)ROWS * COLS; i++) w[i] = check_rng_normal(&rng);
    for (int c = 0; c < 2; c++) {
        CHECK_OK(qmm_quantize(w, QMM_F32, ROWS, COLS, 4, GROUP, all_conventions[c], packed, scales, biases));
        size_t negative = 0, groups = (size_t)ROWS * COLS / GROUP;
        for (size_t g = 0; g < groups; g++) negative += scales[g] < 0.0f;
        /* 4096 groups, p = 1/2: the standard deviation of the fraction is 0.8%, so 40..60% cannot fail by chance */
        double fraction = (double)negative / (double)groups;
        CHECK(fraction > 0.40 && fraction < 0.60, "%s: %.1f%% of scales negative, expected about half",
              convention_name(all_conventions[c]), 100.0 * fraction);
    }
cleanup:
    free(w), free(scales), free(biases), free(packed);
}

/* Quantizes one group of 32 f32 values with 4 bits (or `bits`) and returns codes, scale, bias, dequantized. */
static void quantize_one_group(const float values[32], int bits, qmm_convention convention, uint8_t codes[32],
                               float *scale, float *bias, float dequantized[32]) {
    uint32_t w[8] = {0};
    memset(codes, 0xFF, 32);
    *scale = *bias = NAN;
    CHECK_OK(qmm_quantize(values, QMM_F32, 1, 32, bits, 32, convention, w, scale, bias));
    CHECK_OK(qmm_unpack(w, 1, 32, bits, codes));
    qmm_qmatrix m = {w, scale, bias, QMM_F32, 1, 32, bits, 32};
    for (int i = 0; i < 32; i++) dequantized[i] = NAN;
    CHECK_OK(qmm_dequantize(&m, dequantized, QMM_F32));
}

/* Hand-worked groups. The CPU results below were confirmed with mx.quantize/mx.dequantize. */
static void test_hand_worked(void) {
    uint8_t codes[32];
    float scale, bias, out[32], values[32];

    /* 1. Ramp with ties, 4 bits: min 0, max 15 -> s0 = 15/15 = 1; |0| > |15| is false, so s = −1, edge = 15,
     *    q0 = round(15/−1) = −15 ≠ 0 -> s = 15/−15 = −1, b = 15, and q = round((w − 15)/−1) = round(15 − w).
     *    Integers are exact (q = 15 − w, ŵ = w). The halves are ties: 2.5 -> 12.5, 3.5 -> 11.5, 0.5 -> 14.5.
     *    CPU (ties to even): 12, 12, 14 -> ŵ = 3, 3, 1.   GPU (half away from zero): 13, 12, 15 -> ŵ = 2, 3, 0.
     *    Both conventions see the same range here (max 15 > 0, min 0). */
    for (int i = 0; i < 32; i++) values[i] = (float)(i % 16);
    values[20] = 2.5f, values[21] = 3.5f, values[22] = 0.5f;
    for (int c = 0; c < 2; c++) {
        qmm_convention convention = all_conventions[c];
        quantize_one_group(values, 4, convention, codes, &scale, &bias, out);
        CHECK(scale == -1.0f && bias == 15.0f, "%s ramp: scale %g bias %g, want -1 and 15", convention_name(convention),
              (double)scale, (double)bias);
        int exact_wrong = 0;
        for (int i = 0; i < 20; i++) exact_wrong += codes[i] != 15 - i % 16 || out[i] != values[i];
        CHECK(exact_wrong == 0, "%s ramp: integers must quantize exactly (code 15 − w)", convention_name(convention));
        bool gpu = convention == QMM_CONVENTION_GPU;
        CHECK(codes[20] == (gpu ? 13 : 12) && codes[21] == 12 && codes[22] == (gpu ? 15 : 14),
              "%s ties: codes %u %u %u, want %s", convention_name(convention), codes[20], codes[21], codes[22],
              gpu ? "13 12 15 (half away from zero)" : "12 12 14 (ties to even)");
        CHECK(out[20] == (gpu ? 2.0f : 3.0f) && out[21] == 3.0f && out[22] == (gpu ? 0.0f : 1.0f),
              "%s ties: dequantized %g %g %g", convention_name(convention), (double)out[20], (double)out[21],
              (double)out[22]);
    }

    /* 2. All-negative group {−16, −1, −4, −12} repeated, 4 bits.
     *    CPU: [min, max] = [−16, −1]: s0 = 15/15 = 1, |−16| > |−1| -> s = 1, edge = −16, q0 = −16, s = −16/−16 = 1,
     *         b = −16; q = w + 16 = 0, 15, 12, 4, and ŵ = w exactly.
     *    GPU: the running max starts at 0, so the range is [−16, 0]: s0 = 16/15 = 1.0666667f (f32), edge = −16,
     *         q0 = round(−16/1.0666667f) = round(−14.999999) = −15, s = −16/−15 = 1.0666667f, b = −16;
     *         q = round((w + 16)/s) = round(0, 14.06, 11.25, 3.75) = 0, 14, 11, 4. */
    const float negative[4] = {-16.0f, -1.0f, -4.0f, -12.0f};
    for (int i = 0; i < 32; i++) values[i] = negative[i % 4];
    quantize_one_group(values, 4, QMM_CONVENTION_CPU, codes, &scale, &bias, out);
    CHECK(scale == 1.0f && bias == -16.0f, "cpu all-negative: scale %g bias %g, want 1 and -16", (double)scale,
          (double)bias);
    CHECK(codes[0] == 0 && codes[1] == 15 && codes[2] == 12 && codes[3] == 4 && codes[31] == 4,
          "cpu all-negative: codes %u %u %u %u, want 0 15 12 4", codes[0], codes[1], codes[2], codes[3]);
    CHECK(out[0] == -16.0f && out[1] == -1.0f && out[2] == -4.0f && out[3] == -12.0f, "cpu all-negative: exact");
    quantize_one_group(values, 4, QMM_CONVENTION_GPU, codes, &scale, &bias, out);
    CHECK(scale == 16.0f / 15.0f && bias == -16.0f, "gpu all-negative: scale %.9g bias %g, want 16/15 and -16 (range [min, 0])",
          (double)scale, (double)bias);
    CHECK(codes[0] == 0 && codes[1] == 14 && codes[2] == 11 && codes[3] == 4 && codes[31] == 4,
          "gpu all-negative: codes %u %u %u %u, want 0 14 11 4", codes[0], codes[1], codes[2], codes[3]);
    CHECK(out[1] == 14.0f * (16.0f / 15.0f) - 16.0f, "gpu all-negative: code 14 dequantizes to 14·s + b = %.9g",
          (double)out[1]);

    /* 3. All-positive group {1, 16}: both conventions use [1, 16] (only the GPU max starts at 0, not the min):
     *    s0 = 1, |1| > |16| false -> s = −1, edge = 16, q0 = −16, b = 16, q = 16 − w = 15, 0. */
    for (int i = 0; i < 32; i++) values[i] = (i & 1) ? 16.0f : 1.0f;
    for (int c = 0; c < 2; c++) {
        quantize_one_group(values, 4, all_conventions[c], codes, &scale, &bias, out);
        CHECK(scale == -1.0f && bias == 16.0f && codes[0] == 15 && codes[1] == 0 && out[0] == 1.0f && out[1] == 16.0f,
              "%s all-positive: scale %g bias %g codes %u %u", convention_name(all_conventions[c]), (double)scale,
              (double)bias, codes[0], codes[1]);
    }

    /* 4. Constant 5.0: the range is 0, so s0 = the 1e-7 floor; |5| > |5| false -> s = −1e-7, edge = 5,
     *    q0 = round(5/−1e-7) = −5e7 ≠ 0 -> s = 5/−5e7 (= −1e-7f again), b = 5; every code is 0 and ŵ = 5 exactly. */
    for (int i = 0; i < 32; i++) values[i] = 5.0f;
    for (int c = 0; c < 2; c++) {
        quantize_one_group(values, 4, all_conventions[c], codes, &scale, &bias, out);
        int wrong = 0;
        for (int i = 0; i < 32; i++) wrong += codes[i] != 0 || out[i] != 5.0f;
        CHECK(wrong == 0 && bias == 5.0f && scale == -(float)1e-7, "%s constant 5: scale %a bias %g, %d wrong",
              convention_name(all_conventions[c]), (double)scale, (double)bias, wrong);
    }

    /* 5. All zeros: s = −1e-7 (floor, max side), edge 0, q0 = 0 -> b = 0, codes 0, ŵ = 0. */
    for (int i = 0; i < 32; i++) values[i] = 0.0f;
    for (int c = 0; c < 2; c++) {
        quantize_one_group(values, 8, all_conventions[c], codes, &scale, &bias, out);
        int wrong = 0;
        for (int i = 0; i < 32; i++) wrong += codes[i] != 0 || out[i] != 0.0f;
        CHECK(wrong == 0 && bias == 0.0f && scale == -(float)1e-7, "%s zeros: scale %a bias %g, %d wrong",
              convention_name(all_conventions[c]), (double)scale, (double)bias, wrong);
    }

    /* 6. Clipping at the far end, 2 bits: {−1, 0.875, 0, ...}: s0 = 1.875/3 = 0.625, |−1| > |0.875| -> s = 0.625,
     *    edge = −1, q0 = round(−1.6) = −2, s = −1/−2 = 0.5, b = −1. Then 0.875 -> (0.875 + 1)/0.5 = 3.75 -> 4,
     *    clipped to 3 -> ŵ = 0.5: an error of 0.375 = 0.75·s, more than half a step (MLX gives the same). */
    for (int i = 0; i < 32; i++) values[i] = 0.0f;
    values[0] = -1.0f, values[1] = 0.875f;
    for (int c = 0; c < 2; c++) {
        quantize_one_group(values, 2, all_conventions[c], codes, &scale, &bias, out);
        CHECK(scale == 0.5f && bias == -1.0f && codes[0] == 0 && codes[1] == 3 && codes[2] == 2 && out[1] == 0.5f &&
                  out[2] == 0.0f,
              "%s clip: scale %g bias %g codes %u %u %u, ŵ(0.875) = %g", convention_name(all_conventions[c]),
              (double)scale, (double)bias, codes[0], codes[1], codes[2], (double)out[1]);
    }

    /* 7. A tie in the edge refinement itself, 2 bits: {−5, 1, 0, ...}: s0 = 6/3 = 2, |−5| > |1| -> edge = −5,
     *    edge/s0 = −2.5 exactly.
     *    CPU: q0 = rint(−2.5) = −2 -> s = −5/−2 = 2.5, b = −5; codes 0, round(6/2.5 = 2.4) = 2, round(5/2.5) = 2.
     *    GPU: q0 = round(−2.5) = −3 -> s = −5/−3 = 1.6666666f, b = −5; codes 0, round(3.6) = 4 -> clipped 3,
     *         round(5/1.6666666f = 3.0) = 3. */
    for (int i = 0; i < 32; i++) values[i] = 0.0f;
    values[0] = -5.0f, values[1] = 1.0f;
    quantize_one_group(values, 2, QMM_CONVENTION_CPU, codes, &scale, &bias, out);
    CHECK(scale == 2.5f && bias == -5.0f && codes[0] == 0 && codes[1] == 2 && codes[2] == 2 && out[1] == 0.0f,
          "cpu edge tie: scale %g bias %g codes %u %u %u (want 2.5, -5, 0 2 2)", (double)scale, (double)bias, codes[0],
          codes[1], codes[2]);
    quantize_one_group(values, 2, QMM_CONVENTION_GPU, codes, &scale, &bias, out);
    CHECK(scale == 5.0f / 3.0f && bias == -5.0f && codes[0] == 0 && codes[1] == 3 && codes[2] == 3,
          "gpu edge tie: scale %.9g bias %g codes %u %u %u (want 5/3, -5, 0 3 3)", (double)scale, (double)bias,
          codes[0], codes[1], codes[2]);
}

/* ŵ = round_T(round_T(s·q) + b), written out with volatile temporaries so this file's compiler cannot fuse it. */
static float reference_dequantize(float s, float b, unsigned q, qmm_dtype dtype) {
    volatile float product = s * (float)q;
    if (dtype == QMM_F16) {
        volatile float p = qmm_f16_to_f32(qmm_f32_to_f16(product));
        volatile float sum = p + b;
        return qmm_f16_to_f32(qmm_f32_to_f16(sum));
    }
    if (dtype == QMM_BF16) {
        volatile float p = qmm_bf16_to_f32(qmm_f32_to_bf16(product));
        volatile float sum = p + b;
        return qmm_bf16_to_f32(qmm_f32_to_bf16(sum));
    }
    volatile float sum = product + b;
    return sum;
}

static void test_dequantize_formula(void) {
    check_rng rng = check_rng_make(33);
    const size_t rows = 3, cols = 256;
    float *expected = malloc(rows * cols * sizeof(float));
    uint8_t *out = malloc(rows * cols * sizeof(float) + 8);
    if (!expected || !out) {
        CHECK(false, "out of memory");
        goto cleanup;
    }
    for (size_t d = 0; d < 3; d++) {
        for (size_t bi = 0; bi < 6; bi++) {
            for (size_t gi = 0; gi < 3; gi++) {
                qmm_dtype dtype = all_dtypes[d];
                int bits = all_bits[bi], group_size = all_group_sizes[gi];
                check_qmatrix q;
                if (!check_qmatrix_random(&rng, rows, cols, bits, group_size, dtype, &q)) {
                    CHECK(false, "out of memory");
                    goto cleanup;
                }
                /* larger biases and scales than the kit's, so the roundings matter */
                size_t groups = rows * (cols / (size_t)group_size);
                for (size_t g = 0; g < groups; g++) {
                    qmm_store_f32(q.scales, dtype, g, qmm_load_f32(q.scales, dtype, g) * 37.0f);
                    qmm_store_f32(q.biases, dtype, g, qmm_load_f32(q.biases, dtype, g) * 100.0f);
                }
                size_t words_per_row = qmm_packed_words(cols, bits);
                for (size_t r = 0; r < rows; r++)
                    for (size_t j = 0; j < cols; j++) {
                        size_t g = r * (cols / (size_t)group_size) + j / (size_t)group_size;
                        expected[r * cols + j] =
                            reference_dequantize(qmm_load_f32(q.scales, dtype, g), qmm_load_f32(q.biases, dtype, g),
                                                 qmm_code_at(q.w + r * words_per_row, j, bits), dtype);
                    }
                for (size_t od = 0; od < 3; od++) {
                    qmm_dtype out_dtype = all_dtypes[od];
                    size_t out_size = qmm_dtype_size(out_dtype);
                    memset(out, 0xFF, rows * cols * out_size + 8); /* NaN in every dtype, and a canary */
                    CHECK_OK(qmm_dequantize(&q.m, out, out_dtype));
                    size_t wrong = 0, first = 0;
                    for (size_t i = 0; i < rows * cols; i++) {
                        /* the value in the matrix dtype, then converted (exact when widening, RNE when narrowing) */
                        bool ok;
                        if (out_dtype == QMM_F32) {
                            float got;
                            memcpy(&got, out + i * 4, 4);
                            ok = memcmp(&got, &expected[i], 4) == 0;
                        } else {
                            uint16_t got;
                            memcpy(&got, out + i * 2, 2);
                            ok = got == (out_dtype == QMM_F16 ? qmm_f32_to_f16(expected[i]) : qmm_f32_to_bf16(expected[i]));
                        }
                        if (!ok && wrong++ == 0) first = i;
                    }
                    CHECK(wrong == 0, "dequantize %s -> %s bits=%d gs=%d: %zu elements differ, first [%zu] want %a",
                          qmm_dtype_name(dtype), qmm_dtype_name(out_dtype), bits, group_size, wrong, first,
                          (double)expected[first]);
                    CHECK(out[rows * cols * out_size] == 0xFF, "dequantize wrote past the end");
                }
                check_qmatrix_free(&q);
            }
        }
    }

    /* s = 0.1f, q = 3, b = −0.3f: round(round(0.1f·3) + (−0.3f)) = 0 exactly (what mx.dequantize gives), while a
     * fused multiply-add would round once and give −7.45e-9. All 2-bit codes are 3 in an all-ones word. */
    uint32_t ones[2] = {0xFFFFFFFFu, 0xFFFFFFFFu};
    float s = 0.1f, b = -0.3f, result[32];
    qmm_qmatrix m = {ones, &s, &b, QMM_F32, 1, 32, 2, 32};
    CHECK_OK(qmm_dequantize(&m, result, QMM_F32));
    CHECK(result[0] == 0.0f && result[31] == 0.0f, "0.1f·3 − 0.3f must be 0 with two roundings (no FMA), got %a",
          (double)result[0]);
cleanup:
    free(expected), free(out);
}

static void test_numeric_errors(void) {
    enum { ROWS = 3, COLS = 64 };
    float w[ROWS * COLS];
    uint16_t w16[ROWS * COLS];
    uint32_t packed[ROWS * COLS / 8];
    float scales[ROWS * 2], biases[ROWS * 2];
    for (int i = 0; i < ROWS * COLS; i++) w[i] = (float)(i % 7) - 3.0f;

    /* out_w at an address that is not a multiple of 4: refused before anything is written */
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, ROWS, COLS, 4, 32, QMM_CONVENTION_CPU, (uint32_t *)((char *)packed + 1), scales,
                             biases),
                QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_quantize: out_w at");
    EXPECT_MESSAGE("not 4-byte aligned");
    const float bad_values[] = {NAN, INFINITY, -INFINITY};
    for (int v = 0; v < 3; v++) {
        for (int c = 0; c < 2; c++) {
            float saved = w[2 * COLS + 37];
            w[2 * COLS + 37] = bad_values[v];
            memset(packed, 0xAB, sizeof packed);
            memset(scales, 0xAB, sizeof scales);
            EXPECT_FAIL(qmm_quantize(w, QMM_F32, ROWS, COLS, 4, 32, all_conventions[c], packed, scales, biases),
                        QMM_ERR_NUMERIC);
            EXPECT_MESSAGE("row 2, column 37");
            uint8_t poison[sizeof packed];
            memset(poison, 0xAB, sizeof poison);
            CHECK(memcmp(packed, poison, sizeof packed) == 0 && memcmp(scales, poison, sizeof scales) == 0,
                  "a failed quantize must leave the outputs untouched");
            w[2 * COLS + 37] = saved;
        }
    }
    /* f16 / bf16 Inf and NaN bit patterns */
    for (int i = 0; i < ROWS * COLS; i++) w16[i] = qmm_f32_to_f16(w[i]);
    w16[COLS + 5] = 0x7C00; /* +Inf */
    EXPECT_FAIL(qmm_quantize(w16, QMM_F16, ROWS, COLS, 4, 32, QMM_CONVENTION_CPU, packed, scales, biases), QMM_ERR_NUMERIC);
    EXPECT_MESSAGE("row 1, column 5");
    for (int i = 0; i < ROWS * COLS; i++) w16[i] = qmm_f32_to_bf16(w[i]);
    w16[63] = 0xFFC1; /* a negative NaN */
    EXPECT_FAIL(qmm_quantize(w16, QMM_BF16, ROWS, COLS, 4, 32, QMM_CONVENTION_GPU, packed, scales, biases), QMM_ERR_NUMERIC);
    EXPECT_MESSAGE("row 0, column 63");
    /* finite values whose range max − min overflows f32 */
    w[0] = -3e38f, w[1] = 3e38f;
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, ROWS, COLS, 4, 32, QMM_CONVENTION_CPU, packed, scales, biases), QMM_ERR_NUMERIC);
    EXPECT_MESSAGE("row 0");
}

static void test_bad_arguments(void) {
    float w[128] = {0}, scales[4], biases[4], out[128];
    uint32_t packed[64];
    const qmm_convention cpu = QMM_CONVENTION_CPU;

    EXPECT_FAIL(qmm_quantize(w, QMM_F32, 1, 64, 7, 32, cpu, packed, scales, biases), QMM_ERR_FORMAT);
    EXPECT_MESSAGE("bits=7");
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, 1, 64, 4, 16, cpu, packed, scales, biases), QMM_ERR_FORMAT);
    EXPECT_MESSAGE("group_size=16");
    EXPECT_FAIL(qmm_quantize(w, QMM_I32, 1, 64, 4, 32, cpu, packed, scales, biases), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, 1, 64, 4, 32, (qmm_convention)5, packed, scales, biases), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("convention=5");
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, 0, 64, 4, 32, cpu, packed, scales, biases), QMM_ERR_SHAPE);
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, 1, 0, 4, 32, cpu, packed, scales, biases), QMM_ERR_SHAPE);
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, 1, 96, 4, 64, cpu, packed, scales, biases), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("cols=96 (K of a linear layer) is not a multiple of group_size=64");
    EXPECT_FAIL(qmm_quantize(NULL, QMM_F32, 1, 64, 4, 32, cpu, packed, scales, biases), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, 1, 64, 4, 32, cpu, NULL, scales, biases), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, 1, 64, 4, 32, cpu, packed, NULL, biases), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, 1, 64, 4, 32, cpu, packed, scales, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("out_biases");
    EXPECT_FAIL(qmm_quantize(w, QMM_F32, SIZE_MAX / 64, 128, 4, 32, cpu, packed, scales, biases), QMM_ERR_OVERFLOW);

    CHECK_OK(qmm_quantize(w, QMM_F32, 1, 128, 4, 32, cpu, packed, scales, biases));
    qmm_qmatrix m = {packed, scales, biases, QMM_F32, 1, 128, 4, 32};
    EXPECT_FAIL(qmm_dequantize(&m, NULL, QMM_F32), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_FAIL(qmm_dequantize(&m, out, QMM_U32), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_FAIL(qmm_dequantize(NULL, out, QMM_F32), QMM_ERR_INVALID_ARGUMENT);
    qmm_qmatrix bad = m;
    bad.bits = 7;
    EXPECT_FAIL(qmm_dequantize(&bad, out, QMM_F32), QMM_ERR_FORMAT);
    bad = m, bad.cols = 96, bad.group_size = 64;
    EXPECT_FAIL(qmm_dequantize(&bad, out, QMM_F32), QMM_ERR_SHAPE);
    bad = m, bad.scales = NULL;
    EXPECT_FAIL(qmm_dequantize(&bad, out, QMM_F32), QMM_ERR_INVALID_ARGUMENT);
    bad = m, bad.rows = SIZE_MAX / 64;
    EXPECT_FAIL(qmm_dequantize(&bad, out, QMM_F32), QMM_ERR_OVERFLOW);
    CHECK_OK(qmm_dequantize(&m, out, QMM_F32));
    CHECK(out[0] == 0.0f && out[127] == 0.0f, "zeros dequantize to zeros");
}

/* A constant group beyond FLT_MAX·1e-7 (~3.4e31): the scale is the 1e-7 floor, edge/scale overflows to
 * ±Inf, q0 = ±Inf and s = edge/q0 = ±0, so (v − b)/s is 0/0. The code must come out 0 (what MLX gets on
 * x86) without converting that NaN to an integer (undefined behaviour, caught by the float-cast-overflow
 * sanitizer), and ŵ = 0·q + b must give the value back exactly. f32 and bf16 reach such values; f16 cannot. */
static void test_huge_constant_group(void) {
    const float magnitudes[] = {1e35f, -1e35f, 3.3e38f, -3.3e38f, 3.5e31f};
    for (size_t v = 0; v < sizeof magnitudes / sizeof magnitudes[0]; v++) {
        for (int d = 0; d < 3; d += 2) { /* f32, bf16 */
            const qmm_dtype dtype = all_dtypes[d];
            for (int c = 0; c < 2; c++) {
                uint16_t w16[64];
                float w32[64], scales[2], biases[2], out[64];
                uint32_t packed[64 * 8 / 32];
                uint8_t codes[64];
                for (int i = 0; i < 64; i++) {
                    w32[i] = magnitudes[v];
                    w16[i] = qmm_f32_to_bf16(magnitudes[v]);
                }
                const void *w = dtype == QMM_F32 ? (const void *)w32 : (const void *)w16;
                uint16_t scales16[2], biases16[2];
                void *s = dtype == QMM_F32 ? (void *)scales : (void *)scales16;
                void *b = dtype == QMM_F32 ? (void *)biases : (void *)biases16;
                CHECK_OK(qmm_quantize(w, dtype, 1, 64, 8, 32, all_conventions[c], packed, s, b));
                CHECK_OK(qmm_unpack(packed, 1, 64, 8, codes));
                bool zeros = true;
                for (int i = 0; i < 64; i++) zeros = zeros && codes[i] == 0;
                CHECK(zeros, "constant group of %g (%s, %s): every code must be 0", (double)magnitudes[v],
                      qmm_dtype_name(dtype), convention_name(all_conventions[c]));
                qmm_qmatrix m = {packed, s, b, dtype, 1, 64, 8, 32};
                CHECK_OK(qmm_dequantize(&m, out, QMM_F32));
                const float expected = dtype == QMM_F32 ? magnitudes[v] : qmm_bf16_to_f32(w16[0]);
                CHECK(out[0] == expected && out[63] == expected,
                      "constant group of %g (%s, %s) must dequantize exactly, got %g and %g", (double)expected,
                      qmm_dtype_name(dtype), convention_name(all_conventions[c]), (double)out[0], (double)out[63]);
            }
        }
    }
}

/* Float arrays at any address: safetensors views put tensors at any byte offset (MLX does not pad its
 * header), and `qmm quantize` / `qmm matmul --x` hand such views to the library. Quantizing from, and
 * dequantizing into, arrays one byte off alignment gives the same bytes as the aligned arrays (and no
 * misaligned load, which UBSan reports). */
static void test_misaligned_arrays(void) {
    enum { ROWS = 2, COLS = 64 };
    check_rng rng = check_rng_make(91);
    for (int d = 0; d < 3; d++) {
        const qmm_dtype dtype = all_dtypes[d];
        const size_t element = qmm_dtype_size(dtype);
        unsigned char *w = malloc(ROWS * COLS * element + 1), *s = malloc(ROWS * 2 * element + 1);
        unsigned char *b = malloc(ROWS * 2 * element + 1), *out = malloc(ROWS * COLS * 4 + 1);
        void *w_aligned = malloc(ROWS * COLS * element), *s_aligned = malloc(ROWS * 2 * element);
        void *b_aligned = malloc(ROWS * 2 * element);
        float *out_aligned = malloc(ROWS * COLS * 4);
        uint32_t packed[ROWS * COLS * 8 / 32], packed_aligned[ROWS * COLS * 8 / 32];
        if (!w || !s || !b || !out || !w_aligned || !s_aligned || !b_aligned || !out_aligned) {
            CHECK(false, "out of memory");
            goto cleanup;
        }
        check_fill_uniform(&rng, w_aligned, dtype, ROWS * COLS, -1.0f, 1.0f);
        memcpy(w + 1, w_aligned, ROWS * COLS * element);
        CHECK_OK(qmm_quantize(w_aligned, dtype, ROWS, COLS, 8, 32, QMM_CONVENTION_CPU, packed_aligned, s_aligned,
                              b_aligned));
        CHECK_OK(qmm_quantize(w + 1, dtype, ROWS, COLS, 8, 32, QMM_CONVENTION_CPU, packed, s + 1, b + 1));
        CHECK(memcmp(packed, packed_aligned, sizeof packed) == 0 && memcmp(s + 1, s_aligned, ROWS * 2 * element) == 0 &&
                  memcmp(b + 1, b_aligned, ROWS * 2 * element) == 0,
              "%s: quantizing a misaligned array must give the aligned result", qmm_dtype_name(dtype));
        qmm_qmatrix m = {packed, s + 1, b + 1, dtype, ROWS, COLS, 8, 32};
        qmm_qmatrix m_aligned = {packed_aligned, s_aligned, b_aligned, dtype, ROWS, COLS, 8, 32};
        CHECK_OK(qmm_dequantize(&m, out + 1, QMM_F32));
        CHECK_OK(qmm_dequantize(&m_aligned, out_aligned, QMM_F32));
        CHECK(memcmp(out + 1, out_aligned, ROWS * COLS * 4) == 0,
              "%s: dequantizing misaligned scales into a misaligned output must give the aligned result",
              qmm_dtype_name(dtype));
    cleanup:
        free(w), free(s), free(b), free(out), free(w_aligned), free(s_aligned), free(b_aligned), free(out_aligned);
    }
}

/* Arrays that share bytes (a break-it helper found qmm_convert wrong in place, and its kind here): qmm_quantize with
 * out_w, out_scales or out_biases inside w's bytes, and qmm_dequantize with out over w, scales or biases, give the
 * separate-array results; outputs of qmm_quantize that overlap each other are refused, naming the rule. */
static void test_overlapping_arrays(void) {
    enum { R = 4, C = 128, G = 64, WORDS = R * C / 8, GROUPS = R * C / G };
    const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    check_rng rng = check_rng_make(44);
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        const qmm_dtype dtype = dtypes[d];
        const size_t size = qmm_dtype_size(dtype), in_bytes = R * C * size, group_bytes = GROUPS * size;
        uint8_t w[R * C * 4], scales[GROUPS * 4], biases[GROUPS * 4], dense[R * C * 4];
        uint32_t packed[WORDS];
        check_fill_uniform(&rng, w, dtype, R * C, -2, 2);
        CHECK_OK(qmm_quantize(w, dtype, R, C, 4, G, QMM_CONVENTION_GPU, packed, scales, biases));
        const qmm_qmatrix separate = {packed, scales, biases, dtype, R, C, 4, G};
        CHECK_OK(qmm_dequantize(&separate, dense, QMM_F32));
        /* byte offsets into one buffer holding w at 0: inside w (in place, the middle, the tail) or past it */
        const size_t at[] = {0, 64, in_bytes - 64, in_bytes + 128};
        for (size_t a = 0; a < 4; a++) {
            for (size_t b = 0; b < 4; b++) {
                _Alignas(16) uint8_t buffer[R * C * 4 + 1024];
                const size_t w_at = at[a], s_at = at[b], b_at = s_at + group_bytes + 16;
                if (w_at < b_at + group_bytes && s_at < w_at + WORDS * 4) continue; /* outputs apart (refused below) */
                memcpy(buffer, w, in_bytes);
                CHECK_OK(qmm_quantize(buffer, dtype, R, C, 4, G, QMM_CONVENTION_GPU, (uint32_t *)(buffer + w_at),
                                      buffer + s_at, buffer + b_at));
                CHECK(memcmp(buffer + w_at, packed, sizeof packed) == 0 && memcmp(buffer + s_at, scales, group_bytes) == 0 &&
                          memcmp(buffer + b_at, biases, group_bytes) == 0,
                      "qmm_quantize %s, out_w at w + %zu, out_scales at + %zu: other results", qmm_dtype_name(dtype), w_at,
                      s_at);
            }
            /* dequantize: out (f32) over the packed codes, the scales or the biases, each placed at `at` */
            for (int which = 0; which < 3; which++) {
                _Alignas(16) uint8_t buffer[R * C * 4 + 2048];
                size_t w_at = 1536, s_at = w_at + WORDS * 4, b_at = s_at + group_bytes + 16, out_at = at[a] % 1024;
                size_t *moved = which == 0 ? &w_at : which == 1 ? &s_at : &b_at;
                *moved = out_at + (a * 16) % 64; /* inside out's bytes */
                if (which == 0) s_at = 2 * 1024 + 512, b_at = s_at + 64;
                memcpy(buffer + w_at, packed, sizeof packed);
                memcpy(buffer + s_at, scales, group_bytes);
                memcpy(buffer + b_at, biases, group_bytes);
                const qmm_qmatrix m = {(const uint32_t *)(buffer + w_at), buffer + s_at, buffer + b_at, dtype, R, C, 4, G};
                CHECK_OK(qmm_dequantize(&m, buffer + out_at, QMM_F32));
                CHECK(memcmp(buffer + out_at, dense, R * C * 4) == 0, "qmm_dequantize %s, out over %s: other values",
                      qmm_dtype_name(dtype), which == 0 ? "w" : which == 1 ? "scales" : "biases");
            }
        }
        /* outputs overlapping each other: refused */
        uint8_t outs[WORDS * 4 + 64];
        EXPECT_FAIL(qmm_quantize(w, dtype, R, C, 4, G, QMM_CONVENTION_GPU, (uint32_t *)outs, outs + 16, biases),
                    QMM_ERR_INVALID_ARGUMENT);
        EXPECT_MESSAGE("overlap; they must be separate arrays");
    }
}

int main(void) {
    test_random_round_trip();
    test_negative_scale_fraction();
    test_hand_worked();
    test_dequantize_formula();
    test_numeric_errors();
    test_bad_arguments();
    test_huge_constant_group();
    test_misaligned_arrays();
    test_overlapping_arrays();
    return check_finish("test_quantize");
}
