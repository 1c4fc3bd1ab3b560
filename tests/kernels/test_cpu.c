/*
 * test_cpu.c — the CPU rows on the shapes the grid of test_kernels.c does not reach: the fixture's
 * (K = 576 and 1536, N up to 1536, M = 16), tiled work items that cross their chunk boundaries (N > 48,
 * M > 256 lanes), odd N (1, 3, 7), and the thread count: every row must give the same bits on 1 and on
 * 2 threads (each output is computed by one thread in one order), and agree with the f64 oracle within
 * the bound — a row of the oracle's order (the portable row) with the reference row bit for bit; the gather rows on MoE patterns large enough for their threads (run_gather_row). Skipped (with
 * the reason) when the CPU backend is not built. The bf16 GEMV row's guard on x (run_bf16_guard).
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
    if (info->batch_invariant_order && strcmp(info->batch_invariant_order, "oracle") == 0 && info->op == QMM_OP_QMM_T) {
        /* the oracle's order (the portable row): the reference row's bits, every output */
        qmm_matmul_options ref = {.op = QMM_OP_QMM_T, .kernel = "ref.qmm_t.scalar.r1"};
        CHECK_OK(qmm_buffer_poison(ob));
        CHECK_OK(qmm_matmul(context, weights, xb, s.M, ob, &ref, NULL));
        CHECK_OK(qmm_buffer_read(ob, one, s.M * s.N));
        CHECK(memcmp(one, two, s.M * s.N * size) == 0, "%s: not the bits of ref.qmm_t.scalar.r1", label);
    }
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

/* ───────────────────────────── gather rows ─────────────────────────────
 *
 * Shapes past the team threshold (B·N·K ≥ 2^20 multiply-adds), which the grid of test_kernels.c never
 * reaches: blocks on parallel threads (as many blocks as threads or more) and, with one block, one expert's
 * rows on the context's threads. Each pattern runs on 1 and 2 threads — same bits — and against the f64
 * oracle; the output is poisoned before every run and guarded past B·N. */
#define GATHER_EXPERTS 8
#define GATHER_MAX_PAIRS 96
#define GATHER_GUARD 16

typedef struct gather_pattern {
    const char *name;
    size_t T, B;
    uint32_t lhs[GATHER_MAX_PAIRS], rhs[GATHER_MAX_PAIRS];
    bool lhs_null;
} gather_pattern;

/* Each of T tokens to top_k distinct experts in token order (then stably sorted by expert when `sorted`). */
static gather_pattern routed(check_rng *rng, const char *name, size_t T, size_t top_k, bool sorted) {
    gather_pattern p = {.name = name, .T = T};
    uint32_t lhs[GATHER_MAX_PAIRS], rhs[GATHER_MAX_PAIRS];
    size_t B = 0;
    for (size_t t = 0; t < T; t++) {
        bool taken[GATHER_EXPERTS] = {false};
        for (size_t j = 0; j < top_k; j++) {
            uint32_t e = (uint32_t)(check_rng_next(rng) % GATHER_EXPERTS);
            while (taken[e]) e = (e + 1) % GATHER_EXPERTS;
            taken[e] = true;
            lhs[B] = (uint32_t)t;
            rhs[B++] = e;
        }
    }
    for (uint32_t e = 0; e < (sorted ? GATHER_EXPERTS : 1); e++)
        for (size_t i = 0; i < B; i++)
            if (!sorted || rhs[i] == e) {
                p.lhs[p.B] = lhs[i];
                p.rhs[p.B++] = rhs[i];
            }
    return p;
}

