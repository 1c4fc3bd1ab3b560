/*
 * checkpoint.c — MLX checkpoint directories (mlx-lm / mlx-community layout): config.json with
 * "quantization" (default group_size/bits plus per-layer overrides or false) and one or several
 * safetensors shards. A layer P is quantized iff tensor "P.scales" exists; then "P.weight" holds the
 * packed uint32 codes and "P.biases" the biases (DESIGN.md §1; mlx_lm.utils load/save, mlx.nn.quantize).
 */
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* config.json and the shard index are small text files; anything larger is not one of them. */
#define CONFIG_MAX_BYTES ((size_t)64 << 20)

/* ───────────────────────────── config.json ───────────────────────────── */

typedef struct layer_format {
    char *name;
    bool quantized; /* false: config.json says "P": false */
    int bits, group_size;
    const char *bad_kind; /* not NULL: the entry is neither an object nor a bool (its JSON kind, for the message) */
} layer_format;

typedef struct quant_config {
    int bits, group_size; /* 0/0: no "quantization", or false */
    size_t override_count;
    layer_format *overrides; /* sorted by name */
} quant_config;

static void quant_config_free(quant_config *config) {
    for (size_t i = 0; i < config->override_count; i++)
        free(config->overrides[i].name);
    free(config->overrides);
    memset(config, 0, sizeof *config);
}

static bool format_bits_ok(double bits) {
    return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}
static bool format_group_ok(double group_size) { return group_size == 32 || group_size == 64 || group_size == 128; }

/* Reads "bits"/"group_size" of a quantization object; a missing member keeps *bits / *group_size when those are
 * non-zero (a layer's object: MLX's defaults, set by the caller), and is an error otherwise (the top-level object, which
 * mlx-lm indexes as quantization["bits"]). where (printable: a layer's name in it escaped) names the object in
 * messages. */
static qmm_status parse_format(const cJSON *object, const char *where, int *bits, int *group_size) {
    const char *printable = where;
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(object, "mode");
    if (mode) {
        if (!cJSON_IsString(mode) || !mode->valuestring)
            return qmm_error(QMM_ERR_CORRUPT, "config.json %s.mode is %s; it must be a string", printable,
                             qmm_io_json_kind(mode));
        if (strcmp(mode->valuestring, "affine") != 0) {
            char mode_printable[QMM_PRINTABLE_SIZE];
            return qmm_error(
                QMM_ERR_UNSUPPORTED, "config.json %s.mode=\"%s\": qmm reads only MLX \"affine\" quantization",
                printable,
                qmm_printable(mode->valuestring, strlen(mode->valuestring), mode_printable, sizeof mode_printable));
        }
    }
    const char *names[2] = {"bits", "group_size"};
    int *outputs[2] = {bits, group_size};
    for (int k = 0; k < 2; k++) {
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, names[k]);
        if (!item) {
            if (*outputs[k] != 0) continue;
            return qmm_error(QMM_ERR_CORRUPT, "config.json %s has no \"%s\"", printable, names[k]);
        }
        if (!cJSON_IsNumber(item))
            return qmm_error(QMM_ERR_CORRUPT, "config.json %s.%s is %s; it must be an integer", printable, names[k],
                             qmm_io_json_kind(item));
        double value = item->valuedouble;
        bool ok = k == 0 ? format_bits_ok(value) : format_group_ok(value);
        if (!ok)
            return qmm_error(QMM_ERR_FORMAT, "config.json %s.%s=%.17g is not one of %s", printable, names[k], value,
                             k == 0 ? "2, 3, 4, 5, 6, 8" : "32, 64, 128");
        *outputs[k] = (int)value;
    }
    return QMM_OK;
}

/* Python's truth value of a JSON value as mlx-lm's class_predicate returns it to MLX's nn.quantize (`if bool_or_params
 * := ...`): false for false, null, 0, "", [] and {}. */
static bool json_truthy(const cJSON *item) {
    if (cJSON_IsFalse(item) || cJSON_IsNull(item)) return false;
    if (cJSON_IsNumber(item)) return item->valuedouble != 0.0;
    if (cJSON_IsString(item)) return item->valuestring && item->valuestring[0];
    if (cJSON_IsArray(item) || cJSON_IsObject(item)) return item->child != NULL;
    return true;
}

static int compare_layer_formats(const void *a, const void *b) {
    return strcmp(((const layer_format *)a)->name, ((const layer_format *)b)->name);
}

/* Parses one quantization object (the value of config.json's `key`) into *config. */
static qmm_status parse_quantization(const cJSON *quantization, const char *key, quant_config *config) {
    qmm_io_name *names = NULL;
    char printable[QMM_PRINTABLE_SIZE];
    qmm_status status = QMM_OK;
    memset(config, 0, sizeof *config);
    if (!quantization || cJSON_IsFalse(quantization) || cJSON_IsNull(quantization)) return QMM_OK;
    if (!cJSON_IsObject(quantization))
        return qmm_error(QMM_ERR_CORRUPT, "config.json \"%s\" is %s; it must be an object or false", key,
                         qmm_io_json_kind(quantization));
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(quantization, "quant_method");
    if (method) {
        const char *value = cJSON_IsString(method) && method->valuestring ? method->valuestring : "?";
        return qmm_error(QMM_ERR_UNSUPPORTED,
                         "config.json %s.quant_method=\"%s\" is not MLX affine quantization (no quant_method)", key,
                         qmm_printable(value, strlen(value), printable, sizeof printable));
    }
    if ((status = parse_format(quantization, key, &config->bits, &config->group_size)) != QMM_OK) goto cleanup;

    size_t members = (size_t)cJSON_GetArraySize(quantization);
    config->overrides = calloc(members ? members : 1, sizeof(layer_format));
    if (!config->overrides) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu layer entries", members);
        goto cleanup;
    }
    /* cJSON keeps duplicate keys (and finds only the first): every member name must be unique. */
    names = calloc(members ? members : 1, sizeof(qmm_io_name));
    if (!names) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu names", members);
        goto cleanup;
    }
    size_t name_count = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, quantization) {
        names[name_count] = (qmm_io_name){item->string ? item->string : "", name_count};
        name_count++;
    }
    char what[64];
    snprintf(what, sizeof what, "config.json %s key", key);
    if ((status = qmm_io_sort_unique(names, name_count, QMM_ERR_CORRUPT, what)) != QMM_OK) goto cleanup;
    cJSON_ArrayForEach(item, quantization) {
        const char *name = item->string ? item->string : "";
        if (!qmm_io_utf8_valid(name, strlen(name))) {
            status = qmm_error(QMM_ERR_CORRUPT, "config.json %s key \"%s\" is not valid UTF-8", key,
                               qmm_printable(name, strlen(name), printable, sizeof printable));
            goto cleanup;
        }
        static const char *const format_members[] = {"bits", "group_size", "mode", "quant_method"};
        bool format_member = false;
        for (size_t k = 0; k < sizeof format_members / sizeof format_members[0]; k++)
            format_member = format_member || strcmp(name, format_members[k]) == 0;
        if (format_member) continue; /* read by parse_format (quant_method above) */
        layer_format *entry = &config->overrides[config->override_count];
        entry->quantized = json_truthy(item);
        entry->bits = config->bits;
        entry->group_size = config->group_size;
        /* Any other member names a layer. MLX's nn.quantize leaves a layer whose entry is falsy (false, null, 0, "",
         * [], {}) unquantized, takes true or a dict of parameters, and refuses any other truthy value: such an entry
         * is kept and refused when its layer is read (a name that is no layer is never looked up, by MLX or here). */
        if (entry->quantized && !cJSON_IsObject(item) && !cJSON_IsBool(item)) {
            entry->bad_kind = qmm_io_json_kind(item);
        } else if (entry->quantized && cJSON_IsObject(item)) {
            /* mlx-lm's class_predicate hands a layer's object to MLX's nn.quantize, which calls
             * to_quantized(**object): a member it leaves out takes to_quantized's default for affine mode — group 64,
             * 4 bits (mlx.nn, _defaults_for_mode) — not the config's default format (which a break-it helper found
             * qmm used: such a layer was read with other bits or group than MLX reads it with). */
            entry->bits = 4;
            entry->group_size = 64;
            /* the name escaped once, here: where goes into messages as it is (qmm_io_json_keys_once, parse_format) */
            char where[QMM_PRINTABLE_SIZE + 32], in_config[QMM_PRINTABLE_SIZE + 48];
            snprintf(where, sizeof where, "%s[\"%s\"]", key,
                     qmm_printable(name, strlen(name), printable, sizeof printable));
            /* its keys given twice: cJSON would read the first copy, Python's json (mlx-lm) the last (the quantization
             * object's own member names are checked unique above) */
            static const char *const format_keys[] = {"bits", "group_size", "mode"};
            snprintf(in_config, sizeof in_config, "config.json %s", where);
            if ((status = qmm_io_json_keys_once(item, format_keys, sizeof format_keys / sizeof format_keys[0], in_config)) !=
                    QMM_OK ||
                (status = parse_format(item, where, &entry->bits, &entry->group_size)) != QMM_OK)
                goto cleanup;
        } else if (entry->quantized && config->bits == 0) {
            status = qmm_error(QMM_ERR_CORRUPT, "config.json %s[\"%s\"] is true but there is no default format", key,
                               qmm_printable(name, strlen(name), printable, sizeof printable));
            goto cleanup;
        }
        entry->name = strdup(name);
        if (!entry->name) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a layer name");
            goto cleanup;
        }
        config->override_count++;
    }
    qsort(config->overrides, config->override_count, sizeof(layer_format), compare_layer_formats);
