/*
 * bench.c — qmm bench: per (shape, M, dtype), the median time of every eligible kernel of a backend against
 * the floor max(bytes ÷ copy bandwidth, 2·M·N·K ÷ matrix peak) — both ceilings measured in the same run —
 * with the selector's choice, whether it was the fastest, and peers (OpenBLAS, MLX, cuBLAS, torch) measured in
 * the same run. The weights rotate through enough copies to exceed the last-level cache, so small M is measured
 * cold: one chain with a step per copy, whole-chain timing (qmm_chain_set_step_timing off), qmm_chain_elapsed ÷ steps. Results to stdout (a table) and,
 * with --json, to a JSON file; progress to stderr. docs/PERF.md says how to read the table.
 */
#include "measure.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef QMM_BENCH_JSON
#include <cjson/cJSON.h>
#endif

#define MAX_ROWS 40
/* The selector "picked the fastest" when its kernel is within this factor of the fastest one measured. */
#define FASTEST_MARGIN 1.05

/* One line of a cell: a kernel of the backend, or a peer. */
typedef struct bench_row {
    char name[128];
    int peer;
    int selected;
    int invariant; /* --batch-invariant: the mode's choice, timed with the option on */
    double us; /* NaN when not measured (note says why) */
    char note[512];
} bench_row;

typedef struct bench_cell {
    const bench_shape *shape;
    size_t M;
    qmm_dtype dtype;
    size_t copies;
    double bytes, flops, floor_us;
    int compute_bound;
    char selected[128];
    int selector_fastest; /* 1 yes, 0 no, -1 not decided (fewer than two kernels measured, or --kernel) */
    bench_row rows[MAX_ROWS];
    size_t row_count;
    size_t pairs;            /* --gather: B = top_k·T index pairs (M holds T) */
    double experts_touched;  /* --gather: distinct experts per call, averaged over the routings */
} bench_cell;

typedef struct bench_run {
    const command *c;
    qmm_context *context;
    qmm_backend backend;
    int bits, group_size, repeats, quick, peers;
    int peer_timeout_s;         /* --peer-timeout: each peer script's deadline (coreutils timeout), seconds */
    int gather;                 /* --gather: the MoE gather op instead of qmm_t (cells' M is T, the tokens) */
    qmm_op op;                  /* --op: qmm_t (x·Ŵᵀ, W [n, k]) or qmm_n (x·Ŵ, W [k, n] quantized along n) */
    size_t experts, top_k;      /* --gather: experts per stack, experts per token */
    int batch_invariant;        /* --batch-invariant: one more row per cell, the mode's choice with the option on */
    const char *kernel;         /* --kernel, or NULL */
    int selector_only;          /* --selector-only: the selector's kernel alone (and the peers) */
    bench_shape shapes[MAX_SHAPES];
    size_t shape_count;
    size_t ms[MAX_LIST];
    size_t m_count;
    qmm_dtype dtypes[MAX_LIST];
    size_t dtype_count;
    bench_cell *cells;
    size_t cell_count;
    bench_ceilings ceilings;
    size_t cache_bytes; /* what the copies must exceed: the LLC (CPU) or the L2 (CUDA) */
    char cache_desc[128];
    char machine[256];
    char absent[8][320]; /* "peer: reason" */
    size_t absent_count;
    char command_line[2048];
    char date[64];
    char load_warning[256];
    char tuning[1024]; /* --tuning: what was loaded, or "" */
    double started;
} bench_run;


static bench_row *add_row(bench_cell *cell, const char *name, int peer) {
    if (cell->row_count == MAX_ROWS) return NULL;
    bench_row *row = &cell->rows[cell->row_count++];
    memset(row, 0, sizeof *row);
    snprintf(row->name, sizeof row->name, "%s", name);
    row->peer = peer;
    row->us = NAN;
    return row;
}

/* The selector's row of a cell, or under --kernel the forced kernel's (the one kernel row); NULL when none. */
static const bench_row *selected_row(const bench_run *run, const bench_cell *cell) {
    for (size_t r = 0; r < cell->row_count; r++)
        if (!cell->rows[r].peer && !cell->rows[r].invariant && (run->kernel || cell->rows[r].selected))
            return &cell->rows[r];
    return NULL;
}

/* The row a progress line shows: the selector's measured row, else (--kernel) the first measured one. */
static const bench_row *progress_row(const bench_cell *cell) {
    const bench_row *shown = NULL;
    for (size_t r = 0; r < cell->row_count; r++) {
        if (cell->rows[r].peer || isnan(cell->rows[r].us)) continue;
        if (cell->rows[r].selected) return &cell->rows[r];
        if (!shown) shown = &cell->rows[r];
    }
    return shown;
}

/* A progress line's time: "12.3 µs (1.23× floor)", or "not measured" where every row was skipped (no row shown). */
static const char *progress_time(const bench_row *shown, double floor_us, char *text, size_t size) {
    if (shown)
        snprintf(text, size, "%.1f µs (%.2f× floor)", shown->us, shown->us / floor_us);
    else
        snprintf(text, size, "not measured");
    return text;
}

/* The k-th kernel of a cell's measuring order (k = 0 … kernel_count): the selector's choice first, then the
 * table's other rows in order, only --kernel's when given, none under --selector-only. 1: *info is a row to
 * consider; 0: skip this k; -1: qmm_kernel_get failed (*status says why). */
static int measuring_order(const bench_run *run, size_t k, const qmm_kernel_info *chosen, qmm_kernel_info *info,
                           qmm_status *status) {
    if (k > 0 && run->selector_only) return 0;
    if (k == 0) *info = *chosen;
    else if ((*status = qmm_kernel_get(run->context, k - 1, info)) != QMM_OK) return -1;
    if (k > 0 && strcmp(info->name, chosen->name) == 0) return 0;
    if (run->kernel && strcmp(info->name, run->kernel) != 0) return 0;
    return 1;
}

/* The note of a --batch-invariant row once timed: its order and the time ÷ the default row's (the selector's, or
 * --kernel's without the option): the mode's cost. */
static void invariant_note(const bench_run *run, const bench_cell *cell, bench_row *row, const char *order) {
    const bench_row *selected = selected_row(run, cell);
    const double reference = selected ? selected->us : NAN;
    if (isnan(reference) || isnan(row->us))
        snprintf(row->note, sizeof row->note, "batch-invariant mode (order \"%s\")", order);
    else
        snprintf(row->note, sizeof row->note, "batch-invariant mode (order \"%s\"): %.2f× the %s time", order,
                 row->us / reference, run->kernel ? "kernel's default-mode" : "default selector's");
}

/* --batch-invariant: the row of the mode — the selector's choice with qmm_matmul_options.batch_invariant on (or
 * --kernel's row with it), timed like the others, its note from invariant_note. A forced kernel the mode refuses
 * gets a row saying why. */
static qmm_status bench_invariant_row(bench_run *run, bench_cell *cell, qmm_weights **weights, size_t copies,
                                      qmm_buffer *x, qmm_buffer *out) {
    const size_t M = cell->M;
    qmm_matmul_options options = {.op = run->op, .kernel = run->kernel, .batch_invariant = 1};
    qmm_kernel_info info;
    qmm_status status = qmm_select(run->context, weights[0], M, &options, &info);
    bench_row *row = add_row(cell, status == QMM_OK ? info.name : run->kernel ? run->kernel : "(none)", 0);
    if (!row) return QMM_OK;
    row->invariant = 1;
    if (status == QMM_ERR_UNSUPPORTED || status == QMM_ERR_NOT_FOUND) {
        snprintf(row->note, sizeof row->note, "not eligible in batch-invariant mode: %s", qmm_last_error());
        return QMM_OK;
    }
    if (status != QMM_OK) return status;
    if (slow_row_skipped(&info, M, cell->shape->N, cell->shape->K, copies, run->repeats, row->note, sizeof row->note))
        return QMM_OK;
    status = time_kernel(run->context, run->repeats, weights, copies, x, M, out, run->op, info.name, 1, &row->us);
    if (status == QMM_OK) invariant_note(run, cell, row, info.batch_invariant_order);
    return status;
}

