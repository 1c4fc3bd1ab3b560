/*
 * test_round_trip.c — the property "a checkpoint qmm writes reads back exactly as written", on random
 * checkpoints (seed from QMM_TEST_SEED or the clock, printed on failure; ROUNDS rounds, well under a
 * second). Each round makes:
 *   A. qmm_checkpoint_write of float tensors (1-, 2- and 3-D, awkward names) and quantized layers of every
 *      bits × group_size, always including both members of a shape-ambiguous pair (4-bit gs32 / 2-bit gs64,
 *      8-bit gs32 / 4-bit gs64, 8-bit gs64 / 4-bit gs128: the same array shapes), some from their arrays
 *      (a 3-D one as a layer of experts, qmm_layer.experts), some described by tensors passed as they are
 *      (2-D or 3-D);
 *   B. qmm_checkpoint_quantize of A's model.safetensors (with some float weights marked false in its
 *      config.json) at a random format: A's layers keep their formats, the float weights (2-D, and 3-D
 *      [E, N, K] becoming a layer of E experts) become layers exactly where the rules say, bit for bit
 *      what qmm_quantize makes, or the call refuses and writes nothing;
 *   C. qmm_gguf_convert of a GGUF file (Q4_0, Q4_1, Q8_0 and F32 tensors with awkward names), then
 *      qmm_checkpoint_quantize of the result at a format that is shape-ambiguous with Q8_0's 8-bit gs32.
 * After each step every layer must read back with the same format, the same bytes and the same shapes.
 */
#include "check.h"
#include "internal.h"
#include "io_test_util.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROUNDS = 24, MAX_LAYERS = 12, MAX_FLOATS = 8 };

static const char *const awkward[] = {
    "model.layers.0.self_attn.q_proj", "ünïcode.名前", "with space", "quote\"d", "back\\slash", "a/b/c",
    "x.weight",                        "bitsy",       "mode_",      "quantization", "tab\there", "Ω",
};
#define AWKWARD_COUNT (sizeof awkward / sizeof awkward[0])

typedef struct made_layer {
    char name[96];
    int bits, group_size;
    qmm_dtype dtype;
    int ndim;         /* 2, or 3 (leading dims folded into rows) */
    int64_t lead[2];  /* leading dims */
    size_t rows, cols, words, groups;
    uint32_t *w;
    void *scales, *biases;
    bool described; /* passed as tensors, described by format only */
} made_layer;

typedef struct made_float {
    char name[96];
    qmm_dtype dtype;
    int ndim;
    int64_t shape[3];
    void *data;
    size_t nbytes;
    bool marked_false;
} made_float;

static size_t below(check_rng *rng, size_t n) { return (size_t)(check_rng_next(rng) % n); }

static qmm_dtype float_dtype(check_rng *rng) {
    static const qmm_dtype dtypes[3] = {QMM_F16, QMM_BF16, QMM_F32};
    return dtypes[below(rng, 3)];
}

static void make_layer(check_rng *rng, made_layer *l, const char *name, int bits, int group_size, size_t groups,
                       size_t rows_hint, bool described, bool three_d) {
    snprintf(l->name, sizeof l->name, "%s", name);
    l->bits = bits;
    l->group_size = group_size;
    l->dtype = float_dtype(rng);
    l->ndim = three_d ? 3 : 2;
    l->lead[0] = three_d ? 1 + (int64_t)below(rng, 2) : (int64_t)rows_hint;
    l->lead[1] = three_d ? 1 + (int64_t)below(rng, 3) : 1;
    /* A 3-D layer from its arrays is a layer of lead[0] experts, written [E, N, words] — with one expert too
     * (qmm_layer.experts_dim). */
    l->described = described;
    l->rows = (size_t)(l->lead[0] * l->lead[1]);
    l->groups = groups;
    l->cols = groups * (size_t)group_size;
    l->words = l->cols * (size_t)bits / 32;
    size_t element = qmm_dtype_size(l->dtype);
    l->w = malloc(l->rows * l->words * 4);
    l->scales = malloc(l->rows * groups * element);
    l->biases = malloc(l->rows * groups * element);
    for (size_t i = 0; l->w && i < l->rows * l->words; i++)
        l->w[i] = (uint32_t)check_rng_next(rng);
    if (l->scales) check_fill_uniform(rng, l->scales, l->dtype, l->rows * groups, -0.1f, 0.1f);
    if (l->biases) check_fill_uniform(rng, l->biases, l->dtype, l->rows * groups, -1, 1);
}

