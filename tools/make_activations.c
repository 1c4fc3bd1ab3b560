/*
 * make_activations.c — a development tool (built, not installed) that writes DIR/activations.safetensors
 * for the embedded fixture: per linear layer of SmolLM2-135M block 0, the [16, K] f32 activations it
 * receives for 16 fixed tokens. tools/make_fixture.sh runs it; data/NOTICE documents every tensor.
 *
 *   usage: make_activations MODEL.gguf DIR
 *
 * MODEL.gguf gives token_embd (Q8_0, imported exactly by libqmm; rows decoded exactly as d·q), the RMS-norm epsilon and the token
 * strings; DIR is the checkpoint `qmm convert MODEL.gguf DIR --only blk.0.` made (the block's layers and
 * its attn_norm / ffn_norm weights). What each tensor holds (x_t = the embedding row of token t):
 *   attn_q, attn_k, attn_v, attn_output   a_t = rmsnorm(x_t) · attn_norm.weight
 *   ffn_gate, ffn_up                      f_t = rmsnorm(x_t) · ffn_norm.weight
 *   ffn_down                              silu(gate·f_t) ⊙ (up·f_t), the SwiGLU product, with gate·f_t
 *                                         and up·f_t from the f64 oracle on f_t rounded to f16
 * rmsnorm(x) = x / sqrt(mean(x²) + eps), in f64 (llama.cpp's rms_norm, LLaMA's RMSNorm). attn_output
 * really receives the attention output; the normed embedding rows stand in for it (same K, same scale).
 */
#include "qmm.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The 16 tokens (SmolLM2's GPT-2-style BPE vocabulary; "Ġ" marks a leading space). */
static const uint32_t TOKEN_IDS[] = {504,  2644, 2767, 2291, 913,  2477, 2092, 8671,
                                     6736, 2583, 4626, 6740, 1789, 1230, 2654, 5587};
#define T (sizeof TOKEN_IDS / sizeof TOKEN_IDS[0])
#define BLOCK "blk.0."

/* ── a minimal reader of the GGUF key/value section, for two things libqmm's API does not return: the
 * f32 value llama.attention.layer_norm_rms_epsilon and strings of the tokenizer.ggml.tokens array.
 * Layout (GGUF v2/v3): "GGUF", u32 version, u64 tensor count, u64 kv count, then per kv: string key,
 * u32 value type, value; a string is u64 length + bytes; an array is u32 element type, u64 count,
 * elements. Every length is checked against the file. */
typedef struct metadata {
    float epsilon;
    int have_epsilon;
    char *tokens[T];
} metadata;

static int read_exact(FILE *f, void *out, size_t n) { return fread(out, 1, n, f) == n; }

static int skip_bytes(FILE *f, uint64_t n) {
    if (n > (uint64_t)1 << 40) return 0;
    return fseeko(f, (off_t)n, SEEK_CUR) == 0;
}

/* Reads a string into a malloc'd buffer when keep is non-NULL, else skips it. */
static int read_string(FILE *f, char **keep) {
    uint64_t length;
    if (!read_exact(f, &length, 8) || length > ((uint64_t)1 << 24)) return 0;
    if (!keep) return skip_bytes(f, length);
    char *s = malloc((size_t)length + 1);
    if (!s || !read_exact(f, s, (size_t)length)) {
        free(s);
        return 0;
    }
    s[length] = '\0';
    *keep = s;
    return 1;
}

static int scalar_size(uint32_t type) {
    static const int sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8}; /* u8 i8 u16 i16 u32 i32 f32 bool str arr u64 i64 f64 */
    return type < sizeof sizes / sizeof sizes[0] ? sizes[type] : -1;
}