cleanup:
    free(names);
    if (status != QMM_OK) quant_config_free(config);
    return status;
}

/* Where two parsed quantization objects first differ, as text for a message; NULL when they agree. */
static const char *config_difference(const quant_config *a, const quant_config *b, char *buffer, size_t size) {
    if (a->bits != b->bits || a->group_size != b->group_size) {
        snprintf(buffer, size, "default bits=%d group_size=%d vs bits=%d group_size=%d", a->bits, a->group_size,
                 b->bits, b->group_size);
        return buffer;
    }
    char printable[QMM_PRINTABLE_SIZE];
    for (size_t i = 0; i < a->override_count || i < b->override_count; i++) {
        const layer_format *x = i < a->override_count ? &a->overrides[i] : NULL;
        const layer_format *y = i < b->override_count ? &b->overrides[i] : NULL;
        if (x && y && strcmp(x->name, y->name) == 0 && x->quantized == y->quantized && x->bits == y->bits &&
            x->group_size == y->group_size && (x->bad_kind == NULL) == (y->bad_kind == NULL))
            continue;
        const layer_format *named = !y || (x && strcmp(x->name, y->name) < 0) ? x : y;
        snprintf(buffer, size, "layer \"%s\" has a different entry",
                 qmm_printable(named->name, strlen(named->name), printable, sizeof printable));
        return buffer;
    }
    return NULL;
}

/* config.json's bits and group_size in the quantization object read (`quantization`, else `quantization_config`: the
 * one mlx-lm passes on) written as integers (4, not 4.0 or 4e0): MLX's quantize, whose integer arguments refuse a Python
 * float, gets them. The other copy, checked to agree by value, may spell them otherwise. */
static qmm_status check_integer_format(const char *json, size_t size, const char *object) {
    static const char *const keys[] = {"bits", "group_size"};
    size_t start, end;
    if (!qmm_io_json_find_non_integer(json, size, keys, 2, &object, 1, &start, &end)) return QMM_OK;
    char printable[QMM_PRINTABLE_SIZE];
    return qmm_error(QMM_ERR_CORRUPT,
                     "config.json: the number %s at byte %zu is not written as an integer; a quantization's bits and "
                     "group_size must be digits only (MLX's quantize refuses a float)",
                     qmm_printable(json + start, end - start, printable, sizeof printable), start);
}

static qmm_status parse_config(const char *json, size_t size, quant_config *config) {
    memset(config, 0, sizeof *config);
    cJSON *root = NULL;
    quant_config second = {0, 0, 0, NULL};
    const cJSON *quantization = NULL; /* the object read, where there is one */
    qmm_status status = qmm_io_parse_json("config.json", json, size, &root);
    if (status != QMM_OK) return status;
    if (!cJSON_IsObject(root)) {
        status = qmm_error(QMM_ERR_CORRUPT, "config.json is %s; it must be a JSON object", qmm_io_json_kind(root));
        goto cleanup;
    }
    /* A key given twice is read as its first copy by cJSON but as its last by Python's json (mlx-lm): for the
     * keys that decide the format the two readers would disagree, so a duplicate is refused. */
    static const char *const format_keys[] = {"quantization", "quantization_config"};
    for (size_t k = 0; k < sizeof format_keys / sizeof format_keys[0]; k++) {
        const size_t copies = qmm_io_json_key_copies(root, format_keys[k]);
        if (copies > 1) {
            status = qmm_error(QMM_ERR_CORRUPT,
                               "config.json has the top-level key \"%s\" %zu times; it must appear once (qmm would "
                               "read the first copy, Python's json and mlx-lm the last)",
                               format_keys[k], copies);
            goto cleanup;
        }
    }
    /* mlx-lm writes both keys with the same value; "quantization" is the one its loader reads. When both
     * are present they must say the same thing (same default, same per-layer entries): a file where they
     * disagree is refused rather than read by one of them. */
    quantization = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    const cJSON *quantization_config = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (!quantization) {
        status = parse_quantization(quantization_config, "quantization_config", config);
        goto cleanup;
    }
    if ((status = parse_quantization(quantization, "quantization", config)) != QMM_OK) goto cleanup;
    if (!quantization_config) goto cleanup;
    if (parse_quantization(quantization_config, "quantization_config", &second) != QMM_OK) {
        status = qmm_error(QMM_ERR_CORRUPT,
                           "config.json \"quantization_config\" disagrees with \"quantization\" (which reads): %s",
                           qmm_last_error());
        goto cleanup;
    }
    char difference[160];
    if (config_difference(config, &second, difference, sizeof difference)) {
        status = qmm_error(QMM_ERR_CORRUPT,
                           "config.json \"quantization_config\" disagrees with \"quantization\": %s; they must be "
                           "equal (mlx-lm writes one copy of the other)",
                           difference);
        goto cleanup;
    }
cleanup:
    if (status == QMM_OK) /* last: the values' own checks name their fields */
        status = check_integer_format(json, size, quantization ? "quantization" : "quantization_config");
    quant_config_free(&second);
    cJSON_Delete(root);
    if (status != QMM_OK) quant_config_free(config);
    return status;
}

qmm_status qmm_config_parse(const char *json, size_t size, int *bits, int *group_size) {
    if ((!json && size > 0) || !bits || !group_size)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_config_parse: null argument");
    *bits = 0;
    *group_size = 0;
    quant_config config;
    qmm_status status = parse_config(json ? json : "", size, &config);
    if (status != QMM_OK) return status;
    *bits = config.bits;
    *group_size = config.group_size;
    quant_config_free(&config);
    return QMM_OK;
}

/* ───────────────────────────── reading a directory ───────────────────────────── */

typedef struct tensor_ref {
    size_t shard, index;
    const char *name;
} tensor_ref;

typedef struct checkpoint_layer {
    char *name;
    qmm_qmatrix matrix;
    size_t experts; /* product of the weight's dimensions before the last two (MoE experts); 1 for 2-D */
    int experts_dim; /* the weight has 3 or more dimensions (qmm_layer.experts_dim) */
    void *owned[3]; /* aligned copies of misaligned arrays (see build_layer) */
} checkpoint_layer;

struct qmm_checkpoint {
    size_t shard_count;
    char **shard_names;
    qmm_safetensors **shards;
    size_t tensor_count;
    tensor_ref *tensors; /* shard order, then data offset */
    tensor_ref *by_name;
    quant_config config;
    size_t layer_count;
    checkpoint_layer *layers; /* sorted by name */
    char *config_text;        /* qmm_io_checkpoint_of_file: the config.json beside the file, or NULL */
};

void qmm_checkpoint_close(qmm_checkpoint *checkpoint) {
    if (!checkpoint) return;
    for (size_t i = 0; i < checkpoint->shard_count; i++) {
        qmm_safetensors_close(checkpoint->shards ? checkpoint->shards[i] : NULL);
        free(checkpoint->shard_names ? checkpoint->shard_names[i] : NULL);
    }
    free(checkpoint->shards);
    free(checkpoint->shard_names);
    free(checkpoint->config_text);
    free(checkpoint->tensors);
    free(checkpoint->by_name);
    for (size_t i = 0; i < checkpoint->layer_count; i++) {
        free(checkpoint->layers[i].name);
        for (int k = 0; k < 3; k++)
            free(checkpoint->layers[i].owned[k]);
    }
    free(checkpoint->layers);
    quant_config_free(&checkpoint->config);
    free(checkpoint);
}

