/*
 * backend.c — the CPU backend: state and threads, the kernel table, and the scalar pieces every row
 * shares (cpu.h). Built without ISA flags: the rows' supports() check the ISA (isa.c) before the
 * selector can call a run() that lives in avx2.c or avx512.c.
 *
 * Table order (the selector takes the first row that accepts a call, docs/kernels.md §4):
 *   1. GEMV rows, M ≤ QMM_CPU_GEMV_MAX_M: decode and small prefill are bound by reading the weights;
 *      these read every weight byte once and reuse it for up to 8 rows of x in registers. The bf16 GEMV row
 *      (2- to 6-bit codes, AVX-512 BF16; bf16 x up to QMM_CPU_GEMV_BF16_MAX_M — other widths than 4 up to
 *      QMM_CPU_GEMV_BF16_BYTES_MAX_M —, f16 x up to QMM_CPU_GEMV_BF16_F16_MAX_M)
 *      comes first: its dot products decode and multiply faster.
 *   1b. ordered GEMV rows, M ≤ QMM_CPU_GEMV_MAX_M, in the tiled rows' order: after the GEMV rows, so the
 *      selector reaches them only in batch-invariant mode (which skips the GEMV rows: docs/kernels.md §11).
 *   2. tiled (gemm) rows, any M: above the crossover the FMA units bound the time; these decode a
 *      weight panel once into a cache-resident f32 buffer and run a register-blocked micro-kernel. The bf16 tiled
 *      row (bf16 x, AVX-512 BF16: bf16 pairs and vdpbf16ps) first.
 *   3. the portable C row (threads, no SIMD), for CPUs without AVX2.
 *   AVX-512 before AVX2 within each family: twice the lanes per instruction where both can run.
 *   Then the qmm_n rows (GEMV for M ≤ 8, then tiled), then the gather rows (one per ISA, each driving that
 *   ISA's qmm_t rows per expert block; the ordered ones, for batch-invariant mode, driving only the rows of the
 *   ISA's order), then (appended by the runtime) the reference rows.
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
     * pinned to 2 of 64 cores must not start 64 threads. Never above the limit set_threads enforces. */
    int count = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) count = CPU_COUNT(&set);
    if (count < 1) count = omp_get_num_procs();
    if (count < 1) count = 1;
    return count > qmm_max_threads() ? qmm_max_threads() : count;
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

float qmm_cpu_direct_output(const qmm_call *call, size_t m, size_t n) {
    const qmm_direct_operands operands = {.transpose = call->op != QMM_OP_QMM_N, .dtype = call->dtype,
                                          .bits = call->bits, .group_size = call->group_size, .N = call->N,
                                          .K = call->K, .x = call->x, .w = call->w, .scales = call->scales,
                                          .biases = call->biases};
    return (float)qmm_direct_output_f64(&operands, m, n);
}

/* The portable row: every output in the oracle's split — per group qdot += q·x and xsum += x in k order, then
 * acc += s·qdot + b·xsum, the same float operations in the same order, so the same bits — then the non-finite rule;
 * threads over blocks of SCALAR_LANES weight rows. Written so that plain C vectorises without changing any output's
 * sequence of operations: the lanes are SCALAR_LANES weight rows (a group's codes decoded once, by the format's own
 * qmm_unpack_stream, into qt[k][lane] for SCALAR_ROWS rows of x, x[k] broadcast), each lane its own qdot chain in k
 * order; xsum depends only on the row of x and the group, so it is summed once per block of rows of x, in the same
 * order. Rows of x are converted to f32
 * once per block of rows. No intrinsics: it runs on any CPU (NEON or SSE2 lanes where the compiler uses them); it
 * exists so that a CPU without AVX2 still gets all its cores. (The fourteenth session's version, one weight row at
 * a time, took 1.5–2.1× the reference backend's time at M = 16: two dependent add chains per output.) */