static int read_metadata(const char *path, metadata *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char magic[4];
    uint32_t version;
    uint64_t tensors, kvs;
    int ok = read_exact(f, magic, 4) && memcmp(magic, "GGUF", 4) == 0 && read_exact(f, &version, 4) &&
             (version == 2 || version == 3) && read_exact(f, &tensors, 8) && read_exact(f, &kvs, 8);
    for (uint64_t i = 0; ok && i < kvs; i++) {
        char *key = NULL;
        uint32_t type;
        ok = read_string(f, &key) && read_exact(f, &type, 4);
        if (!ok) {
            free(key);
            break;
        }
        if (type == 6 && strcmp(key, "llama.attention.layer_norm_rms_epsilon") == 0) {
            ok = read_exact(f, &out->epsilon, 4);
            out->have_epsilon = ok;
        } else if (type == 8) {
            ok = read_string(f, NULL);
        } else if (type == 9) {
            uint32_t element;
            uint64_t count;
            ok = read_exact(f, &element, 4) && read_exact(f, &count, 8);
            int tokens = ok && element == 8 && strcmp(key, "tokenizer.ggml.tokens") == 0;
            for (uint64_t j = 0; ok && j < count; j++) {
                if (element == 8) {
                    char **keep = NULL;
                    for (size_t t = 0; tokens && t < T; t++)
                        if (TOKEN_IDS[t] == j && !out->tokens[t]) keep = &out->tokens[t];
                    ok = read_string(f, keep);
                } else {
                    int size = scalar_size(element);
                    ok = size > 0 && skip_bytes(f, (uint64_t)size);
                }
            }
        } else {
            int size = scalar_size(type);
            ok = size > 0 && skip_bytes(f, (uint64_t)size);
        }
        free(key);
    }
    fclose(f);
    return ok;
}

/* ── the activations */

static void rmsnorm(const float *x, const float *weight, size_t K, double epsilon, float *out) {
    double sum = 0.0;
    for (size_t k = 0; k < K; k++) sum += (double)x[k] * (double)x[k];
    double inverse = 1.0 / sqrt(sum / (double)K + epsilon);
    for (size_t k = 0; k < K; k++) out[k] = (float)((double)x[k] * inverse * (double)weight[k]);
}

static int fail(const char *what, qmm_status status) {
    fprintf(stderr, "make_activations: %s: %s: %s\n", what, qmm_status_string(status), qmm_last_error());
    return 1;
}

static qmm_status find_norm(const qmm_checkpoint *checkpoint, const char *name, size_t K, const float **weight) {
    qmm_tensor t;
    qmm_status status = qmm_checkpoint_find_tensor(checkpoint, name, &t);
    if (status != QMM_OK) return status;
    if (t.dtype != QMM_F32 || t.ndim != 1 || t.shape[0] != (int64_t)K) return QMM_ERR_SHAPE;
    *weight = t.data;
    return QMM_OK;
}