static int compare_refs(const void *a, const void *b) {
    return strcmp(((const tensor_ref *)a)->name, ((const tensor_ref *)b)->name);
}
static int compare_layers(const void *a, const void *b) {
    return strcmp(((const checkpoint_layer *)a)->name, ((const checkpoint_layer *)b)->name);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

/* A shard file name from model.safetensors.index.json must name a file in the directory itself. */
static bool plain_file_name(const char *name) {
    return name[0] != '\0' && name[0] != '.' && !strchr(name, '/') && qmm_io_utf8_valid(name, strlen(name));
}

/* A shard's file name as mlx_lm.utils.load_model globs them: model*.safetensors. */
static bool shard_file_name(const char *name) {
    return strncmp(name, "model", 5) == 0 && ends_with(name, ".safetensors");
}

/* With an index: a model*.safetensors beside the shards it names that it does not name is refused — mlx_lm's
 * load_model globs model*.safetensors, index or not, and would read that file too (QMM_ERR_CORRUPT). */
static qmm_status check_unnamed_shards(const char *dir, char *const *names, size_t count) {
    DIR *listing = opendir(dir);
    if (!listing) return QMM_OK; /* it was read a moment ago; nothing more to say here */
    qmm_status status = QMM_OK;
    struct dirent *entry;
    while (status == QMM_OK && (entry = readdir(listing)) != NULL) {
        if (!shard_file_name(entry->d_name)) continue;
        bool named = false;
        for (size_t i = 0; i < count && !named; i++) named = strcmp(names[i], entry->d_name) == 0;
        if (!named) {
            char shown[QMM_PRINTABLE_SIZE];
            status = qmm_error(QMM_ERR_CORRUPT,
                               "model.safetensors.index.json names %zu shard%s, but the directory also holds %s, which "
                               "it does not name (mlx_lm reads every model*.safetensors: remove that file, or name its "
                               "tensors in the index)", count, count == 1 ? "" : "s",
                               qmm_printable(entry->d_name, strlen(entry->d_name), shown, sizeof shown));
        }
    }
    closedir(listing);
    return status;
}

static qmm_status add_name(char ***names, size_t *count, size_t *capacity, const char *name) {
    for (size_t i = 0; i < *count; i++)
        if (strcmp((*names)[i], name) == 0) return QMM_OK;
    if (*count == *capacity) {
        size_t grown = *capacity ? 2 * *capacity : 8;
        char **bigger = realloc(*names, grown * sizeof(char *));
        if (!bigger) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot grow the shard list");
        *names = bigger;
        *capacity = grown;
    }
    (*names)[*count] = strdup(name);
    if (!(*names)[*count]) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a shard name");
    (*count)++;
    return QMM_OK;
}

/* Parses "<stem>-<i>-of-<n>.safetensors" (the numbered-shard names of Hugging Face and mlx-lm): the stem's length,
 * i and n; false for any other name (digits only, at most 9 each; *overlong, when not NULL, says a name of that form
 * had a number of more than 9 digits). */
static bool numbered_shard(const char *name, size_t *stem, unsigned long *i, unsigned long *n, bool *overlong) {
    if (overlong) *overlong = false;
    const size_t length = strlen(name), ext = strlen(".safetensors");
    if (length <= ext) return false;
    const char *of = NULL;
    for (const char *p = strstr(name, "-of-"); p; p = strstr(p + 1, "-of-")) of = p; /* the last "-of-" */
    if (!of) return false;
    const char *n_start = of + 4, *n_end = name + length - ext, *i_end = of, *i_start = of;
    while (i_start > name && i_start[-1] >= '0' && i_start[-1] <= '9') i_start--;
    if (i_start == i_end || i_start == name || i_start[-1] != '-' || n_start >= n_end) return false;
    for (const char *p = n_start; p < n_end; p++)
        if (*p < '0' || *p > '9') return false;
    if (i_end - i_start > 9 || n_end - n_start > 9) {
        if (overlong) *overlong = true;
        return false;
    }
    unsigned long values[2] = {0, 0};
    const char *starts[2] = {i_start, n_start}, *ends[2] = {i_end, n_end};
    for (int k = 0; k < 2; k++)
        for (const char *p = starts[k]; p < ends[k]; p++) values[k] = values[k] * 10 + (unsigned long)(*p - '0');
    *stem = (size_t)(i_start - 1 - name), *i = values[0], *n = values[1];
    return true;
}

/* Whether name is shard `want` of the numbered set "<stem>-<i>-of-<n>" whose stem is the first `stem` characters of
 * set_name (want = 0: any shard of that set). */
static bool in_numbered_set(const char *name, const char *set_name, size_t stem, unsigned long n, unsigned long want) {
    size_t stem_b;
    unsigned long i_b, n_b;
    return numbered_shard(name, &stem_b, &i_b, &n_b, NULL) && stem_b == stem && strncmp(name, set_name, stem) == 0 &&
           n_b == n && (want == 0 || i_b == want);
}

/* The shards found by name (no index): every numbered set "<stem>-<i>-of-<n>" must be whole — i from 1 to n, each
 * once — or the layers in a missing shard would be silently absent (mlx-lm loads what it globs and then fails on the
 * missing weights). names: sorted. Each set is checked once, from its first member in the list. */
static qmm_status check_numbered_shards(const char *dir, char *const *names, size_t count) {
    char printable[QMM_PRINTABLE_SIZE];
    size_t stem;
    unsigned long i, n;
    for (size_t a = 0; a < count; a++) {
        bool overlong = false;
        if (!numbered_shard(names[a], &stem, &i, &n, &overlong) && overlong)
            return qmm_error(QMM_ERR_CORRUPT, "\"%s\": shard \"%s\" has a shard number of more than 9 digits (its set "
                             "cannot be checked whole; name shards <stem>-00001-of-00003.safetensors)", dir,
                             qmm_printable(names[a], strlen(names[a]), printable, sizeof printable));
    }
    for (size_t a = 0; a < count; a++)
        if (numbered_shard(names[a], &stem, &i, &n, NULL) && (n == 0 || i == 0 || i > n))
            return qmm_error(QMM_ERR_CORRUPT, "\"%s\": shard \"%s\" is numbered %lu of %lu; shards count from 1 to their total",
                             dir, qmm_printable(names[a], strlen(names[a]), printable, sizeof printable), i, n);
    for (size_t a = 0; a < count; a++) {
        if (!numbered_shard(names[a], &stem, &i, &n, NULL)) continue;
        bool seen = false; /* an earlier member of the same set has checked it */
        for (size_t b = 0; b < a && !seen; b++) seen = in_numbered_set(names[b], names[a], stem, n, 0);
        for (unsigned long want = 1; want <= n && !seen; want++) {
            bool found = false;
            for (size_t b = 0; b < count && !found; b++) found = in_numbered_set(names[b], names[a], stem, n, want);
            if (!found)
                return qmm_error(QMM_ERR_NOT_FOUND,
                                 "\"%s\": \"%s\" is one of %lu shards, but shard %lu of them is missing (no "
                                 "model.safetensors.index.json to say otherwise)",
                                 dir, qmm_printable(names[a], strlen(names[a]), printable, sizeof printable), n, want);
        }
    }
    return QMM_OK;
}

/* Shards: those named by model.safetensors.index.json when it exists, else every model*.safetensors
 * in the directory (what mlx_lm.utils.load_model globs), sorted by name. */
static qmm_status find_shards(const char *dir, char ***names, size_t *count, cJSON **index) {
    qmm_status status = QMM_OK;
    char *index_path = qmm_io_join(dir, "model.safetensors.index.json");
    char *text = NULL;
    size_t size = 0, capacity = 0;
    DIR *listing = NULL;
    char printable[QMM_PRINTABLE_SIZE];
    if (!index_path) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot build a path");
    status = qmm_io_read_file(index_path, CONFIG_MAX_BYTES, &text, &size);
    if (status == QMM_OK) {
        if ((status = qmm_io_parse_json(index_path, text, size, index)) != QMM_OK) goto cleanup;
        const cJSON *map = cJSON_GetObjectItemCaseSensitive(*index, "weight_map");
        if (!cJSON_IsObject(map)) {
            status = qmm_error(QMM_ERR_CORRUPT, "%s: \"weight_map\" is %s; it must be an object", index_path,
                               qmm_io_json_kind(map));
            goto cleanup;
        }
        const cJSON *item;
        cJSON_ArrayForEach(item, map) {
            if (!cJSON_IsString(item) || !item->valuestring || !plain_file_name(item->valuestring)) {
                const char *name = item->string ? item->string : "";
                status = qmm_error(QMM_ERR_CORRUPT,
                                   "%s: weight_map[\"%s\"] must be the file name of a shard in the same directory",
                                   index_path, qmm_printable(name, strlen(name), printable, sizeof printable));
                goto cleanup;
            }
            if ((status = add_name(names, count, &capacity, item->valuestring)) != QMM_OK) goto cleanup;
        }
    } else if (status == QMM_ERR_NOT_FOUND) {
        status = QMM_OK;
        listing = opendir(dir);
        if (!listing) {
            status = qmm_error(QMM_ERR_IO, "cannot list \"%s\": %s", dir, strerror(errno));
            goto cleanup;
        }
        struct dirent *entry;
        while ((entry = readdir(listing)) != NULL) {
            if (!shard_file_name(entry->d_name)) continue;
            if ((status = add_name(names, count, &capacity, entry->d_name)) != QMM_OK) goto cleanup;
        }
    } else {
        goto cleanup;
    }
    if (*count == 0) {
        status = qmm_error(QMM_ERR_NOT_FOUND, "\"%s\" has no model*.safetensors shard", dir);
        goto cleanup;
    }
    qsort(*names, *count, sizeof(char *), qmm_io_compare_strings);
    if (listing && (status = check_numbered_shards(dir, *names, *count)) != QMM_OK) goto cleanup;
cleanup:
    if (listing) closedir(listing);
    free(text);
    free(index_path);
    return status;
}

static const char *ref_name_at(const void *context, size_t i) {
    return ((const qmm_checkpoint *)context)->by_name[i].name;
}

static const tensor_ref *find_ref(const qmm_checkpoint *checkpoint, const char *name) {
    size_t position = qmm_io_find_sorted(checkpoint, checkpoint->tensor_count, ref_name_at, name);
    return position == QMM_IO_NOT_FOUND ? NULL : &checkpoint->by_name[position];
}

static bool find_view(const qmm_checkpoint *checkpoint, const char *name, qmm_tensor *tensor) {
    const tensor_ref *ref = find_ref(checkpoint, name);
    if (!ref) return false;
    return qmm_safetensors_get(checkpoint->shards[ref->shard], ref->index, tensor) == QMM_OK;
}

static const char *override_name_at(const void *context, size_t i) {
    return ((const quant_config *)context)->overrides[i].name;
}

static const layer_format *find_override(const quant_config *config, const char *name) {
    size_t position = qmm_io_find_sorted(config, config->override_count, override_name_at, name);
    return position == QMM_IO_NOT_FOUND ? NULL : &config->overrides[position];
}

_Thread_local size_t qmm_io_fail_aligned_copy;

/* Returns data itself when it is aligned for its element size, else an aligned heap copy (stored in
 * *owned). mlx.core.save_safetensors does not pad its header, so arrays in MLX-written files are often
 * at odd offsets, and kernels read uint32/f16 arrays with aligned loads. */
static qmm_status aligned_view(const qmm_tensor *tensor, const void **data, void **owned) {
    size_t element = qmm_dtype_size(tensor->dtype);
    *data = tensor->data;
    if (((uintptr_t)tensor->data % element) == 0) return QMM_OK;
    bool injected = qmm_io_fail_aligned_copy > 0 && --qmm_io_fail_aligned_copy == 0;
    void *copy = injected ? NULL : malloc(tensor->nbytes ? tensor->nbytes : 1);
    if (!copy) {
        char printable[QMM_PRINTABLE_SIZE];
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes to align \"%s\"", tensor->nbytes,
                         qmm_printable(tensor->name, strlen(tensor->name), printable, sizeof printable));
    }
    memcpy(copy, tensor->data, tensor->nbytes);
    *owned = copy;
    *data = copy;
    return QMM_OK;
}

