/*
 * oracle.c — the reference products every kernel is tested against (DESIGN.md §1, §5).
 *
 *   qmm_ref_qmm_t      out = x·Ŵᵀ in f32 with the seed's per-group split acc += s·Σ(q·x) + b·Σx
 *   qmm_ref_qmm_n      out = x·Ŵ  in f32 with MLX CPU's transpose=False arithmetic (see below)
 *                      both with the non-finite rule: an output whose f32 accumulator ends up ±inf or
 *                      NaN is recomputed in f64 in the direct form (docs/kernels.md §2, "Non-finite")
 *   qmm_ref_dense_f64  either product in f64 with exact dequantization, never rounded, plus the
 *                      magnitudes Σ(|s·q| + |b|)·|x| that feed the error bound
 *   qmm_error_bound    the one tolerance formula (derivation: docs/kernels.md, "Tolerance")
 *   qmm_output_check   the one verdict on an output: the bound, plus the values rounding cannot keep
 *                      finite (beyond the output dtype's range) and the non-finite exact values
 *
 * CMakeLists.txt builds this file with -ffp-contract=off: every operation below rounds on its own, on
 * every target (a fused multiply-add would change the f32 results, and qmm_ref_qmm_n's agreement with
 * MLX bit for bit). Every sum is formed in one fixed order, so the results do not depend on the blocking below: rows of
 * x are processed LANES at a time only so that the compiler can keep LANES independent accumulators
 * in one vector register (each lane is its own sequential sum, bit for bit the scalar loop).
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows of x handled together: 8 f32 lanes = two SSE registers or one AVX register. */
#define LANES 8
/* Rows of x whose f32 copy is kept at once (bounds the scratch memory at ROW_BLOCK·K floats while
 * still decoding each weight row only once per block). */
#define ROW_BLOCK 32

/* Checks what every oracle entry point needs and returns N and K of the product. */
static qmm_status check_product(const char *function, const qmm_qmatrix *matrix, const void *x, size_t M,
                                const void *out, int transpose, size_t *N, size_t *K) {
    if (!matrix) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: matrix is NULL", function);
    qmm_status status = qmm_qmatrix_validate(matrix);
    if (status != QMM_OK) return status;
    if (!x) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: x is NULL", function);
    if (!out) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: out is NULL", function);
    if (transpose != 0 && transpose != 1)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: transpose=%d must be 1 (qmm_t) or 0 (qmm_n)", function,
                         transpose);
    *N = transpose ? matrix->rows : matrix->cols;
    *K = transpose ? matrix->cols : matrix->rows;
    if (M == 0) return qmm_error(QMM_ERR_SHAPE, "%s: M=0, a product needs M >= 1 rows of x", function);
    size_t product;
    if (!qmm_mul_size(M, *K, &product))
        return qmm_error(QMM_ERR_OVERFLOW, "%s: M*K = %zu*%zu overflows size_t", function, M, *K);
    if (!qmm_mul_size(M, *N, &product))
        return qmm_error(QMM_ERR_OVERFLOW, "%s: M*N = %zu*%zu overflows size_t", function, M, *N);
    /* x is M·K elements of the matrix's dtype, out M·N of it (the f64 outputs and abs_dot: M·N doubles); the caller
     * allocated them, but a count that cannot be addressed in bytes is still an overflow worth naming */
    const size_t size = qmm_dtype_size(matrix->dtype);
    if (!qmm_mul_size(M, *K, &product) || !qmm_mul_size(product, size, &product))
        return qmm_error(QMM_ERR_OVERFLOW, "%s: x's M*K = %zu*%zu elements of %s overflow a byte count", function, M,
                         *K, qmm_dtype_name(matrix->dtype));
    if (!qmm_mul_size(M, *N, &product) || !qmm_mul_size(product, sizeof(double) > size ? sizeof(double) : size, &product))
        return qmm_error(QMM_ERR_OVERFLOW, "%s: M*N = %zu*%zu elements overflow a byte count", function, M, *N);
    return QMM_OK;
}

/* calloc of rows·count elements of size bytes, overflow-checked; NULL on overflow or exhaustion. */
static void *scratch(size_t rows, size_t count, size_t size) {
    size_t elements, bytes;
    if (!qmm_mul_size(rows, count, &elements) || !qmm_mul_size(elements, size, &bytes)) return NULL;
    return calloc(bytes ? bytes : 1, 1);
}

