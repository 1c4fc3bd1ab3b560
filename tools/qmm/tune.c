/*
 * tune.c — qmm tune: measures every eligible qmm_t kernel of a backend for each (shape, dtype, M) on this device,
 * exactly as `qmm bench` measures them (measure.c: the same weight copies beyond the cache, chains, medians), and
 * writes a tuning table that qmm_context_load_tuning reads (docs/kernels.md §4). Consecutive M values whose
 * winner is the same kernel become one entry [m_min, m_max]; an M between two entries with different winners is
 * left to the table order (never extrapolated). The winner is the fastest kernel, except that the order's own
 * pick is kept when it is within KEEP_MARGIN of the fastest (so measurement noise does not flip entries).
 * A summary table goes to stdout, progress to stderr. No peers, no ceilings: only the kernels.
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

/* The order's pick stays the winner when it is within this factor of the fastest kernel measured. */
#define KEEP_MARGIN 1.02

typedef struct tune_cell {
    const bench_shape *shape;
    qmm_dtype dtype;
    size_t M;
    size_t measured; /* kernels timed */
    char fastest[128];
    double fastest_us;
    char order[128]; /* the table order's pick (no tuning table loaded) */
    double order_us;  /* NaN when it was not timed (a scalar row over the budget) */
    char winner[128]; /* what the entry names: "" when nothing was measured */
    char note[512];
    char tuned[128]; /* the selector's pick after the written table was loaded back */
} tune_cell;

typedef struct tune_run {
    qmm_context *context;
    qmm_backend backend;
    int bits, group_size, repeats, quick;
    bench_shape shapes[MAX_SHAPES];
    size_t shape_count;
    size_t ms[MAX_LIST];
    size_t m_count;
    qmm_dtype dtypes[MAX_LIST];
    size_t dtype_count;
    tune_cell *cells; /* [shape][dtype][M] */
    size_t cell_count;
    size_t cache_bytes;
    char cache_desc[128];
    char machine[256];
    char command_line[2048];
    char date[64];
} tune_run;

/* Every M of one (shape, dtype): the order's pick and every eligible qmm_t kernel, each forced by name. */
static qmm_status tune_dtype(tune_run *run, const bench_shape *shape, const qmm_qmatrix *matrix, tune_cell *cells,
                             size_t *done, double started) {
    size_t w_bytes = 0, group_bytes = 0;
    qmm_status status = qmm_qmatrix_bytes(matrix, &w_bytes, &group_bytes);
    if (status != QMM_OK) return status;
    const size_t copies = copies_for(run->cache_bytes, run->quick, (double)(w_bytes + 2 * group_bytes));
    qmm_weights **weights = NULL;
    status = weight_copies_create(run->context, matrix, copies, &weights);
    for (size_t mi = 0; status == QMM_OK && mi < run->m_count; mi++) {
        tune_cell *cell = &cells[mi];
        const size_t M = run->ms[mi];
        cell->shape = shape;
        cell->dtype = matrix->dtype;
        cell->M = M;
        cell->fastest_us = cell->order_us = NAN;
        qmm_buffer *x = NULL, *out = NULL;
        status = operands_create(run->context, matrix->dtype, M, shape->N, shape->K, &x, &out);
        qmm_kernel_info order;
        if (status == QMM_OK) status = qmm_select(run->context, weights[0], M, NULL, &order);
        if (status == QMM_OK) snprintf(cell->order, sizeof cell->order, "%s", order.name);
        for (size_t k = 0; status == QMM_OK && k < qmm_kernel_count(run->context); k++) {
            qmm_kernel_info info;
            if ((status = qmm_kernel_get(run->context, k, &info)) != QMM_OK) break;
            if (info.op != QMM_OP_QMM_T) continue;
            int supports = qmm_kernel_supports(run->context, info.name, weights[0], M, QMM_OP_QMM_T, NULL);
            if (supports < 0) {
                status = QMM_ERR_INVALID_ARGUMENT;
                break;
            }
            if (!supports) continue;
            char skipped[256];
            if (slow_row_skipped(&info, M, shape->N, shape->K, copies, run->repeats, skipped, sizeof skipped)) {
                if (!cell->note[0]) snprintf(cell->note, sizeof cell->note, "%s: %s", info.name, skipped);
                continue;
            }
            double us = NAN;
            if ((status = time_kernel(run->context, run->repeats, weights, copies, x, M, out, QMM_OP_QMM_T, info.name, 0, &us)) != QMM_OK)
                break;
            cell->measured++;
            if (strcmp(info.name, cell->order) == 0) cell->order_us = us;
            if (isnan(cell->fastest_us) || us < cell->fastest_us) {
                cell->fastest_us = us;
                snprintf(cell->fastest, sizeof cell->fastest, "%s", info.name);
            }
        }
        qmm_buffer_destroy(x);
        qmm_buffer_destroy(out);
        if (status != QMM_OK) break;
        if (cell->measured) {
            const int keep_order = !isnan(cell->order_us) && cell->order_us <= KEEP_MARGIN * cell->fastest_us;
            snprintf(cell->winner, sizeof cell->winner, "%s", keep_order ? cell->order : cell->fastest);
        }
        (*done)++;
        fprintf(stderr, "tune [%zu/%zu] %s M=%zu %s: %zu kernel%s, fastest %s %.1f µs, order's pick %s, %.0f s so far\n",
                *done, run->cell_count, shape->name, M, qmm_dtype_name(matrix->dtype), cell->measured,
                cell->measured == 1 ? "" : "s", cell->measured ? cell->fastest : "(none)", cell->fastest_us, cell->order,
                now_seconds() - started);
    }
    weight_copies_destroy(weights, copies);
    return status;
}