/* out_f64[T, N] = oracle(layer, x[T, K] rounded to the layer's scale dtype). */
static qmm_status oracle(const qmm_layer *layer, const float *x, double *out) {
    size_t count = T * layer->matrix.cols;
    void *rounded = malloc(count * qmm_dtype_size(layer->matrix.dtype));
    if (!rounded) return QMM_ERR_OUT_OF_MEMORY;
    qmm_status status = qmm_convert(x, QMM_F32, rounded, layer->matrix.dtype, count);
    if (status == QMM_OK) status = qmm_ref_dense_f64(&layer->matrix, rounded, T, 1, out, NULL);
    free(rounded);
    return status;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: make_activations MODEL.gguf DIR\n");
        return 2;
    }
    const char *gguf_path = argv[1], *dir = argv[2];
    static const char *const attention[] = {"attn_q", "attn_k", "attn_v", "attn_output"};
    metadata meta;
    qmm_gguf *gguf = NULL;
    qmm_checkpoint *checkpoint = NULL;
    qmm_qmatrix embedding = {0};
    qmm_tensor unused = {0};
    qmm_layer gate, up;
    const float *attn_norm, *ffn_norm;
    float *rows = NULL, *attn_x = NULL, *ffn_x = NULL, *swiglu = NULL, *row_scales = NULL, *row_biases = NULL;
    double *gate_out = NULL, *up_out = NULL;
    int quantized = 0, rc = 1;
    size_t index;
    qmm_status status;

    if (!read_metadata(gguf_path, &meta)) {
        fprintf(stderr, "make_activations: cannot read the GGUF metadata of %s\n", gguf_path);
        return 1;
    }
    double epsilon = meta.have_epsilon ? (double)meta.epsilon : 1e-5;
    fprintf(stderr, "make_activations: rms epsilon %.9g (%s)\n", epsilon,
            meta.have_epsilon ? "llama.attention.layer_norm_rms_epsilon" : "default 1e-5");

    if ((status = qmm_gguf_open(gguf_path, &gguf)) != QMM_OK) { rc = fail(gguf_path, status); goto cleanup; }
    if ((status = qmm_gguf_find(gguf, "token_embd.weight", &index)) != QMM_OK) { rc = fail("token_embd", status); goto cleanup; }
    if ((status = qmm_gguf_import(gguf, index, &quantized, &embedding, &unused)) != QMM_OK) {
        rc = fail("token_embd import", status);
        goto cleanup;
    }
    if (!quantized) {
        fprintf(stderr, "make_activations: token_embd.weight is not quantized (Q8_0 expected)\n");
        goto cleanup;
    }
    const size_t K = embedding.cols, groups = K / (size_t)embedding.group_size;
    const size_t words = K * (size_t)embedding.bits / 32, scale_size = qmm_dtype_size(embedding.dtype);
    rows = malloc(T * K * sizeof *rows);
    attn_x = malloc(T * K * sizeof *attn_x);
    ffn_x = malloc(T * K * sizeof *ffn_x);
    if (!rows || !attn_x || !ffn_x) goto cleanup;

    /* Embedding rows: each token's row of token_embd as the exact Q8_0 value d·q (what llama.cpp computes
     * in f32). qmm_dequantize with the f16 scales would round each ŵ to f16 as mx.dequantize does, so the
     * row's scales and biases are widened to f32 first: then s·q' = d·(q + 128) and b = −128d are exact
     * in f32 (11 + 9 significant bits) and so is their sum d·q. */
    row_scales = malloc(groups * sizeof(float));
    row_biases = malloc(groups * sizeof(float));
    if (!row_scales || !row_biases) goto cleanup;
    printf("token ids and strings:\n");
    for (size_t t = 0; t < T; t++) {
        uint32_t id = TOKEN_IDS[t];
        if (id >= embedding.rows) {
            fprintf(stderr, "make_activations: token id %u >= vocabulary %zu\n", id, embedding.rows);
            goto cleanup;
        }
        qmm_qmatrix row = embedding;
        row.rows = 1;
        row.w = embedding.w + (size_t)id * words;
        row.dtype = QMM_F32;
        row.scales = row_scales;
        row.biases = row_biases;
        if ((status = qmm_convert((const char *)embedding.scales + (size_t)id * groups * scale_size, embedding.dtype,
                                  row_scales, QMM_F32, groups)) != QMM_OK ||
            (status = qmm_convert((const char *)embedding.biases + (size_t)id * groups * scale_size, embedding.dtype,
                                  row_biases, QMM_F32, groups)) != QMM_OK ||
            (status = qmm_dequantize(&row, rows + t * K, QMM_F32)) != QMM_OK) {
            rc = fail("dequantize", status);
            goto cleanup;
        }
        printf("  %5u  \"%s\"\n", id, meta.tokens[t] ? meta.tokens[t] : "?");
    }

    if ((status = qmm_checkpoint_open(dir, &checkpoint)) != QMM_OK) { rc = fail(dir, status); goto cleanup; }
    if ((status = find_norm(checkpoint, BLOCK "attn_norm.weight", K, &attn_norm)) != QMM_OK ||
        (status = find_norm(checkpoint, BLOCK "ffn_norm.weight", K, &ffn_norm)) != QMM_OK) {
        rc = fail("norm weights (f32 [K])", status);
        goto cleanup;
    }
    for (size_t t = 0; t < T; t++) {
        rmsnorm(rows + t * K, attn_norm, K, epsilon, attn_x + t * K);
        rmsnorm(rows + t * K, ffn_norm, K, epsilon, ffn_x + t * K);
    }

    if ((status = qmm_checkpoint_find_layer(checkpoint, BLOCK "ffn_gate", &gate)) != QMM_OK ||
        (status = qmm_checkpoint_find_layer(checkpoint, BLOCK "ffn_up", &up)) != QMM_OK) {
        rc = fail("ffn_gate / ffn_up", status);
        goto cleanup;
    }
    if (gate.matrix.cols != K || up.matrix.cols != K || up.matrix.rows != gate.matrix.rows) {
        fprintf(stderr, "make_activations: ffn_gate/ffn_up shapes disagree with K=%zu\n", K);
        goto cleanup;
    }
    const size_t hidden = gate.matrix.rows;
    gate_out = malloc(T * hidden * sizeof *gate_out);
    up_out = malloc(T * hidden * sizeof *up_out);
    swiglu = malloc(T * hidden * sizeof *swiglu);
    if (!gate_out || !up_out || !swiglu) goto cleanup;
    if ((status = oracle(&gate, ffn_x, gate_out)) != QMM_OK || (status = oracle(&up, ffn_x, up_out)) != QMM_OK) {
        rc = fail("oracle", status);
        goto cleanup;
    }
    for (size_t i = 0; i < T * hidden; i++) {
        double g = gate_out[i];
        swiglu[i] = (float)(g / (1.0 + exp(-g)) * up_out[i]);
    }

    /* One tensor per layer, named exactly like the layer. */
    char names[7][64];
    qmm_tensor tensors[7];
    for (int i = 0; i < 7; i++) {
        const char *layer = i < 4 ? attention[i] : i == 4 ? "ffn_gate" : i == 5 ? "ffn_up" : "ffn_down";
        snprintf(names[i], sizeof names[i], BLOCK "%s", layer);
        size_t cols = i == 6 ? hidden : K;
        qmm_tensor t = {names[i], QMM_F32, 2, {(int64_t)T, (int64_t)cols}, i == 6 ? (const void *)swiglu
                                                                             : i < 4 ? (const void *)attn_x
                                                                                     : (const void *)ffn_x,
                        T * cols * sizeof(float)};
        tensors[i] = t;
    }
    char ids[256] = "";
    for (size_t t = 0; t < T; t++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%u", t ? "," : "", TOKEN_IDS[t]);
    char eps_text[32];
    snprintf(eps_text, sizeof eps_text, "%.9g", epsilon);
    const char *keys[] = {"token_ids", "rms_norm_eps", "made_by"};
    const char *values[] = {ids, eps_text, "tools/make_activations.c (see data/NOTICE)"};
    char path[4096];
    snprintf(path, sizeof path, "%s/activations.safetensors", dir);
    if ((status = qmm_safetensors_write(path, tensors, 7, keys, values, 3)) != QMM_OK) {
        rc = fail(path, status);
        goto cleanup;
    }
    printf("wrote %s: 7 tensors of %zu tokens\n", path, (size_t)T);
    rc = 0;
cleanup:
    for (size_t t = 0; t < T; t++) free(meta.tokens[t]);
    qmm_gguf_import_free(&embedding, &unused);
    qmm_checkpoint_close(checkpoint);
    qmm_gguf_close(gguf);
    free(rows);
    free(row_scales);
    free(row_biases);
    free(attn_x);
    free(ffn_x);
    free(swiglu);
    free(gate_out);
    free(up_out);
    return rc;
}
