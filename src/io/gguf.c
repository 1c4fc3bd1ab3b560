/*
 * gguf.c — GGUF v2/v3 reading (mmap + a fully bounds-checked header walk) and exact import of F32,
 * F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q5_K tensors into the MLX affine format (DESIGN.md §1).
 *
 * File layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), all little-endian:
 *   "GGUF" | u32 version | u64 tensor_count | u64 metadata_kv_count
 *   kv:     string key | u32 value_type | value        (string = u64 length + bytes, no NUL)
 *   tensor: string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset
 *   padding to general.alignment (default 32), then the data area; offsets are relative to it.
 * ne[0] is the fastest-moving dimension (a row); qmm's row-major shape is ne reversed.
 *
 * Block formats imported (ggml-common.h block_q4_0 … block_q8_0), 32 weights per block:
 *   Q4_0: f16 d | 16 bytes                 w = d·(q − 8)
 *   Q4_1: f16 d | f16 m | 16 B             w = d·q + m
 *   Q5_0: f16 d | u32 qh | 16 B            w = d·(q − 16)
 *   Q5_1: f16 d | f16 m | u32 qh | 16 B    w = d·q + m
 *   Q8_0: f16 d | 32 × int8                w = d·i
 * In the 4- and 5-bit blocks byte j holds weight j in its low nibble and weight j + 16 in its high nibble;
 * bit j of qh is bit 4 of weight j. MLX affine w = s·q + b with q unsigned, so Q4_0 → s = d, b = −8d;
 * Q5_0 → s = d, b = −16d; Q8_0 → q = i + 128 (= byte XOR 0x80), s = d, b = −128d; Q4_1/Q5_1 → s = d, b = m,
 * all in f16 (for Q4_0/Q4_1/Q8_0 what mlx/io/gguf_quants.cpp gives, bit for bit).
 * K-quants (256-weight super-blocks of 8 sub-blocks of 32, w = d·sc·q − dmin·m): see import_k_block; they
 * import with f32 scales and biases. Q2_K, Q3_K and Q6_K (16-weight sub-blocks) and the codebook types
 * (IQ*, MXFP4, ...) have no exact affine group-of-32 form and are refused.
 */
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_MAGIC             0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS          4 /* GGML_MAX_DIMS */
#define GGUF_MAX_ARRAY_NESTING 8 /* arrays of arrays: bounded so hostile files cannot exhaust the stack */

enum gguf_value_type {
    GGUF_VALUE_U8 = 0,
    GGUF_VALUE_I8 = 1,
    GGUF_VALUE_U16 = 2,
    GGUF_VALUE_I16 = 3,
    GGUF_VALUE_U32 = 4,
    GGUF_VALUE_I32 = 5,
    GGUF_VALUE_F32 = 6,
    GGUF_VALUE_BOOL = 7,
    GGUF_VALUE_STRING = 8,
    GGUF_VALUE_ARRAY = 9,
    GGUF_VALUE_U64 = 10,
    GGUF_VALUE_I64 = 11,
    GGUF_VALUE_F64 = 12,
};

/* Fixed element sizes of the scalar value types (0: not a fixed-size type). */
static size_t value_size(uint32_t type) {
    switch (type) {
    case GGUF_VALUE_U8:
    case GGUF_VALUE_I8:
    case GGUF_VALUE_BOOL: return 1;
    case GGUF_VALUE_U16:
    case GGUF_VALUE_I16: return 2;
    case GGUF_VALUE_U32:
    case GGUF_VALUE_I32:
    case GGUF_VALUE_F32: return 4;
    case GGUF_VALUE_U64:
    case GGUF_VALUE_I64:
    case GGUF_VALUE_F64: return 8;
    default: return 0;
    }
}

/* ggml_type → name, weights per block, bytes per block (ggml.c type_traits). Holes are removed types. */
typedef struct ggml_type_traits {
    const char *name;
    uint32_t block, bytes;
} ggml_type_traits;
static const ggml_type_traits ggml_types[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},      [3] = {"Q4_1", 32, 20},
    [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},      [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", 256, 84},    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66}, [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},   [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},   [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},        [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},   [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},
    [40] = {"NVFP4", 64, 36},    [41] = {"Q1_0", 128, 18},
};
#define GGML_TYPE_TABLE_SIZE (sizeof ggml_types / sizeof ggml_types[0])

static const ggml_type_traits *type_traits(uint32_t type) {
    if (type >= GGML_TYPE_TABLE_SIZE || !ggml_types[type].name) return NULL;
    return &ggml_types[type];
}

/* The MLX bit width of an importable quantized GGUF type (0: not one). */
static int import_bits(uint32_t type) {
    switch (type) {
    case QMM_GGUF_Q4_0:
    case QMM_GGUF_Q4_1:
    case QMM_GGUF_Q4_K: return 4;
    case QMM_GGUF_Q5_0:
    case QMM_GGUF_Q5_1:
    case QMM_GGUF_Q5_K: return 5;
    case QMM_GGUF_Q8_0: return 8;
    default: return 0;
    }
}

static bool importable_type(uint32_t type) {
    return type == QMM_GGUF_F32 || type == QMM_GGUF_F16 || type == QMM_GGUF_BF16 || import_bits(type) != 0;
}

#define IMPORTABLE_TYPES "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K"