/* Codes of one packed row as floats (exact: a code is < 256). */
static void decode_row_codes(const uint32_t *row, size_t cols, int bits, float *codes) {
    for (size_t j = 0; j < cols; j++) codes[j] = (float)qmm_code_at(row, j, bits);
}

/*
 * The non-finite rule (docs/kernels.md §2): one output, out[m, n] = Σ_k ŵ·x_k, in the direct form in
 * f64 — ŵ = s·q + b formed in f64 (s·q exact, + b rounded once), then Σ ŵ·x_k in increasing k — the
 * same operations in the same order as qmm_ref_dense_f64, so the value is bit for bit the dense one.
 * Used only where the f32 accumulator of that output is ±inf or NaN. From finite f32/f16/bf16 inputs
 * this sum cannot overflow (|ŵ·x| < 2^128·2^8·2^128 and K < 2^24 terms, far below 2^1024), so it is
 * non-finite exactly when an input is: IEEE arithmetic then decides (+inf·ŵ = ±inf for ŵ ≠ 0,
 * 0·inf = NaN, +inf + −inf = NaN, NaN stays NaN), independent of the order of the sum.
 * The one implementation: the reference rows (below) and every CPU row (src/cpu/backend.c) call it;
 * this file is built with -ffp-contract=off, so no fused multiply-add changes its bits anywhere.
 */
double qmm_direct_output_f64(const qmm_direct_operands *op, size_t m, size_t n) {
    const size_t K = op->K, group_size = (size_t)op->group_size;
    const size_t cols = op->transpose ? op->K : op->N; /* the quantized dimension */
    const size_t groups = cols / group_size;
    const size_t words = qmm_packed_words(cols, op->bits);
    double sum = 0.0;
    for (size_t k = 0; k < K; k++) {
        const size_t row = op->transpose ? n : k, col = op->transpose ? k : n;
        const double s = qmm_load_f32(op->scales, op->dtype, row * groups + col / group_size);
        const double b = qmm_load_f32(op->biases, op->dtype, row * groups + col / group_size);
        const double sq = s * (double)qmm_code_at(op->w + row * words, col, op->bits);
        const double w_hat = sq + b;
        sum += w_hat * (double)qmm_load_f32(op->x, op->dtype, m * K + k);
    }
    return sum;
}

static double direct_f64(const qmm_qmatrix *matrix, const void *x, size_t m, size_t n, size_t K, int transpose) {
    const qmm_direct_operands op = {.transpose = transpose, .dtype = matrix->dtype, .bits = matrix->bits,
                                    .group_size = matrix->group_size, .N = transpose ? matrix->rows : matrix->cols,
                                    .K = K, .x = x, .w = matrix->w, .scales = matrix->scales,
                                    .biases = matrix->biases};
    return qmm_direct_output_f64(&op, m, n);
}

/* The f32 accumulator of one output under the non-finite rule: kept where finite, else replaced by the
 * f64 direct form rounded to f32 (to ±inf only where that value is beyond the f32 range). */
static float finite_or_direct(float acc, const qmm_qmatrix *matrix, const void *x, size_t m, size_t n, size_t K,
                              int transpose) {
    if (isfinite(acc)) return acc;
    return (float)direct_f64(matrix, x, m, n, K, transpose);
}

/* ───────────────────────────── qmm_t in f32 ───────────────────────────── */

/*
 * out[m, n] = Σ_g ( s_g·Σ_{i∈g}(q_i·x_i) + b_g·Σ_{i∈g} x_i ), the seed's algebraic split (the
 * metaltile mt_qmm kernels and their CPU reference). Per output, in f32:
 *   acc = 0; for each group g in order:
 *     qdot = 0; for k in the group in order: qdot += q_k·x_k
 *     xsum = 0; for k in the group in order: xsum += x_k
 *     acc += s_g·qdot + b_g·xsum            (each operation rounded to f32, no fused multiply-add
 *                                            where the target does not contract)
 *   if acc is ±inf or NaN: acc = (float)direct_f64(...)   (the non-finite rule, above)
 *   out = round_to_dtype(acc)               (the one narrowing, round to nearest even)
 * xsum depends only on (m, g), so it is computed once per row of x; the value is the same.
 * Why the rule: the split subtracts partial sums that can overflow or be infinite where the product
 * is not (x[0] = +inf with every ŵ = 0.5 gives s·inf + b·inf = inf − inf = NaN; x = [2e38, 2e38, 0, …]
 * with ŵ = 0 overflows Σq·x and Σx to inf although the product is 0).
 */
