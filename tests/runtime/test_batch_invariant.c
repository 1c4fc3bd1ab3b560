/*
 * test_batch_invariant.c — batch-invariant mode (qmm_matmul_options.batch_invariant, docs/kernels.md
 * "Batch-invariant mode").
 *
 *   1. The selector over fake rows (src/core/kernel.h): a row without an order is refused, forced or not,
 *      with its message; a row of another order than the call's is refused when forced and passed over
 *      otherwise; a tuning entry naming either is passed over; hints that pass over every row of the
 *      order leave its row with the fewest rows of x per tile (the row that set it, where that is the only
 *      one); without the option nothing changes.
 *   2. Every table (ref, cpu, and cuda when a device is there), every format (bits × group_size × dtype),
 *      both ops, M ∈ {1, 2, 37, 512, 2048}: the rows that accept a batch-invariant call all declare one
 *      order, the same at every M, the selector's choice among them; every row without an order refuses
 *      it with the message naming it.
 *   3. The bits: for f32/f16/bf16, 4-bit gs64 and 3-bit gs32, both ops, 2048 random rows of x: sampled rows
 *      computed alone (M = 1, the selector choosing) and inside M = 2, 37, 512 and 2048 at several positions
 *      (first, last, tile edges), through the selector and through every kernel that accepts the option,
 *      are memcmp-identical; outputs are poisoned first. On cpu also with 1 and 3 threads, and through a
 *      chain. Rows that declare the same order give the same bits without the option too.
 *   4. The errors of a forced row without the order, or of another order, through qmm_matmul.
 *   5. The gather op (qmm_gather_options.batch_invariant): every pair of five routings (decode, top-3 in token
 *      order and sorted, one block of 40 rows, blocks of 16 and 17 rows) bit for bit a batch-invariant qmm_matmul
 *      of its x row and expert alone (on cuda, N = 64 and 52: the gather of that one pair, the gather's own order),
 *      through the selector, every gather row (forced; those of another order or none refused) and 1 or 3
 *      threads; a cpu gather row of an order, without the option, the bits of a qmm_t row of that order.
 *   6. The ordered GEMV rows' blocks (cpu): M = 1, 2, 3, 5, 16 (at M = 1, 4-bit, several blocks of weight rows), N = 200,
 *      4-, 8- and 3-bit, f32/bf16, 1, 2 and 4 threads: the tiled row's bits.
 *   7. The caller's floating-point environment (cpu): FE_UPWARD, FE_TOWARDZERO, FTZ/DAZ set after the thread team
 *      started; qmm_t, qmm_n, batch-invariant rows and a gather on 1, 2 and 3 threads give the same bits.
 * N = 52, K = 384 (qmm_t; qmm_n reads the same weights as K = 52, N = 384): the 2048-row products stay
 * cheap on the ref backend. QMM_TEST_BACKEND=ref|cpu|cuda runs that backend's sections only (as test_kernels).
 */
#include "check.h"
#include "kernel.h"

#include <fenv.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define EXPECT_MESSAGE(text)                                                                                 \
    CHECK(strcmp(qmm_last_error(), (text)) == 0, "message \"%s\", want \"%s\"", qmm_last_error(), (text))
#define EXPECT_CONTAINS(text)                                                                                \
    CHECK(strstr(qmm_last_error(), (text)) != NULL, "message \"%s\" lacks \"%s\"", qmm_last_error(), (text))

/* ───────────────────────────── 1. fake rows ───────────────────────────── */

static bool supports_all(const qmm_call *call, char *why_not, size_t size) {
    (void)call, (void)why_not, (void)size;
    return true;
}
static qmm_status run_nothing(const qmm_call *call) {
    (void)call;
    return QMM_OK;
}

#define FAKE(NAME, ORDER)                                                                                    \
    {.name = NAME, .backend = QMM_BACKEND_CPU, .op = QMM_OP_QMM_T, .family = "fake", .bm = 1, .bn = 1, .bk = 1, \
     .threads = 1, .tolerance_slack = 1.0, .description = "test row", .batch_invariant_order = ORDER}
static const qmm_kernel fake_rows[] = {
    {.info = FAKE("fake.none", NULL), .supports = supports_all, .run = run_nothing},
    {.info = FAKE("fake.x.small", "x"), .supports = supports_all, .run = run_nothing, .prefer_max_m = 4},
    {.info = FAKE("fake.x.tuned", "x"), .supports = supports_all, .run = run_nothing, .tune_only = true},
    {.info = FAKE("fake.y", "y"), .supports = supports_all, .run = run_nothing},
};
static const qmm_kernel *fake_table[] = {&fake_rows[0], &fake_rows[1], &fake_rows[2], &fake_rows[3]};
/* A wide row of order x first (it sets the order), hinted to M ≥ 100, then fake.x.small (1 row of x per tile). */
static const qmm_kernel fake_wide = {.info = {.name = "fake.x.wide", .backend = QMM_BACKEND_CPU, .op = QMM_OP_QMM_T,
                                              .family = "fake", .bm = 4, .bn = 1, .bk = 1, .threads = 1,
                                              .tolerance_slack = 1.0, .description = "test row",
                                              .batch_invariant_order = "x"},
                                     .supports = supports_all, .run = run_nothing, .prefer_min_m = 100};
static const qmm_kernel *fake_wide_table[] = {&fake_rows[0], &fake_wide, &fake_rows[1], &fake_rows[2], &fake_rows[3]};

static const char *pick(const qmm_tuning_table *tuning, size_t M, bool invariant, const char *forced) {
    qmm_call call = {.op = QMM_OP_QMM_T, .dtype = QMM_F16, .bits = 4, .group_size = 64, .N = 64, .K = 128, .M = M,
                     .batch_invariant = invariant};
    const qmm_kernel *chosen = NULL;
    if (qmm_select_kernel_tuned(fake_table, 4, tuning, &call, forced, &chosen) != QMM_OK) return "(error)";
    return chosen->info.name;
}