/* Why a type cannot be imported (qmm_gguf_tensor_info.why_not and the refusals), or "" for an importable one. */
static const char *unsupported_why(uint32_t type) {
    if (importable_type(type)) return "";
    switch (type) {
    case 10: /* Q2_K */
    case 11: /* Q3_K */
    case 14: /* Q6_K */
        return "its sub-blocks of 16 weights have scales of their own, and an MLX group holds 32, 64 or 128";
    case 9:  /* Q8_1 */
    case 15: /* Q8_K */
        return "it is ggml's format for activations in its dot products, not for weights";
    case 16: case 17: case 18: case 19: case 20: case 21: case 22: case 23: case 29: /* IQ* */
        return "its codes index a non-uniform codebook, which no affine s·q + b expresses";
    case 39: /* MXFP4 */
    case 40: /* NVFP4 */
        return "its codes are FP4 (E2M1) values, not evenly spaced, which no affine s·q + b expresses";
    case 24: case 25: case 26: case 27: case 28: /* I8 … I64, F64 */
        return "it is an integer or f64 tensor, not a float or quantized weight type qmm reads";
    default:
        return type_traits(type) ? "qmm does not import this type yet" : "it is a type this build of qmm does not know";
    }
}
typedef struct gguf_kv {
    char *key;
    uint32_t type;
    char *string; /* the value when type is STRING */
} gguf_kv;

typedef struct gguf_tensor {
    char *name;
    uint32_t type;
    char type_name[16]; /* "Q4_1" or "type 99" */
    int ndim;
    int64_t shape[QMM_MAX_DIMS]; /* row-major */
    size_t elements;
    size_t offset; /* from the start of the data area */
    size_t nbytes; /* 0 when the type is unknown (its block size is unknown) */
} gguf_tensor;

/* Why a tensor of an importable quantized type still cannot be imported (its shape), or NULL: qmm_gguf_import's
 * shape rules, as static text for qmm_gguf_tensor_info.why_not (the import's message gives the numbers). */
static const char *shape_why(const gguf_tensor *t) {
    const ggml_type_traits *traits = type_traits(t->type);
    if (!import_bits(t->type) || !traits) return NULL; /* float tensors import whatever their shape */
    const size_t cols = t->ndim > 0 ? (size_t)t->shape[t->ndim - 1] : 1;
    if (cols == 0 || cols % traits->block != 0)
        return "its row length is not a positive multiple of its block (32 weights; 256 for K-quants)";
    if (t->elements / cols == 0) return "it has no rows";
    return NULL;
}

/* Whether qmm_gguf_import accepts the tensor's type and shape (its data may still hold a non-finite factor). */
static bool tensor_importable(const gguf_tensor *t) { return importable_type(t->type) && !shape_why(t); }

struct qmm_gguf {
    qmm_mapping mapping; /* owned when opened from a path */
    const uint8_t *bytes;
    size_t size;
    uint32_t version;
    size_t alignment;
    size_t data_start;
    size_t kv_count;
    gguf_kv *kvs; /* sorted by key */
    size_t tensor_count;
    gguf_tensor *tensors; /* file order */
    qmm_io_name *by_name; /* tensor names and indices, sorted by name */
};

/* ───────────────────────────── bounded reader ───────────────────────────── */

typedef struct cursor {
    const uint8_t *bytes;
    size_t size, at;
} cursor;

static size_t remaining(const cursor *c) { return c->size - c->at; }

static qmm_status need(const cursor *c, size_t n, const char *what) {
    if (remaining(c) < n)
        return qmm_error(QMM_ERR_CORRUPT, "GGUF truncated: %s needs %zu bytes at offset %zu but the file has %zu bytes",
                         what, n, c->at, c->size);
    return QMM_OK;
}

static qmm_status read_u32(cursor *c, uint32_t *value, const char *what) {
    qmm_status status = need(c, 4, what);
    if (status != QMM_OK) return status;
    *value = qmm_le32(c->bytes + c->at);
    c->at += 4;
    return QMM_OK;
}

static qmm_status read_u64(cursor *c, uint64_t *value, const char *what) {
    qmm_status status = need(c, 8, what);
    if (status != QMM_OK) return status;
    *value = qmm_le64(c->bytes + c->at);
    c->at += 8;
    return QMM_OK;
}

/* A GGUF string: u64 length + bytes (no NUL). Returns a view into the file. */
static qmm_status read_string(cursor *c, const char **text, size_t *length, const char *what) {
    uint64_t n;
    qmm_status status = read_u64(c, &n, what);
    if (status != QMM_OK) return status;
    if (n > remaining(c))
        return qmm_error(QMM_ERR_CORRUPT,
                         "GGUF %s: string length %llu at offset %zu runs past the end of the file (%zu bytes)", what,
                         (unsigned long long)n, c->at - 8, c->size);
    *text = (const char *)c->bytes + c->at;
    *length = (size_t)n;
    c->at += (size_t)n;
    return QMM_OK;
}

static char *copy_string(const char *text, size_t length) {
    char *copy = malloc(length + 1);
    if (!copy) return NULL;
    memcpy(copy, text, length);
    copy[length] = '\0';
    return copy;
}

/* Skips one value of `type`, checking every length against the bytes left. */
static qmm_status skip_value(cursor *c, uint32_t type, int depth, const char *key) {
    qmm_status status;
    size_t size = value_size(type);
    if (size) {
        if ((status = need(c, size, key)) != QMM_OK) return status;
        c->at += size;
        return QMM_OK;
    }
    if (type == GGUF_VALUE_STRING) {
        const char *text;
        size_t length;
        return read_string(c, &text, &length, key);
    }
    if (type != GGUF_VALUE_ARRAY)
        return qmm_error(QMM_ERR_CORRUPT, "GGUF metadata \"%s\" has unknown value type %u", key, type);
    if (depth >= GGUF_MAX_ARRAY_NESTING)
        return qmm_error(QMM_ERR_CORRUPT, "GGUF metadata \"%s\" nests arrays deeper than %d", key,
                         GGUF_MAX_ARRAY_NESTING);
    uint32_t element_type;
    uint64_t count;
    if ((status = read_u32(c, &element_type, key)) != QMM_OK) return status;
    if ((status = read_u64(c, &count, key)) != QMM_OK) return status;
    size_t element_size = value_size(element_type);
    /* The smallest encoding of one element bounds how many the rest of the file can hold. */
    size_t minimum = element_size                        ? element_size
                     : element_type == GGUF_VALUE_STRING ? 8
                     : element_type == GGUF_VALUE_ARRAY  ? 12
                                                         : 0;
    if (minimum == 0)
        return qmm_error(QMM_ERR_CORRUPT, "GGUF metadata \"%s\" is an array of unknown value type %u", key,
                         element_type);
    if (count > remaining(c) / minimum)
        return qmm_error(QMM_ERR_CORRUPT,
                         "GGUF metadata \"%s\": array of %llu elements cannot fit in the %zu bytes left in the file",
                         key, (unsigned long long)count, remaining(c));
    if (element_size) {
        c->at += (size_t)count * element_size;
        return QMM_OK;
    }
    for (uint64_t i = 0; i < count; i++)
        if ((status = skip_value(c, element_type, depth + 1, key)) != QMM_OK) return status;
    return QMM_OK;
}

