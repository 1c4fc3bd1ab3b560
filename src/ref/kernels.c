/*
 * kernels.c — the reference rows of every backend's kernel table (DESIGN.md §2).
 *
 * ref.qmm_t.scalar.r1 and ref.qmm_n.scalar.r1 run the oracle (src/ref/oracle.c) on the call's host
 * pointers. They accept every valid call of their op (any M, N, K the runtime lets through), which is
 * why they are appended last: the selector always has an answer. Tile "r1": one output at a time,
 * BM = BN = BK = 1 (no tile), one thread.
 *
 * The gather op has two rows, both accepting every valid gather call:
 *   ref.gather.blocks.r1  one ref.qmm_t.scalar.r1 call per expert block (qmm_gather_run_blocks,
 *                         src/core/gather.c): the way a backend builds its gather rows from its qmm_t rows,
 *                         and the selector's choice here (each weight row decoded once per block, not per pair)
 *   ref.gather.scalar.r1  the gather oracle qmm_ref_gather_qmm: all pairs grouped by expert, one
 *                         qmm_ref_qmm_t call per used expert (last: always an answer)
 * Both give bit for bit the same outputs: qmm_ref_qmm_t computes each row of x on its own.
 *
 * Batch-invariant order "oracle" (docs/kernels.md "Batch-invariant mode") on every row: the oracle reduces every
 * output in one sequential order whatever M (its blocks of rows only share loads), and each gather pair is the
 * oracle's qmm_t output of its x row and expert alone (qmm_gather_options.batch_invariant).
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

static bool ref_gather_scalar_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    return ref_supports(QMM_OP_GATHER, call, why_not, why_not_size);
}

static qmm_status ref_gather_scalar_run(const qmm_call *call) {
    qmm_qmatrix stacked = {
        .w = call->w,
        .scales = call->scales,
        .biases = call->biases,
        .dtype = call->dtype,
        .rows = call->expert_count * call->N, /* checked by the runtime */
        .cols = call->K,
        .bits = call->bits,
        .group_size = call->group_size,
    };
    return qmm_ref_gather_qmm(&stacked, call->expert_count, call->x, call->T, call->lhs_indices, call->rhs_indices,
                              call->M, call->out);
}

static bool ref_gather_blocks_supports(const qmm_call *call, char *why_not, size_t why_not_size) {
    return qmm_gather_blocks_supported(call, &qmm_ref_kernels[0], why_not, why_not_size);
}

static qmm_status ref_gather_blocks_run(const qmm_call *call) { return qmm_gather_run_blocks(call, &qmm_ref_kernels[0]); }

/* Slack 1: the oracle is exactly the order the bound of docs/kernels.md "Tolerance" was derived for. Both gather
 * rows declare "oracle" too: each pair's output is ref.qmm_t.scalar.r1's for its x row and expert alone, whatever
 * the rest of the routing (tests/runtime/test_gather.c). */
const qmm_kernel qmm_ref_kernels[] = {
    {
        .info = {.name = "ref.qmm_t.scalar.r1", .backend = QMM_BACKEND_REF, .op = QMM_OP_QMM_T,
                 .family = "scalar", .bm = 1, .bn = 1, .bk = 1, .threads = 1, .tolerance_slack = 1.0,
                 .description = "scalar oracle x·Ŵᵀ, f32 per-group split acc += s·Σ(q·x) + b·Σx",
                 .batch_invariant_order = "oracle"},
        .supports = ref_qmm_t_supports,
        .run = ref_qmm_t_run,
    },
    {
        .info = {.name = "ref.qmm_n.scalar.r1", .backend = QMM_BACKEND_REF, .op = QMM_OP_QMM_N,
                 .family = "scalar", .bm = 1, .bn = 1, .bk = 1, .threads = 1, .tolerance_slack = 1.0,
                 .description = "scalar oracle x·Ŵ, f32 sum over k of x·(s·q + b) as MLX CPU _qmm",
                 .batch_invariant_order = "oracle"},
        .supports = ref_qmm_n_supports,
        .run = ref_qmm_n_run,
    },
    {
        .info = {.name = "ref.gather.blocks.r1", .backend = QMM_BACKEND_REF, .op = QMM_OP_GATHER,
                 .family = "blocks", .bm = 1, .bn = 1, .bk = 1, .threads = 1, .tolerance_slack = 1.0,
                 .description = "gather: one ref.qmm_t.scalar.r1 product per expert block (rows of one expert)",
                 .batch_invariant_order = "oracle"},
        .supports = ref_gather_blocks_supports,
        .run = ref_gather_blocks_run,
    },
    {
        .info = {.name = "ref.gather.scalar.r1", .backend = QMM_BACKEND_REF, .op = QMM_OP_GATHER,
                 .family = "scalar", .bm = 1, .bn = 1, .bk = 1, .threads = 1, .tolerance_slack = 1.0,
                 .description = "gather oracle: x[lhs[i]]·Ŵ[rhs[i]]ᵀ per pair, f32 per-group split as qmm_t",
                 .batch_invariant_order = "oracle"},
        .supports = ref_gather_scalar_supports,
        .run = ref_gather_scalar_run,
    },
};
const size_t qmm_ref_kernel_count = sizeof qmm_ref_kernels / sizeof qmm_ref_kernels[0];