/* Every M of one (shape, dtype): the selector's choice and every eligible kernel (or --kernel only). */
static qmm_status bench_dtype(bench_run *run, const bench_shape *shape, const qmm_qmatrix *matrix, bench_cell *cells,
                              size_t *done) {
    const size_t N = shape->N, K = shape->K, element = qmm_dtype_size(matrix->dtype);
    size_t w_bytes = 0, group_bytes = 0;
    qmm_status status = qmm_qmatrix_bytes(matrix, &w_bytes, &group_bytes);
    if (status != QMM_OK) return status;
    size_t copies = copies_for(run->cache_bytes, run->quick, (double)(w_bytes + 2 * group_bytes));
    qmm_weights **weights = NULL;
    status = weight_copies_create(run->context, matrix, copies, &weights);

    size_t kernel_count = qmm_kernel_count(run->context);
    for (size_t mi = 0; status == QMM_OK && mi < run->m_count; mi++) {
        bench_cell *cell = &cells[mi];
        const size_t M = run->ms[mi];
        cell->shape = shape;
        cell->M = M;
        cell->dtype = matrix->dtype;
        cell->copies = copies;
        cell->selector_fastest = -1;
        cell->bytes = (double)(w_bytes + 2 * group_bytes) + (double)(M * K + M * N) * (double)element;
        cell->flops = 2.0 * (double)M * (double)N * (double)K;
        double memory_us = cell->bytes / (run->ceilings.copy_gbps * 1e3);
        double compute_us = cell->flops / (bench_peak_for(&run->ceilings, matrix->dtype) * 1e3);
        cell->compute_bound = compute_us > memory_us;
        cell->floor_us = cell->compute_bound ? compute_us : memory_us;

        qmm_buffer *x = NULL, *out = NULL;
        status = operands_create(run->context, matrix->dtype, M, N, K, &x, &out);
        qmm_kernel_info chosen;
        qmm_matmul_options options = {.op = run->op};
        if (status == QMM_OK) status = qmm_select(run->context, weights[0], M, &options, &chosen);
        if (status == QMM_OK) snprintf(cell->selected, sizeof cell->selected, "%s", chosen.name);

        /* The selector's row first, then the other eligible rows in table order. */
        for (size_t k = 0; status == QMM_OK && k <= kernel_count; k++) {
            qmm_kernel_info info;
            const int order = measuring_order(run, k, &chosen, &info, &status);
            if (order < 0) break;
            if (order == 0) continue;
            if (info.op != run->op) {
                bench_row *row = run->kernel ? add_row(cell, info.name, 0) : NULL;
                if (row)
                    snprintf(row->note, sizeof row->note, "not eligible: its op is %s; this run measures %s (--op)",
                             qmm_op_name(info.op), qmm_op_name(run->op));
                continue;
            }
            const char *why_not = NULL;
            int supports = qmm_kernel_supports(run->context, info.name, weights[0], M, run->op, &why_not);
            if (supports < 0) {
                status = QMM_ERR_INVALID_ARGUMENT;
                break;
            }
            if (!supports && !run->kernel) continue; /* not eligible for this call */
            bench_row *row = add_row(cell, info.name, 0);
            if (!row) break;
            row->selected = k == 0;
            if (!supports) {
                snprintf(row->note, sizeof row->note, "not eligible: %s", why_not ? why_not : "(no reason given)");
                continue;
            }
            if (slow_row_skipped(&info, M, N, K, copies, run->repeats, row->note, sizeof row->note)) continue;
            status = time_kernel(run->context, run->repeats, weights, copies, x, M, out, run->op, info.name, 0, &row->us);
        }
        if (status == QMM_OK && run->batch_invariant) status = bench_invariant_row(run, cell, weights, copies, x, out);
        if (status == QMM_OK && run->backend == QMM_BACKEND_CUDA && run->peers) {
            char label[64];
            snprintf(label, sizeof label, "cublas dense %s", qmm_dtype_name(matrix->dtype));
            bench_row *row = add_row(cell, label, 1);
            if (row && matrix->dtype == QMM_F32) {
                snprintf(row->note, sizeof row->note, "not measured: the cuBLAS peer runs f16 and bf16 cells");
            } else if (row) {
                size_t dense_copies = copies_for(run->cache_bytes, run->quick, (double)N * (double)K * (double)element);
                char note[200] = "";
                if (bench_cuda_dense(N, K, M, matrix->dtype, dense_copies, run->repeats, &row->us, note, sizeof note) != QMM_OK)
                    snprintf(row->note, sizeof row->note, "failed: %s", qmm_last_error());
                else
                    snprintf(row->note, sizeof row->note, "%s", note);
            }
        }
        qmm_buffer_destroy(x);
        qmm_buffer_destroy(out);
        if (status != QMM_OK) break;
        (*done)++;
        const bench_row *shown = progress_row(cell);
        char time_text[64];
        fprintf(stderr, "bench [%zu/%zu] %s M=%zu %s: %s %s, %zu kernel row%s, %.0f s so far\n", *done, run->cell_count,
                shape->name, M, qmm_dtype_name(matrix->dtype), shown ? shown->name : cell->selected,
                progress_time(shown, cell->floor_us, time_text, sizeof time_text), cell->row_count,
                cell->row_count == 1 ? "" : "s", now_seconds() - run->started);
    }
    weight_copies_destroy(weights, copies);
    return status;
}

/* ───────────────────────────── --gather ─────────────────────────────
 *
 * The MoE gather op (qmm_gather_matmul) on a stack of `experts` experts of one shape (n×k each): per T, 8
 * routings in which each token picks top_k distinct experts (uniformly, seeded), the pairs sorted by expert
 * with tokens ascending inside each expert (what MLX's gather_qmm gets with sorted_indices from a router's
 * argsort). A timed pass calls qmm_gather_matmul once per step, step i on weight copy i mod copies with
 * routing i mod 8, so the experts a call reads are mostly not in the cache. bytes = the experts a call
 * touches (weights + scales + biases, averaged over the routings) + x + out; flops = 2·B·n·k. */
#define GATHER_ROUTINGS 8
/* A kernel whose probe call says a full measurement would exceed this many seconds gets one pass; one whose single
 * pass would exceed GATHER_SKIP_S is skipped (the note says so), as the plain bench skips its slow scalar rows. */
#define GATHER_BUDGET_S 5.0
#define GATHER_SKIP_S 20.0

/* GATHER_SKIP_S, or QMM_BENCH_GATHER_SKIP_S when that is a positive number of seconds (a test hook: the CLI test
 * sets a threshold far below its case's pass, so the answer does not depend on the machine's speed). */
static double gather_skip_s(void) {
    const char *text = getenv("QMM_BENCH_GATHER_SKIP_S");
    char *end = NULL;
    const double value = text ? strtod(text, &end) : 0.0;
    return text && end != text && *end == '\0' && value > 0.0 && isfinite(value) ? value : GATHER_SKIP_S;
}

typedef struct gather_routing {
    uint32_t *lhs, *rhs; /* [B] tokens and experts, sorted by expert */
    size_t touched;      /* distinct experts */
} gather_routing;

static uint64_t routing_random(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static qmm_status make_routing(uint64_t seed, size_t T, size_t top_k, size_t experts, gather_routing *routing) {
    const size_t B = T * top_k;
    uint32_t *expert_of = malloc(B * sizeof *expert_of);
    size_t *count = calloc(experts + 1, sizeof *count);
    unsigned char *taken = calloc(experts, 1);
    routing->lhs = malloc(B * sizeof *routing->lhs);
    routing->rhs = malloc(B * sizeof *routing->rhs);
    routing->touched = 0;
    qmm_status status = QMM_OK;
    if (!expert_of || !count || !taken || !routing->lhs || !routing->rhs) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a routing of %zu pairs", B);
        goto done;
    }
    uint64_t state = seed;
    for (size_t t = 0; t < T; t++) {
        for (size_t j = 0; j < top_k; j++) { /* distinct experts: the next free one after a taken pick */
            size_t e = (size_t)(routing_random(&state) % experts);
            while (taken[e]) e = (e + 1) % experts;
            taken[e] = 1;
            expert_of[t * top_k + j] = (uint32_t)e;
        }
        for (size_t j = 0; j < top_k; j++) taken[expert_of[t * top_k + j]] = 0;
    }
    /* Counting sort by expert, stable: tokens stay ascending inside each expert's block. */
    for (size_t i = 0; i < B; i++) count[expert_of[i] + 1]++;
    for (size_t e = 0; e < experts; e++) {
        routing->touched += count[e + 1] != 0;
        count[e + 1] += count[e];
    }
    for (size_t i = 0; i < B; i++) {
        const size_t at = count[expert_of[i]]++;
        routing->lhs[at] = (uint32_t)(i / top_k);
        routing->rhs[at] = expert_of[i];
    }
done:
    free(expert_of);
    free(count);
    free(taken);
    return status;
}

/* Waits until the context's work is done: reading one element of out back synchronizes a device backend (the
 * gather call is asynchronous there, like qmm_matmul); on a host backend it is a copy of one element. */
static qmm_status wait_for_out(const qmm_buffer *out) {
    unsigned char element[8];
    return qmm_buffer_read(out, element, 1);
}

/* Median µs of one gather call by `kernel` (NULL: the selector's; ran, if not NULL, gets the row that ran) with
 * qmm_gather_options.batch_invariant = batch_invariant: a probe call, then a warm-up pass and
 * `repeats` timed passes of `steps` calls each, the clock stopped once the last call's work is done (on a device
 * backend 8× as many calls per pass, so that the one wait costs little per call); when the probe says that would
 * take more than GATHER_BUDGET_S, one timed pass over the copies only, and past GATHER_SKIP_S none: *us = NaN (the
 * note says which). */
static qmm_status time_gather(bench_run *run, qmm_weights **weights, size_t copies, const gather_routing *routings,
                              qmm_buffer *x, size_t T, size_t B, qmm_buffer *out, const char *kernel,
                              int batch_invariant, qmm_kernel_info *ran, double *us, char *note, size_t note_size) {
    qmm_gather_options options = {.kernel = kernel, .sorted_indices = 1, .batch_invariant = batch_invariant};
    size_t steps = (copies > GATHER_ROUTINGS ? copies : GATHER_ROUTINGS) * (run->backend == QMM_BACKEND_CUDA ? 8 : 1);
    int repeats = run->repeats, warm_up = 1;
    double started = now_seconds();
    qmm_kernel_info probed;
    qmm_status status = qmm_gather_matmul(run->context, weights[0], x, T, routings[0].lhs, routings[0].rhs, B, out,
                                          &options, &probed);
    if (status == QMM_OK) status = wait_for_out(out);
    if (status != QMM_OK) return status;
    if (ran) *ran = probed;
    options.kernel = probed.name; /* the selector's choice (kernel NULL), forced from here on */
    const double probe = now_seconds() - started;
    if (probe * (double)steps * (double)(repeats + 1) > GATHER_BUDGET_S) {
        if (probe * (double)copies > gather_skip_s()) {
            *us = NAN;
            snprintf(note, note_size, "skipped: one pass of %zu calls would take ~%.0f s (a call took %.2f s)", copies,
                     probe * (double)copies, probe);
            return QMM_OK;
        }
        steps = copies, repeats = 1, warm_up = 0;
        snprintf(note, note_size, "one pass of %zu calls (a call took %.2f s)", steps, probe);
    }
    double *samples = malloc((size_t)repeats * sizeof *samples);
    if (!samples) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %d samples", repeats);
    for (int r = -warm_up; status == QMM_OK && r < repeats; r++) {
        started = now_seconds();
        for (size_t i = 0; status == QMM_OK && i < steps; i++) {
            const gather_routing *routing = &routings[i % GATHER_ROUTINGS];
            status = qmm_gather_matmul(run->context, weights[i % copies], x, T, routing->lhs, routing->rhs, B, out,
                                       &options, NULL);
        }
        if (status == QMM_OK) status = wait_for_out(out);
        if (r >= 0) samples[r] = (now_seconds() - started) * 1e6 / (double)steps;
    }
    if (status == QMM_OK) {
        qsort(samples, (size_t)repeats, sizeof *samples, compare_doubles);
        *us = samples[repeats / 2];
    }
    free(samples);
    return status;
}