/* Whether tensor t has ndim dimensions of these sizes. */
static bool has_shape(const qmm_tensor *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return false;
    return true;
}

/* Checks a quantized layer's three tensors against (bits, group_size), the same rules for the reader
 * and the writer: weight U32 with ≥ 2 dims (leading dims folded into rows), scales and biases one
 * float dtype and one shape [leading dims..., cols/group_size], words per row = cols·bits/32, no empty
 * layer. name is printable. Returns rows and cols. Errors: QMM_ERR_CORRUPT naming the layer and rule. */
static qmm_status check_layer_tensors(const char *name, const qmm_tensor *weight, const qmm_tensor *scales,
                                      const qmm_tensor *biases, int bits, int group_size, size_t *rows_out,
                                      size_t *cols_out) {
    if (weight->dtype != QMM_U32)
        return qmm_error(QMM_ERR_CORRUPT, "layer \"%s\": %s.weight has dtype %s; a quantized weight must be u32", name,
                         name, qmm_dtype_name(weight->dtype));
    if (weight->ndim < 2)
        return qmm_error(QMM_ERR_CORRUPT, "layer \"%s\": %s.weight has %d dimensions; it must have at least 2", name,
                         name, weight->ndim);
    if (!qmm_is_float_dtype(scales->dtype) || biases->dtype != scales->dtype)
        return qmm_error(QMM_ERR_CORRUPT,
                         "layer \"%s\": scales (%s) and biases (%s) must have the same dtype, one of f32, f16, bf16",
                         name, qmm_dtype_name(scales->dtype), qmm_dtype_name(biases->dtype));
    size_t rows = 1;
    for (int d = 0; d < weight->ndim - 1; d++)
        rows *= (size_t)weight->shape[d]; /* bounded by nbytes */
    size_t words = (size_t)weight->shape[weight->ndim - 1];
    size_t stream_bits = words * 32; /* words ≤ 2^53 (validated header), so no overflow */
    if (stream_bits % (size_t)bits != 0)
        return qmm_error(QMM_ERR_CORRUPT, "layer \"%s\": %zu words per row is not a whole number of %d-bit codes", name,
                         words, bits);
    size_t cols = stream_bits / (size_t)bits;
    if (rows == 0 || cols == 0)
        return qmm_error(QMM_ERR_CORRUPT, "layer \"%s\" is empty (%zu rows, %zu columns)", name, rows, cols);
    if (cols % (size_t)group_size != 0)
        return qmm_error(QMM_ERR_CORRUPT,
                         "layer \"%s\": %zu words per row at bits=%d give %zu columns, not a multiple of group_size=%d",
                         name, words, bits, cols, group_size);
    /* scales and biases: the weight's leading dimensions, then the groups of a row */
    int64_t want[QMM_MAX_DIMS];
    memcpy(want, weight->shape, (size_t)weight->ndim * sizeof want[0]);
    want[weight->ndim - 1] = (int64_t)(cols / (size_t)group_size);
    if (!has_shape(scales, weight->ndim, want) || !has_shape(biases, weight->ndim, want)) {
        char scales_shape[QMM_IO_SHAPE_TEXT_SIZE], biases_shape[QMM_IO_SHAPE_TEXT_SIZE],
            weight_shape[QMM_IO_SHAPE_TEXT_SIZE], want_shape[QMM_IO_SHAPE_TEXT_SIZE];
        qmm_io_shape_text(scales->ndim, scales->shape, scales_shape, sizeof scales_shape);
        qmm_io_shape_text(biases->ndim, biases->shape, biases_shape, sizeof biases_shape);
        qmm_io_shape_text(weight->ndim, weight->shape, weight_shape, sizeof weight_shape);
        qmm_io_shape_text(weight->ndim, want, want_shape, sizeof want_shape);
        const char *rule = weight->ndim == 2 ? "[N, K/group_size]"
                           : weight->ndim == 3 ? "[E, N, K/group_size]"
                                               : "[..., N, K/group_size]";
        return qmm_error(QMM_ERR_CORRUPT,
                         "layer \"%s\": scales %s and biases %s must both be %s, %s for weight %s (N=%lld, K=%zu: %zu "
                         "words of %d-bit codes per row, so %zu groups of group_size=%d)",
                         name, scales_shape, biases_shape, want_shape, rule, weight_shape,
                         (long long)weight->shape[weight->ndim - 2], cols, words, bits, cols / (size_t)group_size,
                         group_size);
    }
    *rows_out = rows;
    *cols_out = cols;
    return QMM_OK;
}

static qmm_status build_layer(qmm_checkpoint *checkpoint, const char *scales_name, checkpoint_layer *layer) {
    qmm_status status = QMM_OK;
    char printable[QMM_PRINTABLE_SIZE];
    size_t prefix_length = strlen(scales_name) - strlen(".scales");
    char *name = malloc(prefix_length + sizeof ".weight");
    char *tensor_name = malloc(prefix_length + sizeof ".weight");
    if (!name || !tensor_name) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a layer name");
        goto cleanup;
    }
    memcpy(name, scales_name, prefix_length);
    name[prefix_length] = '\0';
    qmm_printable(name, prefix_length, printable, sizeof printable);

    qmm_tensor weight, scales, biases;
    find_view(checkpoint, scales_name, &scales);
    snprintf(tensor_name, prefix_length + sizeof ".weight", "%s.weight", name);
    if (!find_view(checkpoint, tensor_name, &weight)) {
        status =
            qmm_error(QMM_ERR_CORRUPT, "layer \"%s\" has %s.scales but no %s.weight", printable, printable, printable);
        goto cleanup;
    }
    snprintf(tensor_name, prefix_length + sizeof ".weight", "%s.biases", name);
    if (!find_view(checkpoint, tensor_name, &biases)) {
        status = qmm_error(QMM_ERR_CORRUPT, "layer \"%s\" has %s.scales but no %s.biases (MLX affine needs both)",
                           printable, printable, printable);
        goto cleanup;
    }

    int bits = checkpoint->config.bits, group_size = checkpoint->config.group_size;
    const layer_format *format = find_override(&checkpoint->config, name);
    if (format && format->bad_kind) {
        status = qmm_error(QMM_ERR_CORRUPT,
                           "config.json's quantization entry for layer \"%s\" is %s; a layer's entry must be an object, a "
                           "bool or a falsy value (MLX's nn.quantize refuses any other truthy value)",
                           printable, format->bad_kind);
        goto cleanup;
    }
    if (format && !format->quantized) {
        status =
            qmm_error(QMM_ERR_CORRUPT, "config.json says layer \"%s\" is not quantized (false or another falsy value), "
                      "but %s.scales exists",
                      printable, printable);
        goto cleanup;
    }
    if (format) {
        bits = format->bits;
        group_size = format->group_size;
    }
    if (bits == 0) {
        status =
            qmm_error(QMM_ERR_CORRUPT, "layer \"%s\" has %s.scales but config.json gives no quantization format for it",
                      printable, printable);
        goto cleanup;
    }
    size_t rows = 0, cols = 0;
    if ((status = check_layer_tensors(printable, &weight, &scales, &biases, bits, group_size, &rows, &cols)) != QMM_OK)
        goto cleanup;
    const void *w = NULL, *s = NULL, *b = NULL;
    if ((status = aligned_view(&weight, &w, &layer->owned[0])) != QMM_OK) goto cleanup;
    if ((status = aligned_view(&scales, &s, &layer->owned[1])) != QMM_OK) goto cleanup;
    if ((status = aligned_view(&biases, &b, &layer->owned[2])) != QMM_OK) goto cleanup;
    layer->matrix.w = w;
    layer->matrix.scales = s;
    layer->matrix.biases = b;
    layer->matrix.dtype = scales.dtype;
    layer->matrix.rows = rows;
    layer->matrix.cols = cols;
    layer->matrix.bits = bits;
    layer->matrix.group_size = group_size;
    /* An MoE layer [E, N, words] (or more leading dims) stacks its experts in the rows: rows = experts·N. */
    layer->experts = 1;
    for (int d = 0; d + 2 < weight.ndim; d++) layer->experts *= (size_t)weight.shape[d];
    layer->experts_dim = weight.ndim > 2;
    layer->name = name;
    name = NULL;
