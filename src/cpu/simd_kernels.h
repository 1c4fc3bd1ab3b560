/*
 * simd_kernels.h — the CPU kernels' algorithms, written once (cpu.h, docs/kernels.md "CPU kernels").
 *
 * Included by avx2.c and avx512.c after they define, for their register width:
 *   LANES             f32 lanes per vector (8 or 16)
 *   vf                the f32 vector type
 *   v_zero v_load v_store v_set1 v_fma(a,b,c)=a·b+c (one rounding) v_add v_hsum (a log2(LANES)-deep tree)
 *   v_load_dtype(array, dtype, i)     LANES elements i… of an f32/f16/bf16 array as f32 (exact)
 *   v_decode4(bytes, &lo, &hi)        2·LANES 4-bit codes from LANES bytes: lane i of lo = code 2i,
 *                                     lane i of hi = code 2i+1 (one byte holds two codes)
 *   v_decode8(bytes)                  LANES 8-bit codes from LANES bytes, in order
 *   v_deinterleave(src, &even, &odd)  2·LANES floats → the even-indexed ones and the odd-indexed ones
 *   QMM_ISA(name)                     name with the ISA suffix (entry points are per ISA)
 *   GEMV_R_MAX, GEMV_RW               rows of x per pass, and rows of x × weight rows in registers
 *   GEMM_R                            broadcast rows of the tiled micro-kernel (see there)
 * Everything here is static except the entry points, so the two inclusions never collide.
 *
 * Decode order. 4-bit codes are unpacked a byte per lane (zero-extend), then the low nibble gives
 * the even codes and the high nibble the odd ones: 3 instructions for 2·LANES codes and no shuffle.
 * The codes then sit in "deinterleaved" order inside each block of 2·LANES. The other operand is
 * brought into the same order once per call (x for qmm_t, by v_deinterleave), so every dot product
 * pairs the right code with the right x; only the summation order changes. 8-bit codes are in order.
 * 2, 3, 5 and 6-bit codes are unpacked with the scalar bit-stream helper into bytes, which are then
 * exactly an 8-bit packed row, and take the 8-bit path.
 */
#ifndef LANES
#error "define the vector vocabulary (avx2.c, avx512.c) before including simd_kernels.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The decode path of a format: 4 and 8 read the packed words directly; any other width is first
 * unpacked to bytes (8). */
static int fast_bits(int bits) { return bits == 4 ? 4 : 8; }

/* Row m of x as f32 in the decode order of `fast` (see the top): dst[K]. */
static void convert_x_row(const qmm_call *call, size_t m, int fast, float *dst) {
    const size_t K = call->K;
    if (fast == 4) {
        for (size_t k = 0; k < K; k += 2 * LANES) { /* K is a multiple of 32 ≥ 2·LANES */
            vf even, odd, pair[2];
            pair[0] = v_load_dtype(call->x, call->dtype, m * K + k);
            pair[1] = v_load_dtype(call->x, call->dtype, m * K + k + LANES);
            v_deinterleave(pair, &even, &odd);
            v_store(dst + k, even);
            v_store(dst + k + LANES, odd);
        }
    } else {
        for (size_t k = 0; k < K; k += LANES) v_store(dst + k, v_load_dtype(call->x, call->dtype, m * K + k));
    }
}

/* ═════════════════════════════ GEMV: qmm_t for small M ═════════════════════════════
 *
 * out[m, n] = Σ_g ( s_g·Σ_{k∈g} q_k·x_k + b_g·Σ_{k∈g} x_k ), the seed's split, vectorised along K.
 * Memory: decode is bound by reading W (N·K·bits/8 bytes, larger than the LLC for real layers), so
 * every weight byte is loaded once per call: a block of up to GEMV_RW weight rows is decoded in
 * registers and multiplied with up to GEMV_R_MAX rows of x (from L1/L2) before the next block; for
 * M > GEMV_R_MAX the passes over x reuse the block from L1. Registers (per weight row w, x row r):
 * qdot[r][w] — LANES partial sums of q·x inside the current group — and acc[r][w], into which each
 * group folds as acc = fma(s, qdot, acc). Several independent weight rows (GEMV_RW / R) keep the FMA
 * pipes busy when R is small (a single row would wait on its own FMA latency every group).
 * The bias part b·Σx does not depend on the codes: Σx per (row of x, group) is computed once per
 * call (xsum) and b·xsum is a vector dot product over the groups.
 * Roundings per term (docs/kernels.md §2, need ≤ K + 2): s·q·x: G/LANES in qdot, 1 in the fused
 * fold, groups − 1 along acc, 1 adding the bias vector, log2(LANES) in the tree sum, 1 adding the
 * bias tail — at most 9 + groups for G = 32; b·x: Σx in a tree (≤ log2(G/LANES) + log2(LANES) ≤ 7),
 * 1 fused into the bias dot, groups/LANES along it, 1 + log2(LANES) + 1 → ≤ 14 + groups/LANES.
 * Both stay ≤ K + 2 for every K ≥ 32, so the row's slack is 1.
 * Non-finite: a sum that became inf or NaN stays so, hence a finite output means every group's split
 * was finite; an output that is not finite is recomputed by qmm_cpu_qmm_t_output (scalar, the
 * per-group direct-form rule of the oracle).
 */

