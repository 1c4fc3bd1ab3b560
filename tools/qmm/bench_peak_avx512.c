/*
 * bench_peak_avx512.c — the matrix-peak loop of `qmm bench` for AVX-512 (compiled with -mavx512f; called
 * only when __builtin_cpu_supports("avx512f")). 16 independent zmm accumulators, each updated by one FMA per
 * iteration: enough to cover the FMA latency on two pipes, and all of them stay in registers. bench_peak_avx512bf16:
 * the same with vdpbf16ps (built for that one function: target attribute).
 */
#include <immintrin.h>

float bench_peak_avx512(long iterations, double *flops);
float bench_peak_avx512bf16(long iterations, double *flops);

/* The 16 accumulators a0 … a15, each started at its own value (16 with the same start and the same updates would be
 * merged into one by the compiler); PEAK_STEP(F): a_i = F(a_i) for each; PEAK_SUM: their sum as one float. */
#define PEAK_START                                                                                                   \
    __m512 a0 = _mm512_set1_ps(1.00f), a1 = _mm512_set1_ps(1.01f), a2 = _mm512_set1_ps(1.02f),                      \
           a3 = _mm512_set1_ps(1.03f), a4 = _mm512_set1_ps(1.04f), a5 = _mm512_set1_ps(1.05f),                      \
           a6 = _mm512_set1_ps(1.06f), a7 = _mm512_set1_ps(1.07f), a8 = _mm512_set1_ps(1.08f),                      \
           a9 = _mm512_set1_ps(1.09f), a10 = _mm512_set1_ps(1.10f), a11 = _mm512_set1_ps(1.11f),                    \
           a12 = _mm512_set1_ps(1.12f), a13 = _mm512_set1_ps(1.13f), a14 = _mm512_set1_ps(1.14f),                   \
           a15 = _mm512_set1_ps(1.15f)
#define PEAK_STEP(F)                                                                                                 \
    a0 = F(a0); a1 = F(a1); a2 = F(a2); a3 = F(a3); a4 = F(a4); a5 = F(a5); a6 = F(a6); a7 = F(a7);                 \
    a8 = F(a8); a9 = F(a9); a10 = F(a10); a11 = F(a11); a12 = F(a12); a13 = F(a13); a14 = F(a14); a15 = F(a15)
#define PEAK_SUM                                                                                                     \
    _mm512_reduce_add_ps(_mm512_add_ps(                                                                              \
        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),                                   \
                      _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),                                  \
        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),                                 \
                      _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15)))))

float bench_peak_avx512(long iterations, double *flops) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
    PEAK_START;
#define FMA_STEP(a) _mm512_fmadd_ps(a, m, c)
    for (long i = 0; i < iterations; i++) {
        PEAK_STEP(FMA_STEP);
    }
    *flops = 2.0 * 16.0 * 16.0 * (double)iterations;
    return PEAK_SUM;
}

__attribute__((target("avx512bf16"))) float bench_peak_avx512bf16(long iterations, double *flops) {
    /* a, b: 32 bf16 of 2^-10 (0x3A80) each, so every lane grows by 2^-19 an instruction: finite for any run */
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3A80), b = a;
    PEAK_START;
#define DP_STEP(acc) _mm512_dpbf16_ps(acc, a, b)
    for (long i = 0; i < iterations; i++) {
        PEAK_STEP(DP_STEP);
    }
    *flops = 4.0 * 16.0 * 16.0 * (double)iterations; /* per lane: 2 products and 2 additions */
    return PEAK_SUM;
}
