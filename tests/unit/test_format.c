/*
 * test_format.c — the affine format: qmm_format_validate, qmm_qmatrix_validate, sizes, and qmm_pack /
 * qmm_unpack for every width (random round trips checked against a bit-by-bit stream, hand-worked 3-bit and
 * 6-bit words with codes straddling words, overlapping arrays, and every bad input with its exact status and message); qmm_widen_codes
 * from every width to every wider one.
 */
#include "check.h"
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const int all_bits[] = {2, 3, 4, 5, 6, 8};
static const int all_group_sizes[] = {32, 64, 128};

/* Expects `call` to fail with exactly `status` and a fresh non-empty message. */
#define EXPECT_FAIL(call, status)                                                                            \
    do {                                                                                                     \
        qmm_error_clear();                                                                                   \
        CHECK_STATUS(call, status);                                                                          \
    } while (0)

/* Expects the last message to contain `text` (the bad value must be named). */
#define EXPECT_MESSAGE(text)                                                                                 \
    CHECK(strstr(qmm_last_error(), text) != NULL, "message \"%s\" should mention \"%s\"", qmm_last_error(), text)

static void test_format_validate(void) {
    for (int bits = -2; bits <= 40; bits++) {
        for (int group_size = 0; group_size <= 256; group_size += 16) {
            bool bits_ok = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
            bool group_ok = group_size == 32 || group_size == 64 || group_size == 128;
            qmm_error_clear();
            qmm_status status = qmm_format_validate(bits, group_size);
            if (bits_ok && group_ok) {
                CHECK(status == QMM_OK, "bits=%d group_size=%d should be valid: %s", bits, group_size,
                      qmm_last_error());
            } else {
                CHECK(status == QMM_ERR_FORMAT && qmm_last_error()[0] != '\0',
                      "bits=%d group_size=%d should be QMM_ERR_FORMAT, got %s", bits, group_size,
                      qmm_status_string(status));
            }
        }
    }
    EXPECT_FAIL(qmm_format_validate(7, 64), QMM_ERR_FORMAT);
    EXPECT_MESSAGE("bits=7");
    EXPECT_MESSAGE("{2, 3, 4, 5, 6, 8}");
    EXPECT_FAIL(qmm_format_validate(4, 16), QMM_ERR_FORMAT);
    EXPECT_MESSAGE("group_size=16");
    EXPECT_MESSAGE("{32, 64, 128}");
}

static void test_sizes(void) {
    CHECK(qmm_packed_words(4096, 4) == 512, "4096 4-bit codes are 512 words");
    CHECK(qmm_packed_words(576, 3) == 54, "576 3-bit codes are 54 words");
    CHECK(qmm_packed_words(64, 5) == 10 && qmm_packed_words(32, 6) == 6 && qmm_packed_words(32, 8) == 8 &&
              qmm_packed_words(32, 2) == 2,
          "packed words for 5/6/8/2 bits");
    CHECK(qmm_packed_words((SIZE_MAX / 32) * 32, 8) == (SIZE_MAX / 32) * 8,
          "packed words do not overflow for huge cols (cols·bits would)");
    CHECK(qmm_groups(4096, 128) == 32 && qmm_groups(576, 32) == 18 && qmm_groups(64, 0) == 0, "groups per row");
}

/* The stream as a reference: bit k of code j is stream bit j·bits + k, in word (j·bits+k)/32 at bit
 * (j·bits+k)%32 — written one bit at a time, independently of the packer. */
static void reference_pack(const uint8_t *codes, size_t rows, size_t cols, int bits, uint32_t *w) {
    size_t words = cols * (size_t)bits / 32;
    memset(w, 0, rows * words * sizeof *w);
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < cols; j++)
            for (int k = 0; k < bits; k++)
                if ((codes[r * cols + j] >> k) & 1) {
                    size_t bit = j * (size_t)bits + (size_t)k;
                    w[r * words + bit / 32] |= 1u << (bit % 32);
                }
}

