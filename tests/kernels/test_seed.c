/*
 * test_seed.c — the seed's own cases (../shared/seed/metaltile_qmm_tests.rs.txt), ported as facts.
 *
 * The seed tests 4-bit group-64 qmm_t kernels with deterministic inputs:
 *   word pattern  w[i] = Σ_{bit<8} ((i + bit) & 0xF) << 4·bit, scales 0.1 + i·0.001, biases i·0.0001,
 *                 x 1.0 + i·0.001, at 8×16×512 (f32, f16, bf16), 1×32×512 f32, 4×16×512 bf16,
 *                 32×32×64 and 16×32×64 (f32, f16), 32×32×512 (f32, bf16), 16×32×512 bf16;
 *   Qwen3 cells   n = k = 5120 with a full oracle: M=32 (words (i % 17)·0xDEADBEEF, scales
 *                 0.005 + (i % 7)·0.0007, biases (i % 5)·0.00005, x 0.05 + (i % 23)·0.003) and M=16
 *                 (words (i % 13)·0xC0FFEE00, scales 0.003 + (i % 11)·0.0005, biases (i % 9)·0.00003,
 *                 x 0.07 + (i % 19)·0.002), f32;
 *   finite check  the five Qwen3 shapes (n×k 4096×4096, 5120×5120, 14336×5120, 5120×14336,
 *                 27648×5120) at M=4 f16 with words i·2654435761, scales 0.01 + (i % 13)·0.001,
 *                 biases (i % 7)·0.0001, x 0.1 + (i % 31)·0.01: every output finite.
 * Every registered qmm_t kernel of every backend that can be created runs each case and is compared
 *   (a) with a seed-style f32 reference written here (nibbles extracted by hand, inputs rounded
 *       through the dtype as the seed does), with the seed's tolerances: f32 max |e − a| < 1e-3
 *       (5e-3 for the Qwen3 cells, as the seed); f16 max rel < 5e-3 (1.5e-2 for "mma" rows, the
 *       seed's MMA f16 tolerance); bf16 max rel < 2e-2 (5e-2 for tiled rows, BM·BN > 1); in the
 *       32×32×512 f32 cell, tiled (gemm, mma) rows max rel < 1e-4 (the seed's own rule for a tiled
 *       kernel in that cell, mt_qmm_mma_matches_mt_qmm_at_same_shape_f32);
 *       rel = |e − a| / max(|e|, 1);
 *   (b) with qmm_ref_dense_f64 within qmm_error_bound × the row's tolerance_slack.
 */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Under AddressSanitizer (the -O0 `make test-asan` run) the production-size cells take minutes, and
 * they add no memory-safety coverage the small cells lack: there the Qwen3 full-oracle cells are
 * skipped and the finite check runs its first two shapes. The plain build runs everything. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED_BUILD 1
#endif
#endif
#ifndef SANITIZED_BUILD
#define SANITIZED_BUILD 0
#endif

typedef enum pattern { SEED_RAMP, QWEN3_M32, QWEN3_M16, QWEN3_SMOKE } pattern;

/* The seed's inputs of one case, in f32 as the seed builds them (f32 arithmetic throughout). */
typedef struct seed_inputs {
    size_t M, N, K;
    int group_size;
    uint32_t *w;   /* [N, K/8] */
    float *scales; /* [N, K/64], as built in f32 */
    float *biases;
    float *x; /* [M, K] */
} seed_inputs;

