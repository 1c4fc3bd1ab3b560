/*
 * test_dtype.c — f16/bf16 <-> f32 conversion (exhaustive over all 65536 bit patterns), round to nearest even
 * on constructed halfway values, NaN, subnormals, overflow, and qmm_convert.
 * The expected values are computed independently (ldexp on the fields, midpoints in double), not by the
 * functions under test.
 */
#include "check.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t f32_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static float f32_from_bits(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* The value of an f16 bit pattern from its fields (IEEE binary16: 1 sign, 5 exponent, 10 fraction bits). */
static double f16_value(uint16_t h) {
    int exponent = (h >> 10) & 0x1F;
    int fraction = h & 0x3FF;
    double magnitude;
    if (exponent == 0x1F) magnitude = fraction ? NAN : INFINITY;
    else if (exponent == 0) magnitude = ldexp(fraction, -24);
    else magnitude = ldexp(1024 + fraction, exponent - 25);
    return (h & 0x8000) ? -magnitude : magnitude;
}

static bool is_f16_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }
static bool is_bf16_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); }

static void test_f16_exhaustive(void) {
    unsigned value_errors = 0, roundtrip_errors = 0, first_value = 0, first_roundtrip = 0;
    for (unsigned h = 0; h < 65536; h++) {
        float widened = qmm_f16_to_f32((uint16_t)h);
        double expected = f16_value((uint16_t)h);
        bool value_ok;
        if (isnan(expected)) value_ok = isnan(widened) && (signbit(widened) != 0) == ((h & 0x8000) != 0);
        else value_ok = (double)widened == expected && (signbit(widened) != 0) == ((h & 0x8000) != 0);
        if (!value_ok && value_errors++ == 0) first_value = h;

        uint16_t back = qmm_f32_to_f16(widened);
        bool roundtrip_ok = is_f16_nan((uint16_t)h) ? is_f16_nan(back) && (back & 0x8000) == (h & 0x8000)
                                                    : back == h;
        if (!roundtrip_ok && roundtrip_errors++ == 0) first_roundtrip = h;
    }
    CHECK(value_errors == 0, "f16 -> f32: %u patterns decode wrongly, first 0x%04x -> %a", value_errors, first_value,
          (double)qmm_f16_to_f32((uint16_t)first_value));
    CHECK(roundtrip_errors == 0, "f16 -> f32 -> f16: %u patterns change, first 0x%04x -> 0x%04x", roundtrip_errors,
          first_roundtrip, qmm_f32_to_f16(qmm_f16_to_f32((uint16_t)first_roundtrip)));
}

static void test_bf16_exhaustive(void) {
    unsigned value_errors = 0, roundtrip_errors = 0, first_value = 0, first_roundtrip = 0;
    for (unsigned h = 0; h < 65536; h++) {
        float widened = qmm_bf16_to_f32((uint16_t)h);
        /* bfloat16 is the top half of binary32: widening is exactly a 16-bit shift, NaN payloads included */
        if (f32_bits(widened) != (uint32_t)h << 16 && value_errors++ == 0) first_value = h;
        uint16_t back = qmm_f32_to_bf16(widened);
        bool roundtrip_ok = is_bf16_nan((uint16_t)h) ? is_bf16_nan(back) && (back & 0x8000) == (h & 0x8000)
                                                     : back == h;
        if (!roundtrip_ok && roundtrip_errors++ == 0) first_roundtrip = h;
    }
    CHECK(value_errors == 0, "bf16 -> f32: %u patterns wrong, first 0x%04x", value_errors, first_value);
    CHECK(roundtrip_errors == 0, "bf16 -> f32 -> bf16: %u patterns change, first 0x%04x -> 0x%04x", roundtrip_errors,
          first_roundtrip, qmm_f32_to_bf16(qmm_bf16_to_f32((uint16_t)first_roundtrip)));
}

/* For every pair of neighbouring finite f16 values lo < hi (both signs, subnormals and the normal boundary
 * included): the exact midpoint rounds to the even one of the two, and the f32 values just below and just
 * above the midpoint round to lo and hi. The midpoint has at most 12 significant bits, so it is exact in f32. */