static void free_layer(made_layer *l) {
    free(l->w);
    free(l->scales);
    free(l->biases);
}

/* The three tensors of a described layer, shaped as made (leading dims kept). */
static void layer_tensors(const made_layer *l, qmm_tensor out[3], char names[3][112]) {
    static const char *const suffixes[3] = {".weight", ".scales", ".biases"};
    const void *arrays[3] = {l->w, l->scales, l->biases};
    for (int k = 0; k < 3; k++) {
        snprintf(names[k], 112, "%.95s%s", l->name, suffixes[k]);
        qmm_tensor *t = &out[k];
        memset(t, 0, sizeof *t);
        t->name = names[k];
        t->dtype = k == 0 ? QMM_U32 : l->dtype;
        t->ndim = l->ndim;
        for (int d = 0; d < l->ndim - 1; d++)
            t->shape[d] = l->lead[d];
        t->shape[l->ndim - 1] = (int64_t)(k == 0 ? l->words : l->groups);
        t->data = arrays[k];
        t->nbytes = l->rows * (k == 0 ? l->words * 4 : l->groups * qmm_dtype_size(l->dtype));
    }
}

/* Every made layer reads back with its format, bytes and shapes; every float tensor with its bytes. */
static void verify_layers(const qmm_checkpoint *ck, const made_layer *layers, size_t count, const char *step) {
    for (size_t i = 0; i < count; i++) {
        const made_layer *l = &layers[i];
        qmm_layer got;
        if (qmm_checkpoint_find_layer(ck, l->name, &got) != QMM_OK) {
            CHECK(false, "%s: layer \"%s\" (%d-bit gs%d) is missing: %s", step, l->name, l->bits, l->group_size,
                  qmm_last_error());
            continue;
        }
        const qmm_qmatrix *m = &got.matrix;
        size_t scale_bytes = l->rows * l->groups * qmm_dtype_size(l->dtype);
        CHECK(m->bits == l->bits && m->group_size == l->group_size && m->dtype == l->dtype && m->rows == l->rows &&
                  m->cols == l->cols,
              "%s: layer \"%s\" reads back as %d-bit gs%d %s %zux%zu, written %d-bit gs%d %s %zux%zu", step, l->name,
              m->bits, m->group_size, qmm_dtype_name(m->dtype), m->rows, m->cols, l->bits, l->group_size,
              qmm_dtype_name(l->dtype), l->rows, l->cols);
        if (m->rows != l->rows || m->cols != l->cols || m->bits != l->bits) continue;
        CHECK(memcmp(m->w, l->w, l->rows * l->words * 4) == 0 && memcmp(m->scales, l->scales, scale_bytes) == 0 &&
                  memcmp(m->biases, l->biases, scale_bytes) == 0,
              "%s: layer \"%s\": bytes differ", step, l->name);
        char name[sizeof l->name + sizeof ".weight"];
        snprintf(name, sizeof name, "%.95s.weight", l->name); /* l->name holds ≤ 95 bytes */
        qmm_tensor t;
        CHECK(qmm_checkpoint_find_tensor(ck, name, &t) == QMM_OK && t.ndim == l->ndim &&
                  (l->ndim == 2 || (t.shape[0] == l->lead[0] && t.shape[1] == l->lead[1])),
              "%s: layer \"%s\": weight shape changed (ndim %d)", step, l->name, t.ndim);
        const size_t experts = l->ndim == 3 ? (size_t)l->lead[0] : 1;
        CHECK(got.experts == experts, "%s: layer \"%s\": %zu experts, want %zu", step, l->name, got.experts, experts);
    }
}