/* The most host memory tuning one shape holds at once, in bytes — the arrays' sizes, in double (no size arithmetic can
 * overflow): the f32 master (codes, scales, biases); for the dtype that needs most, its converted scales and biases,
 * the weight copies where the backend keeps them in host memory (ref, cpu; CUDA's are device memory), and at the
 * largest M the operands: x made on the host, and on a host backend the x and out buffers and, on the CPU backend once
 * x made on the host is freed, a tiled row's f32 copy of x while it runs. Loading the table back later holds less (one
 * set of weights). */
static double tune_host_bytes(const tune_run *run, const bench_shape *shape) {
    const int host_memory = run->backend != QMM_BACKEND_CUDA, cpu = run->backend == QMM_BACKEND_CPU;
    const double N = (double)shape->N, K = (double)shape->K;
    const double w_bytes = N * (double)qmm_packed_words(shape->K, run->bits) * sizeof(uint32_t);
    const double groups = N * (double)qmm_groups(shape->K, run->group_size);
    const double master = w_bytes + 2.0 * groups * sizeof(float);
    double m_max = 1.0;
    for (size_t i = 0; i < run->m_count; i++) m_max = (double)run->ms[i] > m_max ? (double)run->ms[i] : m_max;
    double most = 0.0;
    for (size_t d = 0; d < run->dtype_count; d++) {
        const double element = (double)qmm_dtype_size(run->dtypes[d]), copy = w_bytes + 2.0 * groups * element;
        const double converted = element < 4 ? 2.0 * groups * element : 0.0;
        /* x made on the host (operands_create), then on the CPU backend the larger f32 copy a tiled row makes */
        double held = master + converted + m_max * K * (cpu ? 4.0 : element);
        if (host_memory) /* the weight copies, x and out */
            held += (double)copies_for(run->cache_bytes, run->quick, copy) * copy + m_max * (K + N) * element;
        most = held > most ? held : most;
    }
    return most;
}

/* ───────────────────────────── the file ───────────────────────────── */