static void test_f16_ties(void) {
    unsigned errors = 0;
    uint32_t first = 0;
    for (unsigned magnitude = 0; magnitude < 0x7BFF; magnitude++) {
        for (unsigned sign = 0; sign <= 0x8000; sign += 0x8000) {
            uint16_t lo = (uint16_t)(sign | magnitude), hi = (uint16_t)(sign | (magnitude + 1));
            double mid = (f16_value(lo) + f16_value(hi)) / 2;
            float mid32 = (float)mid;
            if ((double)mid32 != mid) { errors++; continue; }
            uint16_t even = (magnitude & 1) ? hi : lo;
            float toward_lo = nextafterf(mid32, (float)f16_value(lo));
            float toward_hi = nextafterf(mid32, (float)f16_value(hi));
            if (qmm_f32_to_f16(mid32) != even || qmm_f32_to_f16(toward_lo) != lo || qmm_f32_to_f16(toward_hi) != hi) {
                if (errors++ == 0) first = f32_bits(mid32);
            }
        }
    }
    CHECK(errors == 0, "f16 round to nearest even: %u neighbour pairs wrong, first midpoint %a -> 0x%04x", errors,
          (double)f32_from_bits(first), qmm_f32_to_f16(f32_from_bits(first)));

    /* Hand-picked cases, each with its reason. */
    CHECK(qmm_f32_to_f16(1.0f + 0x1p-11f) == 0x3C00, "1 + half ulp ties to even 1.0 (0x3C00)");
    CHECK(qmm_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3C02, "1 + 3 half ulps ties to even 0x3C02");
    CHECK(qmm_f32_to_f16(0x1p-25f) == 0x0000, "half the smallest subnormal ties to +0");
    CHECK(qmm_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001, "just above half the smallest subnormal -> 0x0001");
    CHECK(qmm_f32_to_f16(-0x1p-26f) == 0x8000, "a quarter of the smallest subnormal -> -0 (sign kept)");
    CHECK(qmm_f32_to_f16(3 * 0x1p-25f) == 0x0002, "1.5 subnormal ulps ties to even 0x0002");
    CHECK(qmm_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400, "largest subnormal + half ulp ties up into the smallest normal");
    CHECK(qmm_f32_to_f16(0x1p-24f) == 0x0001 && qmm_f32_to_f16(0x1p-14f) == 0x0400, "exact subnormal / normal boundary");
    CHECK(qmm_f32_to_f16(FLT_TRUE_MIN) == 0x0000, "f32 subnormals underflow to 0 in f16");
}

static void test_bf16_ties(void) {
    unsigned errors = 0;
    uint32_t first = 0;
    for (uint32_t magnitude = 0; magnitude < 0x7F7F; magnitude++) {
        for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
            uint16_t lo = (uint16_t)(sign | magnitude), hi = (uint16_t)(sign | (magnitude + 1));
            /* Between lo<<16 and hi<<16 every f32 has lo's exponent, so the bit pattern halfway is the value
             * halfway. */
            uint32_t mid_bits = ((uint32_t)lo << 16) + 0x8000u;
            uint16_t even = (magnitude & 1) ? hi : lo;
            if (qmm_f32_to_bf16(f32_from_bits(mid_bits)) != even || qmm_f32_to_bf16(f32_from_bits(mid_bits - 1)) != lo ||
                qmm_f32_to_bf16(f32_from_bits(mid_bits + 1)) != hi) {
                if (errors++ == 0) first = mid_bits;
            }
        }
    }
    CHECK(errors == 0, "bf16 round to nearest even: %u neighbour pairs wrong, first midpoint 0x%08x -> 0x%04x", errors,
          first, qmm_f32_to_bf16(f32_from_bits(first)));
    CHECK(qmm_f32_to_bf16(1.0f + 0x1p-8f) == 0x3F80, "1 + half bf16 ulp ties to even 1.0");
    CHECK(qmm_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3F82, "1 + 3 half ulps ties to even 0x3F82");
    CHECK(qmm_f32_to_bf16(FLT_TRUE_MIN) == 0x0000, "the smallest f32 subnormal rounds to +0 in bf16");
    CHECK(qmm_f32_to_bf16(f32_from_bits(0x00008001u)) == 0x0001, "f32 subnormal above half a bf16 ulp rounds up");
}

