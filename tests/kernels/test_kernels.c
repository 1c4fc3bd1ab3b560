/*
 * test_kernels.c — the kernel harness (DESIGN.md §5, docs/kernels.md "Harness").
 *
 * For every backend that can be created here (the others print "SKIPPED: <reason>") and every row of
 * its kernel table, a grid of cases derived from the row's own tile runs through the public API with
 * the row forced by name:
 *   M               {1, BM−1, BM, BM+1, 2·BM+1}                             (deduplicated, ≥ 1)
 *   free dimension  {1, 7, T−1, T, T+1, 2·T+1}     T = BN for qmm_t (N), BK for qmm_n (K)
 *   quantized dim   {gs, L−gs, L, L+gs, 2·L+gs} ∪ {576 or 640}, L = lcm(tile, gs), a multiple of gs
 *                   (K for qmm_t, N for qmm_n; 576 = 9·64 is SmolLM2's hidden size, 640 = 5·128)
 *   × every bits {2,3,4,5,6,8} × group_size {32,64,128} × dtype {f32,f16,bf16}
 * Inputs are fresh random each run (the seed is printed on failure). The output buffer is M·N plus a
 * guard of GUARD elements, poisoned with NaN before each run: an unwritten output fails the oracle
 * check, a write past M·N fails the guard check. Each output is compared with qmm_ref_dense_f64
 * within qmm_error_bound × the row's tolerance_slack. A row that runs zero cases fails. Under
 * AddressSanitizer each (bits, group_size) runs one rotating dtype (see SANITIZED_BUILD).
 *
 * Gather rows (op gather, MLX gather_qmm) run through qmm_gather_matmul on EXPERTS stacked experts of
 * N×K (N over the free values of BN, K over the quantized values of BK, every format) with index patterns
 * (gather_patterns below): expert blocks of sizes {1, BM−1, BM, BM+1, 2·BM+1} sorted by expert with two
 * experts never used, with random lhs and with lhs NULL; the same pairs unsorted; B = 1; MoE top-k routing
 * (every token to GATHER_TOP_K distinct experts) in token order and sorted by expert. x has more rows than
 * are used and rows used twice. Outputs are poisoned with a guard as above and compared with
 * qmm_ref_gather_dense_f64; a forced row that answers QMM_ERR_UNSUPPORTED counts as not supported.
 *
 * QMM_TEST_REDUCED=1 runs a reduced grid (bits 3, 4, 8; group 32 and 128; the first three values of each
 * dimension) for slow runs such as compute-sanitizer; QMM_TEST_BACKEND=NAME runs one backend only.
 */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Under AddressSanitizer (the -O0 `make test-asan` run) the full grid of every CPU row takes minutes.
 * There each (bits, group_size) pair runs one dtype, rotating so that every dtype meets every bits
 * value and every group size: every decode path and conversion is still exercised for memory safety,
 * with a third of the cases. The plain build runs the full grid. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED_BUILD 1
#endif
#endif

#define GUARD 16
#define MAX_VALUES 12

typedef struct value_set {
    size_t values[MAX_VALUES];
    size_t count;
} value_set;

static void set_add(value_set *set, size_t value, size_t multiple_of) {
    if (value == 0 || value % multiple_of != 0 || set->count == MAX_VALUES) return;
    for (size_t i = 0; i < set->count; i++)
        if (set->values[i] == value) return;
    set->values[set->count++] = value;
}