/* Every T of one (shape, dtype) for --gather: the selector's gather row and every other gather row. */
static qmm_status bench_gather_dtype(bench_run *run, const bench_shape *shape, const qmm_qmatrix *stack,
                                     bench_cell *cells, size_t *done) {
    const size_t N = shape->N, K = shape->K, element = qmm_dtype_size(stack->dtype), E = run->experts;
    size_t w_bytes = 0, group_bytes = 0;
    qmm_status status = qmm_qmatrix_bytes(stack, &w_bytes, &group_bytes);
    if (status != QMM_OK) return status;
    const double expert_bytes = (double)(w_bytes + 2 * group_bytes) / (double)E;
    const size_t copies = copies_for(run->cache_bytes, run->quick, (double)(w_bytes + 2 * group_bytes));
    qmm_weights **weights = calloc(copies, sizeof *weights);
    if (!weights) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu weight copies", copies);
    for (size_t i = 0; status == QMM_OK && i < copies; i++)
        status = qmm_weights_create_experts(run->context, stack, E, &weights[i]);

    const size_t kernel_count = qmm_kernel_count(run->context);
    for (size_t mi = 0; status == QMM_OK && mi < run->m_count; mi++) {
        bench_cell *cell = &cells[mi];
        const size_t T = run->ms[mi], B = T * run->top_k;
        gather_routing routings[GATHER_ROUTINGS] = {{0}};
        double touched = 0.0;
        for (size_t r = 0; status == QMM_OK && r < GATHER_ROUTINGS; r++) {
            status = make_routing(DEFAULT_SEED + 1000 * T + r, T, run->top_k, E, &routings[r]);
            touched += (double)routings[r].touched / GATHER_ROUTINGS;
        }
        cell->shape = shape;
        cell->M = T;
        cell->pairs = B;
        cell->experts_touched = touched;
        cell->dtype = stack->dtype;
        cell->copies = copies;
        cell->selector_fastest = -1;
        cell->bytes = touched * expert_bytes + (double)(T * K + B * N) * (double)element;
        cell->flops = 2.0 * (double)B * (double)N * (double)K;
        const double memory_us = cell->bytes / (run->ceilings.copy_gbps * 1e3);
        const double compute_us = cell->flops / (bench_peak_for(&run->ceilings, stack->dtype) * 1e3);
        cell->compute_bound = compute_us > memory_us;
        cell->floor_us = cell->compute_bound ? compute_us : memory_us;

        /* x [T, K] and out [B, N] = [T, top_k·N]. */
        qmm_buffer *x = NULL, *out = NULL;
        if (status == QMM_OK) status = operands_create(run->context, stack->dtype, T, run->top_k * N, K, &x, &out);
        qmm_kernel_info chosen = {0};
        const qmm_gather_options options = {.kernel = NULL, .sorted_indices = 1};
        if (status == QMM_OK)
            status = qmm_gather_matmul(run->context, weights[0], x, T, routings[0].lhs, routings[0].rhs, B, out,
                                       &options, &chosen);
        if (status == QMM_OK) snprintf(cell->selected, sizeof cell->selected, "%s", chosen.name);
        for (size_t k = 0; status == QMM_OK && k <= kernel_count; k++) {
            qmm_kernel_info info;
            const int order = measuring_order(run, k, &chosen, &info, &status);
            if (order < 0) break;
            if (order == 0) continue;
            if (info.op != QMM_OP_GATHER) continue; /* --kernel names a gather row (checked before the work) */
            bench_row *row = add_row(cell, info.name, 0);
            if (!row) break;
            row->selected = k == 0;
            status = time_gather(run, weights, copies, routings, x, T, B, out, info.name, 0, NULL, &row->us, row->note,
                                 sizeof row->note);
            if (status == QMM_ERR_UNSUPPORTED) { /* not eligible here: say why when forced, else drop the row */
                if (run->kernel) snprintf(row->note, sizeof row->note, "not eligible: %s", qmm_last_error());
                else cell->row_count--;
                status = QMM_OK;
            }
        }
        /* --batch-invariant: the mode's row (the selector's choice with the option, or --kernel's), as for qmm_t. */
        bench_row *row = status == QMM_OK && run->batch_invariant ? add_row(cell, run->kernel ? run->kernel : "(none)", 0)
                                                                  : NULL;
        if (row) {
            row->invariant = 1;
            qmm_kernel_info info;
            char note[sizeof row->note] = "";
            status = time_gather(run, weights, copies, routings, x, T, B, out, run->kernel, 1, &info, &row->us, note,
                                 sizeof note);
            if (status == QMM_ERR_UNSUPPORTED || status == QMM_ERR_NOT_FOUND) {
                snprintf(row->note, sizeof row->note, "not eligible in batch-invariant mode: %s", qmm_last_error());
                status = QMM_OK;
            } else if (status == QMM_OK) {
                snprintf(row->name, sizeof row->name, "%s", info.name);
                invariant_note(run, cell, row, info.batch_invariant_order);
                if (note[0]) /* the timing's own note (one pass, skipped) goes after */
                    snprintf(row->note + strlen(row->note), sizeof row->note - strlen(row->note), "; %s", note);
            }
        }
        qmm_buffer_destroy(x);
        qmm_buffer_destroy(out);
        for (size_t r = 0; r < GATHER_ROUTINGS; r++) free(routings[r].lhs), free(routings[r].rhs);
        if (status != QMM_OK) break;
        (*done)++;
        const bench_row *shown = progress_row(cell);
        char time_text[64];
        fprintf(stderr, "bench [%zu/%zu] gather %s T=%zu B=%zu %s: %s %s, %zu kernel row%s, %.0f s so far\n", *done,
                run->cell_count, shape->name, T, B, qmm_dtype_name(stack->dtype), shown ? shown->name : cell->selected,
                progress_time(shown, cell->floor_us, time_text, sizeof time_text), cell->row_count,
                cell->row_count == 1 ? "" : "s", now_seconds() - run->started);
    }
    weight_copies_destroy(weights, copies);
    return status;
}

/* The stacked random weights of `experts` experts of shape n×k (rows = experts·n), deterministic per shape. */
static qmm_status make_stack(const bench_run *run, const bench_shape *shape, qmm_qmatrix *stack, uint32_t **w,
                             float **scales, float **biases) {
    bench_shape stacked = *shape;
    stacked.N = shape->N * run->experts;
    return make_master(run->bits, run->group_size, &stacked, stack, w, scales, biases);
}

/* The most host memory one shape's measurement holds at once, in bytes (the arrays' sizes, no allocator overhead): the
 * f32 master (or the --gather stack), one dtype's scales and biases converted, the weight copies where the backend keeps
 * weights in host memory (ref, cpu; CUDA's are device memory), x and out at the largest M, and — after the dtypes —
 * the OpenBLAS peer's dense f32 copies. */
static double shape_host_bytes(const bench_run *run, const bench_shape *shape, int host_weights, int openblas) {
    const double rows = (double)shape->N * (double)(run->gather ? run->experts : 1), K = (double)shape->K;
    const double w_bytes = rows * (double)qmm_packed_words(shape->K, run->bits) * sizeof(uint32_t);
    const double groups = rows * (double)qmm_groups(shape->K, run->group_size);
    const double master = w_bytes + 2.0 * groups * sizeof(float);
    size_t m_max = 1;
    for (size_t i = 0; i < run->m_count; i++) m_max = run->ms[i] > m_max ? run->ms[i] : m_max;
    const double out_rows = (double)m_max * (double)(run->gather ? run->top_k : 1);
    double most = 0.0;
    for (size_t d = 0; d < run->dtype_count; d++) {
        const double element = (double)qmm_dtype_size(run->dtypes[d]), copy = w_bytes + 2.0 * groups * element;
        const double copies = host_weights ? (double)copies_for(run->cache_bytes, run->quick, copy) : 0.0;
        const double held = master + (element < 4 ? 2.0 * groups * element : 0.0) + copies * copy +
                            ((double)m_max * K + out_rows * (double)shape->N) * element;
        most = held > most ? held : most;
    }
    if (openblas) {
        const double dense = (double)shape->N * K * sizeof(float);
        const double held = master + (double)copies_for(run->cache_bytes, run->quick, dense) * dense;
        most = held > most ? held : most;
    }
    return most;
}

/* Refuses, before any measurement, a run with a shape whose arrays would not fit in the host memory available
 * (check_host_memory, common.h: the sixteenth session's break-it helper had --gather at 65536×65536 × 4 experts killed
 * by the system on a 23 GB machine). */
static qmm_status check_shapes_fit(const bench_run *run, int host_weights, int openblas) {
    const char *advice = run->gather ? "measure it on a larger machine or a smaller shape or fewer --experts"
                         : openblas  ? "measure it on a larger machine or a smaller shape (or --no-peers)"
                                     : "measure it on a larger machine or a smaller shape";
    char held[128];
    snprintf(held, sizeof held, "the weights%s%s", host_weights ? " and their copies" : "",
             openblas ? ", the OpenBLAS peer's f32 copies" : "");
    for (size_t s = 0; s < run->shape_count; s++) {
        const bench_shape *shape = &run->shapes[s];
        char subject[160];
        snprintf(subject, sizeof subject, "shape %s (%zu×%zu%s)", shape->name, shape->N, shape->K,
                 run->gather ? " per expert" : "");
        const double needed = shape_host_bytes(run, shape, host_weights, openblas);
        qmm_status status = check_host_memory(needed, subject, held, advice);
        if (status != QMM_OK) return status;
    }
    return QMM_OK;
}

/* Peer (a) on the host: OpenBLAS sgemm on the dequantized f32 weights, for every M of a shape; the same time
 * goes into the shape's cells of every dtype (the peer computes in f32 whatever the dtype). */
