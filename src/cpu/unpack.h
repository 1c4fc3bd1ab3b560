/*
 * unpack.h — the CPU kernels' unpacking of 2-, 3-, 5- and 6-bit codes into one byte per code (included by
 * avx2.c and avx512.c, which define unpack_codes from these pieces). Those widths have no in-place decode: their
 * rows are unpacked to bytes, which are then exactly an 8-bit packed row (simd_kernels.h, "Decode order"). At
 * M = 1 that unpacking was most of the time: qmm_unpack_stream's scalar loop takes a few cycles per code.
 *
 * The stream (DESIGN.md §1) is little-endian and LSB-first, so the 8 codes j … j + 7 (j a multiple of 8) of b
 * bits are the b bytes from byte (j/8)·b read as a little-endian integer, code j + i in its bits [i·b, i·b + b).
 *   pdep (BMI2): deposits those 8·b bits into the low b bits of 8 bytes (mask 0x..1F1F for b = 5): 8 codes per
 *     instruction. Used where pdep is one instruction (qmm_cpu_features.bmi2_fast; not AMD Zen 1/2).
 *   vpermb + vpmultishiftqb (AVX512_VBMI, avx512.c): qword k of a vector gets the 8 bytes from byte k·b, byte i
 *     of that qword the 8 bits from its bit i·b (i·b + 8 ≤ 50 < 64: no wrap-around), then an AND with 2^b − 1:
 *     64 codes in 3 instructions.
 * Neither reads past the bytes the codes occupy, rounded up to whole uint32 words (what qmm_unpack_stream reads):
 * near the end a chunk is copied byte-exactly (pdep) or loaded under a mask (VBMI). Both give qmm_unpack_stream's
 * bytes (test_cpu checks them against it at every width, count and start).
 */
#ifndef QMM_CPU_UNPACK_H
#define QMM_CPU_UNPACK_H

#include "cpu.h"
#include "internal.h"

#include <immintrin.h>
#include <string.h>

/* The stream bytes a call may read: count·bits bits rounded up to whole uint32 words. */
static inline size_t unpack_readable(size_t count, int bits) { return 4 * ((count * (size_t)bits + 31) / 32); }

/* Codes j … count − 1, one at a time from the bytes (j any). */
static inline void unpack_codes_scalar_tail(const uint8_t *stream, size_t j, size_t count, int bits, uint8_t *codes) {
    const unsigned mask = (1u << bits) - 1u;
    for (; j < count; j++) {
        const size_t bit = j * (size_t)bits, at = bit / 8;
        unsigned window = stream[at];
        if (bit % 8 + (size_t)bits > 8) window |= (unsigned)stream[at + 1] << 8;
        codes[j] = (uint8_t)((window >> (bit % 8)) & mask);
    }
}

/* Codes j0 … count − 1 (j0 a multiple of 8) by pdep, 8 at a time. */
__attribute__((target("bmi2"))) static inline void unpack_codes_pdep(const uint8_t *stream, size_t j0, size_t count,
                                                                    int bits, uint8_t *codes) {
    const uint64_t mask = 0x0101010101010101ull * ((1u << bits) - 1u);
    const size_t readable = unpack_readable(count, bits);
    size_t j = j0;
    for (; j + 8 <= count && (j / 8) * (size_t)bits + 8 <= readable; j += 8) {
        uint64_t chunk;
        memcpy(&chunk, stream + (j / 8) * (size_t)bits, 8);
        const uint64_t out = _pdep_u64(chunk, mask);
        memcpy(codes + j, &out, 8);
    }
    for (; j + 8 <= count; j += 8) { /* the last chunks: only the b bytes their codes occupy */
        uint64_t chunk = 0;
        memcpy(&chunk, stream + (j / 8) * (size_t)bits, (size_t)bits);
        const uint64_t out = _pdep_u64(chunk, mask);
        memcpy(codes + j, &out, 8);
    }
    unpack_codes_scalar_tail(stream, j, count, bits, codes);
}

/* The widths unpacked here (4 and 8 are decoded in place; qmm_unpack_stream serves the rest). */
static inline bool unpack_width(int bits) { return bits == 2 || bits == 3 || bits == 5 || bits == 6; }

/* Codes j … count − 1 (j 0, or a multiple of 64 after the VBMI loop) by pdep where it is one instruction, else by the
 * scalar stream reader (j·b/32 whole words in). The tail of each ISA file's unpack_codes. */
static inline void unpack_codes_rest(const uint32_t *in, size_t j, size_t count, int bits, uint8_t *codes) {
    if (unpack_width(bits) && qmm_cpu_features_get()->bmi2_fast)
        unpack_codes_pdep((const uint8_t *)in, j, count, bits, codes);
    else
        qmm_unpack_stream(in + j * (size_t)bits / 32, count - j, bits, codes + j);
}

#endif