static void verify_float(const qmm_checkpoint *ck, const made_float *f, const char *step) {
    qmm_tensor t;
    bool found = qmm_checkpoint_find_tensor(ck, f->name, &t) == QMM_OK;
    CHECK(found && t.dtype == f->dtype && t.ndim == f->ndim && t.nbytes == f->nbytes &&
              memcmp(t.data, f->data, f->nbytes) == 0,
          "%s: float tensor \"%s\" differs or is missing", step, f->name);
}

/* "P": false for every float weight marked so, in both quantization keys of dir/config.json. */
static void mark_false(const char *dir, const made_float *floats, size_t count) {
    char *text = io_read_file(io_path(dir, "config.json"), NULL);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(root != NULL, "config.json of %s does not parse", dir);
    if (!root) return;
    const char *keys[2] = {"quantization", "quantization_config"};
    for (int k = 0; k < 2; k++) {
        cJSON *q = cJSON_GetObjectItemCaseSensitive(root, keys[k]);
        for (size_t i = 0; q && i < count; i++) {
            if (!floats[i].marked_false) continue;
            char layer[96];
            snprintf(layer, sizeof layer, "%.*s", (int)(strlen(floats[i].name) - strlen(".weight")), floats[i].name);
            cJSON_AddItemToObject(q, layer, cJSON_CreateFalse());
        }
    }
    char *out = cJSON_Print(root);
    CHECK(out && io_write_file(io_path(dir, "config.json"), out, strlen(out)), "rewrite config.json");
    cJSON_free(out);
    cJSON_Delete(root);
}

/* The rule qmm_checkpoint_quantize applies: a 2-D [N, K] or 3-D [E, N, K] float *.weight whose K is a
 * multiple of group_size and whose layer config.json does not mark false. */
static bool quantizable(const made_float *f, int group_size) {
    size_t length = strlen(f->name);
    return (f->ndim == 2 || f->ndim == 3) && f->shape[f->ndim - 1] % group_size == 0 && !f->marked_false &&
           length > 7 &&
           strcmp(f->name + length - 7, ".weight") == 0;
}

