/*
 * cpu.h — the CPU backend's internal interface (DESIGN.md §2, docs/kernels.md "CPU kernels").
 *
 *   isa.c       which instruction sets this CPU and OS support (cpuid + xgetbv), detected once
 *   backend.c   the backend hooks (host memory, threads), the kernel table with every row's
 *               supports(), the portable C row and the scalar helpers every row shares
 *   avx2.c      AVX2 + FMA + F16C kernels    (built with -mavx2 -mfma -mf16c)
 *   avx512.c    AVX-512 F/BW/VL/DQ kernels   (built with -mavx512f -mavx512bw -mavx512vl -mavx512dq ...)
 *   simd_kernels.h  the GEMV and tiled algorithms, written once over a small vector vocabulary
 *               (vf, v_fma, decode4, ...) and included by avx2.c and avx512.c, which define that
 *               vocabulary for their register width: one algorithm, one binary, chosen at run time.
 * Only backend.c and isa.c are built without ISA flags, so nothing outside avx2.c / avx512.c can
 * contain an instruction the CPU may lack; a row's supports() checks the ISA before its run() is
 * ever called.
 */
#ifndef QMM_CPU_H
#define QMM_CPU_H

#include "kernel.h"

#include <fenv.h>

#ifdef _OPENMP
#include <omp.h>
#define QMM_CPU_THREAD_ID() omp_get_thread_num()
#define qmm_cpu_team_size() omp_get_num_threads()
#else
#define QMM_CPU_THREAD_ID() 0
#define qmm_cpu_team_size() 1
#endif

/* The caller's floating-point environment inside every parallel region of the backend: OpenMP's worker threads keep
 * the environment they were created with, so a caller that later changes its rounding mode or (x86) FTZ/DAZ would
 * otherwise get outputs whose bits depend on the thread that computed them (the thirty-ninth session's break-it helper:
 * under fesetround(FE_UPWARD), 24,609 of 32,768 outputs of an M = 64 product differed from the same rows at M = 1).
 * QMM_CPU_FP_CALLER(fp) before the region reads the caller's; QMM_CPU_FP_ENTER(fp), first in the region, sets it on
 * a worker (thread 0 is the caller itself, whose exception flags are left alone) and QMM_CPU_FP_LEAVE(fp), last, puts
 * the worker's own environment back, so the caller's choice does not outlive the call on threads it does not own. */
#define QMM_CPU_FP_CALLER(fp)                                                                                   \
    fenv_t fp;                                                                                                  \
    fegetenv(&fp)