static void test_selector(void) {
#define EXPECT_PICK(got, want) CHECK(strcmp((got), (want)) == 0, "picked %s, want %s", (got), (want))
    EXPECT_PICK(pick(NULL, 1, false, NULL), "fake.none");
    EXPECT_PICK(pick(NULL, 1, true, NULL), "fake.x.small");
    /* M = 10: fake.x.small's hint passes it over, fake.x.tuned is tune_only, fake.y has another order: the
     * row that set the order (fake.x.small) takes it. */
    EXPECT_PICK(pick(NULL, 10, true, NULL), "fake.x.small");
    EXPECT_PICK(pick(NULL, 10, false, NULL), "fake.none");
    /* Forced. */
    EXPECT_PICK(pick(NULL, 1, true, "fake.x.tuned"), "fake.x.tuned");
    EXPECT_PICK(pick(NULL, 1, true, "fake.none"), "(error)");
    EXPECT_MESSAGE("forced kernel fake.none does not support this call (M=1, N=64, K=128, qmm_t, batch-invariant): "
                   "kernel fake.none does not declare a batch-invariant order (docs/kernels.md §11: which rows do, and "
                   "why the others do not), so it refuses batch-invariant calls");
    EXPECT_PICK(pick(NULL, 1, true, "fake.y"), "(error)");
    EXPECT_MESSAGE("forced kernel fake.y reduces in batch-invariant order \"y\", but this call's order is \"x\" (that "
                   "of fake.x.small, the first row of the table that declares an order and accepts the call): mixing "
                   "the two would make a row's bits depend on which kernel ran");
    EXPECT_PICK(pick(NULL, 1, false, "fake.y"), "fake.y");
    /* A tuning table: an entry naming a row without the order, or of another order, is passed over. */
    qmm_tuning_entry entry = {.op = QMM_OP_QMM_T, .dtype = QMM_F16, .bits = 4, .group_size = 64, .N = 64, .K = 128,
                              .m_min = 1, .m_max = 100, .row = &fake_rows[0]};
    qmm_tuning_table tuning = {.entries = &entry, .count = 1};
    EXPECT_PICK(pick(&tuning, 10, false, NULL), "fake.none");
    EXPECT_PICK(pick(&tuning, 10, true, NULL), "fake.x.small");
    entry.row = &fake_rows[3];
    EXPECT_PICK(pick(&tuning, 10, false, NULL), "fake.y");
    EXPECT_PICK(pick(&tuning, 10, true, NULL), "fake.x.small");
    entry.row = &fake_rows[2]; /* the order's tune_only row: a measurement may pick it */
    EXPECT_PICK(pick(&tuning, 10, true, NULL), "fake.x.tuned");
    /* Where the hints pass over every row of the order, the row of it with the fewest rows of x per tile runs, not
     * the (wider) row that set the order: fake.x.wide sets it; M = 10 is below its hint and above fake.x.small's. */
    {
        qmm_call wide = {.op = QMM_OP_QMM_T, .dtype = QMM_F16, .bits = 4, .group_size = 64, .N = 64, .K = 128, .M = 10,
                         .batch_invariant = true};
        const qmm_kernel *got = NULL;
        CHECK_OK(qmm_select_kernel_tuned(fake_wide_table, 5, NULL, &wide, NULL, &got));
        EXPECT_PICK(got ? got->info.name : "(none)", "fake.x.small");
        wide.M = 200;
        CHECK_OK(qmm_select_kernel_tuned(fake_wide_table, 5, NULL, &wide, NULL, &got));
        EXPECT_PICK(got ? got->info.name : "(none)", "fake.x.wide");
        wide.M = 2;
        CHECK_OK(qmm_select_kernel_tuned(fake_wide_table, 5, NULL, &wide, NULL, &got));
        EXPECT_PICK(got ? got->info.name : "(none)", "fake.x.small");
    }
    /* A table without any order. */
    qmm_call call = {.op = QMM_OP_QMM_T, .dtype = QMM_F16, .bits = 4, .group_size = 64, .N = 64, .K = 128, .M = 3,
                     .batch_invariant = true};
    const qmm_kernel *chosen = NULL;
    CHECK_STATUS(qmm_select_kernel(fake_table, 1, &call, NULL, &chosen), QMM_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("no kernel of this table declares a batch-invariant order for this call (M=3, N=64, K=128, qmm_t, "
                   "f16, 4-bit, group_size 64)");
#undef EXPECT_PICK
}

/* ───────────────────────────── 2. every table ───────────────────────────── */

#define N_T 52  /* weight rows: qmm_t's N, qmm_n's K (ragged against every tile) */
#define K_T 384 /* weight columns: qmm_t's K, qmm_n's N (two of the CPU tiled rows' K blocks of 256) */
#define ROWS 2048

static const size_t table_ms[] = {1, 2, 37, 512, 2048};
#define TABLE_M_COUNT (sizeof table_ms / sizeof table_ms[0])

static qmm_weights *make_weights(qmm_context *context, check_rng *rng, int bits, int group_size, qmm_dtype dtype) {
    check_qmatrix q;
    qmm_weights *weights = NULL;
    if (!check_qmatrix_random(rng, N_T, K_T, bits, group_size, dtype, &q)) {
        CHECK(false, "check_qmatrix_random failed");
        return NULL;
    }
    CHECK_OK(qmm_weights_create(context, &q.m, &weights));
    check_qmatrix_free(&q);
    return weights;
}

/* One (backend, format, op): the orders of the rows accepting a batch-invariant call at every M are one. */
static void check_table_orders(qmm_context *context, qmm_weights *weights, qmm_op op, const char *label) {
    const size_t count = qmm_kernel_count(context);
    const char *order = NULL; /* the one order of this (backend, format, op) */
    for (size_t mi = 0; mi < TABLE_M_COUNT; mi++) {
        const size_t M = table_ms[mi];
        size_t accepting = 0;
        for (size_t i = 0; i < count; i++) {
            qmm_kernel_info info;
            CHECK_OK(qmm_kernel_get(context, i, &info));
            if (info.op != op) continue;
            qmm_matmul_options options = {.op = op, .kernel = info.name, .batch_invariant = 1};
            qmm_kernel_info got;
            const qmm_status status = qmm_select(context, weights, M, &options, &got);
            if (status == QMM_OK) {
                accepting++;
                CHECK(info.batch_invariant_order != NULL, "%s M=%zu: %s accepts a batch-invariant call without an order",
                      label, M, info.name);
                if (!info.batch_invariant_order) continue;
                if (!order) order = info.batch_invariant_order;
                CHECK(strcmp(order, info.batch_invariant_order) == 0,
                      "%s M=%zu: %s accepts with order \"%s\", another accepting row has \"%s\"", label, M, info.name,
                      info.batch_invariant_order, order);
            } else {
                CHECK(status == QMM_ERR_UNSUPPORTED, "%s M=%zu: forcing %s gave %s (%s)", label, M, info.name,
                      qmm_status_string(status), qmm_last_error());
                if (!info.batch_invariant_order) EXPECT_CONTAINS("does not declare a batch-invariant order");
            }
        }
        CHECK(accepting > 0, "%s M=%zu: no row accepts a batch-invariant call", label, M);
        /* The selector's choice is one of them. */
        qmm_matmul_options options = {.op = op, .batch_invariant = 1};
        qmm_kernel_info chosen;
        CHECK_OK(qmm_select(context, weights, M, &options, &chosen));
        CHECK(chosen.batch_invariant_order && order && strcmp(chosen.batch_invariant_order, order) == 0,
              "%s M=%zu: the selector chose %s of order \"%s\", want \"%s\"", label, M, chosen.name,
              chosen.batch_invariant_order ? chosen.batch_invariant_order : "(none)", order ? order : "(none)");
    }
}

static void test_tables(qmm_context *context, const char *backend) {
    static const int bits_set[] = {2, 3, 4, 5, 6, 8}, group_sizes[] = {32, 64, 128};
    static const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    check_rng rng = check_rng_make(0x7ab1e);
    for (size_t b = 0; b < 6; b++)
        for (size_t g = 0; g < 3; g++)
            for (size_t d = 0; d < 3; d++) {
                qmm_weights *weights = make_weights(context, &rng, bits_set[b], group_sizes[g], dtypes[d]);
                if (!weights) continue;
                for (int op = 0; op < 2; op++) {
                    char label[96];
                    snprintf(label, sizeof label, "%s %s %d-bit gs%d %s", backend, qmm_op_name((qmm_op)op), bits_set[b],
                             group_sizes[g], qmm_dtype_name(dtypes[d]));
                    check_table_orders(context, weights, (qmm_op)op, label);
                }
                qmm_weights_destroy(weights);
            }
}

/* ───────────────────────────── 3. the bits ───────────────────────────── */

/* Rows of x whose single-row output is the reference: first and last rows, and rows at the tiles'
 * edges (8, 16, 32 lanes) inside the products below. */
static const size_t sampled_rows[] = {0, 1, 7, 8, 15, 16, 31, 32, 33, 36, 40, 255, 511, 1024, 2010, 2047};
#define SAMPLED (sizeof sampled_rows / sizeof sampled_rows[0])

/* Products: M rows of x starting at row `first` (so a sampled row sits at several positions). */
typedef struct window {
    size_t M, first;
} window;
static const window windows[] = {{2, 0}, {2, 2046}, {37, 0}, {37, 5}, {37, 2011}, {512, 0}, {512, 1536}, {2048, 0}};
#define WINDOWS (sizeof windows / sizeof windows[0])

typedef struct bit_case {
    qmm_context *context;
    qmm_weights *weights;
    qmm_op op;
    qmm_dtype dtype;
    size_t N, K, element;
    qmm_buffer *x_all; /* ROWS × K */
    qmm_buffer *out;   /* ROWS × N */
    unsigned char *x_host;
    unsigned char *single; /* [SAMPLED][N] the reference rows */
    unsigned char *got;    /* ROWS × N */
    const char *label;
} bit_case;

/* out = x rows [first, first + M) · weights with the option on and `kernel` (NULL: the selector); the
 * window's rows are copied into x_all's start. Returns false when the call failed (already recorded). */
static bool run_window(bit_case *c, const char *kernel, size_t M, size_t first, char *ran, size_t ran_size) {
    qmm_matmul_options options = {.op = c->op, .kernel = kernel, .batch_invariant = 1};
    qmm_kernel_info info;
    qmm_status status = qmm_buffer_write(c->x_all, c->x_host + first * c->K * c->element, M * c->K);
    if (status == QMM_OK) status = qmm_buffer_poison(c->out);
    if (status == QMM_OK) status = qmm_matmul(c->context, c->weights, c->x_all, M, c->out, &options, &info);
    if (status == QMM_OK) status = qmm_buffer_read(c->out, c->got, M * c->N);
    CHECK(status == QMM_OK, "%s %s M=%zu: %s", c->label, kernel ? kernel : "selector", M, qmm_last_error());
    if (status == QMM_OK && ran) snprintf(ran, ran_size, "%s", info.name);
    return status == QMM_OK;
}

/* The sampled rows inside the last window run must equal the single-row references. */
static void compare_window(bit_case *c, const char *who, size_t M, size_t first) {
    for (size_t s = 0; s < SAMPLED; s++) {
        const size_t row = sampled_rows[s];
        if (row < first || row >= first + M) continue;
        const bool same = memcmp(c->got + (row - first) * c->N * c->element, c->single + s * c->N * c->element,
                                 c->N * c->element) == 0;
        CHECK(same, "%s %s: row %zu at position %zu of M=%zu differs from the row alone", c->label, who, row,
              row - first, M);
    }
}

static void check_bits(bit_case *c) {
    /* The references: each sampled row alone, the selector choosing. */
    char reference_kernel[128] = "";
    for (size_t s = 0; s < SAMPLED; s++) {
        if (!run_window(c, NULL, 1, sampled_rows[s], reference_kernel, sizeof reference_kernel)) return;
        memcpy(c->single + s * c->N * c->element, c->got, c->N * c->element);
    }
    /* The selector at every window. */
    for (size_t w = 0; w < WINDOWS; w++) {
        char ran[128];
        if (!run_window(c, NULL, windows[w].M, windows[w].first, ran, sizeof ran)) continue;
        char who[400];
        snprintf(who, sizeof who, "selector (%s, alone: %s)", ran, reference_kernel);
        compare_window(c, who, windows[w].M, windows[w].first);
    }
    /* Every kernel that accepts the option, forced, at every M it accepts (M = 1 included). */
    const size_t count = qmm_kernel_count(c->context);
    for (size_t i = 0; i < count; i++) {
        qmm_kernel_info info;
        CHECK_OK(qmm_kernel_get(c->context, i, &info));
        if (info.op != c->op) continue;
        for (size_t w = 0; w < WINDOWS + 1; w++) {
            const size_t M = w < WINDOWS ? windows[w].M : 1, first = w < WINDOWS ? windows[w].first : ROWS - 1;
            qmm_matmul_options options = {.op = c->op, .kernel = info.name, .batch_invariant = 1};
            qmm_kernel_info chosen;
            if (qmm_select(c->context, c->weights, M, &options, &chosen) != QMM_OK) continue;
            if (!run_window(c, info.name, M, first, NULL, 0)) continue;
            compare_window(c, info.name, M, first);
        }
    }
    /* The thread count (cpu): 1 and 3 threads give the same rows as the default. */
    if (qmm_context_backend(c->context) == QMM_BACKEND_CPU) {
        for (int threads = 1; threads <= 3; threads += 2) {
            CHECK_OK(qmm_context_set_threads(c->context, threads));
            if (run_window(c, NULL, ROWS, 0, NULL, 0)) {
                char who[64];
                snprintf(who, sizeof who, "selector with %d threads", threads);
                compare_window(c, who, ROWS, 0);
            }
        }
        CHECK_OK(qmm_context_set_threads(c->context, 0));
    }
    /* A chain step takes the option: the same kernel as qmm_select, the same rows. */
    {
        qmm_chain *chain = NULL;
        qmm_matmul_options options = {.op = c->op, .batch_invariant = 1};
        qmm_kernel_info selected, stepped;
        const size_t M = 37;
        CHECK_OK(qmm_buffer_write(c->x_all, c->x_host, M * c->K));
        CHECK_OK(qmm_buffer_poison(c->out));
        CHECK_OK(qmm_select(c->context, c->weights, M, &options, &selected));
        CHECK_OK(qmm_chain_create(c->context, &chain));
        CHECK_OK(qmm_chain_add_matmul(chain, c->weights, c->x_all, M, c->out, &options));
        CHECK_OK(qmm_chain_run(chain));
        CHECK_OK(qmm_chain_step(chain, 0, NULL, &stepped));
        CHECK(strcmp(selected.name, stepped.name) == 0, "%s: the chain ran %s, qmm_select picks %s", c->label,
              stepped.name, selected.name);
        CHECK_OK(qmm_buffer_read(c->out, c->got, M * c->N));
        compare_window(c, "chain", M, 0);
        qmm_chain_destroy(chain);
    }
}

/* Rows that declare the same order give the same bits without the option too (rows of a usable ISA that
 * accept the call at M = 37): e.g. the portable CPU row and the reference row, both "oracle". */
static void check_same_order_rows(bit_case *c) {
    const size_t count = qmm_kernel_count(c->context), M = 37;
    unsigned char *first_bits = malloc(M * c->N * c->element);
    if (!first_bits) return;
    CHECK_OK(qmm_buffer_write(c->x_all, c->x_host, M * c->K));
    for (size_t i = 0; i < count; i++) {
        qmm_kernel_info info;
        CHECK_OK(qmm_kernel_get(c->context, i, &info));
        if (info.op != c->op || !info.batch_invariant_order) continue;
        qmm_matmul_options options = {.op = c->op, .kernel = info.name};
        if (qmm_kernel_supports(c->context, info.name, c->weights, M, c->op, NULL) != 1) continue;
        CHECK_OK(qmm_buffer_poison(c->out));
        CHECK_OK(qmm_matmul(c->context, c->weights, c->x_all, M, c->out, &options, NULL));
        CHECK_OK(qmm_buffer_read(c->out, c->got, M * c->N));
        /* Compare with the first earlier row of the same order. */
        for (size_t j = 0; j < i; j++) {
            qmm_kernel_info earlier;
            CHECK_OK(qmm_kernel_get(c->context, j, &earlier));
            if (earlier.op != c->op || !earlier.batch_invariant_order ||
                strcmp(earlier.batch_invariant_order, info.batch_invariant_order) != 0 ||
                qmm_kernel_supports(c->context, earlier.name, c->weights, M, c->op, NULL) != 1)
                continue;
            qmm_matmul_options again = {.op = c->op, .kernel = earlier.name};
            CHECK_OK(qmm_buffer_poison(c->out));
            CHECK_OK(qmm_matmul(c->context, c->weights, c->x_all, M, c->out, &again, NULL));
            CHECK_OK(qmm_buffer_read(c->out, first_bits, M * c->N));
            CHECK(memcmp(first_bits, c->got, M * c->N * c->element) == 0,
                  "%s: %s and %s both declare order \"%s\" but differ at M=%zu", c->label, earlier.name, info.name,
                  info.batch_invariant_order, M);
            break; /* one earlier row of the order is enough: the earlier rows were compared among themselves */
        }
    }
    free(first_bits);
}

static void test_bits(qmm_context *context, const char *backend) {
    static const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    static const int formats[][2] = {{4, 64}, {3, 32}};
    check_rng rng = check_rng_make(0xb175);
    for (size_t d = 0; d < 3; d++)
        for (size_t f = 0; f < 2; f++) {
            const qmm_dtype dtype = dtypes[d];
            qmm_weights *weights = make_weights(context, &rng, formats[f][0], formats[f][1], dtype);
            if (!weights) continue;
            for (int op = 0; op < 2; op++) {
                char label[96];
                snprintf(label, sizeof label, "%s %s %d-bit gs%d %s", backend, qmm_op_name((qmm_op)op), formats[f][0],
                         formats[f][1], qmm_dtype_name(dtype));
                bit_case c = {.context = context, .weights = weights, .op = (qmm_op)op, .dtype = dtype,
                              .N = op == QMM_OP_QMM_T ? N_T : K_T, .K = op == QMM_OP_QMM_T ? K_T : N_T,
                              .element = qmm_dtype_size(dtype), .label = label};
                c.x_host = malloc(ROWS * c.K * c.element);
                c.single = malloc(SAMPLED * c.N * c.element);
                c.got = malloc(ROWS * c.N * c.element);
                if (c.x_host && c.single && c.got) {
                    check_fill_uniform(&rng, c.x_host, dtype, ROWS * c.K, -1.0f, 1.0f);
                    CHECK_OK(qmm_buffer_create(context, dtype, ROWS * c.K, &c.x_all));
                    CHECK_OK(qmm_buffer_create(context, dtype, ROWS * c.N, &c.out));
                    if (c.x_all && c.out) {
                        check_bits(&c);
                        check_same_order_rows(&c);
                    }
                } else {
                    CHECK(false, "%s: out of memory", label);
                }
                qmm_buffer_destroy(c.x_all);
                qmm_buffer_destroy(c.out);
                free(c.x_host);
                free(c.single);
                free(c.got);
            }
            qmm_weights_destroy(weights);
        }
}

/* ───────────────────────────── 5. the gather op ─────────────────────────────
 *
 * qmm_gather_options.batch_invariant: pair i's bits are those of x[lhs[i]] and expert rhs[i] alone. The reference
 * of pair (t, e) is a batch-invariant qmm_matmul (M = 1, the selector choosing) of x row t on expert e's weights as
 * plain weights; every routing below, through the selector and through every gather row that accepts the option
 * (forced), on 1 and 3 threads (cpu), must give exactly those bits. A gather row whose order is one of the qmm_t rows'
 * (cpu) gives, with the option off too, the bits of a qmm_t row of that order on the pair alone (its blocks run only
 * rows of that order). On cuda the gather row's order is GATHER_CUDA_ORDER, the gather's own (chunks of ≤ 16 rows in
 * grouped m16n32 launches of fixed warps where the format groups — f16/bf16 at N = 64 —, else each block on the qmm_t
 * rows of the mode): there every N (64 and 52, no repacked expert slices) is checked against the gather's own calls of
 * one pair. A backend whose gather rows declare no order refuses the call. */

#define G_EXPERTS 5
#define G_TOKENS 40
#define GATHER_CUDA_ORDER "gather-fixed-per-format" /* cuda.gather.blocks.auto's (src/cuda/cuda_backend.c) */

typedef struct gather_routing {
    const char *name;
    size_t B;
    bool lhs_null; /* pair i takes row i of x */
    uint32_t lhs[G_TOKENS * 3], rhs[G_TOKENS * 3];
} gather_routing;

/* Decode (one token, 4 experts), top-3 routing in token order and sorted by expert, every token to one expert (one
 * block of 40 rows: the tiled rows), blocks of 16 and 17 rows (the ordered GEMV's limit) with repeated rows of x. */
static size_t gather_routings(check_rng *rng, gather_routing *out) {
    size_t n = 0;
    gather_routing *r = &out[n++];
    *r = (gather_routing){.name = "decode: token 7 to experts 0, 1, 3, 4", .B = 4};
    for (uint32_t j = 0, e = 0; j < 4; j++, e++) {
        if (e == 2) e++;
        r->lhs[j] = 7;
        r->rhs[j] = e;
    }
    gather_routing *token_order = &out[n++];
    *token_order = (gather_routing){.name = "top-3 routing, token order", .B = G_TOKENS * 3};
    for (uint32_t t = 0; t < G_TOKENS; t++) {
        const uint32_t first = (uint32_t)(check_rng_next(rng) % G_EXPERTS);
        for (uint32_t j = 0; j < 3; j++) {
            token_order->lhs[t * 3 + j] = t;
            token_order->rhs[t * 3 + j] = (first + j * 2) % G_EXPERTS; /* 3 distinct experts */
        }
    }
    r = &out[n++];
    *r = (gather_routing){.name = "top-3 routing, sorted by expert", .B = G_TOKENS * 3};
    size_t at = 0;
    for (uint32_t e = 0; e < G_EXPERTS; e++)
        for (size_t i = 0; i < token_order->B; i++)
            if (token_order->rhs[i] == e) {
                r->lhs[at] = token_order->lhs[i];
                r->rhs[at++] = e;
            }
    r = &out[n++];
    *r = (gather_routing){.name = "every token to expert 2 (lhs NULL)", .B = G_TOKENS, .lhs_null = true};
    for (size_t i = 0; i < G_TOKENS; i++) r->lhs[i] = (uint32_t)i, r->rhs[i] = 2;
    r = &out[n++];
    *r = (gather_routing){.name = "blocks of 16, 17 and 1 rows, random x rows", .B = 34};
    for (size_t i = 0; i < 34; i++) {
        r->lhs[i] = (uint32_t)(check_rng_next(rng) % G_TOKENS);
        r->rhs[i] = i < 16 ? 0 : i < 33 ? 1 : 4;
    }
    return n;
}

typedef struct gather_case {
    qmm_context *context;
    qmm_weights *stacked; /* G_EXPERTS experts of c->n × K_T */
    qmm_weights *plain[G_EXPERTS];
    qmm_dtype dtype;
    size_t element;
    size_t n;              /* rows of each expert (the product's N) */
    bool alone_by_gather;  /* the reference is the gather of the one pair, not qmm_matmul on plain weights */
    qmm_buffer *x, *x_one, *out, *out_one;
    unsigned char *x_host; /* G_TOKENS × K_T */
    unsigned char *got;    /* G_TOKENS·3 × c->n */
    const char *label;
} gather_case;

/* reference[t][e][c->n]: x row t alone on expert e's plain weights, qmm_matmul with `kernel` (NULL: the selector)
 * and the option as given — or, with c->alone_by_gather, the batch-invariant gather of that one pair (the selector).
 * Returns false when a call failed (recorded). */
static bool gather_reference(gather_case *c, const char *kernel, int invariant, unsigned char *reference) {
    /* the gather's own one-pair calls (cuda) only as the mode's reference through the selector: they show that the
     * routing does not change a pair's bits, not which qmm_t order its blocks ran */
    CHECK(!c->alone_by_gather || (!kernel && invariant), "%s: a one-pair gather reference asked for %s, option %d",
          c->label, kernel ? kernel : "the selector", invariant);
    qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = kernel, .batch_invariant = invariant};
    qmm_gather_options gather_options = {.batch_invariant = 1};
    for (size_t t = 0; t < G_TOKENS; t++) {
        if (qmm_buffer_write(c->x_one, c->x_host + t * K_T * c->element, K_T) != QMM_OK) return false;
        for (size_t e = 0; e < G_EXPERTS; e++) {
            const uint32_t lhs = 0, rhs = (uint32_t)e;
            qmm_status status = qmm_buffer_poison(c->out_one);
            if (status == QMM_OK && c->alone_by_gather)
                status = qmm_gather_matmul(c->context, c->stacked, c->x_one, 1, &lhs, &rhs, 1, c->out_one,
                                           &gather_options, NULL);
            else if (status == QMM_OK)
                status = qmm_matmul(c->context, c->plain[e], c->x_one, 1, c->out_one, &options, NULL);
            if (status == QMM_OK)
                status = qmm_buffer_read(c->out_one, reference + (t * G_EXPERTS + e) * c->n * c->element, c->n);
            CHECK(status == QMM_OK, "%s: reference %s row %zu expert %zu: %s", c->label, kernel ? kernel : "selector", t,
                  e, qmm_last_error());
            if (status != QMM_OK) return false;
        }
    }
    return true;
}