static void run_gather_case(qmm_context *context, const qmm_kernel_info *info, check_rng *rng, size_t N, size_t K,
                            format f, const gather_pattern *g) {
    if (K % (size_t)f.group_size != 0) return;
    char label[256];
    snprintf(label, sizeof label, "%s %s %d-bit gs%d E=%d N=%zu K=%zu T=%zu B=%zu (%s)", info->name,
             qmm_dtype_name(f.dtype), f.bits, f.group_size, GATHER_EXPERTS, N, K, g->T, g->B, g->name);
    check_qmatrix q;
    if (!check_qmatrix_random(rng, GATHER_EXPERTS * N, K, f.bits, f.group_size, f.dtype, &q)) {
        CHECK(false, "%s: out of memory", label);
        return;
    }
    const size_t size = qmm_dtype_size(f.dtype), B = g->B, T = g->T, outputs = B * N + GATHER_GUARD;
    const uint32_t *lhs = g->lhs_null ? NULL : g->lhs;
    qmm_weights *weights = NULL;
    qmm_buffer *xb = NULL, *ob = NULL;
    void *x = malloc(T * K * size), *one = malloc(outputs * size), *two = malloc(outputs * size);
    double *exact = malloc(B * N * sizeof(double)), *abs_dot = malloc(B * N * sizeof(double));
    if (!x || !one || !two || !exact || !abs_dot) {
        CHECK(false, "%s: out of memory", label);
        goto cleanup;
    }
    CHECK_OK(qmm_weights_create_experts(context, &q.m, GATHER_EXPERTS, &weights));
    check_fill_uniform(rng, x, f.dtype, T * K, -1.0f, 1.0f);
    CHECK_OK(qmm_buffer_create(context, f.dtype, T * K, &xb));
    CHECK_OK(qmm_buffer_create(context, f.dtype, outputs, &ob));
    if (!weights || !xb || !ob) goto cleanup;
    CHECK_OK(qmm_buffer_write(xb, x, T * K));
    qmm_gather_options options = {.kernel = info->name};
    void *results[2] = {one, two};
    for (int t = 0; t < 2; t++) {
        CHECK_OK(qmm_context_set_threads(context, t + 1));
        CHECK_OK(qmm_buffer_poison(ob));
        qmm_kernel_info ran = {0};
        CHECK_OK(qmm_gather_matmul(context, weights, xb, T, lhs, g->rhs, B, ob, &options, &ran));
        CHECK(ran.name && strcmp(ran.name, info->name) == 0, "%s: ran %s", label, ran.name ? ran.name : "?");
        CHECK_OK(qmm_buffer_read(ob, results[t], outputs));
    }
    CHECK_OK(qmm_context_set_threads(context, 0));
    CHECK(memcmp(one, two, B * N * size) == 0, "%s: 1 and 2 threads give different bits", label);
    size_t guard_written = 0;
    for (size_t i = B * N; i < outputs; i++) guard_written += !isnan(qmm_load_f32(two, f.dtype, i));
    CHECK(guard_written == 0, "%s: %zu elements written past B·N", label, guard_written);
    CHECK_OK(qmm_ref_gather_dense_f64(&q.m, GATHER_EXPERTS, x, T, lhs, g->rhs, B, exact, abs_dot));
    double worst = 0.0;
    const size_t bad = check_against_oracle(label, two, f.dtype, exact, abs_dot, B * N, K, info->tolerance_slack, &worst);
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

static void run_gather_row(qmm_context *context, const qmm_kernel_info *info, check_rng *rng) {
    static const format formats[] = {{4, 64, QMM_BF16}, {8, 32, QMM_F32}, {3, 128, QMM_F16}};
    gather_pattern patterns[6];
    size_t count = 0;
    patterns[count++] = routed(rng, "decode: 1 token to 8 experts", 1, 8, true);
    patterns[count++] = routed(rng, "8 tokens top-4, sorted by expert", 8, 4, true);
    patterns[count++] = routed(rng, "8 tokens top-4, token order", 8, 4, false);
    gather_pattern one_expert = {.name = "one expert, 40 rows (a tiled block on the context's threads)", .T = 40,
                                 .B = 40, .lhs_null = true};
    for (size_t i = 0; i < 40; i++) one_expert.rhs[i] = 5;
    patterns[count++] = one_expert;
    /* A tiled block beside GEMV blocks, rows gathered out of order with repeats (scratch per thread). */
    gather_pattern mixed = {.name = "a 33-row block and single rows, random lhs with repeats", .T = 12};
    for (size_t i = 0; i < 33; i++) mixed.rhs[mixed.B++] = 1;
    for (uint32_t e = 2; e < GATHER_EXPERTS; e++) mixed.rhs[mixed.B++] = e;
    for (size_t i = 0; i < mixed.B; i++) mixed.lhs[i] = (uint32_t)(check_rng_next(rng) % mixed.T);
    patterns[count++] = mixed;
    for (size_t p = 0; p < count; p++)
        for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
            run_gather_case(context, info, rng, 256, 1024, formats[f], &patterns[p]);
            static const size_t odd_n[] = {1, 3, 7};
            for (size_t n = 0; p == 0 && n < 3; n++) /* odd N, decode */
                run_gather_case(context, info, rng, odd_n[n], 1536, formats[f], &patterns[p]);
        }
}