cleanup:
    if (status != QMM_OK) {
        /* The caller counts only layers that were built: copies made before a failure are freed here. */
        for (int k = 0; k < 3; k++) {
            free(layer->owned[k]);
            layer->owned[k] = NULL;
        }
    }
    free(name);
    free(tensor_name);
    return status;
}

static qmm_status index_tensors(qmm_checkpoint *checkpoint, const cJSON *index);

static qmm_status open_directory(const char *dir, qmm_checkpoint *checkpoint) {
    qmm_status status = QMM_OK;
    char *config_path = qmm_io_join(dir, "config.json");
    char *text = NULL, *shard_path = NULL;
    size_t size = 0;
    cJSON *index = NULL;
    if (!config_path) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot build a path");

    struct stat info;
    if (stat(dir, &info) != 0 || !S_ISDIR(info.st_mode)) {
        status = qmm_error(QMM_ERR_IO, "\"%s\" is not a readable directory: %s", dir,
                           errno ? strerror(errno) : "not a directory");
        goto cleanup;
    }
    status = qmm_io_read_file(config_path, CONFIG_MAX_BYTES, &text, &size);
    if (status == QMM_ERR_NOT_FOUND) {
        status = qmm_error(QMM_ERR_NOT_FOUND, "\"%s\" has no config.json", dir);
        goto cleanup;
    }
    if (status != QMM_OK) goto cleanup;
    if ((status = parse_config(text, size, &checkpoint->config)) != QMM_OK) {
        qmm_error(status, "%s: %s", config_path, qmm_last_error()); /* qmm_error formats before it copies */
        goto cleanup;
    }

    if ((status = find_shards(dir, &checkpoint->shard_names, &checkpoint->shard_count, &index)) != QMM_OK) goto cleanup;
    checkpoint->shards = calloc(checkpoint->shard_count, sizeof(qmm_safetensors *));
    if (!checkpoint->shards) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu shards", checkpoint->shard_count);
        goto cleanup;
    }
    for (size_t i = 0; i < checkpoint->shard_count; i++) {
        free(shard_path);
        shard_path = qmm_io_join(dir, checkpoint->shard_names[i]);
        if (!shard_path) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot build a path");
            goto cleanup;
        }
        if (access(shard_path, F_OK) != 0) {
            char shown[QMM_IO_PATH_SHOWN]; /* the shard's name comes from the index: printable */
            status = qmm_error(QMM_ERR_NOT_FOUND, "shard \"%s\" (named by model.safetensors.index.json) does not exist",
                               qmm_printable(shard_path, strlen(shard_path), shown, sizeof shown));
            goto cleanup;
        }
        if ((status = qmm_safetensors_open(shard_path, &checkpoint->shards[i])) != QMM_OK) goto cleanup;
        checkpoint->tensor_count += qmm_safetensors_count(checkpoint->shards[i]);
    }
    status = index_tensors(checkpoint, index);
    if (status == QMM_OK && index) status = check_unnamed_shards(dir, checkpoint->shard_names, checkpoint->shard_count);
cleanup:
    cJSON_Delete(index);
    free(shard_path);
    free(text);
    free(config_path);
    return status;
}

/* With the config parsed and every shard open: the tensor index (shard order and name order), the
 * cross-check with model.safetensors.index.json when there is one, and every quantized layer. */
static qmm_status index_tensors(qmm_checkpoint *checkpoint, const cJSON *index) {
    qmm_status status = QMM_OK;
    char printable[QMM_PRINTABLE_SIZE];
    size_t total = checkpoint->tensor_count;
    checkpoint->tensors = calloc(total ? total : 1, sizeof(tensor_ref));
    checkpoint->by_name = calloc(total ? total : 1, sizeof(tensor_ref));
    checkpoint->layers = calloc(total ? total : 1, sizeof(checkpoint_layer));
    if (!checkpoint->tensors || !checkpoint->by_name || !checkpoint->layers) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the index of %zu tensors", total);
        goto cleanup;
    }
    size_t at = 0;
    for (size_t s = 0; s < checkpoint->shard_count; s++) {
        for (size_t i = 0; i < qmm_safetensors_count(checkpoint->shards[s]); i++, at++) {
            qmm_tensor view;
            qmm_safetensors_get(checkpoint->shards[s], i, &view);
            checkpoint->tensors[at] = (tensor_ref){s, i, view.name};
        }
    }
    memcpy(checkpoint->by_name, checkpoint->tensors, total * sizeof(tensor_ref));
    qsort(checkpoint->by_name, total, sizeof(tensor_ref), compare_refs);
    for (size_t i = 1; i < total; i++) {
        const tensor_ref *a = &checkpoint->by_name[i - 1], *b = &checkpoint->by_name[i];
        if (strcmp(a->name, b->name) == 0) {
            const char *first = checkpoint->shard_names[a->shard], *second = checkpoint->shard_names[b->shard];
            char first_shown[QMM_PRINTABLE_SIZE], second_shown[QMM_PRINTABLE_SIZE]; /* shard names: printable */
            status = qmm_error(QMM_ERR_CORRUPT, "tensor \"%s\" appears in two shards, %s and %s",
                               qmm_printable(a->name, strlen(a->name), printable, sizeof printable),
                               qmm_printable(first, strlen(first), first_shown, sizeof first_shown),
                               qmm_printable(second, strlen(second), second_shown, sizeof second_shown));
            goto cleanup;
        }
    }
    if (index) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(index, "weight_map")) {
            const char *name = item->string ? item->string : "";
            const tensor_ref *ref = find_ref(checkpoint, name);
            if (!ref || strcmp(checkpoint->shard_names[ref->shard], item->valuestring) != 0) {
                char shard[QMM_PRINTABLE_SIZE]; /* the shard's name from the index: printable */
                status = qmm_error(QMM_ERR_CORRUPT, "model.safetensors.index.json puts \"%s\" in %s, but %s",
                                   qmm_printable(name, strlen(name), printable, sizeof printable),
                                   qmm_printable(item->valuestring, strlen(item->valuestring), shard, sizeof shard),
                                   ref ? "it is in another shard" : "no shard has it");
                goto cleanup;
            }
        }
    }

    for (size_t i = 0; i < total; i++) {
        const char *name = checkpoint->tensors[i].name;
        if (!ends_with(name, ".scales")) continue;
        status = build_layer(checkpoint, name, &checkpoint->layers[checkpoint->layer_count]);
        if (status != QMM_OK) goto cleanup;
        checkpoint->layer_count++;
    }
    qsort(checkpoint->layers, checkpoint->layer_count, sizeof(checkpoint_layer), compare_layers);
cleanup:
    return status;
}

bool qmm_io_layer_marked_false(const qmm_checkpoint *checkpoint, const char *name) {
    const layer_format *format = find_override(&checkpoint->config, name);
    return format && !format->quantized && !format->bad_kind;
}

const char *qmm_io_checkpoint_config_text(const qmm_checkpoint *checkpoint) { return checkpoint->config_text; }

