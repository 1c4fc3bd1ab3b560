/*
 * gather.c — what every MoE gather entry point shares (MLX gather_qmm; DESIGN.md §1, docs/kernels.md §7):
 *
 *   qmm_gather_validate          the shape and index checks, before any work (oracle and runtime)
 *   qmm_gather_blocks_supported  whether a qmm_t row can run every expert block of a gather call
 *   qmm_gather_run_blocks        a gather call as one qmm_t call per expert block (kernel.h says how)
 *   qmm_gather_block_end / _call / _rows / _in_place  its pieces, for a row that schedules the blocks itself (src/cpu/,
 *                                and src/cuda/, which gathers x on the device only when some block is not in place)
 *
 * No arithmetic happens here: blocks are computed by the qmm_t row they are given.
 */
#include "kernel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

qmm_status qmm_gather_validate(const char *function, size_t rows, size_t K, qmm_dtype dtype, size_t expert_count,
                               size_t T, const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B,
                               size_t *N, bool *sorted) {
    if (expert_count == 0) return qmm_error(QMM_ERR_SHAPE, "%s: expert_count=0, the weights need at least 1 expert", function);
    if (rows % expert_count != 0)
        return qmm_error(QMM_ERR_SHAPE, "%s: rows=%zu of the stacked weights are not a multiple of expert_count=%zu",
                         function, rows, expert_count);
    *N = rows / expert_count;
    if (T == 0) return qmm_error(QMM_ERR_SHAPE, "%s: T=0, x needs at least 1 row", function);
    if (B == 0) return qmm_error(QMM_ERR_SHAPE, "%s: B=0, a gather needs at least 1 (lhs, rhs) index pair", function);
    if (!rhs_indices) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: rhs_indices is NULL", function);
    qmm_status status = qmm_check_u32_aligned(function, "rhs_indices", rhs_indices);
    if (status == QMM_OK) status = qmm_check_u32_aligned(function, "lhs_indices", lhs_indices);
    if (status != QMM_OK) return status;
    size_t elements;
    const size_t size = qmm_dtype_size(dtype);
    if (!qmm_mul_size(T, K, &elements) || !qmm_mul_size(elements, size, &elements))
        return qmm_error(QMM_ERR_OVERFLOW, "%s: x of T*K = %zu*%zu %s elements overflows size_t", function, T, K,
                         qmm_dtype_name(dtype));
    if (!qmm_mul_size(B, *N, &elements) || !qmm_mul_size(elements, size, &elements) ||
        !qmm_mul_size(B * *N, sizeof(double), &elements))
        return qmm_error(QMM_ERR_OVERFLOW, "%s: out of B*N = %zu*%zu elements overflows size_t", function, B, *N);
    if (!lhs_indices && B > T)
        return qmm_error(QMM_ERR_SHAPE, "%s: lhs_indices is NULL (row i of x for pair i), so B=%zu must be <= T=%zu",
                         function, B, T);
    bool in_order = true;
    for (size_t i = 0; i < B; i++) {
        if (lhs_indices && lhs_indices[i] >= T)
            return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: lhs_indices[%zu]=%u is out of range: x has T=%zu rows (0..%zu)",
                             function, i, lhs_indices[i], T, T - 1);
        if (rhs_indices[i] >= expert_count)
            return qmm_error(QMM_ERR_INVALID_ARGUMENT,
                             "%s: rhs_indices[%zu]=%u is out of range: the weights hold %zu expert%s (0..%zu)", function, i,
                             rhs_indices[i], expert_count, expert_count == 1 ? "" : "s", expert_count - 1);
        if (i > 0 && rhs_indices[i] < rhs_indices[i - 1]) in_order = false;
    }
    *sorted = in_order;
    return QMM_OK;
}

size_t qmm_gather_block_end(const qmm_call *gather, size_t i0) {
    size_t i1 = i0 + 1;
    while (i1 < gather->M && gather->rhs_indices[i1] == gather->rhs_indices[i0]) i1++;
    return i1;
}

bool qmm_gather_block_in_place(const qmm_call *gather, size_t i0, size_t i1) {
    if (!gather->lhs_indices) return true;
    for (size_t i = i0 + 1; i < i1; i++)
        if (gather->lhs_indices[i] != gather->lhs_indices[i0] + (i - i0)) return false;
    return true;
}