/* ───────────────────────────── open ───────────────────────────── */

static int compare_kvs(const void *a, const void *b) {
    return strcmp(((const gguf_kv *)a)->key, ((const gguf_kv *)b)->key);
}

void qmm_gguf_close(qmm_gguf *file) {
    if (!file) return;
    for (size_t i = 0; i < file->kv_count; i++) {
        free(file->kvs[i].key);
        free(file->kvs[i].string);
    }
    free(file->kvs);
    for (size_t i = 0; i < file->tensor_count; i++)
        free(file->tensors[i].name);
    free(file->tensors);
    free(file->by_name);
    qmm_io_unmap(&file->mapping);
    free(file);
}

static qmm_status parse_metadata(qmm_gguf *file, cursor *c, uint64_t kv_count) {
    char printable[QMM_PRINTABLE_SIZE];
    qmm_status status;
    file->kvs = calloc(kv_count ? (size_t)kv_count : 1, sizeof(gguf_kv));
    if (!file->kvs)
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %llu metadata entries", (unsigned long long)kv_count);
    for (uint64_t i = 0; i < kv_count; i++) {
        const char *key;
        size_t key_length;
        if ((status = read_string(c, &key, &key_length, "metadata key")) != QMM_OK) return status;
        if (!qmm_io_utf8_valid(key, key_length))
            return qmm_error(QMM_ERR_CORRUPT, "GGUF metadata key \"%s\" is not valid UTF-8",
                             qmm_printable(key, key_length, printable, sizeof printable));
        gguf_kv *kv = &file->kvs[file->kv_count];
        kv->key = copy_string(key, key_length);
        if (!kv->key) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a metadata key");
        file->kv_count++;
        qmm_printable(key, key_length, printable, sizeof printable);
        if ((status = read_u32(c, &kv->type, printable)) != QMM_OK) return status;
        size_t value_at = c->at;
        if (kv->type == GGUF_VALUE_STRING) {
            const char *text;
            size_t length;
            if ((status = read_string(c, &text, &length, printable)) != QMM_OK) return status;
            /* Only strings that are valid C strings are offered by qmm_gguf_metadata_string. */
            if (qmm_io_utf8_valid(text, length)) {
                kv->string = copy_string(text, length);
                if (!kv->string) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy metadata \"%s\"", printable);
            }
        } else if ((status = skip_value(c, kv->type, 0, printable)) != QMM_OK) {
            return status;
        }
        if (strcmp(kv->key, "general.alignment") == 0) {
            if (kv->type != GGUF_VALUE_U32)
                return qmm_error(QMM_ERR_CORRUPT, "GGUF general.alignment has value type %u; the spec requires uint32",
                                 kv->type);
            uint32_t alignment = qmm_le32(c->bytes + value_at);
            if (alignment == 0 || (alignment & (alignment - 1)) != 0)
                return qmm_error(QMM_ERR_CORRUPT, "GGUF general.alignment=%u is not a power of two", alignment);
            file->alignment = alignment;
        }
    }
    qsort(file->kvs, file->kv_count, sizeof(gguf_kv), compare_kvs);
    for (size_t i = 1; i < file->kv_count; i++)
        if (strcmp(file->kvs[i - 1].key, file->kvs[i].key) == 0)
            return qmm_error(QMM_ERR_CORRUPT, "GGUF metadata key \"%s\" appears twice",
                             qmm_printable(file->kvs[i].key, strlen(file->kvs[i].key), printable, sizeof printable));
    return QMM_OK;
}