qmm_status qmm_ref_qmm_t(const qmm_qmatrix *matrix, const void *x, size_t M, void *out) {
    size_t N, K;
    qmm_status status = check_product("qmm_ref_qmm_t", matrix, x, M, out, 1, &N, &K);
    if (status != QMM_OK) return status;

    const size_t group_size = (size_t)matrix->group_size;
    const size_t groups = K / group_size;
    const size_t words = qmm_packed_words(K, matrix->bits);
    const qmm_dtype dtype = matrix->dtype;
    float *codes = scratch(1, K, sizeof(float));
    /* x of one block of rows, lane-interleaved: x_lanes[(lane_block·K + k)·LANES + lane]. */
    float *x_lanes = scratch(ROW_BLOCK, K, sizeof(float));
    float *x_sums = scratch(ROW_BLOCK, groups, sizeof(float));
    float *scales = scratch(1, groups, sizeof(float));
    float *biases = scratch(1, groups, sizeof(float));
    if (!codes || !x_lanes || !x_sums || !scales || !biases) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_ref_qmm_t: no memory for scratch of K=%zu", K);
        goto cleanup;
    }

    for (size_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
        size_t rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;
        size_t lane_blocks = (rows + LANES - 1) / LANES;
        memset(x_lanes, 0, ROW_BLOCK * K * sizeof(float));
        for (size_t r = 0; r < rows; r++) {
            float *lane_base = x_lanes + (r / LANES) * K * LANES + r % LANES;
            for (size_t k = 0; k < K; k++) lane_base[k * LANES] = qmm_load_f32(x, dtype, (m0 + r) * K + k);
            for (size_t g = 0; g < groups; g++) {
                float sum = 0.0f;
                for (size_t k = g * group_size; k < (g + 1) * group_size; k++) sum += lane_base[k * LANES];
                x_sums[r * groups + g] = sum;
            }
        }
        for (size_t n = 0; n < N; n++) {
            decode_row_codes(matrix->w + n * words, K, matrix->bits, codes);
            for (size_t g = 0; g < groups; g++) {
                scales[g] = qmm_load_f32(matrix->scales, dtype, n * groups + g);
                biases[g] = qmm_load_f32(matrix->biases, dtype, n * groups + g);
            }
            for (size_t block = 0; block < lane_blocks; block++) {
                const float *xb = x_lanes + block * K * LANES;
                float acc[LANES] = {0};
                for (size_t g = 0; g < groups; g++) {
                    float qdot[LANES] = {0};
                    for (size_t k = g * group_size; k < (g + 1) * group_size; k++) {
                        const float code = codes[k];
                        const float *xk = xb + k * LANES;
                        for (int lane = 0; lane < LANES; lane++) qdot[lane] += code * xk[lane];
                    }
                    for (int lane = 0; lane < LANES; lane++) {
                        size_t r = block * LANES + (size_t)lane;
                        float xsum = r < rows ? x_sums[r * groups + g] : 0.0f;
                        acc[lane] += scales[g] * qdot[lane] + biases[g] * xsum;
                    }
                }
                for (int lane = 0; lane < LANES; lane++) {
                    size_t r = block * LANES + (size_t)lane;
                    if (r < rows)
                        qmm_store_f32(out, dtype, (m0 + r) * N + n,
                                      finite_or_direct(acc[lane], matrix, x, m0 + r, n, K, 1));
                }
            }
        }
    }
    status = QMM_OK;

cleanup:
    free(codes);
    free(x_lanes);
    free(x_sums);
    free(scales);
    free(biases);
    return status;
}

/* ───────────────────────────── qmm_n in f32 ───────────────────────────── */

/*
 * MLX CPU, transpose=False (mlx/backend/cpu/quantized.cpp, _qmm): for each row m of x, the output
 * row starts at 0 and, for k = 0, 1, ..., K−1 in order, every output n receives
 *     out[m, n] += x[m, k] · (s·q + b)            with s, b the group of (k, n) along N.
 * So there is no algebraic split here: ŵ = s·q + b is formed first (one multiply, one add), then one
 * multiply by x and one add into the sum over k. We do exactly these operations in exactly this
 * order, in f32, and round once to the dtype at the end. MLX's CPU code runs them in the activation
 * type T, so for f16/bf16 it rounds every operation to T; qmm accumulates in f32 (DESIGN.md §1), so
 * for f16/bf16 the two differ by MLX's extra roundings, and for f32 they agree bit for bit.
 * ŵ depends only on (k, n), so it is formed once per weight row; the value is the same.
 * The non-finite rule applies as in qmm_ref_qmm_t: an accumulator that ends ±inf or NaN (an input was
 * non-finite, or a partial sum overflowed f32) is replaced by the f64 direct form before the narrowing;
 * wherever the f32 result is finite this is exactly MLX's arithmetic.
 */