/* B: quantize `input` (a model.safetensors beside its config.json) into out at (bits, group_size). */
static void check_quantize(const char *input, const char *out, int bits, int group_size, const made_layer *layers,
                           size_t layer_count, const made_float *floats, size_t float_count, const char *step) {
    size_t expect = 0;
    for (size_t i = 0; i < float_count; i++)
        if (quantizable(&floats[i], group_size)) expect++;
    qmm_quantize_summary summary;
    /* a convention outside the enum: refused before the input is read, naming the value; nothing written */
    CHECK(qmm_checkpoint_quantize(input, out, bits, group_size, (qmm_convention)9, NULL, NULL, &summary) ==
              QMM_ERR_INVALID_ARGUMENT && strstr(qmm_last_error(), "convention 9") != NULL && !io_exists(out),
          "%s: convention 9: %s", step, qmm_last_error());
    qmm_status status = qmm_checkpoint_quantize(input, out, bits, group_size, QMM_CONVENTION_CPU, NULL, NULL, &summary);
    if (expect == 0) {
        CHECK(status == QMM_ERR_SHAPE || status == QMM_ERR_NOT_FOUND, "%s: nothing to quantize at %d/%d gave %s (%s)",
              step, bits, group_size, qmm_status_string(status), qmm_last_error());
        CHECK(!io_exists(out), "%s: a refused quantize left %s", step, out);
        return;
    }
    CHECK(status == QMM_OK, "%s: quantize at %d/%d: %s", step, bits, group_size, qmm_last_error());
    if (status != QMM_OK) return;
    CHECK(summary.quantized == expect && summary.kept == layer_count, "%s: quantized %zu (want %zu), kept %zu (want %zu)",
          step, summary.quantized, expect, summary.kept, layer_count);
    qmm_checkpoint *ck = NULL;
    CHECK_OK(qmm_checkpoint_open(out, &ck));
    if (!ck) return;
    verify_layers(ck, layers, layer_count, step);
    for (size_t i = 0; i < float_count; i++) {
        const made_float *f = &floats[i];
        if (!quantizable(f, group_size)) {
            verify_float(ck, f, step);
            continue;
        }
        char layer_name[96];
        snprintf(layer_name, sizeof layer_name, "%.*s", (int)(strlen(f->name) - 7), f->name);
        made_layer want = {0};
        snprintf(want.name, sizeof want.name, "%s", layer_name);
        want.bits = bits;
        want.group_size = group_size;
        want.dtype = f->dtype;
        want.ndim = f->ndim; /* 3-D [E, N, K]: E experts stacked in the rows, written [E, N, words] */
        want.lead[0] = f->shape[0];
        want.lead[1] = f->ndim == 3 ? f->shape[1] : 0;
        want.rows = (size_t)f->shape[0] * (f->ndim == 3 ? (size_t)f->shape[1] : 1);
        want.cols = (size_t)f->shape[f->ndim - 1];
        want.words = want.cols * (size_t)bits / 32;
        want.groups = want.cols / (size_t)group_size;
        size_t element = qmm_dtype_size(f->dtype);
        want.w = malloc(want.rows * want.words * 4);
        want.scales = malloc(want.rows * want.groups * element);
        want.biases = malloc(want.rows * want.groups * element);
        CHECK_OK(qmm_quantize(f->data, f->dtype, want.rows, want.cols, bits, group_size, QMM_CONVENTION_CPU, want.w,
                              want.scales, want.biases));
        verify_layers(ck, &want, 1, step);
        free_layer(&want);
    }
    qmm_checkpoint_close(ck);
}

/* ── GGUF: a minimal v3 writer (no metadata), 32-byte aligned data ── */

typedef struct gguf_tensor {
    char name[96];
    uint32_t type; /* 0 F32, 2 Q4_0, 3 Q4_1, 8 Q8_0 */
    uint64_t rows, cols;
    uint8_t *data;
    size_t nbytes;
} gguf_tensor;

static void gguf_random(check_rng *rng, gguf_tensor *t) {
    size_t blocks = (size_t)(t->rows * t->cols / 32);
    size_t block = t->type == 2 ? 18 : t->type == 3 ? 20 : 34;
    t->nbytes = t->type == 0 ? (size_t)(t->rows * t->cols * 4) : blocks * block;
    t->data = malloc(t->nbytes);
    if (!t->data) return;
    if (t->type == 0) {
        check_fill_uniform(rng, t->data, QMM_F32, (size_t)(t->rows * t->cols), -1, 1);
        return;
    }
    for (size_t b = 0; b < blocks; b++) {
        uint8_t *p = t->data + b * block;
        for (size_t i = 0; i < block; i++)
            p[i] = (uint8_t)check_rng_next(rng);
        uint16_t d = (uint16_t)(0x2000 | (check_rng_next(rng) & 0x3ff) | (below(rng, 2) ? 0x8000 : 0)); /* small, finite */
        p[0] = (uint8_t)d;
        p[1] = (uint8_t)(d >> 8);
        if (t->type == 3) { /* Q4_1 m: small, finite */
            p[2] = (uint8_t)check_rng_next(rng);
            p[3] = (uint8_t)(0x30 | (below(rng, 2) ? 0x80 : 0));
        }
    }
}