static qmm_status parse_tensor_info(qmm_gguf *file, cursor *c, gguf_tensor *tensor) {
    char printable[QMM_PRINTABLE_SIZE];
    qmm_status status;
    const char *name;
    size_t name_length;
    if ((status = read_string(c, &name, &name_length, "tensor name")) != QMM_OK) return status;
    qmm_printable(name, name_length, printable, sizeof printable);
    if (name_length == 0 || !qmm_io_utf8_valid(name, name_length))
        return qmm_error(QMM_ERR_CORRUPT, "GGUF tensor name \"%s\" is empty or not valid UTF-8", printable);
    tensor->name = copy_string(name, name_length);
    if (!tensor->name) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a tensor name");
    uint32_t ndim;
    if ((status = read_u32(c, &ndim, printable)) != QMM_OK) return status;
    if (ndim > GGUF_MAX_DIMS)
        return qmm_error(QMM_ERR_CORRUPT, "GGUF tensor \"%s\" has n_dims=%u; GGUF allows at most %d", printable, ndim,
                         GGUF_MAX_DIMS);
    tensor->ndim = (int)ndim;
    uint64_t ne[GGUF_MAX_DIMS] = {0};
    size_t elements = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < ndim; d++) {
        if ((status = read_u64(c, &ne[d], printable)) != QMM_OK) return status;
        if (ne[d] > (uint64_t)INT64_MAX)
            return qmm_error(QMM_ERR_CORRUPT, "GGUF tensor \"%s\": ne[%u]=%lld is negative", printable, d,
                             (long long)ne[d]);
        tensor->shape[ndim - 1 - d] = (int64_t)ne[d];
#if SIZE_MAX < UINT64_MAX
        if (ne[d] > SIZE_MAX) overflow = true;
#endif
        if (!qmm_mul_size(elements, (size_t)ne[d], &elements)) overflow = true;
    }
    if (overflow)
        return qmm_error(QMM_ERR_CORRUPT, "GGUF tensor \"%s\": the element count of its shape overflows size_t",
                         printable);
    tensor->elements = elements;
    uint64_t offset;
    if ((status = read_u32(c, &tensor->type, printable)) != QMM_OK) return status;
    if ((status = read_u64(c, &offset, printable)) != QMM_OK) return status;
    const ggml_type_traits *traits = type_traits(tensor->type);
    if (traits)
        snprintf(tensor->type_name, sizeof tensor->type_name, "%s", traits->name);
    else
        snprintf(tensor->type_name, sizeof tensor->type_name, "type %u", tensor->type);
    if (offset % file->alignment != 0)
        return qmm_error(QMM_ERR_CORRUPT,
                         "GGUF tensor \"%s\": data offset %llu is not a multiple of general.alignment=%zu", printable,
                         (unsigned long long)offset, file->alignment);
#if SIZE_MAX < UINT64_MAX
    if (offset > SIZE_MAX)
        return qmm_error(QMM_ERR_CORRUPT, "GGUF tensor \"%s\": data offset %llu is past the end of the file", printable,
                         (unsigned long long)offset);
#endif
    tensor->offset = (size_t)offset;
    if (traits) {
        /* Rows whose length is not a whole number of blocks are kept (nbytes rounds the row up) so that
         * import can report the shape error; ggml itself never writes such a tensor. */
        size_t row = ndim > 0 ? (size_t)ne[0] : 1;
        size_t rows = row ? elements / row : 0;
        size_t blocks = row / traits->block + (row % traits->block != 0);
        size_t nbytes = 0; /* no rows (a zero dimension): no bytes, however long a row would be */
        if (rows && (!qmm_mul_size(blocks, traits->bytes, &nbytes) || !qmm_mul_size(nbytes, rows, &nbytes)))
            return qmm_error(QMM_ERR_CORRUPT, "GGUF tensor \"%s\": its byte size overflows size_t", printable);
        tensor->nbytes = nbytes;
    }
    return QMM_OK;
}

static qmm_status parse_file(qmm_gguf *file) {
    qmm_status status;
    char printable[QMM_PRINTABLE_SIZE];
    cursor c = {file->bytes, file->size, 0};
    uint32_t magic;
    if ((status = read_u32(&c, &magic, "magic")) != QMM_OK) return status;
    if (magic != GGUF_MAGIC)
        return qmm_error(QMM_ERR_CORRUPT, "bad GGUF magic 0x%08x (want 0x%08x, \"GGUF\")", magic, GGUF_MAGIC);
    if ((status = read_u32(&c, &file->version, "version")) != QMM_OK) return status;
    if (file->version != 2 && file->version != 3)
        return qmm_error(QMM_ERR_UNSUPPORTED, "GGUF version %u is not supported (qmm reads versions 2 and 3)",
                         file->version);
    uint64_t tensor_count, kv_count;
    if ((status = read_u64(&c, &tensor_count, "tensor count")) != QMM_OK) return status;
    if ((status = read_u64(&c, &kv_count, "metadata count")) != QMM_OK) return status;
    /* Smallest encodings: a kv is a key length (8), a type (4) and a 1-byte value; a tensor info is a
     * name length (8), n_dims (4), a type (4) and an offset (8). */
    if (kv_count > remaining(&c) / 13)
        return qmm_error(QMM_ERR_CORRUPT, "GGUF metadata count %llu cannot fit in the file's %zu remaining bytes",
                         (unsigned long long)kv_count, remaining(&c));
    if (tensor_count > remaining(&c) / 24 || tensor_count * 24 + kv_count * 13 > remaining(&c))
        return qmm_error(
            QMM_ERR_CORRUPT,
            "GGUF tensor count %llu (with %llu metadata entries) cannot fit in the file's %zu remaining bytes",
            (unsigned long long)tensor_count, (unsigned long long)kv_count, remaining(&c));
    file->alignment = GGUF_DEFAULT_ALIGNMENT;
    if ((status = parse_metadata(file, &c, kv_count)) != QMM_OK) return status;

    file->tensors = calloc(tensor_count ? (size_t)tensor_count : 1, sizeof(gguf_tensor));
    file->by_name = calloc(tensor_count ? (size_t)tensor_count : 1, sizeof(qmm_io_name));
    if (!file->tensors || !file->by_name)
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %llu tensor entries",
                         (unsigned long long)tensor_count);
    for (uint64_t i = 0; i < tensor_count; i++) {
        status = parse_tensor_info(file, &c, &file->tensors[file->tensor_count]);
        file->tensor_count++; /* counted even on failure so close frees the name */
        if (status != QMM_OK) return status;
    }
    size_t data_start = (c.at + file->alignment - 1) / file->alignment * file->alignment; /* c.at ≤ size: no overflow */
    file->data_start = data_start;
    size_t data_size = data_start <= file->size ? file->size - data_start : 0;
    for (size_t i = 0; i < file->tensor_count; i++) {
        const gguf_tensor *t = &file->tensors[i];
        size_t end;
        if (data_start > file->size || !qmm_add_size(t->offset, t->nbytes, &end) || end > data_size)
            return qmm_error(
                QMM_ERR_CORRUPT,
                "GGUF tensor \"%s\" (%s): data [%zu, +%zu) runs past the end of the file (data area of %zu "
                "bytes starting at %zu)",
                qmm_printable(t->name, strlen(t->name), printable, sizeof printable), t->type_name, t->offset,
                t->nbytes, data_size, data_start);
    }

    /* Spans are relative to the data area; every end was checked above, so none overflows. */
    qmm_io_span *spans = malloc((file->tensor_count ? file->tensor_count : 1) * sizeof(qmm_io_span));
    if (!spans) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the spans of %zu tensors", file->tensor_count);
    for (size_t i = 0; i < file->tensor_count; i++) {
        const gguf_tensor *t = &file->tensors[i];
        spans[i] = (qmm_io_span){t->offset, t->offset + t->nbytes, t->name};
        file->by_name[i] = (qmm_io_name){t->name, i};
    }
    status = qmm_io_check_spans(spans, file->tensor_count, "GGUF tensors");
    free(spans);
    if (status != QMM_OK) return status;
    return qmm_io_sort_unique(file->by_name, file->tensor_count, QMM_ERR_CORRUPT, "GGUF tensor name");
}