static void test_nan_and_overflow(void) {
    /* NaN stays NaN (quiet), sign kept — including payloads only in the low bits that a plain truncation
     * would turn into Inf. */
    const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FBFFFFFu, 0x7F802000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        float nan = f32_from_bits(nans[i]);
        uint16_t h = qmm_f32_to_f16(nan), b = qmm_f32_to_bf16(nan);
        bool negative = (nans[i] >> 31) != 0;
        CHECK(is_f16_nan(h) && (h & 0x200) && ((h & 0x8000) != 0) == negative,
              "f32 NaN 0x%08x -> f16 0x%04x must be a quiet NaN with the same sign", nans[i], h);
        CHECK(is_bf16_nan(b) && (b & 0x40) && ((b & 0x8000) != 0) == negative,
              "f32 NaN 0x%08x -> bf16 0x%04x must be a quiet NaN with the same sign", nans[i], b);
    }
    CHECK(isnan(qmm_f16_to_f32(0x7C01)) && isnan(qmm_f16_to_f32(0xFE00)) && signbit(qmm_f16_to_f32(0xFE00)),
          "f16 NaNs widen to NaN with sign");

    /* Overflow: f16 max is 65504; 65520 is exactly halfway to 65536 (= Inf) and ties to even, i.e. Inf. */
    CHECK(qmm_f32_to_f16(65504.0f) == 0x7BFF, "65504 is f16 max");
    CHECK(qmm_f32_to_f16(nextafterf(65520.0f, 0.0f)) == 0x7BFF, "just below 65520 rounds to max");
    CHECK(qmm_f32_to_f16(65520.0f) == 0x7C00, "65520 rounds to +Inf");
    CHECK(qmm_f32_to_f16(-1e6f) == 0xFC00, "-1e6 overflows to -Inf");
    CHECK(qmm_f32_to_f16(FLT_MAX) == 0x7C00 && qmm_f32_to_f16(INFINITY) == 0x7C00 && qmm_f32_to_f16(-INFINITY) == 0xFC00,
          "FLT_MAX and Inf go to Inf in f16");
    CHECK(qmm_f32_to_bf16(FLT_MAX) == 0x7F80, "FLT_MAX is above bf16 max + half ulp: +Inf");
    CHECK(qmm_f32_to_bf16(f32_from_bits(0x7F7F7FFFu)) == 0x7F7F, "just below the bf16 overflow midpoint stays finite");
    CHECK(qmm_f32_to_bf16(-INFINITY) == 0xFF80 && qmm_f32_to_bf16(INFINITY) == 0x7F80, "Inf stays Inf in bf16");
    CHECK(qmm_f32_to_f16(-0.0f) == 0x8000 && qmm_f32_to_bf16(-0.0f) == 0x8000, "-0 keeps its sign");
}

static void test_convert(void) {
    check_rng rng = check_rng_make(11);
    const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    enum { COUNT = 1000 };
    float source[COUNT];
    for (int i = 0; i < COUNT; i++) {
        /* wide magnitudes: subnormal to overflow in f16, both signs */
        source[i] = ldexpf(check_rng_uniform(&rng, -1.0f, 1.0f), (int)(check_rng_next(&rng) % 80) - 40);
    }
    source[0] = NAN;
    source[1] = -INFINITY;
    source[2] = -0.0f;
    source[3] = 1e-30f;
    for (int s = 0; s < 3; s++) {
        for (int d = 0; d < 3; d++) {
            qmm_dtype from = dtypes[s], to = dtypes[d];
            /* the source array in `from`, built element-wise with the scalar functions */
            uint8_t src[COUNT * 4], dst[COUNT * 4 + 4];
            for (int i = 0; i < COUNT; i++) {
                if (from == QMM_F16) ((uint16_t *)src)[i] = qmm_f32_to_f16(source[i]);
                else if (from == QMM_BF16) ((uint16_t *)src)[i] = qmm_f32_to_bf16(source[i]);
                else ((float *)src)[i] = source[i];
            }
            memset(dst, 0xA5, sizeof dst);
            CHECK_OK(qmm_convert(src, from, dst, to, COUNT));
            int wrong = 0;
            for (int i = 0; i < COUNT; i++) {
                float value = from == QMM_F16 ? qmm_f16_to_f32(((uint16_t *)src)[i])
                              : from == QMM_BF16 ? qmm_bf16_to_f32(((uint16_t *)src)[i])
                                                 : ((float *)src)[i];
                bool ok;
                if (to == QMM_F16) {
                    uint16_t want = qmm_f32_to_f16(value), got = ((uint16_t *)dst)[i];
                    ok = is_f16_nan(want) ? is_f16_nan(got) : got == want;
                } else if (to == QMM_BF16) {
                    uint16_t want = qmm_f32_to_bf16(value), got = ((uint16_t *)dst)[i];
                    ok = is_bf16_nan(want) ? is_bf16_nan(got) : got == want;
                } else {
                    float got = ((float *)dst)[i];
                    ok = isnan(value) ? isnan(got) : f32_bits(got) == f32_bits(value);
                }
                if (!ok) wrong++;
            }
            CHECK(wrong == 0, "qmm_convert %s -> %s: %d of %d elements differ from the scalar conversion",
                  qmm_dtype_name(from), qmm_dtype_name(to), wrong, COUNT);
            size_t size = qmm_dtype_size(to);
            CHECK(dst[COUNT * size] == 0xA5, "qmm_convert %s -> %s wrote past count", qmm_dtype_name(from),
                  qmm_dtype_name(to));
        }
    }

    float one = 1.0f;
    uint16_t half = 0;
    CHECK_OK(qmm_convert(NULL, QMM_F32, NULL, QMM_F16, 0));
    CHECK_STATUS(qmm_convert(NULL, QMM_F32, &half, QMM_F16, 1), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_convert(&one, QMM_F32, NULL, QMM_F16, 1), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_convert(&one, QMM_I32, &half, QMM_F16, 1), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_convert(&one, QMM_F32, &half, QMM_U8, 1), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_convert(&one, (qmm_dtype)99, &half, QMM_F16, 1), QMM_ERR_INVALID_ARGUMENT);
    /* a count whose destination bytes fit but whose (wider) source bytes do not: an overflow, not a wild read */
    CHECK_STATUS(qmm_convert(&one, QMM_F32, &half, QMM_BF16, SIZE_MAX / 3), QMM_ERR_OVERFLOW);
    CHECK(strstr(qmm_last_error(), "elements of f32 overflow") != NULL, "message names the source: %s", qmm_last_error());
    CHECK_STATUS(qmm_convert(&half, QMM_F16, &one, QMM_F32, SIZE_MAX / 3), QMM_ERR_OVERFLOW);

    /* Overlapping arrays (found by a break-it helper: f16 -> f32 in place read halves it had already overwritten):
     * every pair of distinct dtypes, dst at byte offsets -16 … +16 from src inside one buffer — in place, shifted
     * either way, narrower and wider — gives the bits of the same conversion between separate arrays. */
    enum { N_OVERLAP = 37 };
    float values[N_OVERLAP];
    for (int i = 0; i < N_OVERLAP; i++) values[i] = (float)(i - 18) * 0.37f + (i % 5 == 0 ? 1e-6f : 0.0f);
    for (int s = 0; s < 3; s++) {
        for (int d = 0; d < 3; d++) {
            if (s == d) continue;
            qmm_dtype from = dtypes[s], to = dtypes[d];
            uint8_t packed[N_OVERLAP * 4], expected[N_OVERLAP * 4];
            CHECK_OK(qmm_convert(values, QMM_F32, packed, from, N_OVERLAP));
            CHECK_OK(qmm_convert(packed, from, expected, to, N_OVERLAP));
            const size_t out_bytes = N_OVERLAP * qmm_dtype_size(to), in_bytes = N_OVERLAP * qmm_dtype_size(from);
            for (int offset = -16; offset <= 16; offset += 4) {
                _Alignas(4) uint8_t buffer[N_OVERLAP * 4 + 64];
                memset(buffer, 0x5A, sizeof buffer);
                uint8_t *in = buffer + 24, *out = in + offset;
                memcpy(in, packed, in_bytes);
                CHECK_OK(qmm_convert(in, from, out, to, N_OVERLAP));
                CHECK(memcmp(out, expected, out_bytes) == 0, "qmm_convert %s -> %s with dst at src %+d bytes: other bits",
                      qmm_dtype_name(from), qmm_dtype_name(to), offset);
            }
        }
    }
}