static void test_round_trip(void) {
    check_rng rng = check_rng_make(21);
    const size_t row_counts[] = {1, 3, 7, 13};
    /* cols: multiples of 32 (any width), plus the smallest cols·bits = 32 row for the widths that allow it */
    const size_t col_counts[] = {32, 96, 160, 576};
    for (size_t b = 0; b < sizeof all_bits / sizeof all_bits[0]; b++) {
        int bits = all_bits[b];
        for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++) {
            for (size_t ci = 0; ci <= sizeof col_counts / sizeof col_counts[0]; ci++) {
                size_t rows = row_counts[ri];
                size_t cols = ci < sizeof col_counts / sizeof col_counts[0] ? col_counts[ci] : (size_t)(32 / bits);
                if (cols * (size_t)bits % 32 != 0) continue; /* 3/5/6 bits: only multiples of 32 codes */
                size_t count = rows * cols, words = rows * (cols * (size_t)bits / 32);
                uint8_t *codes = malloc(count), *back = malloc(count);
                uint32_t *w = malloc((words + 1) * sizeof *w), *expected = malloc(words * sizeof *expected);
                if (!codes || !back || !w || !expected) {
                    CHECK(false, "out of memory");
                    free(codes), free(back), free(w), free(expected);
                    return;
                }
                for (size_t i = 0; i < count; i++) codes[i] = (uint8_t)(check_rng_next(&rng) & ((1u << bits) - 1));
                /* the extremes must appear: all-zero and all-ones codes */
                codes[0] = 0;
                codes[count - 1] = (uint8_t)((1u << bits) - 1);
                for (size_t i = 0; i <= words; i++) w[i] = 0xDEADBEEFu; /* poison, plus a canary past the end */
                memset(back, 0xFF, count);

                CHECK_OK(qmm_pack(codes, rows, cols, bits, w));
                reference_pack(codes, rows, cols, bits, expected);
                CHECK(memcmp(w, expected, words * sizeof *w) == 0,
                      "qmm_pack bits=%d rows=%zu cols=%zu differs from the bit-by-bit stream", bits, rows, cols);
                CHECK(w[words] == 0xDEADBEEFu, "qmm_pack bits=%d wrote past the end", bits);

                CHECK_OK(qmm_unpack(w, rows, cols, bits, back));
                CHECK(memcmp(codes, back, count) == 0, "unpack(pack(codes)) != codes for bits=%d rows=%zu cols=%zu",
                      bits, rows, cols);

                /* the shared helper the kernels use reads the same stream */
                size_t code_at_wrong = 0, words_per_row = cols * (size_t)bits / 32;
                for (size_t r = 0; r < rows; r++)
                    for (size_t j = 0; j < cols; j++)
                        if (qmm_code_at(w + r * words_per_row, j, bits) != codes[r * cols + j]) code_at_wrong++;
                CHECK(code_at_wrong == 0, "qmm_code_at disagrees with qmm_pack in %zu codes (bits=%d)", code_at_wrong,
                      bits);

                /* qmm_widen_codes (a backend's stored width): the same codes in every wider width's rows */
                for (size_t wb = b; wb < sizeof all_bits / sizeof all_bits[0]; wb++) {
                    const int wide_bits = all_bits[wb];
                    if (cols * (size_t)wide_bits % 32 != 0) continue;
                    uint32_t *wide = NULL;
                    CHECK_OK(qmm_widen_codes(w, rows, cols, bits, wide_bits, &wide));
                    if (!wide) continue;
                    const size_t wide_words = cols * (size_t)wide_bits / 32;
                    size_t wrong = 0;
                    for (size_t r = 0; r < rows; r++)
                        for (size_t j = 0; j < cols; j++)
                            if (qmm_code_at(wide + r * wide_words, j, wide_bits) != codes[r * cols + j]) wrong++;
                    CHECK(wrong == 0, "qmm_widen_codes %d → %d bits rows=%zu cols=%zu: %zu codes differ", bits,
                          wide_bits, rows, cols, wrong);
                    free(wide);
                }
                free(codes), free(back), free(w), free(expected);
            }
        }
    }
}

