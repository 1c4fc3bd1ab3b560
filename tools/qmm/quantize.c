/*
 * quantize.c — qmm quantize: the float weights of a safetensors file into an MLX checkpoint.
 */
#include "common.h"

#include <stdlib.h>
#include <string.h>

/* ───────────────────────────── qmm quantize ───────────────────────────── */

int cmd_quantize(const command *c, int argc, char **argv) {
    const char *bits_text = NULL, *group_text = NULL, *convention_text = NULL;
    int force = 0;
    flag_spec flags[] = {{"--bits", NULL, &bits_text, NULL, NULL, 0, NULL},
                         {"--group-size", NULL, &group_text, NULL, NULL, 0, NULL},
                         {"--convention", NULL, &convention_text, NULL, NULL, 0, NULL},
                         {"--force", NULL, NULL, NULL, NULL, 0, &force}};
    const char *positional[2];
    size_t npositional;
    int rc = parse_args(c, argc, argv, flags, 4, positional, 2, &npositional);
    if (rc) return rc;
    if (npositional != 2) return usage_error(c, "expected IN.safetensors and OUTDIR");
    int bits = 0, group_size = 0;
    if (!bits_text) return usage_error(c, "--bits is required");
    if (!group_text) return usage_error(c, "--group-size is required");
    if (!parse_int(bits_text, &bits)) return usage_error(c, "--bits '%s' is not an integer", bits_text);
    if (!parse_int(group_text, &group_size))
        return usage_error(c, "--group-size '%s' is not an integer", group_text);
    qmm_convention convention = QMM_CONVENTION_CPU;
    if (convention_text) {
        if (strcmp(convention_text, "gpu") == 0) convention = QMM_CONVENTION_GPU;
        else if (strcmp(convention_text, "cpu") != 0)
            return usage_error(c, "--convention '%s' is not cpu or gpu", convention_text);
    }
    if (qmm_format_validate(bits, group_size) != QMM_OK)
        return usage_error(c, "--bits %d --group-size %d: %s", bits, group_size, qmm_last_error());
    if ((rc = check_outdir(c, positional[1], force))) return rc;
    qmm_status status;

    qmm_safetensors *file = NULL;
    qmm_tensor *tensors = NULL; /* copied as they are */
    qmm_layer *layers = NULL;   /* written by qmm_checkpoint_write as P.weight, P.scales, P.biases */
    char **names = NULL;        /* layer names, owned here */
    void **arrays = NULL;       /* w, scales, biases of each layer, owned here */
    size_t tensor_count = 0, layer_count = 0, array_count = 0;
    if ((status = qmm_safetensors_open(positional[0], &file)) != QMM_OK) return library_error(c, status);
    size_t count = qmm_safetensors_count(file);
    tensors = calloc(count + 1, sizeof *tensors);
    layers = calloc(count + 1, sizeof *layers);
    names = calloc(count + 1, sizeof *names);
    arrays = calloc(3 * count + 1, sizeof *arrays);
    if (!tensors || !layers || !names || !arrays) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the tensor list of %zu tensors", count);
        goto cleanup;
    }
    for (size_t i = 0; i < count; i++) {
        qmm_tensor t;
        if ((status = qmm_safetensors_get(file, i, &t)) != QMM_OK) goto cleanup;
        int quantize = qmm_is_float_dtype(t.dtype) && t.ndim == 2 && ends_with(t.name, ".weight") &&
                       t.shape[0] > 0 && t.shape[1] > 0 && t.shape[1] % group_size == 0;
        if (!quantize) {
            tensors[tensor_count++] = t;
            continue;
        }
        size_t rows = (size_t)t.shape[0], cols = (size_t)t.shape[1];
        size_t w_bytes, s_bytes;
        const qmm_qmatrix format = {NULL, NULL, NULL, t.dtype, rows, cols, bits, group_size};
        if ((status = qmm_qmatrix_bytes(&format, &w_bytes, &s_bytes)) != QMM_OK) goto cleanup;
        size_t length = strlen(t.name) - strlen(".weight");
        char *layer_name = names[layer_count] = malloc(length + 1);
        uint32_t *w = malloc(w_bytes);
        void *scales = malloc(s_bytes), *biases = malloc(s_bytes);
        arrays[array_count++] = w;
        arrays[array_count++] = scales;
        arrays[array_count++] = biases;
        if (!layer_name || !w || !scales || !biases) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the quantized '%s'", t.name);
            goto cleanup;
        }
        memcpy(layer_name, t.name, length);
        layer_name[length] = '\0';
        fprintf(stderr, "qmm quantize: %s [%zu, %zu] %s -> %d-bit gs%d\n", layer_name, rows, cols,
                qmm_dtype_name(t.dtype), bits, group_size);
        status = qmm_quantize(t.data, t.dtype, rows, cols, bits, group_size, convention, w, scales, biases);
        if (status != QMM_OK) goto cleanup;
        qmm_qmatrix m = {w, scales, biases, t.dtype, rows, cols, bits, group_size};
        layers[layer_count].name = layer_name;
        layers[layer_count].matrix = m;
        layer_count++;
    }
    status = qmm_checkpoint_write(positional[1], tensors, tensor_count, layers, layer_count, NULL);
    if (status == QMM_OK)
        printf("wrote %s: %zu tensors copied, %zu quantized layers (%d-bit gs%d, %s convention)\n", positional[1],
               tensor_count, layer_count, bits, group_size, convention == QMM_CONVENTION_GPU ? "gpu" : "cpu");
cleanup:
    for (size_t i = 0; names && i < count; i++) free(names[i]);
    for (size_t i = 0; arrays && i < array_count; i++) free(arrays[i]);
    free(names);
    free(arrays);
    free(tensors);
    free(layers);
    qmm_safetensors_close(file);
    return status == QMM_OK ? 0 : library_error(c, status);
}
