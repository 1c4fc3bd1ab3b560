/*
 * convert.c — qmm convert: a GGUF file into an MLX checkpoint directory.
 */
#include "common.h"

/* ───────────────────────────── qmm convert ───────────────────────────── */

int cmd_convert(const command *c, int argc, char **argv) {
    const char *prefixes[64];
    size_t prefix_count = 0;
    int force = 0;
    flag_spec flags[] = {{"--only", NULL, NULL, prefixes, &prefix_count, 64, NULL},
                         {"--force", NULL, NULL, NULL, NULL, 0, &force}};
    const char *positional[2];
    size_t npositional;
    int rc = parse_args(c, argc, argv, flags, 2, positional, 2, &npositional);
    if (rc) return rc;
    if (npositional != 2) return usage_error(c, "expected IN.gguf and OUTDIR");
    for (size_t i = 0; i < prefix_count; i++)
        if (!prefixes[i][0]) return usage_error(c, "--only needs a non-empty PREFIX");
    if ((rc = check_outdir(c, positional[1], force))) return rc;
    fprintf(stderr, "qmm convert: %s -> %s\n", positional[0], positional[1]);
    qmm_status status = qmm_gguf_convert(positional[0], positional[1], prefixes, prefix_count);
    if (status != QMM_OK) return library_error(c, status);
    qmm_checkpoint *checkpoint = NULL;
    if ((status = qmm_checkpoint_open(positional[1], &checkpoint)) != QMM_OK) return library_error(c, status);
    const size_t tensors = qmm_checkpoint_tensor_count(checkpoint), layers = qmm_checkpoint_layer_count(checkpoint);
    printf("wrote %s: %zu tensor%s, %zu quantized layer%s\n", positional[1], tensors, tensors == 1 ? "" : "s", layers,
           layers == 1 ? "" : "s");
    qmm_checkpoint_close(checkpoint);
    return 0;
}