/* Runs the routing (kernel NULL: the selector) and compares every pair with reference; false when the call failed
 * with `status` (not recorded: the caller decides). */
static qmm_status gather_compare(gather_case *c, const gather_routing *r, const char *kernel, int invariant,
                                 const unsigned char *reference, const char *who) {
    qmm_gather_options options = {.kernel = kernel, .batch_invariant = invariant};
    qmm_status status = qmm_buffer_poison(c->out);
    if (status == QMM_OK)
        status = qmm_gather_matmul(c->context, c->stacked, c->x, G_TOKENS, r->lhs_null ? NULL : r->lhs, r->rhs, r->B,
                                   c->out, &options, NULL);
    if (status != QMM_OK) return status;
    CHECK_OK(qmm_buffer_read(c->out, c->got, r->B * c->n));
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < r->B; i++) {
        const unsigned char *want = reference + ((size_t)r->lhs[i] * G_EXPERTS + r->rhs[i]) * c->n * c->element;
        if (memcmp(c->got + i * c->n * c->element, want, c->n * c->element) != 0 && differ++ == 0) first = i;
    }
    CHECK(differ == 0, "%s %s, %s: %zu of %zu pairs differ from the pair alone (first: pair %zu, token %u, expert %u)",
          c->label, who, r->name, differ, r->B, first, r->lhs[first], r->rhs[first]);
    return QMM_OK;
}