qmm_status qmm_gguf_open_memory(const void *bytes, size_t size, qmm_gguf **file) {
    if (!file) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_gguf_open_memory: file is NULL");
    *file = NULL;
    if (!bytes && size > 0) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_gguf_open_memory: bytes is NULL");
    qmm_gguf *result = calloc(1, sizeof *result);
    if (!result) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a GGUF handle");
    result->bytes = bytes;
    result->size = size;
    qmm_status status = parse_file(result);
    if (status != QMM_OK) {
        qmm_gguf_close(result);
        return status;
    }
    *file = result;
    return QMM_OK;
}

qmm_status qmm_gguf_open(const char *path, qmm_gguf **file) {
    if (!file) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_gguf_open: file is NULL");
    *file = NULL;
    if (!path) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_gguf_open: path is NULL");
    qmm_gguf *result = calloc(1, sizeof *result);
    if (!result) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a GGUF handle");
    qmm_status status = qmm_io_map_file(path, &result->mapping);
    if (status == QMM_ERR_NOT_FOUND) status = QMM_ERR_IO;
    if (status == QMM_OK) {
        result->bytes = result->mapping.base;
        result->size = result->mapping.size;
        status = parse_file(result);
        /* qmm_error formats into a local buffer first, so the last error may be one of its arguments. */
        char shown[QMM_IO_PATH_SHOWN]; /* path for messages, printable */
        if (status != QMM_OK) qmm_error(status, "%s: %s", qmm_printable(path, strlen(path), shown, sizeof shown),
                                        qmm_last_error());
    }
    if (status != QMM_OK) {
        qmm_gguf_close(result);
        return status;
    }
    *file = result;
    return QMM_OK;
}

size_t qmm_gguf_tensor_count(const qmm_gguf *file) { return file ? file->tensor_count : 0; }

qmm_status qmm_gguf_tensor_info_get(const qmm_gguf *file, size_t index, qmm_gguf_tensor_info *info) {
    if (!file || !info) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_gguf_tensor_info_get: null argument");
    if (index >= file->tensor_count)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "tensor index %zu is out of range (the file has %zu tensors)", index,
                         file->tensor_count);
    const gguf_tensor *t = &file->tensors[index];
    memset(info, 0, sizeof *info);
    info->name = t->name;
    info->type = t->type;
    info->type_name = t->type_name;
    info->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++)
        info->shape[d] = t->shape[d];
    info->nbytes = t->nbytes;
    info->importable = tensor_importable(t);
    info->why_not = info->importable ? "" : importable_type(t->type) ? shape_why(t) : unsupported_why(t->type);
    return QMM_OK;
}

static const char *tensor_name_by_name(const void *context, size_t i) {
    const qmm_gguf *file = context;
    return file->by_name[i].name;
}

static const char *kv_key_at(const void *context, size_t i) { return ((const qmm_gguf *)context)->kvs[i].key; }

qmm_status qmm_gguf_find(const qmm_gguf *file, const char *name, size_t *index) {
    if (!file || !name || !index) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_gguf_find: null argument");
    size_t position = qmm_io_find_sorted(file, file->tensor_count, tensor_name_by_name, name);
    if (position != QMM_IO_NOT_FOUND) {
        *index = file->by_name[position].index;
        return QMM_OK;
    }
    char printable[QMM_PRINTABLE_SIZE];
    return qmm_error(QMM_ERR_NOT_FOUND, "the GGUF file has no tensor named \"%s\"",
                     qmm_printable(name, strlen(name), printable, sizeof printable));
}

const char *qmm_gguf_metadata_string(const qmm_gguf *file, const char *key) {
    if (!file || !key) return NULL;
    size_t position = qmm_io_find_sorted(file, file->kv_count, kv_key_at, key);
    return position == QMM_IO_NOT_FOUND ? NULL : file->kvs[position].string;
}

/* ───────────────────────────── import ───────────────────────────── */

void qmm_gguf_import_free(qmm_qmatrix *matrix, qmm_tensor *float_tensor) {
    if (matrix) {
        free((void *)matrix->w);
        free((void *)matrix->scales);
        free((void *)matrix->biases);
        matrix->w = NULL;
        matrix->scales = NULL;
        matrix->biases = NULL;
    }
    if (float_tensor) {
        free((void *)float_tensor->data);
        free((void *)float_tensor->name);
        float_tensor->data = NULL;
        float_tensor->name = NULL;
    }
}

static bool f16_finite(uint16_t h) { return (h & 0x7C00) != 0x7C00; }