typedef struct gemv_plan {
    const qmm_call *call;
    size_t K, group_size, groups;
    size_t words;       /* packed words per weight row */
    int fast;           /* decode path: 4 or 8 */
    const float *xp;    /* [Mpad][K] x in decode order */
    const float *xsum;  /* [Mpad][groups] Σx per group */
    uint8_t *unpacked;  /* generic widths: [threads][GEMV_RW][K] codes as bytes; else NULL */
} gemv_plan;

/* R rows of x (from m0) times NW weight rows (from n0), decoded from rows[w]; result[r·NW + w]. */
ALWAYS_INLINE void gemv_block(const gemv_plan *p, const uint8_t *const *rows, size_t n0, size_t m0, const int R,
                              const int NW, const int fast, float *result) {
    const qmm_call *call = p->call;
    const size_t K = p->K, G = p->group_size, groups = p->groups;
    const float *x0 = p->xp + m0 * K;
    vf acc[GEMV_R_MAX][GEMV_RW];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) acc[r][w] = v_zero();
    for (size_t g = 0; g < groups; g++) {
        vf qdot[GEMV_R_MAX][GEMV_RW];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int w = 0; w < NW; w++) qdot[r][w] = v_zero();
        const size_t k_end = (g + 1) * G;
        if (fast == 4) {
            for (size_t k = g * G; k < k_end; k += 2 * LANES) {
#pragma GCC unroll 8
                for (int w = 0; w < NW; w++) {
                    vf lo, hi;
                    v_decode4(rows[w] + k / 2, &lo, &hi);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        qdot[r][w] = v_fma(lo, v_load(x0 + (size_t)r * K + k), qdot[r][w]);
                        qdot[r][w] = v_fma(hi, v_load(x0 + (size_t)r * K + k + LANES), qdot[r][w]);
                    }
                }
            }
        } else {
            for (size_t k = g * G; k < k_end; k += LANES) {
#pragma GCC unroll 8
                for (int w = 0; w < NW; w++) {
                    const vf q = v_decode8(rows[w] + k);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) qdot[r][w] = v_fma(q, v_load(x0 + (size_t)r * K + k), qdot[r][w]);
                }
            }
        }
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            const vf s = v_set1(qmm_load_f32(call->scales, call->dtype, (n0 + (size_t)w) * groups + g));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][w] = v_fma(s, qdot[r][w], acc[r][w]);
        }
    }
    /* b·Σx: LANES groups at a time, the remainder scalar. */
    for (int w = 0; w < NW; w++) {
        const size_t base = (n0 + (size_t)w) * groups;
        size_t g = 0;
        for (; g + LANES <= groups; g += LANES) {
            const vf b = v_load_dtype(call->biases, call->dtype, base + g);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][w] = v_fma(b, v_load(p->xsum + (m0 + (size_t)r) * groups + g), acc[r][w]);
        }
        float tail[GEMV_R_MAX] = {0};
        for (; g < groups; g++) {
            const float b = qmm_load_f32(call->biases, call->dtype, base + g);
            for (int r = 0; r < R; r++) tail[r] += b * p->xsum[(m0 + (size_t)r) * groups + g];
        }
        for (int r = 0; r < R; r++) result[r * NW + w] = v_hsum(acc[r][w]) + tail[r];
    }
}

#define GEMV_CASE(r, nw)                                                                                      \
    if (R == (r) && NW == (nw)) {                                                                             \
        if (p->fast == 4) gemv_block(p, rows, n0, m0, r, nw, 4, result);                                      \
        else gemv_block(p, rows, n0, m0, r, nw, 8, result);                                                   \
        return;                                                                                               \
    }

static void gemv_dispatch(const gemv_plan *p, const uint8_t *const *rows, size_t n0, size_t m0, int R, int NW,
                          float *result) {
    GEMV_CASE(1, GEMV_RW)
    GEMV_CASE(1, 1)
    GEMV_CASE(2, GEMV_RW / 2)
    GEMV_CASE(2, 1)
    GEMV_CASE(4, GEMV_RW / 4)
    GEMV_CASE(4, 1)
#if GEMV_R_MAX >= 8
    GEMV_CASE(8, GEMV_RW / 8)
    GEMV_CASE(8, 1)
#endif
}