static void check_gather(gather_case *c, check_rng *rng) {
    gather_routing routings[5];
    const size_t routing_count = gather_routings(rng, routings);
    unsigned char *reference = malloc(G_TOKENS * G_EXPERTS * c->n * c->element);
    if (!reference) {
        CHECK(false, "%s: out of memory", c->label);
        return;
    }
    /* The mode through the selector: refused where no gather row declares an order, else the pairs alone. */
    bool ordered = false;
    for (size_t i = 0; i < qmm_kernel_count(c->context); i++) {
        qmm_kernel_info info;
        CHECK_OK(qmm_kernel_get(c->context, i, &info));
        ordered |= info.op == QMM_OP_GATHER && info.batch_invariant_order && qmm_kernel_usable(c->context, i, NULL) == 1;
    }
    if (!ordered) {
        const qmm_status status = gather_compare(c, &routings[1], NULL, 1, NULL, "selector");
        CHECK(status == QMM_ERR_UNSUPPORTED, "%s: a batch-invariant gather without ordered rows gave %s", c->label,
              qmm_status_string(status));
        EXPECT_CONTAINS("declares a batch-invariant order for this call");
        goto cleanup;
    }
    if (!gather_reference(c, NULL, 1, reference)) goto cleanup;
    for (size_t r = 0; r < routing_count; r++) CHECK_OK(gather_compare(c, &routings[r], NULL, 1, reference, "selector"));
    if (qmm_context_backend(c->context) == QMM_BACKEND_CPU) {
        for (int threads = 1; threads <= 3; threads += 2) {
            CHECK_OK(qmm_context_set_threads(c->context, threads));
            char who[64];
            snprintf(who, sizeof who, "selector with %d threads", threads);
            for (size_t r = 0; r < routing_count; r++) CHECK_OK(gather_compare(c, &routings[r], NULL, 1, reference, who));
        }
        CHECK_OK(qmm_context_set_threads(c->context, 0));
    }
    /* Every gather row, forced with the option: the call's order's rows give the same bits and declare one order (the
     * table rule, src/core/kernel.h), the others are refused naming the reason. */
    size_t ran = 0;
    const char *order = NULL;
    for (size_t i = 0; i < qmm_kernel_count(c->context); i++) {
        qmm_kernel_info info;
        CHECK_OK(qmm_kernel_get(c->context, i, &info));
        if (info.op != QMM_OP_GATHER) continue;
        for (size_t r = 0; r < routing_count; r++) {
            const qmm_status status = gather_compare(c, &routings[r], info.name, 1, reference, info.name);
            if (status == QMM_OK) {
                ran++;
                CHECK(info.batch_invariant_order != NULL, "%s: %s accepts a batch-invariant gather without an order",
                      c->label, info.name);
                if (!info.batch_invariant_order) continue;
                if (!order) order = info.batch_invariant_order;
                CHECK(strcmp(order, info.batch_invariant_order) == 0,
                      "%s: %s accepts with order \"%s\", another accepting gather row has \"%s\"", c->label, info.name,
                      info.batch_invariant_order, order);
                continue;
            }
            CHECK(status == QMM_ERR_UNSUPPORTED, "%s: forcing %s gave %s (%s)", c->label, info.name,
                  qmm_status_string(status), qmm_last_error());
            if (!info.batch_invariant_order) EXPECT_CONTAINS("does not declare a batch-invariant order");
            else if (qmm_kernel_usable(c->context, i, NULL) == 1) EXPECT_CONTAINS("but this call's order is");
        }
    }
    CHECK(ran > 0, "%s: no gather row ran in batch-invariant mode", c->label);
    /* A gather row of a qmm_t order, forced without the option, gives the bits of a qmm_t row of that order on the
     * pairs alone (the first usable one in the table, forced, without the option too). Not the gather's own order
     * (cuda): without the option that row groups its blocks by their rows and picks its warps for the grid. */
    for (size_t i = 0; i < qmm_kernel_count(c->context); i++) {
        qmm_kernel_info info;
        CHECK_OK(qmm_kernel_get(c->context, i, &info));
        if (info.op != QMM_OP_GATHER || !info.batch_invariant_order || qmm_kernel_usable(c->context, i, NULL) != 1 ||
            strcmp(info.batch_invariant_order, GATHER_CUDA_ORDER) == 0)
            continue;
        const char *qmm_t_row = NULL;
        for (size_t j = 0; j < qmm_kernel_count(c->context) && !qmm_t_row; j++) {
            qmm_kernel_info row;
            CHECK_OK(qmm_kernel_get(c->context, j, &row));
            if (row.op == QMM_OP_QMM_T && row.batch_invariant_order &&
                strcmp(row.batch_invariant_order, info.batch_invariant_order) == 0 &&
                qmm_kernel_supports(c->context, row.name, c->plain[0], 1, QMM_OP_QMM_T, NULL) == 1)
                qmm_t_row = row.name;
        }
        CHECK(qmm_t_row != NULL, "%s: no usable qmm_t row of order \"%s\" (that of %s)", c->label,
              info.batch_invariant_order, info.name);
        if (!qmm_t_row || !gather_reference(c, qmm_t_row, 0, reference)) continue;
        char who[256];
        snprintf(who, sizeof who, "%s without the option (against %s)", info.name, qmm_t_row);
        for (size_t r = 0; r < routing_count; r++) CHECK_OK(gather_compare(c, &routings[r], info.name, 0, reference, who));
    }
cleanup:
    free(reference);
}