/* Whether the block's second f16 (bytes 2–3) is a factor of its weights: Q4_1/Q5_1's m, the K-quants' dmin. */
static bool has_min_field(uint32_t type) {
    return type == QMM_GGUF_Q4_1 || type == QMM_GGUF_Q5_1 || type == QMM_GGUF_Q4_K || type == QMM_GGUF_Q5_K;
}

/* One 32-weight block → its 32 codes in MLX (sequential) order and the f16 bits of its scale and bias. */
static void import_block(uint32_t type, const uint8_t *block, uint8_t codes[32], uint16_t *scale, uint16_t *bias) {
    const uint16_t d = qmm_le16(block);
    *scale = d;
    if (type == QMM_GGUF_Q8_0) {
        /* int8 i ∈ [−128, 127] → unsigned q = i + 128, which is the byte with its top bit flipped. */
        for (int j = 0; j < 32; j++)
            codes[j] = block[2 + j] ^ 0x80;
        /* −128·d is exact in f32 and rounds to f16 exactly unless it overflows (checked by the caller). */
        *bias = qmm_f32_to_f16(-128.0f * qmm_f16_to_f32(d));
        return;
    }
    /* Q4_x: f16 d [| f16 m] | 16 B;  Q5_x: f16 d [| f16 m] | u32 qh | 16 B, bit j of qh = bit 4 of code j. */
    const bool has_min = has_min_field(type);
    const bool five = type == QMM_GGUF_Q5_0 || type == QMM_GGUF_Q5_1;
    const uint8_t *after_d = block + (has_min ? 4 : 2);
    const uint32_t qh = five ? qmm_le32(after_d) : 0;
    const uint8_t *nibbles = after_d + (five ? 4 : 0);
    for (int j = 0; j < 16; j++) {
        codes[j] = (uint8_t)((nibbles[j] & 0x0F) | ((qh >> j) & 1) << 4);       /* element j: low nibble */
        codes[j + 16] = (uint8_t)((nibbles[j] >> 4) | ((qh >> (j + 16)) & 1) << 4); /* j + 16: high nibble */
    }
    /* w = d·(q − 8) or d·(q − 16): the bias −8d / −16d is exact in f32 and in f16 unless it overflows. */
    *bias = has_min ? qmm_le16(block + 2) : qmm_f32_to_f16((five ? -16.0f : -8.0f) * qmm_f16_to_f32(d));
}

/* One 256-weight K-quant super-block (Q4_K, Q5_K) → its 256 codes in MLX order and the f32 scale and bias of
 * each of its 8 sub-blocks of 32 (ggml-common.h block_q4_K / block_q5_K; ggml-quants.c get_scale_min_k4):
 *   Q4_K: f16 d | f16 dmin | 12 B scales | 128 B qs;  Q5_K: the same with 32 B qh before qs.
 * Sub-block g has a 6-bit scale sc and min m: bytes 0–3 hold sc 0–3 (low 6 bits) and the top 2 bits of sc 4–7,
 * bytes 4–7 the same for m, bytes 8–11 the low 4 bits of sc 4–7 (low nibble) and m 4–7 (high nibble).
 * Its codes are the low (g even) or high (g odd) nibbles of qs[32·(g/2) …], Q5_K adding bit g of qh[l] as bit 4.
 * ggml computes w = (d·sc)·q − dmin·m in f32; d·sc (11 + 6 significant bits) and dmin·m are exact in f32, so
 * scale = d·sc and bias = −(dmin·m) give the same value and the same single rounding. */
static void import_k_block(uint32_t type, const uint8_t *block, uint8_t codes[256], float scales[8],
                           float biases[8]) {
    const float d = qmm_f16_to_f32(qmm_le16(block)), dmin = qmm_f16_to_f32(qmm_le16(block + 2));
    const uint8_t *packed = block + 4;
    const uint8_t *qh = block + 16;
    const uint8_t *qs = block + (type == QMM_GGUF_Q5_K ? 48 : 16);
    for (int g = 0; g < 8; g++) {
        const unsigned sc = g < 4 ? packed[g] & 63u : (packed[g + 4] & 0x0Fu) | (unsigned)(packed[g - 4] >> 6) << 4;
        const unsigned m =
            g < 4 ? packed[g + 4] & 63u : (unsigned)(packed[g + 4] >> 4) | (unsigned)(packed[g] >> 6) << 4;
        scales[g] = d * (float)sc;
        biases[g] = -(dmin * (float)m);
        for (int l = 0; l < 32; l++) {
            unsigned q = (qs[32 * (g / 2) + l] >> (4 * (g % 2))) & 0x0Fu;
            if (type == QMM_GGUF_Q5_K) q |= ((qh[l] >> g) & 1u) << 4;
            codes[32 * g + l] = (uint8_t)q;
        }
    }
}