/* qmm_pack and qmm_unpack with overlapping arrays (in place, and the output shifted either way inside one buffer): the
 * words and codes of the separate-array calls. A break-it helper found qmm_convert's in-place widening wrong; unpack,
 * whose codes are wider than their stream, was wrong in place too (status OK) until both read a copy. */
static void test_pack_overlap(void) {
    check_rng rng = check_rng_make(33);
    enum { ROWS = 3, COLS = 64 };
    for (size_t b = 0; b < sizeof all_bits / sizeof all_bits[0]; b++) {
        const int bits = all_bits[b];
        const size_t words = ROWS * (COLS * (size_t)bits / 32);
        uint8_t codes[ROWS * COLS];
        uint32_t w[ROWS * COLS / 4];
        for (size_t i = 0; i < ROWS * COLS; i++) codes[i] = (uint8_t)(check_rng_next(&rng) & ((1u << bits) - 1));
        CHECK_OK(qmm_pack(codes, ROWS, COLS, bits, w));
        for (int offset = -16; offset <= 16; offset += 4) {
            _Alignas(4) uint8_t buffer[ROWS * COLS + 64];
            uint8_t *in = buffer + 24, *out = in + offset;
            memcpy(in, codes, sizeof codes);
            CHECK_OK(qmm_pack(in, ROWS, COLS, bits, (uint32_t *)out));
            CHECK(memcmp(out, w, words * 4) == 0, "qmm_pack bits=%d, w at codes %+d bytes: other words", bits, offset);
            memcpy(in, w, words * 4);
            CHECK_OK(qmm_unpack((const uint32_t *)in, ROWS, COLS, bits, out));
            CHECK(memcmp(out, codes, sizeof codes) == 0, "qmm_unpack bits=%d, codes at w %+d bytes: other codes", bits,
                  offset);
        }
    }
}

static void test_hand_worked(void) {
    /* 3 bits, codes 0,1,...,7 repeated four times (32 codes = 96 bits = 3 words). Eight codes fill 24 bits:
     * 7<<21 | 6<<18 | 5<<15 | 4<<12 | 3<<9 | 2<<6 | 1<<3 | 0 = 0xFAC688, so the stream is 0xFAC688 four times,
     * 0xFAC688_FAC688_FAC688_FAC688, cut into little-endian words from the bottom:
     *   word 0 = 0x88FAC688: codes 0..9, then the low two bits of code 10 (2 = 0b010 -> bits 30,31 = 0,1)
     *   word 1 = 0xC688FAC6: the top bit of code 10 (0), codes 11..20, the low bit of code 21 (5 -> 1)
     *   word 2 = 0xFAC688FA: the top two bits of code 21 (5>>1 = 0b10), codes 22..31. */
    uint8_t codes3[32];
    for (int j = 0; j < 32; j++) codes3[j] = (uint8_t)(j % 8);
    const uint32_t words3[3] = {0x88FAC688u, 0xC688FAC6u, 0xFAC688FAu};
    uint32_t w[6];
    uint8_t back[32];
    CHECK_OK(qmm_pack(codes3, 1, 32, 3, w));
    CHECK(w[0] == words3[0] && w[1] == words3[1] && w[2] == words3[2], "3-bit words %08x %08x %08x, want %08x %08x %08x",
          w[0], w[1], w[2], words3[0], words3[1], words3[2]);
    memset(back, 0xFF, sizeof back);
    CHECK_OK(qmm_unpack(words3, 1, 32, 3, back));
    CHECK(memcmp(back, codes3, 32) == 0, "3-bit hand-worked words unpack to 0..7 repeated");

    /* 6 bits, 16 codes = 96 bits = 3 words:
     *   codes 1, 2, 3, 4, 5, 63, 6, 7, 8, 9, 62, 10, 11, 12, 13, 14
     * code 5 (63) sits at stream bits 30..35 and code 10 (62) at bits 60..65: both straddle words.
     *   word 0 = 1 | 2<<6 | 3<<12 | 4<<18 | 5<<24 | (63 & 3)<<30                 = 0xC5103081
     *   word 1 = (63 >> 2) | 6<<4 | 7<<10 | 8<<16 | 9<<22 | (62 & 15)<<28       = 0xE2481C6F
     *   word 2 = (62 >> 4) | 10<<2 | 11<<8 | 12<<14 | 13<<20 | 14<<26           = 0x38D30B2B
     * Two rows: the second row repeats the first, so the row stride is exercised too. (Both examples were
     * confirmed with mx.dequantize(scale 1, bias 0) during development.) */
    const uint8_t row6[16] = {1, 2, 3, 4, 5, 63, 6, 7, 8, 9, 62, 10, 11, 12, 13, 14};
    uint8_t codes6[64];
    for (int j = 0; j < 64; j++) codes6[j] = row6[j % 16];
    const uint32_t words6[3] = {0xC5103081u, 0xE2481C6Fu, 0x38D30B2Bu};
    uint32_t w6[12];
    CHECK_OK(qmm_pack(codes6, 2, 32, 6, w6));
    int wrong = 0;
    for (int i = 0; i < 12; i++) wrong += w6[i] != words6[i % 3];
    CHECK(wrong == 0, "6-bit words: %d of 12 differ (first row %08x %08x %08x)", wrong, w6[0], w6[1], w6[2]);
    uint8_t back6[64];
    CHECK_OK(qmm_unpack(w6, 2, 32, 6, back6));
    CHECK(memcmp(back6, codes6, 64) == 0, "6-bit words unpack to the codes");
    CHECK(qmm_code_at(words6, 5, 6) == 63 && qmm_code_at(words6, 10, 6) == 62, "qmm_code_at reads straddling codes");
}

