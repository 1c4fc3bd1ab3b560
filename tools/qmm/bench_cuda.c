/*
 * bench_cuda.c — the GPU side of `qmm bench` (built only with the CUDA backend; C on the CUDA runtime and
 * cuBLAS C APIs): the GPU's name and L2 size, the two ceilings of the floor (a device-to-device copy of 1 GiB
 * timed with events, counting read + write bytes; a cuBLAS bf16 8192³ GEMM with f32 accumulation on random
 * data), and the cuBLAS dense f16/bf16 peer, timed as one CUDA graph over rotated weight copies.
 *
 * Every CUDA and cuBLAS call is checked; a failure becomes QMM_ERR_BACKEND naming the call, the error, the file
 * and the line. The device is the one the bench's context uses (device 0).
 */
#include "bench.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_DEVICE 0

#define CUDA_CHECK(call)                                                                                          \
    do {                                                                                                          \
        cudaError_t check_error = (call);                                                                         \
        if (check_error != cudaSuccess) {                                                                         \
            status = qmm_error(QMM_ERR_BACKEND, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(check_error),  \
                               __FILE__, __LINE__);                                                               \
            goto cleanup;                                                                                         \
        }                                                                                                         \
    } while (0)

#define CUBLAS_CHECK(call)                                                                                        \
    do {                                                                                                          \
        cublasStatus_t check_status = (call);                                                                     \
        if (check_status != CUBLAS_STATUS_SUCCESS) {                                                              \
            status = qmm_error(QMM_ERR_BACKEND, "%s failed: %s (%s:%d)", #call, cublasGetStatusString(check_status), \
                               __FILE__, __LINE__);                                                               \
            goto cleanup;                                                                                         \
        }                                                                                                         \
    } while (0)

int bench_cuda_built(void) { return 1; }

qmm_status bench_cuda_machine(char *name, size_t size, size_t *l2_bytes) {
    qmm_status status = QMM_OK;
    struct cudaDeviceProp p;
    int runtime = 0, driver = 0;
    snprintf(name, size, "unknown GPU");
    *l2_bytes = 0;
    CUDA_CHECK(cudaSetDevice(BENCH_DEVICE));
    CUDA_CHECK(cudaGetDeviceProperties(&p, BENCH_DEVICE));
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    snprintf(name, size, "%s (sm_%d%d, %d SMs, %.0f GiB, L2 %.0f MiB; CUDA runtime %d.%d, driver %d.%d)", p.name, p.major,
             p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / 1073741824.0, (double)p.l2CacheSize / 1048576.0,
             runtime / 1000, (runtime % 1000) / 10, driver / 1000, (driver % 1000) / 10);
    *l2_bytes = (size_t)p.l2CacheSize;
cleanup:
    return status;
}

/* A host pool of random 16-bit values (f16 or bf16, uniform in [-1, 1)), tiled over device arrays: random
 * data without generating gigabytes on the host. One pool per dtype, made once. */
#define POOL_ELEMENTS ((size_t)8 << 20)
static void *pools[QMM_DTYPE_COUNT];

static qmm_status pool_of(qmm_dtype dtype, const void **pool) {
    if (!pools[dtype]) {
        void *p = malloc(POOL_ELEMENTS * 2);
        if (!p) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a %zu MiB random pool", (POOL_ELEMENTS * 2) >> 20);
        qmm_status status = fill_random(0xbe0c4 + (uint64_t)dtype, p, dtype, POOL_ELEMENTS);
        if (status != QMM_OK) {
            free(p);
            return status;
        }
        pools[dtype] = p;
    }
    *pool = pools[dtype];
    return QMM_OK;
}

/* Fills `bytes` of device memory with the random pool of dtype (repeated). */
static qmm_status fill_device(void *device, size_t bytes, qmm_dtype dtype) {
    const void *pool = NULL;
    qmm_status status = pool_of(dtype, &pool);
    if (status != QMM_OK) return status;
    for (size_t done = 0; done < bytes;) {
        size_t chunk = bytes - done < POOL_ELEMENTS * 2 ? bytes - done : POOL_ELEMENTS * 2;
        CUDA_CHECK(cudaMemcpy((char *)device + done, pool, chunk, cudaMemcpyHostToDevice));
        done += chunk;
    }
cleanup:
    return status;
}