/* Rows of x in the pass that starts with `remaining` rows left: all of them up to GEMV_R_MAX, rounded
 * up to a power of two (the padding rows of xp are zero and their results are dropped). */
static int gemv_pass_rows(size_t remaining) {
    int R = 1;
    while (R < GEMV_R_MAX && (size_t)R < remaining) R *= 2;
    return R;
}

static void gemv_store(const gemv_plan *p, size_t n0, size_t m0, int R, int NW, const float *result) {
    const qmm_call *call = p->call;
    for (int r = 0; r < R && m0 + (size_t)r < call->M; r++)
        for (int w = 0; w < NW; w++) {
            const size_t m = m0 + (size_t)r, n = n0 + (size_t)w;
            float value = result[r * NW + w];
            if (!isfinite(value)) value = qmm_cpu_qmm_t_output(call, m, n);
            qmm_store_f32(call->out, call->dtype, m * call->N + n, value);
        }
}

qmm_status QMM_ISA(qmm_cpu_gemv_qmm_t)(const qmm_call *call) {
    const size_t M = call->M, N = call->N, K = call->K;
    const int threads = qmm_cpu_threads(call);
    gemv_plan plan = {.call = call, .K = K, .group_size = (size_t)call->group_size,
                      .groups = K / (size_t)call->group_size, .words = qmm_packed_words(K, call->bits),
                      .fast = fast_bits(call->bits)};
    const size_t Mpad = (M + GEMV_R_MAX - 1) / GEMV_R_MAX * GEMV_R_MAX;
    qmm_status status = QMM_OK;
    float *xp = qmm_cpu_scratch(Mpad * K, sizeof(float), "x in decode order");
    float *xsum = qmm_cpu_scratch(Mpad * plan.groups, sizeof(float), "x group sums");
    uint8_t *unpacked = NULL;
    if (!xp || !xsum) {
        status = QMM_ERR_OUT_OF_MEMORY; /* message set by qmm_cpu_scratch */
        goto cleanup;
    }
    if (call->bits != 4 && call->bits != 8 &&
        !(unpacked = qmm_cpu_scratch((size_t)threads * GEMV_RW * K, 1, "unpacked codes"))) {
        status = QMM_ERR_OUT_OF_MEMORY;
        goto cleanup;
    }
    plan.xp = xp;
    plan.xsum = xsum;
    plan.unpacked = unpacked;
    memset(xp + M * K, 0, (Mpad - M) * K * sizeof(float));
    memset(xsum + M * plan.groups, 0, (Mpad - M) * plan.groups * sizeof(float));
    for (size_t m = 0; m < M; m++) {
        convert_x_row(call, m, plan.fast, xp + m * K);
        /* Σx per group from the converted row: the order inside a group does not change Σx's
         * error bound (LANES-wide partial sums, then the tree of v_hsum). */
        for (size_t g = 0; g < plan.groups; g++) {
            vf sum = v_zero();
            for (size_t k = g * plan.group_size; k < (g + 1) * plan.group_size; k += LANES)
                sum = v_add(sum, v_load(xp + m * K + k));
            xsum[m * plan.groups + g] = v_hsum(sum);
        }
    }

    const size_t blocks = (N + GEMV_RW - 1) / GEMV_RW;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && blocks > 1)
    for (size_t block = 0; block < blocks; block++) {
        const size_t n_begin = block * GEMV_RW, n_end = n_begin + GEMV_RW < N ? n_begin + GEMV_RW : N;
        const uint8_t *rows[GEMV_RW];
        for (size_t n = n_begin; n < n_end; n++) {
            const uint32_t *packed = call->w + n * plan.words;
            if (plan.unpacked) {
                uint8_t *codes = plan.unpacked + ((size_t)QMM_CPU_THREAD_ID() * GEMV_RW + (n - n_begin)) * K;
                qmm_unpack_stream(packed, K, call->bits, codes);
                rows[n - n_begin] = codes;
            } else {
                rows[n - n_begin] = (const uint8_t *)packed;
            }
        }
        float result[GEMV_R_MAX * GEMV_RW];
        for (size_t m0 = 0; m0 < M; m0 += GEMV_R_MAX) {
            const int R = gemv_pass_rows(M - m0), NW = GEMV_RW / R;
            size_t n = n_begin;
            for (; n + (size_t)NW <= n_end; n += (size_t)NW) {
                gemv_dispatch(&plan, rows + (n - n_begin), n, m0, R, NW, result);
                gemv_store(&plan, n, m0, R, NW, result);
            }
            for (; n < n_end; n++) {
                gemv_dispatch(&plan, rows + (n - n_begin), n, m0, R, 1, result);
                gemv_store(&plan, n, m0, R, 1, result);
            }
        }
    }

cleanup:
    free(xp);
    free(xsum);
    free(unpacked);
    return status;
}