enum { SCALAR_ROWS = 16, SCALAR_LANES = 8, SCALAR_MAX_GROUP = 128 /* group sizes are 32, 64 or 128 (src/core/format.c) */ };
qmm_status qmm_cpu_scalar_qmm_t(const qmm_call *call) {
    const size_t M = call->M, N = call->N, K = call->K, group_size = (size_t)call->group_size, groups = K / group_size;
    const size_t words = qmm_packed_words(K, call->bits), row_blocks = (N + SCALAR_LANES - 1) / SCALAR_LANES;
    float *xf = qmm_cpu_scratch(SCALAR_ROWS, (K + groups) * sizeof(float), "rows of x as f32 and their group sums");
    if (!xf) return QMM_ERR_OUT_OF_MEMORY; /* message set by qmm_cpu_scratch */
    float *xsums = xf + SCALAR_ROWS * K;      /* [SCALAR_ROWS][groups] */
    const int threads = qmm_cpu_threads_for(call);
    (void)threads;
    for (size_t m0 = 0; m0 < M; m0 += SCALAR_ROWS) {
        const size_t rows = M - m0 < SCALAR_ROWS ? M - m0 : SCALAR_ROWS;
        for (size_t i = 0; i < rows * K; i++) xf[i] = qmm_load_f32(call->x, call->dtype, m0 * K + i);
        for (size_t r = 0; r < rows; r++)
            for (size_t g = 0; g < groups; g++) {
                const float *xr = xf + r * K + g * group_size;
                float xsum = 0.0f;
                for (size_t i = 0; i < group_size; i++) xsum += xr[i];
                xsums[r * groups + g] = xsum;
            }
        QMM_CPU_FP_CALLER(caller_fp);
#pragma omp parallel num_threads(threads) if (threads > 1)
        {
            QMM_CPU_FP_ENTER(caller_fp);
#pragma omp for schedule(static)
            for (size_t block = 0; block < row_blocks; block++) {
                const size_t n0 = block * SCALAR_LANES, lanes = N - n0 < SCALAR_LANES ? N - n0 : SCALAR_LANES;
                float acc[SCALAR_ROWS][SCALAR_LANES] = {{0}}, qt[SCALAR_MAX_GROUP][SCALAR_LANES] = {{0}};
                float s[SCALAR_LANES] = {0}, b[SCALAR_LANES] = {0};
                uint8_t codes[SCALAR_MAX_GROUP];
                for (size_t g = 0; g < groups; g++) {
                    for (size_t j = 0; j < lanes; j++) { /* lanes past N keep zeros: computed, never stored */
                        s[j] = qmm_load_f32(call->scales, call->dtype, (n0 + j) * groups + g);
                        b[j] = qmm_load_f32(call->biases, call->dtype, (n0 + j) * groups + g);
                        /* the group's codes: its bit stream starts on a word (group_size·bits is a multiple of 32) */
                        qmm_unpack_stream(call->w + (n0 + j) * words + g * group_size * (size_t)call->bits / 32, group_size,
                                          call->bits, codes);
                        for (size_t i = 0; i < group_size; i++) qt[i][j] = (float)codes[i];
                    }
                    for (size_t r = 0; r < rows; r++) {
                        const float *xr = xf + r * K + g * group_size, xsum = xsums[r * groups + g];
                        float qdot[SCALAR_LANES] = {0};
                        for (size_t i = 0; i < group_size; i++)
                            for (size_t j = 0; j < SCALAR_LANES; j++) qdot[j] += qt[i][j] * xr[i];
                        for (size_t j = 0; j < SCALAR_LANES; j++) acc[r][j] += s[j] * qdot[j] + b[j] * xsum;
                    }
                }
                for (size_t r = 0; r < rows; r++)
                    for (size_t j = 0; j < lanes; j++)
                        qmm_store_f32(call->out, call->dtype, (m0 + r) * N + n0 + j,
                                      qmm_cpu_finite_or_direct(call, acc[r][j], m0 + r, n0 + j));
            }
            QMM_CPU_FP_LEAVE(caller_fp);
        }
    }
    free(xf);
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

static bool avx512_gemv_qmm_t_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    if (refuse_op(QMM_OP_QMM_T, call, why_not, why_not_size)) return false;
    return qmm_cpu_has_avx512(why_not, why_not_size) && gemv_m(call, why_not, why_not_size);
}

static bool avx512bf16_gemv_qmm_t_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    if (refuse_op(QMM_OP_QMM_T, call, why_not, why_not_size)) return false;
    if (!qmm_cpu_has_avx512bf16(why_not, why_not_size)) return false;
    if (call->M > QMM_CPU_GEMV_BF16_MAX_M) {
        snprintf(why_not, why_not_size, "M=%zu is above the bf16 GEMV row's limit M <= %d (the tiled rows are faster there)",
                 call->M, QMM_CPU_GEMV_BF16_MAX_M);
        return false;
    }
    if (call->dtype == QMM_F32) {
        snprintf(why_not, why_not_size, "this row multiplies bf16 and f16 x only (vdpbf16ps); the call's dtype is f32");
        return false;
    }
    if (call->dtype == QMM_F16 && call->M > QMM_CPU_GEMV_BF16_F16_MAX_M) {
        snprintf(why_not, why_not_size,
                 "M=%zu with f16 x is above this row's limit for f16, M <= %d (two dot products per pair: the f32 GEMV "
                 "is faster there)", call->M, QMM_CPU_GEMV_BF16_F16_MAX_M);
        return false;
    }
    if (call->bits > 6) {
        snprintf(why_not, why_not_size,
                 "this row decodes codes of 2 to 6 bits (a 64-entry bf16 table); the call has bits=%d", call->bits);
        return false;
    }
    if (call->bits != 4 && call->M > QMM_CPU_GEMV_BF16_BYTES_MAX_M) {
        snprintf(why_not, why_not_size,
                 "M=%zu with %d-bit codes (unpacked to bytes) is above this row's limit for them, M <= %d (the tiled "
                 "bf16 row is faster there)", call->M, call->bits, QMM_CPU_GEMV_BF16_BYTES_MAX_M);
        return false;
    }
    return true;
}

