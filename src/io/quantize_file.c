/*
 * quantize_file.c — qmm_checkpoint_quantize: the float weights of one safetensors file quantized into an
 * MLX checkpoint directory (a 3-D [E, N, K] weight becomes a layer of E experts), with the layers that were already quantized kept in their own format (read
 * from the config.json beside the input, never guessed from shapes), every weight left unquantized
 * reported with its reason, and a refusal, with nothing written, when no weight can be quantized. The other
 * members of the input's config.json (model_type, hyperparameters) are carried into the new one.
 */
#include "io_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

/* Whether the input's config.json says "P": false for weight "P.weight". */
static bool marked_false(const qmm_checkpoint *input, const char *weight_name) {
    size_t length = strlen(weight_name) - strlen(".weight");
    char *layer = malloc(length + 1);
    if (!layer) return false;
    memcpy(layer, weight_name, length);
    layer[length] = '\0';
    bool result = qmm_io_layer_marked_false(input, layer);
    free(layer);
    return result;
}

qmm_status qmm_checkpoint_quantize(const char *in_path, const char *out_dir, int bits, int group_size,
                                   qmm_convention convention, qmm_quantize_note note, void *user,
                                   qmm_quantize_summary *summary) {
    if (summary) memset(summary, 0, sizeof *summary);
    if (!in_path || !out_dir) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_quantize: null argument");
    qmm_status status = qmm_format_validate(bits, group_size);
    if (status != QMM_OK) return status;
    if (convention != QMM_CONVENTION_CPU && convention != QMM_CONVENTION_GPU) /* before the input is opened */
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_checkpoint_quantize: convention %d is not QMM_CONVENTION_CPU (0) "
                         "or QMM_CONVENTION_GPU (1)", (int)convention);
    qmm_checkpoint *input = NULL;
    qmm_tensor *tensors = NULL;
    qmm_layer *layers = NULL;
    void **owned = NULL; /* names and arrays of the layers quantized here */
    size_t tensor_count = 0, layer_count = 0, owned_count = 0;
    qmm_quantize_summary counts = {0, 0, 0, 0};
    char first_left[512] = "";
    char message[512], shape[160], printable[QMM_PRINTABLE_SIZE];

    if ((status = qmm_io_checkpoint_of_file(in_path, &input)) != QMM_OK) goto cleanup;
    size_t count = qmm_checkpoint_tensor_count(input), kept = qmm_checkpoint_layer_count(input);
    tensors = calloc(count + 1, sizeof *tensors);
    layers = calloc(count + kept + 1, sizeof *layers);
    owned = calloc(4 * count + 1, sizeof *owned);
    if (!tensors || !layers || !owned) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the tensor list of %zu tensors", count);
        goto cleanup;
    }
    for (size_t i = 0; i < count; i++) {
        qmm_tensor t;
        if ((status = qmm_checkpoint_tensor(input, i, &t)) != QMM_OK) goto cleanup;
        /* A quantized layer's P.weight is U32, so a float *.weight is never part of one. */
        bool candidate = qmm_is_float_dtype(t.dtype) && t.ndim >= 2 && has_suffix(t.name, ".weight");
        const char *reason = NULL;
        char why[160];
        if (candidate) {
            if (t.ndim > 3) {
                snprintf(why, sizeof why,
                         "it has %d dimensions; only 2-D [N, K] weights and 3-D [E, N, K] layers of experts are "
                         "quantized", t.ndim);
                reason = why;
            } else if (strlen(t.name) == strlen(".weight")) {
                snprintf(why, sizeof why, "its layer name (before \".weight\") is empty: a quantized layer needs one for its "
                                          ".scales, .biases and config.json entry");
                reason = why;
            } else if (t.shape[0] == 0 || t.shape[1] == 0 || t.shape[t.ndim - 1] == 0) {
                snprintf(why, sizeof why, "it is empty");
                reason = why;
            } else if (marked_false(input, t.name)) {
                snprintf(why, sizeof why, "config.json gives its layer the entry false (kept unquantized)");
                reason = why;
            } else if (t.shape[t.ndim - 1] % group_size != 0) {
                snprintf(why, sizeof why, "K=%lld is not a multiple of group_size=%d", (long long)t.shape[t.ndim - 1],
                         group_size);
                reason = why;
            }
        }
        if (!candidate || reason) {
            tensors[tensor_count++] = t;
            counts.copied++;
            if (reason) {
                qmm_io_shape_text(t.ndim, t.shape, shape, sizeof shape);
                snprintf(message, sizeof message, "%s %s %s left unquantized: %s",
                         qmm_printable(t.name, strlen(t.name), printable, sizeof printable), shape,
                         qmm_dtype_name(t.dtype), reason);
                if (!first_left[0]) snprintf(first_left, sizeof first_left, "%s", message);
                counts.left++;
                if (note) note(user, QMM_QUANTIZE_LEFT, t.name, message);
            }
            continue;
        }
        /* 2-D [N, K], or 3-D [E, N, K]: the E experts of an MoE layer (mlx-lm's switch_mlp), quantized along
         * K like MLX's mx.quantize of the whole array and stacked in the rows (qmm_layer.experts = E). The
         * reader bounded every shape by the tensor's bytes, so E·N cannot overflow. */
        const size_t experts = t.ndim == 3 ? (size_t)t.shape[0] : 1;
        size_t rows = (size_t)t.shape[t.ndim - 2] * experts, cols = (size_t)t.shape[t.ndim - 1];
        size_t w_bytes, s_bytes;
        const qmm_qmatrix format = {NULL, NULL, NULL, t.dtype, rows, cols, bits, group_size};
        if ((status = qmm_qmatrix_bytes(&format, &w_bytes, &s_bytes)) != QMM_OK) goto cleanup;
        size_t length = strlen(t.name) - strlen(".weight");
        char *name = owned[owned_count++] = malloc(length + 1);
        uint32_t *w = owned[owned_count++] = malloc(w_bytes);
        void *scales = owned[owned_count++] = malloc(s_bytes);
        void *biases = owned[owned_count++] = malloc(s_bytes);
        if (!name || !w || !scales || !biases) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the quantized \"%s\"",
                               qmm_printable(t.name, strlen(t.name), printable, sizeof printable));
            goto cleanup;
        }
        memcpy(name, t.name, length);
        name[length] = '\0';
        if ((status = qmm_quantize(t.data, t.dtype, rows, cols, bits, group_size, convention, w, scales, biases)) !=
            QMM_OK) {
            qmm_error(status, "weight \"%s\": %s", qmm_printable(t.name, strlen(t.name), printable, sizeof printable),
                      qmm_last_error());
            goto cleanup;
        }
        layers[layer_count].name = name;
        layers[layer_count].matrix = (qmm_qmatrix){w, scales, biases, t.dtype, rows, cols, bits, group_size};
        layers[layer_count].experts = experts;
        layers[layer_count].experts_dim = t.ndim == 3; /* [1, N, K] stays 3-D: an MoE layer of one expert */
        layer_count++;
        counts.quantized++;
        if (note) {
            char expert_text[48] = "";
            if (experts > 1) snprintf(expert_text, sizeof expert_text, "%zu experts, ", experts);
            qmm_io_shape_text(t.ndim, t.shape, shape, sizeof shape);
            snprintf(message, sizeof message, "%s %s %s -> %s%d-bit gs%d",
                     qmm_printable(name, length, printable, sizeof printable), shape, qmm_dtype_name(t.dtype),
                     expert_text, bits, group_size);
            note(user, QMM_QUANTIZE_QUANTIZED, name, message);
        }
    }
    if (counts.quantized == 0) {
        if (first_left[0])
            status = qmm_error(QMM_ERR_SHAPE,
                               "%s: no weight can be quantized at bits=%d group_size=%d (%s%s); nothing was written",
                               in_path, bits, group_size, first_left,
                               counts.left > 1 ? ", and the others likewise" : "");
        else
            status = qmm_error(QMM_ERR_NOT_FOUND,
                               "%s has no float (f32, f16, bf16) tensor named *.weight with 2 or more dimensions to "
                               "quantize%s; nothing was written",
                               in_path, kept ? " (its quantized layers are already quantized)" : "");
        goto cleanup;
    }
    /* The layers already quantized: their tensors were copied above; they are described by format only. */
    for (size_t i = 0; i < kept; i++) {
        qmm_layer layer;
        if ((status = qmm_checkpoint_layer(input, i, &layer)) != QMM_OK) goto cleanup;
        layers[layer_count].name = layer.name;
        layers[layer_count].matrix =
            (qmm_qmatrix){NULL, NULL, NULL, layer.matrix.dtype, layer.matrix.rows, layer.matrix.cols,
                          layer.matrix.bits, layer.matrix.group_size};
        layers[layer_count].experts = layer.experts; /* its tensors keep their [E, N, ...] shape */
        layers[layer_count].experts_dim = layer.experts_dim;
        layer_count++;
        counts.kept++;
        if (note) {
            snprintf(message, sizeof message, "%s already quantized: kept as %d-bit gs%d",
                     qmm_printable(layer.name, strlen(layer.name), printable, sizeof printable), layer.matrix.bits,
                     layer.matrix.group_size);
            note(user, QMM_QUANTIZE_KEPT, layer.name, message);
        }
    }
    /* The input's config.json (model_type, hyperparameters, ...) is carried through; its "quantization" and
     * "quantization_config" are replaced by the writer with the new layers' formats. */
    status = qmm_checkpoint_write(out_dir, tensors, tensor_count, layers, layer_count,
                                  qmm_io_checkpoint_config_text(input));
    if (status == QMM_OK && summary) *summary = counts;
cleanup:
    for (size_t i = 0; i < owned_count; i++)
        free(owned[i]);
    free(owned);
    free(tensors);
    free(layers);
    qmm_checkpoint_close(input);
    return status;
}
