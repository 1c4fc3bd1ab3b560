/*
 * test_checkpoint.c — MLX checkpoint directories: qmm_checkpoint_write → qmm_checkpoint_open round trip
 * with random layers of mixed formats, a hand-made 2-shard checkpoint (with and without
 * model.safetensors.index.json, per-layer overrides and false), qmm_config_parse, and the errors:
 * missing/bad config.json, formats outside the sets, layers that disagree with the config,
 * failed writes that must leave nothing behind, and a failed write over an existing checkpoint that
 * must leave the old one intact.
 */
#include "check.h"
#include "internal.h"
#include "io_internal.h"
#include "io_test_util.h"

#include <cjson/cJSON.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool message_has(const char *needle) { return strstr(qmm_last_error(), needle) != NULL; }

static size_t matrix_bytes(const qmm_qmatrix *m, int which) {
    size_t rows = m->rows;
    if (which == 0) return rows * (m->cols * (size_t)m->bits / 32) * 4;
    return rows * (m->cols / (size_t)m->group_size) * qmm_dtype_size(m->dtype);
}

static bool same_matrix(const qmm_qmatrix *a, const qmm_qmatrix *b) {
    return a->rows == b->rows && a->cols == b->cols && a->bits == b->bits && a->group_size == b->group_size &&
           a->dtype == b->dtype && memcmp(a->w, b->w, matrix_bytes(a, 0)) == 0 &&
           memcmp(a->scales, b->scales, matrix_bytes(a, 1)) == 0 &&
           memcmp(a->biases, b->biases, matrix_bytes(a, 1)) == 0;
}

/* ── write → open round trip ── */

static void test_round_trip(const char *root) {
    check_rng rng = check_rng_make(11);
    const struct {
        const char *name;
        size_t rows, cols;
        int bits, group_size;
        qmm_dtype dtype;
    } specs[] = {
        {"model.layers.1.mlp.down_proj", 6, 128, 4, 64, QMM_F16},
        {"model.layers.0.self_attn.q_proj", 5, 256, 4, 64, QMM_F16},
        {"model.embed_tokens", 7, 64, 8, 32, QMM_F16},
        {"model.layers.0.mlp.up_proj", 3, 192, 3, 64, QMM_BF16},
        {"lm_head", 2, 128, 4, 64, QMM_F32},
        {"model.layers.0.self_attn.k_proj", 4, 384, 6, 128, QMM_F16},
    };
    enum { LAYERS = sizeof specs / sizeof specs[0] };
    check_qmatrix q[LAYERS];
    qmm_layer layers[LAYERS];
    memset(layers, 0, sizeof layers); /* experts 0: plain layers */
    for (int i = 0; i < LAYERS; i++) {
        CHECK(check_qmatrix_random(&rng, specs[i].rows, specs[i].cols, specs[i].bits, specs[i].group_size,
                                   specs[i].dtype, &q[i]),
              "random matrix %d", i);
        layers[i].name = specs[i].name;
        layers[i].matrix = q[i].m;
    }
    float norm[10];
    check_fill_uniform(&rng, norm, QMM_F32, 10, -1, 1);
    qmm_tensor floats[1] = {
        {.name = "model.norm.weight", .dtype = QMM_F32, .ndim = 1, .shape = {10}, .data = norm, .nbytes = sizeof norm}};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, "round");
    CHECK_OK(qmm_checkpoint_write(dir, floats, 1, layers, LAYERS,
                                  "{\"model_type\": \"llama\", \"hidden_size\": 64, \"quantization\": {\"bits\": 2}}"));
    CHECK(io_count_entries(dir) == 2, "the directory has %d entries, want 2 (config.json, model.safetensors)",
          io_count_entries(dir));

    qmm_checkpoint *ck = NULL;
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    if (ck) {
        int bits = -1, group_size = -1;
        CHECK_OK(qmm_checkpoint_default_format(ck, &bits, &group_size));
        CHECK(bits == 4 && group_size == 64, "default format %d/%d, want the most common 4/64", bits, group_size);
        CHECK(qmm_checkpoint_layer_count(ck) == LAYERS, "layer count %zu", qmm_checkpoint_layer_count(ck));
        CHECK(qmm_checkpoint_tensor_count(ck) == 1 + 3 * LAYERS, "tensor count %zu", qmm_checkpoint_tensor_count(ck));
        for (int i = 0; i < LAYERS; i++) {
            qmm_layer got;
            CHECK_OK(qmm_checkpoint_find_layer(ck, specs[i].name, &got));
            CHECK(same_matrix(&got.matrix, &q[i].m), "layer %s differs after the round trip", specs[i].name);
            CHECK((uintptr_t)got.matrix.w % 4 == 0, "layer %s: w misaligned", specs[i].name);
        }
        const char *previous = "";
        for (size_t i = 0; i < qmm_checkpoint_layer_count(ck); i++) {
            qmm_layer got;
            CHECK_OK(qmm_checkpoint_layer(ck, i, &got));
            CHECK(strcmp(previous, got.name) < 0, "layers not in name order: %s then %s", previous, got.name);
            previous = got.name;
        }
        qmm_tensor t;
        CHECK_OK(qmm_checkpoint_find_tensor(ck, "model.norm.weight", &t));
        CHECK(t.dtype == QMM_F32 && t.nbytes == sizeof norm && memcmp(t.data, norm, sizeof norm) == 0, "norm differs");
        CHECK_OK(qmm_checkpoint_find_tensor(ck, "model.embed_tokens.scales", &t));
        CHECK(t.ndim == 2 && t.shape[0] == 7 && t.shape[1] == 2 && t.dtype == QMM_F16, "embed scales shape");
        CHECK_STATUS(qmm_checkpoint_find_tensor(ck, "nothing.here", &t), QMM_ERR_NOT_FOUND);
        CHECK(message_has("nothing.here"), "message: %s", qmm_last_error());
        qmm_layer missing;
        CHECK_STATUS(qmm_checkpoint_find_layer(ck, "model.norm", &missing), QMM_ERR_NOT_FOUND);
        CHECK_STATUS(qmm_checkpoint_layer(ck, LAYERS, &missing), QMM_ERR_INVALID_ARGUMENT);
        qmm_checkpoint_close(ck);
    }

    /* config.json: the extra members are kept, the stale "quantization" replaced, overrides per layer. */
    char *text = io_read_file(io_path(dir, "config.json"), NULL);
    cJSON *config = text ? cJSON_Parse(text) : NULL;
    CHECK(config != NULL, "config.json does not parse");
    if (config) {
        cJSON *type = cJSON_GetObjectItem(config, "model_type");
        CHECK(cJSON_IsString(type) && strcmp(type->valuestring, "llama") == 0, "model_type lost");
        const char *keys[2] = {"quantization", "quantization_config"};
        for (int k = 0; k < 2; k++) {
            cJSON *quantization = cJSON_GetObjectItem(config, keys[k]);
            cJSON *gs = cJSON_GetObjectItem(quantization, "group_size");
            CHECK(cJSON_IsNumber(gs) && gs->valueint == 64, "%s.group_size", keys[k]);
            cJSON *embed = cJSON_GetObjectItem(quantization, "model.embed_tokens");
            CHECK(embed && cJSON_GetObjectItem(embed, "bits")->valueint == 8, "%s: no 8-bit override for embed",
                  keys[k]);
            CHECK(cJSON_GetObjectItem(quantization, "lm_head") == NULL, "%s: lm_head has the default format", keys[k]);
            CHECK(cJSON_GetArraySize(quantization) == 2 + 3, "%s has %d members, want 5", keys[k],
                  cJSON_GetArraySize(quantization));
        }
        cJSON_Delete(config);
    }
    free(text);
    for (int i = 0; i < LAYERS; i++)
        check_qmatrix_free(&q[i]);
}