static io_buf gguf_image(const gguf_tensor *tensors, size_t count) {
    io_buf out = {0}, data = {0};
    io_put(&out, "GGUF", 4);
    io_put_u32(&out, 3);
    io_put_u64(&out, count);
    io_put_u64(&out, 0);
    for (size_t i = 0; i < count; i++) {
        io_pad(&data, 32);
        io_put_gguf_string(&out, tensors[i].name);
        io_put_u32(&out, 2);
        io_put_u64(&out, tensors[i].cols);
        io_put_u64(&out, tensors[i].rows);
        io_put_u32(&out, tensors[i].type);
        io_put_u64(&out, data.size);
        io_put(&data, tensors[i].data, tensors[i].nbytes);
    }
    io_pad(&out, 32);
    io_put(&out, data.data, data.size);
    io_buf_free(&data);
    return out;
}

static void round_gguf(check_rng *rng, const char *root, int round) {
    gguf_tensor tensors[6];
    size_t count = 0;
    const uint32_t types[4] = {2, 3, 8, 0};
    for (size_t i = 0; i < 6; i++) {
        gguf_tensor *t = &tensors[count];
        memset(t, 0, sizeof *t);
        t->type = i < 3 ? types[i] : types[below(rng, 4)];
        t->rows = 1 + below(rng, 3);
        t->cols = 32 * (1 + below(rng, 4));
        snprintf(t->name, sizeof t->name, "%s%zu.weight", awkward[below(rng, AWKWARD_COUNT)], i);
        gguf_random(rng, t);
        count++;
    }
    io_buf image = gguf_image(tensors, count);
    char gguf_path[1024], out[1024], requantized[1024];
    snprintf(gguf_path, sizeof gguf_path, "%s/r%d.gguf", root, round);
    snprintf(out, sizeof out, "%s/r%d-converted", root, round);
    snprintf(requantized, sizeof requantized, "%s/r%d-converted-q", root, round);
    CHECK(io_write_file(gguf_path, image.data, image.size), "write %s", gguf_path);
    io_buf_free(&image);
    CHECK_OK(qmm_gguf_convert(gguf_path, out, NULL, 0));

    /* The converted layers, as qmm_gguf_import makes them, are what must read back. */
    made_layer layers[6];
    made_float floats[6];
    size_t layer_count = 0, float_count = 0;
    qmm_gguf *file = NULL;
    CHECK_OK(qmm_gguf_open(gguf_path, &file));
    for (size_t i = 0; file && i < count; i++) {
        int quantized = 0;
        qmm_qmatrix m;
        qmm_tensor f;
        if (qmm_gguf_import(file, i, &quantized, &m, &f) != QMM_OK) {
            CHECK(false, "import %s: %s", tensors[i].name, qmm_last_error());
            continue;
        }
        if (quantized) {
            made_layer *l = &layers[layer_count++];
            memset(l, 0, sizeof *l);
            snprintf(l->name, sizeof l->name, "%.*s", (int)(strlen(tensors[i].name) - 7), tensors[i].name);
            l->bits = m.bits;
            l->group_size = m.group_size;
            l->dtype = m.dtype;
            l->ndim = 2;
            l->rows = m.rows;
            l->cols = m.cols;
            l->words = m.cols * (size_t)m.bits / 32;
            l->groups = m.cols / (size_t)m.group_size;
            l->w = (uint32_t *)m.w;
            l->scales = (void *)m.scales;
            l->biases = (void *)m.biases;
        } else {
            made_float *fl = &floats[float_count++];
            memset(fl, 0, sizeof *fl);
            snprintf(fl->name, sizeof fl->name, "%s", f.name);
            fl->dtype = f.dtype;
            fl->ndim = f.ndim;
            for (int d = 0; d < f.ndim; d++)
                fl->shape[d] = f.shape[d];
            fl->data = (void *)f.data;
            fl->nbytes = f.nbytes;
            free((void *)f.name);
        }
    }
    qmm_gguf_close(file);
    qmm_checkpoint *ck = NULL;
    CHECK_OK(qmm_checkpoint_open(out, &ck));
    if (ck) {
        verify_layers(ck, layers, layer_count, "convert");
        for (size_t i = 0; i < float_count; i++)
            verify_float(ck, &floats[i], "convert");
        qmm_checkpoint_close(ck);
    }
    /* 4-bit gs64 or 2-bit gs64: Q8_0's and Q4_x's 8/32 and 4/32 layers have those layers' array shapes. */
    int bits = below(rng, 2) ? 4 : 2;
    check_quantize(io_path(out, "model.safetensors"), requantized, bits, 64, layers, layer_count, floats, float_count,
                   "convert+quantize");
    for (size_t i = 0; i < layer_count; i++)
        free_layer(&layers[i]);
    for (size_t i = 0; i < float_count; i++)
        free(floats[i].data);
    for (size_t i = 0; i < count; i++)
        free(tensors[i].data);
}

