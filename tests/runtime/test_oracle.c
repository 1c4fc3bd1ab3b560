/*
 * test_oracle.c — the reference products and the error bound (src/ref/oracle.c).
 *
 *   - qmm_error_bound on hand-computed cases (values worked out with exact fractions, see comments)
 *   - the oracle's exact answers on hand-built matrices (including a 3-bit code straddling two words)
 *   - qmm_ref_qmm_t / qmm_ref_qmm_n against qmm_ref_dense_f64 on fresh random cases, every format
 *   - qmm_ref_qmm_t against a naive split loop written here (same order: equal on targets that do not
 *     contract a·b + c into an FMA, within the bound everywhere)
 *   - every bad input of the oracle entry points, with its exact status and a message
 */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int all_bits[] = {2, 3, 4, 5, 6, 8};
static const int all_group_sizes[] = {32, 64, 128};
static const qmm_dtype all_dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};

static bool close_relative(double got, double want, double tolerance) {
    return fabs(got - want) <= tolerance * fabs(want);
}

static void test_error_bound(void) {
    /* bound = slack·((1 + u_out)·(γ(K+2)·abs_dot + (1 + γ(K+2))·K·2^-149) + u_out·|exact| + tiny),
     * γ(n) = n·2^-24/(1 − n·2^-24). The underflow term K·2^-149 is below 1e-38 here, so the values
     * below (to 1e-13) are those of the first three terms.
     * K=62, f32, exact 2, abs_dot 4: γ(64) = 2^-18/(1 − 2^-18) = 3.81471...e-6;
     * (1 + 2^-24)·4·γ + 2·2^-24 + 2^-149 = 1.5378057469...e-5. */
    double b = qmm_error_bound(62, QMM_F32, 2.0, 4.0, 1.0);
    CHECK(close_relative(b, 1.537805746943191e-05, 1e-13), "bound(K=62, f32) = %.17g", b);
    /* K=30, f16, exact −3, abs_dot 10: γ(32) = 2^-19/(1 − 2^-19);
     * (1 + 2^-11)·10·γ + 3·2^-11 + 2^-24 = 1.4839861905...e-3 (the u_out·|exact| term dominates). */
    b = qmm_error_bound(30, QMM_F16, -3.0, 10.0, 1.0);
    CHECK(close_relative(b, 0.0014839861905962676, 1e-13), "bound(K=30, f16) = %.17g", b);
    /* K=126, bf16, exact 100, abs_dot 1000: γ(128) = 2^-17/(1 − 2^-17);
     * (1 + 2^-8)·1000·γ + 100·2^-8 + 2^-133 = 0.39828425528... */
    b = qmm_error_bound(126, QMM_BF16, 100.0, 1000.0, 1.0);
    CHECK(close_relative(b, 0.3982842552891181, 1e-13), "bound(K=126, bf16) = %.17g", b);
    /* A zero product leaves the smallest bf16 subnormal 2^-133 = 64·2^-139 plus the underflow term
     * (1 + 2^-8)·(1 + γ(5122))·5120·2^-149 = 5.0210641557...·2^-139 (exact fractions). */
    b = qmm_error_bound(5120, QMM_BF16, 0.0, 0.0, 1.0);
    CHECK(close_relative(b, 69.02106415573392 * 0x1.0p-139, 1e-13), "bound(exact 0, abs_dot 0, bf16) = %.17g", b);
    /* Slack multiplies everything: K=5120, f16, exact 0.5, abs_dot 20, slack 2 = 0.012709894034... */
    b = qmm_error_bound(5120, QMM_F16, 0.5, 20.0, 2.0);
    CHECK(close_relative(b, 0.012709894034420957, 1e-13), "bound(K=5120, f16, slack 2) = %.17g", b);
    CHECK(qmm_error_bound(64, QMM_F32, -7.0, 9.0, 3.0) == 3.0 * qmm_error_bound(64, QMM_F32, 7.0, 9.0, 1.0),
          "slack must scale the whole bound and the sign of exact must not matter");
    /* Refusals are NaN, so that every comparison against them fails. */
    CHECK(isnan(qmm_error_bound(64, QMM_U8, 1.0, 1.0, 1.0)), "bound for u8 must be NaN");
    CHECK(isnan(qmm_error_bound(64, QMM_F32, 1.0, 1.0, 0.0)), "bound with slack 0 must be NaN");
    CHECK(isnan(qmm_error_bound(64, QMM_F32, 1.0, 1.0, NAN)), "bound with slack NaN must be NaN");
    CHECK(isnan(qmm_error_bound(64, QMM_F32, 1.0, 1.0, INFINITY)), "bound with slack +inf must be NaN");
    CHECK(isnan(qmm_error_bound(64, QMM_F32, 1.0, 1.0, -1.0)), "bound with slack -1 must be NaN");
    CHECK(isnan(qmm_error_bound(64, QMM_F32, INFINITY, 1.0, 1.0)), "bound with exact +inf must be NaN");
    CHECK(isnan(qmm_error_bound(64, QMM_F32, NAN, 1.0, 1.0)), "bound with exact NaN must be NaN");
    CHECK(isnan(qmm_error_bound(64, QMM_F32, 1.0, INFINITY, 1.0)), "bound with abs_dot +inf must be NaN");
    /* (K + 2)·2^-24 ≥ 1 from K = 2^24 − 2 on (the header and the code say the same threshold). */
    CHECK(isnan(qmm_error_bound(((size_t)1 << 24) - 2, QMM_F32, 1.0, 1.0, 1.0)), "bound with (K+2)·u = 1 must be NaN");
    CHECK(isnan(qmm_error_bound((size_t)1 << 24, QMM_F32, 1.0, 1.0, 1.0)), "bound with K·u = 1 must be NaN");
    b = qmm_error_bound(((size_t)1 << 24) - 3, QMM_F32, 1.0, 1.0, 1.0);
    CHECK(isfinite(b) && b > 1.0, "bound with (K+2)·u = 1 − 2^-24 = %g, want finite and large (γ = 2^24 − 1)", b);
    CHECK(qmm_error_bound(64, QMM_F16, 1.0, 1.0, 1.0) > qmm_error_bound(64, QMM_F32, 1.0, 1.0, 1.0),
          "an f16 output must get a looser bound than an f32 output");
}