static bool avx2_gemv_qmm_t_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    if (refuse_op(QMM_OP_QMM_T, call, why_not, why_not_size)) return false;
    return qmm_cpu_has_avx2(why_not, why_not_size) && gemv_m(call, why_not, why_not_size);
}

static bool avx512_qmm_t_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    return !refuse_op(QMM_OP_QMM_T, call, why_not, why_not_size) && qmm_cpu_has_avx512(why_not, why_not_size);
}

static bool avx512bf16_qmm_t_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    if (refuse_op(QMM_OP_QMM_T, call, why_not, why_not_size) || !qmm_cpu_has_avx512bf16(why_not, why_not_size))
        return false;
    if (call->dtype != QMM_BF16) {
        snprintf(why_not, why_not_size, "this row multiplies bf16 x only (vdpbf16ps); the call's dtype is %s",
                 qmm_dtype_name(call->dtype));
        return false;
    }
    return true;
}

static bool avx2_qmm_t_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    return !refuse_op(QMM_OP_QMM_T, call, why_not, why_not_size) && qmm_cpu_has_avx2(why_not, why_not_size);
}

static bool gemv_n_m(const qmm_call *call, char *why_not, size_t why_not_size) {
    if (call->M <= QMM_CPU_GEMV_N_MAX_M) return true;
    snprintf(why_not, why_not_size, "M=%zu is above the qmm_n GEMV rows' limit M <= %d (the tiled rows are faster there)",
             call->M, QMM_CPU_GEMV_N_MAX_M);
    return false;
}

static bool avx512_gemv_qmm_n_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    if (refuse_op(QMM_OP_QMM_N, call, why_not, why_not_size)) return false;
    return qmm_cpu_has_avx512(why_not, why_not_size) && gemv_n_m(call, why_not, why_not_size);
}

static bool avx2_gemv_qmm_n_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    if (refuse_op(QMM_OP_QMM_N, call, why_not, why_not_size)) return false;
    return qmm_cpu_has_avx2(why_not, why_not_size) && gemv_n_m(call, why_not, why_not_size);
}

static bool avx512_qmm_n_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    return !refuse_op(QMM_OP_QMM_N, call, why_not, why_not_size) && qmm_cpu_has_avx512(why_not, why_not_size);
}

static bool avx2_qmm_n_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    return !refuse_op(QMM_OP_QMM_N, call, why_not, why_not_size) && qmm_cpu_has_avx2(why_not, why_not_size);
}

static bool scalar_qmm_t_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    return !refuse_op(QMM_OP_QMM_T, call, why_not, why_not_size);
}

/* ───────────────────────────── gather (MoE) ─────────────────────────────
 *
 * A CPU gather row walks the call's expert blocks (src/core/gather.c: a maximal run of pairs with one
 * expert; one per used expert when rhs_indices is sorted) and computes each block as one qmm_t product on
 * the qmm_t row that the selector itself picks for that block among its ISA's rows (qmm_select_kernel over
 * the list below, in table order): the GEMV row for a block of M ≤ QMM_CPU_GEMV_MAX_M rows (the bf16 GEMV row's
 * own limits for bf16 and f16 x), the tiled row above. No threshold is repeated here: a block gets exactly the row
 * a plain qmm_t call of its shape gets.
 *
 * Threads: blocks run in parallel, one thread each (dynamic schedule), when there are at least as many
 * blocks as threads and the whole gather is worth a team (QMM_CPU_PARALLEL_MIN_WORK); otherwise (fewer
 * blocks than threads: one expert's prefill) the blocks run one after another and each uses the context's
 * threads as a qmm_t call would. A block with more than 1/threads of the rows (a popular expert in a
 * prefill chunk) runs first on all the threads, since on one it would outlast the others. Decode (one token to 8 experts: 8 blocks of M = 1 of a few hundred KiB
 * each) thus wakes one team per gather instead of one per block. Either way every output is computed by
 * one thread in the order of its qmm_t row, so the result does not depend on the thread count.
 * Batch-invariant mode: the ordered rows (cpu.gather.blocks_ordered.*) drive only their ISA's rows of one order
 * (the ordered GEMV, the tiled row), so a pair's bits depend neither on its block's M nor on the rest of the routing:
 * they are the bits of a batch-invariant qmm_t call on its x row and expert alone. The portable row's one row is of
 * the oracle's order. The other rows pick among GEMV rows of no order and declare none. */
