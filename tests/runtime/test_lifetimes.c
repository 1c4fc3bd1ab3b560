/*
 * test_lifetimes.c — object lifetimes (include/qmm.h, "may be destroyed in any order"; issue 5 §3).
 *
 * A two-step chain x → (weights A) → y → (weights B) → z is built from one context, then the caller's
 * seven handles (context, A, B, x, y, z, chain) are destroyed in every one of the 7! = 5040 orders.
 * After each destroy, while the chain is alive, it runs again: with z still the caller's, z must equal
 * the oracle bit for bit; without, the run must still succeed. Under AddressSanitizer (make test-asan)
 * any use of freed memory fails the test. Also: a handle its caller destroyed while a chain still holds
 * it is refused with a message, a second destroy of such a handle is ignored, and a chain whose
 * context handle was destroyed still accepts steps. Gather weights follow the same rules.
 */
#include "check.h"

#include <stdlib.h>
#include <string.h>

#define EXPECT_MESSAGE(text)                                                                                 \
    CHECK(strcmp(qmm_last_error(), (text)) == 0, "message \"%s\", want \"%s\"", qmm_last_error(), (text))

enum { M = 3, K = 64, HIDDEN = 32, N = 32 }; /* x [M, K] · Aᵀ → y [M, HIDDEN] · Bᵀ → z [M, N] */

static check_qmatrix matrix_a, matrix_b; /* A: HIDDEN × K, B: N × HIDDEN, 4-bit gs32 f32 */
static float host_x[M * K], want_z[M * N];

typedef enum handle { CONTEXT, WEIGHTS_A, WEIGHTS_B, BUFFER_X, BUFFER_Y, BUFFER_Z, CHAIN, HANDLES } handle;
static const char *const handle_names[HANDLES] = {"context", "A", "B", "x", "y", "z", "chain"};

typedef struct fixture {
    qmm_context *context;
    qmm_weights *a, *b;
    qmm_buffer *x, *y, *z;
    qmm_chain *chain;
} fixture;

static bool fixture_make(fixture *f) {
    memset(f, 0, sizeof *f);
    bool ok = qmm_context_create(QMM_BACKEND_REF, 0, &f->context) == QMM_OK &&
              qmm_weights_create(f->context, &matrix_a.m, &f->a) == QMM_OK &&
              qmm_weights_create(f->context, &matrix_b.m, &f->b) == QMM_OK &&
              qmm_buffer_create(f->context, QMM_F32, M * K, &f->x) == QMM_OK &&
              qmm_buffer_create(f->context, QMM_F32, M * HIDDEN, &f->y) == QMM_OK &&
              qmm_buffer_create(f->context, QMM_F32, M * N, &f->z) == QMM_OK &&
              qmm_buffer_write(f->x, host_x, M * K) == QMM_OK && qmm_chain_create(f->context, &f->chain) == QMM_OK &&
              qmm_chain_add_matmul(f->chain, f->a, f->x, M, f->y, NULL) == QMM_OK &&
              qmm_chain_add_matmul(f->chain, f->b, f->y, M, f->z, NULL) == QMM_OK;
    CHECK(ok, "fixture: %s", qmm_last_error());
    return ok;
}

static void destroy_handle(fixture *f, handle which) {
    switch (which) {
    case CONTEXT: qmm_context_destroy(f->context), f->context = NULL; break;
    case WEIGHTS_A: qmm_weights_destroy(f->a), f->a = NULL; break;
    case WEIGHTS_B: qmm_weights_destroy(f->b), f->b = NULL; break;
    case BUFFER_X: qmm_buffer_destroy(f->x), f->x = NULL; break;
    case BUFFER_Y: qmm_buffer_destroy(f->y), f->y = NULL; break;
    case BUFFER_Z: qmm_buffer_destroy(f->z), f->z = NULL; break;
    case CHAIN: qmm_chain_destroy(f->chain), f->chain = NULL; break;
    default: break;
    }
}

/* Runs the chain if the caller still has it; checks z if the caller still has that. */
static bool run_and_check(fixture *f, const char *order) {
    if (!f->chain) return true;
    bool ok = true;
    if (f->z) ok = qmm_buffer_poison(f->z) == QMM_OK;
    qmm_status status = qmm_chain_run(f->chain);
    CHECK(status == QMM_OK, "order %s: chain run failed: %s", order, qmm_last_error());
    if (status != QMM_OK) return false;
    if (f->z) {
        float got[M * N];
        ok = ok && qmm_buffer_read(f->z, got, M * N) == QMM_OK && memcmp(got, want_z, sizeof got) == 0;
        CHECK(ok, "order %s: z differs from the oracle after the caller's destroys", order);
    }
    return ok;
}

/* Next permutation in lexicographic order; false after the last. */
static bool next_permutation(int *p, int n) {
    int i = n - 2;
    while (i >= 0 && p[i] >= p[i + 1]) i--;
    if (i < 0) return false;
    int j = n - 1;
    while (p[j] <= p[i]) j--;
    int t = p[i];
    p[i] = p[j], p[j] = t;
    for (int l = i + 1, r = n - 1; l < r; l++, r--) t = p[l], p[l] = p[r], p[r] = t;
    return true;
}