/* ───────────────────────────── the bf16 rows' guard ─────────────────────────────
 *
 * cpu.qmm_t.gemv_bf16 and cpu.qmm_t.gemm_bf16 multiply with vdpbf16ps, which reads denormal inputs as 0, only when
 * every x is ±0, non-finite or ≥ 2^-118 in magnitude (simd_kernels.h, gemv_bf16_x_ok); a call with a smaller x runs
 * the f32 row of the same family instead (`table`), whose bits it must then give, and the oracle's value. The weights'
 * scales are 2^100 and their biases 0, so that denormal x (2^-133) give outputs near 2^-30 that a dot product
 * reading them as 0 would miss entirely. At the threshold itself (x of magnitude 2^-118 … 2^-110, where the dot
 * products' sums come closest to f32's denormals) the dot products run and the outputs must be within the bound.
 * `bits`: 4 (codes decoded in place) or 5 (unpacked to bytes: the GEMV's other decode). */
static void run_bf16_guard(qmm_context *context, check_rng *rng, const char *row, const char *table, size_t M, int bits) {
    const size_t N = 40, K = 512;
    check_qmatrix q;
    if (!check_qmatrix_random(rng, N, K, bits, 64, QMM_BF16, &q)) {
        CHECK(false, "bf16 guard: out of memory");
        return;
    }
    qmm_weights *weights = NULL, *big = NULL;
    qmm_buffer *xb = NULL, *ob = NULL;
    uint16_t *x = malloc(M * K * sizeof *x), *a = malloc(M * N * sizeof *a), *b = malloc(M * N * sizeof *b);
    double *exact = malloc(M * N * sizeof(double)), *abs_dot = malloc(M * N * sizeof(double));
    const char *why_not = NULL;
    CHECK_OK(qmm_weights_create(context, &q.m, &weights));
    CHECK_OK(qmm_buffer_create(context, QMM_BF16, M * K, &xb));
    CHECK_OK(qmm_buffer_create(context, QMM_BF16, M * N, &ob));
    if (!x || !a || !b || !exact || !abs_dot || !weights || !xb || !ob) {
        CHECK(false, "bf16 guard: out of memory");
        goto cleanup;
    }
    if (qmm_kernel_supports(context, row, weights, M, QMM_OP_QMM_T, &why_not) != 1) {
        printf("  %s guard: not run here: %s\n", row, why_not ? why_not : "?");
        goto cleanup;
    }
    /* 1: every x at the threshold: ±2^-118 … ±2^-110 (exponent fields 9 … 17, random mantissas), some exactly 2^-118,
     * on the ordinary weights */
    for (size_t i = 0; i < M * K; i++) {
        const uint32_t r = (uint32_t)check_rng_next(rng);
        x[i] = (uint16_t)(((r & 1u) << 15) | ((9u + (r >> 1) % 9u) << 7) | ((r >> 8) & 0x7Fu));
        if (i % 7 == 0) x[i] = (uint16_t)((x[i] & 0x8000u) | (9u << 7)); /* ±2^-118 */
    }
    CHECK_OK(qmm_buffer_write(xb, x, M * K));
    qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = row};
    CHECK_OK(qmm_buffer_poison(ob));
    CHECK_OK(qmm_matmul(context, weights, xb, M, ob, &options, NULL));
    CHECK_OK(qmm_buffer_read(ob, a, M * N));
    CHECK_OK(qmm_ref_dense_f64(&q.m, x, M, 1, exact, abs_dot));
    double worst = 0.0;
    size_t bad = check_against_oracle("bf16 guard, x at 2^-118", a, QMM_BF16, exact, abs_dot, M * N, K, 1.0, &worst);
    CHECK(bad == 0, "%s with every x at 2^-118 … 2^-110: %zu outputs outside the bound (worst error/bound %.3g)", row,
          bad, worst);
    /* 2: small x under scales of 2^100 (the matrix's own arrays, changed after the ordinary weights were made from
     * them): rows m % 3 = 0 x = 2^-119 (a normal under the threshold), the others denormals */
    for (size_t i = 0; i < N * K / 64; i++) {
        ((uint16_t *)q.scales)[i] = 0x7180; /* 2^100 */
        ((uint16_t *)q.biases)[i] = 0;
    }
    CHECK_OK(qmm_weights_create(context, &q.m, &big));
    memset(x, 0, M * K * sizeof *x);
    for (size_t k = 0; k < K; k++) {
        if (k % 2 == 0) x[k] = 0x0400;                                   /* 2^-119 */
        if (k % 5 == 0) x[K + k] = 0x0001;                               /* 2^-133 */
        if (k % 3 == 0) x[2 * K + k] = (uint16_t)(k % 2 ? 0x8003 : 0x0041); /* −3·2^-133, 65·2^-133 */
        for (size_t m = 3; m < M; m++) x[m * K + k] = x[(m % 3) * K + k];
    }
    CHECK_OK(qmm_buffer_write(xb, x, M * K));
    for (int t = 0; big && t < 2; t++) {
        options.kernel = t ? table : row;
        CHECK_OK(qmm_buffer_poison(ob));
        CHECK_OK(qmm_matmul(context, big, xb, M, ob, &options, NULL));
        CHECK_OK(qmm_buffer_read(ob, t ? b : a, M * N));
    }
    CHECK(memcmp(a, b, M * N * sizeof *a) == 0, "%s with x under 2^-118: not the bits of %s", row, table);
    CHECK_OK(qmm_ref_dense_f64(&q.m, x, M, 1, exact, abs_dot));
    bad = check_against_oracle("bf16 guard, x under 2^-118", a, QMM_BF16, exact, abs_dot, M * N, K, 1.0, &worst);
    CHECK(bad == 0, "%s with x under 2^-118: %zu outputs outside the bound (worst error/bound %.3g)", row, bad, worst);
    printf("  %s guard (%d-bit, M=%zu): checked\n", row, bits, M);
