/*
 * test_runtime.c — context, weights, buffers, matmul, selection, kernel listing and chains
 * (include/qmm.h "Runtime" and "Chains"), and the stored-width path (on the ref backend's test knob
 * QMM_REF_STORED_BITS). Every bad input is checked for its exact status and message;
 * good calls are checked against the oracle on fresh random inputs.
 */
#include "check.h"
#include "internal.h"
#include "kernel.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPECT_MESSAGE(text)                                                                                 \
    CHECK(strcmp(qmm_last_error(), (text)) == 0, "message \"%s\", want \"%s\"", qmm_last_error(), (text))

/* The thread limit (qmm.h, qmm_max_threads): 8 × the CPUs online, at most QMM_MAX_THREADS. The limit itself
 * is accepted and a matmul large enough to start the team runs on it; one more, 100000 (which overflowed
 * libgomp's stack) and INT_MAX (whose per-thread scratch was 1 TB) are refused naming the value and the
 * limit, and leave the count as it was. */
static void test_thread_limit(qmm_context *context) {
    const int max = qmm_max_threads();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    const long want = online < 1 ? 8 : (8 * online > QMM_MAX_THREADS ? QMM_MAX_THREADS : 8 * online);
    CHECK(max == want, "qmm_max_threads() = %d, want %ld (8 x %ld online, at most %d)", max, want, online,
          QMM_MAX_THREADS);
    CHECK(qmm_context_threads(context) <= max, "default threads %d above the limit %d", qmm_context_threads(context),
          max);
    CHECK_OK(qmm_context_set_threads(context, max));
    const int at_max = qmm_context_threads(context);
    const int refused[] = {max + 1, 2000, 100000, INT_MAX};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        if (refused[i] <= max) continue;
        CHECK_STATUS(qmm_context_set_threads(context, refused[i]), QMM_ERR_INVALID_ARGUMENT);
        char want_message[256];
        snprintf(want_message, sizeof want_message,
                 "qmm_context_set_threads: threads=%d is above the limit %d (8 x the %ld CPUs online, at most "
                 "QMM_MAX_THREADS=%d)",
                 refused[i], max, online, QMM_MAX_THREADS);
        EXPECT_MESSAGE(want_message);
        CHECK(qmm_context_threads(context) == at_max, "threads %d after a refused %d, want %d unchanged",
              qmm_context_threads(context), refused[i], at_max);
    }
    /* 16 × 256 × 512 = 2^21 multiply-adds: above the one-thread cut-off, so the team of `max` starts. */
    check_rng rng = check_rng_make(77);
    check_qmatrix q;
    const size_t M = 16, N = 256, K = 512;
    if (!check_qmatrix_random(&rng, N, K, 4, 64, QMM_F32, &q)) {
        CHECK(false, "out of memory");
        return;
    }
    float *x = malloc(M * K * sizeof(float)), *out = malloc(M * N * sizeof(float));
    double *exact = malloc(M * N * sizeof(double)), *abs_dot = malloc(M * N * sizeof(double));
    qmm_weights *weights = NULL;
    qmm_buffer *xb = NULL, *ob = NULL;
    if (x && out && exact && abs_dot) {
        check_fill_uniform(&rng, x, QMM_F32, M * K, -1.0f, 1.0f);
        CHECK_OK(qmm_weights_create(context, &q.m, &weights));
        CHECK_OK(qmm_buffer_create(context, QMM_F32, M * K, &xb));
        CHECK_OK(qmm_buffer_create(context, QMM_F32, M * N, &ob));
        if (weights && xb && ob) {
            CHECK_OK(qmm_buffer_write(xb, x, M * K));
            const char *kernels[] = {NULL, "cpu.qmm_t.gemm.m32n12.avx512", "cpu.qmm_t.gemm.m16n6.avx2",
                                     "cpu.qmm_t.scalar.r1"};
            for (size_t k = 0; k < sizeof kernels / sizeof kernels[0]; k++) {
                const char *why_not = NULL;
                if (kernels[k] && qmm_kernel_supports(context, kernels[k], weights, M, QMM_OP_QMM_T, &why_not) != 1)
                    continue; /* an ISA this CPU lacks */
                qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = kernels[k]};
                CHECK_OK(qmm_buffer_poison(ob));
                CHECK_OK(qmm_matmul(context, weights, xb, M, ob, &options, NULL));
                CHECK_OK(qmm_buffer_read(ob, out, M * N));
                CHECK_OK(qmm_ref_dense_f64(&q.m, x, M, 1, exact, abs_dot));
                CHECK(check_against_oracle("matmul on qmm_max_threads() threads", out, QMM_F32, exact, abs_dot, M * N, K,
                                           1.0, NULL) == 0,
                      "%s on %d threads", kernels[k] ? kernels[k] : "the selector's row", at_max);
            }
        }
    }
    qmm_buffer_destroy(xb);
    qmm_buffer_destroy(ob);
    qmm_weights_destroy(weights);
    free(x);
    free(out);
    free(exact);
    free(abs_dot);
    check_qmatrix_free(&q);
    CHECK_OK(qmm_context_set_threads(context, 0));
}