/* Exact answers: every value below is a small dyadic number, so every f32 operation is exact and
 * the oracle must hit the value on the nose. */
static void test_exact_cases(void) {
    /* qmm_t, 1×2 out, K = 32, 4-bit gs32: row 0 all codes 1 (s 0.5, b 0.25), row 1 codes j % 16
     * (s −0.125, b 1); x = 1 everywhere. out[0] = 32·0.75 = 24; out[1] = −0.125·2·120 + 32 = 2. */
    uint8_t codes[64];
    for (int j = 0; j < 32; j++) codes[j] = 1, codes[32 + j] = (uint8_t)(j % 16);
    uint32_t w[8];
    CHECK_OK(qmm_pack(codes, 2, 32, 4, w));
    float scales[2] = {0.5f, -0.125f}, biases[2] = {0.25f, 1.0f}, x[32], out[2] = {NAN, NAN};
    for (int k = 0; k < 32; k++) x[k] = 1.0f;
    qmm_qmatrix m = {w, scales, biases, QMM_F32, 2, 32, 4, 32};
    CHECK_OK(qmm_ref_qmm_t(&m, x, 1, out));
    CHECK(out[0] == 24.0f && out[1] == 2.0f, "qmm_t exact case: got %g, %g; want 24, 2", out[0], out[1]);
    double exact[2], abs_dot[2];
    CHECK_OK(qmm_ref_dense_f64(&m, x, 1, 1, exact, abs_dot));
    CHECK(exact[0] == 24.0 && exact[1] == 2.0, "dense f64 qmm_t: got %g, %g", exact[0], exact[1]);
    /* abs_dot[1] = Σ (|−0.125·q| + 1) = 0.125·240 + 32 = 62. */
    CHECK(abs_dot[0] == 24.0 && abs_dot[1] == 62.0, "abs_dot: got %g, %g; want 24, 62", abs_dot[0], abs_dot[1]);

    /* qmm_n with the same weights as K = 2 rows × N = 32 cols: out[n] = x0·ŵ[0, n] + x1·ŵ[1, n]
     * with x = (2, −1): out[n] = 2·0.75 − (−0.125·(n % 16) + 1) = 0.5 + 0.125·(n % 16). */
    float xn[2] = {2.0f, -1.0f}, outn[32];
    for (int n = 0; n < 32; n++) outn[n] = NAN;
    CHECK_OK(qmm_ref_qmm_n(&m, xn, 1, outn));
    int wrong = 0;
    for (int n = 0; n < 32; n++) wrong += outn[n] != 0.5f + 0.125f * (float)(n % 16);
    CHECK(wrong == 0, "qmm_n exact case: %d of 32 outputs wrong (out[1] = %g, want 0.625)", wrong, outn[1]);

    /* A 3-bit code straddling two words: code 10 of a row occupies stream bits [30, 33), i.e. bits
     * 30–31 of word 0 and bit 0 of word 1. Put code 5 (0b101) there and zero elsewhere, s = 1, b = 0:
     * x = e_10 gives exactly 5, any other unit vector gives 0. */
    uint8_t codes3[32] = {0};
    codes3[10] = 5;
    uint32_t w3[3];
    CHECK_OK(qmm_pack(codes3, 1, 32, 3, w3));
    CHECK(w3[0] == (1u << 30) && w3[1] == 1u, "3-bit straddle packing: words %08x %08x", w3[0], w3[1]);
    float one = 1.0f, zero = 0.0f, x3[2 * 32] = {0}, out3[2];
    x3[10] = 1.0f;      /* row 0 of x: e_10 */
    x3[32 + 11] = 1.0f; /* row 1 of x: e_11 */
    qmm_qmatrix m3 = {w3, &one, &zero, QMM_F32, 1, 32, 3, 32};
    CHECK_OK(qmm_ref_qmm_t(&m3, x3, 2, out3));
    CHECK(out3[0] == 5.0f && out3[1] == 0.0f, "3-bit straddle product: got %g, %g; want 5, 0", out3[0], out3[1]);
}