qmm_status qmm_io_checkpoint_of_file(const char *path, qmm_checkpoint **checkpoint) {
    if (!checkpoint || !path || !path[0])
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_io_checkpoint_of_file: null argument");
    *checkpoint = NULL;
    qmm_status status = QMM_OK;
    char *dir = NULL, *config_path = NULL, *text = NULL;
    size_t size = 0;
    char printable[QMM_PRINTABLE_SIZE];
    qmm_checkpoint *result = calloc(1, sizeof *result);
    if (!result) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a checkpoint handle");
    result->shards = calloc(1, sizeof(qmm_safetensors *));
    result->shard_names = calloc(1, sizeof(char *));
    if (!result->shards || !result->shard_names || !(result->shard_names[0] = strdup(path))) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a shard entry");
        goto cleanup;
    }
    result->shard_count = 1;
    if ((status = qmm_safetensors_open(path, &result->shards[0])) != QMM_OK) goto cleanup;
    result->tensor_count = qmm_safetensors_count(result->shards[0]);
    const char *quantized = NULL; /* the first P.scales: a layer whose format only a config can give */
    for (size_t i = 0; i < result->tensor_count && !quantized; i++) {
        qmm_tensor view;
        qmm_safetensors_get(result->shards[0], i, &view);
        if (ends_with(view.name, ".scales")) quantized = view.name;
    }
    dir = strdup(path);
    if (!dir) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a path");
        goto cleanup;
    }
    char *slash = strrchr(dir, '/');
    if (slash) slash[slash == dir ? 1 : 0] = '\0';
    config_path = qmm_io_join(slash ? dir : ".", "config.json");
    if (!config_path) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot build a path");
        goto cleanup;
    }
    status = qmm_io_read_file(config_path, CONFIG_MAX_BYTES, &text, &size);
    if (status == QMM_ERR_NOT_FOUND && quantized) {
        size_t length = strlen(quantized) - strlen(".scales");
        status = qmm_error(QMM_ERR_NOT_FOUND,
                           "\"%s\" holds the already quantized layer \"%s\", but there is no %s to give its bits "
                           "and group_size (a format is never guessed from array shapes: 4-bit gs32 and 2-bit "
                           "gs64 have the same ones)",
                           path, qmm_printable(quantized, length, printable, sizeof printable), config_path);
        goto cleanup;
    }
    if (status == QMM_ERR_NOT_FOUND) status = QMM_OK; /* a float file needs no config */
    if (status != QMM_OK) goto cleanup;
    if (text && (status = parse_config(text, size, &result->config)) != QMM_OK) {
        qmm_error(status, "%s: %s", config_path, qmm_last_error());
        goto cleanup;
    }
    if ((status = index_tensors(result, NULL)) != QMM_OK) {
        if (text) qmm_error(status, "%s (formats from %s): %s", path, config_path, qmm_last_error());
        goto cleanup;
    }
    result->config_text = text; /* qmm_checkpoint_quantize carries its other members through */
    text = NULL;
    *checkpoint = result;
    result = NULL;
cleanup:
    qmm_checkpoint_close(result);
    free(text);
    free(config_path);
    free(dir);
    return status;
}

qmm_status qmm_checkpoint_open(const char *dir, qmm_checkpoint **checkpoint) {
    if (!checkpoint) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_open: checkpoint is NULL");
    *checkpoint = NULL;
    if (!dir || !dir[0]) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_open: dir is empty");
    qmm_checkpoint *result = calloc(1, sizeof *result);
    if (!result) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a checkpoint handle");
    errno = 0;
    qmm_status status = open_directory(dir, result);
    if (status != QMM_OK) {
        qmm_checkpoint_close(result);
        return status;
    }
    *checkpoint = result;
    return QMM_OK;
}

size_t qmm_checkpoint_tensor_count(const qmm_checkpoint *checkpoint) {
    return checkpoint ? checkpoint->tensor_count : 0;
}

qmm_status qmm_checkpoint_tensor(const qmm_checkpoint *checkpoint, size_t index, qmm_tensor *tensor) {
    if (!checkpoint || !tensor) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_tensor: null argument");
    if (index >= checkpoint->tensor_count)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "tensor index %zu is out of range (the checkpoint has %zu tensors)",
                         index, checkpoint->tensor_count);
    const tensor_ref *ref = &checkpoint->tensors[index];
    return qmm_safetensors_get(checkpoint->shards[ref->shard], ref->index, tensor);
}

qmm_status qmm_checkpoint_find_tensor(const qmm_checkpoint *checkpoint, const char *name, qmm_tensor *tensor) {
    if (!checkpoint || !name || !tensor)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_find_tensor: null argument");
    if (find_view(checkpoint, name, tensor)) return QMM_OK;
    char printable[QMM_PRINTABLE_SIZE];
    return qmm_error(QMM_ERR_NOT_FOUND, "the checkpoint has no tensor named \"%s\"",
                     qmm_printable(name, strlen(name), printable, sizeof printable));
}

size_t qmm_checkpoint_layer_count(const qmm_checkpoint *checkpoint) { return checkpoint ? checkpoint->layer_count : 0; }

qmm_status qmm_checkpoint_layer(const qmm_checkpoint *checkpoint, size_t index, qmm_layer *layer) {
    if (!checkpoint || !layer) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_layer: null argument");
    if (index >= checkpoint->layer_count)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "layer index %zu is out of range (the checkpoint has %zu layers)",
                         index, checkpoint->layer_count);
    layer->name = checkpoint->layers[index].name;
    layer->matrix = checkpoint->layers[index].matrix;
    layer->experts = checkpoint->layers[index].experts;
    layer->experts_dim = checkpoint->layers[index].experts_dim;
    return QMM_OK;
}

static const char *layer_name_at(const void *context, size_t i) {
    return ((const qmm_checkpoint *)context)->layers[i].name;
}

qmm_status qmm_checkpoint_find_layer(const qmm_checkpoint *checkpoint, const char *name, qmm_layer *layer) {
    if (!checkpoint || !name || !layer)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_find_layer: null argument");
    size_t position = qmm_io_find_sorted(checkpoint, checkpoint->layer_count, layer_name_at, name);
    if (position != QMM_IO_NOT_FOUND) return qmm_checkpoint_layer(checkpoint, position, layer);
    char printable[QMM_PRINTABLE_SIZE];
    return qmm_error(QMM_ERR_NOT_FOUND, "the checkpoint has no quantized layer named \"%s\"",
                     qmm_printable(name, strlen(name), printable, sizeof printable));
}

qmm_status qmm_checkpoint_default_format(const qmm_checkpoint *checkpoint, int *bits, int *group_size) {
    if (!checkpoint || !bits || !group_size)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_default_format: null argument");
    *bits = checkpoint->config.bits;
    *group_size = checkpoint->config.group_size;
    return QMM_OK;
}

/* ───────────────────────────── writing a directory ───────────────────────────── */

/* A stale index or numbered shard would be picked up by a later open together with the new file. */
static qmm_status check_no_stale_shards(const char *dir) {
    DIR *listing = opendir(dir);
    if (!listing) return qmm_error(QMM_ERR_IO, "cannot list \"%s\": %s", dir, strerror(errno));
    qmm_status status = QMM_OK;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        const char *name = entry->d_name;
        bool stale = strcmp(name, "model.safetensors.index.json") == 0 ||
                     (shard_file_name(name) && strcmp(name, "model.safetensors") != 0);
        if (stale) {
            char printable[QMM_PRINTABLE_SIZE];
            status = qmm_error(QMM_ERR_INVALID_ARGUMENT,
                               "\"%s\" already holds \"%s\", which a reader would mix with the new model.safetensors; "
                               "write into an empty or new directory",
                               dir, qmm_printable(name, strlen(name), printable, sizeof printable));
            break;
        }
    }
    closedir(listing);
    return status;
}

static cJSON *format_object(int bits, int group_size) {
    cJSON *object = cJSON_CreateObject();
    if (!object) return NULL;
    if (!cJSON_AddNumberToObject(object, "group_size", group_size) || !cJSON_AddNumberToObject(object, "bits", bits)) {
        cJSON_Delete(object);
        return NULL;
    }
    return object;
}

/* config.json text: extra members first, then "quantization" and "quantization_config". */
static qmm_status build_config(const qmm_layer *layers, size_t layer_count, const char *extra_config_json,
                               char **text) {
    qmm_status status = QMM_OK;
    cJSON *root = NULL, *quantization = NULL;
    size_t *counts = NULL;
    *text = NULL;
    if (extra_config_json) {
        status = qmm_io_parse_json("extra_config_json", extra_config_json, strlen(extra_config_json), &root);
        if (status != QMM_OK) {
            status = qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s", qmm_last_error()); /* names extra_config_json */
            goto cleanup;
        }
        if (!cJSON_IsObject(root)) {
            status = qmm_error(QMM_ERR_INVALID_ARGUMENT, "extra_config_json is %s; it must be a JSON object",
                               qmm_io_json_kind(root));
            goto cleanup;
        }
    } else {
        root = cJSON_CreateObject();
        if (!root) goto out_of_memory;
    }
    if (layer_count > 0) {
        /* The default is the most common (bits, group_size); ties go to the one seen first. */
        counts = calloc(layer_count, sizeof(size_t));
        if (!counts) goto out_of_memory;
        size_t best = 0;
        for (size_t i = 0; i < layer_count; i++) {
            for (size_t j = 0; j <= i; j++) {
                if (layers[j].matrix.bits == layers[i].matrix.bits &&
                    layers[j].matrix.group_size == layers[i].matrix.group_size) {
                    counts[j]++;
                    break;
                }
            }
        }
        for (size_t i = 1; i < layer_count; i++)
            if (counts[i] > counts[best]) best = i;
        int bits = layers[best].matrix.bits, group_size = layers[best].matrix.group_size;
        quantization = format_object(bits, group_size);
        if (!quantization) goto out_of_memory;
        for (size_t i = 0; i < layer_count; i++) {
            if (layers[i].matrix.bits == bits && layers[i].matrix.group_size == group_size) continue;
            cJSON *override = format_object(layers[i].matrix.bits, layers[i].matrix.group_size);
            if (!override || !cJSON_AddItemToObject(quantization, layers[i].name, override)) {
                cJSON_Delete(override);
                goto out_of_memory;
            }
        }
        while (cJSON_GetObjectItemCaseSensitive(root, "quantization"))
            cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization");
        while (cJSON_GetObjectItemCaseSensitive(root, "quantization_config"))
            cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
        cJSON *copy = cJSON_Duplicate(quantization, 1);
        if (!copy) goto out_of_memory;
        if (!cJSON_AddItemToObject(root, "quantization", quantization)) {
            cJSON_Delete(copy);
            goto out_of_memory;
        }
        quantization = NULL;
        if (!cJSON_AddItemToObject(root, "quantization_config", copy)) {
            cJSON_Delete(copy);
            goto out_of_memory;
        }
    }
    *text = cJSON_Print(root);
    if (!*text) goto out_of_memory;
    goto cleanup;
out_of_memory:
    status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot build config.json");
cleanup:
    free(counts);
    cJSON_Delete(quantization);
    cJSON_Delete(root);
    return status;
}