static size_t gcd(size_t a, size_t b) {
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The tile of a row along a dimension; 0 or negative means "no tile" and counts as 1. */
static size_t tile_of(int tile) { return tile > 0 ? (size_t)tile : 1; }

static value_set m_values(const qmm_kernel_info *info) {
    const size_t bm = tile_of(info->bm);
    value_set set = {{0}, 0};
    set_add(&set, 1, 1);
    set_add(&set, 2, 1); /* the CPU GEMV's nibble-plane path runs M ≤ 2 (docs/kernels.md §8) */
    set_add(&set, bm - 1, 1);
    set_add(&set, bm, 1);
    set_add(&set, bm + 1, 1);
    set_add(&set, 2 * bm + 1, 1);
    return set;
}

static value_set free_values(size_t tile) {
    value_set set = {{0}, 0};
    set_add(&set, 1, 1);
    set_add(&set, 7, 1);
    set_add(&set, tile - 1, 1);
    set_add(&set, tile, 1);
    set_add(&set, tile + 1, 1);
    set_add(&set, 2 * tile + 1, 1);
    return set;
}

/* long_k: also a K past 1536, the fixture's (the GEMV rows only: the scalar rows would take long at that K). */
static value_set quantized_values(size_t tile, size_t group_size, bool long_k) {
    const size_t lcm = tile / gcd(tile, group_size) * group_size;
    value_set set = {{0}, 0};
    set_add(&set, group_size, group_size);
    set_add(&set, lcm - group_size, group_size);
    set_add(&set, lcm, group_size);
    set_add(&set, lcm + group_size, group_size);
    set_add(&set, 2 * lcm + group_size, group_size);
    set_add(&set, 576, group_size); /* not a power of two, and a real model's K (SmolLM2-135M) */
    set_add(&set, 640, group_size); /* the same for group_size 128, where 576 is not a multiple */
    if (long_k) set_add(&set, 1536 + group_size, group_size); /* the fixture's K and more: a long walk along K */
    return set;
}

typedef struct kernel_tally {
    size_t ran;
    size_t not_supported;
    size_t failed;
    double worst;
    char first_refusal[600];
} kernel_tally;

/* One weight matrix (rows × cols, format) against every M of the grid. tiny_x: x uniform in [-1e-37, 1e-37) instead
 * (f32 and bf16 hold it): below 2^-102, where x·16^-j would round, so the CPU GEMV's nibble-plane path must take the
 * table decode (docs/kernels.md §8), and the CUDA tensor-core rows' scaled parts must stay exact (§9.7, §9.8); with
 * every x that small the bound is small too, and the rounding shows. */
static void run_matrix(qmm_context *context, const qmm_kernel_info *info, check_rng *rng, size_t N, size_t K,
                       int bits, int group_size, qmm_dtype dtype, const value_set *ms, kernel_tally *tally,
                       bool tiny_x) {
    const bool transpose = info->op == QMM_OP_QMM_T;
    check_qmatrix q;
    if (!check_qmatrix_random(rng, transpose ? N : K, transpose ? K : N, bits, group_size, dtype, &q)) {
        CHECK(false, "out of memory for a %zu×%zu matrix", N, K);
        return;
    }
    qmm_weights *weights = NULL;
    CHECK_OK(qmm_weights_create(context, &q.m, &weights));
    const size_t size = qmm_dtype_size(dtype);
    for (size_t mi = 0; weights && mi < ms->count; mi++) {
        const size_t M = ms->values[mi];
        char label[192];
        snprintf(label, sizeof label, "%s %s %d-bit gs%d M=%zu N=%zu K=%zu%s", info->name, qmm_dtype_name(dtype), bits,
                 group_size, M, N, K, tiny_x ? " (tiny x)" : "");
        const char *why_not = NULL;
        int supported = qmm_kernel_supports(context, info->name, weights, M, info->op, &why_not);
        CHECK(supported >= 0, "%s: qmm_kernel_supports failed: %s", label, qmm_last_error());
        if (supported != 1) {
            if (tally->not_supported++ == 0 && why_not)
                snprintf(tally->first_refusal, sizeof tally->first_refusal, "%s: %s", label, why_not);
            continue;
        }
        void *x = malloc(M * K * size), *out = malloc((M * N + GUARD) * size);
        double *exact = malloc(M * N * sizeof(double)), *abs_dot = malloc(M * N * sizeof(double));
        qmm_buffer *xb = NULL, *ob = NULL;
        if (!x || !out || !exact || !abs_dot) {
            CHECK(false, "%s: out of memory", label);
            goto next;
        }
        check_fill_uniform(rng, x, dtype, M * K, -1.0f, 1.0f);
        if (tiny_x)
            for (size_t i = 0; i < M * K; i++) qmm_store_f32(x, dtype, i, qmm_load_f32(x, dtype, i) * 1e-37f);
        CHECK_OK(qmm_buffer_create(context, dtype, M * K, &xb));
        CHECK_OK(qmm_buffer_create(context, dtype, M * N + GUARD, &ob));
        if (!xb || !ob) goto next;
        CHECK_OK(qmm_buffer_write(xb, x, M * K));
        CHECK_OK(qmm_buffer_poison(ob));
        qmm_matmul_options options = {.op = info->op, .kernel = info->name};
        qmm_kernel_info ran = {0};
        qmm_status status = qmm_matmul(context, weights, xb, M, ob, &options, &ran);
        CHECK(status == QMM_OK, "%s: matmul -> %s: %s", label, qmm_status_string(status), qmm_last_error());
        if (status != QMM_OK) {
            tally->failed++;
            goto next;
        }
        CHECK(ran.name && strcmp(ran.name, info->name) == 0, "%s: ran %s instead", label, ran.name ? ran.name : "?");
        CHECK_OK(qmm_buffer_read(ob, out, M * N + GUARD));
        CHECK_OK(qmm_ref_dense_f64(&q.m, x, M, transpose ? 1 : 0, exact, abs_dot));
        double worst = 0.0;
        size_t bad = check_against_oracle(label, out, dtype, exact, abs_dot, M * N, K, info->tolerance_slack, &worst);
        size_t guard_written = 0;
        for (size_t i = M * N; i < M * N + GUARD; i++) guard_written += !isnan(qmm_load_f32(out, dtype, i));
        CHECK(bad == 0, "%s: %zu of %zu outputs outside the bound (worst error/bound %.3g)", label, bad, M * N, worst);
        CHECK(guard_written == 0, "%s: %zu elements written past M·N", label, guard_written);
        if (bad || guard_written) tally->failed++;
        if (worst > tally->worst) tally->worst = worst;
        tally->ran++;
    next:
        qmm_buffer_destroy(xb);
        qmm_buffer_destroy(ob);
        free(x);
        free(out);
        free(exact);
        free(abs_dot);
    }
    qmm_weights_destroy(weights);
    check_qmatrix_free(&q);
}

/* ───────────────────────────── gather ───────────────────────────── */

#define EXPERTS 6
#define GATHER_TOP_K 2
#define MAX_PAIRS 64

typedef struct gather_case {
    const char *name;
    size_t B, T;
    uint32_t lhs[MAX_PAIRS], rhs[MAX_PAIRS];
    bool lhs_null;
    bool sorted; /* rhs_indices non-decreasing: passed as the sorted_indices promise */
} gather_case;

/* The index patterns of one matrix (see the header). ms: the M values of the row's tile = block sizes. */
static size_t gather_patterns(check_rng *rng, const value_set *ms, gather_case *cases) {
    static const uint32_t used[] = {1, 3, 4, 5}; /* experts 0 and 2 are never used by the sorted patterns */
    size_t count = 0;
    gather_case sorted = {.name = "sorted by expert, random lhs", .sorted = true};
    for (size_t j = 0; j < 4; j++)
        for (size_t r = 0; r < ms->values[j % ms->count] && sorted.B < MAX_PAIRS; r++) sorted.rhs[sorted.B++] = used[j];
    sorted.T = sorted.B + 3; /* rows of x no pair uses */
    for (size_t i = 0; i < sorted.B; i++) sorted.lhs[i] = (uint32_t)(check_rng_next(rng) % (sorted.T - 1)); /* repeats */
    cases[count++] = sorted;

    gather_case identity = sorted;
    identity.name = "sorted by expert, lhs NULL (row i)";
    identity.lhs_null = true;
    identity.T = identity.B;
    cases[count++] = identity;

    gather_case unsorted = sorted;
    unsorted.name = "unsorted, random experts";
    unsorted.sorted = false;
    for (size_t i = 0; i < unsorted.B; i++) unsorted.rhs[i] = (uint32_t)(check_rng_next(rng) % EXPERTS);
    if (unsorted.B > 1 && unsorted.rhs[0] <= unsorted.rhs[1]) { /* make sure it is out of order */
        unsorted.rhs[0] = EXPERTS - 1;
        unsorted.rhs[1] = 0;
    }
    cases[count++] = unsorted;

    gather_case single = {.name = "B=1", .B = 1, .T = 3, .sorted = true};
    single.lhs[0] = (uint32_t)(check_rng_next(rng) % single.T);
    single.rhs[0] = (uint32_t)(check_rng_next(rng) % EXPERTS);
    cases[count++] = single;

    /* MoE routing: each of T tokens to GATHER_TOP_K distinct experts, in token order, then sorted by expert
     * (stable, as a router's argsort): lhs ascends inside each expert block but skips rows. */
    gather_case routed = {.name = "top-k routing, token order", .T = ms->values[ms->count - 1] + 2};
    for (size_t t = 0; t < routed.T && routed.B + GATHER_TOP_K <= MAX_PAIRS; t++) {
        uint32_t first = (uint32_t)(check_rng_next(rng) % EXPERTS);
        uint32_t second = (first + 1 + (uint32_t)(check_rng_next(rng) % (EXPERTS - 1))) % EXPERTS;
        routed.lhs[routed.B] = (uint32_t)t;
        routed.rhs[routed.B++] = first;
        routed.lhs[routed.B] = (uint32_t)t;
        routed.rhs[routed.B++] = second;
    }
    cases[count++] = routed;
    gather_case by_expert = {.name = "top-k routing, sorted by expert", .T = routed.T, .sorted = true};
    for (uint32_t e = 0; e < EXPERTS; e++)
        for (size_t i = 0; i < routed.B; i++)
            if (routed.rhs[i] == e) {
                by_expert.lhs[by_expert.B] = routed.lhs[i];
                by_expert.rhs[by_expert.B++] = e;
            }
    cases[count++] = by_expert;
    return count;
}

static void run_gather_matrix(qmm_context *context, const qmm_kernel_info *info, check_rng *rng, size_t N, size_t K,
                              int bits, int group_size, qmm_dtype dtype, const value_set *ms, kernel_tally *tally) {
    check_qmatrix q;
    if (!check_qmatrix_random(rng, EXPERTS * N, K, bits, group_size, dtype, &q)) {
        CHECK(false, "out of memory for %d experts of %zu×%zu", EXPERTS, N, K);
        return;
    }
    qmm_weights *weights = NULL;
    CHECK_OK(qmm_weights_create_experts(context, &q.m, EXPERTS, &weights));
    gather_case cases[8];
    const size_t case_count = weights ? gather_patterns(rng, ms, cases) : 0;
    const size_t size = qmm_dtype_size(dtype);
    for (size_t c = 0; c < case_count; c++) {
        const gather_case *g = &cases[c];
        const size_t B = g->B, T = g->T;
        char label[256];
        snprintf(label, sizeof label, "%s %s %d-bit gs%d E=%d N=%zu K=%zu T=%zu B=%zu (%s)", info->name,
                 qmm_dtype_name(dtype), bits, group_size, EXPERTS, N, K, T, B, g->name);
        void *x = malloc(T * K * size), *out = malloc((B * N + GUARD) * size);
        double *exact = malloc(B * N * sizeof(double)), *abs_dot = malloc(B * N * sizeof(double));
        qmm_buffer *xb = NULL, *ob = NULL;
        const uint32_t *lhs = g->lhs_null ? NULL : g->lhs;
        if (!x || !out || !exact || !abs_dot) {
            CHECK(false, "%s: out of memory", label);
            goto next;
        }
        check_fill_uniform(rng, x, dtype, T * K, -1.0f, 1.0f);
        CHECK_OK(qmm_buffer_create(context, dtype, T * K, &xb));
        CHECK_OK(qmm_buffer_create(context, dtype, B * N + GUARD, &ob));
        if (!xb || !ob) goto next;
        CHECK_OK(qmm_buffer_write(xb, x, T * K));
        CHECK_OK(qmm_buffer_poison(ob));
        qmm_gather_options options = {.kernel = info->name, .sorted_indices = g->sorted};
        qmm_kernel_info ran = {0};
        qmm_status status = qmm_gather_matmul(context, weights, xb, T, lhs, g->rhs, B, ob, &options, &ran);
        if (status == QMM_ERR_UNSUPPORTED) {
            if (tally->not_supported++ == 0)
                snprintf(tally->first_refusal, sizeof tally->first_refusal, "%.250s: %.340s", label, qmm_last_error());
            goto next;
        }
        CHECK(status == QMM_OK, "%s: gather -> %s: %s", label, qmm_status_string(status), qmm_last_error());
        if (status != QMM_OK) {
            tally->failed++;
            goto next;
        }
        CHECK(ran.name && strcmp(ran.name, info->name) == 0, "%s: ran %s instead", label, ran.name ? ran.name : "?");
        CHECK_OK(qmm_buffer_read(ob, out, B * N + GUARD));
        CHECK_OK(qmm_ref_gather_dense_f64(&q.m, EXPERTS, x, T, lhs, g->rhs, B, exact, abs_dot));
        double worst = 0.0;
        size_t bad = check_against_oracle(label, out, dtype, exact, abs_dot, B * N, K, info->tolerance_slack, &worst);
        size_t guard_written = 0;
        for (size_t i = B * N; i < B * N + GUARD; i++) guard_written += !isnan(qmm_load_f32(out, dtype, i));
        CHECK(bad == 0, "%s: %zu of %zu outputs outside the bound (worst error/bound %.3g)", label, bad, B * N, worst);
        CHECK(guard_written == 0, "%s: %zu elements written past B·N", label, guard_written);
        if (bad || guard_written) tally->failed++;
        if (worst > tally->worst) tally->worst = worst;
        tally->ran++;
    next:
        qmm_buffer_destroy(xb);
        qmm_buffer_destroy(ob);
        free(x);
        free(out);
        free(exact);
        free(abs_dot);
    }
    qmm_weights_destroy(weights);
    check_qmatrix_free(&q);
}

/* ───────────────────────────── the non-finite pass ─────────────────────────────
 *
 * The non-finite rule (docs/kernels.md §2) for every row: a few cases per row, per dtype, per format, with
 * inputs built so that the f32 accumulator is ±inf or NaN — through an infinite or NaN input, or through a
 * partial sum that overflows where the exact product is finite — and judged, like the grid, by
 * qmm_output_check against qmm_ref_dense_f64 (plain IEEE f64 sums: ±inf and NaN inputs give the IEEE value
 * of the product, huge finite ones cannot overflow f64), with poisoned outputs and a guard. Kinds:
 *   NF_INF_NAN  random ŵ, x in [-1, 1) with per row: one +inf; +inf and −inf; a NaN; −inf among huge values
 *   NF_OVERFLOW ŵ = 1 everywhere, x rows [H, H, −H, 0, …] (one group) or H, H, −H spread over K (split groups
 *               finite, their sum not): every f32 order overflows a partial sum, the product is H
 *   NF_CANCEL   ŵ = qmax (+ ½), x rows [h, −h, 0, …] with ŵ·h beyond f32: the product is 0 (or small)
 *   NF_HUGE     random codes, scales up to vmax/1000, biases up to vmax/10, x in [-1, 1): sums overflow and
 *               cancel at random; exact values both inside and beyond the range (±inf is then right)
 * H, h, the scale and bias ranges are fractions of the dtype's largest value vmax, so f16 and bf16 exercise
 * the same patterns (for f16 they overflow only the narrowing). */
enum { NF_INF_NAN, NF_OVERFLOW, NF_CANCEL, NF_HUGE, NF_KINDS };
static const char *const nf_kind_names[NF_KINDS] = {"inf/NaN in x", "overflowing partial sums",
                                                    "cancelling overflow", "huge scales and biases"};

static double dtype_max(qmm_dtype dtype) {
    return dtype == QMM_F16 ? 65504.0 : dtype == QMM_BF16 ? 0x1.fep127 : 0x1.fffffep127;
}

/* Sets every code of a packed row-major matrix (rows × cols) to `code`. */
static void nf_set_codes(uint32_t *w, size_t rows, size_t cols, int bits, uint32_t code) {
    const size_t words = rows * cols * (size_t)bits / 32;
    memset(w, 0, words * sizeof(uint32_t));
    for (size_t j = 0; j < rows * cols; j++) {
        const size_t bit = j * (size_t)bits;
        w[bit / 32] |= code << (bit % 32);
        if (bit % 32 + (size_t)bits > 32) w[bit / 32 + 1] |= code >> (32 - bit % 32);
    }
}

static void nf_set_affine(const check_qmatrix *q, size_t groups, qmm_dtype dtype, float s, float b) {
    for (size_t g = 0; g < groups; g++) {
        qmm_store_f32(q->scales, dtype, g, s);
        qmm_store_f32(q->biases, dtype, g, b);
    }
}

/* The inputs of one case: the matrix (rows × cols of the op) and x [M, K]. variant rotates the patterns. */
static void nf_fill(check_rng *rng, int kind, unsigned variant, check_qmatrix *q, void *x, size_t M, size_t K,
                    qmm_dtype dtype) {
    const size_t rows = q->m.rows, cols = q->m.cols, groups = rows * (cols / (size_t)q->m.group_size);
    const uint32_t qmax = (1u << q->m.bits) - 1u;
    const double vmax = dtype_max(dtype);
    const float H = (float)(0.88 * vmax), h = (float)(0.3 * vmax);
    const size_t k_mid = K / 2, k_last = K - 1;
    memset(x, 0, M * K * qmm_dtype_size(dtype));
    switch (kind) {
    case NF_INF_NAN:
        check_fill_uniform(rng, x, dtype, M * K, -1.0f, 1.0f);
        for (size_t m = 0; m < M; m++) {
            const size_t k1 = check_rng_next(rng) % K, k2 = check_rng_next(rng) % K;
            switch ((m + variant) % 4) {
            case 0: qmm_store_f32(x, dtype, m * K + k1, INFINITY); break;
            case 1:
                qmm_store_f32(x, dtype, m * K + k1, INFINITY);
                qmm_store_f32(x, dtype, m * K + (k1 == k2 ? (k1 + 1) % K : k2), -INFINITY);
                break;
            case 2: qmm_store_f32(x, dtype, m * K + k1, NAN); break;
            default:
                for (size_t k = 0; k < K; k += 3) qmm_store_f32(x, dtype, m * K + k, (k & 1) ? -H : H);
                qmm_store_f32(x, dtype, m * K + k1, -INFINITY);
                break;
            }
        }
        return;
    case NF_OVERFLOW:
        /* ŵ = 1 three ways: s = 1, q = 1, b = 0; s = 0 (random codes: s·Σq·x is 0·inf), b = 1; s = ½, q = 1, b = ½. */
        if (variant % 3 == 1) nf_set_affine(q, groups, dtype, 0.0f, 1.0f);
        else {
            nf_set_codes(q->w, rows, cols, q->m.bits, 1);
            nf_set_affine(q, groups, dtype, variant % 3 == 0 ? 1.0f : 0.5f, variant % 3 == 0 ? 0.0f : 0.5f);
        }
        for (size_t m = 0; m < M; m++) {
            const size_t at[2][3] = {{0, 1 % K, 2 % K}, {0, k_mid, k_last}};
            const size_t *k = at[(m + variant) % 2];
            if (K < 3) { /* too short for three values: H, H (the product overflows: ±inf is right) */
                for (size_t i = 0; i < K; i++) qmm_store_f32(x, dtype, m * K + i, H);
                continue;
            }
            qmm_store_f32(x, dtype, m * K + k[0], H);
            qmm_store_f32(x, dtype, m * K + k[1], H);
            qmm_store_f32(x, dtype, m * K + k[2], -H);
        }
        return;
    case NF_CANCEL:
        nf_set_codes(q->w, rows, cols, q->m.bits, qmax);
        nf_set_affine(q, groups, dtype, 1.0f, variant % 2 ? 0.5f : 0.0f);
        for (size_t m = 0; m < M; m++) {
            if (K < 2) {
                qmm_store_f32(x, dtype, m * K, (m + variant) % 2 ? h : -h);
                continue;
            }
            const size_t k1 = (m + variant) % 2 ? 0 : k_mid, k2 = (m + variant) % 2 ? 1 : k_last;
            qmm_store_f32(x, dtype, m * K + k1, h);
            qmm_store_f32(x, dtype, m * K + k2, -h);
            if (K > 2 && m % 3 == 2) qmm_store_f32(x, dtype, m * K + (k2 + 1) % K == k1 ? 2 : (k2 + 1) % K, 0.75f);
        }
        return;
    default: /* NF_HUGE */
        for (size_t g = 0; g < groups; g++) {
            qmm_store_f32(q->scales, dtype, g, check_rng_uniform(rng, -1.0f, 1.0f) * (float)(vmax / 1000.0));
            qmm_store_f32(q->biases, dtype, g, check_rng_uniform(rng, -1.0f, 1.0f) * (float)(vmax / 10.0));
        }
        check_fill_uniform(rng, x, dtype, M * K, -1.0f, 1.0f);
        return;
    }
}

typedef struct nf_tally {
    size_t ran, failed, not_supported;
    size_t outputs, exact_nonfinite, exact_beyond, exact_finite;
    char first_refusal[600];
} nf_tally;

#define NF_EXPERTS 2

/* One case: returns false when the row does not take this shape (nothing ran). */
static bool nf_case(qmm_context *context, const qmm_kernel_info *info, check_rng *rng, int kind, unsigned variant,
                    size_t M, size_t N, size_t K, int bits, int group_size, qmm_dtype dtype, nf_tally *tally) {
    const bool gather = info->op == QMM_OP_GATHER, transpose = info->op != QMM_OP_QMM_N;
    const size_t experts = gather ? NF_EXPERTS : 1;
    char label[256];
    snprintf(label, sizeof label, "%s %s %d-bit gs%d M=%zu N=%zu K=%zu non-finite: %s (variant %u)", info->name,
             qmm_dtype_name(dtype), bits, group_size, M, N, K, nf_kind_names[kind], variant);
    check_qmatrix q;
    if (!check_qmatrix_random(rng, transpose ? experts * N : K, transpose ? K : N, bits, group_size, dtype, &q)) {
        CHECK(false, "%s: out of memory", label);
        return true;
    }
    const size_t size = qmm_dtype_size(dtype);
    void *x = malloc(M * K * size), *out = malloc((M * N + GUARD) * size);
    double *exact = malloc(M * N * sizeof(double)), *abs_dot = malloc(M * N * sizeof(double));
    uint32_t rhs[64];
    qmm_weights *weights = NULL;
    qmm_buffer *xb = NULL, *ob = NULL;
    bool supported = true;
    if (!x || !out || !exact || !abs_dot || M > 64) {
        CHECK(false, "%s: out of memory", label);
        goto done;
    }
    nf_fill(rng, kind, variant, &q, x, M, K, dtype);
    for (size_t i = 0; i < M; i++) rhs[i] = (uint32_t)(i % experts);
    if (gather) CHECK_OK(qmm_weights_create_experts(context, &q.m, experts, &weights));
    else CHECK_OK(qmm_weights_create(context, &q.m, &weights));
    if (!weights) goto done;
    if (!gather) {
        const char *why_not = NULL;
        int accepts = qmm_kernel_supports(context, info->name, weights, M, info->op, &why_not);
        CHECK(accepts >= 0, "%s: qmm_kernel_supports failed: %s", label, qmm_last_error());
        if (accepts != 1) {
            if (tally->not_supported++ == 0 && why_not)
                snprintf(tally->first_refusal, sizeof tally->first_refusal, "%.250s: %.340s", label, why_not);
            supported = false;
            goto done;
        }
    }
    CHECK_OK(qmm_buffer_create(context, dtype, M * K, &xb));
    CHECK_OK(qmm_buffer_create(context, dtype, M * N + GUARD, &ob));
    if (!xb || !ob) goto done;
    CHECK_OK(qmm_buffer_write(xb, x, M * K));
    CHECK_OK(qmm_buffer_poison(ob));
    qmm_kernel_info ran = {0};
    qmm_status status;
    if (gather) {
        qmm_gather_options options = {.kernel = info->name};
        status = qmm_gather_matmul(context, weights, xb, M, NULL, rhs, M, ob, &options, &ran);
        if (status == QMM_ERR_UNSUPPORTED) {
            if (tally->not_supported++ == 0)
                snprintf(tally->first_refusal, sizeof tally->first_refusal, "%.250s: %.340s", label, qmm_last_error());
            supported = false;
            goto done;
        }
    } else {
        qmm_matmul_options options = {.op = info->op, .kernel = info->name};
        status = qmm_matmul(context, weights, xb, M, ob, &options, &ran);
    }
    CHECK(status == QMM_OK, "%s: -> %s: %s", label, qmm_status_string(status), qmm_last_error());
    if (status != QMM_OK) {
        tally->failed++;
        goto done;
    }
    CHECK_OK(qmm_buffer_read(ob, out, M * N + GUARD));
    if (gather) CHECK_OK(qmm_ref_gather_dense_f64(&q.m, experts, x, M, NULL, rhs, M, exact, abs_dot));
    else CHECK_OK(qmm_ref_dense_f64(&q.m, x, M, transpose ? 1 : 0, exact, abs_dot));
    for (size_t i = 0; i < M * N; i++) {
        if (!isfinite(exact[i])) tally->exact_nonfinite++;
        else if (fabs(exact[i]) >= dtype_max(dtype)) tally->exact_beyond++;
        else tally->exact_finite++;
    }
    tally->outputs += M * N;
    size_t bad = check_against_oracle(label, out, dtype, exact, abs_dot, M * N, K, info->tolerance_slack, NULL);
    size_t guard_written = 0;
    for (size_t i = M * N; i < M * N + GUARD; i++) guard_written += !isnan(qmm_load_f32(out, dtype, i));
    CHECK(bad == 0, "%s: %zu of %zu outputs wrong", label, bad, M * N);
    CHECK(guard_written == 0, "%s: %zu elements written past M·N", label, guard_written);
    if (bad || guard_written) tally->failed++;
    tally->ran++;
done:
    qmm_buffer_destroy(xb);
    qmm_buffer_destroy(ob);
    qmm_weights_destroy(weights);
    free(x);
    free(out);
    free(exact);
    free(abs_dot);
    check_qmatrix_free(&q);
    return supported;
}

/* Every kind, dtype and a few formats on the first shape of the row's grid that it takes, preferring
 * several groups along the quantized dimension and a tail along the free one, for M = 1 and for
 * the largest M of its grid (up to 64) that it takes. */
static void run_nonfinite(qmm_context *context, const qmm_kernel_info *info, check_rng *rng) {
    static const int formats[][2] = {{4, 32}, {8, 64}, {3, 128}};
    static const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    const bool transpose = info->op != QMM_OP_QMM_N;
    const size_t free_tile = tile_of(transpose ? info->bn : info->bk);
    const size_t quantized_tile = tile_of(transpose ? info->bk : info->bn);
    /* M = 1, then the grid's other M values, largest first: the first of those the row takes. */
    const value_set ms = m_values(info);
    size_t m_list[MAX_VALUES + 1] = {1}, m_count = 1;
    for (size_t i = ms.count; i-- > 0;)
        if (ms.values[i] > 1 && ms.values[i] <= 64) m_list[m_count++] = ms.values[i];
    const size_t free_order[] = {free_tile + 1, free_tile, 7, 1};
    nf_tally tally = {0};
    unsigned variant = 0;
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        const size_t gs = (size_t)formats[f][1], L = quantized_tile / gcd(quantized_tile, gs) * gs;
        const size_t quantized_order[] = {2 * L + gs, L + gs, gs == 128 ? 640 : 576, L, gs};
        bool large_done = false;
        for (size_t mi = 0; mi < m_count && !large_done; mi++) {
            bool done = false;
            for (size_t qi = 0; qi < 5 && !done; qi++)
                for (size_t fi = 0; fi < 4 && !done; fi++)
                    for (size_t pd = 0; pd < 3 && !done; pd++) { /* a row may take only some dtypes (mma: f16/bf16) */
                    const size_t N = transpose ? free_order[fi] : quantized_order[qi];
                    const size_t K = transpose ? quantized_order[qi] : free_order[fi];
                    if (!nf_case(context, info, rng, NF_INF_NAN, variant, m_list[mi], N, K, formats[f][0], (int)gs,
                                 dtypes[pd], &tally))
                        continue; /* this shape or dtype is not the row's: the next one */
                    done = true;
                    for (size_t d = 0; d < 3; d++)
                        for (int kind = 0; kind < NF_KINDS; kind++)
                            for (unsigned v = 0; v < 2; v++) {
                                if (d == pd && kind == NF_INF_NAN && v == 0) continue; /* ran above */
                                nf_case(context, info, rng, kind, variant + v, m_list[mi], N, K, formats[f][0],
                                        (int)gs, dtypes[d], &tally);
                            }
                    variant += 2;
                }
            large_done = done && mi > 0;
        }
    }
    printf("  %-28s non-finite pass: %zu cases ran, %zu failed (%zu outputs: %zu exact non-finite, %zu beyond the "
           "range, %zu finite)\n",
           info->name, tally.ran, tally.failed, tally.outputs, tally.exact_nonfinite, tally.exact_beyond,
           tally.exact_finite);
    CHECK(tally.ran > 0, "%s: the non-finite pass ran no case (first refusal: %s)", info->name, tally.first_refusal);
}