typedef struct gather_block {
    size_t i0, i1;
    const qmm_kernel *row; /* the qmm_t row the selector picks for this block */
} gather_block;

static qmm_status cpu_gather_run(const qmm_call *call, const qmm_kernel *const *rows, size_t row_count) {
    size_t count = 0, gathered_max = 0;
    for (size_t i0 = 0; i0 < call->M; i0 = qmm_gather_block_end(call, i0)) count++;
    size_t list_bytes;
    if (!qmm_mul_size(count, sizeof(gather_block), &list_bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "cpu gather: a list of %zu expert blocks overflows size_t", count);
    gather_block *blocks = malloc(list_bytes);
    if (!blocks) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cpu gather: no memory for a list of %zu expert blocks", count);
    qmm_status status = QMM_OK;
    size_t b = 0;
    for (size_t i0 = 0; i0 < call->M; b++) {
        const size_t i1 = qmm_gather_block_end(call, i0);
        const qmm_call block = qmm_gather_block_call(call, i0, i1);
        blocks[b] = (gather_block){i0, i1, NULL};
        if ((status = qmm_select_kernel(rows, row_count, &block, NULL, &blocks[b].row)) != QMM_OK) goto cleanup;
        if (!block.x && i1 - i0 > gathered_max) gathered_max = i1 - i0;
        i0 = i1;
    }

    const int threads = qmm_cpu_threads_for(call); /* the whole gather's work: B·N·K */
    const int team = threads > 1 && count >= (size_t)threads ? threads : 1;
    /* Rows of x that a block takes out of order are copied to scratch: one slice per thread of the team. */
    const size_t row_bytes = call->K * qmm_dtype_size(call->dtype); /* T·K·size checked by the runtime */
    size_t slice = 0, bytes = 0;
    unsigned char *scratch = NULL;
    if (gathered_max) {
        /* Repeated rows make a block larger than x, so this product is checked. */
        if (!qmm_mul_size(gathered_max, row_bytes, &slice) || !qmm_mul_size(slice, (size_t)team, &bytes)) {
            status = qmm_error(QMM_ERR_OVERFLOW, "cpu gather: %d × %zu gathered rows of x of %zu bytes overflow size_t",
                               team, gathered_max, row_bytes);
            goto cleanup;
        }
        if (!(scratch = malloc(bytes))) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cpu gather: no memory for %zu gathered rows of x (%zu bytes)",
                               (size_t)team * gathered_max, bytes);
            goto cleanup;
        }
    }
    /* A block with more than its share of the rows (rows·team > B; every block has the same N and K) would
     * hold one thread past all the others: it runs first, on the context's threads (team == 1: every block). */
    for (b = 0; b < count && status == QMM_OK; b++) {
        if (team > 1 && (blocks[b].i1 - blocks[b].i0) * (size_t)team <= call->M) continue;
        qmm_call block = qmm_gather_block_call(call, blocks[b].i0, blocks[b].i1);
        if (!block.x) {
            qmm_gather_block_rows(call, blocks[b].i0, blocks[b].i1, scratch);
            block.x = scratch;
        }
        status = blocks[b].row->run(&block);
    }
    if (team > 1 && status == QMM_OK) {
        /* Each block on one thread; a failure (a kernel's scratch) keeps its message for the caller's thread. */
        qmm_cpu_state one_thread = {.threads = 1};
        char message[512] = "";
        int failed = 0;
        QMM_CPU_FP_CALLER(caller_fp);
#pragma omp parallel num_threads(team)
        {
            QMM_CPU_FP_ENTER(caller_fp);
#pragma omp for schedule(dynamic, 1)
            for (size_t k = 0; k < count; k++) {
                int stop;
#pragma omp atomic read
                stop = failed;
                if (stop || (blocks[k].i1 - blocks[k].i0) * (size_t)team > call->M) continue; /* ran above */
                qmm_call block = qmm_gather_block_call(call, blocks[k].i0, blocks[k].i1);
                block.backend_state = &one_thread;
                if (!block.x) {
                    unsigned char *rows_of_x = scratch + (size_t)QMM_CPU_THREAD_ID() * slice;
                    qmm_gather_block_rows(call, blocks[k].i0, blocks[k].i1, rows_of_x);
                    block.x = rows_of_x;
                }
                const qmm_status result = blocks[k].row->run(&block);
                if (result != QMM_OK) {
#pragma omp critical(qmm_cpu_gather_failure)
                    if (!failed) {
                        snprintf(message, sizeof message, "%s", qmm_last_error());
                        status = result;
#pragma omp atomic write
                        failed = 1;
                    }
                }
            }
            QMM_CPU_FP_LEAVE(caller_fp);
        }
        if (status != QMM_OK) qmm_error(status, "%s", message);
    }
    free(scratch);