static void test_every_destroy_order(void) {
    int order[HANDLES];
    for (int i = 0; i < HANDLES; i++) order[i] = i;
    size_t orders = 0, failed = 0;
    do {
        char name[64] = "";
        for (int i = 0; i < HANDLES; i++) {
            strcat(name, handle_names[order[i]]);
            if (i + 1 < HANDLES) strcat(name, ",");
        }
        fixture f;
        if (!fixture_make(&f)) return;
        bool ok = run_and_check(&f, name);
        for (int i = 0; i < HANDLES && ok; i++) {
            destroy_handle(&f, (handle)order[i]);
            ok = run_and_check(&f, name);
        }
        for (int i = 0; i < HANDLES; i++) destroy_handle(&f, (handle)order[i]); /* after a failure */
        failed += !ok;
        orders++;
    } while (next_permutation(order, HANDLES) && failed < 3);
    CHECK(orders == 5040, "%zu destroy orders run, want 7! = 5040", orders);
    printf("destroy orders: %zu run, %zu failed\n", orders, failed);
}

/* The named orders of issue 5, each written out, so a failure points at one. */
static void test_named_orders(void) {
    fixture f;
    /* Weights destroyed, then the chain runs (was: reads freed weights). */
    if (!fixture_make(&f)) return;
    destroy_handle(&f, WEIGHTS_A), destroy_handle(&f, WEIGHTS_B);
    run_and_check(&f, "weights, then run");
    /* A handle the caller destroyed is refused while a chain keeps the object alive. */
    float host_out[M * N];
    CHECK_OK(qmm_buffer_read(f.z, host_out, M * N));
    qmm_buffer *z = f.z;
    destroy_handle(&f, BUFFER_Z);
    CHECK_STATUS(qmm_buffer_read(z, host_out, M * N), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_buffer_read: the buffer, destroyed with qmm_buffer_destroy, may not be used again (the "
                   "objects that use it keep it alive only for themselves)");
    qmm_buffer_destroy(z); /* a second destroy while the chain holds z is ignored */
    run_and_check(&f, "weights, z, z again, then run");
    for (int i = 0; i < HANDLES; i++) destroy_handle(&f, (handle)i);

    /* Context destroyed first, then its weights and buffers (was: weights destroy read the freed
     * context), without a chain. */
    if (!fixture_make(&f)) return;
    destroy_handle(&f, CHAIN);
    destroy_handle(&f, CONTEXT);
    destroy_handle(&f, WEIGHTS_A);
    destroy_handle(&f, BUFFER_X);
    destroy_handle(&f, WEIGHTS_B);
    destroy_handle(&f, BUFFER_Y);
    destroy_handle(&f, BUFFER_Z);

    /* Context destroyed, the chain still runs, accepts a step, and refuses destroyed weights. */
    if (!fixture_make(&f)) return;
    qmm_weights *a = f.a;
    destroy_handle(&f, CONTEXT);
    run_and_check(&f, "context, then run");
    CHECK_OK(qmm_chain_add_matmul(f.chain, f.b, f.y, M, f.z, NULL)); /* the same step again */
    CHECK(qmm_chain_length(f.chain) == 3, "chain length %zu, want 3", qmm_chain_length(f.chain));
    run_and_check(&f, "context, add, then run");
    destroy_handle(&f, WEIGHTS_A);
    CHECK_STATUS(qmm_chain_add_matmul(f.chain, a, f.x, M, f.y, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_chain_add_matmul: the weights, destroyed with qmm_weights_destroy, may not be used again "
                   "(the objects that use it keep it alive only for themselves)");
    qmm_buffer *x = f.x;
    destroy_handle(&f, BUFFER_X);
    CHECK_STATUS(qmm_chain_add_matmul(f.chain, f.b, x, M, f.y, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_chain_add_matmul: buffer x, destroyed with qmm_buffer_destroy, may not be used again (the "
                   "objects that use it keep it alive only for themselves)");
    for (int i = 0; i < HANDLES; i++) destroy_handle(&f, (handle)i);

    /* A destroyed context handle is refused where the caller passes it, even while objects hold it. */
    if (!fixture_make(&f)) return;
    qmm_context *context = f.context;
    destroy_handle(&f, CONTEXT);
    qmm_weights *w = (qmm_weights *)&w;
    CHECK_STATUS(qmm_weights_create(context, &matrix_a.m, &w), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_weights_create: the context, destroyed with qmm_context_destroy, may not be used again (the "
                   "objects that use it keep it alive only for themselves)");
    CHECK(w == NULL, "a refused create must leave *weights NULL");
    qmm_buffer *buffer = NULL;
    CHECK_STATUS(qmm_buffer_create(context, QMM_F32, 4, &buffer), QMM_ERR_INVALID_ARGUMENT);
    qmm_chain *chain = NULL;
    CHECK_STATUS(qmm_chain_create(context, &chain), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_matmul(context, f.a, f.x, M, f.y, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    qmm_kernel_info info;
    CHECK_STATUS(qmm_select(context, f.a, M, NULL, &info), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_kernel_get(context, 0, &info), QMM_ERR_INVALID_ARGUMENT);
    CHECK(qmm_kernel_supports(context, "ref.qmm_t.scalar.r1", f.a, M, QMM_OP_QMM_T, NULL) == -1,
          "qmm_kernel_supports on a destroyed context must return -1");
    CHECK_STATUS(qmm_context_set_threads(context, 1), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_context_set_threads: the context, destroyed with qmm_context_destroy, may not be used again "
                   "(the objects that use it keep it alive only for themselves)");
    qmm_context_destroy(context); /* ignored: the weights, buffers and chain still hold it */
    run_and_check(&f, "context twice, then run");
    for (int i = HANDLES - 1; i >= 0; i--) destroy_handle(&f, (handle)i);
}

/* Gather weights (qmm_weights_create_experts) are counted like any weights, and a gather call holds
 * nothing beyond the call: destroyed handles are refused, and any destroy order frees everything (under
 * ASan, a use of freed memory or a leak fails the test). */
static void test_gather_lifetimes(void) {
    enum { EXPERTS = 2, B = 4 }; /* matrix A's HIDDEN rows as 2 experts of HIDDEN/2 rows */
    const uint32_t rhs[B] = {0, 0, 1, 1}, lhs[B] = {0, 2, 1, 2};
    qmm_context *context = NULL;
    qmm_weights *experts = NULL, *one = NULL;
    qmm_buffer *x = NULL, *out = NULL, *y = NULL;
    qmm_chain *chain = NULL;
    CHECK_OK(qmm_context_create(QMM_BACKEND_REF, 0, &context));
    if (!context) return;
    CHECK_OK(qmm_weights_create_experts(context, &matrix_a.m, EXPERTS, &experts));
    CHECK_OK(qmm_weights_create_experts(context, &matrix_a.m, 1, &one));
    CHECK_OK(qmm_buffer_create(context, QMM_F32, M * K, &x));
    CHECK_OK(qmm_buffer_create(context, QMM_F32, B * HIDDEN, &out));
    CHECK_OK(qmm_buffer_create(context, QMM_F32, M * HIDDEN, &y));
    CHECK_OK(qmm_chain_create(context, &chain));
    if (!experts || !one || !x || !out || !y || !chain) return;
    CHECK_OK(qmm_buffer_write(x, host_x, M * K));
    CHECK_OK(qmm_gather_matmul(context, experts, x, M, lhs, rhs, B, out, NULL, NULL));
    /* Weights of one expert are plain weights: a chain step holds them like any other. */
    CHECK_OK(qmm_chain_add_matmul(chain, one, x, M, y, NULL));
    qmm_weights_destroy(one);
    CHECK_STATUS(qmm_gather_matmul(context, one, x, M, lhs, rhs, 1, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_gather_matmul: the weights, destroyed with qmm_weights_destroy, may not be used again (the "
                   "objects that use it keep it alive only for themselves)");
    CHECK_OK(qmm_chain_run(chain)); /* the chain still holds them */
    qmm_context_destroy(context);   /* the weights, buffers and chain still hold it */
    CHECK_STATUS(qmm_gather_matmul(context, experts, x, M, lhs, rhs, B, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_gather_matmul: the context, destroyed with qmm_context_destroy, may not be used again (the "
                   "objects that use it keep it alive only for themselves)");
    CHECK(qmm_weights_expert_count(experts) == EXPERTS, "expert count %zu, want %d", qmm_weights_expert_count(experts),
          EXPERTS);
    qmm_qmatrix format;
    CHECK_OK(qmm_weights_describe(experts, &format)); /* still the caller's */
    qmm_buffer_destroy(out);
    qmm_weights_destroy(experts);
    CHECK_OK(qmm_chain_run(chain));
    qmm_chain_destroy(chain); /* drops one and y ... */
    qmm_buffer_destroy(y);
    qmm_buffer_destroy(x); /* ... and the last holder of the context */
}

int main(void) {
    check_rng rng = check_rng_make(31);
    if (!check_qmatrix_random(&rng, HIDDEN, K, 4, 32, QMM_F32, &matrix_a) ||
        !check_qmatrix_random(&rng, N, HIDDEN, 4, 32, QMM_F32, &matrix_b)) {
        CHECK(false, "out of memory");
        return check_finish("test_lifetimes");
    }
    check_fill_uniform(&rng, host_x, QMM_F32, M * K, -1.0f, 1.0f);
    float y[M * HIDDEN];
    CHECK_OK(qmm_ref_qmm_t(&matrix_a.m, host_x, M, y));
    CHECK_OK(qmm_ref_qmm_t(&matrix_b.m, y, M, want_z));
    test_named_orders();
    test_gather_lifetimes();
    test_every_destroy_order();
    check_qmatrix_free(&matrix_a);
    check_qmatrix_free(&matrix_b);
    return check_finish("test_lifetimes");
}