qmm_status qmm_ref_qmm_n(const qmm_qmatrix *matrix, const void *x, size_t M, void *out) {
    size_t N, K;
    qmm_status status = check_product("qmm_ref_qmm_n", matrix, x, M, out, 0, &N, &K);
    if (status != QMM_OK) return status;

    const size_t group_size = (size_t)matrix->group_size;
    const size_t groups = N / group_size;
    const size_t words = qmm_packed_words(N, matrix->bits);
    const qmm_dtype dtype = matrix->dtype;
    float *w_hat = scratch(1, N, sizeof(float));
    float *acc = scratch(ROW_BLOCK, N, sizeof(float));
    if (!w_hat || !acc) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_ref_qmm_n: no memory for scratch of N=%zu", N);
        goto cleanup;
    }

    for (size_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
        size_t rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;
        memset(acc, 0, ROW_BLOCK * N * sizeof(float));
        for (size_t k = 0; k < K; k++) {
            const uint32_t *row = matrix->w + k * words;
            for (size_t g = 0; g < groups; g++) {
                const float s = qmm_load_f32(matrix->scales, dtype, k * groups + g);
                const float b = qmm_load_f32(matrix->biases, dtype, k * groups + g);
                for (size_t n = g * group_size; n < (g + 1) * group_size; n++) {
                    float scaled = s * (float)qmm_code_at(row, n, matrix->bits);
                    w_hat[n] = scaled + b;
                }
            }
            for (size_t r = 0; r < rows; r++) {
                const float xv = qmm_load_f32(x, dtype, (m0 + r) * K + k);
                float *acc_row = acc + r * N;
                for (size_t n = 0; n < N; n++) acc_row[n] += xv * w_hat[n];
            }
        }
        for (size_t r = 0; r < rows; r++)
            for (size_t n = 0; n < N; n++)
                qmm_store_f32(out, dtype, (m0 + r) * N + n,
                              finite_or_direct(acc[r * N + n], matrix, x, m0 + r, n, K, 0));
    }
    status = QMM_OK;

cleanup:
    free(w_hat);
    free(acc);
    return status;
}

/* ───────────────────────────── the f64 dense oracle ───────────────────────────── */

/* ŵ = s·q + b in f64: s·q is exact (a 24-bit significand times a code of at most 8 bits fits in 53
 * bits); the add rounds at most once, at 2^-53 relative. */
static void decode_row_f64(const qmm_qmatrix *matrix, size_t row_index, size_t cols, double *w_hat,
                           double *w_abs) {
    const size_t group_size = (size_t)matrix->group_size;
    const size_t groups = cols / group_size;
    const uint32_t *row = matrix->w + row_index * qmm_packed_words(cols, matrix->bits);
    for (size_t g = 0; g < groups; g++) {
        const double s = qmm_load_f32(matrix->scales, matrix->dtype, row_index * groups + g);
        const double b = qmm_load_f32(matrix->biases, matrix->dtype, row_index * groups + g);
        for (size_t j = g * group_size; j < (g + 1) * group_size; j++) {
            const double sq = s * (double)qmm_code_at(row, j, matrix->bits);
            w_hat[j] = sq + b;
            w_abs[j] = fabs(sq) + fabs(b);
        }
    }
}