static qmm_status bench_openblas_shape(bench_run *run, const qmm_qmatrix *master, bench_cell *cells_of_shape) {
    /* the master is n×k for qmm_t, k×n for qmm_n (--op n): dequantized as it is, multiplied with or without Ŵ's transpose */
    const int k_by_n = run->op == QMM_OP_QMM_N;
    const size_t N = k_by_n ? master->cols : master->rows, K = k_by_n ? master->rows : master->cols;
    double dense_bytes = (double)N * (double)K * sizeof(float);
    size_t copies = copies_for(run->cache_bytes, run->quick, dense_bytes);
    float **w = calloc(copies, sizeof *w);
    qmm_status status = w ? QMM_OK : qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu dense copies", copies);
    for (size_t i = 0; status == QMM_OK && i < copies; i++) {
        w[i] = malloc(N * K * sizeof(float));
        if (!w[i]) status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a dense f32 copy of %zu×%zu", N, K);
        else if (i == 0) status = qmm_dequantize(master, w[0], QMM_F32);
        else memcpy(w[i], w[0], N * K * sizeof(float));
    }
    for (size_t mi = 0; status == QMM_OK && mi < run->m_count; mi++) {
        double us = NAN;
        status = bench_openblas_time(w, copies, N, K, run->ms[mi], k_by_n, run->repeats, &us);
        if (status != QMM_OK) break;
        fprintf(stderr, "bench peer openblas %s M=%zu: %.1f µs\n", cells_of_shape[0].shape->name,
                run->ms[mi], us);
        for (size_t d = 0; d < run->dtype_count; d++) {
            bench_cell *cell = &cells_of_shape[d * run->m_count + mi];
            bench_row *row = add_row(cell, "openblas sgemm f32 (dequantized)", 1);
            if (!row) continue;
            row->us = us;
            snprintf(row->note, sizeof row->note, "f32 weights %zu copies%s", copies,
                     cell->dtype == QMM_F32 ? "" : "; f32 whatever the cell's dtype");
        }
    }
    for (size_t i = 0; w && i < copies; i++) free(w[i]);
    free(w);
    return status;
}

static void note_absent(bench_run *run, const char *peer, const char *reason) {
    if (run->absent_count == sizeof run->absent / sizeof run->absent[0]) return;
    snprintf(run->absent[run->absent_count++], sizeof run->absent[0], "%s: absent: %s", peer, reason);
}

/* src as one single-quoted shell word into dst[size] ('…', each ' as '\''); false when it does not fit. */
static bool shell_quote(char *dst, size_t size, const char *src) {
    size_t at = 0;
    if (size < 3) return false;
    dst[at++] = '\'';
    for (const char *p = src; *p; p++) {
        const char *piece = *p == '\'' ? "'\\''" : NULL;
        const size_t n = piece ? 4 : 1;
        if (at + n + 2 > size) return false;
        if (piece) memcpy(dst + at, piece, n);
        else dst[at] = *p;
        at += n;
    }
    dst[at++] = '\'';
    dst[at] = '\0';
    return true;
}

/* The script peers of the backend (--gather: of the gather op), each run once over the whole grid; their samples
 * go to the cells, matched by (shape, M, dtype) — for --gather M is T. */
static void bench_script_peers(bench_run *run) {
    char shapes[8192] = "", ms[512] = "", dtypes[128] = "";
    size_t used = 0;
    for (size_t s = 0; s < run->shape_count && used < sizeof shapes; s++)
        used += (size_t)snprintf(shapes + used, sizeof shapes - used, "%s%s:%zu:%zu", s ? "," : "", run->shapes[s].name,
                                 run->shapes[s].N, run->shapes[s].K);
    used = 0;
    for (size_t i = 0; i < run->m_count && used < sizeof ms; i++)
        used += (size_t)snprintf(ms + used, sizeof ms - used, "%s%zu", i ? "," : "", run->ms[i]);
    used = 0;
    for (size_t i = 0; i < run->dtype_count && used < sizeof dtypes; i++)
        used += (size_t)snprintf(dtypes + used, sizeof dtypes - used, "%s%s", i ? "," : "", qmm_dtype_name(run->dtypes[i]));
    /* a list cut short would have the scripts time other shapes under these names: then no script runs */
    const bool lists_fit = strlen(shapes) + 1 < sizeof shapes && strlen(ms) + 1 < sizeof ms;

    typedef struct script {
        const char *peer, *python, *file;
    } script;
    char venv_python[PATH_MAX], peers_dir[PATH_MAX];
    snprintf(venv_python, sizeof venv_python, "%s/.venv/bin/python", source_dir());
    /* test hook: QMM_BENCH_PEERS_DIR, a folder of scripts with the peers' file names (tests/cli/bench.sh) */
    const char *peers_override = getenv("QMM_BENCH_PEERS_DIR");
    if (peers_override && *peers_override)
        snprintf(peers_dir, sizeof peers_dir, "%s", peers_override);
    else
        snprintf(peers_dir, sizeof peers_dir, "%s/bench/peers", source_dir());
    script cpu_scripts[] = {{"mlx-cpu", venv_python, "mlx_cpu.py"}, {"ggml", venv_python, "ggml_cpu.py"}};
    script cuda_scripts[] = {{"torch-int4", "python3", "torch_int4.py"}, {"mlx-cuda", "python3", "mlx_cuda.py"}};
    script gather_scripts[] = {{"mlx-gather-cpu", venv_python, "mlx_gather_cpu.py"}};
    script cuda_gather_scripts[] = {{"mlx-gather-cuda", "python3", "mlx_gather_cuda.py"}};
    const int cuda = run->backend == QMM_BACKEND_CUDA;
    const script *scripts = run->gather ? (cuda ? cuda_gather_scripts : gather_scripts) : cuda ? cuda_scripts : cpu_scripts;
    size_t count = run->gather ? 1 : 2;
    char extra[128] = ""; /* --gather: the stack and the routing */
    if (run->gather)
        snprintf(extra, sizeof extra, " --experts %zu --experts-per-token %zu", run->experts, run->top_k);
    /* each script under a deadline (a hung script would hang the bench): coreutils `timeout`, SIGTERM at the deadline
     * and SIGKILL 10 s later; where `timeout` is missing the scripts run without one, said once */
    const bool deadline = system("command -v timeout >/dev/null 2>&1") == 0;
    if (!deadline) fprintf(stderr, "bench: coreutils 'timeout' is not on PATH: the peer scripts run without a deadline\n");
    char deadline_prefix[64] = "";
    if (deadline) snprintf(deadline_prefix, sizeof deadline_prefix, "timeout -k 10 %d ", run->peer_timeout_s);
    for (size_t i = 0; i < count; i++) {
        char absent[320] = "";
        if (!lists_fit) {
            note_absent(run, scripts[i].peer, "the shapes or M list is too long for the script's command line (more than "
                                              "8 KiB of name:N:K items): run fewer shapes at a time");
            continue;
        }
        if (scripts[i].python[0] == '/' && access(scripts[i].python, X_OK) != 0) {
            /* the ggml peer's package is installed by `setup.sh bench` only (README "Benchmarks") */
            snprintf(absent, sizeof absent, "the project's venv is missing (%s; scripts/setup.sh %s creates it)",
                     scripts[i].python, strcmp(scripts[i].peer, "ggml") == 0 ? "bench" : "test");
            note_absent(run, scripts[i].peer, absent);
            continue;
        }
        if (scripts[i].python[0] != '/' && system("command -v python3 >/dev/null 2>&1") != 0) {
            note_absent(run, scripts[i].peer, "python3 is not on PATH");
            continue;
        }
        char command_text[16384], script_path[PATH_MAX + 64];
        char quoted_python[2 * PATH_MAX], quoted_script[2 * PATH_MAX + 128], quoted_shapes[2 * sizeof shapes];
        snprintf(script_path, sizeof script_path, "%s/%s", peers_dir, scripts[i].file);
        /* every text from outside (paths, shape names) single-quoted for the shell, its quotes escaped */
        const bool quoted = shell_quote(quoted_python, sizeof quoted_python, scripts[i].python) &&
                            shell_quote(quoted_script, sizeof quoted_script, script_path) &&
                            shell_quote(quoted_shapes, sizeof quoted_shapes, shapes);
        const int length = !quoted ? -1 : snprintf(command_text, sizeof command_text,
                 "%s%s %s --shapes %s --m %s --dtype %s --bits %d --group-size %d --repeats %d "
                 "--cache-bytes %zu --threads %d%s%s",
                 deadline_prefix, quoted_python, quoted_script, quoted_shapes, ms, dtypes, run->bits, run->group_size,
                 run->repeats, run->quick ? 0 : run->cache_bytes, bench_host_threads(), extra, run->quick ? " --quick" : "");
        if (length < 0 || (size_t)length >= sizeof command_text) {
            note_absent(run, scripts[i].peer, "its command line would exceed 16 KiB (long paths or shape lists)");
            continue;
        }
        fprintf(stderr, "bench peer %s: %s\n", scripts[i].peer, command_text);
        bench_peer_samples samples = {0};
        /* a script answers once per cell (and peer name): room for four times that, enough for the checks below to
         * say what else it printed */
        const size_t max_samples = 4 * run->cell_count + 64;
        if (!bench_run_script_peer(command_text, deadline ? run->peer_timeout_s : 0, max_samples, &samples, absent,
                                   sizeof absent)) {
            note_absent(run, scripts[i].peer, absent);
            bench_peer_samples_free(&samples);
            continue;
        }
        size_t unmatched = 0; /* lines naming no cell of this run: counted, said once */
        for (size_t j = 0; j < samples.count; j++) {
            const bench_peer_sample *sample = &samples.items[j];
            bool matched = false;
            for (size_t k = 0; k < run->cell_count; k++) {
                bench_cell *cell = &run->cells[k];
                if (!cell->shape || cell->M != sample->M || strcmp(cell->shape->name, sample->shape) != 0 ||
                    strcmp(qmm_dtype_name(cell->dtype), sample->dtype) != 0)
                    continue;
                matched = true;
                bool seen = false; /* one row per peer and cell: a script's later lines for the cell are dropped */
                for (size_t r = 0; r < cell->row_count && !seen; r++)
                    seen = cell->rows[r].peer && strcmp(cell->rows[r].name, sample->peer) == 0;
                if (seen) {
                    fprintf(stderr, "  peer %s: a second line for %s M=%zu %s is ignored\n", sample->peer, sample->shape,
                            sample->M, sample->dtype);
                    continue;
                }
                bench_row *row = add_row(cell, sample->peer, 1);
                if (!row) {
                    fprintf(stderr, "  peer %s: no room for its row in %s M=%zu %s (%d rows)\n", sample->peer,
                            sample->shape, sample->M, sample->dtype, MAX_ROWS);
                    continue;
                }
                row->us = sample->us;
                snprintf(row->note, sizeof row->note, "%s", sample->note);
                if (isnan(sample->us) && strncmp(row->note, "skipped", 7) != 0) {
                    char note[256];
                    snprintf(note, sizeof note, "skipped: %s", sample->note);
                    snprintf(row->note, sizeof row->note, "%s", note);
                }
            }
            unmatched += !matched;
        }
        if (unmatched)
            fprintf(stderr, "  peer %s: %zu line%s named no cell of this run (shape, M, dtype): ignored\n",
                    scripts[i].peer, unmatched, unmatched == 1 ? "" : "s");
        bench_peer_samples_free(&samples);
    }
}

