/*
 * isa.c — which instruction sets this CPU and its OS support, detected at run time (cpu.h).
 *
 * An instruction set is usable only when the CPU implements it (cpuid) AND the OS saves and restores
 * its registers on a context switch (XCR0, read with xgetbv once cpuid reports OSXSAVE): a CPU with
 * AVX-512 under an OS (or hypervisor) that does not enable the ZMM state faults on the first ZMM
 * instruction. Bits used (Intel SDM vol. 2A "CPUID", vol. 1 §13.3 "XCR0"; AMD APM vol. 3 "CPUID"):
 *   leaf 1      ECX: 12 FMA, 27 OSXSAVE, 28 AVX, 29 F16C
 *   leaf 7.0    EBX: 5 AVX2, 16 AVX512F, 17 AVX512DQ, 30 AVX512BW, 31 AVX512VL;  ECX: 11 AVX512_VNNI
 *   leaf 7.1    EAX: 5 AVX512_BF16
 *   XCR0        bits 1–2 XMM + YMM state (AVX), bits 5–7 opmask + ZMM_Hi256 + Hi16_ZMM (AVX-512)
 * This file is built without ISA flags: it only asks.
 */
#include "cpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t read_xcr0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

static void detect(qmm_cpu_features *f) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const bool osxsave = (c >> 27) & 1;
    const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    f->os_ymm = (xcr0 & 0x6) == 0x6;
    f->os_zmm = f->os_ymm && (xcr0 & 0xE0) == 0xE0;
    f->avx = f->os_ymm && ((c >> 28) & 1);
    f->fma = f->avx && ((c >> 12) & 1);
    f->f16c = f->avx && ((c >> 29) & 1);
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned leaf7_subleaves = a;
    f->avx2 = f->avx && ((b >> 5) & 1);
    f->avx512f = f->os_zmm && ((b >> 16) & 1);
    f->avx512dq = f->avx512f && ((b >> 17) & 1);
    f->avx512bw = f->avx512f && ((b >> 30) & 1);
    f->avx512vl = f->avx512f && ((b >> 31) & 1);
    f->avx512vnni = f->avx512f && ((c >> 11) & 1);
    f->avx512vbmi = f->avx512f && ((c >> 1) & 1);
    /* pdep is one instruction on Intel since Haswell and on AMD since Zen 3 (family 19h); Zen 1/2 (17h) run it
     * as microcode, tens to hundreds of cycles, slower than the scalar loop it would replace. */
    unsigned vendor_b = 0, vendor_c = 0, vendor_d = 0, family_a = 0, unused;
    __get_cpuid(0, &unused, &vendor_b, &vendor_c, &vendor_d);
    __get_cpuid(1, &family_a, &unused, &unused, &unused);
    const unsigned base_family = (family_a >> 8) & 0xF;
    const unsigned family = base_family + (base_family == 0xF ? (family_a >> 20) & 0xFF : 0);
    const bool amd = vendor_b == 0x68747541u && vendor_d == 0x69746E65u && vendor_c == 0x444D4163u; /* "AuthenticAMD" */
    f->bmi2_fast = ((b >> 8) & 1) && !(amd && family < 0x19);
    if (leaf7_subleaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        f->avx512bf16 = f->avx512f && ((a >> 5) & 1);
    }
}
#else
static void detect(qmm_cpu_features *f) { (void)f; } /* not x86: only the portable rows run */
#endif