static bool make_inputs(pattern which, size_t M, size_t N, size_t K, seed_inputs *in) {
    memset(in, 0, sizeof *in);
    in->M = M, in->N = N, in->K = K, in->group_size = 64;
    const size_t words = N * K / 8, groups = N * K / 64, xs = M * K;
    in->w = malloc(words * sizeof(uint32_t));
    in->scales = malloc(groups * sizeof(float));
    in->biases = malloc(groups * sizeof(float));
    in->x = malloc(xs * sizeof(float));
    if (!in->w || !in->scales || !in->biases || !in->x) return false;
    for (size_t i = 0; i < words; i++) {
        const uint32_t u = (uint32_t)i;
        switch (which) {
        case SEED_RAMP: {
            uint32_t v = 0;
            for (uint32_t bit = 0; bit < 8; bit++) v |= ((u + bit) & 0xFu) << (bit * 4);
            in->w[i] = v;
            break;
        }
        case QWEN3_M32: in->w[i] = (u % 17u) * 0xDEADBEEFu; break;
        case QWEN3_M16: in->w[i] = (u % 13u) * 0xC0FFEE00u; break;
        case QWEN3_SMOKE: in->w[i] = u * 2654435761u; break;
        }
    }
    for (size_t i = 0; i < groups; i++) {
        const float f = (float)i;
        switch (which) {
        case SEED_RAMP: in->scales[i] = 0.1f + f * 0.001f, in->biases[i] = f * 0.0001f; break;
        case QWEN3_M32:
            in->scales[i] = 0.005f + (float)(i % 7) * 0.0007f, in->biases[i] = (float)(i % 5) * 0.00005f;
            break;
        case QWEN3_M16:
            in->scales[i] = 0.003f + (float)(i % 11) * 0.0005f, in->biases[i] = (float)(i % 9) * 0.00003f;
            break;
        case QWEN3_SMOKE:
            in->scales[i] = 0.01f + (float)(i % 13) * 0.001f, in->biases[i] = (float)(i % 7) * 0.0001f;
            break;
        }
    }
    for (size_t i = 0; i < xs; i++) {
        switch (which) {
        case SEED_RAMP: in->x[i] = 1.0f + (float)i * 0.001f; break;
        case QWEN3_M32: in->x[i] = 0.05f + (float)(i % 23) * 0.003f; break;
        case QWEN3_M16: in->x[i] = 0.07f + (float)(i % 19) * 0.002f; break;
        case QWEN3_SMOKE: in->x[i] = 0.1f + (float)(i % 31) * 0.01f; break;
        }
    }
    return true;
}

static void free_inputs(seed_inputs *in) {
    free(in->w);
    free(in->scales);
    free(in->biases);
    free(in->x);
    memset(in, 0, sizeof *in);
}

/* f32 → dtype → f32, the seed's round trip of every input through the kernel's dtype. */
static float round_through(float v, qmm_dtype dtype) {
    switch (dtype) {
    case QMM_F16: return qmm_f16_to_f32(qmm_f32_to_f16(v));
    case QMM_BF16: return qmm_bf16_to_f32(qmm_f32_to_bf16(v));
    default: return v;
    }
}

/* The seed's CPU reference, restated: per output, per group of 64, eight words of eight nibbles,
 * q·x and x summed in f32, acc += s·Σq·x + b·Σx. Inputs are the dtype-rounded f32 values; the result
 * stays f32 (the seed compares it, unrounded, with the kernel's dtype output). */
static void seed_reference(const seed_inputs *in, const float *scales, const float *biases, const float *x,
                           float *out) {
    const size_t K = in->K, groups = K / 64;
    for (size_t m = 0; m < in->M; m++)
        for (size_t n = 0; n < in->N; n++) {
            float acc = 0.0f;
            for (size_t g = 0; g < groups; g++) {
                const float s = scales[n * groups + g], b = biases[n * groups + g];
                float q_dot = 0.0f, x_sum = 0.0f;
                for (size_t p = 0; p < 8; p++) {
                    const uint32_t packed = in->w[n * K / 8 + g * 8 + p];
                    for (unsigned bit = 0; bit < 8; bit++) {
                        const float q = (float)((packed >> (bit * 4)) & 0xFu);
                        const float xv = x[m * K + g * 64 + p * 8 + bit];
                        q_dot += q * xv;
                        x_sum += xv;
                    }
                }
                acc += s * q_dot + b * x_sum;
            }
            out[m * in->N + n] = acc;
        }
}

/* Host arrays of one case in the kernel's dtype, and the f32 values the reference sees. */
typedef struct typed_case {
    qmm_qmatrix matrix;
    void *scales, *biases, *x;           /* dtype */
    float *scales_f, *biases_f, *x_f;    /* rounded through dtype, as f32 */
} typed_case;

static bool make_typed(const seed_inputs *in, qmm_dtype dtype, typed_case *t) {
    memset(t, 0, sizeof *t);
    const size_t groups = in->N * in->K / 64, xs = in->M * in->K, size = qmm_dtype_size(dtype);
    t->scales = malloc(groups * size), t->biases = malloc(groups * size), t->x = malloc(xs * size);
    t->scales_f = malloc(groups * sizeof(float)), t->biases_f = malloc(groups * sizeof(float));
    t->x_f = malloc(xs * sizeof(float));
    if (!t->scales || !t->biases || !t->x || !t->scales_f || !t->biases_f || !t->x_f) return false;
    for (size_t i = 0; i < groups; i++) {
        qmm_store_f32(t->scales, dtype, i, in->scales[i]);
        qmm_store_f32(t->biases, dtype, i, in->biases[i]);
        t->scales_f[i] = round_through(in->scales[i], dtype);
        t->biases_f[i] = round_through(in->biases[i], dtype);
    }
    for (size_t i = 0; i < xs; i++) {
        qmm_store_f32(t->x, dtype, i, in->x[i]);
        t->x_f[i] = round_through(in->x[i], dtype);
    }
    qmm_qmatrix m = {in->w, t->scales, t->biases, dtype, in->N, in->K, 4, 64};
    t->matrix = m;
    return true;
}