/* ── a 2-shard checkpoint made by hand ── */

static qmm_tensor tensor_2d(const char *name, qmm_dtype dtype, int64_t rows, int64_t cols, const void *data) {
    qmm_tensor t = {.name = name, .dtype = dtype, .ndim = 2, .shape = {rows, cols}, .data = data};
    t.nbytes = (size_t)(rows * cols) * qmm_dtype_size(dtype);
    return t;
}

static void test_two_shards(const char *root) {
    check_rng rng = check_rng_make(12);
    check_qmatrix a, b;
    CHECK(check_qmatrix_random(&rng, 4, 128, 4, 64, QMM_F16, &a), "matrix a");
    CHECK(check_qmatrix_random(&rng, 3, 64, 8, 32, QMM_F16, &b), "matrix b");
    uint16_t head[6 * 8];
    check_fill_uniform(&rng, head, QMM_F16, 6 * 8, -1, 1);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, "sharded");
    mkdir(dir, 0755);
    qmm_tensor shard1[3] = {tensor_2d("layers.0.q.weight", QMM_U32, 4, 16, a.w),
                            tensor_2d("layers.0.q.scales", QMM_F16, 4, 2, a.scales),
                            tensor_2d("layers.0.q.biases", QMM_F16, 4, 2, a.biases)};
    qmm_tensor shard2[4] = {
        tensor_2d("layers.1.o.weight", QMM_U32, 3, 16, b.w), tensor_2d("layers.1.o.scales", QMM_F16, 3, 2, b.scales),
        tensor_2d("layers.1.o.biases", QMM_F16, 3, 2, b.biases), tensor_2d("lm_head.weight", QMM_F16, 6, 8, head)};
    CHECK_OK(qmm_safetensors_write(io_path(dir, "model-00001-of-00002.safetensors"), shard1, 3, NULL, NULL, 0));
    CHECK_OK(qmm_safetensors_write(io_path(dir, "model-00002-of-00002.safetensors"), shard2, 4, NULL, NULL, 0));
    const char *config = "{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"mode\": \"affine\","
                         " \"layers.1.o\": {\"group_size\": 32, \"bits\": 8}, \"lm_head\": false}}";
    CHECK(io_write_file(io_path(dir, "config.json"), config, strlen(config)), "write config");

    for (int with_index = 0; with_index < 2; with_index++) {
        if (with_index) {
            const char *index = "{\"metadata\": {}, \"weight_map\": {"
                                "\"layers.0.q.weight\": \"model-00001-of-00002.safetensors\","
                                "\"layers.1.o.scales\": \"model-00002-of-00002.safetensors\","
                                "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}";
            CHECK(io_write_file(io_path(dir, "model.safetensors.index.json"), index, strlen(index)), "write index");
        }
        qmm_checkpoint *ck = NULL;
        CHECK_OK(qmm_checkpoint_open(dir, &ck));
        if (!ck) continue;
        CHECK(qmm_checkpoint_tensor_count(ck) == 7, "tensor count %zu, want 7", qmm_checkpoint_tensor_count(ck));
        CHECK(qmm_checkpoint_layer_count(ck) == 2, "layer count %zu, want 2", qmm_checkpoint_layer_count(ck));
        qmm_layer layer;
        CHECK_OK(qmm_checkpoint_find_layer(ck, "layers.0.q", &layer));
        CHECK(same_matrix(&layer.matrix, &a.m), "layers.0.q differs (index %d)", with_index);
        CHECK_OK(qmm_checkpoint_find_layer(ck, "layers.1.o", &layer));
        CHECK(layer.matrix.bits == 8 && layer.matrix.group_size == 32, "override: %d/%d", layer.matrix.bits,
              layer.matrix.group_size);
        CHECK(same_matrix(&layer.matrix, &b.m), "layers.1.o differs (index %d)", with_index);
        qmm_tensor t;
        CHECK_OK(qmm_checkpoint_find_tensor(ck, "lm_head.weight", &t));
        CHECK(t.nbytes == sizeof head && memcmp(t.data, head, sizeof head) == 0, "lm_head differs");
        qmm_checkpoint_close(ck);
    }

    /* With the index (still in place): a model*.safetensors it does not name, beside its shards, is refused (mlx_lm
     * globs model*.safetensors and would read it too) */
    CHECK_OK(qmm_safetensors_write(io_path(dir, "model.safetensors"), shard2 + 3, 1, NULL, NULL, 0));
    {
        qmm_checkpoint *stray = (qmm_checkpoint *)&rng;
        CHECK_STATUS(qmm_checkpoint_open(dir, &stray), QMM_ERR_CORRUPT);
        CHECK(message_has("names 2 shards, but the directory also holds model.safetensors"), "message: %s",
              qmm_last_error());
        CHECK(stray == NULL, "handle not reset on failure");
    }
    remove(io_path(dir, "model.safetensors"));

    /* An index that puts a tensor in the wrong shard, or names a missing shard. */
    const char *wrong = "{\"weight_map\": {\"layers.0.q.weight\": \"model-00002-of-00002.safetensors\","
                        "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}";
    CHECK(io_write_file(io_path(dir, "model.safetensors.index.json"), wrong, strlen(wrong)), "write index");
    qmm_checkpoint *ck = (qmm_checkpoint *)&rng;
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("layers.0.q.weight"), "message: %s", qmm_last_error());
    CHECK(ck == NULL, "handle not reset on failure");
    const char *missing = "{\"weight_map\": {\"x\": \"model-00003-of-00003.safetensors\"}}";
    CHECK(io_write_file(io_path(dir, "model.safetensors.index.json"), missing, strlen(missing)), "write index");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_NOT_FOUND);
    CHECK(message_has("model-00003-of-00003"), "message: %s", qmm_last_error());
    const char *escape = "{\"weight_map\": {\"x\": \"../elsewhere.safetensors\"}}";
    CHECK(io_write_file(io_path(dir, "model.safetensors.index.json"), escape, strlen(escape)), "write index");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    remove(io_path(dir, "model.safetensors.index.json"));

    /* Without an index, a numbered set of shards must be whole: shard 2 of 2 missing, or numbers out of range. */
    CHECK(rename(io_path(dir, "model-00002-of-00002.safetensors"), io_path(dir, "aside.bin")) == 0, "rename");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_NOT_FOUND);
    CHECK(message_has("model-00001-of-00002.safetensors") && message_has("shard 2 of them is missing"), "message: %s",
          qmm_last_error());
    CHECK(rename(io_path(dir, "aside.bin"), io_path(dir, "model-00003-of-00002.safetensors")) == 0, "rename");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("numbered 3 of 2"), "message: %s", qmm_last_error());
    /* a number of more than 9 digits: its set cannot be checked, so the name is refused rather than loaded unchecked */
    CHECK(rename(io_path(dir, "model-00003-of-00002.safetensors"), io_path(dir, "model-00002-of-99999999999.safetensors")) == 0,
          "rename");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("model-00002-of-99999999999.safetensors") && message_has("more than 9 digits"), "message: %s",
          qmm_last_error());
    CHECK(rename(io_path(dir, "model-00002-of-99999999999.safetensors"), io_path(dir, "model-00002-of-00002.safetensors")) == 0,
          "rename");
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    qmm_checkpoint_close(ck);
    ck = NULL;

    /* The same tensor in two shards. */
    qmm_tensor dup[1] = {tensor_2d("lm_head.weight", QMM_F16, 6, 8, head)};
    CHECK_OK(qmm_safetensors_write(io_path(dir, "model-extra.safetensors"), dup, 1, NULL, NULL, 0));
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("lm_head.weight") && message_has("two shards"), "message: %s", qmm_last_error());
    remove(io_path(dir, "model-extra.safetensors"));

    /* The config says lm_head is not quantized, but it has scales. */
    qmm_tensor scaled[3] = {tensor_2d("lm_head.weight", QMM_U32, 4, 16, a.w),
                            tensor_2d("lm_head.scales", QMM_F16, 4, 2, a.scales),
                            tensor_2d("lm_head.biases", QMM_F16, 4, 2, a.biases)};
    CHECK_OK(qmm_safetensors_write(io_path(dir, "model-00002-of-00002.safetensors"), scaled, 3, NULL, NULL, 0));
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("lm_head") && message_has("false"), "message: %s", qmm_last_error());

    check_qmatrix_free(&a);
    check_qmatrix_free(&b);
}