/* ── The non-finite rule (docs/kernels.md §2): an output whose f32 accumulator is ±inf or NaN is
 * recomputed in f64 in the direct form, so the oracle agrees with qmm_ref_dense_f64 wherever the split
 * would subtract infinite or overflowed partial sums. */

/* A 4-bit gs32 f32 matrix of rows × cols with every code q, every scale s and every bias b. */
typedef struct constant_matrix {
    qmm_qmatrix m;
    uint32_t w[96 * 32 / 8];          /* the largest: qmm_n with K = 96 rows of N = 32 codes */
    float scales[96], biases[96];
} constant_matrix;

static void constant_matrix_make(constant_matrix *c, size_t rows, size_t cols, uint32_t q, float s, float b) {
    uint32_t word = 0;
    for (int j = 0; j < 8; j++) word |= q << (4 * j);
    for (size_t i = 0; i < rows * cols / 8; i++) c->w[i] = word;
    for (size_t i = 0; i < rows * cols / 32; i++) c->scales[i] = s, c->biases[i] = b;
    c->m = (qmm_qmatrix){c->w, c->scales, c->biases, QMM_F32, rows, cols, 4, 32};
}

static bool same_value(float got, float want) { return isnan(want) ? isnan(got) : got == want; }

/* qmm_t of a 2×K matrix (both rows alike) and qmm_n of the K×32 one, on one row of x; every output
 * must be `want`, and want must be what qmm_ref_dense_f64 gives rounded to f32. */
static void check_non_finite_case(const char *what, size_t K, uint32_t q, float s, float b, const float *x,
                                  float want) {
    constant_matrix c;
    float out[32];
    double exact[32];
    for (int transpose = 1; transpose >= 0; transpose--) {
        const size_t N = transpose ? 2 : 32;
        constant_matrix_make(&c, transpose ? N : K, transpose ? K : N, q, s, b);
        for (size_t n = 0; n < N; n++) out[n] = 12345.0f;
        CHECK_OK(transpose ? qmm_ref_qmm_t(&c.m, x, 1, out) : qmm_ref_qmm_n(&c.m, x, 1, out));
        CHECK_OK(qmm_ref_dense_f64(&c.m, x, 1, transpose, exact, NULL));
        for (size_t n = 0; n < N; n++) {
            CHECK(same_value(out[n], want), "%s, %s: out[%zu] = %g, want %g", what, transpose ? "qmm_t" : "qmm_n", n,
                  out[n], want);
            CHECK(same_value((float)exact[n], want), "%s, dense f64: out[%zu] = %g, want %g", what, n, exact[n], want);
        }
    }
}