static void round_checkpoint(check_rng *rng, const char *root, int round) {
    static const int bits_set[6] = {2, 3, 4, 5, 6, 8}, group_set[3] = {32, 64, 128};
    static const int pairs[3][2][2] = {{{4, 32}, {2, 64}}, {{8, 32}, {4, 64}}, {{8, 64}, {4, 128}}};
    made_layer layers[MAX_LAYERS];
    made_float floats[MAX_FLOATS];
    size_t layer_count = 0, float_count = 0;
    char name[96];

    /* Both members of one ambiguous pair, with the same array shapes; then random formats. */
    const int (*pair)[2] = pairs[round % 3];
    size_t groups = 1 + below(rng, 2), rows = 1 + below(rng, 4);
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "%s%zu", awkward[below(rng, AWKWARD_COUNT)], layer_count);
        make_layer(rng, &layers[layer_count++], name, pair[k][0], pair[k][1], groups, rows, below(rng, 2), false);
    }
    size_t extra = 2 + below(rng, 6);
    for (size_t i = 0; i < extra && layer_count < MAX_LAYERS; i++) {
        snprintf(name, sizeof name, "%s%zu", awkward[below(rng, AWKWARD_COUNT)], layer_count);
        bool three_d = below(rng, 4) == 0;
        make_layer(rng, &layers[layer_count++], name, bits_set[below(rng, 6)], group_set[below(rng, 3)],
                   1 + below(rng, 3), 1 + below(rng, 4), below(rng, 2), three_d);
    }
    /* Float tensors: 2-D weights of several K (some marked false), a 1-D norm, a 3-D weight of experts (of
     * several K, sometimes marked false), a bias. */
    static const int64_t ks[5] = {48, 64, 96, 128, 256};
    for (size_t i = 0; i < MAX_FLOATS; i++) {
        made_float *f = &floats[float_count];
        memset(f, 0, sizeof *f);
        f->dtype = float_dtype(rng);
        const char *base = awkward[below(rng, AWKWARD_COUNT)];
        if (i < 5) {
            f->ndim = 2;
            f->shape[0] = 1 + (int64_t)below(rng, 3);
            f->shape[1] = ks[below(rng, 5)];
            f->marked_false = below(rng, 4) == 0;
            snprintf(f->name, sizeof f->name, "%sf%zu.weight", base, i);
        } else if (i == 5) {
            f->ndim = 1;
            f->shape[0] = 7;
            snprintf(f->name, sizeof f->name, "%sf%zu.norm.weight", base, i);
        } else if (i == 6) {
            f->ndim = 3;
            f->shape[0] = 1 + (int64_t)below(rng, 2); /* one expert too: [1, N, K] stays 3-D */
            f->shape[1] = 2;
            f->shape[2] = ks[below(rng, 5)];
            f->marked_false = below(rng, 4) == 0;
            snprintf(f->name, sizeof f->name, "%sf%zu.experts.weight", base, i);
        } else {
            f->ndim = 2;
            f->shape[0] = 2;
            f->shape[1] = 64;
            snprintf(f->name, sizeof f->name, "%sf%zu.bias", base, i);
        }
        size_t elements = 1;
        for (int d = 0; d < f->ndim; d++)
            elements *= (size_t)f->shape[d];
        f->nbytes = elements * qmm_dtype_size(f->dtype);
        f->data = malloc(f->nbytes);
        if (f->data) check_fill_uniform(rng, f->data, f->dtype, elements, -2, 2);
        float_count++;
    }

    /* A: write, open, compare. */
    qmm_tensor tensors[MAX_FLOATS + 3 * MAX_LAYERS];
    char names[MAX_LAYERS][3][112];
    qmm_layer entries[MAX_LAYERS];
    size_t tensor_count = 0;
    for (size_t i = 0; i < float_count; i++)
        tensors[tensor_count++] = (qmm_tensor){floats[i].name, floats[i].dtype, floats[i].ndim,
                                               {floats[i].shape[0], floats[i].shape[1], floats[i].shape[2]},
                                               floats[i].data, floats[i].nbytes};
    for (size_t i = 0; i < layer_count; i++) {
        const made_layer *l = &layers[i];
        entries[i].name = l->name;
        entries[i].experts = l->ndim == 3 ? (size_t)l->lead[0] : 1;
        entries[i].experts_dim = l->ndim == 3;
        if (l->described) {
            layer_tensors(l, &tensors[tensor_count], names[i]);
            tensor_count += 3;
            entries[i].matrix = (qmm_qmatrix){NULL, NULL, NULL, l->dtype, l->rows, l->cols, l->bits, l->group_size};
        } else {
            entries[i].matrix = (qmm_qmatrix){l->w, l->scales, l->biases, l->dtype, l->rows, l->cols, l->bits,
                                              l->group_size};
        }
    }
    char dir[1024], quantized[1024];
    snprintf(dir, sizeof dir, "%s/r%d-written", root, round);
    snprintf(quantized, sizeof quantized, "%s/r%d-quantized", root, round);
    if (qmm_checkpoint_write(dir, tensors, tensor_count, entries, layer_count, "{\"model_type\": \"test\"}") != QMM_OK) {
        CHECK(false, "round %d: write: %s", round, qmm_last_error());
    } else {
        qmm_checkpoint *ck = NULL;
        CHECK_OK(qmm_checkpoint_open(dir, &ck));
        if (ck) {
            verify_layers(ck, layers, layer_count, "write");
            for (size_t i = 0; i < float_count; i++)
                verify_float(ck, &floats[i], "write");
            CHECK(qmm_checkpoint_layer_count(ck) == layer_count, "write: %zu layers, want %zu",
                  qmm_checkpoint_layer_count(ck), layer_count);
            qmm_checkpoint_close(ck);
        }
        /* B: quantize A's file at a random format (config.json beside it, some weights marked false). */
        mark_false(dir, floats, float_count);
        check_quantize(io_path(dir, "model.safetensors"), quantized, bits_set[below(rng, 6)], group_set[below(rng, 3)],
                       layers, layer_count, floats, float_count, "write+quantize");
    }
    for (size_t i = 0; i < layer_count; i++)
        free_layer(&layers[i]);
    for (size_t i = 0; i < float_count; i++)
        free(floats[i].data);
}

int main(void) {
    char *root = io_temp_dir("round-trip");
    CHECK(root != NULL, "mkdtemp failed");
    check_rng rng = check_rng_make(500);
    for (int round = 0; root && round < ROUNDS; round++) {
        round_checkpoint(&rng, root, round);
        round_gguf(&rng, root, round);
    }
    if (root) {
        io_remove_tree(root);
        free(root);
    }
    return check_finish("io-round-trip");
}
