/*
 * info.c — qmm info: list a .safetensors, .gguf or MLX checkpoint dir (tensors, quantized layers, formats).
 */
#include "common.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* ───────────────────────────── qmm info ───────────────────────────── */

/* Names come from the file: printed through printable (common.h), a control character escaped. */
static void print_tensor_row(const qmm_tensor *t) {
    char shape[160], name[PRINTABLE_SIZE];
    format_shape(shape, sizeof shape, t->ndim, t->shape);
    printf("  %-48s %-5s %s\n", printable(t->name, name, sizeof name), qmm_dtype_name(t->dtype), shape);
}

static void print_layer_row(const qmm_layer *layer) {
    char format[64], name[PRINTABLE_SIZE];
    format_format(format, sizeof format, &layer->matrix);
    printable(layer->name, name, sizeof name);
    if (layer->experts > 1) /* MoE: the rows stack the experts */
        printf("  %-40s N=%-6zu K=%-6zu %s, %zu experts (qmm gather)\n", name, layer->matrix.rows / layer->experts,
               layer->matrix.cols, format, layer->experts);
    else
        printf("  %-40s N=%-6zu K=%-6zu %s\n", name, layer->matrix.rows, layer->matrix.cols, format);
}

static int info_checkpoint(const command *c, const char *dir) {
    qmm_checkpoint *checkpoint = NULL;
    qmm_status status = qmm_checkpoint_open(dir, &checkpoint);
    if (status != QMM_OK) return library_error(c, status);
    int bits = 0, group_size = 0;
    size_t tensors = qmm_checkpoint_tensor_count(checkpoint), layers = qmm_checkpoint_layer_count(checkpoint);
    status = qmm_checkpoint_default_format(checkpoint, &bits, &group_size);
    if (status != QMM_OK) goto done;
    fprint_safe(stdout, "%s: MLX checkpoint, %zu tensor%s, %zu quantized layer%s", dir, tensors, tensors == 1 ? "" : "s",
                layers, layers == 1 ? "" : "s");
    if (bits) printf(" (config default: %d-bit gs%d)", bits, group_size);
    printf("\ntensors:\n");
    for (size_t i = 0; i < tensors; i++) {
        qmm_tensor t;
        if ((status = qmm_checkpoint_tensor(checkpoint, i, &t)) != QMM_OK) goto done;
        print_tensor_row(&t);
    }
    printf("quantized layers:\n");
    for (size_t i = 0; i < layers; i++) {
        qmm_layer layer;
        if ((status = qmm_checkpoint_layer(checkpoint, i, &layer)) != QMM_OK) goto done;
        print_layer_row(&layer);
    }
done:
    qmm_checkpoint_close(checkpoint);
    return status == QMM_OK ? 0 : library_error(c, status);
}

/* A lone .safetensors file does not say bits or group_size (only their product follows from the
 * shapes), so quantized layers are described from config.json when the file sits in a checkpoint dir. */
static int info_safetensors(const command *c, const char *path) {
    qmm_safetensors *file = NULL;
    qmm_checkpoint *checkpoint = NULL;
    char *dir = NULL, *name = NULL;
    qmm_status status = qmm_safetensors_open(path, &file);
    if (status != QMM_OK) return library_error(c, status);
    size_t count = qmm_safetensors_count(file);
    fprint_safe(stdout, "%s: safetensors, %zu tensors", path, count);
    printf("\ntensors:\n");
    for (size_t i = 0; i < count; i++) {
        qmm_tensor t;
        if ((status = qmm_safetensors_get(file, i, &t)) != QMM_OK) goto done;
        print_tensor_row(&t);
    }

    dir = strdup(path);
    if (!dir) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a path");
        goto done;
    }
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else strcpy(dir, ".");
    char config[4096];
    struct stat st;
    snprintf(config, sizeof config, "%s/config.json", dir);
    if (stat(config, &st) == 0 && qmm_checkpoint_open(dir, &checkpoint) != QMM_OK) {
        /* The file itself is fine (it opened above); say why the formats are not shown, then go on. */
        fprint_safe_line(stderr, "qmm info: %s does not open as a checkpoint (%s), so formats are not shown", dir,
                         qmm_last_error());
        checkpoint = NULL;
    }

    printf("quantized layers%s:\n", checkpoint ? " (formats from config.json beside the file)" : "");
    size_t found = 0;
    for (size_t i = 0; i < count; i++) {
        qmm_tensor scales, weight;
        if ((status = qmm_safetensors_get(file, i, &scales)) != QMM_OK) goto done;
        if (!ends_with(scales.name, ".scales")) continue;
        /* the layer's name and its weight's, of any length (a name of 1016 bytes or more was skipped unsaid) */
        const size_t length = strlen(scales.name) - strlen(".scales");
        free(name);
        if (!(name = malloc(2 * length + sizeof ".weight" + 1))) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a layer name of %zu bytes", length);
            goto done;
        }
        char *weight_name = name + length + 1;
        memcpy(name, scales.name, length);
        name[length] = '\0';
        memcpy(weight_name, scales.name, length);
        memcpy(weight_name + length, ".weight", sizeof ".weight");
        qmm_layer layer;
        if (checkpoint && qmm_checkpoint_find_layer(checkpoint, name, &layer) == QMM_OK) {
            print_layer_row(&layer);
        } else {
            char shown[PRINTABLE_SIZE];
            printable(name, shown, sizeof shown);
            if (qmm_safetensors_find(file, weight_name, &weight) != QMM_OK || weight.ndim != 2 || scales.ndim != 2 ||
                scales.shape[1] == 0) {
                printf("  %-40s (scales without a matching 2-D %s.weight)\n", shown, shown);
            } else {
                long long product = (long long)weight.shape[1] * 32 / (long long)scales.shape[1];
                printf("  %-40s N=%-6lld bits×group_size=%lld, scales %s (bits and group_size are in config.json)\n",
                       shown, (long long)weight.shape[0], product, qmm_dtype_name(scales.dtype));
            }
        }
        found++;
    }
    if (!found) printf("  (none)\n");
    status = QMM_OK;