static void test_gather(qmm_context *context, const char *backend) {
    static const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    static const int formats[][2] = {{4, 64}, {3, 32}};
    /* cuda: N = 64 (grouped in f16/bf16) and N = 52 (no repacked expert slices), both against the gather's one-pair
     * calls */
    const bool cuda = qmm_context_backend(context) == QMM_BACKEND_CUDA;
    static const size_t ns[] = {N_T, 64};
    check_rng rng = check_rng_make(0x9a74e7);
    for (size_t d = 0; d < 3; d++)
        for (size_t f = 0; f < 2; f++)
            for (size_t s = 0; s < (cuda ? 2u : 1u); s++) {
                const qmm_dtype dtype = dtypes[d];
                const int bits = formats[f][0], group_size = formats[f][1];
                const size_t n = ns[s];
                char label[128];
                snprintf(label, sizeof label, "%s gather %d-bit gs%d %s N=%zu", backend, bits, group_size,
                         qmm_dtype_name(dtype), n);
                check_qmatrix q;
                if (!check_qmatrix_random(&rng, G_EXPERTS * n, K_T, bits, group_size, dtype, &q)) {
                    CHECK(false, "%s: check_qmatrix_random failed", label);
                    continue;
                }
                gather_case c = {.context = context, .dtype = dtype, .element = qmm_dtype_size(dtype), .n = n,
                                 .alone_by_gather = cuda, .label = label};
                CHECK_OK(qmm_weights_create_experts(context, &q.m, G_EXPERTS, &c.stacked));
                const size_t words = qmm_packed_words(K_T, bits), groups = qmm_groups(K_T, group_size);
                bool made = c.stacked != NULL;
                for (size_t e = 0; e < G_EXPERTS; e++) {
                    qmm_qmatrix expert = q.m;
                    expert.rows = n;
                    expert.w = q.m.w + e * n * words;
                    expert.scales = (const unsigned char *)q.m.scales + e * n * groups * c.element;
                    expert.biases = (const unsigned char *)q.m.biases + e * n * groups * c.element;
                    CHECK_OK(qmm_weights_create(context, &expert, &c.plain[e]));
                    made &= c.plain[e] != NULL;
                }
                CHECK_OK(qmm_buffer_create(context, dtype, G_TOKENS * K_T, &c.x));
                CHECK_OK(qmm_buffer_create(context, dtype, K_T, &c.x_one));
                CHECK_OK(qmm_buffer_create(context, dtype, G_TOKENS * 3 * n, &c.out));
                CHECK_OK(qmm_buffer_create(context, dtype, n, &c.out_one));
                c.x_host = malloc(G_TOKENS * K_T * c.element);
                c.got = malloc(G_TOKENS * 3 * n * c.element);
                if (made && c.x && c.x_one && c.out && c.out_one && c.x_host && c.got) {
                    check_fill_uniform(&rng, c.x_host, dtype, G_TOKENS * K_T, -1.0f, 1.0f);
                    CHECK_OK(qmm_buffer_write(c.x, c.x_host, G_TOKENS * K_T));
                    /* cuda, f16/bf16 at N = 64: the chunks must go to the grouped launches (a call that cannot group
                     * is then an error), not silently to the per-block form */
                    const bool grouped = cuda && dtype != QMM_F32 && n % 16 == 0;
                    if (grouped) setenv("QMM_CUDA_GATHER_GROUPED", "1", 1);
                    check_gather(&c, &rng);
                    if (grouped) unsetenv("QMM_CUDA_GATHER_GROUPED");
                } else {
                    CHECK(false, "%s: could not set up the case", label);
                }
                qmm_buffer_destroy(c.x);
                qmm_buffer_destroy(c.x_one);
                qmm_buffer_destroy(c.out);
                qmm_buffer_destroy(c.out_one);
                for (size_t e = 0; e < G_EXPERTS; e++) qmm_weights_destroy(c.plain[e]);
                qmm_weights_destroy(c.stacked);
                free(c.x_host);
                free(c.got);
                check_qmatrix_free(&q);
            }
}

