/*
 * test_cpu.c — the CPU rows on the shapes the grid of test_kernels.c does not reach: the fixture's
 * (K = 576 and 1536, N up to 1536, M = 16), tiled work items that cross their chunk boundaries (N > 48,
 * M > 256 lanes), odd N (1, 3, 7), and the thread count: every row must give the same bits on 1 and on
 * 2 threads (each output is computed by one thread in one order), and agree with the f64 oracle within
 * the bound. Skipped (with the reason) when the CPU backend is not built.
 */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    size_t M, N, K;
} shape;

typedef struct format {
    int bits, group_size;
    qmm_dtype dtype;
} format;

static void run_case(qmm_context *context, const qmm_kernel_info *info, check_rng *rng, shape s, format f) {
    const bool transpose = info->op == QMM_OP_QMM_T;
    const size_t quantized = transpose ? s.K : s.N;
    if (quantized % (size_t)f.group_size != 0) return;
    char label[160];
    snprintf(label, sizeof label, "%s %s %d-bit gs%d M=%zu N=%zu K=%zu", info->name, qmm_dtype_name(f.dtype), f.bits,
             f.group_size, s.M, s.N, s.K);
    check_qmatrix q;
    if (!check_qmatrix_random(rng, transpose ? s.N : s.K, transpose ? s.K : s.N, f.bits, f.group_size, f.dtype, &q)) {
        CHECK(false, "%s: out of memory", label);
        return;
    }
    const size_t size = qmm_dtype_size(f.dtype);
    qmm_weights *weights = NULL;
    qmm_buffer *xb = NULL, *ob = NULL;
    void *x = malloc(s.M * s.K * size), *one = malloc(s.M * s.N * size), *two = malloc(s.M * s.N * size);
    double *exact = malloc(s.M * s.N * sizeof(double)), *abs_dot = malloc(s.M * s.N * sizeof(double));
    if (!x || !one || !two || !exact || !abs_dot) {
        CHECK(false, "%s: out of memory", label);
        goto cleanup;
    }
    CHECK_OK(qmm_weights_create(context, &q.m, &weights));
    const char *why_not = NULL;
    if (!weights || qmm_kernel_supports(context, info->name, weights, s.M, info->op, &why_not) != 1) goto cleanup;
    check_fill_uniform(rng, x, f.dtype, s.M * s.K, -1.0f, 1.0f);
    CHECK_OK(qmm_buffer_create(context, f.dtype, s.M * s.K, &xb));
    CHECK_OK(qmm_buffer_create(context, f.dtype, s.M * s.N, &ob));
    if (!xb || !ob) goto cleanup;
    CHECK_OK(qmm_buffer_write(xb, x, s.M * s.K));
    qmm_matmul_options options = {.op = info->op, .kernel = info->name};
    void *outputs[2] = {one, two};
    for (int t = 0; t < 2; t++) {
        CHECK_OK(qmm_context_set_threads(context, t + 1));
        CHECK_OK(qmm_buffer_poison(ob));
        CHECK_OK(qmm_matmul(context, weights, xb, s.M, ob, &options, NULL));
        CHECK_OK(qmm_buffer_read(ob, outputs[t], s.M * s.N));
    }
    CHECK_OK(qmm_context_set_threads(context, 0));
    CHECK(memcmp(one, two, s.M * s.N * size) == 0, "%s: 1 and 2 threads give different bits", label);
    CHECK_OK(qmm_ref_dense_f64(&q.m, x, s.M, transpose ? 1 : 0, exact, abs_dot));
    double worst = 0.0;
    const size_t bad = check_against_oracle(label, two, f.dtype, exact, abs_dot, s.M * s.N, s.K, info->tolerance_slack,
                                            &worst);
    CHECK(bad == 0, "%s: %zu outputs outside the bound (worst error/bound %.3g)", label, bad, worst);
cleanup:
    qmm_buffer_destroy(xb);
    qmm_buffer_destroy(ob);
    qmm_weights_destroy(weights);
    check_qmatrix_free(&q);
    free(x);
    free(one);
    free(two);
    free(exact);
    free(abs_dot);
}

int main(void) {
    qmm_context *context = NULL;
    if (qmm_context_create(QMM_BACKEND_CPU, 0, &context) != QMM_OK) {
        printf("SKIPPED: %s\n", qmm_last_error());
        return check_finish("test_cpu");
    }
    /* qmm_t reads (M, N, K) as out M×N from K; qmm_n the same, with N quantized. */
    static const shape shapes[] = {
        {16, 1536, 576}, {16, 576, 1536}, {16, 192, 576}, /* the fixture's layers */
        {1, 3, 1536},    {5, 7, 576},     {1, 1, 64},     /* odd N, K = one group */
        {300, 100, 256}, {17, 64, 1536}, {100, 384, 300}, /* tiled items past their chunks */
    };
    static const format formats[] = {{4, 32, QMM_F16}, {8, 64, QMM_BF16}, {3, 64, QMM_F32}, {4, 128, QMM_F32}};
    check_rng rng = check_rng_make(600);
    for (size_t k = 0; k < qmm_kernel_count(context); k++) {
        qmm_kernel_info info;
        CHECK_OK(qmm_kernel_get(context, k, &info));
        if (strncmp(info.name, "cpu.", 4) != 0) continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) run_case(context, &info, &rng, shapes[s], formats[f]);
        printf("  %s\n", info.name);
    }
    qmm_context_destroy(context);
    return check_finish("test_cpu");
}
