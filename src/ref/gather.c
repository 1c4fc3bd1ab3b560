/*
 * gather.c — the MoE gather oracle (MLX gather_qmm, transpose=True; DESIGN.md §1):
 *
 *   qmm_ref_gather_qmm         out[i] = x[lhs_indices[i]]·Ŵ[rhs_indices[i]]ᵀ, each row exactly qmm_ref_qmm_t's
 *   qmm_ref_gather_dense_f64   the same in f64 with abs_dot, each row qmm_ref_dense_f64's
 *
 * Both are one call of the qmm_t oracle per index pair, with M = 1, on the pair's x row and expert: the
 * gather adds no arithmetic of its own, so its bound is qmm_t's (docs/kernels.md §6) and a row's bits do
 * not depend on the other pairs. Deliberately plain: every pair decodes its expert again, which is what an
 * oracle may afford (the fast way is ref.gather.blocks.r1, src/core/gather.c).
 */
#include "internal.h"

#include <stdlib.h>

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

qmm_status qmm_ref_gather_qmm(const qmm_qmatrix *stacked, size_t expert_count, const void *x, size_t T,
                              const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B, void *out) {
    size_t N;
    qmm_status status = check_gather("qmm_ref_gather_qmm", stacked, expert_count, x, T, lhs_indices, rhs_indices, B,
                                     out, &N);
    if (status != QMM_OK) return status;
    const size_t size = qmm_dtype_size(stacked->dtype), K = stacked->cols;
    for (size_t i = 0; i < B; i++) {
        const size_t row = lhs_indices ? lhs_indices[i] : i;
        const qmm_qmatrix expert = expert_matrix(stacked, N, rhs_indices[i]);
        status = qmm_ref_qmm_t(&expert, (const unsigned char *)x + row * K * size, 1, (unsigned char *)out + i * N * size);
        if (status != QMM_OK) return status;
    }
    return QMM_OK;
}

qmm_status qmm_ref_gather_dense_f64(const qmm_qmatrix *stacked, size_t expert_count, const void *x, size_t T,
                                    const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B,
                                    double *out_f64, double *abs_dot) {
    size_t N;
    qmm_status status = check_gather("qmm_ref_gather_dense_f64", stacked, expert_count, x, T, lhs_indices,
                                     rhs_indices, B, out_f64, &N);
    if (status != QMM_OK) return status;
    const size_t size = qmm_dtype_size(stacked->dtype), K = stacked->cols;
    for (size_t i = 0; i < B; i++) {
        const size_t row = lhs_indices ? lhs_indices[i] : i;
        const qmm_qmatrix expert = expert_matrix(stacked, N, rhs_indices[i]);
        status = qmm_ref_dense_f64(&expert, (const unsigned char *)x + row * K * size, 1, 1, out_f64 + i * N,
                                   abs_dot ? abs_dot + i * N : NULL);
        if (status != QMM_OK) return status;
    }
    return QMM_OK;
}