qmm_status qmm_ref_dense_f64(const qmm_qmatrix *matrix, const void *x, size_t M, int transpose, double *out_f64,
                             double *abs_dot) {
    size_t N, K;
    qmm_status status = check_product("qmm_ref_dense_f64", matrix, x, M, out_f64, transpose, &N, &K);
    if (status != QMM_OK) return status;

    const qmm_dtype dtype = matrix->dtype;
    const size_t cols = transpose ? K : N;
    double *w_hat = scratch(1, cols, sizeof(double));
    double *w_abs = scratch(1, cols, sizeof(double));
    /* qmm_t: x of a block of rows, lane-interleaved ([K][LANES]), and |x| likewise.
     * qmm_n: one accumulator row of N per row of the block, for the value and for abs_dot. */
    double *x_lanes = NULL, *x_abs = NULL, *acc = NULL, *acc_abs = NULL;
    if (transpose) {
        x_lanes = scratch(ROW_BLOCK, K, sizeof(double));
        x_abs = scratch(ROW_BLOCK, K, sizeof(double));
    } else {
        acc = scratch(ROW_BLOCK, N, sizeof(double));
        acc_abs = scratch(ROW_BLOCK, N, sizeof(double));
    }
    if (!w_hat || !w_abs || (transpose && (!x_lanes || !x_abs)) || (!transpose && (!acc || !acc_abs))) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_ref_dense_f64: no memory for scratch of N=%zu, K=%zu", N, K);
        goto cleanup;
    }

    for (size_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
        const size_t rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;
        if (transpose) {
            /* out[m, n] = Σ_k ŵ[n, k]·x[m, k], k in increasing order. */
            const size_t lane_blocks = (rows + LANES - 1) / LANES;
            memset(x_lanes, 0, ROW_BLOCK * K * sizeof(double));
            memset(x_abs, 0, ROW_BLOCK * K * sizeof(double));
            for (size_t r = 0; r < rows; r++) {
                const size_t base = (r / LANES) * K * LANES + r % LANES;
                for (size_t k = 0; k < K; k++) {
                    const double v = qmm_load_f32(x, dtype, (m0 + r) * K + k);
                    x_lanes[base + k * LANES] = v;
                    x_abs[base + k * LANES] = fabs(v);
                }
            }
            for (size_t n = 0; n < N; n++) {
                decode_row_f64(matrix, n, K, w_hat, w_abs);
                for (size_t block = 0; block < lane_blocks; block++) {
                    const double *xb = x_lanes + block * K * LANES;
                    const double *ab = x_abs + block * K * LANES;
                    double sum[LANES] = {0}, sum_abs[LANES] = {0};
                    for (size_t k = 0; k < K; k++) {
                        for (int lane = 0; lane < LANES; lane++) sum[lane] += w_hat[k] * xb[k * LANES + lane];
                        if (abs_dot)
                            for (int lane = 0; lane < LANES; lane++)
                                sum_abs[lane] += w_abs[k] * ab[k * LANES + lane];
                    }
                    for (int lane = 0; lane < LANES; lane++) {
                        const size_t r = block * LANES + (size_t)lane;
                        if (r >= rows) continue;
                        out_f64[(m0 + r) * N + n] = sum[lane];
                        if (abs_dot) abs_dot[(m0 + r) * N + n] = sum_abs[lane];
                    }
                }
            }
        } else {
            /* out[m, n] = Σ_k x[m, k]·ŵ[k, n], k in increasing order. */
            memset(acc, 0, ROW_BLOCK * N * sizeof(double));
            memset(acc_abs, 0, ROW_BLOCK * N * sizeof(double));
            for (size_t k = 0; k < K; k++) {
                decode_row_f64(matrix, k, N, w_hat, w_abs);
                for (size_t r = 0; r < rows; r++) {
                    const double xv = qmm_load_f32(x, dtype, (m0 + r) * K + k);
                    double *acc_row = acc + r * N;
                    for (size_t n = 0; n < N; n++) acc_row[n] += xv * w_hat[n];
                    if (abs_dot) {
                        const double xa = fabs(xv);
                        double *abs_row = acc_abs + r * N;
                        for (size_t n = 0; n < N; n++) abs_row[n] += xa * w_abs[n];
                    }
                }
            }
            for (size_t r = 0; r < rows; r++) {
                memcpy(out_f64 + (m0 + r) * N, acc + r * N, N * sizeof(double));
                if (abs_dot) memcpy(abs_dot + (m0 + r) * N, acc_abs + r * N, N * sizeof(double));
            }
        }
    }
    status = QMM_OK;

cleanup:
    free(w_hat);
    free(w_abs);
    free(x_lanes);
    free(x_abs);
    free(acc);
    free(acc_abs);
    return status;
}

/* ───────────────────────────── the error bound ───────────────────────────── */

