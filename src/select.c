/*
 * select.c — the one place that chooses a kernel (DESIGN.md §2).
 *
 * The rule, in full:
 *   1. A forced name (qmm_matmul_options.kernel) picks that row or fails: QMM_ERR_NOT_FOUND when no
 *      row has the name, QMM_ERR_UNSUPPORTED with the row's own reason when it refuses the call.
 *      Forcing never falls back to another row: a benchmark or test that asked for a kernel must
 *      not silently measure a different one.
 *   2. Otherwise the table is walked in order and the first row that accepts the call wins, skipping
 *      rows whose hints say no: tune_only rows (kept for forcing and `qmm tune`), rows whose
 *      prefer_max_m is below M or whose prefer_min_n is above N (a row may handle calls it is not the
 *      fastest at; the thresholds and their one-line reasons sit beside each backend's table). Tables are ordered fastest-first by
 *      their backend and end with rows that accept every valid call (the reference rows, or on CUDA
 *      the generic kernels), so there is always an answer.
 * A measured tuning table (a later issue) will slot in between 1 and 2; until then the order is all.
 */
#include "kernel.h"

#include <stdio.h>
#include <string.h>

bool qmm_kernel_accepts(const qmm_kernel *row, const qmm_call *call, char *why_not, size_t why_not_size) {
    if (row->info.op != call->op) {
        snprintf(why_not, why_not_size, "kernel %s computes %s, the call is %s", row->info.name,
                 qmm_op_name(row->info.op), qmm_op_name(call->op));
        return false;
    }
    if (why_not_size) why_not[0] = '\0';
    if (row->supports(call, why_not, why_not_size)) return true;
    if (why_not_size && why_not[0] == '\0') snprintf(why_not, why_not_size, "kernel %s gave no reason", row->info.name);
    return false;
}

qmm_status qmm_select_kernel(const qmm_kernel *const *table, size_t count, const qmm_call *call,
                             const char *forced, const qmm_kernel **chosen) {
    if (!table || !call || !chosen) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_select_kernel: null argument");
    char why_not[256];
    if (forced) {
        for (size_t i = 0; i < count; i++) {
            if (strcmp(table[i]->info.name, forced) != 0) continue;
            if (!qmm_kernel_accepts(table[i], call, why_not, sizeof why_not))
                return qmm_error(QMM_ERR_UNSUPPORTED, "forced kernel %s does not support this call (M=%zu, N=%zu, K=%zu, %s): %s",
                                 forced, call->M, call->N, call->K, qmm_op_name(call->op), why_not);
            *chosen = table[i];
            return QMM_OK;
        }
        /* Name the known rows so that a typo is easy to fix. */
        char known[256] = "";
        size_t used = 0;
        for (size_t i = 0; i < count && used < sizeof known; i++) {
            int written = snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", table[i]->info.name);
            if (written < 0) break;
            used += (size_t)written;
        }
        return qmm_error(QMM_ERR_NOT_FOUND, "kernel \"%s\" is not registered (known: %s)", forced, known);
    }
    why_not[0] = '\0';
    for (size_t i = 0; i < count; i++) {
        if (table[i]->tune_only || (table[i]->prefer_max_m && call->M > table[i]->prefer_max_m) ||
            call->N < table[i]->prefer_min_n)
            continue;
        if (qmm_kernel_accepts(table[i], call, why_not, sizeof why_not)) {
            *chosen = table[i];
            return QMM_OK;
        }
    }
    return qmm_error(QMM_ERR_UNSUPPORTED, "no kernel supports this call (M=%zu, N=%zu, K=%zu, %s); last reason: %s",
                     call->M, call->N, call->K, qmm_op_name(call->op), count ? why_not : "the table is empty");
}
