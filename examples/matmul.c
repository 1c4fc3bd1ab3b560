/*
 * matmul.c — the smallest whole program on the qmm library: quantize a random f16 weight matrix W [N, K] to
 * MLX's 4-bit format (groups of 64), put it on a backend, multiply x [M, K] by it (out = x·Ŵᵀ, a linear
 * layer), and check one output against the dequantized weights.
 *
 *   cc examples/matmul.c $(pkg-config --cflags --libs qmm) -o matmul && ./matmul [cpu|cuda|ref]
 *   (with libqmm installed outside the loader's paths, e.g. PREFIX=$HOME/.local: LD_LIBRARY_PATH=$HOME/.local/lib ./matmul)
 *
 * Built and run by `make test` (CTest "example_matmul"). Exit status 0 when the product matches.
 */
#include <qmm.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 256
#define K 512
#define M 4
#define BITS 4
#define GROUP 64

static int fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, qmm_last_error());
    return 1;
}

int main(int argc, char **argv) {
    qmm_backend backend = QMM_BACKEND_CPU;
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) backend = QMM_BACKEND_CUDA;
    if (argc > 1 && strcmp(argv[1], "ref") == 0) backend = QMM_BACKEND_REF;

    /* f16 weights and activations, values in [-1, 1) */
    static uint16_t w[N * K], x[M * K], out[M * N];
    static uint32_t packed[N * K * BITS / 32];
    static uint16_t scales[N * K / GROUP], biases[N * K / GROUP];
    srand(1);
    for (size_t i = 0; i < N * K; i++) w[i] = qmm_f32_to_f16((float)rand() / (float)RAND_MAX * 2.0f - 1.0f);
    for (size_t i = 0; i < M * K; i++) x[i] = qmm_f32_to_f16((float)rand() / (float)RAND_MAX * 2.0f - 1.0f);

    /* mx.quantize(w, group_size=64, bits=4) */
    if (qmm_quantize(w, QMM_F16, N, K, BITS, GROUP, QMM_CONVENTION_CPU, packed, scales, biases) != QMM_OK)
        return fail("qmm_quantize");
    const qmm_qmatrix q = {packed, scales, biases, QMM_F16, /*rows=N*/ N, /*cols=K*/ K, BITS, GROUP};

    qmm_context *ctx = NULL;
    qmm_weights *weights = NULL;
    qmm_buffer *xb = NULL, *ob = NULL;
    qmm_kernel_info info;
    int rc = 1;
    if (qmm_context_create(backend, 0, &ctx) != QMM_OK) return fail("qmm_context_create");
    if (qmm_weights_create(ctx, &q, &weights) != QMM_OK || qmm_buffer_create(ctx, QMM_F16, M * K, &xb) != QMM_OK ||
        qmm_buffer_create(ctx, QMM_F16, M * N, &ob) != QMM_OK || qmm_buffer_write(xb, x, M * K) != QMM_OK ||
        qmm_matmul(ctx, weights, xb, M, ob, NULL, &info) != QMM_OK || qmm_buffer_read(ob, out, M * N) != QMM_OK) {
        rc = fail("qmm");
        goto done;
    }

    /* out[0, 0] against Σ_k x[0, k]·ŵ[0, k] with Ŵ from qmm_dequantize, in double */
    static float dequantized[N * K];
    if (qmm_dequantize(&q, dequantized, QMM_F32) != QMM_OK) {
        rc = fail("qmm_dequantize");
        goto done;
    }
    double expect = 0.0;
    for (size_t k = 0; k < K; k++) expect += (double)qmm_f16_to_f32(x[k]) * dequantized[k];
    const double got = qmm_f16_to_f32(out[0]);
    printf("%s: out[0,0] = %.5f, Σ x·ŵ = %.5f (kernel %s)\n", qmm_backend_name(backend), got, expect, info.name);
    rc = fabs(got - expect) <= 1e-2 * (1.0 + fabs(expect)) ? 0 : 1; /* f16 output: 11 significant bits */

done:
    qmm_buffer_destroy(xb);
    qmm_buffer_destroy(ob);
    qmm_weights_destroy(weights);
    qmm_context_destroy(ctx);
    return rc;
}