cleanup:
    free(blocks);
    return status;
}

/* Each ISA's qmm_t rows in table order: what its gather row's blocks choose among. The table places these
 * rows by the same names (designated initializers below), so reordering it cannot point a list elsewhere. */
enum {
    ROW_QMM_T_GEMV_BF16_AVX512,
    ROW_QMM_T_GEMV_AVX512,
    ROW_QMM_T_GEMV_AVX2,
    ROW_QMM_T_GEMV_ORDERED_AVX512, /* batch-invariant mode only (docs/kernels.md §11) */
    ROW_QMM_T_GEMV_ORDERED_AVX2,
    ROW_QMM_T_GEMM_BF16_AVX512,
    ROW_QMM_T_GEMM_AVX512,
    ROW_QMM_T_GEMM_AVX2,
    ROW_QMM_T_SCALAR,
    ROW_FIRST_OTHER /* the qmm_n and gather rows follow */
};
static const qmm_kernel *const avx512_qmm_t_rows[] = {&qmm_cpu_kernels[ROW_QMM_T_GEMV_BF16_AVX512],
                                                      &qmm_cpu_kernels[ROW_QMM_T_GEMV_AVX512],
                                                      &qmm_cpu_kernels[ROW_QMM_T_GEMM_BF16_AVX512],
                                                      &qmm_cpu_kernels[ROW_QMM_T_GEMM_AVX512]};
static const qmm_kernel *const avx2_qmm_t_rows[] = {&qmm_cpu_kernels[ROW_QMM_T_GEMV_AVX2],
                                                    &qmm_cpu_kernels[ROW_QMM_T_GEMM_AVX2]};
static const qmm_kernel *const portable_qmm_t_rows[] = {&qmm_cpu_kernels[ROW_QMM_T_SCALAR]};
/* The ordered gather rows' (batch-invariant mode): each ISA's rows of its one order, the ordered GEMV first (blocks of
 * M <= 16) and the tiled row (every M), as the qmm_t table reaches them for a batch-invariant call. */
static const qmm_kernel *const avx512_ordered_qmm_t_rows[] = {&qmm_cpu_kernels[ROW_QMM_T_GEMV_ORDERED_AVX512],
                                                              &qmm_cpu_kernels[ROW_QMM_T_GEMM_AVX512]};
static const qmm_kernel *const avx2_ordered_qmm_t_rows[] = {&qmm_cpu_kernels[ROW_QMM_T_GEMV_ORDERED_AVX2],
                                                            &qmm_cpu_kernels[ROW_QMM_T_GEMM_AVX2]};

/* A gather row accepts a call when its ISA is here and the rows it drives accept every block. */
static bool cpu_gather_supports(const qmm_call *call, const qmm_kernel *const *rows, size_t row_count,
                                char *why_not, size_t why_not_size) {
    if (refuse_op(QMM_OP_GATHER, call, why_not, why_not_size)) return false;
    /* The last row of each list (tiled, or the portable row) takes every qmm_t call its ISA allows: its ISA first, so
     * that a missing one is named as such rather than through the first block. */
    const qmm_kernel *last = rows[row_count - 1];
    if (last->usable && !last->usable(why_not, why_not_size)) return false;
    return qmm_gather_blocks_supported(call, last, why_not, why_not_size);
}

#define CPU_GATHER(isa, list)                                                                                   \
    static bool isa##_gather_supports(const qmm_call *call, char *why_not, size_t why_not_size) {              \
        return cpu_gather_supports(call, list, sizeof list / sizeof list[0], why_not, why_not_size);            \
    }                                                                                                           \
    static qmm_status isa##_gather_run(const qmm_call *call) {                                                  \
        return cpu_gather_run(call, list, sizeof list / sizeof list[0]);                                        \
    }
