/*
 * test_gather.c — the MoE gather op (MLX gather_qmm) through the oracle and the runtime:
 *   - qmm_ref_gather_qmm row i equals qmm_ref_qmm_t of x[lhs[i]] and expert rhs[i] alone, bit for bit;
 *   - every gather row of the ref backend equals the oracle bit for bit (ref.gather.blocks.r1 through
 *     ref.qmm_t.scalar.r1 per expert block; the selector's choice), sorted or not;
 *   - every bad input with its exact status and message, and out left untouched (indices are checked
 *     before any work);
 *   - qmm_select_gather names the row qmm_gather_matmul runs (ref and cpu, the selector, forced rows, batch-invariant
 *     mode, sorted or not), with qmm_gather_matmul's index errors under its own name.
 * The numerical grid (every format, odd N/K, every index pattern) is the kernel harness's job
 * (tests/kernels/test_kernels.c).
 */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT_MESSAGE(text)                                                                                 \
    CHECK(strcmp(qmm_last_error(), (text)) == 0, "message \"%s\", want \"%s\"", qmm_last_error(), (text))

enum { E = 4, N = 5, K = 64, T = 6 };

static void test_oracle_rows(check_rng *rng) {
    check_qmatrix q;
    CHECK(check_qmatrix_random(rng, E * N, K, 3, 32, QMM_BF16, &q), "matrix");
    uint16_t x[T * K], out[8 * N], want[N];
    check_fill_uniform(rng, x, QMM_BF16, T * K, -1, 1);
    const uint32_t lhs[8] = {5, 0, 0, 3, 2, 2, 1, 4}, rhs[8] = {3, 3, 0, 1, 1, 1, 3, 0};
    CHECK_OK(qmm_ref_gather_qmm(&q.m, E, x, T, lhs, rhs, 8, out));
    for (size_t i = 0; i < 8; i++) {
        qmm_qmatrix expert = q.m;
        expert.rows = N;
        expert.w = q.m.w + rhs[i] * N * qmm_packed_words(K, 3);
        expert.scales = (const uint16_t *)q.m.scales + rhs[i] * N * (K / 32);
        expert.biases = (const uint16_t *)q.m.biases + rhs[i] * N * (K / 32);
        CHECK_OK(qmm_ref_qmm_t(&expert, x + lhs[i] * K, 1, want));
        CHECK(memcmp(want, out + i * N, sizeof want) == 0, "oracle row %zu differs from qmm_ref_qmm_t alone", i);
    }
    /* The oracle's own argument checks. */
    double exact[8 * N];
    CHECK_STATUS(qmm_ref_gather_qmm(NULL, E, x, T, lhs, rhs, 8, out), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_ref_gather_qmm(&q.m, E, NULL, T, lhs, rhs, 8, out), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_ref_gather_qmm: x is NULL");
    CHECK_STATUS(qmm_ref_gather_qmm(&q.m, 3, x, T, lhs, rhs, 8, out), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_ref_gather_qmm: rows=20 of the stacked weights are not a multiple of expert_count=3");
    CHECK_STATUS(qmm_ref_gather_dense_f64(&q.m, E, x, 5, lhs, rhs, 8, exact, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_ref_gather_dense_f64: lhs_indices[0]=5 is out of range: x has T=5 rows (0..4)");
    CHECK_OK(qmm_ref_gather_dense_f64(&q.m, E, x, T, lhs, rhs, 8, exact, NULL));
    /* index arrays at addresses that are not multiples of 4 (read as uint32: refused before any read) */
    uint32_t spare[9] = {0};
    const uint32_t *odd = (const uint32_t *)((const char *)spare + 2);
    CHECK_STATUS(qmm_ref_gather_qmm(&q.m, E, x, T, lhs, odd, 8, out), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(qmm_last_error(), "qmm_ref_gather_qmm: rhs_indices at") && strstr(qmm_last_error(), "not 4-byte aligned"),
          "message: %s", qmm_last_error());
    CHECK_STATUS(qmm_ref_gather_qmm(&q.m, E, x, T, odd, rhs, 8, out), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(qmm_last_error(), "lhs_indices at") && strstr(qmm_last_error(), "not 4-byte aligned"), "message: %s",
          qmm_last_error());
    check_qmatrix_free(&q);
}

static void test_runtime(check_rng *rng) {
    qmm_context *context = NULL, *other = NULL;
    CHECK_OK(qmm_context_create(QMM_BACKEND_REF, 0, &context));
    CHECK_OK(qmm_context_create(QMM_BACKEND_REF, 0, &other));
    CHECK(strcmp(qmm_op_name(QMM_OP_GATHER), "gather") == 0, "op name");
    check_qmatrix q;
    CHECK(check_qmatrix_random(rng, E * N, K, 4, 64, QMM_F16, &q), "matrix");
    qmm_weights *weights = (qmm_weights *)&weights, *plain = NULL;
    CHECK_STATUS(qmm_weights_create_experts(context, &q.m, 0, &weights), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_weights_create_experts: expert_count=0, the weights need at least 1 expert");
    CHECK(weights == NULL, "a failed create must leave *weights NULL");
    CHECK_STATUS(qmm_weights_create_experts(context, &q.m, 3, &weights), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_weights_create_experts: rows=20 of the stacked matrix are not a multiple of expert_count=3");
    CHECK_STATUS(qmm_weights_create_experts(context, NULL, E, &weights), QMM_ERR_INVALID_ARGUMENT);
    CHECK_OK(qmm_weights_create_experts(context, &q.m, E, &weights));
    CHECK_OK(qmm_weights_create(context, &q.m, &plain));
    CHECK(qmm_weights_expert_count(weights) == E && qmm_weights_expert_count(plain) == 1 &&
              qmm_weights_expert_count(NULL) == 0,
          "expert counts");
    qmm_qmatrix described;
    CHECK_OK(qmm_weights_describe(weights, &described));
    CHECK(described.rows == E * N && described.cols == K, "describe gives the stacked format");

    uint16_t x_host[T * K], out_host[8 * N], want[8 * N];
    check_fill_uniform(rng, x_host, QMM_F16, T * K, -1, 1);
    qmm_buffer *x = NULL, *out = NULL, *small = NULL, *f32 = NULL, *foreign = NULL;
    CHECK_OK(qmm_buffer_create(context, QMM_F16, T * K, &x));
    CHECK_OK(qmm_buffer_create(context, QMM_F16, 8 * N, &out));
    CHECK_OK(qmm_buffer_create(context, QMM_F16, 8 * N - 1, &small));
    CHECK_OK(qmm_buffer_create(context, QMM_F32, 8 * N, &f32));
    CHECK_OK(qmm_buffer_create(other, QMM_F16, 8 * N, &foreign));
    CHECK_OK(qmm_buffer_write(x, x_host, T * K));

    /* Every row, sorted and unsorted pairs, lhs given or NULL: the oracle's bits. */
    const uint32_t lhs[8] = {5, 0, 0, 3, 2, 2, 1, 4};
    const uint32_t sorted[8] = {0, 0, 1, 1, 1, 3, 3, 3}, unsorted[8] = {3, 3, 0, 1, 1, 1, 3, 0};
    const uint32_t *rhs_sets[2] = {sorted, unsorted};
    const char *rows[3] = {NULL, "ref.gather.blocks.r1", "ref.gather.scalar.r1"};
    for (int r = 0; r < 2; r++)
        for (int l = 0; l < 2; l++) {
            const uint32_t *lhs_used = l ? NULL : lhs;
            const size_t B = l ? T : 8; /* lhs NULL: pair i uses row i, so B ≤ T */
            CHECK_OK(qmm_ref_gather_qmm(&q.m, E, x_host, T, lhs_used, rhs_sets[r], B, want));
            for (int k = 0; k < 3; k++) {
                qmm_gather_options options = {.kernel = rows[k], .sorted_indices = r == 0};
                qmm_kernel_info info = {0};
                CHECK_OK(qmm_buffer_poison(out));
                CHECK_OK(qmm_gather_matmul(context, weights, x, T, lhs_used, rhs_sets[r], B, out, &options, &info));
                CHECK_OK(qmm_buffer_read(out, out_host, B * N));
                CHECK(memcmp(out_host, want, B * N * sizeof *want) == 0, "%s, %s, lhs %s: differs from the oracle",
                      info.name ? info.name : "?", r ? "unsorted" : "sorted", l ? "NULL" : "given");
                CHECK(info.name && info.op == QMM_OP_GATHER, "ran %s", info.name ? info.name : "(none)");
                if (!rows[k]) CHECK(strcmp(info.name, "ref.gather.blocks.r1") == 0, "selector chose %s", info.name);
            }
        }
    /* Plain weights are one expert. */
    const uint32_t zeros[2] = {0, 0}, pair[2] = {1, 4};
    CHECK_OK(qmm_gather_matmul(context, plain, x, T, pair, zeros, 2, out, NULL, NULL));

    /* Bad indices: refused before any work, naming the array, the position, the value and the bound. */
    CHECK_OK(qmm_buffer_poison(out));
    const uint32_t bad_lhs[3] = {0, 6, 1}, bad_rhs[3] = {0, 1, 4};
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, bad_lhs, sorted, 3, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_gather_matmul: lhs_indices[1]=6 is out of range: x has T=6 rows (0..5)");
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, bad_rhs, 3, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_gather_matmul: rhs_indices[2]=4 is out of range: the weights hold 4 experts (0..3)");
    CHECK_STATUS(qmm_gather_matmul(context, plain, x, T, lhs, pair, 2, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_gather_matmul: rhs_indices[0]=1 is out of range: the weights hold 1 expert (0..0)");
    CHECK_OK(qmm_buffer_read(out, out_host, 8 * N));
    size_t written = 0;
    for (size_t i = 0; i < 8 * N; i++) written += !isnan(qmm_f16_to_f32(out_host[i]));
    CHECK(written == 0, "a refused gather wrote %zu outputs", written);

    qmm_gather_options promise = {.kernel = NULL, .sorted_indices = 1};
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, unsorted, 8, out, &promise, NULL),
                 QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_gather_matmul: sorted_indices is set but rhs_indices[2]=0 < rhs_indices[1]=3 (indices sorted "
                   "by expert must not decrease)");
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, NULL, sorted, 8, out, NULL, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_gather_matmul: lhs_indices is NULL (row i of x for pair i), so B=8 must be <= T=6");
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, NULL, 8, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_gather_matmul: rhs_indices is NULL");
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, sorted, 0, out, NULL, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_gather_matmul: B=0, a gather needs at least 1 (lhs, rhs) index pair");
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, 0, lhs, sorted, 8, out, NULL, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_gather_matmul: T=0, x needs at least 1 row");
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, SIZE_MAX / 8, lhs, sorted, 8, out, NULL, NULL),
                 QMM_ERR_OVERFLOW);

    /* Buffers and objects. */
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T + 1, lhs, sorted, 8, out, NULL, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_gather_matmul: x holds 384 elements but T*K = 7*64 = 448 are needed");
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, sorted, 8, small, NULL, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_gather_matmul: out holds 39 elements but B*N = 8*5 = 40 are needed");
    /* B past the index arrays' 8 entries and past out: refused on out's size before any index is read (ASan) */
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, sorted, 9, out, NULL, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_gather_matmul: out holds 40 elements but B*N = 9*5 = 45 are needed");
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, sorted, 8, f32, NULL, NULL), QMM_ERR_SHAPE);
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, sorted, 8, foreign, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, sorted, 1, x, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_gather_matmul: x and out are the same buffer");
    CHECK_STATUS(qmm_gather_matmul(other, weights, x, T, lhs, sorted, 8, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_gather_matmul: the weights belong to another context");
    CHECK_STATUS(qmm_gather_matmul(NULL, weights, x, T, lhs, sorted, 8, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_gather_matmul(context, NULL, x, T, lhs, sorted, 8, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);

    /* Kernels: forcing an unknown name or a row of another op. */
    qmm_gather_options unknown = {.kernel = "cpu.gather.blocks.r4"}, wrong = {.kernel = "ref.qmm_t.scalar.r1"};
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, sorted, 8, out, &unknown, NULL), QMM_ERR_NOT_FOUND);
    CHECK_STATUS(qmm_gather_matmul(context, weights, x, T, lhs, sorted, 8, out, &wrong, NULL), QMM_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("forced kernel ref.qmm_t.scalar.r1 does not support this call (M=8, N=5, K=64, gather): "
                   "kernel ref.qmm_t.scalar.r1 computes qmm_t, the call is gather");

    /* qmm_matmul refuses expert weights and the gather op. */
    qmm_matmul_options gather_op = {.op = QMM_OP_GATHER, .kernel = NULL};
    CHECK_STATUS(qmm_matmul(context, plain, x, 1, out, &gather_op, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_matmul: op=gather takes index arrays: call qmm_gather_matmul");
    CHECK_STATUS(qmm_matmul(context, weights, x, 1, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_matmul: the weights hold 4 experts (qmm_weights_create_experts); multiply them with "
                   "qmm_gather_matmul");
    CHECK(qmm_kernel_supports(context, "ref.gather.scalar.r1", plain, 1, QMM_OP_GATHER, NULL) == -1,
          "qmm_kernel_supports has no gather form: -1");

    qmm_buffer_destroy(x);
    qmm_buffer_destroy(out);
    qmm_buffer_destroy(small);
    qmm_buffer_destroy(f32);
    qmm_buffer_destroy(foreign);
    qmm_weights_destroy(weights);
    qmm_weights_destroy(plain);
    check_qmatrix_free(&q);
    qmm_context_destroy(context);
    qmm_context_destroy(other);
}

/* E random f32 experts of N×K (4-bit gs32) on a context of `backend`, x of T rows and out of 8 pairs' rows. */
typedef struct f32_stack {
    qmm_context *context;
    check_qmatrix q;
    qmm_weights *weights;
    qmm_buffer *x, *out;
} f32_stack;

static bool f32_stack_open(check_rng *rng, qmm_backend backend, f32_stack *s) {
    *s = (f32_stack){0};
    CHECK_OK(qmm_context_create(backend, 0, &s->context));
    if (!s->context) return false;
    CHECK(check_qmatrix_random(rng, E * N, K, 4, 32, QMM_F32, &s->q), "matrix");
    CHECK_OK(qmm_weights_create_experts(s->context, &s->q.m, E, &s->weights));
    CHECK_OK(qmm_buffer_create(s->context, QMM_F32, T * K, &s->x));
    CHECK_OK(qmm_buffer_create(s->context, QMM_F32, 8 * N, &s->out));
    return true;
}

static void f32_stack_close(f32_stack *s) {
    qmm_buffer_destroy(s->x);
    qmm_buffer_destroy(s->out);
    qmm_weights_destroy(s->weights);
    check_qmatrix_free(&s->q);
    qmm_context_destroy(s->context);
}

/* A forced name that is not registered lists every row of the context's table, whole: the CPU table's 16
 * names (398 characters) were cut at 255, mid-name, before the gather rows ("cpu.gather.blocks.av)"). */
static void test_unknown_kernel_names_every_row(check_rng *rng) {
    f32_stack stack;
    if (!f32_stack_open(rng, QMM_BACKEND_CPU, &stack)) return;
    qmm_context *context = stack.context;
    char want[1024] = "kernel \"nope\" is not registered (known: "; /* qmm_last_error holds 1024 */
    for (size_t i = 0; i < qmm_kernel_count(context); i++) {
        qmm_kernel_info info;
        CHECK_OK(qmm_kernel_get(context, i, &info));
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", i ? ", " : "", info.name);
    }
    snprintf(want + strlen(want), sizeof want - strlen(want), ")");
    const uint32_t rhs[T] = {0, 0, 1, 2, 3, 3};
    qmm_gather_options nope = {.kernel = "nope"};
    CHECK_STATUS(qmm_gather_matmul(context, stack.weights, stack.x, T, NULL, rhs, T, stack.out, &nope, NULL),
                 QMM_ERR_NOT_FOUND);
    EXPECT_MESSAGE(want);
    f32_stack_close(&stack);
}

/* qmm_select_gather: the row qmm_gather_matmul runs for the same arguments, without buffers; its errors. */
static void test_select_gather(check_rng *rng, qmm_backend backend) {
    f32_stack stack;
    if (!f32_stack_open(rng, backend, &stack)) return;
    qmm_context *context = stack.context;
    qmm_weights *weights = stack.weights;
    qmm_buffer *x = stack.x, *out = stack.out;
    const uint32_t lhs[8] = {5, 0, 0, 3, 2, 2, 1, 4};
    const uint32_t sorted[8] = {0, 0, 1, 1, 1, 3, 3, 3}, unsorted[8] = {3, 3, 0, 1, 1, 1, 3, 0};
    size_t compared = 0;
    for (size_t k = 0; k <= qmm_kernel_count(context); k++) { /* k = count: the selector */
        qmm_kernel_info row = {0};
        if (k < qmm_kernel_count(context)) {
            CHECK_OK(qmm_kernel_get(context, k, &row));
            if (row.op != QMM_OP_GATHER || qmm_kernel_usable(context, k, NULL) != 1) continue;
        }
        for (int invariant = 0; invariant < 2; invariant++)
            for (int s = 0; s < 2; s++) {
                qmm_gather_options options = {.kernel = row.name, .sorted_indices = s == 0, .batch_invariant = invariant};
                const uint32_t *rhs = s == 0 ? sorted : unsorted;
                qmm_kernel_info chosen = {0}, ran = {0};
                const qmm_status selected = qmm_select_gather(context, weights, T, lhs, rhs, 8, &options, &chosen);
                char why[1024];
                snprintf(why, sizeof why, "%s", qmm_last_error());
                const qmm_status status = qmm_gather_matmul(context, weights, x, T, lhs, rhs, 8, out, &options, &ran);
                CHECK(selected == status, "%s %s, option %d, %s: qmm_select_gather gave %s (%s), qmm_gather_matmul %s",
                      qmm_backend_name(backend), row.name ? row.name : "selector", invariant, s ? "unsorted" : "sorted",
                      qmm_status_string(selected), why, qmm_status_string(status));
                if (selected != QMM_OK || status != QMM_OK) continue;
                compared++;
                CHECK(chosen.name && ran.name && strcmp(chosen.name, ran.name) == 0 && chosen.op == QMM_OP_GATHER,
                      "%s %s, option %d: qmm_select_gather names %s, qmm_gather_matmul ran %s", qmm_backend_name(backend),
                      row.name ? row.name : "selector", invariant, chosen.name ? chosen.name : "(none)",
                      ran.name ? ran.name : "(none)");
            }
    }
    CHECK(compared >= 4, "%s: only %zu selections compared", qmm_backend_name(backend), compared);
    /* Errors: those of qmm_gather_matmul under its own name, info NULL; nothing about buffers. */
    qmm_kernel_info info;
    const uint32_t bad_rhs[3] = {0, 1, 4};
    CHECK_STATUS(qmm_select_gather(context, weights, T, lhs, bad_rhs, 3, NULL, &info), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_select_gather: rhs_indices[2]=4 is out of range: the weights hold 4 experts (0..3)");
    CHECK_STATUS(qmm_select_gather(context, weights, T, NULL, sorted, 8, NULL, &info), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_select_gather: lhs_indices is NULL (row i of x for pair i), so B=8 must be <= T=6");
    CHECK_STATUS(qmm_select_gather(context, weights, T, lhs, sorted, 8, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_select_gather: info is NULL");
    qmm_gather_options nope = {.kernel = "nope"}; /* info is checked before any choice */
    CHECK_STATUS(qmm_select_gather(context, weights, T, lhs, sorted, 8, &nope, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_select_gather: info is NULL");
    CHECK_STATUS(qmm_select_gather(NULL, weights, T, lhs, sorted, 8, NULL, &info), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_select_gather: context is NULL");
    qmm_gather_options promise = {.sorted_indices = 1}, unknown = {.kernel = "nope"};
    CHECK_STATUS(qmm_select_gather(context, weights, T, lhs, unsorted, 8, &promise, &info), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_select_gather(context, weights, T, lhs, sorted, 8, &unknown, &info), QMM_ERR_NOT_FOUND);
    f32_stack_close(&stack);
}

int main(void) {
    check_rng rng = check_rng_make(61);
    test_oracle_rows(&rng);
    test_runtime(&rng);
    test_select_gather(&rng, QMM_BACKEND_REF);
    test_select_gather(&rng, QMM_BACKEND_CPU);
    test_unknown_kernel_names_every_row(&rng);
    return check_finish("test_gather");
}
