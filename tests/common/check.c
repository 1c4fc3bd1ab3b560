#include "check.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int check_passed;
int check_failed;
static bool seed_printed;

uint64_t check_seed(void) {
    static uint64_t seed;
    static bool have;
    if (!have) {
        const char *env = getenv("QMM_TEST_SEED");
        if (env && *env) {
            seed = strtoull(env, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
        }
        have = true;
    }
    return seed;
}

void check_record(bool ok, const char *file, int line, const char *format, ...) {
    if (ok) {
        check_passed++;
        return;
    }
    check_failed++;
    if (!seed_printed) {
        fprintf(stderr, "(replay with QMM_TEST_SEED=%llu)\n", (unsigned long long)check_seed());
        seed_printed = true;
    }
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
}

int check_finish(const char *suite) {
    printf("%s: %d passed, %d failed\n", suite, check_passed, check_failed);
    if (check_passed + check_failed == 0) {
        fprintf(stderr, "%s: no check ran\n", suite);
        return 1;
    }
    return check_failed ? 1 : 0;
}

check_rng check_rng_make(uint64_t salt) {
    check_rng rng = {check_seed() ^ (salt * 0x9E3779B97F4A7C15ull)};
    return rng;
}

uint64_t check_rng_next(check_rng *rng) {
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float check_rng_uniform(check_rng *rng, float lo, float hi) {
    double unit = (double)(check_rng_next(rng) >> 11) * 0x1.0p-53;
    return (float)(lo + (hi - lo) * unit);
}

float check_rng_normal(check_rng *rng) {
    float sum = 0.0f;
    for (int i = 0; i < 12; i++) sum += check_rng_uniform(rng, 0.0f, 1.0f);
    return sum - 6.0f;
}

void check_fill_uniform(check_rng *rng, void *array, qmm_dtype dtype, size_t count, float lo, float hi) {
    for (size_t i = 0; i < count; i++) {
        float v = check_rng_uniform(rng, lo, hi);
        switch (dtype) {
        case QMM_F16: ((uint16_t *)array)[i] = qmm_f32_to_f16(v); break;
        case QMM_BF16: ((uint16_t *)array)[i] = qmm_f32_to_bf16(v); break;
        default: ((float *)array)[i] = v; break;
        }
    }
}

bool check_qmatrix_random(check_rng *rng, size_t rows, size_t cols, int bits, int group_size, qmm_dtype dtype,
                          check_qmatrix *out) {
    memset(out, 0, sizeof *out);
    size_t words = rows * (cols * (size_t)bits / 32);
    size_t groups = rows * (cols / (size_t)group_size);
    out->w = malloc(words * sizeof(uint32_t) + 4);
    out->scales = malloc(groups * qmm_dtype_size(dtype) + 4);
    out->biases = malloc(groups * qmm_dtype_size(dtype) + 4);
    if (!out->w || !out->scales || !out->biases) {
        check_qmatrix_free(out);
        return false;
    }
    for (size_t i = 0; i < words; i++) out->w[i] = (uint32_t)check_rng_next(rng);
    for (size_t g = 0; g < groups; g++) {
        float s = check_rng_uniform(rng, 0.01f, 0.1f);
        if (check_rng_next(rng) & 1) s = -s;
        float b = check_rng_uniform(rng, -1.0f, 1.0f);
        switch (dtype) {
        case QMM_F16:
            ((uint16_t *)out->scales)[g] = qmm_f32_to_f16(s);
            ((uint16_t *)out->biases)[g] = qmm_f32_to_f16(b);
            break;
        case QMM_BF16:
            ((uint16_t *)out->scales)[g] = qmm_f32_to_bf16(s);
            ((uint16_t *)out->biases)[g] = qmm_f32_to_bf16(b);
            break;
        default:
            ((float *)out->scales)[g] = s;
            ((float *)out->biases)[g] = b;
            break;
        }
    }
    qmm_qmatrix m = {out->w, out->scales, out->biases, dtype, rows, cols, bits, group_size};
    out->m = m;
    return true;
}

void check_qmatrix_free(check_qmatrix *q) {
    free(q->w);
    free(q->scales);
    free(q->biases);
    memset(q, 0, sizeof *q);
}

static double load_as_double(const void *array, qmm_dtype dtype, size_t i) {
    switch (dtype) {
    case QMM_F16: return qmm_f16_to_f32(((const uint16_t *)array)[i]);
    case QMM_BF16: return qmm_bf16_to_f32(((const uint16_t *)array)[i]);
    default: return ((const float *)array)[i];
    }
}

size_t check_against_oracle(const char *label, const void *out, qmm_dtype dtype, const double *exact,
                            const double *abs_dot, size_t count, size_t K, double slack, double *worst) {
    size_t bad = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < count; i++) {
        double got = load_as_double(out, dtype, i);
        double ratio;
        /* The one verdict (qmm_output_check, docs/kernels.md §6): the bound, ±inf where rounding to dtype
         * overflows, and the non-finite rule's exact match for a non-finite exact value. */
        bool ok = qmm_output_check(K, dtype, got, exact[i], abs_dot[i], slack, &ratio);
        if (ratio > worst_ratio) worst_ratio = ratio;
        if (!ok) {
            if (bad < 5)
                fprintf(stderr, "  %s: element %zu = %.9g, oracle %.9g, |error| %.3g, bound %.3g\n", label, i, got,
                        exact[i], fabs(got - exact[i]), qmm_error_bound(K, dtype, exact[i], abs_dot[i], slack));
            bad++;
        }
    }
    if (worst) *worst = worst_ratio;
    return bad;
}
