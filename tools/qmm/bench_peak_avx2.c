/*
 * bench_peak_avx2.c — the matrix-peak loop of `qmm bench` for AVX2+FMA (compiled with -mavx2 -mfma; called
 * only when __builtin_cpu_supports says both). 12 independent ymm accumulators plus the two operands fit the
 * 16 ymm registers; 12 covers the FMA latency (4–5 cycles) on two pipes.
 */
#include <immintrin.h>

float bench_peak_avx2(long iterations, double *flops);

float bench_peak_avx2(long iterations, double *flops) {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
    __m256 a0 = _mm256_set1_ps(1.00f), a1 = _mm256_set1_ps(1.01f), a2 = _mm256_set1_ps(1.02f),
           a3 = _mm256_set1_ps(1.03f), a4 = _mm256_set1_ps(1.04f), a5 = _mm256_set1_ps(1.05f),
           a6 = _mm256_set1_ps(1.06f), a7 = _mm256_set1_ps(1.07f), a8 = _mm256_set1_ps(1.08f),
           a9 = _mm256_set1_ps(1.09f), a10 = _mm256_set1_ps(1.10f), a11 = _mm256_set1_ps(1.11f);
    for (long i = 0; i < iterations; i++) {
        a0 = _mm256_fmadd_ps(a0, m, c); a1 = _mm256_fmadd_ps(a1, m, c);
        a2 = _mm256_fmadd_ps(a2, m, c); a3 = _mm256_fmadd_ps(a3, m, c);
        a4 = _mm256_fmadd_ps(a4, m, c); a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c); a7 = _mm256_fmadd_ps(a7, m, c);
        a8 = _mm256_fmadd_ps(a8, m, c); a9 = _mm256_fmadd_ps(a9, m, c);
        a10 = _mm256_fmadd_ps(a10, m, c); a11 = _mm256_fmadd_ps(a11, m, c);
    }
    *flops = 2.0 * 8.0 * 12.0 * (double)iterations;
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}