cleanup:
    qmm_buffer_destroy(xb);
    qmm_buffer_destroy(ob);
    qmm_weights_destroy(weights);
    qmm_weights_destroy(big);
    check_qmatrix_free(&q);
    free(x);
    free(a);
    free(b);
    free(exact);
    free(abs_dot);
}

/* src/cpu's unpacking of 2/3/5/6-bit codes (vpermb + vpmultishiftqb, pdep, their tails) against qmm_unpack_stream,
 * byte for byte, at every such width, counts around its steps of 8 and 64 codes and starts a few words into a row;
 * each stream is its own allocation of exactly the words qmm_unpack_stream reads, so an over-read is ASan's to see.
 * Weak: absent when the CPU backend is not built (src/cpu/cpu.h). */
bool qmm_cpu_unpack_codes_for_test(int isa, const uint32_t *in, size_t count, int bits, uint8_t *codes)
    __attribute__((weak));

static void test_unpack_codes(check_rng *rng) {
    if (!qmm_cpu_unpack_codes_for_test) {
        printf("  unpack_codes: SKIPPED: the CPU backend is not built\n");
        return;
    }
    static const size_t counts[] = {0, 1, 7, 8, 9, 31, 32, 63, 64, 65, 100, 127, 128, 129, 200, 576, 1000, 1536};
    static const int widths[] = {2, 3, 5, 6};
    static const struct { int isa; const char *name; } isas[] = {{1, "avx2"}, {2, "avx512"}}; /* QMM_CPU_ISA_* */
    for (size_t i = 0; i < 2; i++) {
        size_t cases = 0, bad = 0;
        bool ran = true;
        for (size_t w = 0; w < 4 && ran; w++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0] && ran; c++)
                for (size_t start = 0; start < 3 && ran; start++) {
                    const int bits = widths[w];
                    const size_t count = counts[c], words = start + (count * (size_t)bits + 31) / 32;
                    if (bits == 2 && count * 2 % 32 != 0) continue; /* qmm_unpack_stream: 2-bit in whole words */
                    uint32_t *stream = malloc(words ? words * 4 : 4);
                    uint8_t *want = malloc(count + 1), *got = malloc(count + 1);
                    for (size_t k = 0; k < words; k++) stream[k] = (uint32_t)check_rng_next(rng);
                    memset(got, 0xEE, count + 1);
                    want[count] = 0xEE;
                    qmm_unpack_stream(stream + start, count, bits, want);
                    ran = qmm_cpu_unpack_codes_for_test(isas[i].isa, stream + start, count, bits, got);
                    if (ran) {
                        cases++;
                        if (memcmp(want, got, count + 1) != 0) {
                            bad++;
                            if (bad <= 3)
                                CHECK(false, "unpack_codes %s: %d-bit count %zu start %zu differs from the reference",
                                      isas[i].name, bits, count, start);
                        }
                    }
                    free(stream);
                    free(want);
                    free(got);
                }
        if (ran)
            CHECK(bad == 0 && cases >= 3 * 3 * sizeof counts / sizeof counts[0], "unpack_codes %s: %zu of %zu differ",
                  isas[i].name, bad, cases);
        printf("  unpack_codes %s: %s\n", isas[i].name, ran ? "checked" : "not usable here");
    }
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
        {3, 21, 160},                                     /* K an odd number of 32s: a half chunk of 64 codes */
        {50, 40, 576},    {64, 24, 1024},                 /* the bf16 GEMV row's passes up to its M = 64 */
    };
    static const format formats[] = {{4, 32, QMM_F16}, {8, 64, QMM_BF16}, {3, 64, QMM_F32}, {4, 128, QMM_F32},
                                     {2, 32, QMM_BF16}, {4, 32, QMM_BF16}, {4, 64, QMM_BF16}};
    check_rng rng = check_rng_make(600);
    test_unpack_codes(&rng);
    for (size_t k = 0; k < qmm_kernel_count(context); k++) {
        qmm_kernel_info info;
        CHECK_OK(qmm_kernel_get(context, k, &info));
        if (strncmp(info.name, "cpu.", 4) != 0) continue;
        if (info.op == QMM_OP_GATHER) { /* no qmm_kernel_supports form: ask whether the row can run here */
            const char *why_not = NULL;
            if (qmm_kernel_usable(context, k, &why_not) == 1) run_gather_row(context, &info, &rng);
            printf("  %s%s%s\n", info.name, why_not && why_not[0] ? ": not usable here: " : "", why_not ? why_not : "");
            continue;
        }
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) run_case(context, &info, &rng, shapes[s], formats[f]);
        printf("  %s\n", info.name);
    }
    run_bf16_guard(context, &rng, "cpu.qmm_t.gemv_bf16.r8.avx512bf16", "cpu.qmm_t.gemv.r8.avx512", 3, 4);
    run_bf16_guard(context, &rng, "cpu.qmm_t.gemv_bf16.r8.avx512bf16", "cpu.qmm_t.gemv.r8.avx512", 3, 5);
    run_bf16_guard(context, &rng, "cpu.qmm_t.gemv_bf16.r8.avx512bf16", "cpu.qmm_t.gemm.m32n12.avx512", 40, 4);
    run_bf16_guard(context, &rng, "cpu.qmm_t.gemm_bf16.m32n12.avx512bf16", "cpu.qmm_t.gemm.m32n12.avx512", 37, 4);
    qmm_context_destroy(context);
    return check_finish("test_cpu");
}
