/*
 * run.c — qmm run: the main job, every quantized layer of a real checkpoint checked against the oracle.
 */
#include "common.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ───────────────────────────── qmm run ───────────────────────────── */

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The embedded fixture: the installed share dir next to this binary (<prefix>/bin/qmm -> <prefix>/share/qmm/: an
 * installed qmm uses its own copy), else the source tree (source_dir: QMM_SOURCE_DIR, else the tree it was built
 * from — a build-tree binary). */
static qmm_status find_fixture(char *out, size_t size) {
    char exe[2048], installed[4096] = "";
    ssize_t length = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = NULL;
    if (length > 0) {
        exe[length] = '\0';
        slash = strrchr(exe, '/');
    }
    if (slash) {
        *slash = '\0';
        snprintf(installed, sizeof installed, "%s/../share/qmm/%s", exe, FIXTURE_NAME);
        if (is_dir(installed)) {
            snprintf(out, size, "%s", installed);
            return QMM_OK;
        }
    }
    snprintf(out, size, "%s/data/%s", source_dir(), FIXTURE_NAME);
    if (is_dir(out)) return QMM_OK;
    return qmm_error(QMM_ERR_NOT_FOUND, "the fixture %s is in neither %s nor %s; pass a checkpoint DIR", FIXTURE_NAME,
                     installed[0] ? installed : "the install share dir", out);
}