done:
    qmm_checkpoint_close(checkpoint);
    qmm_safetensors_close(file);
    free(dir);
    free(name);
    return status == QMM_OK ? 0 : library_error(c, status);
}

static int info_gguf(const command *c, const char *path) {
    qmm_gguf *file = NULL;
    qmm_status status = qmm_gguf_open(path, &file);
    if (status != QMM_OK) return library_error(c, status);
    size_t count = qmm_gguf_tensor_count(file), importable = 0;
    const char *arch = qmm_gguf_metadata_string(file, "general.architecture");
    const char *name = qmm_gguf_metadata_string(file, "general.name");
    char arch_shown[PRINTABLE_SIZE], name_shown[PRINTABLE_SIZE], tensor_shown[PRINTABLE_SIZE]; /* text from the file */
    printf("%s: GGUF, %zu tensors, architecture %s%s%s%s\n", path, count,
           arch ? printable(arch, arch_shown, sizeof arch_shown) : "(none)", name ? " (\"" : "",
           name ? printable(name, name_shown, sizeof name_shown) : "", name ? "\")" : "");
    printf("  %-40s %-6s %-16s %s\n", "tensor", "type", "shape", "importable");
    for (size_t i = 0; i < count; i++) {
        qmm_gguf_tensor_info info;
        if ((status = qmm_gguf_tensor_info_get(file, i, &info)) != QMM_OK) break;
        char shape[160];
        format_shape(shape, sizeof shape, info.ndim, info.shape);
        char as_no[256];
        snprintf(as_no, sizeof as_no, "no: %s", info.why_not);
        const char *as = as_no;
        if (info.importable) {
            importable++;
            switch (info.type) {
            case QMM_GGUF_Q4_0: as = "yes: 4-bit gs32 f16 (bias -8d)"; break;
            case QMM_GGUF_Q4_1: as = "yes: 4-bit gs32 f16"; break;
            case QMM_GGUF_Q5_0: as = "yes: 5-bit gs32 f16 (bias -16d)"; break;
            case QMM_GGUF_Q5_1: as = "yes: 5-bit gs32 f16"; break;
            case QMM_GGUF_Q8_0: as = "yes: 8-bit gs32 f16 (bias -128d)"; break;
            case QMM_GGUF_Q4_K: as = "yes: 4-bit gs32 f32"; break;
            case QMM_GGUF_Q5_K: as = "yes: 5-bit gs32 f32"; break;
            default: as = "yes: float"; break;
            }
        }
        printf("  %-40s %-6s %-16s %s\n", printable(info.name, tensor_shown, sizeof tensor_shown), info.type_name, shape,
               as);
    }
    qmm_gguf_close(file);
    if (status != QMM_OK) return library_error(c, status);
    printf("%zu of %zu tensors importable\n", importable, count);
    return 0;
}

int cmd_info(const command *c, int argc, char **argv) {
    const char *positional[1];
    size_t npositional;
    int rc = parse_args(c, argc, argv, NULL, 0, positional, 1, &npositional);
    if (rc) return rc;
    if (npositional != 1) return usage_error(c, "expected one FILE or DIR");
    const char *path = positional[0];
    struct stat st;
    if (stat(path, &st) != 0)
        return library_error(c, qmm_error(QMM_ERR_IO, "cannot open '%s': %s", path, strerror(errno)));
    if (S_ISDIR(st.st_mode)) return info_checkpoint(c, path);
    /* Reading a FIFO or a device below could block forever; the readers accept only regular files. */
    if (!S_ISREG(st.st_mode))
        return library_error(c, qmm_error(QMM_ERR_IO, "'%s' is neither a regular file nor a directory", path));
    /* The GGUF magic decides, or a .gguf name (so that a broken .gguf is reported as a GGUF file, "bad GGUF
     * magic", not as a malformed safetensors file). */
    unsigned char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return library_error(c, qmm_error(QMM_ERR_IO, "cannot open '%s': %s", path, strerror(errno)));
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    const size_t length = strlen(path);
    const bool gguf_name = length >= 5 && strcasecmp(path + length - 5, ".gguf") == 0;
    if ((got == 4 && memcmp(magic, "GGUF", 4) == 0) || gguf_name) return info_gguf(c, path);
    return info_safetensors(c, path);
}
