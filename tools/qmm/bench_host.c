/*
 * bench_host.c — the CPU side of `qmm bench`: the machine (CPU model, threads, last-level cache from
 * sysfs), the two ceilings of the floor (a multi-threaded streaming copy and a register-resident f32 FMA
 * loop on every thread, the widest vectors this CPU has, chosen at run time), and the OpenBLAS peer.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "bench.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef QMM_BENCH_OPENBLAS
#include <cblas.h>
#endif

static int threads_override; /* --threads, 0 = not given */

void bench_host_set_threads(int threads) { threads_override = threads > 0 ? threads : 0; }

int bench_host_threads(void) {
    if (threads_override) return threads_override;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return 1;
}

void bench_host_cpu_model(char *out, size_t size) {
    snprintf(out, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *colon = strchr(line, ':');
        if (!colon) continue;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        snprintf(out, size, "%s", colon);
        out[strcspn(out, "\n")] = '\0';
        break;
    }
    fclose(f);
}

/* Reads a small sysfs file into text (trailing newline removed); 0 when unreadable. */
static int read_text(const char *path, char *text, size_t size) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(text, (int)size, f) != NULL;
    fclose(f);
    if (ok) text[strcspn(text, "\n")] = '\0';
    return ok;
}

/* "32768K" -> bytes. */
static size_t parse_cache_size(const char *text) {
    char *end;
    unsigned long long value = strtoull(text, &end, 10);
    if (*end == 'K') value <<= 10;
    else if (*end == 'M') value <<= 20;
    else if (*end == 'G') value <<= 30;
    return (size_t)value;
}

/* The cpus of a list such as "0-3,8". */
static int count_cpu_list(const char *list) {
    int count = 0;
    const char *p = list;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) break;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        count += (int)(b - a + 1);
        p = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
    return count;
}

/* The highest cache level of cpu0 (its size × the number of instances that cover the online cpus). */
size_t bench_host_llc_bytes(char *desc, size_t size) {
    int best_level = -1;
    size_t best_size = 0;
    char best_shared[256] = "";
    for (int index = 0; index < 16; index++) {
        char path[256], text[256];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
        if (!read_text(path, text, sizeof text)) break;
        int level = atoi(text);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", index);
        if (read_text(path, text, sizeof text) && strcmp(text, "Instruction") == 0) continue;
        if (level <= best_level) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
        if (!read_text(path, text, sizeof text)) continue;
        best_level = level;
        best_size = parse_cache_size(text);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/shared_cpu_list", index);
        if (!read_text(path, best_shared, sizeof best_shared)) best_shared[0] = '\0';
    }
    if (best_level < 0 || best_size == 0) {
        snprintf(desc, size, "unknown (sysfs has no cache sizes)");
        return 0;
    }
    char online[256];
    int cpus = read_text("/sys/devices/system/cpu/online", online, sizeof online) ? count_cpu_list(online) : 1;
    int sharing = best_shared[0] ? count_cpu_list(best_shared) : cpus;
    int instances = sharing > 0 ? (cpus + sharing - 1) / sharing : 1;
    if (instances < 1) instances = 1;
    snprintf(desc, size, "L%d %zu MiB × %d instance%s", best_level, best_size >> 20, instances,
             instances == 1 ? "" : "s");
    return best_size * (size_t)instances;
}

/* ───────────────────────────── ceilings ───────────────────────────── */

/* A plain scalar FMA loop for CPUs without AVX2+FMA (8 accumulators; the compiler may vectorise it). */
static float peak_portable(long iterations, double *flops) {
    float a0 = 1.0f, a1 = 1.1f, a2 = 1.2f, a3 = 1.3f, a4 = 1.4f, a5 = 1.5f, a6 = 1.6f, a7 = 1.7f;
    const float m = 0.999999f, c = 1e-6f;
    for (long i = 0; i < iterations; i++) {
        a0 = a0 * m + c; a1 = a1 * m + c; a2 = a2 * m + c; a3 = a3 * m + c;
        a4 = a4 * m + c; a5 = a5 * m + c; a6 = a6 * m + c; a7 = a7 * m + c;
    }
    *flops = 2.0 * 8.0 * (double)iterations;
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

typedef float (*peak_fn)(long, double *);

static peak_fn choose_peak(const char **name) {
#ifdef QMM_BENCH_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        *name = "AVX-512 (zmm)";
        return bench_peak_avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *name = "AVX2+FMA (ymm)";
        return bench_peak_avx2;
    }
#endif
    *name = "portable C";
    return peak_portable;
}

volatile float bench_sink; /* where the FMA loops' results go, so they are not optimised away */

/* A peak loop on every thread at once, best of 3 runs: FLOP/s. */
static double best_peak(peak_fn peak, long iterations) {
    double best = 0.0;
    for (int r = 0; r < 3; r++) {
        double total = 0.0;
        double start = now_seconds();
#ifdef _OPENMP
#pragma omp parallel reduction(+ : total)
#endif
        {
            double flops = 0.0;
            float value = peak(iterations, &flops);
            if (value == 12345.0f) bench_sink = value; /* practically never; keeps the result live */
            total += flops;
        }
        double seconds = now_seconds() - start;
        if (seconds > 0 && total / seconds > best) best = total / seconds;
    }
    return best;
}

