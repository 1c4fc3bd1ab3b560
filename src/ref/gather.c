/*
 * gather.c — the MoE gather oracle (MLX gather_qmm, transpose=True; DESIGN.md §1):
 *
 *   qmm_ref_gather_qmm         out[i] = x[lhs_indices[i]]·Ŵ[rhs_indices[i]]ᵀ, each row exactly qmm_ref_qmm_t's
 *   qmm_ref_gather_dense_f64   the same in f64 with abs_dot, each row qmm_ref_dense_f64's
 *
 * Each output row is what the qmm_t oracle gives for the pair's x row and expert alone: the gather adds
 * no arithmetic of its own, so its bound is qmm_t's (docs/kernels.md §6) and a row's bits do not depend on
 * the other pairs. The pairs are grouped by expert (gather_by_expert) only so that each used expert is
 * decoded once per call rather than once per pair; the grouping is over all pairs, in any order, unlike
 * qmm_gather_run_blocks (src/core/gather.c), which follows the runs of consecutive pairs.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Expert e of the stacked matrix, as a matrix of its own (N rows of the same format). */
static qmm_qmatrix expert_matrix(const qmm_qmatrix *stacked, size_t N, size_t expert) {
    const size_t size = qmm_dtype_size(stacked->dtype);
    const size_t words = qmm_packed_words(stacked->cols, stacked->bits);
    const size_t groups = qmm_groups(stacked->cols, stacked->group_size);
    qmm_qmatrix matrix = *stacked;
    matrix.w = stacked->w + expert * N * words;
    matrix.scales = (const unsigned char *)stacked->scales + expert * N * groups * size;
    matrix.biases = (const unsigned char *)stacked->biases + expert * N * groups * size;
    matrix.rows = N;
    return matrix;
}

/* The checks both entry points share; N per expert. */
static qmm_status check_gather(const char *function, const qmm_qmatrix *stacked, size_t expert_count, const void *x,
                               size_t T, const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B,
                               const void *out, size_t *N) {
    if (!stacked) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: stacked is NULL", function);
    qmm_status status = qmm_qmatrix_validate(stacked);
    if (status != QMM_OK) return status;
    if (!x) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: x is NULL", function);
    if (!out) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: out is NULL", function);
    bool sorted;
    return qmm_gather_validate(function, stacked->rows, stacked->cols, stacked->dtype, expert_count, T, lhs_indices,
                               rhs_indices, B, N, &sorted);
}

/* Both entry points: the pairs grouped by expert (a counting sort, stable), each expert's x rows gathered
 * into one block, one oracle call per used expert (qmm_ref_qmm_t, or qmm_ref_dense_f64 when out_f64 is not
 * NULL), and the block's output rows scattered back to their pairs. Every row of x is its own sum in both
 * oracles, so the grouping changes how often an expert is decoded, not a single bit of any output. */
static qmm_status gather_by_expert(const char *function, const qmm_qmatrix *stacked, size_t expert_count,
                                   const void *x, size_t T, const uint32_t *lhs_indices, const uint32_t *rhs_indices,
                                   size_t B, void *out, double *out_f64, double *abs_dot) {
    size_t N;
    qmm_status status = check_gather(function, stacked, expert_count, x, T, lhs_indices, rhs_indices, B,
                                     out ? out : (void *)out_f64, &N);
    if (status != QMM_OK) return status;
    const size_t size = qmm_dtype_size(stacked->dtype), K = stacked->cols;
    const size_t out_size = out_f64 ? sizeof(double) : size;
    size_t x_bytes, out_bytes, largest = 0;
    size_t *start = calloc(expert_count + 1, sizeof *start), *order = malloc(B * sizeof *order);
    unsigned char *x_block = NULL, *out_block = NULL;
    double *abs_block = NULL;
    if (!start || !order) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "%s: no memory to group B=%zu pairs by expert", function, B);
        goto cleanup;
    }
    for (size_t i = 0; i < B; i++) start[rhs_indices[i] + 1]++;
    /* the blocks hold one expert's rows at a time: room for the largest block, not for all B rows (at most T rows
     * when each token's experts are distinct: B = T·top_k rows would be allocated and mostly never touched) */
    for (size_t e = 0; e < expert_count; e++) largest = start[e + 1] > largest ? start[e + 1] : largest;
    if (!qmm_mul_size(largest, K * size, &x_bytes) || !qmm_mul_size(largest, N * out_size, &out_bytes)) {
        status = qmm_error(QMM_ERR_OVERFLOW, "%s: %zu gathered rows of x overflow size_t", function, largest);
        goto cleanup;
    }
    const size_t abs_bytes = largest * N * sizeof *abs_block; /* ≤ B·N·8, checked by qmm_gather_validate */
    x_block = malloc(x_bytes ? x_bytes : 1);
    out_block = malloc(out_bytes ? out_bytes : 1);
    abs_block = abs_dot ? malloc(abs_bytes ? abs_bytes : 1) : NULL;
    if (!x_block || !out_block || (abs_dot && !abs_block)) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "%s: no memory to group B=%zu pairs by expert (%zu rows at most)",
                           function, B, largest);
        goto cleanup;
    }
    for (size_t e = 0; e < expert_count; e++) start[e + 1] += start[e];
    for (size_t i = 0; i < B; i++) order[start[rhs_indices[i]]++] = i; /* start[e] is now expert e's end */
    for (size_t e = 0, first = 0; e < expert_count; first = start[e++]) {
        const size_t rows = start[e] - first;
        if (rows == 0) continue;
        for (size_t r = 0; r < rows; r++) {
            const size_t i = order[first + r], row = lhs_indices ? lhs_indices[i] : i;
            memcpy(x_block + r * K * size, (const unsigned char *)x + row * K * size, K * size);
        }
        const qmm_qmatrix expert = expert_matrix(stacked, N, e);
        status = out_f64 ? qmm_ref_dense_f64(&expert, x_block, rows, 1, (double *)out_block, abs_block)
                         : qmm_ref_qmm_t(&expert, x_block, rows, out_block);
        if (status != QMM_OK) goto cleanup;
        for (size_t r = 0; r < rows; r++) {
            const size_t i = order[first + r];
            if (out_f64) memcpy(out_f64 + i * N, (double *)out_block + r * N, N * sizeof(double));
            else memcpy((unsigned char *)out + i * N * size, out_block + r * N * size, N * size);
            if (abs_dot) memcpy(abs_dot + i * N, abs_block + r * N, N * sizeof(double));
        }
    }
    status = QMM_OK;

cleanup:
    free(start);
    free(order);
    free(x_block);
    free(out_block);
    free(abs_block);
    return status;
}

qmm_status qmm_ref_gather_qmm(const qmm_qmatrix *stacked, size_t expert_count, const void *x, size_t T,
                              const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B, void *out) {
    if (!out) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_ref_gather_qmm: out is NULL");
    return gather_by_expert("qmm_ref_gather_qmm", stacked, expert_count, x, T, lhs_indices, rhs_indices, B, out, NULL,
                            NULL);
}

qmm_status qmm_ref_gather_dense_f64(const qmm_qmatrix *stacked, size_t expert_count, const void *x, size_t T,
                                    const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B,
                                    double *out_f64, double *abs_dot) {
    if (!out_f64) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_ref_gather_dense_f64: out_f64 is NULL");
    return gather_by_expert("qmm_ref_gather_dense_f64", stacked, expert_count, x, T, lhs_indices, rhs_indices, B,
                            NULL, out_f64, abs_dot);
}