CPU_GATHER(avx512, avx512_qmm_t_rows)
CPU_GATHER(avx2, avx2_qmm_t_rows)
CPU_GATHER(avx512_ordered, avx512_ordered_qmm_t_rows)
CPU_GATHER(avx2_ordered, avx2_ordered_qmm_t_rows)
CPU_GATHER(portable, portable_qmm_t_rows)

/* Slack 1 for every row: each one keeps every product term within K + 2 f32 roundings (the counts
 * are beside each kernel in simd_kernels.h and in docs/kernels.md "CPU kernels"). */
#define CPU_ROW(row_name, row_op, row_family, m, n, k, text, accepts, runs, isa)                                 \
    CPU_ROW_ORDERED(row_name, row_op, row_family, m, n, k, text, accepts, runs, isa, NULL)
/* A row with a batch-invariant order (docs/kernels.md "Batch-invariant mode"):
 *   "split-fma-d32"/"split-fma-d16"  the tiled qmm_t rows (AVX-512 / AVX2): per output and group g in order,
 *        qdot = an FMA chain of q·x over the group's k in decode order (each 2·LANES block: even codes, then
 *        odd), Σx a sequential sum in that order, then acc += fma(s, qdot, b·Σx). Each output is one lane of
 *        its own, so M, the tiles and the threads change nothing; the two ISAs' decode orders differ (4-bit).
 *        The ordered GEMV rows (M ≤ 16) reduce in the same order as their ISA's tiled row, with N in the lanes;
 *        the GEMV rows (a K-split FMA chain and a tree sum) reduce differently: they declare none.
 *   "fma-chain"  every qmm_n SIMD row, GEMV and tiled, both ISAs: ŵ = fma(s, q, b), then one FMA chain per
 *        output over k = 0, 1, … in order (the same bits, simd_kernels.h).
 *   "oracle"     the portable row: the oracle's order (backend.c is built with -ffp-contract=off). */
#define CPU_ROW_ORDERED(row_name, row_op, row_family, m, n, k, text, accepts, runs, isa, order)                 \
    {                                                                                                       \
        .info = {.name = row_name, .backend = QMM_BACKEND_CPU, .op = row_op, .family = row_family, .bm = m, \
                 .bn = n, .bk = k, .threads = 1, .tolerance_slack = 1.0, .description = text,              \
                 .batch_invariant_order = order},                                                         \
        .supports = accepts, .run = runs, .usable = isa,                                                    \
    }

/* Tiles as the harness reads them (docs/kernels.md §5): GEMV rows bm = rows of x per pass, bn = weight
 * rows decoded together, bk = codes per decode step; tiled qmm_t rows bm = the micro-kernel's M lanes,
 * bn = its N rows, bk = KC; tiled qmm_n rows bm = the micro-kernel's M rows, bn = its N lanes, bk = KC.
 * Slack 1 for every row: each keeps every product term within K + 2 f32 roundings (counts beside the
 * kernels in simd_kernels.h and in docs/kernels.md "CPU kernels"). */