int cmd_run(const command *c, int argc, char **argv) {
    const char *seed_text = NULL, *backend = NULL, *threads_text = NULL, *tuning = NULL;
    int batch_invariant = 0;
    flag_spec flags[] = {{"--seed", NULL, &seed_text, NULL, NULL, 0, NULL},
                         {"--backend", NULL, &backend, NULL, NULL, 0, NULL},
                         {"--threads", NULL, &threads_text, NULL, NULL, 0, NULL},
                         {"--tuning", NULL, &tuning, NULL, NULL, 0, NULL},
                         {"--batch-invariant", NULL, NULL, NULL, NULL, 0, &batch_invariant}};
    const char *positional[1];
    size_t npositional;
    int rc = parse_args(c, argc, argv, flags, sizeof flags / sizeof flags[0], positional, 1, &npositional);
    if (rc) return rc;
    unsigned long long seed = DEFAULT_SEED, faults = 0;
    if ((rc = parse_seed(c, seed_text, &seed))) return rc;
    if (tuning && !tuning[0]) return usage_error(c, "--tuning is empty (want a tuning table from 'qmm tune')");
    int backend_choice, threads;
    if ((rc = parse_backend(c, backend, &backend_choice))) return rc;
    if ((rc = parse_threads(c, threads_text, &threads))) return rc;
    if ((rc = parse_inject_fault(c, &faults))) return rc;

    char dir[4096], activations_path[4200];
    qmm_checkpoint *checkpoint = NULL;
    qmm_safetensors *activations = NULL;
    qmm_context *context = NULL;
    void *x = NULL;
    size_t failed = 0, count = 0;
    qmm_status status = QMM_OK;
    if (npositional == 1 && strlen(positional[0]) >= sizeof dir) /* snprintf would cut it to another path */
        return usage_error(c, "DIR is %zu bytes long; the limit is %zu", strlen(positional[0]), sizeof dir - 1);
    if (npositional == 1) snprintf(dir, sizeof dir, "%s", positional[0]);
    else if ((status = find_fixture(dir, sizeof dir)) != QMM_OK) goto cleanup;

    if ((status = qmm_checkpoint_open(dir, &checkpoint)) != QMM_OK) goto cleanup;
    count = qmm_checkpoint_layer_count(checkpoint);
    if (count == 0) {
        status = qmm_error(QMM_ERR_NOT_FOUND, "'%s' has no quantized layer (no tensor named P.scales)", dir);
        goto cleanup;
    }
    snprintf(activations_path, sizeof activations_path, "%s/activations.safetensors", dir);
    struct stat st;
    /* Absent activations fall back to random x; a present but broken file is an error. */
    if (stat(activations_path, &st) == 0 &&
        (status = qmm_safetensors_open(activations_path, &activations)) != QMM_OK)
        goto cleanup;
    if ((status = open_context(backend_choice, &context)) != QMM_OK) goto cleanup;
    if ((status = apply_threads(context, threads)) != QMM_OK) goto cleanup;
    /* Before any layer runs: each layer's product must fit in the host memory (activations of many tokens on a large
     * layer hold tens of GiB; past the memory the system kills the process, with nothing said). */
    int layer_width = 22; /* the table's layer column: the longest name and two spaces */
    for (size_t i = 0; i < count; i++) {
        qmm_layer layer;
        qmm_tensor tensor;
        size_t rows = RANDOM_ROWS;
        if ((status = qmm_checkpoint_layer(checkpoint, i, &layer)) != QMM_OK) goto cleanup;
        if (activations && qmm_safetensors_find(activations, layer.name, &tensor) == QMM_OK &&
            (status = activation_rows(&tensor, layer.matrix.cols, 0, &rows)) != QMM_OK)
            goto cleanup;
        char name[PRINTABLE_SIZE];
        printable(layer.name, name, sizeof name);
        const int name_width = display_chars(name) + 2;
        if (name_width > layer_width) layer_width = name_width;
        status = check_product_fits(context, name, &layer.matrix, layer.matrix.dtype, rows, 0.0,
                                    "run it on a larger machine, or with fewer tokens in activations.safetensors");
        if (status != QMM_OK) goto cleanup;
    }
    if (tuning) {
        char note[1024];
        if ((status = load_tuning_option(context, tuning, note, sizeof note)) != QMM_OK) goto cleanup;
        fprintf(stderr, "qmm run: %s\n", note);
    }

    fprint_safe_line(stderr, "qmm run: %s: %zu quantized layer%s, backend %s, %d thread%s, activations %s", dir, count,
                     count == 1 ? "" : "s", qmm_backend_name(qmm_context_backend(context)), qmm_context_threads(context),
                     qmm_context_threads(context) == 1 ? "" : "s", activations ? "activations.safetensors" : "(none)");
    const bool loaded = warn_if_loaded(c, context);
    if (faults) fprintf(stderr, "qmm run: QMM_RUN_INJECT_FAULT=%llu: corrupting one output of the first %llu layer(s)\n",
                        faults, faults);
    /* the kernel column fits the longest row names (cpu.qmm_t.gemv_ordered.n16.avx512, cuda.qmm_t.mma_tile_bf16x3.m32n128) */
    const int widths[] = {layer_width, 18, 17, 36, 12, 13, 10};
    static const char *const headers[] = {"layer", "M×N×K", "format", "kernel", "max|error|", "error/bound", "µs"};
    for (int k = 0; k < 7; k++) print_cell(headers[k], widths[k]);
    printf("x\n");
    for (size_t i = 0; i < count; i++) {
        qmm_layer layer;
        qmm_tensor tensor;
        layer_result result;
        size_t rows = RANDOM_ROWS;
        const qmm_qmatrix *m;
        int random_x = 1;
        if ((status = qmm_checkpoint_layer(checkpoint, i, &layer)) != QMM_OK) goto cleanup;
        m = &layer.matrix;
        char name[PRINTABLE_SIZE]; /* from the file, printed escaped */
        printable(layer.name, name, sizeof name);
        if (activations && qmm_safetensors_find(activations, layer.name, &tensor) == QMM_OK) {
            if ((status = load_activation(&tensor, m->cols, m->dtype, 0, &x, &rows)) != QMM_OK) goto cleanup;
            random_x = 0;
        } else {
            size_t elements;
            if (!qmm_mul_size(rows, m->cols, &elements) || !(x = malloc(elements * qmm_dtype_size(m->dtype)))) {
                status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate x for layer '%s'", name);
                goto cleanup;
            }
            if ((status = fill_random(seed + i, x, m->dtype, elements)) != QMM_OK) goto cleanup;
        }
        if (layer.experts > 1)
            fprintf(stderr, "qmm run: %s (%zu experts, multiplied as one stacked matrix of %zu rows; qmm gather routes "
                    "tokens to experts) ...\n", name, layer.experts, m->rows);
        else
            fprintf(stderr, "qmm run: %s ...\n", name);
        status = check_product(context, m, x, rows, NULL, batch_invariant, 0.05, i < faults, &result);
        free(x);
        x = NULL;
        if (status != QMM_OK) goto cleanup;
        char shape[64], format[64], error[32], ratio[32], time[32];
        snprintf(shape, sizeof shape, "%zu×%zu×%zu", rows, m->rows, m->cols);
        format_format(format, sizeof format, m);
        snprintf(error, sizeof error, "%.3e", result.max_abs_error);
        snprintf(ratio, sizeof ratio, "%.3f%s", result.worst_ratio,
                 result.outside ? " FAIL" : result.invariant_differ ? " FAIL (rows differ alone)" : "");
        snprintf(time, sizeof time, "%.1f", result.microseconds);
        const char *cells[] = {name, shape, format, result.kernel.name, error, ratio, time};
        for (int k = 0; k < 7; k++) print_cell(cells[k], widths[k]);
        printf("%s\n", random_x ? "random x" : "real x");
        if (result.outside || result.invariant_differ) failed++;
    }
    if (failed) printf("FAIL: %zu of %zu layer%s outside bound%s\n", failed, count, count == 1 ? "" : "s",
                       batch_invariant ? " or with rows that differ from the same row alone" : "");
    else if (batch_invariant)
        printf("%zu layer%s, all within bound; batch-invariant: every row checked alone (M=1) is bit for bit the same "
               "inside the product\n", count, count == 1 ? "" : "s");
    else if (count == 1) printf("1 layer, within bound\n");
    else printf("%zu layers, all within bound\n", count);
    if (loaded) /* the warning went to stderr before the table; the times are read here */
        printf("note: the µs column was measured while other processes competed for the cores (the warning on stderr): "
               "it may be far above the idle figures; --threads 1 suffers least\n");
cleanup:
    free(x);
    qmm_context_destroy(context);
    qmm_safetensors_close(activations);
    qmm_checkpoint_close(checkpoint);
    if (status != QMM_OK) return library_error(c, status);
    return failed ? QMM_EXIT_FAIL : QMM_EXIT_OK;
}