qmm_status bench_host_ceilings(int quick, bench_ceilings *c) {
    memset(c, 0, sizeof *c);
    int threads = bench_host_threads();
#ifdef _OPENMP
    const char *threading = "OpenMP";
    omp_set_num_threads(threads);
#else
    const char *threading = "one thread (built without OpenMP)";
    threads = 1;
#endif
    /* Copy: two buffers, each far larger than any cache; first touched by the threads that copy them. */
    size_t bytes = (size_t)(quick ? 32 : 256) << 20;
    char *src = aligned_alloc(4096, bytes), *dst = aligned_alloc(4096, bytes);
    if (!src || !dst) {
        free(src);
        free(dst);
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate 2 × %zu MiB for the copy-bandwidth ceiling", bytes >> 20);
    }
    int runs = quick ? 3 : 7;
    double best = 0.0;
    for (int r = -1; r < runs; r++) { /* r = -1: first touch */
        double start = now_seconds();
#ifdef _OPENMP
#pragma omp parallel
#endif
        {
#ifdef _OPENMP
            int t = omp_get_thread_num(), n = omp_get_num_threads();
#else
            int t = 0, n = 1;
#endif
            size_t chunk = (bytes / (size_t)n + 4095) & ~(size_t)4095;
            size_t begin = (size_t)t * chunk, end = begin + chunk > bytes ? bytes : begin + chunk;
            if (begin < end) {
                if (r < 0) {
                    memset(src + begin, (int)(t + 1), end - begin);
                    memset(dst + begin, 0, end - begin);
                } else {
                    memcpy(dst + begin, src + begin, end - begin);
                }
            }
        }
        double seconds = now_seconds() - start;
        if (r >= 0 && seconds > 0 && 2.0 * (double)bytes / seconds > best) best = 2.0 * (double)bytes / seconds;
    }
    bench_sink = (float)dst[bytes / 2];
    free(src);
    free(dst);
    c->copy_gbps = best / 1e9;
    c->copy_bytes = (double)bytes;
    snprintf(c->copy_method, sizeof c->copy_method,
             "memcpy of %zu MiB split over %d thread%s (%s), read + write bytes, best of %d", bytes >> 20, threads,
             threads == 1 ? "" : "s", threading, runs);

    /* Peak: the FMA loop on every thread at once; best of 3. */
    const char *isa;
    peak_fn peak = choose_peak(&isa);
    long iterations = quick ? 1000000L : 20000000L;
    const double best_flops = best_peak(peak, iterations);
    c->peak_gflops = best_flops / 1e9;
    snprintf(c->peak_method, sizeof c->peak_method,
             "f32 FMA loop, %s, register-resident accumulators, %d thread%s (%s), best of 3", isa, threads,
             threads == 1 ? "" : "s", threading);

    /* bf16 inputs: where the CPU multiplies bf16 pairs (vdpbf16ps, twice the FLOPs of an FMA an instruction), that
     * loop is their peak, measured the same way; else the f32 peak above. */
    c->peak_bf16_gflops = c->peak_gflops;
    snprintf(c->peak_bf16_method, sizeof c->peak_bf16_method, "no bf16 dot-product instruction here: the f32 peak");
#ifdef QMM_BENCH_X86
    if (__builtin_cpu_supports("avx512bf16")) {
        const double best_bf16 = best_peak(bench_peak_avx512bf16, iterations);
        if (best_bf16 / 1e9 > c->peak_gflops) {
            c->peak_bf16_gflops = best_bf16 / 1e9;
            snprintf(c->peak_bf16_method, sizeof c->peak_bf16_method,
                     "vdpbf16ps loop (AVX-512 BF16), register-resident accumulators, %d thread%s (%s), best of 3",
                     threads, threads == 1 ? "" : "s", threading);
        } else {
            snprintf(c->peak_bf16_method, sizeof c->peak_bf16_method,
                     "a vdpbf16ps loop measured %.1f GFLOP/s, not above the f32 peak: the f32 peak", best_bf16 / 1e9);
        }
    }
#endif
    return QMM_OK;
}

/* ───────────────────────────── OpenBLAS ───────────────────────────── */

int bench_openblas_available(char *why, size_t size) {
#ifdef QMM_BENCH_OPENBLAS
    snprintf(why, size, "OpenBLAS %s", openblas_get_config());
    return 1;
#else
    snprintf(why, size, "OpenBLAS was not found when qmm was built (Debian: libopenblas-dev; scripts/setup.sh build)");
    return 0;
#endif
}

qmm_status bench_openblas_time(float *const *w, size_t copies, size_t N, size_t K, size_t M, int w_is_k_by_n,
                               int repeats, double *us) {
#ifdef QMM_BENCH_OPENBLAS
    *us = NAN;
    float *x = malloc(M * K * sizeof *x), *out = malloc(M * N * sizeof *out);
    double *times = malloc((size_t)repeats * sizeof *times);
    if (!x || !out || !times) {
        free(x);
        free(out);
        free(times);
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate x and out of the OpenBLAS peer (M=%zu)", M);
    }
    openblas_set_num_threads(bench_host_threads()); /* the same thread count as qmm (--threads) */
    qmm_status status = fill_random(7, x, QMM_F32, M * K);
    for (int r = -1; status == QMM_OK && r < repeats; r++) { /* r = -1: warm-up */
        double start = now_seconds();
        for (size_t i = 0; i < copies; i++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, w_is_k_by_n ? CblasNoTrans : CblasTrans, (int)M, (int)N, (int)K,
                        1.0f, x, (int)K, w[i], w_is_k_by_n ? (int)N : (int)K, 0.0f, out, (int)N);
        if (r >= 0) times[r] = (now_seconds() - start) * 1e6 / (double)copies;
    }
    if (status == QMM_OK) {
        qsort(times, (size_t)repeats, sizeof *times, compare_doubles);
        *us = times[repeats / 2];
    }
    free(x);
    free(out);
    free(times);
    return status;
#else
    (void)w, (void)copies, (void)N, (void)K, (void)M, (void)w_is_k_by_n, (void)repeats;
    *us = NAN;
    return qmm_error(QMM_ERR_UNSUPPORTED, "OpenBLAS was not linked in");
#endif
}