/* ───────────────────────────── 6. the ordered GEMV's blocks (cpu) ─────────────────────────────
 *
 * The ordered GEMV rows run ORDERED_NB_MAX blocks of weight rows together at M = 1 with 4-bit codes (4 with AVX-512, 2 with AVX2; else
 * one; src/cpu/simd_kernels.h) and the rows of x in groups of up to 4: every such shape must give the tiled row's
 * bits. N = 200 (three blocks of 64 rows and a tail of 8 at M = 1, ragged against 16 and 32 too), K = 8192, 4-bit
 * (the table decode), 8-bit and 3-bit (bytes), f32 and bf16, 1, 2 and 4 threads (AVX-512, M = 1: 4 blocks a pass on 1
 * and 2 threads, one on 4, since 4 · 64 > N), M = 1, 2, 3, 5 and 16 against the tiled row forced at M = 16. */
#define OB_N 200
#define OB_K 8192 /* M·N·K ≥ 2^20 from M = 1: the calls run on the context's threads (qmm_cpu_threads_for) */
static void test_ordered_blocks(qmm_context *context) {
    static const char *const pairs[][2] = {{"cpu.qmm_t.gemv_ordered.n16.avx512", "cpu.qmm_t.gemm.m32n12.avx512"},
                                           {"cpu.qmm_t.gemv_ordered.n8.avx2", "cpu.qmm_t.gemm.m16n6.avx2"}};
    static const int bits_set[] = {4, 8, 3};
    static const qmm_dtype dtypes[] = {QMM_F32, QMM_BF16};
    static const size_t ms[] = {1, 2, 3, 5, 16};
    check_rng rng = check_rng_make(0x0b10c5);
    for (size_t b = 0; b < 3; b++)
        for (size_t d = 0; d < 2; d++) {
            check_qmatrix q;
            if (!check_qmatrix_random(&rng, OB_N, OB_K, bits_set[b], 64, dtypes[d], &q)) {
                CHECK(false, "check_qmatrix_random failed");
                continue;
            }
            const size_t element = qmm_dtype_size(dtypes[d]);
            qmm_weights *weights = NULL;
            qmm_buffer *x = NULL, *out = NULL;
            unsigned char *x_host = malloc(16 * OB_K * element), *want = malloc(16 * OB_N * element),
                          *got = malloc(16 * OB_N * element);
            CHECK_OK(qmm_weights_create(context, &q.m, &weights));
            CHECK_OK(qmm_buffer_create(context, dtypes[d], 16 * OB_K, &x));
            CHECK_OK(qmm_buffer_create(context, dtypes[d], 16 * OB_N, &out));
            if (weights && x && out && x_host && want && got) {
                check_fill_uniform(&rng, x_host, dtypes[d], 16 * OB_K, -1.0f, 1.0f);
                CHECK_OK(qmm_buffer_write(x, x_host, 16 * OB_K));
                for (size_t p = 0; p < 2; p++) {
                    if (qmm_kernel_supports(context, pairs[p][0], weights, 1, QMM_OP_QMM_T, NULL) != 1) continue;
                    qmm_matmul_options tiled = {.op = QMM_OP_QMM_T, .kernel = pairs[p][1]};
                    CHECK_OK(qmm_buffer_poison(out));
                    CHECK_OK(qmm_matmul(context, weights, x, 16, out, &tiled, NULL));
                    CHECK_OK(qmm_buffer_read(out, want, 16 * OB_N));
                    for (int threads = 1; threads <= 4; threads *= 2) {
                        CHECK_OK(qmm_context_set_threads(context, threads));
                        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                            qmm_matmul_options ordered = {.op = QMM_OP_QMM_T, .kernel = pairs[p][0]};
                            CHECK_OK(qmm_buffer_poison(out));
                            CHECK_OK(qmm_matmul(context, weights, x, ms[mi], out, &ordered, NULL));
                            CHECK_OK(qmm_buffer_read(out, got, ms[mi] * OB_N));
                            for (size_t m = 0; m < ms[mi]; m++)
                                CHECK(memcmp(got + m * OB_N * element, want + m * OB_N * element, OB_N * element) == 0,
                                      "%s %d-bit %s M=%zu, %d thread(s): row %zu differs from %s's", pairs[p][0],
                                      bits_set[b], qmm_dtype_name(dtypes[d]), ms[mi], threads, m, pairs[p][1]);
                        }
                    }
                    CHECK_OK(qmm_context_set_threads(context, 0));
                }
            } else {
                CHECK(false, "ordered blocks: could not set up the case");
            }
            qmm_buffer_destroy(x);
            qmm_buffer_destroy(out);
            qmm_weights_destroy(weights);
            free(x_host);
            free(want);
            free(got);
            check_qmatrix_free(&q);
        }
}