#define QMM_CPU_FP_ENTER(fp)                                                                                    \
    fenv_t fp##_own;                                                                                            \
    const int fp##_worker = QMM_CPU_THREAD_ID() != 0;                                                           \
    if (fp##_worker) {                                                                                          \
        fegetenv(&fp##_own);                                                                                    \
        fesetenv(&fp);                                                                                          \
    }
#define QMM_CPU_FP_LEAVE(fp)                                                                                    \
    do {                                                                                                        \
        if (fp##_worker) fesetenv(&fp##_own);                                                                   \
    } while (0)

/* The widest instruction set the rows may use: what the CPU has, capped by the environment variable
 * QMM_CPU_MAX_ISA=avx512|avx2|portable (for running and testing the narrower rows on a wider CPU; avx512: AVX-512
 * without AVX512_BF16, as on Skylake-X and Ice Lake). */
enum { QMM_CPU_ISA_PORTABLE = 0, QMM_CPU_ISA_AVX2 = 1, QMM_CPU_ISA_AVX512 = 2, QMM_CPU_ISA_AVX512BF16 = 3 };

/* What the CPU and the OS support (the OS must save the wider register state: XCR0). */
typedef struct qmm_cpu_features {
    int max_isa;                                      /* QMM_CPU_ISA_*: the QMM_CPU_MAX_ISA cap */
    bool avx, avx2, fma, f16c;                        /* cpuid + XCR0 bits 1–2 (XMM, YMM state) */
    bool avx512f, avx512bw, avx512vl, avx512dq;       /* cpuid + XCR0 bits 5–7 (opmask, ZMM state) */
    bool avx512bf16;                                  /* cpuid leaf 7.1 (the two bf16 rows) */
    bool avx512vnni;                                  /* noted, not required by any row yet */
    bool avx512vbmi;                                  /* vpermb, vpmultishiftqb: unpacking 2/3/5/6-bit codes */
    bool bmi2_fast;                                   /* pdep, where it is one instruction (not AMD Zen 1/2) */
    bool os_ymm, os_zmm;                              /* XCR0 enables the YMM / ZMM state */
} qmm_cpu_features;

/* The features of this CPU, detected on the first call (cpuid traps to the hypervisor in a VM, so
 * it is run once and cached). Thread-safe: concurrent first calls compute the same values. */
const qmm_cpu_features *qmm_cpu_features_get(void);

/* Whether the AVX2 rows / AVX-512 rows can run here; if not, why_not gets the first missing piece
 * ("this CPU lacks AVX-512BW", "the OS does not enable the ZMM register state (XCR0)"). */
bool qmm_cpu_has_avx2(char *why_not, size_t why_not_size);
bool qmm_cpu_has_avx512(char *why_not, size_t why_not_size);
/* The AVX-512 rows' ISA plus AVX512_BF16 (vdpbf16ps), for the two bf16 rows. */
bool qmm_cpu_has_avx512bf16(char *why_not, size_t why_not_size);

/* The CPU backend's per-context state (call->backend_state): the host threads its kernels use. */
typedef struct qmm_cpu_state {
    int threads;
} qmm_cpu_state;

/* The threads a call may use: the context's count (≥ 1), or 1 when there is no CPU state. */
static inline int qmm_cpu_threads(const qmm_call *call) {
    const qmm_cpu_state *state = call->backend_state;
    return state && state->threads > 0 ? state->threads : 1;
}

/* The threads worth starting for a call: the context's count, but one thread below 2^20 multiply-adds
 * (about 10–30 µs on one core). Waking a team costs microseconds, and when another process holds the
 * other core a worker may wait a whole scheduler time slice (milliseconds) before it runs. */
#define QMM_CPU_PARALLEL_MIN_WORK (1u << 20)
static inline int qmm_cpu_threads_for(const qmm_call *call) {
    const double work = (double)call->M * (double)call->N * (double)call->K;
    return work < (double)QMM_CPU_PARALLEL_MIN_WORK ? 1 : qmm_cpu_threads(call);
}

/* The number of cores this process may run on (sched_getaffinity), at least 1. */
int qmm_cpu_default_threads(void);

/* The non-finite rule (docs/kernels.md §2), the same for every CPU row: output (m, n) of the call (qmm_t
 * or qmm_n) in the direct form in f64 — qmm_direct_output_f64, the oracle's own implementation — rounded
 * to f32. Slow (a scalar loop over K in f64), and only ever called for an output whose f32 accumulator
 * is ±inf or NaN. */
float qmm_cpu_direct_output(const qmm_call *call, size_t m, size_t n);

/* The epilogue check every row applies to each output's f32 accumulator before the narrowing: acc where
 * it is finite (a sum that ever became inf or NaN stays so, so a finite acc had no overflow), else the
 * direct form. One test per output; the recompute is rare. */
static inline float qmm_cpu_finite_or_direct(const qmm_call *call, float acc, size_t m, size_t n) {
    return __builtin_expect(__builtin_isfinite(acc), 1) ? acc : qmm_cpu_direct_output(call, m, n);
}

/* Memory with 64-byte alignment (one cache line, one ZMM register) for the kernels' scratch; a
 * size overflow or exhaustion sets qmm_error and returns NULL. Free with free(). */
void *qmm_cpu_scratch(size_t count, size_t size, const char *what);

/* The per-ISA entry points (run() of the table rows). */
qmm_status qmm_cpu_gemv_qmm_t_avx2(const qmm_call *call);
qmm_status qmm_cpu_gemm_qmm_t_avx2(const qmm_call *call);
qmm_status qmm_cpu_gemm_qmm_n_avx2(const qmm_call *call);
qmm_status qmm_cpu_gemv_qmm_t_avx512(const qmm_call *call);
qmm_status qmm_cpu_gemv_bf16_qmm_t_avx512(const qmm_call *call);
qmm_status qmm_cpu_gemm_qmm_t_avx512(const qmm_call *call);
qmm_status qmm_cpu_gemm_bf16_qmm_t_avx512(const qmm_call *call);
qmm_status qmm_cpu_gemm_qmm_n_avx512(const qmm_call *call);
qmm_status qmm_cpu_gemv_qmm_n_avx2(const qmm_call *call);
qmm_status qmm_cpu_gemv_qmm_n_avx512(const qmm_call *call);
qmm_status qmm_cpu_gemv_ordered_qmm_t_avx2(const qmm_call *call);
qmm_status qmm_cpu_gemv_ordered_qmm_t_avx512(const qmm_call *call);

qmm_status qmm_cpu_scalar_qmm_t(const qmm_call *call);

/* The unpacking of 2/3/5/6-bit codes to bytes that each ISA's rows use (unpack.h), for test_cpu. */
void qmm_cpu_unpack_codes_avx2(const uint32_t *in, size_t count, int bits, uint8_t *codes);
void qmm_cpu_unpack_codes_avx512(const uint32_t *in, size_t count, int bits, uint8_t *codes);
/* The same by QMM_CPU_ISA_AVX2 or QMM_CPU_ISA_AVX512 (test_cpu declares it weak: absent when the CPU backend is not
 * built); false, with nothing written, where that ISA's rows cannot run here. */
bool qmm_cpu_unpack_codes_for_test(int isa, const uint32_t *in, size_t count, int bits, uint8_t *codes);

/* GEMV rows take M up to this; above it the tiled rows are faster (docs/PERF.md, "CPU crossover"). */
#define QMM_CPU_GEMV_MAX_M 16
/* The bf16 GEMV row up to this: against the tiled bf16 row it took 0.71× the time at M = 48 and 0.92× at M = 64
 * (geomean of 15 seed and Qwen3 shapes on Zen 4; docs/PERF.md, thirty-sixth session, CPU). */
#define QMM_CPU_GEMV_BF16_MAX_M 64
/* ... for 2-, 3-, 5- and 6-bit codes (unpacked to bytes first) only up to this: against the tiled bf16 row at M = 32
 * 0.88× the time for 3-bit, 1.02× for 5-bit, 1.11× for 6-bit; at M = 64 1.08× (3-bit) and 1.22× (5-bit); at M = 16 the
 * f32 GEMV it replaces took 1.33–1.40× its time (seed shapes, Zen 4; docs/PERF.md, thirty-eighth session, CPU). */
#define QMM_CPU_GEMV_BF16_BYTES_MAX_M 16
/* ... and for f16 x (two dot products per pair of codes: a bf16 head and tail of x) only up to this: against the f32
 * GEMV 0.83× the time at M = 1, 1.00× at M = 2, 1.18–1.44× from M = 4 (seed shapes, Zen 4; the same entry). */
#define QMM_CPU_GEMV_BF16_F16_MAX_M 1
/* The qmm_n GEMV rows take M up to this (docs/PERF.md, "qmm_n GEMV"). */
#define QMM_CPU_GEMV_N_MAX_M 16

/* The backend's rows in selector order (backend.c) and what runtime.c plugs into its hooks: the
 * CPU backend shares the host memory hooks; these open, close and carry its thread count. */
#define QMM_CPU_KERNEL_COUNT 18
extern const qmm_kernel qmm_cpu_kernels[QMM_CPU_KERNEL_COUNT];
qmm_status qmm_cpu_open(int device, void **state);
void qmm_cpu_close(void *state);
int qmm_cpu_get_threads(void *state);
void qmm_cpu_set_threads(void *state, int threads);

#endif /* QMM_CPU_H */