/* The qmm_t call of block [i0, i1) (x set by the caller). */
static qmm_call block_call(const qmm_call *gather, size_t i0, size_t i1) {
    const size_t size = qmm_dtype_size(gather->dtype);
    const size_t expert = gather->rhs_indices[i0];
    const size_t words = qmm_packed_words(gather->K, gather->bits), groups = qmm_groups(gather->K, gather->group_size);
    qmm_call call = {
        .op = QMM_OP_QMM_T,
        .dtype = gather->dtype,
        .bits = gather->bits,
        .format_bits = gather->format_bits,
        .group_size = gather->group_size,
        .M = i1 - i0,
        .N = gather->N,
        .K = gather->K,
        .w = gather->w + expert * gather->N * words,
        .scales = (const char *)gather->scales + expert * gather->N * groups * size,
        .biases = (const char *)gather->biases + expert * gather->N * groups * size,
        .out = gather->out ? (char *)gather->out + i0 * gather->N * size : NULL, /* NULL: qmm_select_gather's */
        .backend_state = gather->backend_state,
        .weights_extra = NULL,
        .batch_invariant = gather->batch_invariant, /* the block's rows then reduce in the mode's order */
    };
    return call;
}

qmm_call qmm_gather_block_call(const qmm_call *gather, size_t i0, size_t i1) {
    qmm_call call = block_call(gather, i0, i1);
    if (gather->x && qmm_gather_block_in_place(gather, i0, i1)) {
        const size_t first = gather->lhs_indices ? gather->lhs_indices[i0] : i0;
        call.x = (const unsigned char *)gather->x + first * gather->K * qmm_dtype_size(gather->dtype);
    }
    return call;
}

void qmm_gather_block_rows(const qmm_call *gather, size_t i0, size_t i1, void *rows) {
    const size_t row_bytes = gather->K * qmm_dtype_size(gather->dtype);
    for (size_t i = i0; i < i1; i++) {
        const size_t row = gather->lhs_indices ? gather->lhs_indices[i] : i;
        memcpy((unsigned char *)rows + (i - i0) * row_bytes, (const unsigned char *)gather->x + row * row_bytes,
               row_bytes);
    }
}

bool qmm_gather_blocks_supported(const qmm_call *gather, const qmm_kernel *qmm_t_row, char *why_not,
                                 size_t why_not_size) {
    if (gather->op != QMM_OP_GATHER) {
        snprintf(why_not, why_not_size, "a gather row computes gather, the call is %s", qmm_op_name(gather->op));
        return false;
    }
    char reason[256];
    for (size_t i0 = 0; i0 < gather->M;) {
        const size_t i1 = qmm_gather_block_end(gather, i0);
        qmm_call call = block_call(gather, i0, i1);
        if (!qmm_kernel_accepts(qmm_t_row, &call, reason, sizeof reason)) {
            snprintf(why_not, why_not_size, "expert block rows %zu..%zu (expert %u, M=%zu): %s", i0, i1 - 1,
                     gather->rhs_indices[i0], i1 - i0, reason);
            return false;
        }
        i0 = i1;
    }
    return true;
}

qmm_status qmm_gather_run_blocks(const qmm_call *gather, const qmm_kernel *qmm_t_row) {
    const size_t size = qmm_dtype_size(gather->dtype);
    const size_t row_bytes = gather->K * size; /* T·K·size checked by the runtime */
    unsigned char *scratch = NULL;
    size_t scratch_rows = 0;
    qmm_status status = QMM_OK;
    for (size_t i0 = 0; i0 < gather->M;) {
        const size_t i1 = qmm_gather_block_end(gather, i0);
        qmm_call call = block_call(gather, i0, i1);
        const size_t first = gather->lhs_indices ? gather->lhs_indices[i0] : i0;
        if (qmm_gather_block_in_place(gather, i0, i1)) {
            call.x = (const unsigned char *)gather->x + first * row_bytes;
        } else {
            if (call.M > scratch_rows) {
                /* Repeated rows make a block larger than x (T·K, which the runtime bounded): checked. */
                size_t bytes;
                if (!qmm_mul_size(call.M, row_bytes, &bytes)) {
                    status = qmm_error(QMM_ERR_OVERFLOW, "gather: %zu rows of x of %zu bytes overflow size_t", call.M,
                                       row_bytes);
                    goto cleanup;
                }
                unsigned char *grown = realloc(scratch, bytes);
                if (!grown) {
                    status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "gather: no memory for %zu gathered rows of x (%zu bytes)",
                                       call.M, bytes);
                    goto cleanup;
                }
                scratch = grown;
                scratch_rows = call.M;
            }
            for (size_t i = i0; i < i1; i++)
                memcpy(scratch + (i - i0) * row_bytes, (const unsigned char *)gather->x + gather->lhs_indices[i] * row_bytes,
                       row_bytes);
            call.x = scratch;
        }
        if ((status = qmm_t_row->run(&call)) != QMM_OK) goto cleanup;
        i0 = i1;
    }

cleanup:
    free(scratch);
    return status;
}