static void free_typed(typed_case *t) {
    free(t->scales), free(t->biases), free(t->x), free(t->scales_f), free(t->biases_f), free(t->x_f);
    memset(t, 0, sizeof *t);
}

/* The seed's tolerance for a dtype and a row (see the file header). */
static double seed_tolerance(qmm_dtype dtype, const qmm_kernel_info *info, bool qwen3_cell) {
    const bool tiled = (long)info->bm * (long)info->bn > 1;
    switch (dtype) {
    case QMM_F16: return strcmp(info->family, "mma") == 0 ? 1.5e-2 : 5e-3;
    case QMM_BF16: return tiled ? 5e-2 : 2e-2;
    default: return qwen3_cell ? 5e-3 : 1e-3;
    }
}

/* Runs the row on the case through the runtime; out receives M·N dtype values. Returns false when the
 * row does not support the case (reported, not a failure) or the call failed (a failure). */
static bool run_row(qmm_context *context, const qmm_kernel_info *info, const typed_case *t, size_t M, void *out,
                    const char *label) {
    const size_t N = t->matrix.rows, K = t->matrix.cols;
    qmm_weights *weights = NULL;
    qmm_buffer *xb = NULL, *ob = NULL;
    bool ran = false;
    CHECK_OK(qmm_weights_create(context, &t->matrix, &weights));
    if (!weights) goto cleanup;
    const char *why_not = NULL;
    int supported = qmm_kernel_supports(context, info->name, weights, M, QMM_OP_QMM_T, &why_not);
    CHECK(supported >= 0, "%s: qmm_kernel_supports: %s", label, qmm_last_error());
    if (supported != 1) {
        printf("    %-24s not supported: %s\n", info->name, why_not ? why_not : "?");
        goto cleanup;
    }
    CHECK_OK(qmm_buffer_create(context, t->matrix.dtype, M * K, &xb));
    CHECK_OK(qmm_buffer_create(context, t->matrix.dtype, M * N, &ob));
    if (!xb || !ob) goto cleanup;
    CHECK_OK(qmm_buffer_write(xb, t->x, M * K));
    CHECK_OK(qmm_buffer_poison(ob));
    qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = info->name};
    qmm_status status = qmm_matmul(context, weights, xb, M, ob, &options, NULL);
    CHECK(status == QMM_OK, "%s: matmul -> %s: %s", label, qmm_status_string(status), qmm_last_error());
    if (status != QMM_OK) goto cleanup;
    CHECK_OK(qmm_buffer_read(ob, out, M * N));
    ran = true;
cleanup:
    qmm_buffer_destroy(xb);
    qmm_buffer_destroy(ob);
    qmm_weights_destroy(weights);
    return ran;
}

