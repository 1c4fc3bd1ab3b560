/*
 * check.h — the small test kit every C test uses (CTest runs the executables; exit code 0 = pass).
 *
 *   CHECK(cond, "fmt", ...)        records a failure with file:line and the message, goes on
 *   CHECK_OK(call)                 the call must return QMM_OK (prints qmm_last_error otherwise)
 *   CHECK_STATUS(call, status)     the call must fail with exactly this status and a non-empty message
 *   return check_finish("name")    prints "name: N passed, N failed" and returns the exit code
 *
 * Random inputs come from check_rng (splitmix64), seeded from QMM_TEST_SEED or the clock; the seed is
 * printed on the first failure so a failing case can be replayed.
 */
#ifndef QMM_CHECK_H
#define QMM_CHECK_H

#include "qmm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

extern int check_passed;
extern int check_failed;

void check_record(bool ok, const char *file, int line, const char *format, ...)
    __attribute__((format(printf, 4, 5)));
int check_finish(const char *suite);

#define CHECK(cond, ...) check_record((cond), __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_OK(call)                                                                                       \
    do {                                                                                                     \
        qmm_status check_status_ = (call);                                                                   \
        check_record(check_status_ == QMM_OK, __FILE__, __LINE__, "%s -> %s: %s", #call,                    \
                     qmm_status_string(check_status_), qmm_last_error());                                    \
    } while (0)
#define CHECK_STATUS(call, expected)                                                                         \
    do {                                                                                                     \
        qmm_status check_status_ = (call);                                                                   \
        check_record(check_status_ == (expected) && qmm_last_error()[0] != '\0', __FILE__, __LINE__,         \
                     "%s -> %s (want %s), message \"%s\"", #call, qmm_status_string(check_status_),          \
                     qmm_status_string(expected), qmm_last_error());                                         \
    } while (0)

/* The test seed: QMM_TEST_SEED if set, else derived from the clock; printed on first failure. */
uint64_t check_seed(void);
/* splitmix64 stream. */
typedef struct check_rng {
    uint64_t state;
} check_rng;
check_rng check_rng_make(uint64_t salt);
uint64_t check_rng_next(check_rng *rng);
/* Uniform in [lo, hi). */
float check_rng_uniform(check_rng *rng, float lo, float hi);
/* Approximately N(0, 1) (sum of uniforms), enough for weights and activations. */
float check_rng_normal(check_rng *rng);

/* Fills count elements of a float dtype with uniform values in [lo, hi), rounded to dtype. */
void check_fill_uniform(check_rng *rng, void *array, qmm_dtype dtype, size_t count, float lo, float hi);

/* A random quantized matrix (rows × cols, bits, group_size, dtype), heap-owned: random codes, scales in
 * ±[0.01, 0.1) (negative about half the time, as MLX makes them), biases in [−1, 1). */
typedef struct check_qmatrix {
    qmm_qmatrix m;
    uint32_t *w;
    void *scales;
    void *biases;
} check_qmatrix;
bool check_qmatrix_random(check_rng *rng, size_t rows, size_t cols, int bits, int group_size, qmm_dtype dtype,
                          check_qmatrix *out);
void check_qmatrix_free(check_qmatrix *q);

/* Compares out[M·N] (dtype) against the f64 oracle with qmm_output_check(K, dtype, got, exact, abs_dot,
 * slack) per element — the bound, ±inf where correct rounding to dtype overflows, and for a non-finite exact
 * value the same value (NaN for NaN, the same infinity; docs/kernels.md §2, §6). Returns the number of
 * elements that fail and writes the worst ratio (qmm_output_check's) to *worst (if not NULL). Prints the first
 * few mismatches with `label`. */
size_t check_against_oracle(const char *label, const void *out, qmm_dtype dtype, const double *exact,
                            const double *abs_dot, size_t count, size_t K, double slack, double *worst);

#endif /* QMM_CHECK_H */