/* ───────────────────────────── the table ───────────────────────────── */

static void format_us(char *out, size_t size, double us) {
    if (isnan(us)) snprintf(out, size, "—");
    else if (us >= 1e5) snprintf(out, size, "%.0f", us);
    else snprintf(out, size, "%.1f", us);
}

static void print_header(const bench_run *run) {
    if (run->gather)
        printf("# qmm bench --gather — backend %s on %s; %d-bit group %d; MoE gather out[i, n] = x[lhs[i], k]·Ŵ[rhs[i]]ᵀ "
               "over %zu experts of n×k, %zu distinct experts per token, B = %zu·T pairs sorted by expert "
               "(MLX gather_qmm, sorted_indices)\n", qmm_backend_name(run->backend), run->machine, run->bits,
               run->group_size, run->experts, run->top_k, run->top_k);
    else
        printf("# qmm bench — backend %s on %s; %d-bit group %d; %s\n", qmm_backend_name(run->backend), run->machine,
               run->bits, run->group_size,
               run->op == QMM_OP_QMM_N ? "qmm_n out[M, n] = x[M, k]·Ŵ, Ŵ [k, n] quantized along n (MLX transpose=False)"
                                       : "qmm_t out[M, n] = x[M, k]·Ŵᵀ");
    printf("# ceilings measured in this run: copy %.1f GB/s (%s)\n", run->ceilings.copy_gbps, run->ceilings.copy_method);
    printf("#                                matrix peak %.1f GFLOP/s (%s)\n", run->ceilings.peak_gflops,
           run->ceilings.peak_method);
    bool bf16_cells = false; /* the bf16 peak's line only where a cell uses it */
    for (size_t d = 0; d < run->dtype_count; d++) bf16_cells = bf16_cells || run->dtypes[d] == QMM_BF16;
    if (bf16_cells && run->ceilings.peak_bf16_gflops > run->ceilings.peak_gflops)
        printf("#                                bf16 peak %.1f GFLOP/s (%s): the compute term of bf16 cells\n",
               run->ceilings.peak_bf16_gflops, run->ceilings.peak_bf16_method);
    if (run->gather)
        printf("# floor = max(bytes ÷ copy, 2·B·n·k ÷ peak); bytes = the experts a call touches (weights + scales + "
               "biases, averaged over %d routings) + x + out; ×floor = µs ÷ floor\n", GATHER_ROUTINGS);
    else
        printf("# floor = max(bytes ÷ copy, 2·M·n·k ÷ peak); bytes = weights + scales + biases + x + out; ×floor = µs ÷ floor\n");
    if (run->quick)
        printf("# --quick: tiny grid, 2 weight copies (not rotated beyond the cache), short ceilings — a smoke test, not a measurement\n");
    else
        printf("# weights rotate through copies totalling > 2 × %s (%.0f MiB), so every product reads them cold\n",
               run->cache_desc, (double)run->cache_bytes / 1048576.0);
    if (run->gather)
        printf("# timing: qmm_gather_matmul in a loop, call i on weight copy i mod copies with routing i mod %d; host "
               "clock around the loop and a wait for its last call ÷ calls, median of %d passes after a warm-up pass%s\n",
               GATHER_ROUTINGS, run->repeats,
               run->backend == QMM_BACKEND_CUDA ? " (calls stream as a model's layers would: the index uploads, every "
                                                  "launch and the GPU's work are in the time)"
                                                : "");
    else if (run->backend == QMM_BACKEND_CUDA)
        printf("# timing: one CUDA graph per (cell, kernel) with a step per copy and nothing else, replayed; device time "
               "of the whole replay from events ÷ steps, median of %d replays after a warm-up (host launch gaps excluded)\n",
               run->repeats);
    else
        printf("# timing: one chain per (cell, kernel) with a step per copy; host clock around the whole run ÷ steps, "
               "median of %d runs after a warm-up\n", run->repeats);
    if (run->tuning[0])
        printf("# the selector read a measured %s ('selector picked the fastest' judges the tuned selector)\n",
               run->tuning);
    if (run->batch_invariant)
        printf("# --batch-invariant: 'bi' rows are the selector's choice (or --kernel) with %s.batch_invariant "
               "on, timed the same way; the note gives its time ÷ the default mode's (the mode's cost)\n",
               run->gather ? "qmm_gather_options" : "qmm_matmul_options");
    if (run->selector_only)
        printf("# --selector-only: the selector's kernel alone is measured in each cell (with the peers), so "
               "'fastest' is not decided\n");
    printf("# * = the selector's choice; 'fastest' = the selector's kernel is within 5%% of the fastest kernel measured; "
           "GB/s = the quantized problem's bytes ÷ time (also for peers)\n");
    for (size_t i = 0; i < run->absent_count; i++) printf("# peer %s\n", run->absent[i]);
    if (run->load_warning[0]) printf("%s\n", run->load_warning);
}

static void print_table(const bench_run *run) {
    /* The shape column: 26 wide, or the longest name and two spaces (qwen3-30b-a3b.experts_gate_up is 29). */
    int shape_width = 26;
    for (size_t k = 0; k < run->cell_count; k++)
        if (run->cells[k].shape && (int)strlen(run->cells[k].shape->name) + 2 > shape_width)
            shape_width = (int)strlen(run->cells[k].shape->name) + 2;
    print_cell("shape", shape_width);
    print_cell("n×k", 12);
    print_cell(run->gather ? "T" : "M", 5);
    print_cell("dtype", 6);
    print_cell("floor µs", 10);
    print_cell("bound", 8);
    print_cell("kernel or peer", 40);
    print_cell("µs", 10);
    print_cell("GB/s", 8);
    print_cell("×floor", 8);
    printf("note\n");
    for (size_t k = 0; k < run->cell_count; k++) {
        const bench_cell *cell = &run->cells[k];
        if (!cell->shape) continue;
        char nk[48], m[24], floor_text[32], us[32], gbps[32], ratio[32], name[160];
        snprintf(nk, sizeof nk, "%zu×%zu", cell->shape->N, cell->shape->K);
        snprintf(m, sizeof m, "%zu", cell->M);
        format_us(floor_text, sizeof floor_text, cell->floor_us);
        for (size_t r = 0; r < cell->row_count || r == 0; r++) {
            const bench_row *row = r < cell->row_count ? &cell->rows[r] : NULL;
            print_cell(r == 0 ? cell->shape->name : "", shape_width);
            print_cell(r == 0 ? nk : "", 12);
            print_cell(r == 0 ? m : "", 5);
            print_cell(r == 0 ? qmm_dtype_name(cell->dtype) : "", 6);
            print_cell(r == 0 ? floor_text : "", 10);
            print_cell(r == 0 ? (cell->compute_bound ? "compute" : "memory") : "", 8);
            if (!row) {
                printf("(no eligible kernel)\n");
                continue;
            }
            snprintf(name, sizeof name, "%s%s", row->peer ? "peer " : row->invariant ? "bi " : row->selected ? "* " : "  ",
                     row->name);
            print_cell(name, 40);
            format_us(us, sizeof us, row->us);
            print_cell(us, 10);
            if (isnan(row->us)) snprintf(gbps, sizeof gbps, "—"), snprintf(ratio, sizeof ratio, "—");
            else {
                snprintf(gbps, sizeof gbps, "%.1f", cell->bytes / (row->us * 1e3));
                snprintf(ratio, sizeof ratio, "%.2f", row->us / cell->floor_us);
            }
            print_cell(gbps, 8);
            print_cell(ratio, 8);
            if (run->gather && r == 0) printf("B=%zu, %.1f experts touched; ", cell->pairs, cell->experts_touched);
            if (row->selected && cell->selector_fastest >= 0)
                printf("fastest: %s%s%s\n", cell->selector_fastest ? "yes" : "no", row->note[0] ? "; " : "", row->note);
            else
                printf("%s\n", row->note);
        }
    }
}

/* After the table, one line per M (T with --gather) over every shape and dtype: the cells, the range of the
 * selector's time ÷ floor, and for each peer the cells where qmm is faster of those where both have a time —
 * the figures the issues' targets are stated in, so a run can be read against them without a script. */