/* ── layers that disagree with config.json ── */

static void write_single(const char *dir, const qmm_tensor *tensors, size_t count, const char *config) {
    mkdir(dir, 0755);
    CHECK_OK(qmm_safetensors_write(io_path(dir, "model.safetensors"), tensors, count, NULL, NULL, 0));
    CHECK(io_write_file(io_path(dir, "config.json"), config, strlen(config)), "write config");
}

/* A layer's object in config.json that leaves out bits or group_size: MLX's nn.quantize calls to_quantized(**object),
 * so the member takes to_quantized's affine default (4 bits, group 64), not the config's default format (which qmm
 * used until a break-it helper compared the two). The config's default here (8 bits, group 32) differs from both
 * layers, so the old reading refused them. */
static void test_layer_object_defaults(const char *root) {
    check_rng rng = check_rng_make(21);
    check_qmatrix a, c;
    CHECK(check_qmatrix_random(&rng, 4, 128, 4, 64, QMM_F16, &a), "matrix a");
    CHECK(check_qmatrix_random(&rng, 2, 128, 8, 64, QMM_F16, &c), "matrix c");
    const qmm_tensor tensors[6] = {
        tensor_2d("la.weight", QMM_U32, 4, 16, a.w), tensor_2d("la.scales", QMM_F16, 4, 2, a.scales),
        tensor_2d("la.biases", QMM_F16, 4, 2, a.biases), tensor_2d("lc.weight", QMM_U32, 2, 32, c.w),
        tensor_2d("lc.scales", QMM_F16, 2, 2, c.scales), tensor_2d("lc.biases", QMM_F16, 2, 2, c.biases)};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, "layer-defaults");
    write_single(dir, tensors, 6,
                 "{\"quantization\": {\"group_size\": 32, \"bits\": 8, \"la\": {\"group_size\": 64},"
                 " \"lc\": {\"bits\": 8}}}");
    qmm_checkpoint *ck = NULL;
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    if (ck) {
        qmm_layer layer;
        CHECK_OK(qmm_checkpoint_find_layer(ck, "la", &layer));
        CHECK(layer.matrix.bits == 4 && layer.matrix.group_size == 64, "la {group_size: 64}: %d bits, group %d",
              layer.matrix.bits, layer.matrix.group_size);
        CHECK(same_matrix(&layer.matrix, &a.m), "la differs");
        CHECK_OK(qmm_checkpoint_find_layer(ck, "lc", &layer));
        CHECK(layer.matrix.bits == 8 && layer.matrix.group_size == 64, "lc {bits: 8}: %d bits, group %d",
              layer.matrix.bits, layer.matrix.group_size);
        CHECK(same_matrix(&layer.matrix, &c.m), "lc differs");
        qmm_checkpoint_close(ck);
    }
    check_qmatrix_free(&a);
    check_qmatrix_free(&c);
}