const qmm_cpu_features *qmm_cpu_features_get(void) {
    static qmm_cpu_features features;
    static atomic_int state; /* 0 unknown, 1 being detected, 2 ready */
    if (atomic_load_explicit(&state, memory_order_acquire) == 2) return &features;
    int expected = 0;
    if (atomic_compare_exchange_strong(&state, &expected, 1)) {
        qmm_cpu_features detected = {0};
        detect(&detected);
        /* QMM_CPU_MAX_ISA caps what the rows may use (read once, with cpuid), so that the AVX2 and portable
         * rows can be run and tested on a CPU that has more (either case: AVX2 too); an unknown value caps nothing. */
        const char *cap = getenv("QMM_CPU_MAX_ISA");
        detected.max_isa = QMM_CPU_ISA_AVX512BF16;
        if (cap && strcasecmp(cap, "avx512") == 0) detected.max_isa = QMM_CPU_ISA_AVX512;
        if (cap && strcasecmp(cap, "avx2") == 0) detected.max_isa = QMM_CPU_ISA_AVX2;
        if (cap && strcasecmp(cap, "portable") == 0) detected.max_isa = QMM_CPU_ISA_PORTABLE;
        features = detected;
        atomic_store_explicit(&state, 2, memory_order_release);
    } else {
        while (atomic_load_explicit(&state, memory_order_acquire) != 2) {
        } /* another thread is running cpuid: a few microseconds */
    }
    return &features;
}

/* The first missing piece, in the order a reader would check them. */
static bool refuse(char *why_not, size_t why_not_size, const char *what) {
    if (why_not_size) snprintf(why_not, why_not_size, "%s", what);
    return false;
}
/* A row needing `isa` under a QMM_CPU_MAX_ISA cap below it: checked before the CPU's features, so the message names
 * the instruction set the row needs and the cap's value, not the first set below it. */
static bool refuse_capped(char *why_not, size_t why_not_size, const char *isa, int max_isa) {
    const char *cap = max_isa == QMM_CPU_ISA_PORTABLE ? "portable" : max_isa == QMM_CPU_ISA_AVX2 ? "avx2" : "avx512";
    if (why_not_size) snprintf(why_not, why_not_size, "%s is disabled by QMM_CPU_MAX_ISA=%s", isa, cap);
    return false;
}

bool qmm_cpu_has_avx2(char *why_not, size_t why_not_size) {
    const qmm_cpu_features *f = qmm_cpu_features_get();
#if !(defined(__x86_64__) || defined(__i386__))
    return refuse(why_not, why_not_size, "this CPU is not x86 (no AVX2)");
#endif
    if (f->max_isa < QMM_CPU_ISA_AVX2) return refuse_capped(why_not, why_not_size, "AVX2", f->max_isa);
    if (!f->os_ymm) return refuse(why_not, why_not_size, "the OS does not enable the YMM register state (XCR0)");
    if (!f->avx2) return refuse(why_not, why_not_size, "this CPU lacks AVX2");
    if (!f->fma) return refuse(why_not, why_not_size, "this CPU lacks FMA");
    if (!f->f16c) return refuse(why_not, why_not_size, "this CPU lacks F16C");
    return true;
}

bool qmm_cpu_has_avx512(char *why_not, size_t why_not_size) {
    const qmm_cpu_features *f = qmm_cpu_features_get();
    if (f->max_isa < QMM_CPU_ISA_AVX512) return refuse_capped(why_not, why_not_size, "AVX-512", f->max_isa);
    if (!qmm_cpu_has_avx2(why_not, why_not_size)) return false; /* the AVX-512 file also uses FMA, F16C */
    if (!f->os_zmm) return refuse(why_not, why_not_size, "the OS does not enable the ZMM register state (XCR0)");
    if (!f->avx512f) return refuse(why_not, why_not_size, "this CPU lacks AVX-512F");
    if (!f->avx512bw) return refuse(why_not, why_not_size, "this CPU lacks AVX-512BW");
    if (!f->avx512vl) return refuse(why_not, why_not_size, "this CPU lacks AVX-512VL");
    if (!f->avx512dq) return refuse(why_not, why_not_size, "this CPU lacks AVX-512DQ");
    return true;
}

bool qmm_cpu_has_avx512bf16(char *why_not, size_t why_not_size) {
    const int max_isa = qmm_cpu_features_get()->max_isa;
    if (max_isa < QMM_CPU_ISA_AVX512BF16) return refuse_capped(why_not, why_not_size, "AVX512_BF16", max_isa);
    if (!qmm_cpu_has_avx512(why_not, why_not_size)) return false;
    if (!qmm_cpu_features_get()->avx512bf16) return refuse(why_not, why_not_size, "this CPU lacks AVX512_BF16");
    return true;
}