static void run_kernel(qmm_context *context, const qmm_kernel_info *info, check_rng *rng) {
    static const int all_bits[] = {2, 3, 4, 5, 6, 8};
    static const int all_group_sizes[] = {32, 64, 128};
    static const qmm_dtype all_dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    const bool transpose = info->op != QMM_OP_QMM_N;
    /* qmm_t and gather: N is free (tile BN), K is quantized (tile BK); qmm_n: the other way round. */
    const size_t free_tile = tile_of(transpose ? info->bn : info->bk);
    const size_t quantized_tile = tile_of(transpose ? info->bk : info->bn);
    const value_set ms = m_values(info), frees = free_values(free_tile);
    kernel_tally tally = {0};
    const bool reduced = getenv("QMM_TEST_REDUCED") != NULL;
    for (size_t d = 0; d < 3; d++)
        for (size_t b = 0; b < 6; b++)
            for (size_t g = 0; g < 3; g++) {
                if (reduced && (all_bits[b] == 2 || all_bits[b] == 5 || all_bits[b] == 6 || all_group_sizes[g] == 64))
                    continue;
#ifdef SANITIZED_BUILD
                if ((b + g) % 3 != d) continue;
#endif
                const value_set quantized = quantized_values(quantized_tile, (size_t)all_group_sizes[g],
                                                            transpose && strcmp(info->family, "gemv") == 0);
                for (size_t qi = 0; qi < quantized.count && (!reduced || qi < 3); qi++)
                    for (size_t fi = 0; fi < frees.count && (!reduced || fi < 3); fi++) {
                        const size_t N = transpose ? frees.values[fi] : quantized.values[qi];
                        const size_t K = transpose ? quantized.values[qi] : frees.values[fi];
                        if (info->op == QMM_OP_GATHER) /* x·Ŵᵀ per pair, like qmm_t */
                            run_gather_matrix(context, info, rng, N, K, all_bits[b], all_group_sizes[g],
                                              all_dtypes[d], &ms, &tally);
                        else
                            run_matrix(context, info, rng, N, K, all_bits[b], all_group_sizes[g], all_dtypes[d], &ms,
                                       &tally, false);
                    }
            }
    /* x values too small to scale by 16^-j exactly, products near f32's subnormal range (4-bit, f32 and bf16, every
     * group size): qmm_t with K = 640 + group, qmm_n with N = 640 + group and K = 70 (two 64-row stages of the CUDA
     * qmm_n tiles, which scale x·s before cutting it into parts). */
    if (info->op == QMM_OP_QMM_T || info->op == QMM_OP_QMM_N)
        for (size_t d = 0; d < 3; d += 2)
            for (size_t g = 0; g < 3; g++) {
                const size_t wide = 640 + (size_t)all_group_sizes[g];
                run_matrix(context, info, rng, transpose ? 7 : wide, transpose ? wide : 70, 4, all_group_sizes[g],
                           all_dtypes[d], &ms, &tally, true);
            }
    printf("  %-28s %6zu cases ran, %zu not supported, %zu failed, worst error/bound %.3f\n", info->name, tally.ran,
           tally.not_supported, tally.failed, tally.worst);
    if (tally.not_supported) printf("    first refusal: %s\n", tally.first_refusal);
    CHECK(tally.ran > 0, "%s: zero cases ran — a kernel that is never exercised is not tested", info->name);
}