qmm_status qmm_gguf_import(const qmm_gguf *file, size_t index, int *is_quantized, qmm_qmatrix *matrix,
                           qmm_tensor *float_tensor) {
    if (!file || !is_quantized || !matrix || !float_tensor)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_gguf_import: null argument");
    memset(matrix, 0, sizeof *matrix);
    memset(float_tensor, 0, sizeof *float_tensor);
    *is_quantized = 0;
    if (index >= file->tensor_count)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "tensor index %zu is out of range (the file has %zu tensors)", index,
                         file->tensor_count);
    const gguf_tensor *t = &file->tensors[index];
    char printable[QMM_PRINTABLE_SIZE];
    qmm_printable(t->name, strlen(t->name), printable, sizeof printable);
    const uint8_t *data = file->bytes + file->data_start + t->offset;

    if (t->type == QMM_GGUF_F32 || t->type == QMM_GGUF_F16 || t->type == QMM_GGUF_BF16) {
        void *copy = malloc(t->nbytes ? t->nbytes : 1);
        char *name = strdup(t->name); /* owned: it outlives the file (qmm_gguf_import_free frees it) */
        if (!copy || !name) {
            free(copy);
            free(name);
            return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for tensor \"%s\"", t->nbytes,
                             printable);
        }
        memcpy(copy, data, t->nbytes);
        float_tensor->name = name;
        float_tensor->dtype = t->type == QMM_GGUF_F32 ? QMM_F32 : t->type == QMM_GGUF_F16 ? QMM_F16 : QMM_BF16;
        float_tensor->ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++)
            float_tensor->shape[d] = t->shape[d];
        float_tensor->data = copy;
        float_tensor->nbytes = t->nbytes;
        return QMM_OK;
    }
    const int bits = import_bits(t->type);
    if (!bits)
        return qmm_error(QMM_ERR_UNSUPPORTED,
                         "GGUF tensor \"%s\" has type %s, which qmm cannot import (importable: " IMPORTABLE_TYPES
                         "): %s",
                         printable, t->type_name, unsupported_why(t->type));

    const ggml_type_traits *traits = type_traits(t->type);
    const bool k_quant = traits->block == 256; /* f32 scales and biases, 8 groups per block */
    size_t cols = t->ndim > 0 ? (size_t)t->shape[t->ndim - 1] : 1;
    if (cols % traits->block != 0 || cols == 0)
        return qmm_error(QMM_ERR_SHAPE,
                         "GGUF tensor \"%s\" (%s): row length %zu is not a positive multiple of %u (the block size)",
                         printable, t->type_name, cols, traits->block);
    size_t rows = t->elements / cols;
    if (rows == 0) return qmm_error(QMM_ERR_SHAPE, "GGUF tensor \"%s\" (%s) has no rows", printable, t->type_name);
    const size_t groups_per_block = traits->block / 32;
    const size_t blocks = t->elements / traits->block; /* whole rows of whole blocks */
    const size_t groups = blocks * groups_per_block, scale_size = k_quant ? sizeof(float) : sizeof(uint16_t);
    size_t w_bytes, s_bytes; /* each 32-weight group packs into exactly `bits` words */
    if (!qmm_mul_size(groups, (size_t)bits * 4, &w_bytes) || !qmm_mul_size(groups, scale_size, &s_bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "GGUF tensor \"%s\": imported sizes overflow size_t", printable);
    uint32_t *w = malloc(w_bytes);
    void *scales = malloc(s_bytes);
    void *biases = malloc(s_bytes);
    qmm_status status = QMM_OK;
    if (!w || !scales || !biases) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes to import \"%s\"", w_bytes + 2 * s_bytes,
                           printable);
        goto cleanup;
    }
    const size_t per_row = cols / traits->block;
    for (size_t b = 0; b < blocks; b++) {
        const uint8_t *block = data + b * traits->bytes;
        const size_t g0 = b * groups_per_block;
        uint8_t codes[256];
        /* The block's f16 factors (d; the min m of Q4_1/Q5_1; the K-quants' dmin) must be finite: ggml would turn
         * a NaN or ±inf one into NaN or ±inf weights, which no product can use; refused here, not at the first
         * matmul. */
        const bool second = has_min_field(t->type);
        const uint16_t d = qmm_le16(block), min = second ? qmm_le16(block + 2) : 0;
        if (!f16_finite(d) || !f16_finite(min)) {
            status = qmm_error(QMM_ERR_NUMERIC,
                               "GGUF tensor \"%s\" (%s): row %zu block %zu has %s=%g, which is not finite",
                               printable, t->type_name, b / per_row, b % per_row,
                               !f16_finite(d) ? "d" : k_quant ? "dmin" : "m",
                               (double)qmm_f16_to_f32(!f16_finite(d) ? d : min));
            goto cleanup;
        }
        if (k_quant) {
            import_k_block(t->type, block, codes, (float *)scales + g0, (float *)biases + g0);
        } else {
            uint16_t *scale = (uint16_t *)scales + g0, *bias = (uint16_t *)biases + g0;
            import_block(t->type, block, codes, scale, bias);
            if (!second && !f16_finite(*bias)) {
                status = qmm_error(QMM_ERR_NUMERIC,
                                   "GGUF tensor \"%s\" (%s): row %zu block %zu has d=%g, so the bias −%d·d is not "
                                   "finite in f16",
                                   printable, t->type_name, b / per_row, b % per_row, (double)qmm_f16_to_f32(*scale),
                                   bits == 8 ? 128 : bits == 5 ? 16 : 8);
                goto cleanup;
            }
        }
        for (size_t g = 0; g < groups_per_block; g++)
            if ((status = qmm_pack(codes + 32 * g, 1, 32, bits, w + (g0 + g) * (size_t)bits)) != QMM_OK) goto cleanup;
    }
    matrix->w = w;
    matrix->scales = scales;
    matrix->biases = biases;
    matrix->dtype = k_quant ? QMM_F32 : QMM_F16;
    matrix->rows = rows;
    matrix->cols = cols;
    matrix->bits = bits;
    matrix->group_size = 32;
    *is_quantized = 1;
    w = NULL;
    scales = NULL;
    biases = NULL;
cleanup:
    free(w);
    free(scales);
    free(biases);
    return status;
}

/* ───────────────────────────── convert ───────────────────────────── */

static bool selected(const char *name, const char *const *prefixes, size_t count) {
    if (count == 0) return true;
    for (size_t i = 0; i < count; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) return true; /* none null: checked first */
    return false;
}

qmm_status qmm_gguf_convert(const char *gguf_path, const char *out_dir, const char *const *prefixes, size_t count) {
    if (!gguf_path || !out_dir || (count > 0 && !prefixes))
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_gguf_convert: null argument");
    const qmm_gguf_convert_options options = {.prefixes = prefixes, .prefix_count = count};
    return qmm_gguf_convert_with(gguf_path, out_dir, &options);
}