static void test_inconsistent_layers(const char *root) {
    check_rng rng = check_rng_make(13);
    check_qmatrix a;
    CHECK(check_qmatrix_random(&rng, 4, 128, 4, 64, QMM_F16, &a), "matrix");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, "bad-layers");
    const char *config = "{\"quantization\": {\"group_size\": 64, \"bits\": 4}}";
    qmm_checkpoint *ck = NULL;

    qmm_tensor good[3] = {tensor_2d("p.weight", QMM_U32, 4, 16, a.w), tensor_2d("p.scales", QMM_F16, 4, 2, a.scales),
                          tensor_2d("p.biases", QMM_F16, 4, 2, a.biases)};
    write_single(dir, good, 3, config);
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    qmm_checkpoint_close(ck);

    /* group_size 32 in the config: 128 columns need 4 groups, the scales have 2. */
    write_single(dir, good, 3, "{\"quantization\": {\"group_size\": 32, \"bits\": 4}}");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("\"p\"") && message_has("groups"), "message: %s", qmm_last_error());
    /* bits 3: 16 words = 512 bits per row is not a whole number of 3-bit codes. */
    write_single(dir, good, 3, "{\"quantization\": {\"group_size\": 64, \"bits\": 3}}");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    /* The layer's own entry neither an object nor a bool (MLX's nn.quantize refuses it); an entry of that kind for a
     * name that is no layer is never read, by MLX or here. */
    write_single(dir, good, 3, "{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"p\": [1]}}");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("layer \"p\" is an array"), "message: %s", qmm_last_error());
    write_single(dir, good, 3, "{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"p\": 8}}");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("layer \"p\" is a number"), "message: %s", qmm_last_error());
    /* A falsy entry (0, null, "", [], {}) leaves the layer unquantized, as in MLX: refused, since p has scales. */
    static const char *const falsy[] = {"0", "null", "\"\"", "[]", "{}"};
    for (size_t i = 0; i < sizeof falsy / sizeof falsy[0]; i++) {
        char falsy_config[128];
        snprintf(falsy_config, sizeof falsy_config, "{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"p\": %s}}",
                 falsy[i]);
        write_single(dir, good, 3, falsy_config);
        CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
        CHECK(message_has("layer \"p\" is not quantized"), "%s: message: %s", falsy[i], qmm_last_error());
    }
    write_single(dir, good, 3, "{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"q\": [1], \"note\": \"x\"}}");
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    qmm_checkpoint_close(ck);
    ck = NULL;
    /* No quantization in the config at all, but scales exist. */
    write_single(dir, good, 3, "{\"model_type\": \"llama\"}");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("no quantization format"), "message: %s", qmm_last_error());

    qmm_tensor f16_weight[3] = {tensor_2d("p.weight", QMM_F16, 4, 32, a.w), good[1], good[2]};
    write_single(dir, f16_weight, 3, config);
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("u32"), "message: %s", qmm_last_error());
    qmm_tensor no_biases[2] = {good[0], good[1]};
    write_single(dir, no_biases, 2, config);
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    CHECK(message_has("p.biases"), "message: %s", qmm_last_error());
    qmm_tensor mixed[3] = {good[0], good[1], tensor_2d("p.biases", QMM_BF16, 4, 2, a.biases)};
    write_single(dir, mixed, 3, config);
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    qmm_tensor rows[3] = {good[0], tensor_2d("p.scales", QMM_F16, 2, 4, a.scales), good[2]};
    write_single(dir, rows, 3, config);
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);

    /* A stacked (MoE SwitchLinear) layer: weight [E, N, words], scales [E, N, groups] → E·N rows. */
    qmm_tensor stacked[3] = {good[0], good[1], good[2]};
    for (int k = 0; k < 3; k++) {
        stacked[k].ndim = 3;
        stacked[k].shape[2] = stacked[k].shape[1];
        stacked[k].shape[0] = 2;
        stacked[k].shape[1] = 2;
    }
    write_single(dir, stacked, 3, config);
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    if (ck) {
        qmm_layer layer;
        CHECK_OK(qmm_checkpoint_find_layer(ck, "p", &layer));
        CHECK(layer.matrix.rows == 4 && layer.matrix.cols == 128 && same_matrix(&layer.matrix, &a.m),
              "stacked layer: %zu x %zu", layer.matrix.rows, layer.matrix.cols);
        qmm_checkpoint_close(ck);
    }
    stacked[1].shape[0] = 4;
    stacked[1].shape[1] = 1;
    write_single(dir, stacked, 3, config);
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);

    /* An MLX-written shard: unpadded header, so every array sits at an odd address. The layer must
     * still come out aligned (copied) and equal. */
    char header[512];
    snprintf(header, sizeof header, "%s",
             "{\"p.biases\":{\"data_offsets\":[1,17],\"dtype\":\"F16\",\"shape\":[4,2]},"
             "\"p.scales\":{\"data_offsets\":[17,33],\"dtype\":\"F16\",\"shape\":[4,2]},"
             "\"p.weight\":{\"data_offsets\":[33,289],\"dtype\":\"U32\",\"shape\":[4,16]},"
             "\"pad\":{\"data_offsets\":[0,1],\"dtype\":\"U8\",\"shape\":[1]}}");
    /* Data area 4-aligned in the page-aligned mapping: then offsets 1, 17, 33 are all misaligned. */
    while ((8 + strlen(header)) % 4 != 0)
        strcat(header, " ");
    uint8_t data[289] = {7};
    memcpy(data + 1, a.biases, 16);
    memcpy(data + 17, a.scales, 16);
    memcpy(data + 33, a.w, 256);
    io_buf image = io_safetensors_image(header, data, sizeof data);
    CHECK(io_write_file(io_path(dir, "model.safetensors"), image.data, image.size), "write mlx shard");
    io_buf_free(&image);
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    if (ck) {
        qmm_tensor raw;
        CHECK_OK(qmm_checkpoint_find_tensor(ck, "p.weight", &raw));
        CHECK((uintptr_t)raw.data % 4 != 0, "test setup: p.weight should sit at a misaligned address");
        qmm_layer layer;
        CHECK_OK(qmm_checkpoint_find_layer(ck, "p", &layer));
        CHECK((uintptr_t)layer.matrix.w % 4 == 0 && (uintptr_t)layer.matrix.scales % 2 == 0 &&
                  (uintptr_t)layer.matrix.biases % 2 == 0,
              "layer arrays are not aligned");
        CHECK(same_matrix(&layer.matrix, &a.m), "the misaligned layer differs");
        qmm_checkpoint_close(ck);
    }
    /* Out of memory at the second or third aligned copy: the copies already made are freed (the ASan
     * build's leak check sees any that is not), and the failure names the array. */
    for (size_t fail_at = 1; fail_at <= 3; fail_at++) {
        qmm_io_fail_aligned_copy = fail_at;
        ck = NULL;
        CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_OUT_OF_MEMORY);
        CHECK(ck == NULL && message_has("to align"), "copy %zu: %s", fail_at, qmm_last_error());
        qmm_io_fail_aligned_copy = 0;
    }
    io_remove_tree(dir);
    check_qmatrix_free(&a);
}

/* ── config.json ── */