int main(void) {
    const qmm_backend backends[] = {QMM_BACKEND_REF, QMM_BACKEND_CPU, QMM_BACKEND_CUDA};
    size_t kernels_run = 0;
    const char *only = getenv("QMM_TEST_BACKEND");
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        if (only && strcmp(only, qmm_backend_name(backends[i])) != 0) continue;
        qmm_context *context = NULL;
        qmm_status status = qmm_context_create(backends[i], 0, &context);
        if (status != QMM_OK) {
            printf("backend %s: SKIPPED: %s\n", qmm_backend_name(backends[i]), qmm_last_error());
            /* "not built" or "no device" is a skip; anything else is a failure of the backend. */
            CHECK(status == QMM_ERR_UNSUPPORTED, "backend %s: context_create -> %s: %s", qmm_backend_name(backends[i]),
                  qmm_status_string(status), qmm_last_error());
            continue;
        }
        printf("backend %s: %zu kernels\n", qmm_backend_name(backends[i]), qmm_kernel_count(context));
        check_rng rng = check_rng_make(100 + i);
        for (size_t k = 0; k < qmm_kernel_count(context); k++) {
            qmm_kernel_info info;
            CHECK_OK(qmm_kernel_get(context, k, &info));
            const char *why_not = NULL;
            if (qmm_kernel_usable(context, k, &why_not) != 1) { /* e.g. QMM_CPU_MAX_ISA=avx2: the AVX-512 rows */
                printf("  %-28s SKIPPED: not usable on this machine: %s\n", info.name, why_not ? why_not : "?");
                continue;
            }
            const char *selected = getenv("QMM_TEST_KERNEL"); /* a part of the names to run (device time) */
            if (selected && *selected && !strstr(info.name, selected)) {
                printf("  %-28s SKIPPED: not selected by QMM_TEST_KERNEL=%s\n", info.name, selected);
                continue;
            }
            if (!getenv("QMM_TEST_NONFINITE_ONLY")) run_kernel(context, &info, &rng);
            run_nonfinite(context, &info, &rng);
            kernels_run++;
        }
        qmm_context_destroy(context);
    }
    CHECK(kernels_run > 0, "no kernel of any backend ran");
    return check_finish("test_kernels");
}
