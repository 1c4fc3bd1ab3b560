/*
 * kernels.c — the reference rows of every backend's kernel table (DESIGN.md §2).
 *
 * ref.qmm_t.scalar.r1 and ref.qmm_n.scalar.r1 run the oracle (src/ref/oracle.c) on the call's host
 * pointers. They accept every valid call of their op (any M, N, K the runtime lets through), which is
 * why they are appended last: the selector always has an answer. Tile "r1": one output at a time,
 * BM = BN = BK = 1 (no tile), one thread.
 */
#include "kernel.h"

#include <stdio.h>

static bool ref_supports(const qmm_op op, const qmm_call *call, char *why_not, size_t why_not_size) {
    if (call->op != op) {
        snprintf(why_not, why_not_size, "this row computes %s, the call is %s", qmm_op_name(op),
                 qmm_op_name(call->op));
        return false;
    }
    return true;
}

static bool ref_qmm_t_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    return ref_supports(QMM_OP_QMM_T, call, why_not, why_not_size);
}

static bool ref_qmm_n_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    return ref_supports(QMM_OP_QMM_N, call, why_not, why_not_size);
}

/* The call's weights as the oracle's qmm_qmatrix: rows × cols is N × K for qmm_t, K × N for qmm_n. */
static qmm_qmatrix call_matrix(const qmm_call *call) {
    qmm_qmatrix matrix = {
        .w = call->w,
        .scales = call->scales,
        .biases = call->biases,
        .dtype = call->dtype,
        .rows = call->op == QMM_OP_QMM_T ? call->N : call->K,
        .cols = call->op == QMM_OP_QMM_T ? call->K : call->N,
        .bits = call->bits,
        .group_size = call->group_size,
    };
    return matrix;
}

static qmm_status ref_qmm_t_run(const qmm_call *call) {
    qmm_qmatrix matrix = call_matrix(call);
    return qmm_ref_qmm_t(&matrix, call->x, call->M, call->out);
}

static qmm_status ref_qmm_n_run(const qmm_call *call) {
    qmm_qmatrix matrix = call_matrix(call);
    return qmm_ref_qmm_n(&matrix, call->x, call->M, call->out);
}

/* Slack 1: the oracle is exactly the order the bound of docs/kernels.md "Tolerance" was derived for. */
const qmm_kernel qmm_ref_kernels[] = {
    {
        .info = {.name = "ref.qmm_t.scalar.r1", .backend = QMM_BACKEND_REF, .op = QMM_OP_QMM_T,
                 .family = "scalar", .bm = 1, .bn = 1, .bk = 1, .threads = 1, .tolerance_slack = 1.0,
                 .description = "scalar oracle x·Ŵᵀ, f32 per-group split acc += s·Σ(q·x) + b·Σx"},
        .supports = ref_qmm_t_supports,
        .run = ref_qmm_t_run,
    },
    {
        .info = {.name = "ref.qmm_n.scalar.r1", .backend = QMM_BACKEND_REF, .op = QMM_OP_QMM_N,
                 .family = "scalar", .bm = 1, .bn = 1, .bk = 1, .threads = 1, .tolerance_slack = 1.0,
                 .description = "scalar oracle x·Ŵ, f32 sum over k of x·(s·q + b) as MLX CPU _qmm"},
        .supports = ref_qmm_n_supports,
        .run = ref_qmm_n_run,
    },
};
const size_t qmm_ref_kernel_count = sizeof qmm_ref_kernels / sizeof qmm_ref_kernels[0];
