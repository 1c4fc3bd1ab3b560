/*
 * convert.c — qmm convert: a GGUF file into an MLX checkpoint directory.
 */
#include "common.h"

/* ───────────────────────────── qmm convert ───────────────────────────── */

/* --skip-unsupported: names on stderr the selected tensors the conversion left out (importable = 0). */
static int report_skipped(const command *c, const char *path, const char *const *prefixes, size_t prefix_count) {
    qmm_gguf *file = NULL;
    qmm_status status = qmm_gguf_open(path, &file);
    if (status != QMM_OK) return library_error(c, status);
    size_t skipped = 0;
    char shown[256];
    for (size_t i = 0; i < qmm_gguf_tensor_count(file) && status == QMM_OK; i++) {
        qmm_gguf_tensor_info info;
        if ((status = qmm_gguf_tensor_info_get(file, i, &info)) != QMM_OK || info.importable) continue;
        bool chosen = prefix_count == 0;
        for (size_t p = 0; p < prefix_count && !chosen; p++)
            chosen = strncmp(info.name, prefixes[p], strlen(prefixes[p])) == 0;
        if (!chosen) continue;
        fprintf(stderr, "qmm convert: left out %s (%s: %s)\n", printable(info.name, shown, sizeof shown),
                info.type_name, info.why_not);
        skipped++;
    }
    qmm_gguf_close(file);
    if (status != QMM_OK) return library_error(c, status);
    fprintf(stderr, "qmm convert: %zu tensor%s left out (--skip-unsupported)\n", skipped, skipped == 1 ? "" : "s");
    return 0;
}

int cmd_convert(const command *c, int argc, char **argv) {
    const char *prefixes[64];
    size_t prefix_count = 0;
    int force = 0, skip = 0;
    flag_spec flags[] = {{"--only", NULL, NULL, prefixes, &prefix_count, 64, NULL},
                         {"--force", NULL, NULL, NULL, NULL, 0, &force},
                         {"--skip-unsupported", NULL, NULL, NULL, NULL, 0, &skip}};
    const char *positional[2];
    size_t npositional;
    int rc = parse_args(c, argc, argv, flags, 3, positional, 2, &npositional);
    if (rc) return rc;
    if (npositional != 2) return usage_error(c, "expected IN.gguf and OUTDIR");
    for (size_t i = 0; i < prefix_count; i++)
        if (!prefixes[i][0]) return usage_error(c, "--only needs a non-empty PREFIX");
    if ((rc = check_outdir(c, positional[1], force))) return rc;
    fprint_safe_line(stderr, "qmm convert: %s -> %s", positional[0], positional[1]);
    const qmm_gguf_convert_options options = {
        .prefixes = prefixes, .prefix_count = prefix_count, .skip_unsupported = skip};
    qmm_status status = qmm_gguf_convert_with(positional[0], positional[1], &options);
    if (status != QMM_OK) {
        rc = library_error(c, status);
        /* the hint only where it helps: the file itself opens (its version and byte order are read), so what was
         * unsupported is a tensor — the error above is printed already when the open below sets its own */
        qmm_gguf *file = NULL;
        const bool tensor_type = status == QMM_ERR_UNSUPPORTED && !skip && qmm_gguf_open(positional[0], &file) == QMM_OK;
        qmm_gguf_close(file);
        if (tensor_type)
            fprintf(stderr, "qmm convert: --skip-unsupported converts the rest and leaves such tensors out\n");
        return rc;
    }
    if (skip && (rc = report_skipped(c, positional[0], prefixes, prefix_count))) return rc;
    qmm_checkpoint *checkpoint = NULL;
    if ((status = qmm_checkpoint_open(positional[1], &checkpoint)) != QMM_OK) return library_error(c, status);
    const size_t tensors = qmm_checkpoint_tensor_count(checkpoint), layers = qmm_checkpoint_layer_count(checkpoint);
    fprint_safe_line(stdout, "wrote %s: %zu tensor%s, %zu quantized layer%s", positional[1], tensors, tensors == 1 ? "" : "s",
                     layers, layers == 1 ? "" : "s");
    qmm_checkpoint_close(checkpoint);
    return 0;
}