static void test_config(const char *root) {
    int bits = -1, group_size = -1;
    const char *plain = "{\"quantization\": {\"group_size\": 128, \"bits\": 6}}";
    CHECK_OK(qmm_config_parse(plain, strlen(plain), &bits, &group_size));
    CHECK(bits == 6 && group_size == 128, "parsed %d/%d", bits, group_size);
    const char *fallback = "{\"quantization_config\": {\"group_size\": 32, \"bits\": 2}}";
    CHECK_OK(qmm_config_parse(fallback, strlen(fallback), &bits, &group_size));
    CHECK(bits == 2 && group_size == 32, "quantization_config: %d/%d", bits, group_size);
    const char *none = "{\"model_type\": \"qwen3\"}";
    CHECK_OK(qmm_config_parse(none, strlen(none), &bits, &group_size));
    CHECK(bits == 0 && group_size == 0, "no quantization: %d/%d", bits, group_size);
    const char *off = "{\"quantization\": false}";
    CHECK_OK(qmm_config_parse(off, strlen(off), &bits, &group_size));
    CHECK(bits == 0 && group_size == 0, "quantization false: %d/%d", bits, group_size);
    /* keys of the same names outside the quantization objects are the model's own: any number */
    const char *hyper = "{\"group_size\": 1.5, \"vision\": {\"bits\": -2e0}, \"quantization\": {\"group_size\": 64, \"bits\": 4}}";
    CHECK_OK(qmm_config_parse(hyper, strlen(hyper), &bits, &group_size));
    CHECK(bits == 4 && group_size == 64, "hyperparameters beside the quantization: %d/%d", bits, group_size);
    /* The buffer is not NUL-terminated where size ends: only the first 2 bytes are the JSON. */
    const char *prefix = "{}garbage that must not be read";
    CHECK_OK(qmm_config_parse(prefix, 2, &bits, &group_size));

    static const struct {
        const char *json;
        qmm_status status;
        const char *needle;
    } bad[] = {
        {"[1]", QMM_ERR_CORRUPT, "object"},
        {"{\"quantization\": ", QMM_ERR_CORRUPT, "JSON"},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 7}}", QMM_ERR_FORMAT, "bits=7"},
        {"{\"quantization\": {\"group_size\": 48, \"bits\": 4}}", QMM_ERR_FORMAT, "group_size=48"},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": \"4\"}}", QMM_ERR_CORRUPT, "bits"},
        /* whole numbers written as floats: MLX's quantize refuses them (a Python float), so qmm does, naming them */
        {"{\"quantization\": {\"group_size\": 64.0, \"bits\": 4}}", QMM_ERR_CORRUPT,
         "the number 64.0 at byte 32 is not written as an integer"},
        {"{\"quantization_config\": {\"group_size\": 64, \"bits\": 4e0}}", QMM_ERR_CORRUPT, "4e0"},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"model.l\": {\"bits\": 08}}}", QMM_ERR_CORRUPT, "08"},
        {"{\"quantization\": {\"group_size\": 64}}", QMM_ERR_CORRUPT, "bits"},
        {"{\"quantization\": \"yes\"}", QMM_ERR_CORRUPT, "quantization"},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"mode\": \"mxfp4\"}}", QMM_ERR_UNSUPPORTED, "mxfp4"},
        {"{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128}}",
         QMM_ERR_UNSUPPORTED, "awq"},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"bits\": 8}}", QMM_ERR_CORRUPT, "twice"},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"a.b\": {\"bits\": 5, \"group_size\": 16}}}",
         QMM_ERR_FORMAT, "a.b"},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4}} trailing", QMM_ERR_CORRUPT, "after"},
        {"", QMM_ERR_CORRUPT, "JSON"},
        /* "quantization_config" must say what "quantization" says (mlx-lm writes one as a copy of the other). */
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4}, \"quantization_config\": {\"group_size\": 64, "
         "\"bits\": 8}}",
         QMM_ERR_CORRUPT, "bits=4 group_size=64 vs bits=8 group_size=64"},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"a\": false}, \"quantization_config\": "
         "{\"group_size\": 64, \"bits\": 4}}",
         QMM_ERR_CORRUPT, "layer \"a\""},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"a\": {\"bits\": 8}}, \"quantization_config\": "
         "{\"group_size\": 64, \"bits\": 4, \"a\": {\"bits\": 2}}}",
         QMM_ERR_CORRUPT, "layer \"a\""},
        {"{\"quantization\": false, \"quantization_config\": {\"group_size\": 64, \"bits\": 4}}", QMM_ERR_CORRUPT,
         "disagrees"},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4}, \"quantization_config\": {\"quant_method\": "
         "\"awq\"}}",
         QMM_ERR_CORRUPT, "awq"},
        /* A layer key with a NUL byte would be cut to another layer's name. */
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"a\\u0000b\": false}}", QMM_ERR_CORRUPT,
         "holds a NUL byte"},
        /* A per-layer format key given twice: the same disagreement. */
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"a\": {\"bits\": 8, \"bits\": 4}}}", QMM_ERR_CORRUPT,
         "\"bits\" appears 2 times"},
        /* A top-level format key given twice: cJSON reads the first copy, Python's json (mlx-lm) the last. */
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4}, \"quantization\": {\"group_size\": 64, "
         "\"bits\": 8}}",
         QMM_ERR_CORRUPT, "top-level key \"quantization\" 2 times"},
        {"{\"quantization\": {\"group_size\": 64, \"bits\": 4}, \"quantization_config\": {\"group_size\": 64, "
         "\"bits\": 4}, \"quantization_config\": {\"group_size\": 64, \"bits\": 8}}",
         QMM_ERR_CORRUPT, "top-level key \"quantization_config\" 2 times"},
        {"{\"quantization_config\": {\"group_size\": 64, \"bits\": 4}, \"quantization_config\": false}",
         QMM_ERR_CORRUPT, "top-level key \"quantization_config\" 2 times"},
    };
    /* The same content twice, in another member order and spelling, agrees. */
    const char *agree = "{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"a\": {\"bits\": 8}, \"b\": false},"
                        " \"quantization_config\": {\"b\": false, \"a\": {\"group_size\": 64, \"bits\": 8.0},"
                        " \"bits\": 4, \"group_size\": 64, \"mode\": \"affine\"}}";
    CHECK_OK(qmm_config_parse(agree, strlen(agree), &bits, &group_size));
    /* Other top-level keys may repeat (qmm reads none of them). */
    const char *other_twice = "{\"model_type\": \"a\", \"model_type\": \"b\", \"quantization\": {\"group_size\": 64, "
                              "\"bits\": 4}}";
    CHECK_OK(qmm_config_parse(other_twice, strlen(other_twice), &bits, &group_size));
    CHECK(bits == 4 && group_size == 64, "agreeing copies: %d/%d", bits, group_size);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qmm_error_clear();
        qmm_status status = qmm_config_parse(bad[i].json, strlen(bad[i].json), &bits, &group_size);
        CHECK(status == bad[i].status && qmm_last_error()[0], "config %zu (%s): %s (want %s) \"%s\"", i, bad[i].json,
              qmm_status_string(status), qmm_status_string(bad[i].status), qmm_last_error());
        CHECK(message_has(bad[i].needle), "config %zu: message \"%s\" lacks \"%s\"", i, qmm_last_error(),
              bad[i].needle);
    }

    /* Through qmm_checkpoint_open: missing config, bad config, no shard, no directory. */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, "configs");
    mkdir(dir, 0755);
    qmm_checkpoint *ck = NULL;
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_NOT_FOUND);
    CHECK(message_has("config.json"), "message: %s", qmm_last_error());
    CHECK(io_write_file(io_path(dir, "config.json"), "[]", 2), "write");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_CORRUPT);
    const char *seven = "{\"quantization\": {\"group_size\": 64, \"bits\": 7}}";
    CHECK(io_write_file(io_path(dir, "config.json"), seven, strlen(seven)), "write");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_FORMAT);
    CHECK(message_has("bits=7"), "message: %s", qmm_last_error());
    const char *g48 = "{\"quantization\": {\"group_size\": 48, \"bits\": 4}}";
    CHECK(io_write_file(io_path(dir, "config.json"), g48, strlen(g48)), "write");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_FORMAT);
    CHECK(io_write_file(io_path(dir, "config.json"), plain, strlen(plain)), "write");
    CHECK_STATUS(qmm_checkpoint_open(dir, &ck), QMM_ERR_NOT_FOUND);
    CHECK(message_has("shard"), "message: %s", qmm_last_error());
    CHECK_STATUS(qmm_checkpoint_open(io_path(root, "does-not-exist"), &ck), QMM_ERR_IO);
    CHECK(ck == NULL, "handle not NULL");

    /* config.json, the index or a shard that is a FIFO: refused, never waited on (opening a FIFO for
     * reading used to block until a writer came; the alarm turns a regression into a failure). */
    alarm(30);
    const char *fifo_names[] = {"config.json", "model.safetensors.index.json", "model.safetensors"};
    for (int k = 0; k < 3; k++) {
        char fifo_dir[1024];
        snprintf(fifo_dir, sizeof fifo_dir, "%s/fifo-%d", root, k);
        mkdir(fifo_dir, 0755);
        if (k > 0) CHECK(io_write_file(io_path(fifo_dir, "config.json"), plain, strlen(plain)), "write");
        CHECK(mkfifo(io_path(fifo_dir, fifo_names[k]), 0644) == 0, "mkfifo %s", fifo_names[k]);
        CHECK_STATUS(qmm_checkpoint_open(fifo_dir, &ck), QMM_ERR_IO);
        CHECK(message_has(fifo_names[k]) && message_has("regular file"), "message: %s", qmm_last_error());
        io_remove_tree(fifo_dir);
    }
    alarm(0);
}

/* ── what the writer refuses before it writes anything, and layers described by their tensors ── */