/* ───────────────────────────── 7. the caller's floating-point environment (cpu) ─────────────────────────────
 *
 * The CPU backend's worker threads take the caller's floating-point environment in every parallel region
 * (QMM_CPU_FP_ENTER, src/cpu/cpu.h), so with another rounding mode, or FTZ/DAZ (x86), set on the caller's thread after
 * the thread team started, the bits still do not depend on the thread count: qmm_t at M = 1, 5 and 40, qmm_n at M = 3,
 * batch-invariant M = 1 against the same rows inside M = 40, and a gather of 16 pairs (its blocks on the team), each on
 * 1, 2 and 3 threads. N = 512, K = 4096 (above the work that starts threads). FTZ/DAZ gets x at 2^-126 scale, so
 * products and x are denormal. The caller's environment is put back after each mode. */
#define FP_N 512
#define FP_K 4096
#define FP_ROWS 40
typedef struct fp_case {
    qmm_context *context;
    qmm_weights *weights, *experts;
    qmm_buffer *x, *out;
    unsigned char *got;
} fp_case;

/* out rows as bytes for (op, M, option) on `threads` threads; false when a call failed (recorded). */
static bool fp_run(fp_case *c, int threads, qmm_op op, size_t M, int invariant, size_t rows_out) {
    CHECK_OK(qmm_context_set_threads(c->context, threads));
    qmm_matmul_options options = {.op = op, .batch_invariant = invariant};
    qmm_status status = qmm_buffer_poison(c->out);
    if (status == QMM_OK) status = qmm_matmul(c->context, c->weights, c->x, M, c->out, &options, NULL);
    if (status == QMM_OK) status = qmm_buffer_read(c->out, c->got, rows_out);
    CHECK(status == QMM_OK, "fp environment: %s M=%zu on %d threads: %s", qmm_op_name(op), M, threads, qmm_last_error());
    return status == QMM_OK;
}