/*
 * bound = slack·( (1 + u_out)·( γ(K + 2)·abs_dot + (1 + γ(K + 2))·K·2^-149 ) + u_out·|exact| + tiny_out ),
 * γ(n) = n·u/(1 − n·u), u = 2^-24 (f32 accumulation). Why K + 2: each product term passes through at
 * most K + 2 f32 roundings before the final narrowing (split form: G for Σq·x, one each for s·Q and the
 * add, K/G − 1 for the sum over groups, and G + K/G + 1 ≤ K + 2 for K = G·groups; qmm_n: s·q, +b, ·x,
 * then K − 1 adds). Why K·2^-149: an f32 multiplication whose result is subnormal loses up to 2^-150
 * absolute beyond its relative rounding (additions of f32 values are exact when subnormal), and an
 * output takes at most 2K multiplications (split: K of q·x and 2 per group; direct: s·q and ŵ·x per k);
 * those losses then pass through at most K + 2 more roundings. The last rounding to out_dtype adds
 * u_out·|acc| ≤ u_out·(|exact| + error) plus half a subnormal step. Derivation: docs/kernels.md §6.
 * Returns NaN for a non-float out_dtype, a slack that is not finite and > 0, a non-finite exact or
 * abs_dot, or K so large that (K + 2)·u ≥ 1, so that every comparison against it fails loudly.
 */
double qmm_error_bound(size_t K, qmm_dtype out_dtype, double exact, double abs_dot, double slack) {
    const double u32 = 0x1.0p-24;
    double u_out, tiny_out;
    switch (out_dtype) {
    case QMM_F32: u_out = 0x1.0p-24; tiny_out = 0x1.0p-149; break;
    case QMM_F16: u_out = 0x1.0p-11; tiny_out = 0x1.0p-24; break;
    case QMM_BF16: u_out = 0x1.0p-8; tiny_out = 0x1.0p-133; break;
    default: return NAN;
    }
    if (!(slack > 0.0 && slack < INFINITY)) return NAN;
    if (!isfinite(exact) || !isfinite(abs_dot)) return NAN;
    const double n = (double)K + 2.0;
    if (n * u32 >= 1.0) return NAN;
    const double gamma = n * u32 / (1.0 - n * u32);
    const double underflow = (double)K * 0x1.0p-149; /* 2K multiplications × 2^-150 each */
    return slack * ((1.0 + u_out) * (gamma * fabs(abs_dot) + (1.0 + gamma) * underflow) + u_out * fabs(exact) +
                    tiny_out);
}

/* ───────────────────────────── the verdict on one output ───────────────────────────── */

/* The overflow threshold of a float dtype: the largest finite value plus half its ulp. Round to nearest
 * even sends |v| ≥ threshold to ±inf (at the threshold itself the tie goes to the even neighbour, which
 * is 2^(emax+1), i.e. inf, because the largest finite value has an odd last significand bit). */
static double overflow_threshold(qmm_dtype dtype) {
    switch (dtype) {
    case QMM_F32: return 0x1.ffffffp127; /* (2 − 2^-23)·2^127 + 2^103 */
    case QMM_F16: return 65520.0;        /* 65504 + 16 */
    case QMM_BF16: return 0x1.ffp127;    /* (2 − 2^-7)·2^127 + 2^119 */
    default: return NAN;
    }
}

/*
 * An output is right when
 *   - exact is not finite (an input was ±inf or NaN): got is the same value (NaN for NaN, the same inf);
 *   - got is finite: |got − exact| ≤ bound (qmm_error_bound);
 *   - got is ±inf: exact has the same sign and |exact| + bound ≥ the overflow threshold, i.e. correct
 *     rounding of exact itself gives ±inf (|exact| ≥ threshold), or of a value within the bound of it
 *     (an accumulator the bound allows may lie beyond the threshold).
 * *ratio receives error/bound for a finite got, (threshold − |exact|)/bound (at least 0) for an
 * infinite one of the right sign, 0 for a matched non-finite exact, and +inf for every other miss
 * (a NaN output, a NaN bound, an infinity of the wrong sign).
 */
int qmm_output_check(size_t K, qmm_dtype out_dtype, double got, double exact, double abs_dot, double slack,
                     double *ratio) {
    double r = INFINITY;
    int ok = 0;
    if (!isfinite(exact)) {
        ok = isnan(exact) ? isnan(got) : got == exact;
        r = ok ? 0.0 : INFINITY;
    } else {
        double bound = qmm_error_bound(K, out_dtype, exact, abs_dot, slack);
        if (isnan(bound) || isnan(got)) {
            r = INFINITY;
        } else if (isinf(got)) {
            if ((got > 0) == (exact > 0) && exact != 0.0) {
                double gap = overflow_threshold(out_dtype) - fabs(exact);
                r = gap > 0.0 ? gap / bound : 0.0;
                ok = r <= 1.0;
            }
        } else {
            r = fabs(got - exact) / bound;
            ok = fabs(got - exact) <= bound;
        }
    }
    if (ratio) *ratio = r;
    return ok;
}