/* The bytes of dir's config.json and model.safetensors, concatenated (NULL when either is missing). */
static char *snapshot(const char *dir, size_t *size) {
    size_t a = 0, b = 0;
    char *config = io_read_file(io_path(dir, "config.json"), &a);
    char *model = io_read_file(io_path(dir, "model.safetensors"), &b);
    char *both = config && model ? malloc(a + b + 1) : NULL;
    if (both) {
        memcpy(both, config, a);
        memcpy(both + a, model, b);
        *size = a + b;
    }
    free(config);
    free(model);
    return both;
}

static void test_write_refusals(const char *root) {
    check_rng rng = check_rng_make(15);
    check_qmatrix a, b;
    /* The same arrays read as 4-bit gs32 or as 2-bit gs64 (K = 64 or 128): only the config tells. */
    CHECK(check_qmatrix_random(&rng, 3, 64, 4, 32, QMM_F16, &a), "matrix a");
    CHECK(check_qmatrix_random(&rng, 2, 128, 2, 64, QMM_F16, &b), "matrix b");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, "refusals");
    qmm_layer full = {"model.full", b.m, 1, 0};
    CHECK_OK(qmm_checkpoint_write(dir, NULL, 0, &full, 1, NULL));
    size_t before_size = 0, after_size = 0;
    char *before = snapshot(dir, &before_size);
    CHECK(before != NULL, "snapshot");

    float values[8] = {0};
    qmm_tensor orphan_scales = tensor_2d("x.scales", QMM_F32, 2, 4, values);
    qmm_tensor orphan_biases = tensor_2d("x.biases", QMM_F32, 2, 4, values);
    const qmm_tensor *orphans[2] = {&orphan_scales, &orphan_biases};
    for (int k = 0; k < 2; k++) {
        CHECK_STATUS(qmm_checkpoint_write(dir, orphans[k], 1, &full, 1, NULL), QMM_ERR_INVALID_ARGUMENT);
        CHECK(message_has(orphans[k]->name) && message_has("no layer describes it"), "message: %s", qmm_last_error());
    }
    static const char *const keys[] = {"bits", "group_size", "mode", "quant_method"};
    for (int k = 0; k < 4; k++) {
        qmm_layer named[2] = {full, {keys[k], a.m, 1, 0}};
        CHECK_STATUS(qmm_checkpoint_write(dir, NULL, 0, named, 2, NULL), QMM_ERR_INVALID_ARGUMENT);
        CHECK(message_has(keys[k]) && message_has("collide"), "message: %s", qmm_last_error());
    }
    qmm_layer twice[2] = {full, full};
    CHECK_STATUS(qmm_checkpoint_write(dir, NULL, 0, twice, 2, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK(message_has("twice"), "message: %s", qmm_last_error());

    /* Layer "p" described only: its tensors come among tensors, its format from the entry. */
    qmm_tensor p_tensors[3] = {tensor_2d("p.weight", QMM_U32, 3, 8, a.w), tensor_2d("p.scales", QMM_F16, 3, 2, a.scales),
                               tensor_2d("p.biases", QMM_F16, 3, 2, a.biases)};
    qmm_layer described = {"p", {NULL, NULL, NULL, QMM_F16, 3, 64, 4, 32}, 1, 0};
    qmm_layer pair[2] = {full, described};
    CHECK_STATUS(qmm_checkpoint_write(dir, p_tensors, 2, pair, 2, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK(message_has("p.biases"), "message: %s", qmm_last_error());
    pair[1].matrix.bits = 8;        /* 8 words per row at 8 bits: K = 32 ... */
    pair[1].matrix.group_size = 64; /* ... not a multiple of group_size 64 */
    CHECK_STATUS(qmm_checkpoint_write(dir, p_tensors, 3, pair, 2, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK(message_has("group_size=64"), "message: %s", qmm_last_error());
    qmm_layer clash[2] = {full, {"p", a.m, 1, 0}}; /* arrays of its own and p.* among tensors */
    CHECK_STATUS(qmm_checkpoint_write(dir, p_tensors, 3, clash, 2, NULL), QMM_ERR_INVALID_ARGUMENT);

    after_size = 0;
    char *after = snapshot(dir, &after_size);
    CHECK(after && before_size == after_size && memcmp(before, after, before_size) == 0,
          "a refused write changed the existing checkpoint");
    CHECK(io_count_entries(dir) == 2, "a refused write left %d entries, want 2", io_count_entries(dir));
    free(after);
    free(before);

    /* Accepted: p keeps 4-bit gs32 though the default (the other layer's) is 2-bit gs64 and p's arrays
     * have the shapes of a 2-bit gs64 layer of K = 128. */
    pair[1] = described;
    CHECK_OK(qmm_checkpoint_write(dir, p_tensors, 3, pair, 2, NULL));
    qmm_checkpoint *ck = NULL;
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    if (ck) {
        qmm_layer got;
        CHECK_OK(qmm_checkpoint_find_layer(ck, "p", &got));
        CHECK(same_matrix(&got.matrix, &a.m), "p: %d-bit gs%d K=%zu, want 4-bit gs32 K=64", got.matrix.bits,
              got.matrix.group_size, got.matrix.cols);
        CHECK_OK(qmm_checkpoint_find_layer(ck, "model.full", &got));
        CHECK(same_matrix(&got.matrix, &b.m), "model.full differs");
        CHECK(qmm_checkpoint_tensor_count(ck) == 6, "tensor count %zu", qmm_checkpoint_tensor_count(ck));
        qmm_checkpoint_close(ck);
    }
    io_remove_tree(dir);

    /* A checkpoint without quantized layers is a float checkpoint that opens again. */
    float norm[4] = {1, 2, 3, 4};
    qmm_tensor plain = {.name = "norm.weight", .dtype = QMM_F32, .ndim = 1, .shape = {4}, .data = norm, .nbytes = 16};
    CHECK_OK(qmm_checkpoint_write(dir, &plain, 1, NULL, 0, NULL));
    ck = NULL;
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    CHECK(ck && qmm_checkpoint_layer_count(ck) == 0 && qmm_checkpoint_tensor_count(ck) == 1, "float checkpoint");
    qmm_checkpoint_close(ck);
    io_remove_tree(dir);
    check_qmatrix_free(&a);
    check_qmatrix_free(&b);
}

/* ── failed writes leave nothing ── */

static void test_write_failures(const char *root) {
    check_rng rng = check_rng_make(14);
    check_qmatrix a;
    CHECK(check_qmatrix_random(&rng, 2, 64, 4, 32, QMM_F16, &a), "matrix");
    qmm_layer layer = {"p", a.m, 1, 0};

    /* The rename of model.safetensors fails (a non-empty directory is in its way). */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, "blocked");
    mkdir(dir, 0755);
    mkdir(io_path(dir, "model.safetensors"), 0755);
    CHECK(io_write_file(io_path(dir, "model.safetensors/keep"), "x", 1), "fill blocker");
    CHECK_STATUS(qmm_checkpoint_write(dir, NULL, 0, &layer, 1, NULL), QMM_ERR_IO);
    CHECK(io_count_entries(dir) == 1, "after a failed rename the directory has %d entries, want 1",
          io_count_entries(dir));
    CHECK(!io_exists(io_path(dir, "config.json")), "config.json was left behind");
    io_remove_tree(dir);

    /* config.json's rename fails after model.safetensors was renamed: that one is removed again. */
    mkdir(dir, 0755);
    mkdir(io_path(dir, "config.json"), 0755);
    CHECK(io_write_file(io_path(dir, "config.json/keep"), "x", 1), "fill blocker");
    CHECK_STATUS(qmm_checkpoint_write(dir, NULL, 0, &layer, 1, NULL), QMM_ERR_IO);
    CHECK(io_count_entries(dir) == 1, "the directory has %d entries, want 1", io_count_entries(dir));
    io_remove_tree(dir);

    /* An invalid layer: the directory the call would have created does not exist afterwards. */
    char fresh[1024];
    snprintf(fresh, sizeof fresh, "%s/%s", root, "fresh");
    qmm_layer bad = layer;
    bad.matrix.bits = 7;
    CHECK_STATUS(qmm_checkpoint_write(fresh, NULL, 0, &bad, 1, NULL), QMM_ERR_FORMAT);
    CHECK(message_has("\"p\""), "message does not name the layer: %s", qmm_last_error());
    CHECK(!io_exists(fresh), "a failed write left the directory");
    /* Names that collide (a float tensor named like the layer's weight). */
    qmm_tensor clash = tensor_2d("p.weight", QMM_U32, 2, 8, a.w);
    CHECK_STATUS(qmm_checkpoint_write(fresh, &clash, 1, &layer, 1, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK(!io_exists(fresh), "a failed write left the directory");
    CHECK_STATUS(qmm_checkpoint_write(fresh, NULL, 0, &layer, 1, "[1, 2]"), QMM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(qmm_checkpoint_write(fresh, NULL, 0, &layer, 1, "{\"a\": "), QMM_ERR_INVALID_ARGUMENT);
    /* The message re-wraps the JSON parser's own (it used to be formatted over itself, garbled). */
    CHECK(strcmp(qmm_last_error(), "extra_config_json is not valid JSON (error near byte 5 of 6)") == 0,
          "message: %s", qmm_last_error());
    CHECK(!io_exists(fresh), "a failed write left the directory");
    /* The parent does not exist. */
    CHECK_STATUS(qmm_checkpoint_write(io_path(root, "no/such/parent"), NULL, 0, &layer, 1, NULL), QMM_ERR_IO);
    /* A directory with stale shards of another checkpoint. */
    char stale[1024];
    snprintf(stale, sizeof stale, "%s/%s", root, "stale");
    mkdir(stale, 0755);
    CHECK(io_write_file(io_path(stale, "model-00001-of-00002.safetensors"), "x", 1), "stale shard");
    CHECK_STATUS(qmm_checkpoint_write(stale, NULL, 0, &layer, 1, NULL), QMM_ERR_INVALID_ARGUMENT);
    CHECK(message_has("model-00001-of-00002"), "message: %s", qmm_last_error());
    CHECK(io_count_entries(stale) == 1, "the stale directory has %d entries", io_count_entries(stale));
    io_remove_tree(stale);

    /* No quantized layers: config.json has no "quantization", and the checkpoint opens with 0/0. */
    uint16_t values[4] = {1, 2, 3, 4};
    qmm_tensor plain = {.name = "w", .dtype = QMM_F16, .ndim = 1, .shape = {4}, .data = values, .nbytes = 8};
    char floats[1024];
    snprintf(floats, sizeof floats, "%s/%s", root, "floats");
    CHECK_OK(qmm_checkpoint_write(floats, &plain, 1, NULL, 0, NULL));
    qmm_checkpoint *ck = NULL;
    CHECK_OK(qmm_checkpoint_open(floats, &ck));
    int bits = -1, group_size = -1;
    if (ck) {
        CHECK_OK(qmm_checkpoint_default_format(ck, &bits, &group_size));
        CHECK(bits == 0 && group_size == 0 && qmm_checkpoint_layer_count(ck) == 0, "float-only checkpoint: %d/%d", bits,
              group_size);
        qmm_checkpoint_close(ck);
    }
    check_qmatrix_free(&a);
}

/* ── replacing an existing checkpoint ── */

/* The checkpoint in dir opens and its layer "p" equals want. */
static void check_layer_p(const char *dir, const qmm_qmatrix *want, const char *what) {
    qmm_checkpoint *ck = NULL;
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    if (!ck) return;
    qmm_layer got;
    CHECK_OK(qmm_checkpoint_find_layer(ck, "p", &got));
    CHECK(same_matrix(&got.matrix, want), "%s", what);
    qmm_checkpoint_close(ck);
}

static void test_replace_existing(const char *root) {
    check_rng rng = check_rng_make(15);
    check_qmatrix a, b;
    CHECK(check_qmatrix_random(&rng, 2, 64, 4, 32, QMM_F16, &a), "matrix a");
    CHECK(check_qmatrix_random(&rng, 3, 64, 8, 32, QMM_F16, &b), "matrix b");
    qmm_layer old_layer = {"p", a.m, 1, 0}, new_layer = {"p", b.m, 1, 0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, "replace");
    CHECK_OK(qmm_checkpoint_write(dir, NULL, 0, &old_layer, 1, NULL));
    size_t model_size = 0, config_size = 0;
    char *old_model = io_read_file(io_path(dir, "model.safetensors"), &model_size);
    char *old_config = io_read_file(io_path(dir, "config.json"), &config_size);
    CHECK(old_model && old_config, "cannot read the first checkpoint");

    /* config.json's rename fails (a non-empty directory is in its way) after the new model.safetensors
     * was renamed over the old one: the old weights must come back, byte for byte. */
    CHECK(unlink(io_path(dir, "config.json")) == 0, "remove config.json");
    mkdir(io_path(dir, "config.json"), 0755);
    CHECK(io_write_file(io_path(dir, "config.json/keep"), "x", 1), "fill blocker");
    CHECK_STATUS(qmm_checkpoint_write(dir, NULL, 0, &new_layer, 1, NULL), QMM_ERR_IO);
    CHECK(message_has("config.json"), "message: %s", qmm_last_error());
    CHECK(io_count_entries(dir) == 2, "the directory has %d entries, want 2 (no temporary or kept file)",
          io_count_entries(dir));
    size_t size = 0;
    char *model = io_read_file(io_path(dir, "model.safetensors"), &size);
    CHECK(model && old_model && size == model_size && memcmp(model, old_model, size) == 0,
          "model.safetensors is not the old one after the failed write (%zu bytes, want %zu)", size, model_size);
    free(model);
    /* With the old config.json back in place the old checkpoint opens with its original layer. */
    io_remove_tree(io_path(dir, "config.json"));
    CHECK(old_config && io_write_file(io_path(dir, "config.json"), old_config, config_size), "restore config.json");
    check_layer_p(dir, &a.m, "the old layer differs after the failed write");

    /* A successful write replaces both files and leaves nothing else behind. */
    CHECK_OK(qmm_checkpoint_write(dir, NULL, 0, &new_layer, 1, NULL));
    CHECK(io_count_entries(dir) == 2, "the directory has %d entries, want 2", io_count_entries(dir));
    check_layer_p(dir, &b.m, "the new layer differs after the replacing write");
    io_remove_tree(dir);
    free(old_model);
    free(old_config);
    check_qmatrix_free(&a);
    check_qmatrix_free(&b);
}

/* ── a layer of MoE experts: written [E, N, words], read back with experts = E and the rows stacked ── */

static void test_experts(const char *root) {
    check_rng rng = check_rng_make(16);
    check_qmatrix stacked, plain;
    CHECK(check_qmatrix_random(&rng, 4 * 3, 64, 4, 32, QMM_BF16, &stacked), "stacked matrix");
    CHECK(check_qmatrix_random(&rng, 5, 64, 4, 32, QMM_BF16, &plain), "plain matrix");
    qmm_layer layers[2] = {{"model.layers.0.mlp.switch_mlp.up_proj", stacked.m, 4, 0}, {"model.layers.0.q", plain.m, 0, 0}};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, "experts");
    CHECK_OK(qmm_checkpoint_write(dir, NULL, 0, layers, 2, NULL));
    qmm_checkpoint *ck = NULL;
    CHECK_OK(qmm_checkpoint_open(dir, &ck));
    if (ck) {
        qmm_layer got;
        qmm_tensor t;
        CHECK_OK(qmm_checkpoint_find_layer(ck, "model.layers.0.mlp.switch_mlp.up_proj", &got));
        CHECK(got.experts == 4 && got.matrix.rows == 12 && got.matrix.cols == 64, "experts %zu rows %zu cols %zu",
              got.experts, got.matrix.rows, got.matrix.cols);
        CHECK(same_matrix(&got.matrix, &stacked.m), "the stacked experts differ after the round trip");
        CHECK_OK(qmm_checkpoint_find_tensor(ck, "model.layers.0.mlp.switch_mlp.up_proj.weight", &t));
        CHECK(t.ndim == 3 && t.shape[0] == 4 && t.shape[1] == 3 && t.shape[2] == 8, "expert weight written [4, 3, 8]");
        CHECK_OK(qmm_checkpoint_find_tensor(ck, "model.layers.0.mlp.switch_mlp.up_proj.scales", &t));
        CHECK(t.ndim == 3 && t.shape[0] == 4 && t.shape[1] == 3 && t.shape[2] == 2, "expert scales written [4, 3, 2]");
        CHECK_OK(qmm_checkpoint_find_layer(ck, "model.layers.0.q", &got));
        CHECK(got.experts == 1 && same_matrix(&got.matrix, &plain.m), "a plain layer reads experts = 1");
        qmm_checkpoint_close(ck);
    }
    /* rows that are not a whole number of experts: refused, naming both. */
    layers[0].experts = 5;
    snprintf(dir, sizeof dir, "%s/%s", root, "experts-bad");
    CHECK_STATUS(qmm_checkpoint_write(dir, NULL, 0, layers, 1, NULL), QMM_ERR_SHAPE);
    CHECK(strstr(qmm_last_error(), "rows=12 are not a multiple of experts=5") != NULL, "message: %s", qmm_last_error());
    check_qmatrix_free(&stacked);
    check_qmatrix_free(&plain);
}

static bool path_exists(const char *path) {
    struct stat info;
    return lstat(path, &info) == 0;
}

/* What a SIGINT/SIGTERM handler removes (qmm_atomic_remove_all, the CLI's clean_up_on_signals): the temporary files
 * begun and neither renamed nor aborted, and the directory noted as created once it is empty — not a finished file,
 * not a directory no longer noted, not a file already aborted or renamed (its slot is free again). */
static void test_signal_cleanup(const char *root) {
    char dir[4096], model[4200], config[4200], kept[4200];
    snprintf(dir, sizeof dir, "%s/signal-out", root);
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(config, sizeof config, "%s/config.json", dir);
    snprintf(kept, sizeof kept, "%s/kept.bin", root);
    /* a finished file beside them: renamed into place before the signal */
    qmm_atomic_file done = QMM_ATOMIC_FILE_NONE;
    CHECK_OK(qmm_atomic_begin(&done, kept));
    CHECK_OK(qmm_atomic_write(&done, "kept", 4));
    CHECK_OK(qmm_atomic_finish(&done));
    CHECK_OK(qmm_atomic_rename(&done));
    /* an aborted one: its slot freed */
    qmm_atomic_file aborted = QMM_ATOMIC_FILE_NONE;
    CHECK_OK(qmm_atomic_begin(&aborted, kept));
    qmm_atomic_abort(&aborted);
    CHECK(mkdir(dir, 0777) == 0, "mkdir %s", dir);
    const int note = qmm_atomic_note_created_dir(dir);
    CHECK(note >= 0, "the created directory was not noted");
    qmm_atomic_file a = QMM_ATOMIC_FILE_NONE, b = QMM_ATOMIC_FILE_NONE;
    CHECK_OK(qmm_atomic_begin(&a, model));
    CHECK_OK(qmm_atomic_begin(&b, config));
    CHECK_OK(qmm_atomic_write(&a, "partial", 7));
    CHECK(a.temp_path && b.temp_path && path_exists(a.temp_path) && path_exists(b.temp_path), "temporary files missing");
    qmm_atomic_remove_all(); /* as the handler would, mid-write */
    CHECK(a.temp_path && !path_exists(a.temp_path), "%s left behind", a.temp_path ? a.temp_path : "(null)");
    CHECK(b.temp_path && !path_exists(b.temp_path), "%s left behind", b.temp_path ? b.temp_path : "(null)");
    CHECK(!path_exists(dir), "the created directory %s left behind", dir);
    CHECK(path_exists(kept), "the finished file %s was removed", kept);
    qmm_atomic_abort(&a); /* after a removal: harmless */
    qmm_atomic_abort(&b);
    qmm_atomic_forget(note);
    /* a directory no longer noted: not removed */
    CHECK(mkdir(dir, 0777) == 0, "mkdir %s again", dir);
    qmm_atomic_remove_all();
    CHECK(path_exists(dir), "a directory no longer noted was removed");
    rmdir(dir);
    unlink(kept);
}

static volatile sig_atomic_t caught;
static void note_signal(int sig) { caught = sig; }

/* qmm_atomic_block_signals holds a signal back until qmm_atomic_restore_signals, which delivers it. */
static void test_signals_held(void) {
    struct sigaction action, old;
    memset(&action, 0, sizeof action);
    action.sa_handler = note_signal;
    sigemptyset(&action.sa_mask);
    CHECK(sigaction(SIGTERM, &action, &old) == 0, "sigaction");
    caught = 0;
    sigset_t mask;
    qmm_atomic_block_signals(&mask);
    raise(SIGTERM);
    CHECK(caught == 0, "SIGTERM delivered while held back");
    qmm_atomic_restore_signals(&mask);
    CHECK(caught == SIGTERM, "SIGTERM not delivered once restored (caught %d)", (int)caught);
    sigaction(SIGTERM, &old, NULL);
}

int main(void) {
    char *root = io_temp_dir("checkpoint");
    CHECK(root != NULL, "mkdtemp failed");
    if (root) {
        test_round_trip(root);
        test_two_shards(root);
        test_layer_object_defaults(root);
        test_inconsistent_layers(root);
        test_config(root);
        test_write_refusals(root);
        test_write_failures(root);
        test_replace_existing(root);
        test_experts(root);
        test_signal_cleanup(root);
        test_signals_held();
        io_remove_tree(root);
        free(root);
    }
    return check_finish("io-checkpoint");
}