static void print_summary(const bench_run *run) {
    enum { MAX_PEERS = 8 };
    const char *peers[MAX_PEERS];
    int widths[MAX_PEERS];
    size_t peer_count = 0;
    for (size_t k = 0; k < run->cell_count; k++)
        for (size_t r = 0; r < run->cells[k].row_count; r++) {
            const bench_row *row = &run->cells[k].rows[r];
            if (!row->peer) continue;
            size_t p = 0;
            while (p < peer_count && strcmp(peers[p], row->name) != 0) p++;
            if (p == peer_count && peer_count < MAX_PEERS) peers[peer_count++] = row->name;
        }
    printf("summary by %s: the selector's kernel over every shape and dtype — time ÷ floor, and the cells where it is "
           "faster than each peer, of those where both have a time\n", run->gather ? "T" : "M");
    print_cell(run->gather ? "T" : "M", 7);
    print_cell("cells", 7);
    print_cell("×floor", 14);
    for (size_t p = 0; p < peer_count; p++) {
        char header[80];
        snprintf(header, sizeof header, "vs %s", peers[p]);
        widths[p] = (int)strlen(header) + 2 > 12 ? (int)strlen(header) + 2 : 12;
        print_cell(header, widths[p]);
    }
    printf("\n");
    for (size_t i = 0; i < run->m_count; i++) {
        size_t cells = 0, wins[MAX_PEERS] = {0}, both[MAX_PEERS] = {0};
        double low = INFINITY, high = -INFINITY;
        for (size_t k = 0; k < run->cell_count; k++) {
            const bench_cell *cell = &run->cells[k];
            if (!cell->shape || cell->M != run->ms[i]) continue;
            cells++;
            const bench_row *mine = selected_row(run, cell);
            if (!mine || isnan(mine->us)) continue;
            const double ratio = mine->us / cell->floor_us;
            low = ratio < low ? ratio : low;
            high = ratio > high ? ratio : high;
            for (size_t r = 0; r < cell->row_count; r++) {
                const bench_row *row = &cell->rows[r];
                if (!row->peer || isnan(row->us)) continue;
                for (size_t p = 0; p < peer_count; p++)
                    if (strcmp(peers[p], row->name) == 0) {
                        both[p]++;
                        wins[p] += mine->us < row->us;
                    }
            }
        }
        char text[48];
        snprintf(text, sizeof text, "%zu", run->ms[i]);
        print_cell(text, 7);
        snprintf(text, sizeof text, "%zu", cells);
        print_cell(text, 7);
        if (low <= high) snprintf(text, sizeof text, "%.2f–%.2f", low, high);
        else snprintf(text, sizeof text, "—");
        print_cell(text, 14);
        for (size_t p = 0; p < peer_count; p++) {
            if (both[p]) snprintf(text, sizeof text, "%zu/%zu", wins[p], both[p]);
            else snprintf(text, sizeof text, "—");
            print_cell(text, widths[p]);
        }
        printf("\n");
    }
}

/* Whether the selector's row is within FASTEST_MARGIN of the fastest kernel row measured in each cell. */
static void decide_fastest(bench_run *run, size_t *decided, size_t *yes) {
    *decided = *yes = 0;
    for (size_t k = 0; k < run->cell_count; k++) {
        bench_cell *cell = &run->cells[k];
        double selected = NAN, best = INFINITY;
        size_t measured = 0;
        for (size_t r = 0; r < cell->row_count; r++) {
            const bench_row *row = &cell->rows[r];
            if (row->peer || row->invariant || isnan(row->us)) continue;
            measured++;
            if (row->us < best) best = row->us;
            if (row->selected) selected = row->us;
        }
        cell->selector_fastest = -1;
        if (run->kernel || measured < 2 || isnan(selected)) continue;
        cell->selector_fastest = selected <= FASTEST_MARGIN * best;
        (*decided)++;
        *yes += (size_t)cell->selector_fastest;
    }
}

/* ───────────────────────────── JSON ───────────────────────────── */

#ifdef QMM_BENCH_JSON
static cJSON *number_or_null(double value) { return isnan(value) || isinf(value) ? cJSON_CreateNull() : cJSON_CreateNumber(value); }

static qmm_status write_json(const bench_run *run, const char *path, double elapsed) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "tool", "qmm bench");
    char version[32];
    snprintf(version, sizeof version, "%d.%d.%d", QMM_VERSION_MAJOR, QMM_VERSION_MINOR, QMM_VERSION_PATCH);
    cJSON_AddStringToObject(root, "version", version);
    cJSON_AddStringToObject(root, "command", run->command_line);
    cJSON_AddStringToObject(root, "date", run->date);
    cJSON_AddStringToObject(root, "backend", qmm_backend_name(run->backend));
    cJSON *machine = cJSON_AddObjectToObject(root, "machine");
    cJSON_AddStringToObject(machine, run->backend == QMM_BACKEND_CUDA ? "gpu" : "cpu", run->machine);
    cJSON_AddNumberToObject(machine, "threads", bench_host_threads());
    cJSON_AddStringToObject(machine, "cache", run->cache_desc);
    cJSON_AddNumberToObject(machine, "cache_bytes", (double)run->cache_bytes);
    cJSON *format = cJSON_AddObjectToObject(root, "format");
    cJSON_AddNumberToObject(format, "bits", run->bits);
    cJSON_AddNumberToObject(format, "group_size", run->group_size);
    cJSON_AddStringToObject(root, "op", run->gather ? "gather" : qmm_op_name(run->op));
    if (run->gather) { /* cells' M is T (tokens); B = top_k·T pairs */
        cJSON *gather = cJSON_AddObjectToObject(root, "gather");
        cJSON_AddNumberToObject(gather, "experts", (double)run->experts);
        cJSON_AddNumberToObject(gather, "top_k", (double)run->top_k);
        cJSON_AddNumberToObject(gather, "routings", GATHER_ROUTINGS);
    }
    cJSON *ceilings = cJSON_AddObjectToObject(root, "ceilings");
    cJSON_AddItemToObject(ceilings, "copy_gbps", number_or_null(run->ceilings.copy_gbps));
    cJSON_AddStringToObject(ceilings, "copy_method", run->ceilings.copy_method);
    cJSON_AddItemToObject(ceilings, "matrix_peak_gflops", number_or_null(run->ceilings.peak_gflops));
    cJSON_AddStringToObject(ceilings, "matrix_peak_method", run->ceilings.peak_method);
    cJSON_AddItemToObject(ceilings, "matrix_peak_bf16_gflops", number_or_null(run->ceilings.peak_bf16_gflops));
    cJSON_AddStringToObject(ceilings, "matrix_peak_bf16_method", run->ceilings.peak_bf16_method);
    cJSON_AddStringToObject(root, "floor",
                            "max(bytes / copy_gbps, flops / matrix_peak_gflops); bf16 cells: matrix_peak_bf16_gflops");
    cJSON_AddNumberToObject(root, "repeats", run->repeats);
    cJSON_AddBoolToObject(root, "quick", run->quick);
    cJSON_AddBoolToObject(root, "batch_invariant", run->batch_invariant);
    cJSON_AddBoolToObject(root, "selector_only", run->selector_only);
    if (run->load_warning[0]) cJSON_AddStringToObject(root, "warning", run->load_warning + 2);
    if (run->tuning[0]) cJSON_AddStringToObject(root, "tuning", run->tuning);
    cJSON *absent = cJSON_AddArrayToObject(root, "peers_absent");
    for (size_t i = 0; i < run->absent_count; i++) cJSON_AddItemToArray(absent, cJSON_CreateString(run->absent[i]));
    cJSON *cells = cJSON_AddArrayToObject(root, "cells");
    for (size_t k = 0; k < run->cell_count; k++) {
        const bench_cell *cell = &run->cells[k];
        if (!cell->shape) continue;
        cJSON *item = cJSON_CreateObject();
        cJSON_AddStringToObject(item, "shape", cell->shape->name);
        cJSON_AddNumberToObject(item, "N", (double)cell->shape->N);
        cJSON_AddNumberToObject(item, "K", (double)cell->shape->K);
        cJSON_AddNumberToObject(item, "M", (double)cell->M);
        if (run->gather) {
            cJSON_AddNumberToObject(item, "T", (double)cell->M);
            cJSON_AddNumberToObject(item, "B", (double)cell->pairs);
            cJSON_AddNumberToObject(item, "experts_touched", cell->experts_touched);
        }
        cJSON_AddStringToObject(item, "dtype", qmm_dtype_name(cell->dtype));
        cJSON_AddNumberToObject(item, "copies", (double)cell->copies);
        cJSON_AddNumberToObject(item, "bytes", cell->bytes);
        cJSON_AddNumberToObject(item, "flops", cell->flops);
        cJSON_AddItemToObject(item, "floor_us", number_or_null(cell->floor_us));
        cJSON_AddStringToObject(item, "bound", cell->compute_bound ? "compute" : "memory");
        cJSON_AddStringToObject(item, "selected", cell->selected);
        if (cell->selector_fastest < 0) cJSON_AddNullToObject(item, "selector_fastest");
        else cJSON_AddBoolToObject(item, "selector_fastest", cell->selector_fastest);
        cJSON *kernels = cJSON_AddArrayToObject(item, "kernels");
        cJSON *peers = cJSON_AddArrayToObject(item, "peers");
        for (size_t r = 0; r < cell->row_count; r++) {
            const bench_row *row = &cell->rows[r];
            cJSON *entry = cJSON_CreateObject();
            cJSON_AddStringToObject(entry, "name", row->name);
            if (!row->peer) cJSON_AddBoolToObject(entry, "selected", row->selected);
            if (!row->peer) cJSON_AddBoolToObject(entry, "batch_invariant", row->invariant);
            cJSON_AddItemToObject(entry, "us", number_or_null(row->us));
            cJSON_AddItemToObject(entry, "gbps", number_or_null(cell->bytes / (row->us * 1e3)));
            cJSON_AddItemToObject(entry, "x_floor", number_or_null(row->us / cell->floor_us));
            char note[sizeof row->note]; /* a note cut by snprintf may end inside a character: JSON wants whole ones */
            cJSON_AddStringToObject(entry, "note", whole_utf8(row->note, note, sizeof note));
            cJSON_AddItemToArray(row->peer ? peers : kernels, entry);
        }
        cJSON_AddItemToArray(cells, item);
    }
    cJSON_AddNumberToObject(root, "elapsed_s", elapsed);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot format the JSON results");
    size_t length = strlen(text);
    char *file = malloc(length + 1);
    qmm_status status = file ? QMM_OK : qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot format the JSON results");
    if (file) {
        memcpy(file, text, length);
        file[length] = '\n';
        status = write_output_file("--json", path, file, length + 1);
    }
    free(file);
    cJSON_free(text);
    return status;
}
#endif