/* text as a JSON string (quotes, backslashes and control characters escaped). */
static void put_json_string(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* One entry per run of consecutive M values (in the sorted --m list) with the same winner. */
static size_t write_entries(FILE *f, const tune_run *run) {
    size_t written = 0;
    for (size_t s = 0; s < run->shape_count; s++)
        for (size_t d = 0; d < run->dtype_count; d++) {
            const tune_cell *cells = &run->cells[(s * run->dtype_count + d) * run->m_count];
            for (size_t first = 0; first < run->m_count;) {
                size_t last = first;
                if (!cells[first].winner[0]) {
                    first++;
                    continue;
                }
                while (last + 1 < run->m_count && strcmp(cells[last + 1].winner, cells[first].winner) == 0) last++;
                fprintf(f, "%s\n    {\"op\": \"qmm_t\", \"dtype\": \"%s\", \"bits\": %d, \"group_size\": %d, \"N\": %zu, "
                        "\"K\": %zu, \"m_min\": %zu, \"m_max\": %zu, \"kernel\": ",
                        written ? "," : "", qmm_dtype_name(cells[first].dtype), run->bits, run->group_size,
                        run->shapes[s].N, run->shapes[s].K, cells[first].M, cells[last].M);
                put_json_string(f, cells[first].winner);
                fprintf(f, ", \"shape\": ");
                put_json_string(f, run->shapes[s].name);
                fprintf(f, ", \"us\": [");
                for (size_t i = first; i <= last; i++) fprintf(f, "%s%.3f", i > first ? ", " : "", cells[i].fastest_us);
                fprintf(f, "]}");
                written++;
                first = last + 1;
            }
        }
    return written;
}

/* Writes the table to path through a unique temporary file in the same directory and a rename
 * (write_output_file: nothing half-written is left at path or beside it). */
static qmm_status write_table(const tune_run *run, const char *path, size_t *entries) {
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    if (!f) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot format the tuning table: %s", strerror(errno));
    fprintf(f, "{\n  \"format\": \"qmm-tuning\",\n  \"version\": 1,\n  \"backend\": \"%s\",\n  \"device\": ",
            qmm_backend_name(run->backend));
    put_json_string(f, qmm_context_device(run->context));
    fprintf(f, ",\n  \"machine\": ");
    put_json_string(f, run->machine);
    fprintf(f, ",\n  \"tool\": \"qmm tune %d.%d.%d\",\n  \"command\": ", QMM_VERSION_MAJOR, QMM_VERSION_MINOR,
            QMM_VERSION_PATCH);
    put_json_string(f, run->command_line);
    fprintf(f, ",\n  \"date\": \"%s\",\n  \"repeats\": %d,\n  \"quick\": %s,\n  \"entries\": [", run->date, run->repeats,
            run->quick ? "true" : "false");
    *entries = write_entries(f, run);
    fprintf(f, "\n  ]\n}\n");
    int ok = !ferror(f);
    ok = (fclose(f) == 0) && ok;
    qmm_status status = ok ? write_output_file("--out", path, text, size)
                           : qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot format the tuning table");
    free(text);
    return status;
}

/* --out: a regular file (or a new path) in an existing writable directory, checked before the work. */
static int check_out_path(const command *c, const char *path) { return check_output_file(c, "--out", path); }

/* ───────────────────────────── the summary ───────────────────────────── */

static void format_us(char *out, size_t size, double us) {
    if (isnan(us)) snprintf(out, size, "—");
    else snprintf(out, size, "%.1f", us);
}

static void print_summary(const tune_run *run, int verified) {
    print_cell("shape", 24);
    print_cell("n×k", 12);
    print_cell("M", 5);
    print_cell("dtype", 6);
    print_cell("fastest kernel", 34);
    print_cell("µs", 9);
    print_cell("order's pick", 34);
    print_cell("µs", 9);
    print_cell("gain", 7);
    printf("%s\n", verified ? "tuned pick" : "note");
    for (size_t k = 0; k < run->cell_count; k++) {
        const tune_cell *cell = &run->cells[k];
        if (!cell->shape) continue;
        char nk[48], m[24], fastest_us[32], order_us[32], gain[32];
        snprintf(nk, sizeof nk, "%zu×%zu", cell->shape->N, cell->shape->K);
        snprintf(m, sizeof m, "%zu", cell->M);
        format_us(fastest_us, sizeof fastest_us, cell->fastest_us);
        format_us(order_us, sizeof order_us, cell->order_us);
        if (isnan(cell->order_us) || isnan(cell->fastest_us)) snprintf(gain, sizeof gain, "—");
        else snprintf(gain, sizeof gain, "%.2f×", cell->order_us / cell->fastest_us);
        print_cell(cell->shape->name, 24);
        print_cell(nk, 12);
        print_cell(m, 5);
        print_cell(qmm_dtype_name(cell->dtype), 6);
        print_cell(cell->measured ? cell->fastest : "(none measured)", 34);
        print_cell(fastest_us, 9);
        print_cell(cell->order, 34);
        print_cell(order_us, 9);
        print_cell(gain, 7);
        if (!cell->measured) printf("no entry: %s\n", cell->note[0] ? cell->note : "no eligible kernel");
        else if (verified)
            printf("%s%s\n", cell->tuned,
                   strcmp(cell->winner, cell->fastest) != 0 ? " (order's pick kept: within 2% of the fastest)" : "");
        else printf("%s\n", cell->note);
    }
}

/* ───────────────────────────── qmm tune ───────────────────────────── */

static int compare_sizes(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

int cmd_tune(const command *c, int argc, char **argv) {
    const char *backend_text = NULL, *shapes_text = NULL, *m_text = NULL, *dtype_text = NULL, *bits_text = NULL,
               *group_text = NULL, *repeats_text = NULL, *out_text = NULL, *threads_text = NULL;
    int quick = 0, threads = 0;
    flag_spec flags[] = {
        {"--backend", NULL, &backend_text, NULL, NULL, 0, NULL}, {"--shapes", NULL, &shapes_text, NULL, NULL, 0, NULL},
        {"--m", "-m", &m_text, NULL, NULL, 0, NULL},             {"--dtype", NULL, &dtype_text, NULL, NULL, 0, NULL},
        {"--bits", NULL, &bits_text, NULL, NULL, 0, NULL},       {"--group-size", NULL, &group_text, NULL, NULL, 0, NULL},
        {"--repeats", NULL, &repeats_text, NULL, NULL, 0, NULL}, {"--out", "-o", &out_text, NULL, NULL, 0, NULL},
        {"--quick", NULL, NULL, NULL, NULL, 0, &quick},          {"--threads", NULL, &threads_text, NULL, NULL, 0, NULL},
    };
    const char *positional[1];
    size_t npositional;
    int rc = parse_args(c, argc, argv, flags, sizeof flags / sizeof flags[0], positional, 0, &npositional);
    if (rc) return rc;

    tune_run *run = calloc(1, sizeof *run);
    if (!run) return library_error(c, qmm_error(QMM_ERR_OUT_OF_MEMORY, "no memory for the tuning run"));
    const double started = now_seconds();
    run->quick = quick;
    run->bits = 4;
    run->group_size = 64;
    run->repeats = quick ? 3 : 7;
    char out_path[PATH_MAX] = "";
    int backend_choice;
    qmm_status status = QMM_OK;

    /* Every option is checked before any work. */
    if ((rc = parse_backend(c, backend_text, &backend_choice))) goto done;
    if ((rc = parse_threads(c, threads_text, &threads))) goto done;
    const measure_option_texts texts = {bits_text, group_text, repeats_text, m_text, dtype_text, shapes_text};
    if ((rc = parse_measure_options(c, &texts, &run->bits, &run->group_size, &run->repeats, run->ms, &run->m_count,
                                    run->dtypes, &run->dtype_count)))
        goto done;

    if ((status = open_context(backend_choice, &run->context)) != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }
    if ((status = apply_threads(run->context, threads)) != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }
    bench_host_set_threads(threads); /* the table's "machine" names the threads it was measured with */
    run->backend = qmm_context_backend(run->context);
    warn_if_loaded(c, run->context); /* a table measured on a busy machine picks by noise */
    const int cuda = run->backend == QMM_BACKEND_CUDA;
    if (out_text) snprintf(out_path, sizeof out_path, "%s", out_text);
    else snprintf(out_path, sizeof out_path, "qmm-tuning-%s.json", qmm_backend_name(run->backend));
    if ((rc = check_out_path(c, out_path))) goto done;
    if (!m_text) {
        static const size_t cpu_ms[] = {1, 2, 4, 8, 16, 32, 64, 128, 512}, cuda_ms[] = {1, 2, 3, 4, 6, 8, 12, 16},
                            quick_ms[] = {1, 3};
        const size_t *list = quick ? quick_ms : cuda ? cuda_ms : cpu_ms;
        run->m_count = quick ? 2 : cuda ? 8 : 9;
        memcpy(run->ms, list, run->m_count * sizeof *list);
    }
    /* Ranges are made of neighbours in M: sort, and drop repeats. */
    qsort(run->ms, run->m_count, sizeof run->ms[0], compare_sizes);
    size_t unique = 0;
    for (size_t i = 0; i < run->m_count; i++)
        if (unique == 0 || run->ms[i] != run->ms[unique - 1]) run->ms[unique++] = run->ms[i];
    run->m_count = unique;
    if (!dtype_text) default_measure_dtypes(quick, cuda, run->dtypes, &run->dtype_count);
    if ((status = load_measure_shapes(shapes_text, quick, run->group_size, run->shapes, &run->shape_count)) != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }
    /* A table holds one answer per (dtype, N, K) and M (its loader refuses overlapping entries): a dtype given
     * twice is measured once, and a shape with the N×K of an earlier one is not measured again. */
    unique = 0;
    for (size_t i = 0; i < run->dtype_count; i++) {
        size_t j = 0;
        while (j < unique && run->dtypes[j] != run->dtypes[i]) j++;
        if (j == unique) run->dtypes[unique++] = run->dtypes[i];
    }
    run->dtype_count = unique;
    unique = 0;
    for (size_t i = 0; i < run->shape_count; i++) {
        size_t j = 0;
        while (j < unique && (run->shapes[j].N != run->shapes[i].N || run->shapes[j].K != run->shapes[i].K)) j++;
        if (j < unique)
            fprintf(stderr, "tune: shape %s (%zu×%zu) has the n×k of shape %s: measured once, as %s\n", run->shapes[i].name,
                    run->shapes[i].N, run->shapes[i].K, run->shapes[j].name, run->shapes[j].name);
        else run->shapes[unique++] = run->shapes[i];
    }
    run->shape_count = unique;
    {
        format_command_line(run->command_line, sizeof run->command_line, "tune", argc, argv);
        time_t now = time(NULL);
        strftime(run->date, sizeof run->date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    }
    if ((status = measure_machine(run->backend, run->machine, sizeof run->machine, &run->cache_bytes, run->cache_desc,
                                  sizeof run->cache_desc)) != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }

    /* Before any measurement: every shape must fit in the host memory (past it the system kills the process, with
     * nothing said: a 1048576×16384 shape holds tens of GiB with its copies). */
    for (size_t s = 0; s < run->shape_count; s++) {
        const bench_shape *shape = &run->shapes[s];
        char subject[160];
        snprintf(subject, sizeof subject, "shape %s (%zu×%zu)", shape->name, shape->N, shape->K);
        status = check_host_memory(tune_host_bytes(run, shape), subject,
                                   cuda ? "the weights, x at the largest M"
                                        : "the weights and their copies, x and out at the largest M",
                                   "tune it on a larger machine or a smaller shape");
        if (status != QMM_OK) {
            rc = library_error(c, status);
            goto done;
        }
    }

    run->cell_count = run->shape_count * run->dtype_count * run->m_count;
    run->cells = calloc(run->cell_count ? run->cell_count : 1, sizeof *run->cells);
    if (!run->cells) {
        rc = library_error(c, qmm_error(QMM_ERR_OUT_OF_MEMORY, "no memory for %zu cells", run->cell_count));
        goto done;
    }
    size_t done_cells = 0;
    for (size_t s = 0; s < run->shape_count && status == QMM_OK; s++) {
        const bench_shape *shape = &run->shapes[s];
        qmm_qmatrix master;
        uint32_t *w = NULL;
        float *scales = NULL, *biases = NULL;
        status = make_master(run->bits, run->group_size, shape, &master, &w, &scales, &biases);
        for (size_t d = 0; d < run->dtype_count && status == QMM_OK; d++) {
            qmm_qmatrix matrix = master;
            void *converted_scales = NULL, *converted_biases = NULL;
            if (run->dtypes[d] != QMM_F32)
                status = convert_scales(&master, run->dtypes[d], &matrix, &converted_scales, &converted_biases);
            if (status == QMM_OK)
                status = tune_dtype(run, shape, &matrix, &run->cells[(s * run->dtype_count + d) * run->m_count],
                                    &done_cells, started);
            free(converted_scales);
            free(converted_biases);
        }
        free(w);
        free(scales);
        free(biases);
    }
    if (status != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }
    size_t entries = 0;
    if ((status = write_table(run, out_path, &entries)) != QMM_OK) {
        rc = library_error(c, status);
        goto done;
    }

    /* Load the table back: it must parse, and the tuned selector's pick is what the last column shows. */
    int verified = 0;
    char load_note[512] = "";
    if ((status = qmm_context_load_tuning(run->context, out_path)) == QMM_OK) {
        verified = 1;
        for (size_t s = 0; s < run->shape_count && status == QMM_OK; s++)
            for (size_t d = 0; d < run->dtype_count && status == QMM_OK; d++) {
                /* qmm_select needs weights of the shape; one small set per (shape, dtype). */
                qmm_qmatrix master;
                uint32_t *w = NULL;
                float *scales = NULL, *biases = NULL;
                void *converted_scales = NULL, *converted_biases = NULL;
                qmm_weights *weights = NULL;
                status = make_master(run->bits, run->group_size, &run->shapes[s], &master, &w, &scales, &biases);
                qmm_qmatrix matrix = master;
                if (status == QMM_OK && run->dtypes[d] != QMM_F32)
                    status = convert_scales(&master, run->dtypes[d], &matrix, &converted_scales, &converted_biases);
                if (status == QMM_OK) status = qmm_weights_create(run->context, &matrix, &weights);
                for (size_t mi = 0; status == QMM_OK && mi < run->m_count; mi++) {
                    tune_cell *cell = &run->cells[(s * run->dtype_count + d) * run->m_count + mi];
                    qmm_kernel_info info;
                    if ((status = qmm_select(run->context, weights, cell->M, NULL, &info)) == QMM_OK)
                        snprintf(cell->tuned, sizeof cell->tuned, "%s", info.name);
                }
                qmm_weights_destroy(weights);
                free(converted_scales);
                free(converted_biases);
                free(w);
                free(scales);
                free(biases);
            }
        if (status != QMM_OK) {
            rc = library_error(c, status);
            goto done;
        }
    } else {
        snprintf(load_note, sizeof load_note, "# the table was not loaded back to check it: %s\n", qmm_last_error());
    }

    printf("# qmm tune — backend %s on \"%s\" (%s); %d-bit group %d; qmm_t out[M, n] = x[M, k]·Ŵᵀ\n",
           qmm_backend_name(run->backend), qmm_context_device(run->context), run->machine, run->bits, run->group_size);
    if (run->quick)
        printf("# --quick: tiny grid, 2 weight copies (not rotated beyond the cache) — a smoke test, not a measurement\n");
    else
        printf("# every eligible qmm_t kernel timed as qmm bench times it: weights rotate through copies totalling > 2 × "
               "%s, median of %d runs after a warm-up\n", run->cache_desc, run->repeats);
    printf("# gain = order's pick µs ÷ fastest µs; an entry names the fastest kernel unless the order's pick is within "
           "2%% of it; scalar reference rows over ~10 s are not timed\n");
    fputs(load_note, stdout);
    print_summary(run, verified);
    fprint_safe_line(stdout, "wrote %zu entr%s for %zu cells to %s", entries, entries == 1 ? "y" : "ies", run->cell_count,
                     out_path);
    printf("tune took %.1f s\n", now_seconds() - started);
    rc = 0;

done:
    if (run->context) qmm_context_destroy(run->context);
    free(run->cells);
    free(run);
    return rc;
}
