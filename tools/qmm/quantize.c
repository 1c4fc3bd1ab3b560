/*
 * quantize.c — qmm quantize: the float weights of a safetensors file into an MLX checkpoint.
 */
#include "common.h"

#include <string.h>

/* ───────────────────────────── qmm quantize ───────────────────────────── */

static void print_quantize_note(void *user, qmm_quantize_event event, const char *name, const char *message) {
    (void)user;
    (void)name;
    fprint_safe_line(stderr, "qmm quantize: %s%s", event == QMM_QUANTIZE_LEFT ? "warning: " : "", message);
}

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
    /* A value given wrongly is named before a missing one is asked for (`--bits 7` alone hears about the 7): each value
     * given is parsed and judged — a missing one by a supported stand-in, since qmm_format_validate judges the pair,
     * bits first — and only then are the missing ones required. */
    int bits = 4, group_size = 64;
    if (bits_text && !parse_format_number(bits_text, &bits))
        return usage_error(c, "--bits '%s' is not one of 2, 3, 4, 5, 6, 8", bits_text);
    if (group_text && !parse_format_number(group_text, &group_size))
        return usage_error(c, "--group-size '%s' is not one of 32, 64, 128", group_text);
    if ((bits_text || group_text) && qmm_format_validate(bits, group_size) != QMM_OK) {
        if (bits_text && group_text)
            return usage_error(c, "--bits %d --group-size %d: %s", bits, group_size, qmm_last_error());
        return usage_error(c, "%s %d: %s", bits_text ? "--bits" : "--group-size", bits_text ? bits : group_size,
                           qmm_last_error());
    }
    qmm_convention convention = QMM_CONVENTION_CPU;
    if (convention_text) {
        if (strcmp(convention_text, "gpu") == 0) convention = QMM_CONVENTION_GPU;
        else if (strcmp(convention_text, "cpu") != 0)
            return usage_error(c, "--convention '%s' is not cpu or gpu", convention_text);
    }
    if (!bits_text) return usage_error(c, "--bits is required");
    if (!group_text) return usage_error(c, "--group-size is required");
    if ((rc = check_outdir(c, positional[1], force))) return rc;
    /* The library decides and reports; every weight left unquantized is named here with its reason. */
    qmm_quantize_summary summary;
    qmm_status status = qmm_checkpoint_quantize(positional[0], positional[1], bits, group_size, convention,
                                                print_quantize_note, NULL, &summary);
    if (status != QMM_OK) return library_error(c, status);
    fprint_safe(stdout, "wrote %s: %zu tensor%s copied, %zu quantized layer%s (%d-bit gs%d, %s convention)",
                positional[1], summary.copied, summary.copied == 1 ? "" : "s", summary.quantized,
                summary.quantized == 1 ? "" : "s", bits, group_size, convention == QMM_CONVENTION_GPU ? "gpu" : "cpu");
    if (summary.kept)
        printf(", %zu already quantized layer%s kept in their own format", summary.kept, summary.kept == 1 ? "" : "s");
    if (summary.left) printf(", %zu float weights left unquantized (see above)", summary.left);
    printf("\n");
    return 0;
}