/* One seed case on every qmm_t row of every context: (a) seed reference and (b) f64 oracle. */
static double seconds_now(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static void run_case(qmm_context *const *contexts, size_t context_count, pattern which, size_t M, size_t N, size_t K,
                     qmm_dtype dtype) {
    const double start = seconds_now();
    const bool qwen3_cell = which == QWEN3_M32 || which == QWEN3_M16;
    char name[96];
    snprintf(name, sizeof name, "%zux%zux%zu %s%s", M, N, K, qmm_dtype_name(dtype), qwen3_cell ? " (Qwen3 cell)" : "");
    seed_inputs in;
    typed_case t;
    memset(&in, 0, sizeof in);
    memset(&t, 0, sizeof t);
    const size_t count = M * N;
    float *expected = malloc(count * sizeof(float));
    double *exact = malloc(count * sizeof(double)), *abs_dot = malloc(count * sizeof(double));
    void *out = malloc(count * qmm_dtype_size(dtype));
    if (!expected || !exact || !abs_dot || !out || !make_inputs(which, M, N, K, &in) || !make_typed(&in, dtype, &t)) {
        CHECK(false, "%s: out of memory", name);
        goto cleanup;
    }
    seed_reference(&in, t.scales_f, t.biases_f, t.x_f, expected);
    const double reference_done = seconds_now();
    CHECK_OK(qmm_ref_dense_f64(&t.matrix, t.x, M, 1, exact, abs_dot));
    printf("  %s (seed reference %.2f s, f64 oracle %.2f s)\n", name, reference_done - start,
           seconds_now() - reference_done);
    size_t rows_ran = 0;
    for (size_t c = 0; c < context_count; c++) {
        for (size_t k = 0; k < qmm_kernel_count(contexts[c]); k++) {
            qmm_kernel_info info;
            CHECK_OK(qmm_kernel_get(contexts[c], k, &info));
            if (info.op != QMM_OP_QMM_T) continue;
            char label[160];
            snprintf(label, sizeof label, "seed %s on %s", name, info.name);
            const double row_start = seconds_now();
            if (!run_row(contexts[c], &info, &t, M, out, label)) continue;
            rows_ran++;
            /* (a) the seed's comparison */
            /* The seed's 32×32×512 f32 cell (mt_qmm_mma_matches_mt_qmm_at_same_shape_f32) holds a tiled
             * kernel to max rel < 1e-4, not 1e-3 absolute: "at k=512 with values ~1e4, absolute diff
             * of ~1e-2 is normal fp32 reorder noise" (1e-3 is below one f32 ulp there). Tiled (gemm,
             * mma) rows and the CUDA ffma_gemv row (lanes sum strided parts of K, then a butterfly: also a
             * reordered sum) get that rule in that cell; every other row and cell keeps 1e-3 absolute. */
            /* The CUDA f32 tensor-core row (mma_tile_bf16x3: MMAs add their products in their own order) is such a
             * tiled MMA kernel in every K = 512 f32 cell (8×16 too: 6 ulps of 3434 there, 4e-7 relative). */
            const bool f32_relative = dtype == QMM_F32 && K == 512 && !qwen3_cell &&
                                      ((M == 32 && N == 32 &&
                                        (strcmp(info.family, "gemm") == 0 || strcmp(info.family, "mma") == 0 ||
                                         strcmp(info.family, "ffma_gemv") == 0)) ||
                                       strcmp(info.family, "mma_tile_bf16x3") == 0);
            const double tolerance = f32_relative ? 1e-4 : seed_tolerance(dtype, &info, qwen3_cell);
            double worst = 0.0;
            size_t worst_at = 0;
            for (size_t i = 0; i < count; i++) {
                const double e = expected[i], a = qmm_load_f32(out, dtype, i);
                double diff = fabs(e - a);
                if (dtype != QMM_F32 || f32_relative) diff /= fmax(fabs(e), 1.0);
                if (!(diff <= worst)) worst = diff, worst_at = i; /* NaN sticks */
            }
            CHECK(worst < tolerance, "%s: max %s diff %.3g at %zu (expected %.6f, got %.6f) ≥ seed tolerance %.3g",
                  label, dtype == QMM_F32 && !f32_relative ? "|abs|" : "rel", worst, worst_at, (double)expected[worst_at],
                  (double)qmm_load_f32(out, dtype, worst_at), tolerance);
            /* (b) the f64 oracle within the documented bound */
            double worst_ratio = 0.0;
            size_t bad = check_against_oracle(label, out, dtype, exact, abs_dot, count, K, info.tolerance_slack,
                                              &worst_ratio);
            CHECK(bad == 0, "%s: %zu outputs outside qmm_error_bound (worst error/bound %.3g)", label, bad, worst_ratio);
            printf("    %-24s max %s diff %.3g (seed tolerance %.0e), worst error/bound %.3f (%.2f s)\n", info.name,
                   dtype == QMM_F32 && !f32_relative ? "abs" : "rel", worst, tolerance, worst_ratio, seconds_now() - row_start);
        }
    }
    CHECK(rows_ran > 0, "%s: no qmm_t kernel ran the case", name);
cleanup:
    free_inputs(&in);
    free_typed(&t);
    free(expected);
    free(exact);
    free(abs_dot);
    free(out);
}

/* The seed's finite-output check over the Qwen3 hot-path shapes at M = 4, f16. */
static void run_finite_check(qmm_context *const *contexts, size_t context_count) {
    static const struct {
        size_t n, k;
        const char *label;
    } shapes[] = {
        {4096, 4096, "baseline 4096²"},
        {5120, 5120, "Qwen3-8B/14B attn proj"},
        {14336, 5120, "Qwen3-8B/14B MLP up_proj"},
        {5120, 14336, "Qwen3-8B/14B MLP down_proj"},
        {27648, 5120, "Qwen3-coder-30B MoE expert up_proj"},
    };
    const size_t M = 4;
    const size_t shape_count = SANITIZED_BUILD ? 2 : sizeof shapes / sizeof shapes[0];
    if (SANITIZED_BUILD) printf("  finite check: first 2 of 5 shapes only (sanitizer build)\n");
    for (size_t s = 0; s < shape_count; s++) {
        seed_inputs in;
        typed_case t;
        memset(&in, 0, sizeof in);
        memset(&t, 0, sizeof t);
        const size_t N = shapes[s].n, K = shapes[s].k;
        uint16_t *out = malloc(M * N * sizeof(uint16_t));
        if (!out || !make_inputs(QWEN3_SMOKE, M, N, K, &in) || !make_typed(&in, QMM_F16, &t)) {
            CHECK(false, "finite check %s: out of memory", shapes[s].label);
            free_inputs(&in);
            free_typed(&t);
            free(out);
            continue;
        }
        for (size_t c = 0; c < context_count; c++)
            for (size_t k = 0; k < qmm_kernel_count(contexts[c]); k++) {
                const double start = seconds_now();
                qmm_kernel_info info;
                CHECK_OK(qmm_kernel_get(contexts[c], k, &info));
                if (info.op != QMM_OP_QMM_T) continue;
                char label[160];
                snprintf(label, sizeof label, "finite %zux%zux%zu f16 (%s) on %s", M, N, K, shapes[s].label, info.name);
                if (!run_row(contexts[c], &info, &t, M, out, label)) continue;
                size_t not_finite = 0, first = 0;
                for (size_t i = 0; i < M * N; i++)
                    if (!isfinite(qmm_f16_to_f32(out[i])) && not_finite++ == 0) first = i;
                CHECK(not_finite == 0, "%s: %zu non-finite outputs, first at %zu", label, not_finite, first);
                printf("  %-60s all %zu outputs finite: %s (%.2f s)\n", label, M * N, not_finite ? "no" : "yes",
                       seconds_now() - start);
            }
        free_inputs(&in);
        free_typed(&t);
        free(out);
    }
}

int main(void) {
    const qmm_backend backends[] = {QMM_BACKEND_REF, QMM_BACKEND_CPU, QMM_BACKEND_CUDA};
    qmm_context *contexts[3];
    size_t context_count = 0;
    for (size_t i = 0; i < 3; i++) {
        qmm_context *context = NULL;
        qmm_status status = qmm_context_create(backends[i], 0, &context);
        if (status != QMM_OK) {
            printf("backend %s: SKIPPED: %s\n", qmm_backend_name(backends[i]), qmm_last_error());
            CHECK(status == QMM_ERR_UNSUPPORTED, "backend %s: %s", qmm_backend_name(backends[i]), qmm_last_error());
            continue;
        }
        contexts[context_count++] = context;
    }
    /* The seed's small cells. */
    run_case(contexts, context_count, SEED_RAMP, 8, 16, 512, QMM_F32);
    run_case(contexts, context_count, SEED_RAMP, 8, 16, 512, QMM_F16);
    run_case(contexts, context_count, SEED_RAMP, 8, 16, 512, QMM_BF16);
    run_case(contexts, context_count, SEED_RAMP, 1, 32, 512, QMM_F32);
    run_case(contexts, context_count, SEED_RAMP, 4, 16, 512, QMM_BF16);
    run_case(contexts, context_count, SEED_RAMP, 32, 32, 64, QMM_F32);
    run_case(contexts, context_count, SEED_RAMP, 32, 32, 64, QMM_F16);
    run_case(contexts, context_count, SEED_RAMP, 16, 32, 64, QMM_F32);
    run_case(contexts, context_count, SEED_RAMP, 16, 32, 64, QMM_F16);
    run_case(contexts, context_count, SEED_RAMP, 32, 32, 512, QMM_F32);
    run_case(contexts, context_count, SEED_RAMP, 32, 32, 512, QMM_BF16);
    run_case(contexts, context_count, SEED_RAMP, 16, 32, 512, QMM_BF16);
    /* The Qwen3 production cells with a full oracle. */
    if (SANITIZED_BUILD) {
        printf("  32x5120x5120 and 16x5120x5120 Qwen3 cells: SKIPPED: sanitizer build (minutes at -O0); the plain "
               "build runs them\n");
    } else {
        run_case(contexts, context_count, QWEN3_M32, 32, 5120, 5120, QMM_F32);
        run_case(contexts, context_count, QWEN3_M16, 16, 5120, 5120, QMM_F32);
    }
    /* The finite-output check over the five Qwen3 shapes. */
    run_finite_check(contexts, context_count);
    for (size_t i = 0; i < context_count; i++) qmm_context_destroy(contexts[i]);
    return check_finish("test_seed");
}