static bool fp_gather(fp_case *c, int threads) {
    static const uint32_t lhs[16] = {0, 3, 5, 1, 2, 7, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7},
                          rhs[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
    CHECK_OK(qmm_context_set_threads(c->context, threads));
    qmm_status status = qmm_buffer_poison(c->out);
    if (status == QMM_OK) status = qmm_gather_matmul(c->context, c->experts, c->x, 8, lhs, rhs, 16, c->out, NULL, NULL);
    if (status == QMM_OK) status = qmm_buffer_read(c->out, c->got, 16 * (FP_N / 4));
    CHECK(status == QMM_OK, "fp environment: gather on %d threads: %s", threads, qmm_last_error());
    return status == QMM_OK;
}

static void test_fp_environment(qmm_context *context) {
    check_rng rng = check_rng_make(0xfe7e);
    check_qmatrix q;
    if (!check_qmatrix_random(&rng, FP_N, FP_K, 4, 64, QMM_F32, &q)) {
        CHECK(false, "check_qmatrix_random failed");
        return;
    }
    fp_case c = {.context = context};
    float *x = malloc(FP_ROWS * FP_K * sizeof *x);
    unsigned char *first = malloc(FP_ROWS * FP_N * sizeof(float));
    c.got = malloc(FP_ROWS * FP_N * sizeof(float));
    CHECK_OK(qmm_weights_create(context, &q.m, &c.weights));
    CHECK_OK(qmm_weights_create_experts(context, &q.m, 4, &c.experts));
    CHECK_OK(qmm_buffer_create(context, QMM_F32, FP_ROWS * FP_K, &c.x));
    CHECK_OK(qmm_buffer_create(context, QMM_F32, FP_ROWS * FP_N, &c.out));
    if (!x || !first || !c.got || !c.weights || !c.experts || !c.x || !c.out) {
        CHECK(false, "fp environment: could not set up the case");
        goto cleanup;
    }
    fenv_t saved;
    fegetenv(&saved);
    enum { MODES = 3 };
    static const char *const names[MODES] = {"FE_UPWARD", "FE_TOWARDZERO", "FTZ|DAZ"};
    for (int mode = 0; mode < MODES; mode++) {
#if !(defined(__x86_64__) || defined(__i386__))
        if (mode == 2) continue; /* FTZ/DAZ: x86's MXCSR */
#endif
        check_fill_uniform(&rng, x, QMM_F32, FP_ROWS * FP_K, -1.0f, 1.0f);
        if (mode == 2)
            for (size_t i = 0; i < FP_ROWS * FP_K; i++) x[i] *= 0x1p-126f; /* about half of them denormal */
        CHECK_OK(qmm_buffer_write(c.x, x, FP_ROWS * FP_K));
        /* The team starts in the default environment, then the caller's changes. */
        fp_run(&c, 3, QMM_OP_QMM_T, 40, 0, 40 * FP_N);
#if defined(__x86_64__) || defined(__i386__)
        if (mode == 2) _mm_setcsr(_mm_getcsr() | 0x8040); /* FTZ (bit 15) and DAZ (bit 6) */
#endif
        if (mode == 0) fesetround(FE_UPWARD);
        if (mode == 1) fesetround(FE_TOWARDZERO);
        static const size_t ms[] = {1, 5, 40};
        for (size_t mi = 0; mi < 3; mi++)
            for (int threads = 1; threads <= 3; threads++) {
                if (!fp_run(&c, threads, QMM_OP_QMM_T, ms[mi], 0, ms[mi] * FP_N)) continue;
                if (threads == 1) memcpy(first, c.got, ms[mi] * FP_N * sizeof(float));
                else
                    CHECK(memcmp(first, c.got, ms[mi] * FP_N * sizeof(float)) == 0,
                          "fp environment %s: qmm_t M=%zu on %d threads differs from 1 thread", names[mode], ms[mi], threads);
            }
        for (int threads = 1; threads <= 3; threads++) { /* qmm_n: K = 512 of x's rows, N = 4096 */
            if (!fp_run(&c, threads, QMM_OP_QMM_N, 3, 0, 3 * FP_K)) continue;
            if (threads == 1) memcpy(first, c.got, 3 * FP_K * sizeof(float));
            else
                CHECK(memcmp(first, c.got, 3 * FP_K * sizeof(float)) == 0,
                      "fp environment %s: qmm_n M=3 on %d threads differs from 1 thread", names[mode], threads);
        }
        for (int threads = 1; threads <= 3; threads++) { /* batch-invariant: row 0 alone and inside M = 40 */
            if (!fp_run(&c, threads, QMM_OP_QMM_T, 1, 1, FP_N)) continue;
            memcpy(first, c.got, FP_N * sizeof(float));
            if (!fp_run(&c, threads, QMM_OP_QMM_T, 40, 1, 40 * FP_N)) continue;
            CHECK(memcmp(first, c.got, FP_N * sizeof(float)) == 0,
                  "fp environment %s: batch-invariant row 0 inside M=40 on %d threads differs from it alone",
                  names[mode], threads);
        }
        for (int threads = 1; threads <= 3; threads++) {
            if (!fp_gather(&c, threads)) continue;
            if (threads == 1) memcpy(first, c.got, 16 * (FP_N / 4) * sizeof(float));
            else
                CHECK(memcmp(first, c.got, 16 * (FP_N / 4) * sizeof(float)) == 0,
                      "fp environment %s: gather on %d threads differs from 1 thread", names[mode], threads);
        }
        fesetenv(&saved);
    }
    CHECK_OK(qmm_context_set_threads(context, 0));
cleanup:
    qmm_buffer_destroy(c.x);
    qmm_buffer_destroy(c.out);
    qmm_weights_destroy(c.weights);
    qmm_weights_destroy(c.experts);
    free(x);
    free(first);
    free(c.got);
    check_qmatrix_free(&q);
}

/* ───────────────────────────── 4. errors through qmm_matmul ───────────────────────────── */

static void test_errors(qmm_context *context) {
    check_rng rng = check_rng_make(0xe7707);
    qmm_weights *weights = make_weights(context, &rng, 4, 64, QMM_F32);
    qmm_buffer *x = NULL, *out = NULL;
    CHECK_OK(qmm_buffer_create(context, QMM_F32, 4 * K_T, &x));
    CHECK_OK(qmm_buffer_create(context, QMM_F32, 4 * N_T, &out));
    if (!weights || !x || !out) goto cleanup;
    float host[4 * K_T];
    check_fill_uniform(&rng, host, QMM_F32, 4 * K_T, -1.0f, 1.0f);
    CHECK_OK(qmm_buffer_write(x, host, 4 * K_T));
    /* A row without an order (the AVX-512 GEMV row: refused before its ISA is asked). */
    qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = "cpu.qmm_t.gemv.r8.avx512", .batch_invariant = 1};
    CHECK_STATUS(qmm_matmul(context, weights, x, 4, out, &options, NULL), QMM_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("forced kernel cpu.qmm_t.gemv.r8.avx512 does not support this call (M=4, N=52, K=384, qmm_t, "
                   "batch-invariant): kernel cpu.qmm_t.gemv.r8.avx512 does not declare a batch-invariant order "
                   "(docs/kernels.md §11: which rows do, and why the others do not), so it refuses batch-invariant "
                   "calls");
    CHECK_STATUS(qmm_select(context, weights, 4, &options, &(qmm_kernel_info){0}), QMM_ERR_UNSUPPORTED);
    EXPECT_CONTAINS("does not declare a batch-invariant order");
    /* The same row without the option is fine wherever its ISA is there. */
    options.batch_invariant = 0;
    if (qmm_kernel_supports(context, options.kernel, weights, 4, QMM_OP_QMM_T, NULL) == 1)
        CHECK_OK(qmm_matmul(context, weights, x, 4, out, &options, NULL));
    /* A row of another order than the call's: the reference row on a CPU whose tiled rows set the order. */
    qmm_matmul_options invariant = {.op = QMM_OP_QMM_T, .batch_invariant = 1};
    qmm_kernel_info chosen;
    CHECK_OK(qmm_select(context, weights, 4, &invariant, &chosen));
    options = (qmm_matmul_options){.op = QMM_OP_QMM_T, .kernel = "ref.qmm_t.scalar.r1", .batch_invariant = 1};
    if (chosen.batch_invariant_order && strcmp(chosen.batch_invariant_order, "oracle") != 0) {
        CHECK_STATUS(qmm_matmul(context, weights, x, 4, out, &options, NULL), QMM_ERR_UNSUPPORTED);
        char expected[512];
        snprintf(expected, sizeof expected,
                 "forced kernel ref.qmm_t.scalar.r1 reduces in batch-invariant order \"oracle\", but this call's order "
                 "is \"%s\"", chosen.batch_invariant_order);
        EXPECT_CONTAINS(expected);
    } else {
        CHECK_OK(qmm_matmul(context, weights, x, 4, out, &options, NULL));
    }
cleanup:
    qmm_buffer_destroy(x);
    qmm_buffer_destroy(out);
    qmm_weights_destroy(weights);
}

int main(void) {
    test_selector();
    static const qmm_backend backends[] = {QMM_BACKEND_REF, QMM_BACKEND_CPU, QMM_BACKEND_CUDA};
    const char *only = getenv("QMM_TEST_BACKEND"); /* as test_kernels: one backend's sections only */
    for (size_t b = 0; b < 3; b++) {
        if (only && *only && strcmp(only, qmm_backend_name(backends[b])) != 0) continue;
        qmm_context *context = NULL;
        const qmm_status status = qmm_context_create(backends[b], 0, &context);
        if (status != QMM_OK) {
            printf("SKIPPED backend %s: %s\n", qmm_backend_name(backends[b]), qmm_last_error());
            continue;
        }
        test_tables(context, qmm_backend_name(backends[b]));
        test_bits(context, qmm_backend_name(backends[b]));
        test_gather(context, qmm_backend_name(backends[b]));
        if (backends[b] == QMM_BACKEND_CPU) test_errors(context);
        if (backends[b] == QMM_BACKEND_CPU) test_ordered_blocks(context);
        if (backends[b] == QMM_BACKEND_CPU) test_fp_environment(context);
        qmm_context_destroy(context);
    }
    return check_finish("test_batch_invariant");
}
