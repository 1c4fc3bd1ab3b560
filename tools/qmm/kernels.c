/*
 * kernels.c — qmm kernels: every backend's kernel table in selector order, or why it is unavailable.
 */
#include "common.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ───────────────────────────── qmm kernels ───────────────────────────── */

/* One backend's rows in the order the selector tries them. Returns 0 or the exit code. */
static int print_table(const command *c, qmm_context *context) {
    size_t count = qmm_kernel_count(context);
    printf("backend %s: %zu kernels, in the order the selector tries them\n",
           qmm_backend_name(qmm_context_backend(context)), count);
    /* Columns as wide as their widest entry, so long names keep the table aligned. */
    int name_width = 4, family_width = 6, order_width = 1;
    for (size_t i = 0; i < count; i++) {
        qmm_kernel_info info;
        if (qmm_kernel_get(context, i, &info) != QMM_OK) continue;
        if ((int)strlen(info.name) > name_width) name_width = (int)strlen(info.name);
        if ((int)strlen(info.family) > family_width) family_width = (int)strlen(info.family);
        if (info.batch_invariant_order && (int)strlen(info.batch_invariant_order) > order_width)
            order_width = (int)strlen(info.batch_invariant_order);
    }
    for (size_t i = 0; i < count; i++) {
        qmm_kernel_info info;
        qmm_status status = qmm_kernel_get(context, i, &info);
        if (status != QMM_OK) return library_error(c, status);
        const char *why_not = NULL;
        int usable = qmm_kernel_usable(context, i, &why_not);
        if (usable < 0) return library_error(c, QMM_ERR_INVALID_ARGUMENT);
        char tile[64], verdict[300], block[16];
        snprintf(tile, sizeof tile, "%dx%dx%d", info.bm, info.bn, info.bk);
        /* threads per GPU block; a host row runs on the context's threads (qmm_context_create), so "-" */
        if (info.backend == QMM_BACKEND_CUDA) snprintf(block, sizeof block, "%d", info.threads);
        else snprintf(block, sizeof block, "-");
        /* Whether this machine can run the row at all (its ISA), and if not, what it lacks. */
        if (usable) snprintf(verdict, sizeof verdict, "yes");
        else snprintf(verdict, sizeof verdict, "no: %s", why_not);
        printf("  %-*s %-6s %-*s tile %-10s block threads %-4s slack %-4g order %-*s  usable: %s — %s\n", name_width,
               info.name, qmm_op_name(info.op), family_width, info.family, tile, block, info.tolerance_slack, order_width,
               info.batch_invariant_order ? info.batch_invariant_order : "-", verdict, info.description);
    }
    return 0;
}

/* Every backend's kernel table in selector order, or why the backend is not available here; with
 * --backend, only that backend's table (auto: the one auto picks), and an unavailable one is an error. */
int cmd_kernels(const command *c, int argc, char **argv) {
    static const qmm_backend backends[] = {QMM_BACKEND_CUDA, QMM_BACKEND_CPU, QMM_BACKEND_REF};
    const char *backend = NULL;
    flag_spec flags[] = {{"--backend", NULL, &backend, NULL, NULL, 0, NULL}};
    const char *positional[1];
    size_t npositional;
    int rc = parse_args(c, argc, argv, flags, 1, positional, 0, &npositional);
    if (rc) return rc;
    int backend_choice;
    if ((rc = parse_backend(c, backend, &backend_choice))) return rc;
    /* The library reads QMM_CPU_MAX_ISA silently (an unknown value caps nothing); say so here, where a typo
     * would otherwise test rows other than the ones meant. */
    const char *cap = getenv("QMM_CPU_MAX_ISA");
    if (cap && strcasecmp(cap, "avx512") != 0 && strcasecmp(cap, "avx2") != 0 && strcasecmp(cap, "portable") != 0) {
        fprint_safe_line(stdout, "note: QMM_CPU_MAX_ISA='%.64s%s' is none of 'avx512', 'avx2', 'portable' (in either "
                         "case), so it caps nothing", cap, strlen(cap) > 64 ? "…" : "");
    }
    qmm_context *context = NULL;
    if (backend) {
        qmm_status status = open_context(backend_choice, &context);
        if (status != QMM_OK) return library_error(c, status);
        rc = print_table(c, context);
        qmm_context_destroy(context);
        return rc;
    }
    for (size_t b = 0; b < sizeof backends / sizeof backends[0]; b++) {
        if (qmm_context_create(backends[b], 0, &context) != QMM_OK) {
            printf("backend %s: not available (%s)\n", qmm_backend_name(backends[b]), qmm_last_error());
            continue;
        }
        rc = print_table(c, context);
        qmm_context_destroy(context);
        if (rc) return rc;
    }
    return 0;
}