/* --json PATH: a file, or a directory (then bench-<backend>-<date>-<pid>.json in it: two runs started in the same
 * second do not write one file); checked before the work. */
static int resolve_json_path(const command *c, const char *text, qmm_backend backend, char *path, size_t size) {
#ifndef QMM_BENCH_JSON
    (void)text, (void)backend, (void)path, (void)size;
    return library_error(c, qmm_error(QMM_ERR_UNSUPPORTED, "--json: qmm was built without cJSON (libcjson-dev), "
                                                           "which writes the JSON results"));
#else
    struct stat info;
    if (!text[0]) return usage_error(c, "--json is empty (want a file or a directory)");
    if ((stat(text, &info) == 0 && S_ISDIR(info.st_mode)) || ends_with(text, "/")) {
        char stamp[32];
        time_t now = time(NULL);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", gmtime(&now));
        snprintf(path, size, "%s%sbench-%s-%s-%ld.json", text, ends_with(text, "/") ? "" : "/", qmm_backend_name(backend),
                 stamp, (long)getpid());
    } else {
        snprintf(path, size, "%s", text);
    }
    return check_output_file(c, "--json", path);
#endif
}

/* ───────────────────────────── qmm bench ───────────────────────────── */

int cmd_bench(const command *c, int argc, char **argv) {
    const char *backend_text = NULL, *shapes_text = NULL, *m_text = NULL, *dtype_text = NULL, *bits_text = NULL,
               *group_text = NULL, *kernel = NULL, *repeats_text = NULL, *json_text = NULL, *tuning_text = NULL,
               *threads_text = NULL, *experts_text = NULL, *top_k_text = NULL, *op_text = NULL,
               *peer_timeout_text = NULL;
    int no_peers = 0, quick = 0, threads = 0, gather = 0, batch_invariant = 0, selector_only = 0;
    flag_spec flags[] = {
        {"--backend", NULL, &backend_text, NULL, NULL, 0, NULL}, {"--shapes", NULL, &shapes_text, NULL, NULL, 0, NULL},
        {"--m", "-m", &m_text, NULL, NULL, 0, NULL},             {"--dtype", NULL, &dtype_text, NULL, NULL, 0, NULL},
        {"--bits", NULL, &bits_text, NULL, NULL, 0, NULL},       {"--group-size", NULL, &group_text, NULL, NULL, 0, NULL},
        {"--kernel", NULL, &kernel, NULL, NULL, 0, NULL},        {"--repeats", NULL, &repeats_text, NULL, NULL, 0, NULL},
        {"--json", NULL, &json_text, NULL, NULL, 0, NULL},       {"--no-peers", NULL, NULL, NULL, NULL, 0, &no_peers},
        {"--quick", NULL, NULL, NULL, NULL, 0, &quick},          {"--tuning", NULL, &tuning_text, NULL, NULL, 0, NULL},
        {"--threads", NULL, &threads_text, NULL, NULL, 0, NULL},
        {"--gather", NULL, NULL, NULL, NULL, 0, &gather},        {"--experts", NULL, &experts_text, NULL, NULL, 0, NULL},
        {"--experts-per-token", NULL, &top_k_text, NULL, NULL, 0, NULL},
        {"--batch-invariant", NULL, NULL, NULL, NULL, 0, &batch_invariant},
        {"--op", NULL, &op_text, NULL, NULL, 0, NULL},
        {"--peer-timeout", NULL, &peer_timeout_text, NULL, NULL, 0, NULL},
        {"--selector-only", NULL, NULL, NULL, NULL, 0, &selector_only},
    };
    const char *positional[1];
    size_t npositional;
    int rc = parse_args(c, argc, argv, flags, sizeof flags / sizeof flags[0], positional, 0, &npositional);
    if (rc) return rc;

    bench_run *run = calloc(1, sizeof *run);
    if (!run) return library_error(c, qmm_error(QMM_ERR_OUT_OF_MEMORY, "no memory for the bench"));
    run->c = c;
    run->started = now_seconds();
    run->quick = quick;
    run->peers = !no_peers;
    run->kernel = kernel;
    run->selector_only = selector_only;
    run->gather = gather;
    run->experts = 128; /* Qwen3-30B-A3B: 128 experts, 8 per token */
    run->top_k = 8;
    run->batch_invariant = batch_invariant;
    run->bits = 4;
    run->group_size = 64;
    run->repeats = quick ? 3 : 7;
    run->peer_timeout_s = 3600;
    char json_path[PATH_MAX] = "";
    int backend_choice;
    qmm_status status = QMM_OK;

    /* Every option is checked before any work. */
    if ((rc = parse_backend(c, backend_text, &backend_choice))) goto done;
    if ((rc = parse_threads(c, threads_text, &threads))) goto done;
    const measure_option_texts texts = {bits_text, group_text, repeats_text, m_text, dtype_text, shapes_text};
    if ((rc = parse_measure_options(c, &texts, &run->bits, &run->group_size, &run->repeats, run->ms, &run->m_count,
                                    run->dtypes, &run->dtype_count)))
        goto done;
    if ((experts_text || top_k_text) && !gather) {
        rc = usage_error(c, "%s applies to --gather only", experts_text ? "--experts" : "--experts-per-token");
        goto done;
    }
    {
        unsigned long long value;
        if (experts_text) {
            if (!parse_unsigned(experts_text, 1, 65536, &value)) {
                rc = usage_error(c, "--experts '%s' is not a whole number in [1, 65536]", experts_text);
                goto done;
            }
            run->experts = (size_t)value;
        }
        if (top_k_text) {
            if (!parse_unsigned(top_k_text, 1, 65536, &value)) {
                rc = usage_error(c, "--experts-per-token '%s' is not a whole number in [1, 65536]", top_k_text);
                goto done;
            }
            run->top_k = (size_t)value;
        }
        if (peer_timeout_text) {
            if (no_peers) {
                rc = usage_error(c, "--peer-timeout does not apply with --no-peers (no peer script runs)");
                goto done;
            }
            if (!parse_unsigned(peer_timeout_text, 1, 604800, &value)) {
                rc = usage_error(c, "--peer-timeout '%s' is not a whole number of seconds in [1, 604800]",
                                 peer_timeout_text);
                goto done;
            }
            run->peer_timeout_s = (int)value;
        }
        if (!top_k_text && run->top_k > run->experts) run->top_k = run->experts; /* the default 8, capped (as qmm gather) */
        if (gather && run->top_k > run->experts) {
            rc = usage_error(c, "--experts-per-token %zu is more than --experts %zu (each token picks distinct experts)", run->top_k,
                             run->experts);
            goto done;
        }
    }
    run->op = QMM_OP_QMM_T;
    if (op_text) {
        if (gather) {
            rc = usage_error(c, "--op does not apply to --gather (the gather op is x·Ŵᵀ per pair)");
            goto done;
        }
        if (strcmp(op_text, "t") == 0 || strcmp(op_text, "qmm_t") == 0) run->op = QMM_OP_QMM_T;
        else if (strcmp(op_text, "n") == 0 || strcmp(op_text, "qmm_n") == 0) run->op = QMM_OP_QMM_N;
        else {
            rc = usage_error(c, "--op '%s' is not t (qmm_t, x·Ŵᵀ) or n (qmm_n, x·Ŵ)", op_text);
            goto done;
        }
    }
    if (peer_timeout_text && run->op == QMM_OP_QMM_N) {
        rc = usage_error(c, "--peer-timeout does not apply with --op n (the peer scripts time x·Ŵᵀ only: none runs)");
        goto done;
    }
    if (tuning_text && gather) { /* the gather rows choose each block's qmm_t row by the table order */
        rc = usage_error(c, "--tuning does not apply to --gather (a tuning table steers qmm_t and qmm_n calls only)");
        goto done;
    }
    if (tuning_text && !tuning_text[0]) {
        rc = usage_error(c, "--tuning is empty (want a tuning table from 'qmm tune')");
        goto done;
    }
    if (kernel && !kernel[0]) {
        rc = usage_error(c, "--kernel is empty (want a kernel name from 'qmm kernels')");
        goto done;
    }
    if (kernel && selector_only) {
        rc = usage_error(c, "--kernel and --selector-only both choose the kernel rows; give one of them");
        goto done;
    }

    if ((status = open_context(backend_choice, &run->context)) != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }
    if ((status = apply_threads(run->context, threads)) != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }
    bench_host_set_threads(threads);
    run->backend = qmm_context_backend(run->context);
    if (tuning_text) {
        if ((status = load_tuning_option(run->context, tuning_text, run->tuning, sizeof run->tuning)) != QMM_OK) {
            rc = library_error(c, status);
            goto done;
        }
        if (run->op == QMM_OP_QMM_N) { /* a table's entries each name their op; `qmm tune` writes qmm_t entries */
            const size_t used = strlen(run->tuning);
            snprintf(run->tuning + used, sizeof run->tuning - used, " (each steers calls of its own op only: qmm_t "
                     "entries, such as qmm tune writes, do not apply to --op n)");
        }
        fprint_safe_line(stderr, "bench: %s", run->tuning);
    }
    if (json_text && (rc = resolve_json_path(c, json_text, run->backend, json_path, sizeof json_path))) goto done;
    if (kernel) {
        int found = 0;
        const char *why_not = NULL;
        for (size_t k = 0; k < qmm_kernel_count(run->context); k++) {
            qmm_kernel_info info;
            if (qmm_kernel_get(run->context, k, &info) == QMM_OK && strcmp(info.name, kernel) == 0) {
                found = info.op == (gather ? QMM_OP_GATHER : run->op) ? 1 : -1 - (int)info.op;
                if (qmm_kernel_usable(run->context, k, &why_not) == 1) why_not = NULL;
                else if (!why_not) why_not = "not usable here";
            }
        }
        if (found > 0 && why_not) { /* every cell would say "not eligible": refuse before the work, as matmul does */
            rc = library_error(c, qmm_error(QMM_ERR_UNSUPPORTED, "--kernel '%s' cannot run on this machine: %s", kernel,
                                            why_not));
            goto done;
        }
        if (found < 0 && gather) { /* --gather times qmm_gather_matmul: only a gather row can run it */
            rc = usage_error(c, "--kernel '%s' computes %s; qmm bench --gather measures gather kernels only", kernel,
                             qmm_op_name((qmm_op)(-1 - found)));
            goto done;
        }
        if (found < 0) { /* the run times one op: a row of another op would refuse every cell */
            const qmm_op theirs = (qmm_op)(-1 - found);
            rc = usage_error(c, "--kernel '%s' computes %s; this run measures %s kernels%s", kernel, qmm_op_name(theirs),
                             qmm_op_name(run->op),
                             theirs == QMM_OP_GATHER ? " (--gather measures gather kernels)"
                             : theirs == QMM_OP_QMM_N ? " (--op n measures qmm_n kernels)"
                                                      : " (--op t, the default, measures qmm_t kernels)");
            goto done;
        }
        if (!found) {
            rc = library_error(c, qmm_error(QMM_ERR_NOT_FOUND, "--kernel '%s' is not a kernel of backend %s ('qmm kernels "
                                                               "--backend %s' lists them)",
                                            kernel, qmm_backend_name(run->backend), qmm_backend_name(run->backend)));
            goto done;
        }
    }
    int cuda = run->backend == QMM_BACKEND_CUDA;
    if (cuda && !bench_cuda_built()) {
        rc = library_error(c, qmm_error(QMM_ERR_UNSUPPORTED, "--backend cuda: this qmm was built without the CUDA "
                                                             "bench (nvcc/cuBLAS not found at build time)"));
        goto done;
    }
    if (!m_text && gather) { /* T, the tokens: decode, then prefill chunks */
        static const size_t gather_ts[] = {1, 8, 32, 128}, quick_ts[] = {1, 3};
        run->m_count = quick ? 2 : 4;
        memcpy(run->ms, quick ? quick_ts : gather_ts, run->m_count * sizeof *run->ms);
    } else if (!m_text) {
        static const size_t cpu_ms[] = {1, 2, 4, 8, 16, 32, 64, 128, 512}, cuda_ms[] = {1, 2, 4, 8, 16}, quick_ms[] = {1, 3};
        const size_t *list = quick ? quick_ms : cuda ? cuda_ms : cpu_ms;
        run->m_count = quick ? 2 : cuda ? 5 : 9;
        memcpy(run->ms, list, run->m_count * sizeof *list);
    }
    if (!dtype_text) default_measure_dtypes(quick, cuda, run->dtypes, &run->dtype_count);
    if ((status = load_measure_shapes(shapes_text ? shapes_text : gather && !quick ? "qwen3-30b-a3b-experts" : NULL, quick,
                                      run->group_size, run->shapes, &run->shape_count)) != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }

    /* qmm_n quantizes along n: a shape whose n is not a multiple of the group is a bad shape, as one whose k is not
     * for qmm_t (the --quick grid drops it, as it drops those; at least quick.256x512 stays) */
    if (run->op == QMM_OP_QMM_N) {
        size_t kept = 0;
        for (size_t s = 0; s < run->shape_count; s++) {
            if (run->shapes[s].N % (size_t)run->group_size == 0) {
                run->shapes[kept++] = run->shapes[s];
            } else if (shapes_text || !quick) {
                rc = library_error(c, qmm_error(QMM_ERR_SHAPE, "--op n: shape %s has n=%zu, not a multiple of --group-size "
                                                              "%d (qmm_n's Ŵ [k, n] is quantized along n)",
                                                run->shapes[s].name, run->shapes[s].N, run->group_size));
                goto done;
            }
        }
        run->shape_count = kept;
    }
    {
        format_command_line(run->command_line, sizeof run->command_line, "bench", argc, argv);
        time_t now = time(NULL);
        strftime(run->date, sizeof run->date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    }

    /* The machine (its last-level cache sets the weights' copies), whether the shapes fit in host memory — refused
     * before anything is measured — and then the two ceilings. */
    status = measure_machine(run->backend, run->machine, sizeof run->machine, &run->cache_bytes, run->cache_desc,
                             sizeof run->cache_desc);
    if (status != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }
    char openblas[256];
    int have_openblas = !cuda && !gather && run->peers && bench_openblas_available(openblas, sizeof openblas);
    if (!cuda && !gather && run->peers && !have_openblas) note_absent(run, "openblas", openblas);
    if ((status = check_shapes_fit(run, !cuda, have_openblas)) != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }
    fprintf(stderr, "bench: measuring the ceilings...\n");
    status = cuda ? bench_cuda_ceilings(quick, &run->ceilings) : bench_host_ceilings(quick, &run->ceilings);
    if (status != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }
    {
        char what[96];
        if (competing_load(bench_host_threads(), what, sizeof what))
            snprintf(run->load_warning, sizeof run->load_warning,
                     "# warning: %s on %d thread%s when the run started: other processes compete for the cores and the "
                     "memory bus, so times (and ceilings) may be off", what, bench_host_threads(),
                     bench_host_threads() == 1 ? "" : "s");
    }
    fprintf(stderr, "bench: copy %.1f GB/s, matrix peak %.1f GFLOP/s\n", run->ceilings.copy_gbps, run->ceilings.peak_gflops);

    run->cell_count = run->shape_count * run->dtype_count * run->m_count;
    run->cells = calloc(run->cell_count ? run->cell_count : 1, sizeof *run->cells);
    if (!run->cells) {
        rc = library_error(c, qmm_error(QMM_ERR_OUT_OF_MEMORY, "no memory for %zu cells", run->cell_count));
        goto done;
    }

    size_t done_cells = 0;
    for (size_t s = 0; s < run->shape_count && status == QMM_OK; s++) {
        const bench_shape *shape = &run->shapes[s];
        bench_cell *cells_of_shape = &run->cells[s * run->dtype_count * run->m_count];
        qmm_qmatrix master;
        uint32_t *w = NULL;
        float *scales = NULL, *biases = NULL;
        /* qmm_n (--op n): the same n×k problem with Ŵ stored k×n, quantized along n */
        bench_shape stored = *shape;
        if (run->op == QMM_OP_QMM_N) stored.N = shape->K, stored.K = shape->N;
        status = gather ? make_stack(run, shape, &master, &w, &scales, &biases)
                        : make_master(run->bits, run->group_size, &stored, &master, &w, &scales, &biases);
        for (size_t d = 0; d < run->dtype_count && status == QMM_OK; d++) {
            qmm_qmatrix matrix = master;
            void *converted_scales = NULL, *converted_biases = NULL;
            if (run->dtypes[d] != QMM_F32)
                status = convert_scales(&master, run->dtypes[d], &matrix, &converted_scales, &converted_biases);
            if (status == QMM_OK)
                status = gather ? bench_gather_dtype(run, shape, &matrix, &cells_of_shape[d * run->m_count], &done_cells)
                                : bench_dtype(run, shape, &matrix, &cells_of_shape[d * run->m_count], &done_cells);
            free(converted_scales);
            free(converted_biases);
        }
        if (status == QMM_OK && have_openblas) status = bench_openblas_shape(run, &master, cells_of_shape);
        free(w);
        free(scales);
        free(biases);
    }
    if (status != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }
    if (run->peers && run->op == QMM_OP_QMM_N) { /* the peer scripts time x·Ŵᵀ */
        const char *why = "--op n: the peer script times x·Ŵᵀ (qmm_t) only";
        if (cuda) note_absent(run, "torch-int4", why), note_absent(run, "mlx-cuda", why);
        else note_absent(run, "mlx-cpu", why), note_absent(run, "ggml", why);
    } else if (run->peers) {
        bench_script_peers(run);
    }

    size_t decided, yes;
    decide_fastest(run, &decided, &yes);
    double elapsed = now_seconds() - run->started;
    print_header(run);
    print_table(run);
    print_summary(run);
    if (decided)
        printf("selector picked the fastest kernel (or one within 5%%) in %zu of %zu cells with two or more kernels "
               "measured (%.0f%%)\n", yes, decided, 100.0 * (double)yes / (double)decided);
    else
        printf("selector vs fastest: not decided (no cell had two or more kernels measured%s)\n",
               run->kernel ? "; --kernel measures one" : run->selector_only ? "; --selector-only measures one" : "");
    printf("bench took %.1f s (%zu cells)\n", elapsed, run->cell_count);
#ifdef QMM_BENCH_JSON
    if (json_path[0]) {
        if ((status = write_json(run, json_path, elapsed)) != QMM_OK) {
            rc = library_error(c, status);
            goto done;
        }
        fprint_safe_line(stdout, "results written to %s", json_path);
    }
#endif
    rc = 0;

done:
    if (run->context) qmm_context_destroy(run->context);
    free(run->cells);
    free(run);
    return rc;
}

/* Without the CUDA backend, the CUDA bench answers "not built" (bench_cuda.c holds the real one). */
#ifndef QMM_BENCH_CUDA
int bench_cuda_built(void) { return 0; }
qmm_status bench_cuda_machine(char *name, size_t size, size_t *l2_bytes) {
    snprintf(name, size, "no GPU");
    *l2_bytes = 0;
    return qmm_error(QMM_ERR_UNSUPPORTED, "qmm was built without the CUDA backend");
}
qmm_status bench_cuda_ceilings(int quick, bench_ceilings *ceilings) {
    (void)quick;
    memset(ceilings, 0, sizeof *ceilings);
    return qmm_error(QMM_ERR_UNSUPPORTED, "qmm was built without the CUDA backend");
}
qmm_status bench_cuda_dense(size_t N, size_t K, size_t M, qmm_dtype dtype, size_t copies, int repeats, double *us,
                            char *note, size_t note_size) {
    (void)N, (void)K, (void)M, (void)dtype, (void)copies, (void)repeats;
    *us = NAN;
    snprintf(note, note_size, "not built");
    return qmm_error(QMM_ERR_UNSUPPORTED, "qmm was built without the CUDA backend");
}
#endif