static void test_non_finite(void) {
    float x[96] = {0};
    /* Issue 5: every ŵ = 0.5 (q = 1, s = 1, b = −0.5), x[0] = +inf. The split gave inf − inf = NaN. */
    x[0] = INFINITY;
    check_non_finite_case("x[0] = +inf, ŵ = 0.5", 32, 1, 1.0f, -0.5f, x, INFINITY);
    x[0] = -INFINITY;
    check_non_finite_case("x[0] = -inf, ŵ = 0.5", 32, 1, 1.0f, -0.5f, x, -INFINITY);
    /* A negative ŵ flips the infinity: ŵ = −0.5 (q = 1, s = −1, b = 0.5). */
    check_non_finite_case("x[0] = -inf, ŵ = -0.5", 32, 1, -1.0f, 0.5f, x, INFINITY);
    /* +inf and −inf in one product: inf − inf is NaN in the exact product too. */
    x[0] = INFINITY, x[1] = -INFINITY;
    check_non_finite_case("x = [+inf, -inf, 0, ...]", 32, 1, 1.0f, -0.5f, x, NAN);
    /* +inf in two groups, one group each: acc = inf + inf stays +inf. */
    x[1] = 0.0f, x[32] = INFINITY;
    check_non_finite_case("x[0] = x[32] = +inf", 64, 1, 1.0f, -0.5f, x, INFINITY);
    /* ŵ = 0 times +inf is NaN (IEEE 0·inf), as in the f64 oracle. */
    x[32] = 0.0f;
    check_non_finite_case("x[0] = +inf, ŵ = 0", 32, 1, 1.0f, -1.0f, x, NAN);
    /* NaN input stays NaN, whatever the weights. */
    x[0] = NAN;
    check_non_finite_case("x[0] = NaN", 32, 1, 1.0f, -0.5f, x, NAN);
    x[0] = 0.0f;

    /* Issue 5: x = [2e38, 2e38, 0, ...] with ŵ = 0 (q = 1, s = 1, b = −1): Σq·x and Σx overflow to inf,
     * the split gave NaN; the product is exactly 0. */
    x[0] = 2e38f, x[1] = 2e38f;
    check_non_finite_case("x = [2e38, 2e38, 0, ...], ŵ = 0", 32, 1, 1.0f, -1.0f, x, 0.0f);
    /* ŵ = 1: a group's sums overflow (3e38 + 3e38) but the next group brings the product back into
     * range: 3e38 + 3e38 − 3e38 = 3e38 exactly in f64. */
    x[0] = 3e38f, x[1] = 3e38f, x[32] = -3e38f;
    check_non_finite_case("x = [3e38, 3e38 | -3e38], ŵ = 1", 64, 1, 1.0f, 0.0f, x, 3e38f);
    /* Every group finite, the sum over groups overflows: 3e38 | 3e38 | −3e38. */
    x[1] = 0.0f, x[32] = 3e38f, x[64] = -3e38f;
    check_non_finite_case("x = [3e38 | 3e38 | -3e38], ŵ = 1", 96, 1, 1.0f, 0.0f, x, 3e38f);
    /* A product truly beyond f32 (6e38) rounds to +inf. */
    x[1] = 3e38f, x[32] = 0.0f, x[64] = 0.0f;
    check_non_finite_case("x = [3e38, 3e38], ŵ = 1: 6e38", 32, 1, 1.0f, 0.0f, x, INFINITY);
    x[0] = x[1] = 0.0f;
    /* Non-finite weights follow IEEE too: s = +inf, q = 0 gives ŵ = inf·0 + b = NaN; q = 1 gives
     * ŵ = +inf, and with x = 1 everywhere the product is +inf. */
    for (int k = 0; k < 32; k++) x[k] = 1.0f;
    check_non_finite_case("s = +inf, q = 0", 32, 0, INFINITY, 0.5f, x, NAN);
    check_non_finite_case("s = +inf, q = 1, x = 1", 32, 1, INFINITY, 0.5f, x, INFINITY);
    for (int k = 0; k < 32; k++) x[k] = 0.0f;

    /* The rule is per output: in M = 9 rows (past one lane block) only row 8 holds +inf; rows 0–7 keep
     * their f32 split values (equal to the dense ones here: small integers), row 8 is +inf. In f16 too. */
    for (int d = 0; d < 2; d++) {
        const qmm_dtype dtype = d ? QMM_F16 : QMM_F32;
        uint16_t s16 = qmm_f32_to_f16(1.0f), b16 = qmm_f32_to_f16(-0.5f);
        uint32_t w[4];
        for (int i = 0; i < 4; i++) w[i] = 0x11111111u;
        float s32 = 1.0f, b32 = -0.5f, x32[9 * 32], out32[9];
        uint16_t x16[9 * 32], out16[9];
        for (int i = 0; i < 9 * 32; i++) {
            x32[i] = (float)(i % 32 == 0 ? i / 32 : 0);
            x16[i] = qmm_f32_to_f16(x32[i]);
        }
        x32[8 * 32 + 5] = INFINITY;
        x16[8 * 32 + 5] = 0x7C00; /* +inf in f16 */
        qmm_qmatrix m = {w, d ? (void *)&s16 : &s32, d ? (void *)&b16 : &b32, dtype, 1, 32, 4, 32};
        CHECK_OK(qmm_ref_qmm_t(&m, d ? (void *)x16 : x32, 9, d ? (void *)out16 : out32));
        for (int r = 0; r < 9; r++) {
            float got = d ? qmm_f16_to_f32(out16[r]) : out32[r];
            float want = r == 8 ? INFINITY : 0.5f * (float)r;
            CHECK(got == want, "%s, M = 9, row %d: got %g, want %g", qmm_dtype_name(dtype), r, got, want);
        }
    }
}