/* Whether tensor t is converted: selected by the prefixes and, when unsupported types are skipped, importable. */
static bool converted(const gguf_tensor *t, const qmm_gguf_convert_options *options) {
    return selected(t->name, options->prefixes, options->prefix_count) &&
           (!options->skip_unsupported || tensor_importable(t));
}

qmm_status qmm_gguf_convert_with(const char *gguf_path, const char *out_dir, const qmm_gguf_convert_options *options) {
    const qmm_gguf_convert_options defaults = {0};
    if (!options) options = &defaults;
    if (!gguf_path || !out_dir || (options->prefix_count > 0 && !options->prefixes))
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_gguf_convert_with: null argument");
    for (size_t i = 0; i < options->prefix_count; i++)
        if (!options->prefixes[i])
            return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_gguf_convert: prefixes[%zu] (of %zu) is null (want a name "
                             "prefix; an empty string selects every tensor)", i, options->prefix_count);
    const size_t count = options->prefix_count;
    qmm_gguf *file = NULL;
    qmm_tensor *tensors = NULL;
    qmm_layer *layers = NULL;
    char **layer_names = NULL;
    size_t tensor_count = 0, layer_count = 0;
    cJSON *extra = NULL;
    char *extra_text = NULL;
    char printable[QMM_PRINTABLE_SIZE];
    qmm_status status = qmm_gguf_open(gguf_path, &file);
    if (status != QMM_OK) return status;

    /* Every selected tensor must be importable before anything is converted or written. */
    size_t chosen = 0;
    for (size_t i = 0; i < file->tensor_count; i++) {
        const gguf_tensor *t = &file->tensors[i];
        if (!converted(t, options)) continue;
        chosen++;
        if (!importable_type(t->type)) {
            status = qmm_error(QMM_ERR_UNSUPPORTED,
                               "%s: tensor \"%s\" has type %s, which qmm cannot import (importable: " IMPORTABLE_TYPES
                               "): %s; nothing was written",
                               gguf_path, qmm_printable(t->name, strlen(t->name), printable, sizeof printable),
                               t->type_name, unsupported_why(t->type));
            goto cleanup;
        }
    }
    if (chosen == 0) {
        if (file->tensor_count == 0)
            status = qmm_error(QMM_ERR_NOT_FOUND, "%s: the GGUF file has no tensors", gguf_path);
        else if (options->skip_unsupported)
            status = qmm_error(QMM_ERR_NOT_FOUND,
                               "%s: no %stensor can be imported (types " IMPORTABLE_TYPES ", in rows of whole blocks)",
                               gguf_path, count ? "selected " : "");
        else status = qmm_error(QMM_ERR_NOT_FOUND, "%s: no tensor matches the %zu given prefixes", gguf_path, count);
        goto cleanup;
    }
    tensors = calloc(chosen, sizeof(qmm_tensor));
    layers = calloc(chosen, sizeof(qmm_layer));
    layer_names = calloc(chosen, sizeof(char *));
    if (!tensors || !layers || !layer_names) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu conversion entries", chosen);
        goto cleanup;
    }
    for (size_t i = 0; i < file->tensor_count; i++) {
        const gguf_tensor *t = &file->tensors[i];
        if (!converted(t, options)) continue;
        int quantized = 0;
        qmm_qmatrix matrix;
        qmm_tensor float_tensor;
        if ((status = qmm_gguf_import(file, i, &quantized, &matrix, &float_tensor)) != QMM_OK) {
            char message[1024]; /* the library's message size */
            snprintf(message, sizeof message, "%s", qmm_last_error());
            qmm_error(status, "%s: %s; nothing was written", gguf_path, message);
            goto cleanup;
        }
        if (!quantized) {
            tensors[tensor_count++] = float_tensor;
            continue;
        }
        /* "blk.0.attn_q.weight" → layer "blk.0.attn_q" (tensors blk.0.attn_q.weight/.scales/.biases). */
        size_t length = strlen(t->name);
        if (length > 7 && strcmp(t->name + length - 7, ".weight") == 0) length -= 7;
        layer_names[layer_count] = copy_string(t->name, length);
        layers[layer_count].matrix = matrix;
        layers[layer_count].name = layer_names[layer_count];
        /* An MoE tensor [E, N, K] (blk.N.ffn_*_exps) stays a layer of E experts, [E, N, words] as MLX's loader
         * shapes it, not one matrix of E·N rows; more leading dims fold into E, as qmm_checkpoint_open reads. */
        layers[layer_count].experts = 1;
        for (int d = 0; d + 2 < t->ndim; d++) layers[layer_count].experts *= (size_t)t->shape[d];
        layers[layer_count].experts_dim = t->ndim > 2;
        layer_count++;
        if (!layer_names[layer_count - 1]) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a layer name");
            goto cleanup;
        }
    }
    extra = cJSON_CreateObject();
    const char *architecture = qmm_gguf_metadata_string(file, "general.architecture");
    if (!extra || (architecture && (!cJSON_AddStringToObject(extra, "model_type", architecture) ||
                                    !cJSON_AddStringToObject(extra, "gguf_architecture", architecture)))) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot build config.json");
        goto cleanup;
    }
    extra_text = cJSON_PrintUnformatted(extra);
    if (!extra_text) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot build config.json");
        goto cleanup;
    }
    status = qmm_checkpoint_write(out_dir, tensors, tensor_count, layers, layer_count, extra_text);
cleanup:
    for (size_t i = 0; i < tensor_count; i++)
        qmm_gguf_import_free(NULL, &tensors[i]);
    for (size_t i = 0; i < layer_count; i++) {
        qmm_gguf_import_free(&layers[i].matrix, NULL);
        free(layer_names[i]);
    }
    free(tensors);
    free(layers);
    free(layer_names);
    cJSON_free(extra_text);
    cJSON_Delete(extra);
    qmm_gguf_close(file);
    return status;
}