qmm_status bench_cuda_ceilings(int quick, bench_ceilings *c) {
    qmm_status status = QMM_OK;
    void *src = NULL, *dst = NULL, *a = NULL, *b = NULL, *out = NULL;
    cudaEvent_t start = NULL, stop = NULL;
    cudaStream_t stream = NULL;
    cublasHandle_t handle = NULL;
    memset(c, 0, sizeof *c);
    CUDA_CHECK(cudaSetDevice(BENCH_DEVICE));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));

    /* Copy: 1 GiB device to device (64 MiB with --quick), best of 10 after one warm-up. */
    size_t bytes = (size_t)(quick ? 64 : 1024) << 20;
    CUDA_CHECK(cudaMalloc(&src, bytes));
    CUDA_CHECK(cudaMalloc(&dst, bytes));
    CUDA_CHECK(cudaMemsetAsync(src, 0x3c, bytes, stream));
    CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream));
    int runs = quick ? 3 : 10;
    double best = 0.0;
    for (int r = -1; r < runs; r++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventRecord(start, stream));
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (r >= 0 && ms > 0 && 2.0 * (double)bytes / (ms * 1e-3) > best) best = 2.0 * (double)bytes / (ms * 1e-3);
    }
    c->copy_gbps = best / 1e9;
    c->copy_bytes = (double)bytes;
    snprintf(c->copy_method, sizeof c->copy_method,
             "cudaMemcpyAsync device to device of %zu MiB, CUDA events, read + write bytes, best of %d", bytes >> 20, runs);
    cudaFree(src);
    cudaFree(dst);
    src = dst = NULL;

    /* Peak: cuBLAS bf16 n³ GEMM (n = 8192; 2048 with --quick), f32 accumulation, random data; best of 10. */
    const int n = quick ? 2048 : 8192;
    size_t matrix = (size_t)n * (size_t)n * 2;
    CUDA_CHECK(cudaMalloc(&a, matrix));
    CUDA_CHECK(cudaMalloc(&b, matrix));
    CUDA_CHECK(cudaMalloc(&out, matrix));
    if ((status = fill_device(a, matrix, QMM_BF16)) != QMM_OK) goto cleanup;
    if ((status = fill_device(b, matrix, QMM_BF16)) != QMM_OK) goto cleanup;
    CUBLAS_CHECK(cublasCreate(&handle));
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    const float alpha = 1.0f, beta = 0.0f;
    best = 0.0;
    runs = quick ? 3 : 10;
    for (int r = -2; r < runs; r++) { /* two warm-ups: the first picks the algorithm */
        float ms = 0.0f;
        CUDA_CHECK(cudaEventRecord(start, stream));
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                                  &beta, out, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        double flops = 2.0 * (double)n * (double)n * (double)n;
        if (r >= 0 && ms > 0 && flops / (ms * 1e-3) > best) best = flops / (ms * 1e-3);
    }
    c->peak_gflops = best / 1e9;
    snprintf(c->peak_method, sizeof c->peak_method,
             "cuBLAS cublasGemmEx bf16 %d³, CUBLAS_COMPUTE_32F, random data, CUDA events, best of %d", n, runs);
    c->peak_bf16_gflops = c->peak_gflops; /* the peak above is already bf16's */
    snprintf(c->peak_bf16_method, sizeof c->peak_bf16_method, "the matrix peak (a bf16 GEMM)");

cleanup:
    if (handle) cublasDestroy(handle);
    cudaFree(src);
    cudaFree(dst);
    cudaFree(a);
    cudaFree(b);
    cudaFree(out);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
    return status;
}

/* The dense peer keeps its weight copies while consecutive calls ask for the same (N, K, dtype, copies): the
 * bench walks M inside a (shape, dtype). */
static struct {
    size_t N, K, copies;
    qmm_dtype dtype;
    void **w;
} dense_cache;

static void dense_cache_free(void) {
    for (size_t i = 0; dense_cache.w && i < dense_cache.copies; i++) cudaFree(dense_cache.w[i]);
    free(dense_cache.w);
    memset(&dense_cache, 0, sizeof dense_cache);
}