static void test_pack_bad_input(void) {
    uint8_t codes[256] = {0};
    uint32_t w[64];
    /* unsupported widths */
    const int bad_bits[] = {0, 1, 7, 9, 16, 32, -4};
    for (size_t i = 0; i < sizeof bad_bits / sizeof bad_bits[0]; i++) {
        EXPECT_FAIL(qmm_pack(codes, 1, 32, bad_bits[i], w), QMM_ERR_FORMAT);
        EXPECT_FAIL(qmm_unpack(w, 1, 32, bad_bits[i], codes), QMM_ERR_FORMAT);
    }
    EXPECT_FAIL(qmm_pack(codes, 1, 32, 7, w), QMM_ERR_FORMAT);
    EXPECT_MESSAGE("bits=7");

    /* a row that does not end on a word boundary */
    EXPECT_FAIL(qmm_pack(codes, 1, 33, 4, w), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("cols=33");
    EXPECT_FAIL(qmm_unpack(w, 2, 48, 3, codes), QMM_ERR_SHAPE);
    EXPECT_FAIL(qmm_pack(codes, 1, 6, 8, w), QMM_ERR_SHAPE);
    CHECK_OK(qmm_pack(codes, 1, 4, 8, w)); /* 4·8 = 32: one whole word, allowed */

    /* a code that does not fit: nothing is written */
    for (size_t b = 0; b < sizeof all_bits / sizeof all_bits[0]; b++) {
        int bits = all_bits[b];
        if (bits == 8) continue; /* every uint8_t fits in 8 bits */
        memset(codes, 0, sizeof codes);
        codes[32 + 17] = (uint8_t)(1u << bits); /* row 1, column 17 */
        for (int i = 0; i < 64; i++) w[i] = 0xDEADBEEFu;
        EXPECT_FAIL(qmm_pack(codes, 2, 32, bits, w), QMM_ERR_INVALID_ARGUMENT);
        EXPECT_MESSAGE("row 1, column 17");
        int touched = 0;
        for (int i = 0; i < 64; i++) touched += w[i] != 0xDEADBEEFu;
        CHECK(touched == 0, "qmm_pack bits=%d wrote %d words before failing on a bad code", bits, touched);
    }
    memset(codes, 0, sizeof codes);

    /* null pointers */
    EXPECT_FAIL(qmm_pack(NULL, 1, 32, 4, w), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("codes");
    EXPECT_FAIL(qmm_pack(codes, 1, 32, 4, NULL), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_FAIL(qmm_unpack(NULL, 1, 32, 4, codes), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_FAIL(qmm_unpack(w, 1, 32, 4, NULL), QMM_ERR_INVALID_ARGUMENT);

    /* rows·cols overflows size_t (checked before any memory is touched) */
    EXPECT_FAIL(qmm_pack(codes, SIZE_MAX / 16, 64, 4, w), QMM_ERR_OVERFLOW);
    EXPECT_FAIL(qmm_unpack(w, SIZE_MAX / 16, 64, 4, codes), QMM_ERR_OVERFLOW);
    EXPECT_FAIL(qmm_pack(codes, 2, SIZE_MAX / 2 + 1 - ((SIZE_MAX / 2 + 1) % 32), 8, w), QMM_ERR_OVERFLOW);
}

static void test_qmatrix_validate(void) {
    uint32_t w[64] = {0};
    uint16_t scales[8] = {0}, biases[8] = {0};
    const qmm_qmatrix good = {w, scales, biases, QMM_F16, 2, 128, 4, 64};
    CHECK_OK(qmm_qmatrix_validate(&good));
    for (size_t b = 0; b < 6; b++)
        for (size_t g = 0; g < 3; g++) {
            qmm_qmatrix m = good;
            m.bits = all_bits[b];
            m.group_size = all_group_sizes[g];
            m.rows = 1;
            CHECK_OK(qmm_qmatrix_validate(&m));
        }

    qmm_qmatrix m;
    EXPECT_FAIL(qmm_qmatrix_validate(NULL), QMM_ERR_INVALID_ARGUMENT);

    m = good, m.bits = 7;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_FORMAT);
    EXPECT_MESSAGE("bits=7");
    m = good, m.group_size = 16;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_FORMAT);
    EXPECT_MESSAGE("group_size=16");

    m = good, m.cols = 576, m.group_size = 128;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_SHAPE);
    EXPECT_MESSAGE("576");
    EXPECT_MESSAGE("group_size=128");
    m = good, m.rows = 0;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_SHAPE);
    m = good, m.cols = 0;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_SHAPE);

    m = good, m.dtype = QMM_U8;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("u8");
    m = good, m.dtype = (qmm_dtype)42;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_INVALID_ARGUMENT);

    m = good, m.w = NULL;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("w (packed codes)");
    /* uint32 words at an address that is not a multiple of 4: refused before anything reads them */
    m = good, m.w = (const uint32_t *)((const char *)w + 1);
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not 4-byte aligned");
    uint8_t codes[128];
    EXPECT_FAIL(qmm_unpack((const uint32_t *)((const char *)w + 2), 1, 128, 4, codes), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not 4-byte aligned");
    memset(codes, 0, sizeof codes);
    EXPECT_FAIL(qmm_pack(codes, 1, 128, 4, (uint32_t *)((char *)w + 3)), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("qmm_pack: w at");
    EXPECT_MESSAGE("not 4-byte aligned");
    m = good, m.scales = NULL;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("scales");
    m = good, m.biases = NULL;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("biases");

    /* sizes that overflow size_t: rows·cols, and the byte size of the unpacked matrix */
    m = good, m.rows = SIZE_MAX / 64, m.cols = 128;
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_OVERFLOW);
    m = good, m.rows = SIZE_MAX / 256, m.cols = 128; /* rows·cols fits, its bytes do not */
    EXPECT_FAIL(qmm_qmatrix_validate(&m), QMM_ERR_OVERFLOW);
}

int main(void) {
    test_format_validate();
    test_sizes();
    test_round_trip();
    test_pack_overlap();
    test_hand_worked();
    test_pack_bad_input();
    test_qmatrix_validate();
    return check_finish("test_format");
}