static void test_dtype_names(void) {
    CHECK(qmm_dtype_size(QMM_F32) == 4 && qmm_dtype_size(QMM_F16) == 2 && qmm_dtype_size(QMM_BF16) == 2 &&
              qmm_dtype_size(QMM_U32) == 4 && qmm_dtype_size((qmm_dtype)99) == 0,
          "dtype sizes");
    for (int i = 0; i < QMM_DTYPE_COUNT; i++) {
        qmm_dtype parsed = QMM_DTYPE_COUNT;
        CHECK_OK(qmm_dtype_parse(qmm_dtype_name((qmm_dtype)i), &parsed));
        CHECK(parsed == (qmm_dtype)i, "dtype %d name %s parses back to %d", i, qmm_dtype_name((qmm_dtype)i), (int)parsed);
    }
    qmm_dtype parsed;
    CHECK_OK(qmm_dtype_parse("bfloat16", &parsed));
    CHECK(parsed == QMM_BF16, "bfloat16 alias");
    CHECK_STATUS(qmm_dtype_parse("float8", &parsed), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(qmm_last_error(), "float16") != NULL, "the refusal lists the long names: %s", qmm_last_error());
    /* the caller's bytes go into the message escaped: no raw control byte or invalid UTF-8 */
    CHECK_STATUS(qmm_dtype_parse("\x1b[31mX\xff\xfe", &parsed), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strchr(qmm_last_error(), 0x1b) == NULL && strchr(qmm_last_error(), (char)0xff) == NULL,
          "escaped: %s", qmm_last_error());
    CHECK_STATUS(qmm_dtype_parse(NULL, &parsed), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(qmm_dtype_name((qmm_dtype)-1), "?") == 0, "unknown dtype name is ?");
}

int main(void) {
    test_f16_exhaustive();
    test_bf16_exhaustive();
    test_f16_ties();
    test_bf16_ties();
    test_nan_and_overflow();
    test_convert();
    test_dtype_names();
    return check_finish("test_dtype");
}
