/*
 * format.c — the affine format: validation, sizes, and bit packing for every width (DESIGN.md §1).
 *
 * Each row of w is one little-endian, least-significant-bit-first bit stream: code j occupies stream
 * bits [j·bits, (j+1)·bits) and word t holds stream bits [32t, 32t+32). For 2, 4 and 8 bits a word holds
 * whole codes; for 3, 5 and 6 bits a code may straddle two words (never a group boundary, because
 * group_size·bits is a multiple of 32). This is byte for byte what MLX writes: its CPU quantizer packs
 * 3/5/6-bit codes LSB-first into 3- or 5-byte packs (mlx/backend/cpu/quantized.cpp, quantize()), which on
 * a little-endian machine is the same stream.
 *
 * Packing and unpacking move through a row with a 64-bit bit buffer: codes are shifted in (or out) and a
 * whole 32-bit word is written (or read) whenever 32 bits are ready, so no code is assembled from two
 * separate reads and the loop costs a shift, an or and a mask per code.
 */
#include "internal.h"

#include <stdlib.h>

static const char allowed_bits[] = "{2, 3, 4, 5, 6, 8}";
static const char allowed_group_sizes[] = "{32, 64, 128}";

static bool bits_supported(int bits) {
    return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

static bool group_size_supported(int group_size) {
    return group_size == 32 || group_size == 64 || group_size == 128;
}

qmm_status qmm_format_validate(int bits, int group_size) {
    if (!bits_supported(bits))
        return qmm_error(QMM_ERR_FORMAT, "bits=%d is not supported (allowed: %s)", bits, allowed_bits);
    if (!group_size_supported(group_size))
        return qmm_error(QMM_ERR_FORMAT, "group_size=%d is not supported (allowed: %s)", group_size,
                         allowed_group_sizes);
    return QMM_OK;
}

size_t qmm_packed_words(size_t cols, int bits) {
    if (bits <= 0 || bits > 32) return 0;
    /* cols = 32a + r  =>  cols·bits/32 = a·bits + r·bits/32, computed without forming cols·bits (which could
     * overflow for a huge cols); exact whenever cols·bits is a multiple of 32. */
    return (cols / 32) * (size_t)bits + ((cols % 32) * (size_t)bits) / 32;
}

size_t qmm_groups(size_t cols, int group_size) {
    if (group_size <= 0) return 0;
    return cols / (size_t)group_size;
}

qmm_status qmm_qmatrix_bytes(const qmm_qmatrix *matrix, size_t *w_bytes, size_t *group_bytes) {
    if (!matrix) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_qmatrix: matrix is NULL");
    qmm_status status = qmm_format_validate(matrix->bits, matrix->group_size);
    if (status != QMM_OK) return status;
    if (!qmm_is_float_dtype(matrix->dtype))
        return qmm_error(QMM_ERR_INVALID_ARGUMENT,
                         "scales/biases dtype %s (%d) is not supported (allowed: f32, f16, bf16)",
                         qmm_dtype_name(matrix->dtype), (int)matrix->dtype);
    if (matrix->rows == 0 || matrix->cols == 0)
        return qmm_error(QMM_ERR_SHAPE, "matrix is %zu x %zu; rows and cols must be at least 1", matrix->rows,
                         matrix->cols);
    if (matrix->cols % (size_t)matrix->group_size != 0)
        return qmm_error(QMM_ERR_SHAPE, "cols=%zu (K of a linear layer) is not a multiple of group_size=%d",
                         matrix->cols, matrix->group_size);

    /* Byte sizes of the three arrays (and of the unpacked matrix, which dequantize and the oracles form)
     * must fit in size_t. */
    size_t words = qmm_packed_words(matrix->cols, matrix->bits);
    size_t groups = qmm_groups(matrix->cols, matrix->group_size);
    size_t count, bytes, packed_bytes, scale_bytes;
    if (!qmm_mul_size(matrix->rows, matrix->cols, &count) || !qmm_mul_size(count, sizeof(float), &bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "rows=%zu x cols=%zu elements, as f32 (the unpacked matrix), overflow a "
                         "byte count in size_t", matrix->rows, matrix->cols);
    if (!qmm_mul_size(matrix->rows, words, &count) || !qmm_mul_size(count, sizeof(uint32_t), &packed_bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "packed weights of rows=%zu x %zu words overflow size_t", matrix->rows,
                         words);
    if (!qmm_mul_size(matrix->rows, groups, &count) ||
        !qmm_mul_size(count, qmm_dtype_size(matrix->dtype), &scale_bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "scales of rows=%zu x %zu groups overflow size_t", matrix->rows, groups);
    if (w_bytes) *w_bytes = packed_bytes;
    if (group_bytes) *group_bytes = scale_bytes;
    return QMM_OK;
}

qmm_status qmm_check_u32_aligned(const char *function, const char *name, const void *p) {
    if ((uintptr_t)p % sizeof(uint32_t) == 0) return QMM_OK;
    return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: %s at %p is not 4-byte aligned (uint32 values must be)", function,
                     name, p);
}

qmm_status qmm_qmatrix_validate(const qmm_qmatrix *matrix) {
    qmm_status status = qmm_qmatrix_bytes(matrix, NULL, NULL);
    if (status != QMM_OK) return status;
    if (!matrix->w) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_qmatrix: w (packed codes) is NULL");
    if ((status = qmm_check_u32_aligned("qmm_qmatrix", "w (packed codes)", matrix->w)) != QMM_OK) return status;
    if (!matrix->scales) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_qmatrix: scales is NULL");
    if (!matrix->biases) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_qmatrix: biases is NULL");
    return QMM_OK;
}

qmm_status qmm_copy_if_overlapping(const char *function, const char *what, const void *in, size_t in_bytes,
                                   const void *out, size_t out_bytes, void **copy) {
    *copy = NULL;
    if (!qmm_overlap(in, in_bytes, out, out_bytes)) return QMM_OK;
    if (!(*copy = malloc(in_bytes ? in_bytes : 1)))
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "%s: %zu bytes for a copy of %s, which overlaps the output", function,
                         in_bytes, what);
    memcpy(*copy, in, in_bytes);
    return QMM_OK;
}

/* The checks qmm_pack and qmm_unpack share; w is whichever of in and out holds the uint32 words. Sets
 * *words_per_row, and *code_bytes and *word_bytes: the two arrays' sizes. */
static qmm_status check_pack_arguments(const char *function, const char *in_name, const void *in,
                                       const char *out_name, const void *out, const uint32_t *w, size_t rows,
                                       size_t cols, int bits, size_t *words_per_row, size_t *code_bytes,
                                       size_t *word_bytes) {
    if (!bits_supported(bits))
        return qmm_error(QMM_ERR_FORMAT, "%s: bits=%d is not supported (allowed: %s)", function, bits, allowed_bits);
    if (!in || !out)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: %s is NULL", function, !in ? in_name : out_name);
    qmm_status status = qmm_check_u32_aligned(function, "w", w);
    if (status != QMM_OK) return status;
    /* A row must end on a word boundary: cols·bits a multiple of 32 (cols % 32 == 0 always suffices;
     * 8-bit needs only cols % 4, 4-bit cols % 8, 2-bit cols % 16). */
    if (((cols % 32) * (size_t)bits) % 32 != 0)
        return qmm_error(QMM_ERR_SHAPE, "%s: cols=%zu x bits=%d is not a multiple of 32 (a row must fill whole words)",
                         function, cols, bits);
    if (!qmm_mul_size(rows, cols, code_bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "%s: rows=%zu x cols=%zu overflows size_t", function, rows, cols);
    *words_per_row = qmm_packed_words(cols, bits);
    size_t words;
    if (!qmm_mul_size(rows, *words_per_row, &words) || !qmm_mul_size(words, sizeof(uint32_t), word_bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "%s: rows=%zu x %zu words overflows size_t", function, rows,
                         *words_per_row);
    return QMM_OK;
}

void qmm_pack_stream(const uint8_t *codes, size_t count, int bits, uint32_t *out) {
    uint64_t buffer = 0; /* pending stream bits, LSB = the oldest */
    unsigned filled = 0; /* how many bits of buffer are pending (< 32 between codes) */
    for (size_t j = 0; j < count; j++) {
        buffer |= (uint64_t)codes[j] << filled;
        filled += (unsigned)bits;
        if (filled >= 32) {
            *out++ = (uint32_t)buffer;
            buffer >>= 32;
            filled -= 32;
        }
    }
    /* count·bits is a multiple of 32, so nothing is left over (filled == 0 here). */
}

/* Codes that never straddle two words (2, 4, 8 bits): each word's codes by constant shifts, which the compiler
 * unrolls (the portable CPU row decodes every group through here). */
#define UNPACK_WORDS(BITS)                                                                                  \
    for (size_t w = 0; w < count * (BITS) / 32; w++)                                                        \
        for (unsigned c = 0; c < 32 / (BITS); c++)                                                          \
            codes[w * (32 / (BITS)) + c] = (uint8_t)((in[w] >> ((BITS) * c)) & ((1u << (BITS)) - 1u));

void qmm_unpack_stream(const uint32_t *in, size_t count, int bits, uint8_t *codes) {
    switch (bits) {
    case 2: UNPACK_WORDS(2) return;
    case 4: UNPACK_WORDS(4) return;
    case 8: UNPACK_WORDS(8) return;
    default: break;
    }
    const uint64_t mask = ((uint64_t)1 << bits) - 1u;
    uint64_t buffer = 0;
    unsigned available = 0; /* unread stream bits in buffer */
    for (size_t j = 0; j < count; j++) {
        if (available < (unsigned)bits) { /* the code reaches into the next word: append it above */
            buffer |= (uint64_t)(*in++) << available;
            available += 32;
        }
        codes[j] = (uint8_t)(buffer & mask);
        buffer >>= bits;
        available -= (unsigned)bits;
    }
}
#undef UNPACK_WORDS

qmm_status qmm_pack(const uint8_t *codes, size_t rows, size_t cols, int bits, uint32_t *w) {
    size_t words_per_row = 0, code_bytes = 0, word_bytes = 0;
    qmm_status status = check_pack_arguments("qmm_pack", "codes", codes, "w", w, w, rows, cols, bits, &words_per_row,
                                             &code_bytes, &word_bytes);
    if (status != QMM_OK) return status;

    /* Every code must fit in `bits` bits; check all before writing anything, so a failed call leaves w
     * untouched. OR-ing a row together finds a bad row cheaply; only then is the column searched. */
    const unsigned limit = 1u << bits;
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = codes + r * cols;
        unsigned any = 0;
        for (size_t j = 0; j < cols; j++) any |= row[j];
        if (any < limit) continue;
        for (size_t j = 0; j < cols; j++)
            if (row[j] >= limit)
                return qmm_error(QMM_ERR_INVALID_ARGUMENT,
                                 "qmm_pack: code %u at row %zu, column %zu does not fit in bits=%d (must be < %u)",
                                 row[j], r, j, bits, limit);
    }

    void *copy; /* codes overlapping w (in place): read from a copy */
    if ((status = qmm_copy_if_overlapping("qmm_pack", "codes", codes, code_bytes, w, word_bytes, &copy)) != QMM_OK)
        return status;
    if (copy) codes = copy;
    for (size_t r = 0; r < rows; r++) qmm_pack_stream(codes + r * cols, cols, bits, w + r * words_per_row);
    free(copy);
    return QMM_OK;
}

qmm_status qmm_widen_codes(const uint32_t *w, size_t rows, size_t cols, int bits, int wide_bits, uint32_t **wide) {
    *wide = NULL;
    const size_t words = qmm_packed_words(cols, bits), wide_words = qmm_packed_words(cols, wide_bits);
    size_t bytes;
    if (!qmm_mul_size(rows, wide_words, &bytes) || !qmm_mul_size(bytes, sizeof(uint32_t), &bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "%zu rows of %zu %d-bit codes overflow size_t", rows, cols, wide_bits);
    uint32_t *out = malloc(bytes ? bytes : 1);
    uint8_t *codes = malloc(cols);
    if (!out || !codes) {
        free(out);
        free(codes);
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "no host memory to store a %zu×%zu matrix's %d-bit codes as %d-bit",
                         rows, cols, bits, wide_bits);
    }
    for (size_t r = 0; r < rows; r++) {
        qmm_unpack_stream(w + r * words, cols, bits, codes);
        qmm_pack_stream(codes, cols, wide_bits, out + r * wide_words);
    }
    free(codes);
    *wide = out;
    return QMM_OK;
}

qmm_status qmm_unpack(const uint32_t *w, size_t rows, size_t cols, int bits, uint8_t *codes) {
    size_t words_per_row = 0, code_bytes = 0, word_bytes = 0;
    qmm_status status = check_pack_arguments("qmm_unpack", "w", w, "codes", codes, w, rows, cols, bits,
                                             &words_per_row, &code_bytes, &word_bytes);
    if (status != QMM_OK) return status;
    void *copy; /* w overlapping codes (in place: the codes are wider than their stream): read from a copy */
    if ((status = qmm_copy_if_overlapping("qmm_unpack", "w", w, word_bytes, codes, code_bytes, &copy)) != QMM_OK)
        return status;
    if (copy) w = copy;
    for (size_t r = 0; r < rows; r++) qmm_unpack_stream(w + r * words_per_row, cols, bits, codes + r * cols);
    free(copy);
    return QMM_OK;
}
