/*
 * bench.h — what the parts of `qmm bench` share: bench.c (the command: grid, measurement, table, JSON),
 * bench_host.c (CPU ceilings, the machine, the OpenBLAS peer), bench_peak_*.c (the register-resident FMA
 * loops, one ISA per file with its own compiler flags), bench_cuda.c (GPU ceilings and the cuBLAS peer,
 * built only with the CUDA backend) and bench_peers.c (the peers that run as Python scripts).
 */
#ifndef QMM_TOOLS_BENCH_H
#define QMM_TOOLS_BENCH_H

#include "common.h"

/* The two ceilings of the floor, measured in the same run. */
typedef struct bench_ceilings {
    double copy_gbps;     /* (read + write bytes) / s / 1e9 of a large streaming copy */
    double copy_bytes;    /* size of one buffer of that copy */
    double peak_gflops;   /* the matrix peak, FLOP/s / 1e9 */
    double peak_bf16_gflops; /* the matrix peak for bf16 inputs (CPU: a vdpbf16ps loop where the CPU has one; else
                              * peak_gflops), the compute term of bf16 cells: bench_peak_for */
    char copy_method[200];
    char peak_method[200];
    char peak_bf16_method[200];
} bench_ceilings;

/* The matrix peak a cell of this dtype is held to: bf16's where it is higher (a bf16 dot-product instruction). */
static inline double bench_peak_for(const bench_ceilings *c, qmm_dtype dtype) {
    return dtype == QMM_BF16 && c->peak_bf16_gflops > c->peak_gflops ? c->peak_bf16_gflops : c->peak_gflops;
}

/* ── host (bench_host.c) */

/* The threads the bench uses: --threads when given (bench_host_set_threads), else the ones this process may
 * use (its CPU affinity). The ceilings, qmm's context and the OpenBLAS and ggml peers all use this count. */
int bench_host_threads(void);
void bench_host_set_threads(int threads);
/* The last-level cache in bytes (all instances of the highest cache level, from sysfs); 0 when unknown.
 * desc receives e.g. "L3 32 MiB (1 instance)". */
size_t bench_host_llc_bytes(char *desc, size_t size);
/* "AMD EPYC" from /proc/cpuinfo, or "unknown CPU". */
void bench_host_cpu_model(char *out, size_t size);
/* Copy bandwidth (multi-threaded memcpy, best of several) and the f32 FMA peak on every thread.
 * quick: small buffers and short loops (for tests). */
qmm_status bench_host_ceilings(int quick, bench_ceilings *ceilings);

/* The FMA loops: each runs `iterations` of FMAs on independent register accumulators and returns a value
 * that depends on all of them (so nothing is optimised away); *flops receives the FLOPs performed. */
float bench_peak_avx512(long iterations, double *flops);
float bench_peak_avx2(long iterations, double *flops);
/* The same with vdpbf16ps (AVX-512 BF16: two bf16 products added into each f32 lane, 64 FLOPs an instruction); called
 * only when __builtin_cpu_supports("avx512bf16"). */
float bench_peak_avx512bf16(long iterations, double *flops);

/* OpenBLAS (peer a): whether it was linked in (else why not), and the median µs of one
 * cblas_sgemm out[M, N] = x[M, K]·W[N, K]ᵀ (w_is_k_by_n: out = x·W with W [K, N], for qmm_n), W rotating through
 * `copies` dense f32 arrays. */
int bench_openblas_available(char *why, size_t size);
qmm_status bench_openblas_time(float *const *w, size_t copies, size_t N, size_t K, size_t M, int w_is_k_by_n,
                               int repeats, double *us);

/* ── CUDA (bench_cuda.c; stubs answer "not built" when the library has no CUDA backend) */

int bench_cuda_built(void);
/* The GPU's name and its L2 size in bytes. */
qmm_status bench_cuda_machine(char *name, size_t size, size_t *l2_bytes);
/* Device-to-device copy bandwidth (cudaMemcpyAsync of >= 1 GiB, events, read + write bytes) and the
 * cuBLAS bf16 8192³ GEMM (CUBLAS_COMPUTE_32F, random data) as the matrix peak. */
qmm_status bench_cuda_ceilings(int quick, bench_ceilings *ceilings);
/* cuBLAS dense GEMM out[M, N] = x[M, K]·W[N, K]ᵀ in dtype (F16/BF16), random data, W rotating through
 * `copies` arrays, the copies captured as one CUDA graph and replayed; median µs per product over
 * `repeats` replays after one warm-up. note receives how it was timed. */
qmm_status bench_cuda_dense(size_t N, size_t K, size_t M, qmm_dtype dtype, size_t copies, int repeats, double *us,
                            char *note, size_t note_size);

/* ── peers run as scripts (bench_peers.c) */

/* One answer of a script peer: a time, or a reason the cell was skipped. */
typedef struct bench_peer_sample {
    char peer[64];
    char shape[64];
    size_t M;
    char dtype[8];
    double us;        /* NaN when skipped */
    char note[200];   /* skipped: why; else how it was timed */
} bench_peer_sample;

typedef struct bench_peer_samples {
    bench_peer_sample *items;
    size_t count, capacity;
} bench_peer_samples;

/* Runs `shell_command` (through /bin/sh), reads its stdout as JSON lines (bench/peers/README.md says the
 * protocol) and appends the samples, at most max_samples of them (later result lines are read and dropped, and
 * counted on stderr; a line longer than 64 KiB is dropped the same way, so a script's output cannot fill the host's
 * memory). deadline_s > 0: the command was started under coreutils `timeout` with that
 * many seconds (exit status 124, or 137 after the follow-up SIGKILL, then means the deadline stopped it, and is said
 * so). Returns 1 when the peer ran (results before a deadline are kept); 0 when it is absent, with the reason in
 * absent (a line {"absent": "..."}, a failing command, or no JSON parser in this build). */
int bench_run_script_peer(const char *shell_command, int deadline_s, size_t max_samples, bench_peer_samples *samples,
                          char *absent, size_t absent_size);
void bench_peer_samples_free(bench_peer_samples *samples);

#endif
