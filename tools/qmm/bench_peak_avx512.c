/*
 * bench_peak_avx512.c — the matrix-peak loop of `qmm bench` for AVX-512 (compiled with -mavx512f; called
 * only when __builtin_cpu_supports("avx512f")). 16 independent zmm accumulators, each updated by one FMA per
 * iteration: enough to cover the FMA latency on two pipes, and all of them stay in registers. bench_peak_avx512bf16:
 * the same with vdpbf16ps (built for that one function: target attribute).
 */
#include <immintrin.h>

float bench_peak_avx512(long iterations, double *flops);
float bench_peak_avx512bf16(long iterations, double *flops);

float bench_peak_avx512(long iterations, double *flops) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
    __m512 a0 = _mm512_set1_ps(1.00f), a1 = _mm512_set1_ps(1.01f), a2 = _mm512_set1_ps(1.02f),
           a3 = _mm512_set1_ps(1.03f), a4 = _mm512_set1_ps(1.04f), a5 = _mm512_set1_ps(1.05f),
           a6 = _mm512_set1_ps(1.06f), a7 = _mm512_set1_ps(1.07f), a8 = _mm512_set1_ps(1.08f),
           a9 = _mm512_set1_ps(1.09f), a10 = _mm512_set1_ps(1.10f), a11 = _mm512_set1_ps(1.11f),
           a12 = _mm512_set1_ps(1.12f), a13 = _mm512_set1_ps(1.13f), a14 = _mm512_set1_ps(1.14f),
           a15 = _mm512_set1_ps(1.15f);
    for (long i = 0; i < iterations; i++) {
        a0 = _mm512_fmadd_ps(a0, m, c); a1 = _mm512_fmadd_ps(a1, m, c);
        a2 = _mm512_fmadd_ps(a2, m, c); a3 = _mm512_fmadd_ps(a3, m, c);
        a4 = _mm512_fmadd_ps(a4, m, c); a5 = _mm512_fmadd_ps(a5, m, c);
        a6 = _mm512_fmadd_ps(a6, m, c); a7 = _mm512_fmadd_ps(a7, m, c);
        a8 = _mm512_fmadd_ps(a8, m, c); a9 = _mm512_fmadd_ps(a9, m, c);
        a10 = _mm512_fmadd_ps(a10, m, c); a11 = _mm512_fmadd_ps(a11, m, c);
        a12 = _mm512_fmadd_ps(a12, m, c); a13 = _mm512_fmadd_ps(a13, m, c);
        a14 = _mm512_fmadd_ps(a14, m, c); a15 = _mm512_fmadd_ps(a15, m, c);
    }
    *flops = 2.0 * 16.0 * 16.0 * (double)iterations;
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                       _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512bf16"))) float bench_peak_avx512bf16(long iterations, double *flops) {
    /* a, b: 32 bf16 of 2^-10 (0x3A80) each, so every lane grows by 2^-19 an instruction: finite for any run */
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3A80), b = a;
    /* distinct starting values: 16 accumulators with the same start and the same updates would be merged into one */
    __m512 a0 = _mm512_set1_ps(1.00f), a1 = _mm512_set1_ps(1.01f), a2 = _mm512_set1_ps(1.02f),
           a3 = _mm512_set1_ps(1.03f), a4 = _mm512_set1_ps(1.04f), a5 = _mm512_set1_ps(1.05f),
           a6 = _mm512_set1_ps(1.06f), a7 = _mm512_set1_ps(1.07f), a8 = _mm512_set1_ps(1.08f),
           a9 = _mm512_set1_ps(1.09f), a10 = _mm512_set1_ps(1.10f), a11 = _mm512_set1_ps(1.11f),
           a12 = _mm512_set1_ps(1.12f), a13 = _mm512_set1_ps(1.13f), a14 = _mm512_set1_ps(1.14f),
           a15 = _mm512_set1_ps(1.15f);
    for (long i = 0; i < iterations; i++) {
        a0 = _mm512_dpbf16_ps(a0, a, b); a1 = _mm512_dpbf16_ps(a1, a, b);
        a2 = _mm512_dpbf16_ps(a2, a, b); a3 = _mm512_dpbf16_ps(a3, a, b);
        a4 = _mm512_dpbf16_ps(a4, a, b); a5 = _mm512_dpbf16_ps(a5, a, b);
        a6 = _mm512_dpbf16_ps(a6, a, b); a7 = _mm512_dpbf16_ps(a7, a, b);
        a8 = _mm512_dpbf16_ps(a8, a, b); a9 = _mm512_dpbf16_ps(a9, a, b);
        a10 = _mm512_dpbf16_ps(a10, a, b); a11 = _mm512_dpbf16_ps(a11, a, b);
        a12 = _mm512_dpbf16_ps(a12, a, b); a13 = _mm512_dpbf16_ps(a13, a, b);
        a14 = _mm512_dpbf16_ps(a14, a, b); a15 = _mm512_dpbf16_ps(a15, a, b);
    }
    *flops = 4.0 * 16.0 * 16.0 * (double)iterations; /* per lane: 2 products and 2 additions */
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                       _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
    return _mm512_reduce_add_ps(s);
}
