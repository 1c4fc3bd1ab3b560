/*
 * backend.c — the CPU backend: state and threads, the kernel table, and the scalar pieces every row
 * shares (cpu.h). Built without ISA flags: the rows' supports() check the ISA (isa.c) before the
 * selector can call a run() that lives in avx2.c or avx512.c.
 *
 * Table order (the selector takes the first row that accepts a call, docs/kernels.md §4):
 *   1. GEMV rows, M ≤ QMM_CPU_GEMV_MAX_M: decode and small prefill are bound by reading the weights;
 *      these read every weight byte once and reuse it for up to 8 rows of x in registers.
 *   2. tiled (gemm) rows, any M: above the crossover the FMA units bound the time; these decode a
 *      weight panel once into a cache-resident f32 buffer and run a register-blocked micro-kernel.
 *   3. the portable C row (threads, no SIMD), for CPUs without AVX2.
 *   AVX-512 before AVX2 within each family: twice the lanes per instruction where both can run.
 *   Then the qmm_n rows, then (appended by the runtime) the reference rows.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "cpu.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

/* ───────────────────────────── state and threads ───────────────────────────── */

int qmm_cpu_default_threads(void) {
#ifdef _OPENMP
    cpu_set_t set;
    /* The cores this process may use (taskset, cgroups' cpusets), not the machine's: a container
     * pinned to 2 of 64 cores must not start 64 threads. */
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int count = CPU_COUNT(&set);
        if (count >= 1) return count;
    }
    int processors = omp_get_num_procs();
    return processors >= 1 ? processors : 1;
#else
    return 1; /* built without OpenMP: every kernel runs on the calling thread */
#endif
}

qmm_status qmm_cpu_open(int device, void **state) {
    *state = NULL;
    qmm_cpu_state *created = calloc(1, sizeof *created);
    if (!created) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cpu backend: no memory for its state");
    created->threads = qmm_cpu_default_threads();
    (void)qmm_cpu_features_get(); /* cpuid once, now, not inside the first timed matmul */
    *state = created;
    return QMM_OK;
}

void qmm_cpu_close(void *state) { free(state); }

int qmm_cpu_get_threads(void *state) { return ((qmm_cpu_state *)state)->threads; }

void qmm_cpu_set_threads(void *state, int threads) {
#ifdef _OPENMP
    ((qmm_cpu_state *)state)->threads = threads > 0 ? threads : qmm_cpu_default_threads();
#else
    (void)threads;
    ((qmm_cpu_state *)state)->threads = 1;
#endif
}

void *qmm_cpu_scratch(size_t count, size_t size, const char *what) {
    size_t bytes;
    if (!qmm_mul_size(count, size, &bytes) || !qmm_add_size(bytes, 63, &bytes)) {
        qmm_error(QMM_ERR_OVERFLOW, "cpu kernel: scratch for %s (%zu × %zu bytes) overflows size_t", what, count, size);
        return NULL;
    }
    bytes -= bytes % 64;
    void *memory = aligned_alloc(64, bytes ? bytes : 64);
    if (!memory) qmm_error(QMM_ERR_OUT_OF_MEMORY, "cpu kernel: no memory for %s (%zu bytes)", what, bytes);
    return memory;
}

/* ───────────────────────────── scalar pieces ───────────────────────────── */