/* An existing file that a write replaces, kept under a temporary name beside it until the write has
 * succeeded, so that a failure after it was replaced can put it back. */
typedef struct kept_file {
    char *path; /* the temporary name; NULL when there was nothing to keep */
    bool moved; /* renamed aside (the file system refused a hard link): its own name is free meanwhile */
} kept_file;

/* Keeps the file at path, if there is one, as "path.qmm-old-XXXXXX": a hard link where the file
 * system allows one (path stays in place for readers), else a rename. A directory at path is not
 * kept: renaming a file onto it fails, so it is never replaced. Errors: QMM_ERR_IO. */
static qmm_status keep_existing(const char *path, kept_file *kept) {
    kept->path = NULL;
    kept->moved = false;
    struct stat info;
    if (lstat(path, &info) != 0) {
        if (errno == ENOENT) return QMM_OK;
        return qmm_error(QMM_ERR_IO, "cannot stat \"%s\": %s", path, strerror(errno));
    }
    if (S_ISDIR(info.st_mode)) return QMM_OK;
    static const char suffix[] = ".qmm-old-XXXXXX";
    size_t length = strlen(path);
    char *keep = malloc(length + sizeof suffix);
    if (!keep) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a temporary name for \"%s\"", path);
    memcpy(keep, path, length);
    memcpy(keep + length, suffix, sizeof suffix);
    /* mkstemp reserves a fresh name; link() cannot replace it, so the placeholder goes first. */
    int fd = mkstemp(keep);
    if (fd < 0) {
        int err = errno;
        free(keep);
        return qmm_error(QMM_ERR_IO, "cannot create a temporary file beside \"%s\": %s", path, strerror(err));
    }
    close(fd);
    unlink(keep);
    if (link(path, keep) != 0) {
        if (rename(path, keep) != 0) {
            int err = errno;
            free(keep);
            return qmm_error(QMM_ERR_IO, "cannot keep the existing \"%s\" aside while it is replaced: %s", path,
                             strerror(err));
        }
        kept->moved = true;
    }
    kept->path = keep;
    return QMM_OK;
}

/* After the write: on success the kept file is removed; on failure it goes back to path (replacing
 * whatever the write put there) when it had left it, else the kept name alone is removed. */
static qmm_status release_kept(const char *path, kept_file *kept, bool replaced, qmm_status status) {
    if (!kept->path) return status;
    if (status != QMM_OK && (replaced || kept->moved)) {
        if (rename(kept->path, path) != 0) {
            /* Nothing is lost: say where the old file is rather than remove it. */
            status = qmm_error(status, "%s (and the previous \"%s\" could not be put back: it is \"%s\")",
                               qmm_last_error(), path, kept->path);
        }
    } else {
        unlink(kept->path);
    }
    free(kept->path);
    kept->path = NULL;
    return status;
}

/* A layer entry that only describes a layer whose tensors the caller passes among tensors[]. */
static bool described_only(const qmm_layer *layer) {
    return !layer->matrix.w && !layer->matrix.scales && !layer->matrix.biases;
}

static const char *io_name_at(const void *context, size_t i) { return ((const qmm_io_name *)context)[i].name; }

/* Everything qmm_checkpoint_write refuses about its arguments, checked before anything is created, so
 * that what it writes opens again with qmm_checkpoint_open as written:
 *   - layer names: non-empty, unique, not a key of the quantization object (bits, group_size, mode,
 *     quant_method: an override under such a name would be read as, or collide with, that key);
 *   - a layer described only (w, scales, biases all NULL): its P.weight, P.scales and P.biases must be
 *     among tensors and pass the reader's checks at the layer's bits and group_size;
 *   - tensors: unique names, and no "X.scales" or "X.biases" that no layer owns (a reader would take
 *     X.scales for a quantized layer whose format the config does not give). */
static qmm_status check_write_arguments(const qmm_tensor *tensors, size_t tensor_count, const qmm_layer *layers,
                                        size_t layer_count) {
    static const char *const reserved[] = {"bits", "group_size", "mode", "quant_method"};
    static const char *const suffixes[3] = {".weight", ".scales", ".biases"};
    qmm_status status = QMM_OK;
    qmm_io_name *tensor_names = calloc(tensor_count ? tensor_count : 1, sizeof(qmm_io_name));
    qmm_io_name *layer_names = calloc(layer_count ? layer_count : 1, sizeof(qmm_io_name));
    char *buffer = NULL;
    char printable[QMM_PRINTABLE_SIZE];
    if (!tensor_names || !layer_names) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu names", tensor_count + layer_count);
        goto cleanup;
    }
    for (size_t i = 0; i < tensor_count; i++) {
        if (!tensors[i].name) {
            status = qmm_error(QMM_ERR_INVALID_ARGUMENT, "tensor %zu has no name", i);
            goto cleanup;
        }
        tensor_names[i] = (qmm_io_name){tensors[i].name, i};
    }
    if ((status = qmm_io_sort_unique(tensor_names, tensor_count, QMM_ERR_INVALID_ARGUMENT, "tensor name")) != QMM_OK)
        goto cleanup;
    size_t longest = 0;
    for (size_t i = 0; i < layer_count; i++) {
        const char *name = layers[i].name;
        if (!name || !name[0]) {
            status = qmm_error(QMM_ERR_INVALID_ARGUMENT, "layer %zu has no name", i);
            goto cleanup;
        }
        qmm_printable(name, strlen(name), printable, sizeof printable);
        for (size_t k = 0; k < sizeof reserved / sizeof reserved[0]; k++) {
            if (strcmp(name, reserved[k]) == 0) {
                status = qmm_error(QMM_ERR_INVALID_ARGUMENT,
                                   "layer \"%s\" has the name of a config.json quantization key (bits, group_size, "
                                   "mode, quant_method); its entry there would collide with that key",
                                   printable);
                goto cleanup;
            }
        }
        if (strlen(name) > longest) longest = strlen(name);
        layer_names[i] = (qmm_io_name){name, i};
    }
    if ((status = qmm_io_sort_unique(layer_names, layer_count, QMM_ERR_INVALID_ARGUMENT, "layer name")) != QMM_OK)
        goto cleanup;
    buffer = malloc(longest + sizeof ".weight");
    if (!buffer) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a tensor name");
        goto cleanup;
    }
    for (size_t i = 0; i < layer_count; i++) {
        const qmm_layer *layer = &layers[i];
        qmm_printable(layer->name, strlen(layer->name), printable, sizeof printable);
        if (!described_only(layer)) { /* its arrays: qmm_qmatrix_validate in the caller */
            for (int k = 0; k < 3; k++) {
                snprintf(buffer, longest + sizeof ".weight", "%s%s", layer->name, suffixes[k]);
                if (qmm_io_find_sorted(tensor_names, tensor_count, io_name_at, buffer) != QMM_IO_NOT_FOUND) {
                    status = qmm_error(QMM_ERR_INVALID_ARGUMENT,
                                       "tensor \"%s%s\" is passed among tensors and also made by layer \"%s\" from "
                                       "its arrays",
                                       printable, suffixes[k], printable);
                    goto cleanup;
                }
            }
            continue;
        }
        if ((status = qmm_format_validate(layer->matrix.bits, layer->matrix.group_size)) != QMM_OK) {
            qmm_error(status, "layer \"%s\": %s", printable, qmm_last_error());
            goto cleanup;
        }
        qmm_tensor parts[3];
        for (int k = 0; k < 3; k++) {
            snprintf(buffer, longest + sizeof ".weight", "%s%s", layer->name, suffixes[k]);
            size_t at = qmm_io_find_sorted(tensor_names, tensor_count, io_name_at, buffer);
            if (at == QMM_IO_NOT_FOUND) {
                status = qmm_error(QMM_ERR_INVALID_ARGUMENT,
                                   "layer \"%s\" is described without arrays, but no tensor is named %s%s", printable,
                                   printable, suffixes[k]);
                goto cleanup;
            }
            parts[k] = tensors[tensor_names[at].index];
        }
        size_t rows = 0, cols = 0;
        status = check_layer_tensors(printable, &parts[0], &parts[1], &parts[2], layer->matrix.bits,
                                     layer->matrix.group_size, &rows, &cols);
        if (status != QMM_OK) {
            status = qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s", qmm_last_error());
            goto cleanup;
        }
    }
    for (size_t i = 0; i < tensor_count; i++) {
        const char *name = tensors[i].name;
        for (int k = 1; k < 3; k++) {
            size_t length = strlen(name), suffix = strlen(suffixes[k]);
            if (length < suffix || strcmp(name + length - suffix, suffixes[k]) != 0) continue;
            char *owner = strdup(name);
            if (!owner) {
                status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a tensor name");
                goto cleanup;
            }
            owner[length - suffix] = '\0';
            size_t at = qmm_io_find_sorted(layer_names, layer_count, io_name_at, owner);
            free(owner);
            if (at == QMM_IO_NOT_FOUND || !described_only(&layers[layer_names[at].index])) {
                status = qmm_error(
                    QMM_ERR_INVALID_ARGUMENT,
                    "tensor \"%s\" ends in %s but no layer describes it: a reader would take it for part of a quantized "
                    "layer whose format config.json does not give (pass the layer, or rename the tensor)",
                    qmm_printable(name, length, printable, sizeof printable), suffixes[k]);
                goto cleanup;
            }
        }
    }