const qmm_kernel qmm_cpu_kernels[QMM_CPU_KERNEL_COUNT] = {
    [ROW_QMM_T_GEMV_BF16_AVX512] = CPU_ROW("cpu.qmm_t.gemv_bf16.r8.avx512bf16", QMM_OP_QMM_T, "gemv", 8, 8, 64,
            "2-6-bit codes (not 8), bf16 x M<=64 (2/3/5/6-bit: M<=16) / f16 x M=1: codes to bf16 by vpermw (4-bit) or vpermi2w on unpacked bytes, vdpbf16ps dot products (f16: x as head + tail), b·Σx split",
            avx512bf16_gemv_qmm_t_supports, qmm_cpu_gemv_bf16_qmm_t_avx512, qmm_cpu_has_avx512bf16),
    [ROW_QMM_T_GEMV_AVX512] = CPU_ROW("cpu.qmm_t.gemv.r8.avx512", QMM_OP_QMM_T, "gemv", 8, 8, 32,
            "M<=16, memory-bound: weights read once, 8 rows of x x 8 weight rows in ZMM, split s·Σq·x + b·Σx",
            avx512_gemv_qmm_t_supports, qmm_cpu_gemv_qmm_t_avx512, qmm_cpu_has_avx512),
    [ROW_QMM_T_GEMV_AVX2] = CPU_ROW("cpu.qmm_t.gemv.r4.avx2", QMM_OP_QMM_T, "gemv", 4, 4, 16,
            "M<=16 without AVX-512: 4 rows of x x 4 weight rows in YMM, split s·Σq·x + b·Σx",
            avx2_gemv_qmm_t_supports, qmm_cpu_gemv_qmm_t_avx2, qmm_cpu_has_avx2),
    [ROW_QMM_T_GEMV_ORDERED_AVX512] = CPU_ROW_ORDERED("cpu.qmm_t.gemv_ordered.n16.avx512", QMM_OP_QMM_T, "gemv_ordered", 4, 16, 32,
            "M<=16 in the AVX-512 tiled row's order (batch-invariant mode): 16 weight rows in the lanes, codes by gather",
            avx512_gemv_qmm_t_supports, qmm_cpu_gemv_ordered_qmm_t_avx512, qmm_cpu_has_avx512, "split-fma-d32"),
    [ROW_QMM_T_GEMV_ORDERED_AVX2] = CPU_ROW_ORDERED("cpu.qmm_t.gemv_ordered.n8.avx2", QMM_OP_QMM_T, "gemv_ordered", 4, 8, 16,
            "M<=16 in the AVX2 tiled row's order (batch-invariant mode): 8 weight rows in the lanes, codes by gather",
            avx2_gemv_qmm_t_supports, qmm_cpu_gemv_ordered_qmm_t_avx2, qmm_cpu_has_avx2, "split-fma-d16"),
    [ROW_QMM_T_GEMM_BF16_AVX512] = CPU_ROW("cpu.qmm_t.gemm_bf16.m32n12.avx512bf16", QMM_OP_QMM_T, "gemm", 32, 12, 256,
            "any M, bf16 x: codes and x as bf16 pairs, 12x32 ZMM vdpbf16ps micro-kernel, split s·Σq·x + b·Σx per group",
            avx512bf16_qmm_t_supports, qmm_cpu_gemm_bf16_qmm_t_avx512, qmm_cpu_has_avx512bf16),
    [ROW_QMM_T_GEMM_AVX512] = CPU_ROW_ORDERED("cpu.qmm_t.gemm.m32n12.avx512", QMM_OP_QMM_T, "gemm", 32, 12, 256,
            "any M, FMA-bound: panel decoded to f32 once, 12x32 ZMM micro-kernel (n rows x m lanes)",
            avx512_qmm_t_supports, qmm_cpu_gemm_qmm_t_avx512, qmm_cpu_has_avx512, "split-fma-d32"),
    [ROW_QMM_T_GEMM_AVX2] = CPU_ROW_ORDERED("cpu.qmm_t.gemm.m16n6.avx2", QMM_OP_QMM_T, "gemm", 16, 6, 256,
            "any M without AVX-512: panel decoded to f32 once, 6x16 YMM micro-kernel",
            avx2_qmm_t_supports, qmm_cpu_gemm_qmm_t_avx2, qmm_cpu_has_avx2, "split-fma-d16"),
    [ROW_QMM_T_SCALAR] = CPU_ROW_ORDERED("cpu.qmm_t.scalar.r1", QMM_OP_QMM_T, "scalar", 1, 1, 1,
            "any CPU (no AVX2): the oracle's split per output in portable C, lanes of 8 weight rows, threads over them",
            scalar_qmm_t_supports, qmm_cpu_scalar_qmm_t, NULL, "oracle"),
    [ROW_FIRST_OTHER] = CPU_ROW_ORDERED("cpu.qmm_n.gemv.k4.avx512", QMM_OP_QMM_N, "gemv", 8, 32, 4,
            "x·Ŵ, M<=16: weights read once, 4 rows of W per pass over an L1-resident out chunk, ŵ by vpermps table",
            avx512_gemv_qmm_n_supports, qmm_cpu_gemv_qmm_n_avx512, qmm_cpu_has_avx512, "fma-chain"),
    CPU_ROW_ORDERED("cpu.qmm_n.gemv.k4.avx2", QMM_OP_QMM_N, "gemv", 8, 32, 4,
            "x·Ŵ, M<=16 without AVX-512: 4 rows of W per pass over an L1-resident out chunk, ŵ = fma(s,q,b)",
            avx2_gemv_qmm_n_supports, qmm_cpu_gemv_qmm_n_avx2, qmm_cpu_has_avx2, "fma-chain"),
    CPU_ROW_ORDERED("cpu.qmm_n.gemm.m12n32.avx512", QMM_OP_QMM_N, "gemm", 12, 32, 256,
            "x·Ŵ: weight rows decoded along N to f32, 12x32 ZMM micro-kernel (m rows x n lanes)",
            avx512_qmm_n_supports, qmm_cpu_gemm_qmm_n_avx512, qmm_cpu_has_avx512, "fma-chain"),
    CPU_ROW_ORDERED("cpu.qmm_n.gemm.m6n16.avx2", QMM_OP_QMM_N, "gemm", 6, 16, 256,
            "x·Ŵ without AVX-512: weight rows decoded along N to f32, 6x16 YMM micro-kernel",
            avx2_qmm_n_supports, qmm_cpu_gemm_qmm_n_avx2, qmm_cpu_has_avx2, "fma-chain"),
    CPU_ROW("cpu.gather.blocks.avx512", QMM_OP_GATHER, "blocks", QMM_CPU_GEMV_MAX_M, 12, 256,
            "MoE gather: per expert block the AVX-512 qmm_t row the selector picks (a GEMV for small blocks, else tiled), blocks on parallel threads",
            avx512_gather_supports, avx512_gather_run, qmm_cpu_has_avx512),
    CPU_ROW("cpu.gather.blocks.avx2", QMM_OP_GATHER, "blocks", QMM_CPU_GEMV_MAX_M, 6, 256,
            "MoE gather without AVX-512: per expert block the AVX2 qmm_t row the selector picks, blocks on parallel threads",
            avx2_gather_supports, avx2_gather_run, qmm_cpu_has_avx2),
    CPU_ROW_ORDERED("cpu.gather.blocks_ordered.avx512", QMM_OP_GATHER, "blocks_ordered", QMM_CPU_GEMV_MAX_M, 12, 256,
            "MoE gather in batch-invariant mode: per expert block the AVX-512 rows of order split-fma-d32 (ordered GEMV for small blocks, else tiled)",
            avx512_ordered_gather_supports, avx512_ordered_gather_run, qmm_cpu_has_avx512, "split-fma-d32"),
    CPU_ROW_ORDERED("cpu.gather.blocks_ordered.avx2", QMM_OP_GATHER, "blocks_ordered", QMM_CPU_GEMV_MAX_M, 6, 256,
            "MoE gather in batch-invariant mode without AVX-512: per expert block the AVX2 rows of order split-fma-d16",
            avx2_ordered_gather_supports, avx2_ordered_gather_run, qmm_cpu_has_avx2, "split-fma-d16"),
    CPU_ROW_ORDERED("cpu.gather.blocks.portable", QMM_OP_GATHER, "blocks", 1, 1, 1,
            "MoE gather on any CPU (no AVX2): cpu.qmm_t.scalar.r1 per expert block, blocks on parallel threads",
            portable_gather_supports, portable_gather_run, NULL, "oracle"),
};