float qmm_cpu_qmm_t_output(const qmm_call *call, size_t m, size_t n) {
    const size_t K = call->K, group_size = (size_t)call->group_size, groups = K / group_size;
    const uint32_t *row = call->w + n * qmm_packed_words(K, call->bits);
    float acc = 0.0f;
    for (size_t g = 0; g < groups; g++) {
        const float s = qmm_load_f32(call->scales, call->dtype, n * groups + g);
        const float b = qmm_load_f32(call->biases, call->dtype, n * groups + g);
        float qdot = 0.0f, xsum = 0.0f;
        for (size_t k = g * group_size; k < (g + 1) * group_size; k++) {
            const float xv = qmm_load_f32(call->x, call->dtype, m * K + k);
            qdot += (float)qmm_code_at(row, k, call->bits) * xv;
            xsum += xv;
        }
        float term = s * qdot + b * xsum;
        if (!isfinite(term)) {
            /* s·Σq·x or b·Σx overflowed (or cancelled inf − inf) where the products themselves may
             * not: the direct form, as the oracle does for such a group. */
            term = 0.0f;
            for (size_t k = g * group_size; k < (g + 1) * group_size; k++)
                term += (s * (float)qmm_code_at(row, k, call->bits) + b) *
                        qmm_load_f32(call->x, call->dtype, m * K + k);
        }
        acc += term;
    }
    return acc;
}

/* The portable row: every output by qmm_cpu_qmm_t_output, threads over N. No SIMD beyond what the
 * compiler does for plain C, so it runs on any CPU; it exists so that a CPU without AVX2 still gets
 * all its cores. */
qmm_status qmm_cpu_scalar_qmm_t(const qmm_call *call) {
    const size_t M = call->M, N = call->N;
    const int threads = qmm_cpu_threads(call);
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (size_t n = 0; n < N; n++)
        for (size_t m = 0; m < M; m++) qmm_store_f32(call->out, call->dtype, m * N + n, qmm_cpu_qmm_t_output(call, m, n));
    return QMM_OK;
}

/* ───────────────────────────── the table ───────────────────────────── */

static bool refuse_op(qmm_op op, const qmm_call *call, char *why_not, size_t why_not_size) {
    if (call->op == op) return false;
    snprintf(why_not, why_not_size, "this row computes %s, the call is %s", qmm_op_name(op), qmm_op_name(call->op));
    return true;
}

static bool gemv_m(const qmm_call *call, char *why_not, size_t why_not_size) {
    if (call->M <= QMM_CPU_GEMV_MAX_M) return true;
    snprintf(why_not, why_not_size, "M=%zu is above the GEMV rows' limit M <= %d (the tiled rows are faster there)",
             call->M, QMM_CPU_GEMV_MAX_M);
    return false;
}

static bool avx2_gemv_qmm_t_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    if (refuse_op(QMM_OP_QMM_T, call, why_not, why_not_size)) return false;
    return qmm_cpu_has_avx2(why_not, why_not_size) && gemv_m(call, why_not, why_not_size);
}

static bool scalar_qmm_t_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    return !refuse_op(QMM_OP_QMM_T, call, why_not, why_not_size);
}

/* Slack 1 for every row: each one keeps every product term within K + 2 f32 roundings (the counts
 * are beside each kernel in simd_kernels.h and in docs/kernels.md "CPU kernels"). */
const qmm_kernel qmm_cpu_kernels[QMM_CPU_KERNEL_COUNT] = {
    {
        .info = {.name = "cpu.qmm_t.gemv.r4.avx2", .backend = QMM_BACKEND_CPU, .op = QMM_OP_QMM_T, .family = "gemv",
                 .bm = 4, .bn = 2, .bk = 16, .threads = 1, .tolerance_slack = 1.0,
                 .description = "M<=16: 4 rows of x per weight load, 8-lane split s·Σq·x + b·Σx, threads over N"},
        .supports = avx2_gemv_qmm_t_supports,
        .run = qmm_cpu_gemv_qmm_t_avx2,
    },
    {
        .info = {.name = "cpu.qmm_t.scalar.r1", .backend = QMM_BACKEND_CPU, .op = QMM_OP_QMM_T, .family = "scalar",
                 .bm = 1, .bn = 1, .bk = 1, .threads = 1, .tolerance_slack = 1.0,
                 .description = "portable C, any CPU: the oracle's split per output, threads over N"},
        .supports = scalar_qmm_t_supports,
        .run = qmm_cpu_scalar_qmm_t,
    },
};
