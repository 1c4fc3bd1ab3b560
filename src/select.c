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
 *      prefer_max_m is below M or whose prefer_min_n is above N (or prefer_min_k above K), the M limit being
 *      prefer_max_m_small_n when N ≤ prefer_small_n, rows whose prefer_min_m is above
 *      M (or, when N ≥ prefer_large_n, whose prefer_min_m_large_n is), rows whose prefer_gap_tiles range holds the
 *      call's ceil(M/bm)·ceil(N/bn) tiles, and rows whose prefer_min_tiles (from M = prefer_large_m,
 *      prefer_min_tiles_large_m) exceeds those tiles (prefer_min_tiles_unsplit too, in batch-invariant
 *      mode), or whose prefer_min_tiles_k exceeds those tiles times K, or (from M =
 *      prefer_max_tiles_k_min_m) whose prefer_max_tiles_k they exceed, or whose prefer_fill rule (the last
 *      wave's fill over prefer_fill_sms SMs against tiles prefer_fill_over_bn wide) or whose own prefer rule they
 *      fail (a row may handle calls it is not the fastest at; the thresholds and their one-line reasons sit beside
 *      each backend's table). Tables are ordered fastest-first by their backend and end with rows that accept every valid
 *      call (the reference rows, or on CUDA the generic kernels), so there is always an answer.
 * Between 1 and 2, a measured tuning table (qmm_context_load_tuning, written by `qmm tune` on this
 * device) is consulted: when one of its entries matches the call exactly (op, dtype, bits, group_size,
 * N, K, and M inside the entry's [m_min, m_max]) and the row it names accepts the call, that row wins,
 * hints and tune_only notwithstanding (a measurement beats a threshold). Otherwise — no entry, or a
 * stale entry whose row refuses the call — the order of step 2 decides: a tuning table never makes a
 * valid call fail.
 * Batch-invariant calls (qmm_matmul_options.batch_invariant, docs/kernels.md "Batch-invariant mode"): the
 * call's order is that of the first row of the table, hints aside, that declares a batch-invariant order
 * and accepts the call (qmm_batch_invariant_row). Steps 1 and 2 and the tuning table then consider only
 * rows that declare that same order: a forced row without an order, or with another one, fails with
 * QMM_ERR_UNSUPPORTED saying so; a tuned row without it is passed over; and when the hints pass over
 * every row of the order, the row of the order with the fewest rows of x per tile that accepts the call runs
 * (batch_invariant_fallback). So whatever M, every row that can run the call
 * reduces each output the same way, and row i's bits do not depend on M.
 */
#include "kernel.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool qmm_kernel_accepts(const qmm_kernel *row, const qmm_call *call, char *why_not, size_t why_not_size) {
    if (row->info.op != call->op) {
        snprintf(why_not, why_not_size, "kernel %s computes %s, the call is %s", row->info.name,
                 qmm_op_name(row->info.op), qmm_op_name(call->op));
        return false;
    }
    if (call->batch_invariant && !row->info.batch_invariant_order) {
        snprintf(why_not, why_not_size,
                 "kernel %s does not declare a batch-invariant order (docs/kernels.md §11: which rows do, and why "
                 "the others do not), so it refuses batch-invariant calls", row->info.name);
        return false;
    }
    if (why_not_size) why_not[0] = '\0';
    if (row->supports(call, why_not, why_not_size)) return true;
    if (why_not_size && why_not[0] == '\0') snprintf(why_not, why_not_size, "kernel %s gave no reason", row->info.name);
    return false;
}

static int compare_sizes(size_t a, size_t b) { return (a > b) - (a < b); }

/* The key of an entry without its M range, compared field by field. */
static int compare_key(qmm_op op, qmm_dtype dtype, int bits, int group_size, size_t N, size_t K,
                       const qmm_tuning_entry *entry) {
    if (op != entry->op) return op < entry->op ? -1 : 1;
    if (dtype != entry->dtype) return dtype < entry->dtype ? -1 : 1;
    if (bits != entry->bits) return bits < entry->bits ? -1 : 1;
    if (group_size != entry->group_size) return group_size < entry->group_size ? -1 : 1;
    if (N != entry->N) return compare_sizes(N, entry->N);
    return compare_sizes(K, entry->K);
}

int qmm_tuning_compare(const qmm_tuning_entry *a, const qmm_tuning_entry *b) {
    int key = compare_key(a->op, a->dtype, a->bits, a->group_size, a->N, a->K, b);
    return key ? key : compare_sizes(a->m_min, b->m_min);
}

/* The weights' own width (qmm_call.format_bits; 0 there: bits), which a user reads and a tuning table is keyed by. */
static int format_bits(const qmm_call *call) { return call->format_bits ? call->format_bits : call->bits; }

const qmm_tuning_entry *qmm_tuning_find(const qmm_tuning_table *tuning, const qmm_call *call) {
    if (!tuning || !tuning->count) return NULL;
    /* keyed by the weights' own width (a 3-bit matrix stored as 4-bit codes: its entries say 3, as qmm tune wrote) */
    const int bits = format_bits(call);
    /* Binary search for the last entry ≤ (the call's key, m_min = M); entries of one key have disjoint
     * ranges sorted by m_min, so only that one can contain M. */
    size_t low = 0, high = tuning->count; /* the answer is below high */
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        const qmm_tuning_entry *entry = &tuning->entries[middle];
        int key = compare_key(call->op, call->dtype, bits, call->group_size, call->N, call->K, entry);
        if (key > 0 || (key == 0 && entry->m_min <= call->M)) low = middle + 1;
        else high = middle;
    }
    if (low == 0) return NULL;
    const qmm_tuning_entry *entry = &tuning->entries[low - 1];
    if (compare_key(call->op, call->dtype, bits, call->group_size, call->N, call->K, entry) != 0) return NULL;
    return call->M <= entry->m_max ? entry : NULL;
}

void qmm_tuning_free(qmm_tuning_table *tuning) {
    if (!tuning) return;
    free(tuning->entries);
    tuning->entries = NULL;
    tuning->count = 0;
}

qmm_status qmm_select_kernel(const qmm_kernel *const *table, size_t count, const qmm_call *call,
                             const char *forced, const qmm_kernel **chosen) {
    return qmm_select_kernel_tuned(table, count, NULL, call, forced, chosen);
}

qmm_status qmm_batch_invariant_row(const qmm_kernel *const *table, size_t count, const qmm_call *call,
                                   const qmm_kernel **row) {
    char why_not[256];
    for (size_t i = 0; i < count; i++) {
        if (!table[i]->info.batch_invariant_order) continue;
        if (qmm_kernel_accepts(table[i], call, why_not, sizeof why_not)) {
            *row = table[i];
            return QMM_OK;
        }
    }
    return qmm_error(QMM_ERR_UNSUPPORTED,
                     "no kernel of this table declares a batch-invariant order for this call (M=%zu, N=%zu, K=%zu, %s, "
                     "%s, %d-bit, group_size %d)", call->M, call->N, call->K, qmm_op_name(call->op),
                     qmm_dtype_name(call->dtype), format_bits(call), call->group_size);
}

/* The largest M the row's hints let the selector take it for, unforced, at this N (SIZE_MAX: no limit). */
static size_t preferred_max_m(const qmm_kernel *row, size_t N) {
    const bool small_n = row->prefer_small_n && N <= row->prefer_small_n;
    const size_t limit = small_n ? row->prefer_max_m_small_n : row->prefer_max_m;
    return limit ? limit : SIZE_MAX;
}

/* The smallest M the row's hints let the selector take it for, unforced, at this N. */
static size_t preferred_min_m(const qmm_kernel *row, size_t N) {
    const size_t large = row->prefer_large_n && N >= row->prefer_large_n ? row->prefer_min_m_large_n : 0;
    return large > row->prefer_min_m ? large : row->prefer_min_m;
}

/* Whether the call has the tiles of the row's bm × bn its prefer_min_tiles hint asks for (from M = prefer_large_m its
 * prefer_min_tiles_large_m; prefer_min_tiles_unsplit in
 * batch-invariant mode, where nothing splits K), outside its prefer_gap_tiles range, and the tiles × K its
 * prefer_min_tiles_k hint asks for and (from M = prefer_max_tiles_k_min_m) its prefer_max_tiles_k allows. */
static bool tiles_in_range(const qmm_kernel *row, const qmm_call *call) {
    const size_t unsplit = call->batch_invariant ? row->prefer_min_tiles_unsplit : 0;
    const bool capped = row->prefer_max_tiles_k && call->M >= row->prefer_max_tiles_k_min_m;
    const size_t min_tiles =
        row->prefer_large_m && call->M >= row->prefer_large_m ? row->prefer_min_tiles_large_m : row->prefer_min_tiles;
    if (!min_tiles && !row->prefer_min_tiles_k && !unsplit && !row->prefer_gap_tiles_max && !capped) return true;
    const size_t bm = row->info.bm > 0 ? (size_t)row->info.bm : 1, bn = row->info.bn > 0 ? (size_t)row->info.bn : 1;
    const size_t tiles = ((call->M + bm - 1) / bm) * ((call->N + bn - 1) / bn);
    if (tiles < min_tiles || tiles < unsplit) return false;
    if (row->prefer_gap_tiles_max && tiles >= row->prefer_gap_tiles_min && tiles <= row->prefer_gap_tiles_max)
        return false;
    if (!row->prefer_min_tiles_k && !capped) return true;
    if (call->K == 0) return false; /* (no valid call has K = 0) */
    const size_t need = row->prefer_min_tiles_k / call->K + (row->prefer_min_tiles_k % call->K != 0);
    if (tiles < need) return false; /* tiles·K ≥ prefer_min_tiles_k, without the product's overflow */
    return !capped || tiles <= row->prefer_max_tiles_k / call->K; /* tiles·K ≤ prefer_max_tiles_k, the same way */
}

/* Whether the call's tiles of the row's bm × bn fill the last wave over prefer_fill_sms SMs at least
 * prefer_fill_ratio_pct % as well as tiles of bm × prefer_fill_over_bn would (true where the row has no such rule).
 * fill(t) = t ÷ (S·ceil(t ÷ S)); compared as t·ceil(u ÷ S)·100 ≥ pct·u·ceil(t ÷ S), S cancelling, in double (no
 * overflow for any valid call; exact while the products stay below 2^53). */
static bool fills_better(const qmm_kernel *row, const qmm_call *call) {
    if (!row->prefer_fill_sms || !row->prefer_fill_over_bn || !row->prefer_fill_ratio_pct) return true;
    const size_t sms = row->prefer_fill_sms;
    const size_t bm = row->info.bm > 0 ? (size_t)row->info.bm : 1, bn = row->info.bn > 0 ? (size_t)row->info.bn : 1;
    const size_t m_tiles = (call->M + bm - 1) / bm;
    const size_t t = m_tiles * ((call->N + bn - 1) / bn);
    const size_t u = m_tiles * ((call->N + row->prefer_fill_over_bn - 1) / row->prefer_fill_over_bn);
    const double lhs = (double)t * (double)((u + sms - 1) / sms) * 100.0;
    const double rhs = (double)row->prefer_fill_ratio_pct * (double)u * (double)((t + sms - 1) / sms);
    return lhs >= rhs;
}

/* Whether a row that accepts a batch-invariant call reduces in the call's order (set by `order_row`). */
static bool same_order(const qmm_kernel *row, const qmm_kernel *order_row) {
    return order_row == NULL || strcmp(row->info.batch_invariant_order, order_row->info.batch_invariant_order) == 0;
}

/* A batch-invariant call the hints pass over in every row of its order (too little work for any of them, as a rule):
 * of the rows of the order that accept it (tune_only aside), the one with the fewest rows of x per tile (info.bm,
 * the first in table order among equals) — the least tile wasted on a small call (on Hopper the wgmma m64n128 row,
 * not m128n128, which sets the order); the row that set the order where none other does. */
static const qmm_kernel *batch_invariant_fallback(const qmm_kernel *const *table, size_t count, const qmm_call *call,
                                                  const qmm_kernel *order_row) {
    const qmm_kernel *best = NULL;
    char why_not[256];
    for (size_t i = 0; i < count; i++) {
        if (table[i]->tune_only || !table[i]->info.batch_invariant_order || !same_order(table[i], order_row) ||
            (best && table[i]->info.bm >= best->info.bm) || !qmm_kernel_accepts(table[i], call, why_not, sizeof why_not))
            continue;
        best = table[i];
    }
    return best ? best : order_row;
}

qmm_status qmm_select_kernel_tuned(const qmm_kernel *const *table, size_t count, const qmm_tuning_table *tuning,
                                   const qmm_call *call, const char *forced, const qmm_kernel **chosen) {
    if (!table || !call || !chosen) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_select_kernel: null argument");
    char why_not[256];
    /* Batch-invariant: the row whose order every candidate must share (NULL otherwise). */
    const qmm_kernel *order_row = NULL;
    if (forced) {
        for (size_t i = 0; i < count; i++) {
            if (strcmp(table[i]->info.name, forced) != 0) continue;
            if (!qmm_kernel_accepts(table[i], call, why_not, sizeof why_not))
                return qmm_error(QMM_ERR_UNSUPPORTED, "forced kernel %s does not support this call (M=%zu, N=%zu, K=%zu, %s%s): %s",
                                 forced, call->M, call->N, call->K, qmm_op_name(call->op),
                                 call->batch_invariant ? ", batch-invariant" : "", why_not);
            if (call->batch_invariant) {
                qmm_status status = qmm_batch_invariant_row(table, count, call, &order_row);
                if (status != QMM_OK) return status; /* unreachable: table[i] declares one and accepts */
                if (!same_order(table[i], order_row))
                    return qmm_error(QMM_ERR_UNSUPPORTED,
                                     "forced kernel %s reduces in batch-invariant order \"%s\", but this call's order is "
                                     "\"%s\" (that of %s, the first row of the table that declares an order and accepts "
                                     "the call): mixing the two would make a row's bits depend on which kernel ran",
                                     forced, table[i]->info.batch_invariant_order, order_row->info.batch_invariant_order,
                                     order_row->info.name);
            }
            *chosen = table[i];
            return QMM_OK;
        }
        /* Name the known rows so that a typo is easy to fix. */
        char known[800] = ""; /* the CPU table's 22 names take about 610 */
        size_t used = 0;
        for (size_t i = 0; i < count; i++) {
            /* Whole names only: one that does not fit (with room left for ", …") ends the list with "…". */
            const char *name = table[i]->info.name;
            if (used + strlen(name) + 2 + sizeof ", …" > sizeof known) {
                snprintf(known + used, sizeof known - used, "%s…", i ? ", " : "");
                break;
            }
            used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", name);
        }
        char shown[QMM_PRINTABLE_SIZE]; /* the caller's bytes, escaped */
        return qmm_error(QMM_ERR_NOT_FOUND, "kernel \"%s\" is not registered (known: %s)",
                         qmm_printable(forced, strlen(forced), shown, sizeof shown), known);
    }
    if (call->batch_invariant) {
        qmm_status status = qmm_batch_invariant_row(table, count, call, &order_row);
        if (status != QMM_OK) return status;
    }
    /* The measured table: its row when it accepts the call (a stale entry falls through to the order),
     * and under batch-invariant mode only when it reduces in the call's order. */
    const qmm_tuning_entry *entry = qmm_tuning_find(tuning, call);
    if (entry && qmm_kernel_accepts(entry->row, call, why_not, sizeof why_not) && same_order(entry->row, order_row)) {
        *chosen = entry->row;
        return QMM_OK;
    }
    why_not[0] = '\0';
    for (size_t i = 0; i < count; i++) {
        if (table[i]->tune_only || call->M > preferred_max_m(table[i], call->N) ||
            call->M < preferred_min_m(table[i], call->N) || call->N < table[i]->prefer_min_n ||
            call->K < table[i]->prefer_min_k ||
            !tiles_in_range(table[i], call) || !fills_better(table[i], call) ||
            (table[i]->prefer && !table[i]->prefer(call)))
            continue;
        if (qmm_kernel_accepts(table[i], call, why_not, sizeof why_not) && same_order(table[i], order_row)) {
            *chosen = table[i];
            return QMM_OK;
        }
    }
    if (order_row) { /* the hints passed over every row of the order: its row with the fewest rows of x per tile */
        *chosen = batch_invariant_fallback(table, count, call, order_row);
        return QMM_OK;
    }
    return qmm_error(QMM_ERR_UNSUPPORTED, "no kernel supports this call (M=%zu, N=%zu, K=%zu, %s); last reason: %s",
                     call->M, call->N, call->K, qmm_op_name(call->op), count ? why_not : "the table is empty");
}