bool qmm_cpu_unpack_codes_for_test(int isa, const uint32_t *in, size_t count, int bits, uint8_t *codes) {
    if (isa == QMM_CPU_ISA_AVX512 && qmm_cpu_has_avx512(NULL, 0)) qmm_cpu_unpack_codes_avx512(in, count, bits, codes);
    else if (isa == QMM_CPU_ISA_AVX2 && qmm_cpu_has_avx2(NULL, 0)) qmm_cpu_unpack_codes_avx2(in, count, bits, codes);
    else return false;
    return true;
}

#if !(defined(__x86_64__) || defined(__i386__))
/* Not x86: the SIMD files are not built and their rows always refuse (isa.c), so these never run. */
#define NOT_HERE(name)                                                                                       \
    qmm_status name(const qmm_call *call) {                                                                 \
        return qmm_error(QMM_ERR_UNSUPPORTED, "%s: not built for this CPU architecture", #name);            \
    }
NOT_HERE(qmm_cpu_gemv_qmm_t_avx2)
NOT_HERE(qmm_cpu_gemm_qmm_t_avx2)
NOT_HERE(qmm_cpu_gemm_qmm_n_avx2)
NOT_HERE(qmm_cpu_gemv_qmm_t_avx512)
NOT_HERE(qmm_cpu_gemv_bf16_qmm_t_avx512)
NOT_HERE(qmm_cpu_gemm_qmm_t_avx512)
NOT_HERE(qmm_cpu_gemm_bf16_qmm_t_avx512)
NOT_HERE(qmm_cpu_gemm_qmm_n_avx512)
NOT_HERE(qmm_cpu_gemv_qmm_n_avx2)
NOT_HERE(qmm_cpu_gemv_qmm_n_avx512)
NOT_HERE(qmm_cpu_gemv_ordered_qmm_t_avx2)
NOT_HERE(qmm_cpu_gemv_ordered_qmm_t_avx512)
void qmm_cpu_unpack_codes_avx2(const uint32_t *in, size_t count, int bits, uint8_t *codes) {
    qmm_unpack_stream(in, count, bits, codes);
}
void qmm_cpu_unpack_codes_avx512(const uint32_t *in, size_t count, int bits, uint8_t *codes) {
    qmm_unpack_stream(in, count, bits, codes);
}
#endif