/* ── Underflow (docs/kernels.md §6): f32 products that land in the subnormal range lose up to 2^-150
 * each; the bound's K·2^-149 term covers them. Issue 5: scales of 3·2^-149 made the oracle exceed the
 * bound without that term 61-fold. */
static void test_underflow(void) {
    const size_t K = 4096;
    const float tiny_scale = 0x3.0p-149f; /* 3·2^-149, a subnormal */
    uint32_t *w = malloc(K * 32 / 8 * sizeof(uint32_t));
    float *scales = malloc(K * sizeof(float)), *biases = malloc(K * sizeof(float));
    float *x = calloc(K, sizeof(float)), out[32];
    double exact[32], abs_dot[32];
    if (!w || !scales || !biases || !x) {
        CHECK(false, "out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < K * 32 / 8; i++) w[i] = 0x11111111u; /* every code 1 */
    for (size_t i = 0; i < K; i++) scales[i] = tiny_scale, biases[i] = 0.0f;

    /* qmm_t, N = 1 row of K = 4096 (128 groups), x = 0.5 at the head of each group, 0 elsewhere:
     * each s·Σqx = 1.5·2^-149 rounds (to even) to 2·2^-149, so the oracle gives 256·2^-149 where the
     * exact product is 192·2^-149. */
    for (size_t k = 0; k < K; k += 32) x[k] = 0.5f;
    qmm_qmatrix mt = {w, scales, biases, QMM_F32, 1, K, 4, 32};
    CHECK_OK(qmm_ref_qmm_t(&mt, x, 1, out));
    CHECK_OK(qmm_ref_dense_f64(&mt, x, 1, 1, exact, abs_dot));
    CHECK(out[0] == 0x100.0p-149f && exact[0] == 0xC0.0p-149, "qmm_t underflow case: got %a, exact %a (want 256, 192 ×2^-149)",
          (double)out[0], exact[0]);
    double bound = qmm_error_bound(K, QMM_F32, exact[0], abs_dot[0], 1.0);
    CHECK(fabs(out[0] - exact[0]) <= bound, "qmm_t underflow: error %a > bound %a", fabs(out[0] - exact[0]), bound);
    CHECK(check_against_oracle("qmm_t underflow", out, QMM_F32, exact, abs_dot, 1, K, 1.0, NULL) == 0,
          "qmm_t underflow outside the bound");

    /* qmm_n, K = 4096 rows of N = 32, every ŵ = 3·2^-149, x = 0.5: each ŵ·x = 1.5·2^-149 rounds to
     * 2·2^-149, 4096 of them lose 2048·2^-149 (half of the bound's K·2^-149 term). */
    for (size_t k = 0; k < K; k++) x[k] = 0.5f;
    qmm_qmatrix mn = {w, scales, biases, QMM_F32, K, 32, 4, 32};
    CHECK_OK(qmm_ref_qmm_n(&mn, x, 1, out));
    CHECK_OK(qmm_ref_dense_f64(&mn, x, 1, 0, exact, abs_dot));
    CHECK(out[0] == 0x2000.0p-149f && exact[0] == 0x1800.0p-149, "qmm_n underflow case: got %a, exact %a (want 8192, 6144 ×2^-149)",
          (double)out[0], exact[0]);
    double worst = 0.0;
    CHECK(check_against_oracle("qmm_n underflow", out, QMM_F32, exact, abs_dot, 32, K, 1.0, &worst) == 0,
          "qmm_n underflow outside the bound");
    CHECK(worst > 0.4 && worst < 0.6, "qmm_n underflow: error/bound %g, want about 0.5 (the term is not loose)", worst);

cleanup:
    free(w);
    free(scales);
    free(biases);
    free(x);
}

/* The seed's split written plainly, one output at a time, as an independent check of the blocked
 * oracle's order. */
static void naive_split(const qmm_qmatrix *m, const float *x, size_t M, float *out) {
    size_t N = m->rows, K = m->cols, gs = (size_t)m->group_size, groups = K / gs;
    size_t words = K * (size_t)m->bits / 32;
    for (size_t i = 0; i < M; i++)
        for (size_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (size_t g = 0; g < groups; g++) {
                float qdot = 0.0f, xsum = 0.0f;
                for (size_t k = g * gs; k < (g + 1) * gs; k++) {
                    qdot += (float)qmm_code_at(m->w + n * words, k, m->bits) * x[i * K + k];
                }
                for (size_t k = g * gs; k < (g + 1) * gs; k++) xsum += x[i * K + k];
                acc += ((const float *)m->scales)[n * groups + g] * qdot +
                       ((const float *)m->biases)[n * groups + g] * xsum;
            }
            out[i * N + n] = acc;
        }
}

static void test_random_against_dense(void) {
    check_rng rng = check_rng_make(11);
    /* M past one lane block (8) and one row block (32) of the oracle; N and K not powers of two. */
    const size_t shapes[][3] = {{1, 1, 1}, {3, 5, 9}, {8, 7, 3}, {9, 17, 2}, {33, 3, 5}, {2, 40, 18}};
    size_t cases = 0, bad_total = 0;
    double worst_seen = 0.0;
    for (size_t d = 0; d < 3; d++)
        for (size_t b = 0; b < 6; b++)
            for (size_t gi = 0; gi < 3; gi++)
                for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                    for (int transpose = 0; transpose <= 1; transpose++) {
                        const qmm_dtype dtype = all_dtypes[d];
                        const int bits = all_bits[b], gs = all_group_sizes[gi];
                        const size_t M = shapes[s][0];
                        /* the quantized dimension is a count of groups, the other one is free */
                        const size_t quantized = shapes[s][2] * (size_t)gs, free_dim = shapes[s][1];
                        const size_t N = transpose ? free_dim : quantized, K = transpose ? quantized : free_dim;
                        check_qmatrix q;
                        if (!check_qmatrix_random(&rng, transpose ? N : K, transpose ? K : N, bits, gs, dtype, &q)) {
                            CHECK(false, "out of memory");
                            return;
                        }
                        const size_t size = qmm_dtype_size(dtype);
                        void *x = malloc(M * K * size), *out = malloc(M * N * size);
                        double *exact = malloc(M * N * sizeof(double)), *abs_dot = malloc(M * N * sizeof(double));
                        check_fill_uniform(&rng, x, dtype, M * K, -1.0f, 1.0f);
                        memset(out, 0xFF, M * N * size); /* NaN in every dtype */
                        qmm_status st = transpose ? qmm_ref_qmm_t(&q.m, x, M, out) : qmm_ref_qmm_n(&q.m, x, M, out);
                        CHECK(st == QMM_OK, "oracle failed: %s", qmm_last_error());
                        CHECK_OK(qmm_ref_dense_f64(&q.m, x, M, transpose, exact, abs_dot));
                        char label[128];
                        snprintf(label, sizeof label, "%s %s %d-bit gs%d M=%zu N=%zu K=%zu",
                                 transpose ? "qmm_t" : "qmm_n", qmm_dtype_name(dtype), bits, gs, M, N, K);
                        double worst;
                        size_t bad = check_against_oracle(label, out, dtype, exact, abs_dot, M * N, K, 1.0, &worst);
                        CHECK(bad == 0, "%s: %zu outputs outside the bound (worst error/bound %.3g)", label, bad, worst);
                        bad_total += bad;
                        if (worst > worst_seen) worst_seen = worst;
                        if (transpose && dtype == QMM_F32) {
                            float *naive = malloc(M * N * sizeof(float));
                            naive_split(&q.m, x, M, naive);
#if defined(__x86_64__) && !defined(__FMA__)
                            /* No FMA contraction on this target: the same order must give the same bits. */
                            CHECK(memcmp(naive, out, M * N * sizeof(float)) == 0,
                                  "%s: the blocked oracle differs from the plain split loop", label);
#endif
                            size_t naive_bad = check_against_oracle("naive split", naive, QMM_F32, exact, abs_dot,
                                                                    M * N, K, 1.0, NULL);
                            CHECK(naive_bad == 0, "%s: the plain split loop is outside the bound", label);
                            free(naive);
                        }
                        cases++;
                        free(x);
                        free(out);
                        free(exact);
                        free(abs_dot);
                        check_qmatrix_free(&q);
                    }
    printf("oracle vs f64 dense: %zu random cases, %zu outputs outside the bound, worst error/bound %.3f\n", cases,
           bad_total, worst_seen);
}

static void test_bad_input(void) {
    check_rng rng = check_rng_make(12);
    check_qmatrix q;
    if (!check_qmatrix_random(&rng, 4, 64, 4, 32, QMM_F32, &q)) {
        CHECK(false, "out of memory");
        return;
    }
    float x[2 * 64] = {0}, out[2 * 64];
    double out64[2 * 64];

    CHECK_STATUS(qmm_ref_qmm_t(NULL, x, 1, out), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_ref_qmm_t(&q.m, NULL, 1, out), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(qmm_last_error(), "qmm_ref_qmm_t: x is NULL") == 0, "message: %s", qmm_last_error());
    CHECK_STATUS(qmm_ref_qmm_n(&q.m, x, 1, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(qmm_last_error(), "qmm_ref_qmm_n: out is NULL") == 0, "message: %s", qmm_last_error());
    CHECK_STATUS(qmm_ref_dense_f64(&q.m, x, 1, 2, out64, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(qmm_last_error(), "qmm_ref_dense_f64: transpose=2 must be 1 (qmm_t) or 0 (qmm_n)") == 0,
          "message: %s", qmm_last_error());

    CHECK_STATUS(qmm_ref_qmm_t(&q.m, x, 0, out), QMM_ERR_SHAPE);
    CHECK(strcmp(qmm_last_error(), "qmm_ref_qmm_t: M=0, a product needs M >= 1 rows of x") == 0, "message: %s",
          qmm_last_error());
    /* M·K overflows size_t: K = 64, M = SIZE_MAX/32. */
    CHECK_STATUS(qmm_ref_qmm_t(&q.m, x, SIZE_MAX / 32, out), QMM_ERR_OVERFLOW);
    CHECK(strstr(qmm_last_error(), "M*K") != NULL, "message names M*K: %s", qmm_last_error());
    /* qmm_n of the same matrix: K = 4, N = 64, so M = SIZE_MAX/16 keeps M·K but not M·N. */
    CHECK_STATUS(qmm_ref_qmm_n(&q.m, x, SIZE_MAX / 16, out), QMM_ERR_OVERFLOW);
    CHECK(strstr(qmm_last_error(), "M*N") != NULL, "message names M*N: %s", qmm_last_error());
    CHECK_STATUS(qmm_ref_dense_f64(&q.m, x, SIZE_MAX / 32, 1, out64, NULL), QMM_ERR_OVERFLOW);
    /* M·K fits in elements but not as f32 bytes (a break-it helper's case: the oracle read past x): K = 64,
     * M = SIZE_MAX/256 + 1 */
    CHECK_STATUS(qmm_ref_qmm_t(&q.m, x, SIZE_MAX / 256 + 1, out), QMM_ERR_OVERFLOW);
    CHECK(strstr(qmm_last_error(), "x's M*K") && strstr(qmm_last_error(), "byte count"), "message names x's bytes: %s",
          qmm_last_error());
    CHECK_STATUS(qmm_ref_dense_f64(&q.m, x, SIZE_MAX / 256 + 1, 1, out64, NULL), QMM_ERR_OVERFLOW);

    /* The matrix itself goes through qmm_qmatrix_validate. */
    qmm_qmatrix bad = q.m;
    bad.bits = 7;
    CHECK_STATUS(qmm_ref_qmm_t(&bad, x, 1, out), QMM_ERR_FORMAT);
    bad = q.m;
    bad.cols = 48;
    CHECK_STATUS(qmm_ref_qmm_n(&bad, x, 1, out), QMM_ERR_SHAPE);
    bad = q.m;
    bad.scales = NULL;
    CHECK_STATUS(qmm_ref_dense_f64(&bad, x, 1, 0, out64, NULL), QMM_ERR_INVALID_ARGUMENT);
    bad = q.m;
    bad.dtype = QMM_U8;
    CHECK_STATUS(qmm_ref_qmm_t(&bad, x, 1, out), QMM_ERR_INVALID_ARGUMENT);
    check_qmatrix_free(&q);
}

/* qmm_output_check, the one verdict (docs/kernels.md §6, "Verdict"): the bound, ±inf where correct rounding of
 * exact to the output dtype overflows (threshold = largest finite + half an ulp), and the non-finite rule. */
static void test_output_check(void) {
    double r;
    int ok;
    /* f16: 65504 is the largest finite value, 65520 the threshold (the tie rounds to inf). */
    ok = qmm_output_check(576, QMM_F16, INFINITY, 65520.0, 65520.0, 1.0, &r);
    CHECK(ok && r == 0.0,
          "f16 exact 65520 (the tie) must be right as +inf, ratio %g", r);
    ok = qmm_output_check(576, QMM_F16, -INFINITY, -1.6e7, 1.7e7, 1.0, &r);
    CHECK(ok && r == 0.0,
          "f16 exact -1.6e7 must be right as -inf, ratio %g", r);
    ok = qmm_output_check(576, QMM_F16, INFINITY, -1.6e7, 1.7e7, 1.0, &r);
    CHECK(!ok && isinf(r),
          "f16 exact -1.6e7 must be wrong as +inf");
    ok = qmm_output_check(64, QMM_F16, INFINITY, 60000.0, 60000.0, 1.0, &r);
    CHECK(!ok && r > 1.0,
          "f16 exact 60000 (rounds to 60000) must be wrong as +inf, ratio %g", r);
    /* Just below the threshold an accumulator within the bound may round to inf: 65519 + bound(~32) ≥ 65520. */
    ok = qmm_output_check(64, QMM_F16, INFINITY, 65519.0, 65519.0, 1.0, &r);
    CHECK(ok && r > 0.0 && r <= 1.0,
          "f16 exact 65519 must be right as +inf (within the bound of the threshold), ratio %g", r);
    ok = qmm_output_check(64, QMM_F16, 65504.0, 65519.0, 65519.0, 1.0, &r);
    CHECK(ok && r <= 1.0,
          "f16 exact 65519 must be right as 65504 (within the bound), ratio %g", r);
    ok = qmm_output_check(64, QMM_F16, 65504.0, 1.0e5, 1.0e5, 1.0, &r);
    CHECK(!ok, "f16 exact 1e5 must be wrong as 65504");
    /* f32: the threshold is 2^128 − 2^103; exact −3.46e38 rounds to −inf. */
    ok = qmm_output_check(576, QMM_F32, -INFINITY, -3.46e38, 9.0e38, 1.0, &r);
    CHECK(ok && r == 0.0,
          "f32 exact -3.46e38 must be right as -inf");
    ok = qmm_output_check(4, QMM_F32, INFINITY, 0x1.ffffffp127, 0x1.ffffffp127, 1.0, &r);
    CHECK(ok, "f32 threshold must be +inf");
    ok = qmm_output_check(4, QMM_F32, INFINITY, 0x1.fffep127, 0x1.fffep127, 1.0, &r);
    CHECK(!ok,
          "f32 exact 2^128 − 2^112 must be wrong as +inf");
    ok = qmm_output_check(4, QMM_BF16, INFINITY, 0x1.ffp127, 0x1.ffp127, 1.0, &r);
    CHECK(ok, "bf16 threshold must be +inf");
    ok = qmm_output_check(4, QMM_BF16, INFINITY, 0x1.fcp127, 0x1.fcp127, 1.0, &r);
    CHECK(!ok,
          "bf16 exact below its threshold by more than the bound must be wrong as +inf");
    /* Finite values: the bound; NaN output: wrong; non-finite exact: the same value. */
    double b = qmm_error_bound(62, QMM_F32, 2.0, 4.0, 1.0);
    ok = qmm_output_check(62, QMM_F32, 2.0 + 0.5 * b, 2.0, 4.0, 1.0, &r);
    CHECK(ok && r <= 1.0, "error = bound/2 must be right");
    ok = qmm_output_check(62, QMM_F32, 2.0 + 2 * b, 2.0, 4.0, 1.0, &r);
    CHECK(!ok && r > 1.9, "error = 2·bound must be wrong");
    ok = qmm_output_check(62, QMM_F32, NAN, 2.0, 4.0, 1.0, &r);
    CHECK(!ok && isinf(r), "NaN for a finite exact must be wrong");
    ok = qmm_output_check(62, QMM_F32, NAN, NAN, 4.0, 1.0, &r);
    CHECK(ok, "NaN for NaN must be right");
    ok = qmm_output_check(62, QMM_F32, -INFINITY, -INFINITY, INFINITY, 1.0, &r);
    CHECK(ok, "-inf for -inf must be right");
    ok = qmm_output_check(62, QMM_F32, 1.0, INFINITY, INFINITY, 1.0, &r);
    CHECK(!ok, "1 for +inf must be wrong");
    ok = qmm_output_check(62, QMM_F32, 2.0, 2.0, 4.0, 0.0, &r);
    CHECK(!ok && isinf(r), "a NaN bound (slack 0) must be wrong");
    /* check_against_oracle applies the same rule: f16 outputs +inf for exact 70000 and 65504 for 65510. */
    uint16_t out[2] = {0x7c00, 0x7bff};
    double exact[2] = {70000.0, 65510.0}, abs_dot[2] = {70000.0, 65510.0};
    CHECK(check_against_oracle("overflow", out, QMM_F16, exact, abs_dot, 2, 64, 1.0, NULL) == 0,
          "check_against_oracle must accept +inf for an exact value beyond f16's range");
}

int main(void) {
    test_error_bound();
    test_output_check();
    test_exact_cases();
    test_non_finite();
    test_underflow();
    test_random_against_dense();
    test_bad_input();
    return check_finish("test_oracle");
}