cleanup:
    free(buffer);
    free(tensor_names);
    free(layer_names);
    return status;
}

qmm_status qmm_checkpoint_write(const char *dir, const qmm_tensor *tensors, size_t tensor_count,
                                const qmm_layer *layers, size_t layer_count, const char *extra_config_json) {
    if (!dir || !dir[0]) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_write: dir is empty");
    if ((tensor_count > 0 && !tensors) || (layer_count > 0 && !layers))
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_write: tensors or layers is NULL");
    qmm_status status = QMM_OK;
    qmm_tensor *all = NULL;
    char **names = NULL;
    char *config_text = NULL, *model_path = NULL, *config_path = NULL;
    bool created_dir = false, model_renamed = false;
    int dir_note = -1; /* created_dir's entry for a signal's cleanup (qmm_atomic_remove_all) */
    sigset_t signals;  /* the mask before the signals were held back (signals_held) */
    bool signals_held = false;
    qmm_atomic_file model_file = QMM_ATOMIC_FILE_NONE, config_file = QMM_ATOMIC_FILE_NONE;
    kept_file old_model = {NULL, false};
    char printable[QMM_PRINTABLE_SIZE];

    size_t total = 0, name_count = 0;
    if ((status = check_write_arguments(tensors, tensor_count, layers, layer_count)) != QMM_OK) return status;
    if (!qmm_mul_size(layer_count, 3, &total) || !qmm_add_size(total, tensor_count, &total))
        return qmm_error(QMM_ERR_OVERFLOW, "%zu tensors and %zu layers overflow size_t", tensor_count, layer_count);
    all = calloc(total ? total : 1, sizeof(qmm_tensor));
    names = calloc(layer_count * 3 + 1, sizeof(char *));
    if (!all || !names) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu tensor entries", total);
        goto cleanup;
    }
    if (tensor_count) memcpy(all, tensors, tensor_count * sizeof(qmm_tensor));
    total = tensor_count; /* grows by three per layer that brings its arrays */
    for (size_t i = 0; i < layer_count; i++) {
        const qmm_layer *layer = &layers[i];
        if (described_only(layer)) continue; /* its tensors are among tensors (check_write_arguments) */
        qmm_printable(layer->name, strlen(layer->name), printable, sizeof printable);
        if ((status = qmm_qmatrix_validate(&layer->matrix)) != QMM_OK) {
            qmm_error(status, "layer \"%s\": %s", printable, qmm_last_error());
            goto cleanup;
        }
        const qmm_qmatrix *m = &layer->matrix;
        const size_t experts = layer->experts ? layer->experts : 1;
        if (m->rows % experts != 0) {
            status = qmm_error(QMM_ERR_SHAPE, "layer \"%s\": rows=%zu are not a multiple of experts=%zu", printable,
                               m->rows, experts);
            goto cleanup;
        }
        size_t words = m->cols / 32 * (size_t)m->bits; /* cols is a multiple of group_size, so of 32 */
        size_t groups = m->cols / (size_t)m->group_size;
        size_t element = qmm_dtype_size(m->dtype);
        size_t w_bytes, s_bytes;
        if (!qmm_mul_size(m->rows, words, &w_bytes) || !qmm_mul_size(w_bytes, 4, &w_bytes) ||
            !qmm_mul_size(m->rows, groups, &s_bytes) || !qmm_mul_size(s_bytes, element, &s_bytes)) {
            status = qmm_error(QMM_ERR_OVERFLOW, "layer \"%s\": byte sizes overflow size_t", printable);
            goto cleanup;
        }
        const char *suffixes[3] = {".weight", ".scales", ".biases"};
        const void *arrays[3] = {m->w, m->scales, m->biases};
        for (int k = 0; k < 3; k++) {
            size_t length = strlen(layer->name) + strlen(suffixes[k]) + 1;
            char *name = malloc(length);
            if (!name) {
                status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a tensor name");
                goto cleanup;
            }
            snprintf(name, length, "%s%s", layer->name, suffixes[k]);
            names[name_count++] = name;
            qmm_tensor *t = &all[total++];
            t->name = name;
            t->dtype = k == 0 ? QMM_U32 : m->dtype;
            /* [rows, last], or [experts, rows/experts, last] for a layer of MoE experts (one expert too, with
             * experts_dim: [1, N, last] stays 3-D). */
            t->ndim = experts > 1 || layer->experts_dim ? 3 : 2;
            if (t->ndim == 3) t->shape[0] = (int64_t)experts;
            t->shape[t->ndim - 2] = (int64_t)(m->rows / experts);
            t->shape[t->ndim - 1] = (int64_t)(k == 0 ? words : groups);
            t->data = arrays[k];
            t->nbytes = k == 0 ? w_bytes : s_bytes;
        }
    }
    if ((status = build_config(layers, layer_count, extra_config_json, &config_text)) != QMM_OK) goto cleanup;

    struct stat info;
    if (stat(dir, &info) == 0) {
        if (!S_ISDIR(info.st_mode)) {
            status = qmm_error(QMM_ERR_IO, "\"%s\" exists and is not a directory", dir);
            goto cleanup;
        }
    } else {
        qmm_atomic_block_signals(&signals); /* no signal between the mkdir and its note */
        if (mkdir(dir, 0777) == 0) {
            created_dir = true;
            dir_note = qmm_atomic_note_created_dir(dir);
        }
        const int err = errno;
        qmm_atomic_restore_signals(&signals);
        if (!created_dir) {
            status = qmm_error(QMM_ERR_IO, "cannot create directory \"%s\": %s", dir, strerror(err));
            goto cleanup;
        }
    }
    if (!created_dir && (status = check_no_stale_shards(dir)) != QMM_OK) goto cleanup;
    model_path = qmm_io_join(dir, "model.safetensors");
    config_path = qmm_io_join(dir, "config.json");
    if (!model_path || !config_path) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot build a path");
        goto cleanup;
    }
    /* both temporary files begun before either is written: a destination refused (qmm_atomic_begin) costs no work */
    if ((status = qmm_atomic_begin(&model_file, model_path)) != QMM_OK) goto cleanup;
    if ((status = qmm_atomic_begin(&config_file, config_path)) != QMM_OK) goto cleanup;
    if ((status = qmm_safetensors_write_to(&model_file, all, total, NULL, NULL, 0)) != QMM_OK) goto cleanup;
    if ((status = qmm_atomic_finish(&model_file)) != QMM_OK) goto cleanup;
    if ((status = qmm_atomic_write(&config_file, config_text, strlen(config_text))) != QMM_OK) goto cleanup;
    if ((status = qmm_atomic_write(&config_file, "\n", 1)) != QMM_OK) goto cleanup;
    if ((status = qmm_atomic_finish(&config_file)) != QMM_OK) goto cleanup;
    /* Both files are complete under temporary names; only the two renames remain. If config.json's
     * rename fails, the old config.json is untouched (rename is atomic), so only the old
     * model.safetensors must be kept aside to go back beside it: never leave a config.json with weights
     * that are not its own, nor weights without a config. From here to the end the signals the CLI's cleanup
     * handler catches are held back, so that this runs whole; a signal that came meanwhile ends the process after. */
    qmm_atomic_block_signals(&signals);
    signals_held = true;
    if ((status = keep_existing(model_path, &old_model)) != QMM_OK) goto cleanup;
    if ((status = qmm_atomic_rename(&model_file)) != QMM_OK) goto cleanup;
    model_renamed = true;
    status = qmm_atomic_rename(&config_file);
cleanup:
    if (old_model.path)
        status = release_kept(model_path, &old_model, model_renamed, status);
    else if (status != QMM_OK && model_renamed)
        unlink(model_path);
    qmm_atomic_abort(&model_file);
    qmm_atomic_abort(&config_file);
    if (status != QMM_OK && created_dir) rmdir(dir);
    qmm_atomic_forget(dir_note);
    if (signals_held) qmm_atomic_restore_signals(&signals);
    for (size_t i = 0; i < name_count; i++)
        free(names[i]);
    free(names);
    free(all);
    cJSON_free(config_text);
    free(model_path);
    free(config_path);
    return status;
}