qmm_status bench_cuda_dense(size_t N, size_t K, size_t M, qmm_dtype dtype, size_t copies, int repeats, double *us,
                            char *note, size_t note_size) {
    qmm_status status = QMM_OK;
    void *x = NULL, *out = NULL, *workspace = NULL;
    cudaStream_t stream = NULL;
    cudaEvent_t start = NULL, stop = NULL;
    cublasHandle_t handle = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    double *samples = NULL;
    int captured = 0;
    *us = NAN;
    note[0] = '\0';
    if (dtype != QMM_F16 && dtype != QMM_BF16)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "the cuBLAS peer runs f16 or bf16, not %s", qmm_dtype_name(dtype));
    if (N > 0x7fffffff || K > 0x7fffffff || M > 0x7fffffff)
        return qmm_error(QMM_ERR_SHAPE, "M=%zu, N=%zu, K=%zu: cuBLAS takes int dimensions", M, N, K);
    const cudaDataType type = dtype == QMM_F16 ? CUDA_R_16F : CUDA_R_16BF;
    const size_t element = 2;
    samples = malloc((size_t)repeats * sizeof *samples);
    if (!samples) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %d samples", repeats);
    CUDA_CHECK(cudaSetDevice(BENCH_DEVICE));

    if (!(dense_cache.w && dense_cache.N == N && dense_cache.K == K && dense_cache.dtype == dtype &&
          dense_cache.copies == copies)) {
        dense_cache_free();
        dense_cache.w = calloc(copies, sizeof *dense_cache.w);
        if (!dense_cache.w) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu copy pointers", copies);
            goto cleanup;
        }
        dense_cache.N = N, dense_cache.K = K, dense_cache.dtype = dtype, dense_cache.copies = copies;
        for (size_t i = 0; i < copies; i++) {
            CUDA_CHECK(cudaMalloc(&dense_cache.w[i], N * K * element));
            if ((status = fill_device(dense_cache.w[i], N * K * element, dtype)) != QMM_OK) goto cleanup;
        }
    }
    CUDA_CHECK(cudaMalloc(&x, M * K * element));
    CUDA_CHECK(cudaMalloc(&out, M * N * element));
    if ((status = fill_device(x, M * K * element, dtype)) != QMM_OK) goto cleanup;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUBLAS_CHECK(cublasCreate(&handle));
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    /* A workspace of our own, so that cuBLAS allocates nothing while the graph is captured. */
    const size_t workspace_bytes = (size_t)32 << 20;
    CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    CUBLAS_CHECK(cublasSetWorkspace(handle, workspace, workspace_bytes));

    /* out[M, N] (row-major) = x[M, K] · W[N, K]ᵀ is, column-major, out' (N×M) = W' (K×N)ᵀ · x' (K×M). */
    const float alpha = 1.0f, beta = 0.0f;
    /* One eager product first: cuBLAS picks its algorithm outside the capture. */
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha, dense_cache.w[0], type,
                              (int)K, x, type, (int)K, &beta, out, type, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
        cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
        for (size_t i = 0; i < copies && s == CUBLAS_STATUS_SUCCESS; i++)
            s = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha, dense_cache.w[i], type,
                             (int)K, x, type, (int)K, &beta, out, type, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cudaError_t end = cudaStreamEndCapture(stream, &graph);
        if (s == CUBLAS_STATUS_SUCCESS && end == cudaSuccess && graph &&
            cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess)
            captured = 1;
    }
    cudaGetLastError(); /* a refused capture leaves an error behind; the fallback below does not need it */
    for (int r = -1; r < repeats; r++) { /* r = -1: warm-up */
        float ms = 0.0f;
        CUDA_CHECK(cudaEventRecord(start, stream));
        if (captured) {
            CUDA_CHECK(cudaGraphLaunch(exec, stream));
        } else {
            for (size_t i = 0; i < copies; i++)
                CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha,
                                          dense_cache.w[i], type, (int)K, x, type, (int)K, &beta, out, type, (int)N,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (r >= 0) samples[r] = 1000.0 * (double)ms / (double)copies;
    }
    qsort(samples, (size_t)repeats, sizeof *samples, compare_doubles);
    *us = samples[repeats / 2];
    snprintf(note, note_size, "cublasGemmEx %s, f32 accumulation, random data, %zu copies, %s, median of %d",
             qmm_dtype_name(dtype), copies,
             captured ? "one CUDA graph, events" : "direct launches (graph capture refused), events, launch gaps included",
             repeats);

cleanup:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (handle) cublasDestroy(handle);
    if (stream) cudaStreamSynchronize(stream);
    cudaFree(workspace);
    cudaFree(x);
    cudaFree(out);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
    free(samples);
    if (status != QMM_OK) dense_cache_free();
    return status;
}