static void test_context(void) {
    qmm_context *context = (qmm_context *)&context; /* must be reset to NULL on failure */
    CHECK_STATUS(qmm_context_create(QMM_BACKEND_REF, 0, NULL), QMM_ERR_INVALID_ARGUMENT);
    /* CUDA: not built (no nvcc at configure time) or no device here; a GPU machine creates it. */
    if (qmm_context_create(QMM_BACKEND_CUDA, 0, &context) == QMM_OK) {
        qmm_context_destroy(context);
        context = NULL;
    } else {
        CHECK(context == NULL, "a failed create must leave *context NULL");
        CHECK(strncmp(qmm_last_error(), "backend cuda is not built", 25) == 0 ||
                  strncmp(qmm_last_error(), "no CUDA device", 14) == 0,
              "cuda context message \"%s\"", qmm_last_error());
    }
    CHECK_STATUS(qmm_context_create((qmm_backend)7, 0, &context), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("backend=7 is not a qmm_backend (ref=0, cpu=1, cuda=2)");

    CHECK_OK(qmm_context_create(QMM_BACKEND_REF, 0, &context));
    CHECK(qmm_context_backend(context) == QMM_BACKEND_REF, "backend of a ref context");
    /* The ref backend runs one host thread: 0 and 1 are accepted, more is refused with the reason. */
    CHECK(qmm_context_threads(context) == 1, "ref threads %d, want 1", qmm_context_threads(context));
    CHECK_OK(qmm_context_set_threads(context, 1));
    CHECK_OK(qmm_context_set_threads(context, 0));
    CHECK_STATUS(qmm_context_set_threads(context, 2), QMM_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("qmm_context_set_threads: backend ref runs its kernels on one host thread, threads=2");
    CHECK_STATUS(qmm_context_set_threads(context, -1), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_context_set_threads: threads=-1 is negative (0 = the default)");
    CHECK_STATUS(qmm_context_set_threads(NULL, 1), QMM_ERR_INVALID_ARGUMENT);
    /* Above the limit is refused before the backend's rule (the value is wrong everywhere). */
    CHECK_STATUS(qmm_context_set_threads(context, INT_MAX), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(qmm_last_error(), "threads=2147483647 is above the limit") != NULL, "message: %s", qmm_last_error());
    CHECK(qmm_context_threads(NULL) == 0, "threads of NULL");
    CHECK(strcmp(qmm_backend_name(QMM_BACKEND_REF), "ref") == 0 && strcmp(qmm_backend_name(QMM_BACKEND_CUDA), "cuda") == 0,
          "backend names");
    CHECK(strcmp(qmm_op_name(QMM_OP_QMM_T), "qmm_t") == 0 && strcmp(qmm_op_name(QMM_OP_QMM_N), "qmm_n") == 0,
          "op names");

    /* The kernel listing: the reference rows, qmm_t first. */
    CHECK(qmm_kernel_count(context) == 4, "ref backend has %zu kernels, want 4", qmm_kernel_count(context));
    CHECK(qmm_kernel_count(NULL) == 0, "kernel count of NULL");
    qmm_kernel_info info;
    CHECK_OK(qmm_kernel_get(context, 0, &info));
    CHECK(strcmp(info.name, "ref.qmm_t.scalar.r1") == 0 && info.op == QMM_OP_QMM_T && info.tolerance_slack == 1.0 &&
              strcmp(info.family, "scalar") == 0 && info.bm == 1 && info.threads == 1,
          "row 0 is %s", info.name);
    CHECK_OK(qmm_kernel_get(context, 1, &info));
    CHECK(strcmp(info.name, "ref.qmm_n.scalar.r1") == 0 && info.op == QMM_OP_QMM_N, "row 1 is %s", info.name);
    CHECK_STATUS(qmm_kernel_get(context, 4, &info), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_kernel_get: index 4 is out of range: backend ref has 4 kernels");
    CHECK_STATUS(qmm_kernel_get(context, 0, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_kernel_get(NULL, 0, &info), QMM_ERR_INVALID_ARGUMENT);
    qmm_context_destroy(context);
    qmm_context_destroy(NULL);

    /* The CPU backend: its rows, then the reference rows; a thread count that defaults to the cores
     * this process may use (1 when built without OpenMP) and can be set and reset. */
    context = NULL;
    CHECK_OK(qmm_context_create(QMM_BACKEND_CPU, 0, &context));
    if (context) {
        CHECK(qmm_context_backend(context) == QMM_BACKEND_CPU, "backend of a cpu context");
        const size_t count = qmm_kernel_count(context);
        CHECK(count > 4, "cpu backend has %zu kernels", count);
        static const char *const ref_rows[4] = {"ref.qmm_t.scalar.r1", "ref.qmm_n.scalar.r1", "ref.gather.blocks.r1",
                                                "ref.gather.scalar.r1"};
        for (size_t r = 0; r < 4 && count > 4; r++) {
            CHECK_OK(qmm_kernel_get(context, count - 4 + r, &info));
            CHECK(strcmp(info.name, ref_rows[r]) == 0, "cpu row %zu is %s, want the ref rows last (%s)", count - 4 + r,
                  info.name, ref_rows[r]);
        }
        CHECK_OK(qmm_kernel_get(context, 0, &info));
        CHECK(strncmp(info.name, "cpu.", 4) == 0 && info.backend == QMM_BACKEND_CPU, "cpu row 0 is %s", info.name);
        const int initial = qmm_context_threads(context);
        CHECK(initial >= 1, "cpu default threads %d", initial);
        CHECK_OK(qmm_context_set_threads(context, 3));
        CHECK(qmm_context_threads(context) == 3 || qmm_context_threads(context) == 1, "cpu threads after set 3: %d",
              qmm_context_threads(context));
        CHECK_OK(qmm_context_set_threads(context, 0));
        CHECK(qmm_context_threads(context) == initial, "cpu threads after reset: %d, want %d",
              qmm_context_threads(context), initial);
        CHECK_STATUS(qmm_context_set_threads(context, -2), QMM_ERR_INVALID_ARGUMENT);
        test_thread_limit(context);
        qmm_context_destroy(context);
    }
}

static void test_buffers(qmm_context *context) {
    qmm_buffer *buffer = (qmm_buffer *)&buffer;
    CHECK_STATUS(qmm_buffer_create(NULL, QMM_F32, 4, &buffer), QMM_ERR_INVALID_ARGUMENT);
    CHECK(buffer == NULL, "a failed create must leave *buffer NULL");
    CHECK_STATUS(qmm_buffer_create(context, QMM_F32, 4, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_buffer_create(context, QMM_U8, 4, &buffer), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_buffer_create: dtype u8 is not an activation dtype (f32, f16, bf16)");
    CHECK_STATUS(qmm_buffer_create(context, QMM_F16, 0, &buffer), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_buffer_create: count=0, a buffer holds at least 1 element");
    CHECK_STATUS(qmm_buffer_create(context, QMM_F32, SIZE_MAX / 2, &buffer), QMM_ERR_OVERFLOW);
    CHECK(strstr(qmm_last_error(), "overflow") != NULL, "message: %s", qmm_last_error());

    CHECK_OK(qmm_buffer_create(context, QMM_BF16, 5, &buffer));
    CHECK(qmm_buffer_count(buffer) == 5 && qmm_buffer_dtype(buffer) == QMM_BF16, "buffer count/dtype");
    uint16_t host[6] = {1, 2, 3, 4, 5, 6}, back[6] = {0};
    CHECK_STATUS(qmm_buffer_write(buffer, host, 6), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_buffer_write: count=6 exceeds the buffer's 5 elements");
    CHECK_STATUS(qmm_buffer_read(buffer, back, 6), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_buffer_read: count=6 exceeds the buffer's 5 elements");
    CHECK_STATUS(qmm_buffer_write(buffer, NULL, 2), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_buffer_write(NULL, host, 2), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_buffer_read(buffer, NULL, 2), QMM_ERR_INVALID_ARGUMENT);
    CHECK_OK(qmm_buffer_write(buffer, host, 0)); /* nothing to copy is fine */
    CHECK_OK(qmm_buffer_write(buffer, host, 5));
    CHECK_OK(qmm_buffer_read(buffer, back, 5));
    CHECK(memcmp(host, back, 5 * sizeof(uint16_t)) == 0 && back[5] == 0, "buffer round trip");
    CHECK_OK(qmm_buffer_poison(buffer));
    CHECK_OK(qmm_buffer_read(buffer, back, 5));
    int not_nan = 0;
    for (int i = 0; i < 5; i++) not_nan += !isnan(qmm_bf16_to_f32(back[i]));
    CHECK(not_nan == 0, "poisoned bf16 buffer has %d non-NaN elements", not_nan);
    CHECK_STATUS(qmm_buffer_poison(NULL), QMM_ERR_INVALID_ARGUMENT);
    qmm_buffer_destroy(buffer);
    qmm_buffer_destroy(NULL);

    /* Poison crosses the runtime's 4096-element chunk: every element of every dtype must be NaN. */
    const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    for (int d = 0; d < 3; d++) {
        const size_t count = 4096 * 2 + 3;
        CHECK_OK(qmm_buffer_create(context, dtypes[d], count, &buffer));
        float *values = malloc(count * sizeof(float));
        void *raw = malloc(count * qmm_dtype_size(dtypes[d]));
        CHECK_OK(qmm_buffer_poison(buffer));
        CHECK_OK(qmm_buffer_read(buffer, raw, count));
        CHECK_OK(qmm_convert(raw, dtypes[d], values, QMM_F32, count));
        size_t finite = 0;
        for (size_t i = 0; i < count; i++) finite += !isnan(values[i]);
        CHECK(finite == 0, "poisoned %s buffer: %zu of %zu elements are not NaN", qmm_dtype_name(dtypes[d]), finite,
              count);
        free(values);
        free(raw);
        qmm_buffer_destroy(buffer);
    }
}

static void test_weights(qmm_context *context, check_rng *rng) {
    check_qmatrix q;
    if (!check_qmatrix_random(rng, 6, 96, 3, 32, QMM_F16, &q)) {
        CHECK(false, "out of memory");
        return;
    }
    qmm_weights *weights = (qmm_weights *)&weights;
    CHECK_STATUS(qmm_weights_create(context, NULL, &weights), QMM_ERR_INVALID_ARGUMENT);
    CHECK(weights == NULL, "a failed create must leave *weights NULL");
    CHECK_STATUS(qmm_weights_create(NULL, &q.m, &weights), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_weights_create(context, &q.m, NULL), QMM_ERR_INVALID_ARGUMENT);
    qmm_qmatrix bad = q.m;
    bad.bits = 7;
    CHECK_STATUS(qmm_weights_create(context, &bad, &weights), QMM_ERR_FORMAT);
    bad = q.m;
    bad.cols = 80;
    CHECK_STATUS(qmm_weights_create(context, &bad, &weights), QMM_ERR_SHAPE);
    bad = q.m;
    bad.w = NULL;
    CHECK_STATUS(qmm_weights_create(context, &bad, &weights), QMM_ERR_INVALID_ARGUMENT);
    bad = q.m;
    bad.rows = SIZE_MAX / 2;
    CHECK_STATUS(qmm_weights_create(context, &bad, &weights), QMM_ERR_OVERFLOW);

    CHECK_OK(qmm_weights_create(context, &q.m, &weights));
    qmm_qmatrix format;
    CHECK_OK(qmm_weights_describe(weights, &format));
    CHECK(format.w == NULL && format.scales == NULL && format.biases == NULL && format.rows == 6 && format.cols == 96 &&
              format.bits == 3 && format.group_size == 32 && format.dtype == QMM_F16,
          "describe: %zu×%zu %d-bit gs%d", format.rows, format.cols, format.bits, format.group_size);
    CHECK_STATUS(qmm_weights_describe(NULL, &format), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_weights_describe(weights, NULL), QMM_ERR_INVALID_ARGUMENT);

    /* The weights are a copy: scribbling over the caller's arrays must not change a product. */
    float x[96], before[6], after[6];
    check_fill_uniform(rng, x, QMM_F32, 96, -1.0f, 1.0f);
    uint16_t x16[96], out16[6];
    CHECK_OK(qmm_convert(x, QMM_F32, x16, QMM_F16, 96));
    qmm_buffer *xb, *ob;
    CHECK_OK(qmm_buffer_create(context, QMM_F16, 96, &xb));
    CHECK_OK(qmm_buffer_create(context, QMM_F16, 6, &ob));
    CHECK_OK(qmm_buffer_write(xb, x16, 96));
    CHECK_OK(qmm_matmul(context, weights, xb, 1, ob, NULL, NULL));
    CHECK_OK(qmm_buffer_read(ob, out16, 6));
    CHECK_OK(qmm_convert(out16, QMM_F16, before, QMM_F32, 6));
    memset(q.w, 0xA5, 6 * 96 * 3 / 32 * sizeof(uint32_t));
    memset(q.scales, 0, 6 * 3 * sizeof(uint16_t));
    CHECK_OK(qmm_matmul(context, weights, xb, 1, ob, NULL, NULL));
    CHECK_OK(qmm_buffer_read(ob, out16, 6));
    CHECK_OK(qmm_convert(out16, QMM_F16, after, QMM_F32, 6));
    CHECK(memcmp(before, after, sizeof before) == 0, "weights must not alias the caller's arrays");
    qmm_buffer_destroy(xb);
    qmm_buffer_destroy(ob);
    qmm_weights_destroy(weights);
    qmm_weights_destroy(NULL);
    check_qmatrix_free(&q);
}

/* Every bad input of qmm_matmul / qmm_select / qmm_kernel_supports. Weights 8×64 (4-bit gs32, f32):
 * qmm_t has N = 8, K = 64; qmm_n has K = 8, N = 64. */
static void test_matmul_errors(qmm_context *context, check_rng *rng) {
    check_qmatrix q;
    if (!check_qmatrix_random(rng, 8, 64, 4, 32, QMM_F32, &q)) {
        CHECK(false, "out of memory");
        return;
    }
    qmm_weights *weights;
    CHECK_OK(qmm_weights_create(context, &q.m, &weights));
    qmm_buffer *x, *out, *small, *x16, *big;
    CHECK_OK(qmm_buffer_create(context, QMM_F32, 2 * 64, &x));
    CHECK_OK(qmm_buffer_create(context, QMM_F32, 2 * 64, &out));
    CHECK_OK(qmm_buffer_create(context, QMM_F32, 100, &small));
    CHECK_OK(qmm_buffer_create(context, QMM_F16, 2 * 64, &x16));
    CHECK_OK(qmm_buffer_create(context, QMM_F32, 4 * 64, &big));
    CHECK_OK(qmm_buffer_poison(x));

    CHECK_STATUS(qmm_matmul(NULL, weights, x, 2, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_matmul: context is NULL");
    CHECK_STATUS(qmm_matmul(context, NULL, x, 2, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_matmul: weights is NULL");
    CHECK_STATUS(qmm_matmul(context, weights, NULL, 2, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_matmul: x is NULL");
    CHECK_STATUS(qmm_matmul(context, weights, x, 2, NULL, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_matmul: out is NULL");
    CHECK_STATUS(qmm_matmul(context, weights, x, 0, out, NULL, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_matmul: M=0, a matmul needs M >= 1 rows of x");
    /* M·K overflows: K = 64, M = SIZE_MAX/32. */
    char expected[160];
    CHECK_STATUS(qmm_matmul(context, weights, x, SIZE_MAX / 32, out, NULL, NULL), QMM_ERR_OVERFLOW);
    snprintf(expected, sizeof expected, "qmm_matmul: x of M*K = %zu*64 f32 elements overflows size_t", SIZE_MAX / 32);
    EXPECT_MESSAGE(expected);
    /* M·K fits but the bytes of x do not: M = SIZE_MAX/128 (×64 fits, ×4 bytes does not). */
    CHECK_STATUS(qmm_matmul(context, weights, x, SIZE_MAX / 128, out, NULL, NULL), QMM_ERR_OVERFLOW);
    snprintf(expected, sizeof expected, "qmm_matmul: x of M*K = %zu*64 f32 elements overflows size_t", SIZE_MAX / 128);
    EXPECT_MESSAGE(expected);
    /* qmm_n: K = 8 rows, N = 64: M = SIZE_MAX/64 keeps x's M·K bytes but not out's M·N. */
    CHECK_STATUS(qmm_matmul(context, weights, x, SIZE_MAX / 64, out, &(qmm_matmul_options){.op = QMM_OP_QMM_N}, NULL),
                 QMM_ERR_OVERFLOW);
    snprintf(expected, sizeof expected, "qmm_matmul: out of M*N = %zu*64 f32 elements overflows size_t", SIZE_MAX / 64);
    EXPECT_MESSAGE(expected);
    /* x too small: M = 2 needs 2*64 = 128, small has 100. */
    CHECK_STATUS(qmm_matmul(context, weights, small, 2, out, NULL, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_matmul: x holds 100 elements but M*K = 2*64 = 128 are needed");
    /* out too small for qmm_n: M·N = 2*64 = 128. */
    qmm_matmul_options qmm_n = {.op = QMM_OP_QMM_N, .kernel = NULL};
    CHECK_STATUS(qmm_matmul(context, weights, x, 2, small, &qmm_n, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_matmul: out holds 100 elements but M*N = 2*64 = 128 are needed");
    CHECK_STATUS(qmm_matmul(context, weights, x16, 2, out, NULL, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_matmul: x has dtype f16 but the weights' scales are f32 (x and out must match them)");
    CHECK_STATUS(qmm_matmul(context, weights, x, 2, x16, NULL, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_matmul: out has dtype f16 but the weights' scales are f32 (x and out must match them)");
    CHECK_STATUS(qmm_matmul(context, weights, big, 2, big, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_matmul: x and out are the same buffer");
    qmm_matmul_options bad_op = {.op = (qmm_op)5, .kernel = NULL};
    CHECK_STATUS(qmm_matmul(context, weights, x, 2, out, &bad_op, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_matmul: op=5 is not a qmm_op (qmm_t=0, qmm_n=1)");
    qmm_matmul_options unknown = {.op = QMM_OP_QMM_T, .kernel = "cuda.qmm_t.gemv.r8"};
    CHECK_STATUS(qmm_matmul(context, weights, x, 2, out, &unknown, NULL), QMM_ERR_NOT_FOUND);
    EXPECT_MESSAGE("kernel \"cuda.qmm_t.gemv.r8\" is not registered (known: ref.qmm_t.scalar.r1, ref.qmm_n.scalar.r1, ref.gather.blocks.r1, ref.gather.scalar.r1)");
    /* a forced name's bytes go into the message escaped (no raw control byte) */
    qmm_matmul_options control = {.op = QMM_OP_QMM_T, .kernel = "\x1b[31mref"};
    CHECK_STATUS(qmm_matmul(context, weights, x, 2, out, &control, NULL), QMM_ERR_NOT_FOUND);
    CHECK(strchr(qmm_last_error(), 0x1b) == NULL && strstr(qmm_last_error(), "[31mref") != NULL, "escaped: %s",
          qmm_last_error());
    qmm_matmul_options wrong_op = {.op = QMM_OP_QMM_T, .kernel = "ref.qmm_n.scalar.r1"};
    CHECK_STATUS(qmm_matmul(context, weights, x, 2, out, &wrong_op, NULL), QMM_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("forced kernel ref.qmm_n.scalar.r1 does not support this call (M=2, N=8, K=64, qmm_t): "
                   "kernel ref.qmm_n.scalar.r1 computes qmm_n, the call is qmm_t");

    /* Objects of another context. */
    qmm_context *other;
    CHECK_OK(qmm_context_create(QMM_BACKEND_REF, 0, &other));
    qmm_buffer *foreign;
    CHECK_OK(qmm_buffer_create(other, QMM_F32, 2 * 64, &foreign));
    CHECK_STATUS(qmm_matmul(other, weights, foreign, 2, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_matmul: the weights belong to another context");
    CHECK_STATUS(qmm_matmul(context, weights, foreign, 2, out, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_matmul: buffer x belongs to another context");
    qmm_buffer_destroy(foreign);
    qmm_context_destroy(other);

    /* Failed calls must not have touched out. */
    float host_out[128];
    CHECK_OK(qmm_buffer_poison(out));
    CHECK_STATUS(qmm_matmul(context, weights, x, 0, out, NULL, NULL), QMM_ERR_SHAPE);
    CHECK_OK(qmm_buffer_read(out, host_out, 128));
    CHECK(isnan(host_out[0]) && isnan(host_out[127]), "a refused matmul wrote its output");

    /* qmm_select: same validation, and the choice for each op. */
    qmm_kernel_info info;
    CHECK_STATUS(qmm_select(context, weights, 0, NULL, &info), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_select: M=0, a matmul needs M >= 1 rows of x");
    CHECK_STATUS(qmm_select(context, weights, 1, NULL, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_select(context, weights, 1, &unknown, &info), QMM_ERR_NOT_FOUND);
    CHECK_STATUS(qmm_select(context, weights, 1, &wrong_op, &info), QMM_ERR_UNSUPPORTED);
    CHECK_OK(qmm_select(context, weights, 3, NULL, &info));
    CHECK(strcmp(info.name, "ref.qmm_t.scalar.r1") == 0, "default selection is %s", info.name);
    CHECK_OK(qmm_select(context, weights, 3, &qmm_n, &info));
    CHECK(strcmp(info.name, "ref.qmm_n.scalar.r1") == 0, "qmm_n selection is %s", info.name);

    /* qmm_kernel_supports: 1, 0 with a reason, -1 with a message. */
    const char *why = NULL;
    CHECK(qmm_kernel_supports(context, "ref.qmm_t.scalar.r1", weights, 4, QMM_OP_QMM_T, &why) == 1, "supports qmm_t");
    CHECK(qmm_kernel_supports(context, "ref.qmm_t.scalar.r1", weights, 4, QMM_OP_QMM_N, &why) == 0, "refuses qmm_n");
    CHECK(why && strcmp(why, "kernel ref.qmm_t.scalar.r1 computes qmm_t, the call is qmm_n") == 0, "why_not: %s",
          why ? why : "(null)");
    CHECK(qmm_kernel_supports(context, "ref.qmm_n.scalar.r1", weights, 0, QMM_OP_QMM_N, &why) == 0, "refuses M=0");
    CHECK(why && strstr(why, "M=0") != NULL, "why_not for M=0: %s", why ? why : "(null)");
    qmm_error_clear();
    CHECK(qmm_kernel_supports(context, "no.such.kernel", weights, 4, QMM_OP_QMM_T, &why) == -1, "unknown name");
    EXPECT_MESSAGE("qmm_kernel_supports: kernel \"no.such.kernel\" is not registered in backend ref");
    CHECK(qmm_kernel_supports(context, "no\x1b[0m", weights, 4, QMM_OP_QMM_T, &why) == -1, "unknown name");
    CHECK(strchr(qmm_last_error(), 0x1b) == NULL, "escaped: %s", qmm_last_error());
    CHECK(qmm_kernel_supports(context, NULL, weights, 4, QMM_OP_QMM_T, &why) == -1, "NULL name");
    CHECK(qmm_kernel_supports(NULL, "ref.qmm_t.scalar.r1", weights, 4, QMM_OP_QMM_T, &why) == -1, "NULL context");
    CHECK(qmm_kernel_supports(context, "ref.qmm_t.scalar.r1", NULL, 4, QMM_OP_QMM_T, NULL) == -1, "NULL weights");

    /* qmm_kernel_usable: the reference rows run anywhere; bad arguments give -1 with a message. */
    for (size_t i = 0; i < qmm_kernel_count(context); i++)
        CHECK(qmm_kernel_usable(context, i, &why) == 1 && why && why[0] == '\0', "row %zu usable", i);
    CHECK(qmm_kernel_usable(context, qmm_kernel_count(context), NULL) == -1, "index out of range");
    {
        char want[160];
        snprintf(want, sizeof want, "qmm_kernel_usable: index %zu is out of range: backend ref has %zu kernels",
                 qmm_kernel_count(context), qmm_kernel_count(context));
        EXPECT_MESSAGE(want);
    }
    CHECK(qmm_kernel_usable(NULL, 0, &why) == -1, "NULL context");
    EXPECT_MESSAGE("qmm_kernel_usable: context is NULL");

    qmm_buffer_destroy(x);
    qmm_buffer_destroy(out);
    qmm_buffer_destroy(small);
    qmm_buffer_destroy(x16);
    qmm_buffer_destroy(big);
    qmm_weights_destroy(weights);
    check_qmatrix_free(&q);
}

/* Plumbing: one product through the runtime (weights copied, buffers written and read, the op and
 * the N/K roles passed through, the selector's row run) must be the oracle's, bit for bit — the ref
 * rows call the oracle, so this catches wiring mistakes, not numeric ones. The numbers themselves are
 * checked against the f64 oracle and MLX by test_oracle, test_kernels, test_seed and mlx_crosscheck. */
static void check_product(qmm_context *context, const check_qmatrix *q, qmm_op op, size_t M, check_rng *rng) {
    const size_t N = op == QMM_OP_QMM_T ? q->m.rows : q->m.cols, K = op == QMM_OP_QMM_T ? q->m.cols : q->m.rows;
    const qmm_dtype dtype = q->m.dtype;
    const size_t size = qmm_dtype_size(dtype);
    void *x = malloc(M * K * size), *want = malloc(M * N * size), *got = malloc(M * N * size);
    check_fill_uniform(rng, x, dtype, M * K, -1.0f, 1.0f);
    CHECK_OK(op == QMM_OP_QMM_T ? qmm_ref_qmm_t(&q->m, x, M, want) : qmm_ref_qmm_n(&q->m, x, M, want));
    qmm_weights *weights;
    qmm_buffer *xb, *ob;
    CHECK_OK(qmm_weights_create(context, &q->m, &weights));
    CHECK_OK(qmm_buffer_create(context, dtype, M * K, &xb));
    CHECK_OK(qmm_buffer_create(context, dtype, M * N, &ob));
    CHECK_OK(qmm_buffer_write(xb, x, M * K));
    CHECK_OK(qmm_buffer_poison(ob));
    qmm_matmul_options options = {.op = op, .kernel = NULL};
    qmm_kernel_info info = {0};
    CHECK_OK(qmm_matmul(context, weights, xb, M, ob, &options, &info));
    CHECK(info.name && info.op == op, "matmul reported kernel %s", info.name ? info.name : "(none)");
    CHECK_OK(qmm_buffer_read(ob, got, M * N));
    CHECK(memcmp(want, got, M * N * size) == 0, "%s %s M=%zu N=%zu K=%zu: runtime product differs from the oracle",
          qmm_op_name(op), qmm_dtype_name(dtype), M, N, K);
    qmm_buffer_destroy(xb);
    qmm_buffer_destroy(ob);
    qmm_weights_destroy(weights);
    free(x);
    free(want);
    free(got);
}

static void test_matmul_products(qmm_context *context, check_rng *rng) {
    const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    for (int d = 0; d < 3; d++) {
        check_qmatrix q;
        /* 12 rows × 192 cols, 5-bit gs64: qmm_t is N=12, K=192; qmm_n is K=12, N=192. */
        if (!check_qmatrix_random(rng, 12, 192, 5, 64, dtypes[d], &q)) {
            CHECK(false, "out of memory");
            return;
        }
        check_product(context, &q, QMM_OP_QMM_T, 3, rng);
        check_product(context, &q, QMM_OP_QMM_N, 5, rng);
        check_qmatrix_free(&q);
    }
}

/* The stored-width path (kernel.h, stored_bits; the CUDA backend stores 2/3-bit codes as 4-bit and 5/6-bit as 8-bit),
 * run on the ref backend by its test knob QMM_REF_STORED_BITS=1: for 2, 3, 5 and 6 bits and each dtype, weights made
 * with the knob give bit for bit the outputs of weights made without it — qmm_t (M = 3), qmm_n (M = 5) and a gather
 * of 3 experts — their calls carry the stored width in bits and the caller's in format_bits (the tuning key),
 * qmm_weights_describe keeps the caller's width; a bad knob value is an error naming it. The knob's value from outside
 * the test is put back after each use. */
static char *stored_knob_outside; /* QMM_REF_STORED_BITS as the test found it (NULL: unset) */
static void stored_knob(const char *value) { /* NULL: unset */
    if (value) setenv("QMM_REF_STORED_BITS", value, 1);
    else unsetenv("QMM_REF_STORED_BITS");
}
static void stored_knob_restore(void) { stored_knob(stored_knob_outside); }

static qmm_status stored_run(qmm_context *context, const check_qmatrix *q, int wide, qmm_op op, size_t M,
                             const void *x_host, void *out_host) {
    stored_knob(wide ? "1" : NULL);
    qmm_weights *weights = NULL;
    qmm_status status = qmm_weights_create(context, &q->m, &weights);
    stored_knob_restore();
    qmm_buffer *x = NULL, *out = NULL;
    const size_t k = op == QMM_OP_QMM_T ? q->m.cols : q->m.rows, n = op == QMM_OP_QMM_T ? q->m.rows : q->m.cols;
    qmm_qmatrix described;
    if (status == QMM_OK && (status = qmm_weights_describe(weights, &described)) == QMM_OK)
        CHECK(described.bits == q->m.bits, "stored bits: qmm_weights_describe says %d-bit for %d-bit weights (knob %d)",
              described.bits, q->m.bits, wide);
    qmm_matmul_options options = {.op = op};
    qmm_call call;
    if (status == QMM_OK && (status = qmm_prepare_call("test", context, weights, M, &options, &call)) == QMM_OK) {
        const int want = wide ? (q->m.bits <= 4 ? 4 : 8) : q->m.bits;
        CHECK(call.bits == want && call.format_bits == q->m.bits,
              "stored bits: a call on %d-bit weights (knob %d) carries bits %d, format_bits %d (want %d, %d)", q->m.bits,
              wide, call.bits, call.format_bits, want, q->m.bits);
    }
    if (status == QMM_OK) status = qmm_buffer_create(context, q->m.dtype, M * k, &x);
    if (status == QMM_OK) status = qmm_buffer_create(context, q->m.dtype, M * n, &out);
    if (status == QMM_OK) status = qmm_buffer_write(x, x_host, M * k);
    if (status == QMM_OK) status = qmm_buffer_poison(out);
    if (status == QMM_OK) status = qmm_matmul(context, weights, x, M, out, &options, NULL);
    if (status == QMM_OK) status = qmm_buffer_read(out, out_host, M * n);
    qmm_buffer_destroy(x);
    qmm_buffer_destroy(out);
    qmm_weights_destroy(weights);
    return status;
}

static qmm_status stored_gather(qmm_context *context, const check_qmatrix *q, int wide, const void *x_host,
                                void *out_host) {
    static const uint32_t lhs[] = {0, 1, 1, 0, 1}, rhs[] = {2, 0, 2, 1, 1};
    stored_knob(wide ? "1" : NULL);
    qmm_weights *experts = NULL;
    qmm_status status = qmm_weights_create_experts(context, &q->m, 3, &experts);
    stored_knob_restore();
    qmm_buffer *x = NULL, *out = NULL;
    const size_t n = q->m.rows / 3;
    if (status == QMM_OK) status = qmm_buffer_create(context, q->m.dtype, 2 * q->m.cols, &x);
    if (status == QMM_OK) status = qmm_buffer_create(context, q->m.dtype, 5 * n, &out);
    if (status == QMM_OK) status = qmm_buffer_write(x, x_host, 2 * q->m.cols);
    if (status == QMM_OK) status = qmm_buffer_poison(out);
    if (status == QMM_OK) status = qmm_gather_matmul(context, experts, x, 2, lhs, rhs, 5, out, NULL, NULL);
    if (status == QMM_OK) status = qmm_buffer_read(out, out_host, 5 * n);
    qmm_buffer_destroy(x);
    qmm_buffer_destroy(out);
    qmm_weights_destroy(experts);
    return status;
}

static void test_stored_bits(qmm_context *context, check_rng *rng) {
    const char *outside = getenv("QMM_REF_STORED_BITS");
    stored_knob_outside = outside ? strdup(outside) : NULL;
    static const int widths[] = {2, 3, 5, 6};
    static const int group_sizes[] = {32, 64, 128};
    static const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    enum { ROWS = 24, COLS = 256, M_MAX = 5 };
    for (size_t b = 0; b < 4; b++)
        for (size_t d = 0; d < 3; d++) {
            const int bits = widths[b], group_size = group_sizes[(b + d) % 3];
            const size_t size = qmm_dtype_size(dtypes[d]);
            check_qmatrix q;
            if (!check_qmatrix_random(rng, ROWS, COLS, bits, group_size, dtypes[d], &q)) {
                CHECK(false, "stored bits: out of memory");
                return;
            }
            unsigned char x[M_MAX * COLS * 4], plain[M_MAX * COLS * 4], wide[M_MAX * COLS * 4];
            check_fill_uniform(rng, x, dtypes[d], M_MAX * COLS, -1.0f, 1.0f);
            static const struct { qmm_op op; size_t M, n; const char *name; } runs[] = {
                {QMM_OP_QMM_T, 3, ROWS, "qmm_t"}, {QMM_OP_QMM_N, 5, COLS, "qmm_n"}};
            for (size_t r = 0; r < 2; r++) {
                CHECK_OK(stored_run(context, &q, 0, runs[r].op, runs[r].M, x, plain));
                CHECK_OK(stored_run(context, &q, 1, runs[r].op, runs[r].M, x, wide));
                CHECK(memcmp(plain, wide, runs[r].M * runs[r].n * size) == 0,
                      "stored bits: %s of %d-bit gs%d %s weights stored as %d-bit differs", runs[r].name, bits,
                      group_size, qmm_dtype_name(dtypes[d]), bits <= 4 ? 4 : 8);
            }
            CHECK_OK(stored_gather(context, &q, 0, x, plain));
            CHECK_OK(stored_gather(context, &q, 1, x, wide));
            CHECK(memcmp(plain, wide, 5 * (ROWS / 3) * size) == 0,
                  "stored bits: a gather of %d-bit gs%d %s experts stored wider differs", bits, group_size,
                  qmm_dtype_name(dtypes[d]));
            if (b == 0 && d == 0) { /* the knob's rule */
                stored_knob("yes");
                qmm_weights *weights = NULL;
                CHECK_STATUS(qmm_weights_create(context, &q.m, &weights), QMM_ERR_INVALID_ARGUMENT);
                EXPECT_MESSAGE("QMM_REF_STORED_BITS=yes: the knob takes 0 or 1");
                CHECK(weights == NULL, "stored bits: a refused qmm_weights_create left weights");
                stored_knob_restore();
            }
            check_qmatrix_free(&q);
        }
    free(stored_knob_outside);
    stored_knob_outside = NULL;
}

/* A chain of three matmuls: two qmm_t products feeding nothing and one qmm_n, each step timed. */
static void test_chain(qmm_context *context, check_rng *rng) {
    qmm_chain *chain = (qmm_chain *)&chain;
    CHECK_STATUS(qmm_chain_create(NULL, &chain), QMM_ERR_INVALID_ARGUMENT);
    CHECK(chain == NULL, "a failed create must leave *chain NULL");
    CHECK_STATUS(qmm_chain_create(context, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK_OK(qmm_chain_create(context, &chain));
    CHECK(qmm_chain_length(chain) == 0 && qmm_chain_length(NULL) == 0, "a new chain is empty");

    check_qmatrix a, b;
    if (!check_qmatrix_random(rng, 24, 128, 4, 64, QMM_BF16, &a) ||
        !check_qmatrix_random(rng, 128, 96, 6, 32, QMM_BF16, &b)) {
        CHECK(false, "out of memory");
        return;
    }
    const size_t M = 4;
    qmm_weights *wa, *wb;
    CHECK_OK(qmm_weights_create(context, &a.m, &wa));
    CHECK_OK(qmm_weights_create(context, &b.m, &wb));
    /* step 0: x0[4×128] · Aᵀ → y0[4×24]; step 1: x1[4×96] · Bᵀ → y1[4×128]; step 2: y1[4×128] · B → y2[4×96]
     * (qmm_n: B is K=128 rows × N=96 cols), reading step 1's output. */
    qmm_buffer *x0, *x1, *y0, *y1, *y2;
    CHECK_OK(qmm_buffer_create(context, QMM_BF16, M * 128, &x0));
    CHECK_OK(qmm_buffer_create(context, QMM_BF16, M * 96, &x1));
    CHECK_OK(qmm_buffer_create(context, QMM_BF16, M * 24, &y0));
    CHECK_OK(qmm_buffer_create(context, QMM_BF16, M * 128, &y1));
    CHECK_OK(qmm_buffer_create(context, QMM_BF16, M * 96, &y2));
    uint16_t hx0[4 * 128], hx1[4 * 96];
    check_fill_uniform(rng, hx0, QMM_BF16, M * 128, -1.0f, 1.0f);
    check_fill_uniform(rng, hx1, QMM_BF16, M * 96, -1.0f, 1.0f);
    CHECK_OK(qmm_buffer_write(x0, hx0, M * 128));
    CHECK_OK(qmm_buffer_write(x1, hx1, M * 96));

    qmm_matmul_options forced_t = {.op = QMM_OP_QMM_T, .kernel = "ref.qmm_t.scalar.r1"};
    qmm_matmul_options op_n = {.op = QMM_OP_QMM_N, .kernel = NULL};
    CHECK_OK(qmm_chain_add_matmul(chain, wa, x0, M, y0, NULL));
    CHECK_OK(qmm_chain_add_matmul(chain, wb, x1, M, y1, &forced_t));
    CHECK_OK(qmm_chain_add_matmul(chain, wb, y1, M, y2, &op_n));
    /* A bad step is refused when added, with matmul's errors, and leaves the chain as it was. */
    CHECK_STATUS(qmm_chain_add_matmul(chain, wa, x0, 0, y0, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_chain_add_matmul: M=0, a matmul needs M >= 1 rows of x");
    CHECK_STATUS(qmm_chain_add_matmul(chain, wa, x1, M, y0, NULL), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("qmm_chain_add_matmul: x holds 384 elements but M*K = 4*128 = 512 are needed");
    qmm_matmul_options unknown = {.op = QMM_OP_QMM_T, .kernel = "ref.qmm_t.scalar.r2"};
    CHECK_STATUS(qmm_chain_add_matmul(chain, wa, x0, M, y0, &unknown), QMM_ERR_NOT_FOUND);
    CHECK_STATUS(qmm_chain_add_matmul(NULL, wa, x0, M, y0, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK(qmm_chain_length(chain) == 3, "chain length %zu, want 3", qmm_chain_length(chain));

    double us = -1.0;
    qmm_kernel_info info;
    CHECK_STATUS(qmm_chain_step(chain, 0, &us, &info), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_chain_step: the chain has not run since its last step was added or its step timing changed "
                   "(call qmm_chain_run)");
    CHECK_STATUS(qmm_chain_run(NULL), QMM_ERR_INVALID_ARGUMENT);

    CHECK_OK(qmm_buffer_poison(y0));
    CHECK_OK(qmm_buffer_poison(y1));
    CHECK_OK(qmm_buffer_poison(y2));
    CHECK_OK(qmm_chain_run(chain));
    const char *want_kernel[3] = {"ref.qmm_t.scalar.r1", "ref.qmm_t.scalar.r1", "ref.qmm_n.scalar.r1"};
    for (size_t i = 0; i < 3; i++) {
        us = -1.0;
        CHECK_OK(qmm_chain_step(chain, i, &us, &info));
        CHECK(us >= 0.0 && isfinite(us), "step %zu time %g µs", i, us);
        CHECK(strcmp(info.name, want_kernel[i]) == 0, "step %zu ran %s, want %s", i, info.name, want_kernel[i]);
    }
    CHECK_OK(qmm_chain_step(chain, 1, NULL, NULL));
    CHECK_STATUS(qmm_chain_step(chain, 3, &us, &info), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_chain_step: step 3 is out of range: the chain has 3 steps");
    CHECK_STATUS(qmm_chain_step(NULL, 0, &us, &info), QMM_ERR_INVALID_ARGUMENT);
    /* Changing the step timing drops the last run's times; asked for before the next run, the message says so (it
     * named only an added step — a break-it helper). Then back on, run again (the same products). */
    CHECK_OK(qmm_chain_set_step_timing(chain, 0));
    CHECK_STATUS(qmm_chain_elapsed(chain, &us), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_chain_elapsed: the chain has not run since its last step was added or its step timing changed "
                   "(call qmm_chain_run)");
    CHECK_OK(qmm_chain_set_step_timing(chain, 1));
    CHECK_OK(qmm_chain_run(chain));
    CHECK_OK(qmm_chain_elapsed(chain, &us));

    /* The results are the oracle's, in order: step 2 read step 1's output. */
    uint16_t want0[4 * 24], want1[4 * 128], want2[4 * 96], got0[4 * 24], got1[4 * 128], got2[4 * 96];
    CHECK_OK(qmm_ref_qmm_t(&a.m, hx0, M, want0));
    CHECK_OK(qmm_ref_qmm_t(&b.m, hx1, M, want1));
    CHECK_OK(qmm_ref_qmm_n(&b.m, want1, M, want2));
    CHECK_OK(qmm_buffer_read(y0, got0, M * 24));
    CHECK_OK(qmm_buffer_read(y1, got1, M * 128));
    CHECK_OK(qmm_buffer_read(y2, got2, M * 96));
    CHECK(memcmp(want0, got0, sizeof want0) == 0, "chain step 0 differs from the oracle");
    CHECK(memcmp(want1, got1, sizeof want1) == 0, "chain step 1 differs from the oracle");
    CHECK(memcmp(want2, got2, sizeof want2) == 0, "chain step 2 differs from the oracle");

    /* A run again reproduces; adding a step invalidates the last run's times until the next run. */
    CHECK_OK(qmm_chain_run(chain));
    CHECK_OK(qmm_chain_add_matmul(chain, wa, x0, 1, y0, NULL));
    CHECK_STATUS(qmm_chain_step(chain, 0, &us, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK_OK(qmm_chain_run(chain));
    CHECK_OK(qmm_chain_step(chain, 3, &us, &info));
    CHECK(qmm_chain_length(chain) == 4 && us >= 0.0, "chain of 4 after a re-run");

    qmm_chain_destroy(chain);
    qmm_chain_destroy(NULL);
    qmm_buffer_destroy(x0);
    qmm_buffer_destroy(x1);
    qmm_buffer_destroy(y0);
    qmm_buffer_destroy(y1);
    qmm_buffer_destroy(y2);
    qmm_weights_destroy(wa);
    qmm_weights_destroy(wb);
    check_qmatrix_free(&a);
    check_qmatrix_free(&b);
}

int main(void) {
    check_rng rng = check_rng_make(21);
    test_context();
    qmm_context *context;
    CHECK_OK(qmm_context_create(QMM_BACKEND_REF, 0, &context));
    if (!context) return check_finish("test_runtime");
    test_buffers(context);
    test_weights(context, &rng);
    test_matmul_errors(context, &rng);
    test_matmul_products(context, &rng);
    test_stored_bits(context, &rng);
    test_chain(context, &rng);
    qmm_context_destroy(context);
    return check_finish("test_runtime");
}
