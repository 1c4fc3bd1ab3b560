/*
 * qmm.c — the qmm command-line tool: info, convert, quantize, matmul and run (the main job: every
 * quantized layer of a real checkpoint through the runtime, checked against the f64 oracle).
 *
 * Conventions: results go to stdout, progress to stderr. A library failure prints
 * "qmm <cmd>: <status string>: <qmm_last_error()>" and exits 1; bad command-line input prints
 * "qmm <cmd>: usage error: ..." and exits 2. Every product is compared element by element with
 * qmm_ref_dense_f64 using the documented bound qmm_error_bound (docs/kernels.md, "Tolerance").
 */
#include "qmm.h"
#include "internal.h" /* qmm_error (CLI-level errors share the library's message format), qmm_mul_size */

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef QMM_SOURCE_DIR
#define QMM_SOURCE_DIR "."
#endif

/* The embedded real-model fixture (data/NOTICE says what it is and how tools/make_fixture.sh makes it). */
#define FIXTURE_NAME "smollm2-135m-block0"
/* Rows of seeded random x when a layer has no recorded activations (the fixture has 16 tokens). */
#define RANDOM_ROWS 16
/* -m is capped so that x, out and the f64 oracle's two arrays stay within a few GB for real layers. */
#define MAX_M 65536
#define DEFAULT_SEED 42

/* ───────────────────────────── commands, usage and errors ───────────────────────────── */

typedef struct command {
    const char *name;
    const char *summary;
    const char *usage; /* the full --help text */
    int (*run)(const struct command *self, int argc, char **argv);
} command;

static int usage_error(const command *c, const char *format, ...) QMM_PRINTF(2, 3);

static int usage_error(const command *c, const char *format, ...) {
    va_list args;
    fprintf(stderr, "qmm %s: usage error: ", c->name);
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fprintf(stderr, "\nTry 'qmm %s --help'.\n", c->name);
    return 2;
}

/* A failing library call (or a CLI-level check that set the message with qmm_error). */
static int library_error(const command *c, qmm_status status) {
    const char *message = qmm_last_error();
    fprintf(stderr, "qmm %s: %s: %s\n", c->name, qmm_status_string(status),
            message && message[0] ? message : "(no message)");
    return 1;
}

/* ───────────────────────────── argument parsing ───────────────────────────── */

/* One flag of a command. Single-valued flags store their text in *value (given twice is a usage
 * error); repeatable flags (values != NULL) append to values[*count]; switches (switched != NULL) take
 * no value and set *switched = 1. Values are parsed afterwards. */
typedef struct flag_spec {
    const char *name;  /* "--bits" */
    const char *alias; /* "-m", or NULL */
    const char **value;
    const char **values;
    size_t *count;
    size_t capacity;
    int *switched;
} flag_spec;

/* Splits argv into flags (--name VALUE or --name=VALUE) and positional arguments. Returns 0, or the
 * usage-error exit code (2) after printing the reason. */
static int parse_args(const command *c, int argc, char **argv, const flag_spec *flags, size_t flag_count,
                      const char **positional, size_t max_positional, size_t *positional_count) {
    *positional_count = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || arg[1] == '\0') {
            if (*positional_count == max_positional)
                return usage_error(c, "unexpected argument '%s' (at most %zu positional argument%s)", arg,
                                   max_positional, max_positional == 1 ? "" : "s");
            positional[(*positional_count)++] = arg;
            continue;
        }
        const flag_spec *match = NULL;
        const char *value = NULL;
        for (size_t f = 0; f < flag_count && !match; f++) {
            const char *names[2] = {flags[f].name, flags[f].alias};
            for (int n = 0; n < 2 && !match; n++) {
                if (!names[n]) continue;
                size_t length = strlen(names[n]);
                if (strncmp(arg, names[n], length) != 0) continue;
                if (arg[length] == '=') {
                    match = &flags[f];
                    if (match->switched) return usage_error(c, "%s takes no value", names[n]);
                    value = arg + length + 1;
                } else if (arg[length] == '\0') {
                    match = &flags[f];
                    if (match->switched) break;
                    if (i + 1 >= argc) return usage_error(c, "%s needs a value", names[n]);
                    value = argv[++i];
                }
            }
        }
        if (!match) return usage_error(c, "unknown option '%s'", arg);
        if (match->switched) {
            *match->switched = 1;
        } else if (match->values) {
            if (*match->count == match->capacity)
                return usage_error(c, "%s given more than %zu times", match->name, match->capacity);
            match->values[(*match->count)++] = value;
        } else {
            if (*match->value) return usage_error(c, "%s given twice", match->name);
            *match->value = value;
        }
    }
    return 0;
}

/* Whether text is a whole decimal number in [min, max] (no sign, no spaces, no suffix). */
static int parse_unsigned(const char *text, unsigned long long min, unsigned long long max,
                          unsigned long long *out) {
    if (!text || text[0] < '0' || text[0] > '9') return 0;
    errno = 0;
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || value < min || value > max) return 0;
    *out = value;
    return 1;
}

/* An int option whose range the library checks (bits, group size): any decimal int parses. */
static int parse_int(const char *text, int *out) {
    if (!text || !text[0]) return 0;
    errno = 0;
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || value < INT_MIN || value > INT_MAX) return 0;
    *out = (int)value;
    return 1;
}

static int wants_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return 0;
}

/* ───────────────────────────── small helpers ───────────────────────────── */

static int ends_with(const char *text, const char *suffix) {
    size_t a = strlen(text), b = strlen(suffix);
    return a >= b && strcmp(text + a - b, suffix) == 0;
}

static void format_shape(char *out, size_t size, int ndim, const int64_t *shape) {
    size_t used = 0;
    used += (size_t)snprintf(out, size, "[");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(out + used, size - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used < size) snprintf(out + used, size - used, "]");
}

static void format_format(char *out, size_t size, const qmm_qmatrix *m) {
    snprintf(out, size, "%d-bit gs%d %s", m->bits, m->group_size, qmm_dtype_name(m->dtype));
}

/* Prints text left-aligned in a column of `width` characters, counting UTF-8 code points (so "×"
 * and "µ" count as one), with at least one space after it. */
static void print_cell(const char *text, int width) {
    int chars = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        if ((*p & 0xC0) != 0x80) chars++;
    fputs(text, stdout);
    do putchar(' ');
    while (++chars < width);
}

/* splitmix64: the seeded stream behind random x (the same seed gives the same x on every machine). */
static uint64_t rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* count values uniform in [-1, 1), rounded to dtype. */
static qmm_status fill_random(uint64_t seed, void *x, qmm_dtype dtype, size_t count) {
    float *tmp = malloc(count * sizeof *tmp);
    if (!tmp) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu floats of random x", count);
    uint64_t state = seed;
    for (size_t i = 0; i < count; i++)
        tmp[i] = (float)(-1.0 + 2.0 * (double)(rng_next(&state) >> 11) * 0x1.0p-53);
    qmm_status status = qmm_convert(tmp, QMM_F32, x, dtype, count);
    free(tmp);
    return status;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* --backend: "auto" takes the first of cuda, cpu, ref whose context can be created. */
static qmm_status open_context(const char *name, qmm_context **context) {
    static const qmm_backend order[] = {QMM_BACKEND_CUDA, QMM_BACKEND_CPU, QMM_BACKEND_REF};
    *context = NULL;
    if (!name || strcmp(name, "auto") == 0) {
        qmm_status status = QMM_OK;
        for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
            status = qmm_context_create(order[i], 0, context);
            if (status == QMM_OK) return QMM_OK;
        }
        return status;
    }
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (strcmp(name, qmm_backend_name(order[i])) == 0) return qmm_context_create(order[i], 0, context);
    return qmm_error(QMM_ERR_INVALID_ARGUMENT, "backend '%s' is not one of auto, cuda, cpu, ref", name);
}

static int valid_backend_name(const char *name) {
    return !name || strcmp(name, "auto") == 0 || strcmp(name, "ref") == 0 || strcmp(name, "cpu") == 0 ||
           strcmp(name, "cuda") == 0;
}

/* ───────────────────────────── one product, checked and timed ───────────────────────────── */

typedef struct layer_result {
    qmm_kernel_info kernel;
    double max_abs_error;
    double max_exact;   /* max |exact|, the denominator of the (normwise) relative error */
    double worst_ratio; /* max over outputs of |error| / bound (NaN output: infinity) */
    size_t outside;     /* outputs whose error exceeds the bound */
    size_t first_outside;
    double microseconds; /* median device time of one product, from a chain */
    int timing_runs;
    double bytes; /* weights + scales + biases + x + out */
} layer_result;

/* Runs out = x·Ŵᵀ (x: M×K of matrix->dtype) through the runtime — kernel forced when `kernel` is not
 * NULL, else the selector's choice — compares every output with qmm_ref_dense_f64 (the same x, the
 * same scales) under qmm_error_bound with the kernel's documented slack, then times the product with
 * a chain for about `time_budget` seconds (at least 3 runs). inject_fault changes one output element
 * before the comparison (the QMM_RUN_INJECT_FAULT test hook). */
static qmm_status check_product(qmm_context *context, const qmm_qmatrix *matrix, const void *x, size_t M,
                                const char *kernel, double time_budget, int inject_fault, layer_result *result) {
    qmm_weights *weights = NULL;
    qmm_buffer *x_buffer = NULL, *out_buffer = NULL;
    qmm_chain *chain = NULL;
    void *out_host = NULL;
    float *got = NULL;
    double *exact = NULL, *abs_dot = NULL, *times = NULL;
    qmm_status status = QMM_OK;
    const size_t N = matrix->rows, K = matrix->cols;
    const size_t element = qmm_dtype_size(matrix->dtype);
    size_t count_x, count_out, bytes_out;
    memset(result, 0, sizeof *result);

    if (!qmm_mul_size(M, K, &count_x) || !qmm_mul_size(M, N, &count_out) ||
        !qmm_mul_size(count_out, sizeof(double), &bytes_out)) {
        status = qmm_error(QMM_ERR_OVERFLOW, "M=%zu × N=%zu × K=%zu overflows size_t", M, N, K);
        goto cleanup;
    }
    if ((status = qmm_weights_create(context, matrix, &weights)) != QMM_OK) goto cleanup;
    if ((status = qmm_buffer_create(context, matrix->dtype, count_x, &x_buffer)) != QMM_OK) goto cleanup;
    if ((status = qmm_buffer_create(context, matrix->dtype, count_out, &out_buffer)) != QMM_OK) goto cleanup;
    if ((status = qmm_buffer_write(x_buffer, x, count_x)) != QMM_OK) goto cleanup;
    /* Poisoned first, so an output the kernel never writes shows up as NaN. */
    if ((status = qmm_buffer_poison(out_buffer)) != QMM_OK) goto cleanup;

    qmm_matmul_options options = {QMM_OP_QMM_T, kernel};
    if ((status = qmm_matmul(context, weights, x_buffer, M, out_buffer, &options, &result->kernel)) != QMM_OK)
        goto cleanup;

    out_host = malloc(count_out * element);
    got = malloc(count_out * sizeof *got);
    exact = malloc(bytes_out);
    abs_dot = malloc(bytes_out);
    if (!out_host || !got || !exact || !abs_dot) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the %zu×%zu output and its oracle", M, N);
        goto cleanup;
    }
    if ((status = qmm_buffer_read(out_buffer, out_host, count_out)) != QMM_OK) goto cleanup;
    if ((status = qmm_convert(out_host, matrix->dtype, got, QMM_F32, count_out)) != QMM_OK) goto cleanup;
    if (inject_fault) got[0] += 1.0f + fabsf(got[0]); /* test hook: an error far outside any bound */

    if ((status = qmm_ref_dense_f64(matrix, x, M, 1, exact, abs_dot)) != QMM_OK) goto cleanup;
    /* The f64 sum of finite f32/f16/bf16 products cannot overflow, so a non-finite exact value means a NaN
     * or Inf in the input; comparing against it would blame the kernel ("outside bound") for bad input. */
    for (size_t i = 0; i < count_out; i++) {
        if (!isfinite(exact[i])) {
            status = qmm_error(QMM_ERR_NUMERIC,
                               "the exact output at row %zu, column %zu is %g: x (rounded to %s) or the weights' "
                               "scales/biases hold NaN or Inf; the product is checked only for finite inputs",
                               i / N, i % N, exact[i], qmm_dtype_name(matrix->dtype));
            goto cleanup;
        }
    }
    double slack = result->kernel.tolerance_slack > 0 ? result->kernel.tolerance_slack : 1.0;
    for (size_t i = 0; i < count_out; i++) {
        double error = fabs((double)got[i] - exact[i]);
        double bound = qmm_error_bound(K, matrix->dtype, exact[i], abs_dot[i], slack);
        double ratio = isnan(error) ? INFINITY : error / bound;
        if (isnan(error)) error = INFINITY;
        if (error > result->max_abs_error) result->max_abs_error = error;
        if (fabs(exact[i]) > result->max_exact) result->max_exact = fabs(exact[i]);
        if (ratio > result->worst_ratio) result->worst_ratio = ratio;
        if (!(error <= bound)) {
            if (result->outside == 0) result->first_outside = i;
            result->outside++;
        }
    }

    /* Timing: a chain of one step, run repeatedly; the median step time is reported. */
    if ((status = qmm_chain_create(context, &chain)) != QMM_OK) goto cleanup;
    if ((status = qmm_chain_add_matmul(chain, weights, x_buffer, M, out_buffer, &options)) != QMM_OK) goto cleanup;
    enum { MAX_RUNS = 200, MIN_RUNS = 3 };
    times = malloc(MAX_RUNS * sizeof *times);
    if (!times) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate timing samples");
        goto cleanup;
    }
    double start = now_seconds();
    int runs = 0;
    while (runs < MAX_RUNS && (runs < MIN_RUNS || now_seconds() - start < time_budget)) {
        if ((status = qmm_chain_run(chain)) != QMM_OK) goto cleanup;
        if ((status = qmm_chain_step(chain, 0, &times[runs], NULL)) != QMM_OK) goto cleanup;
        runs++;
    }
    qsort(times, (size_t)runs, sizeof *times, compare_doubles);
    result->microseconds = times[runs / 2];
    result->timing_runs = runs;
    size_t groups = qmm_groups(K, matrix->group_size);
    result->bytes = (double)N * (double)qmm_packed_words(K, matrix->bits) * 4.0 +
                    2.0 * (double)N * (double)groups * (double)element + (double)count_x * (double)element +
                    (double)count_out * (double)element;

cleanup:
    qmm_chain_destroy(chain);
    qmm_buffer_destroy(x_buffer);
    qmm_buffer_destroy(out_buffer);
    qmm_weights_destroy(weights);
    free(out_host);
    free(got);
    free(exact);
    free(abs_dot);
    free(times);
    return status;
}

/* ───────────────────────────── activations ───────────────────────────── */

/* Copies the first M rows of a float tensor [T, K] (or [K] as one row) into x (dtype), rounding once.
 * *rows receives T. Errors name the tensor and the disagreement. */
static qmm_status load_activation(const qmm_tensor *tensor, size_t K, qmm_dtype dtype, size_t M, void **x,
                                  size_t *rows) {
    *x = NULL;
    if (!qmm_is_float_dtype(tensor->dtype))
        return qmm_error(QMM_ERR_SHAPE, "activation tensor '%s' has dtype %s, want f32, f16 or bf16", tensor->name,
                         qmm_dtype_name(tensor->dtype));
    int64_t last = tensor->ndim >= 1 ? tensor->shape[tensor->ndim - 1] : 0;
    int64_t T = tensor->ndim == 2 ? tensor->shape[0] : 1;
    if ((tensor->ndim != 1 && tensor->ndim != 2) || last != (int64_t)K || T < 1) {
        char shape[128];
        format_shape(shape, sizeof shape, tensor->ndim, tensor->shape);
        return qmm_error(QMM_ERR_SHAPE, "activation tensor '%s' has shape %s, want [T, K=%zu] with T >= 1",
                         tensor->name, shape, K);
    }
    if (M == 0 && T > MAX_M) /* -m is capped at MAX_M; all T rows must not bypass the cap */
        return qmm_error(QMM_ERR_SHAPE, "activation tensor '%s' has T=%lld rows, more than the %d one product may use "
                         "(qmm matmul -m M takes the first M)", tensor->name, (long long)T, MAX_M);
    if (M == 0) M = (size_t)T;
    if (M > (size_t)T)
        return qmm_error(QMM_ERR_SHAPE, "-m %zu asks for more rows than activation tensor '%s' has (T=%lld)", M,
                         tensor->name, (long long)T);
    size_t count, bytes;
    if (!qmm_mul_size(M, K, &count) || !qmm_mul_size(count, qmm_dtype_size(dtype), &bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "M=%zu × K=%zu overflows size_t", M, K);
    *x = malloc(bytes);
    if (!*x) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of x", bytes);
    qmm_status status = qmm_convert(tensor->data, tensor->dtype, *x, dtype, count);
    if (status != QMM_OK) {
        free(*x);
        *x = NULL;
        return status;
    }
    *rows = M;
    return QMM_OK;
}

/* A copy of matrix with scales and biases converted to dtype (the new arrays are malloc'd, returned in scales and biases). */
static qmm_status convert_scales(const qmm_qmatrix *matrix, qmm_dtype dtype, qmm_qmatrix *converted,
                                 void **scales, void **biases) {
    *scales = *biases = NULL;
    size_t count, bytes;
    if (!qmm_mul_size(matrix->rows, qmm_groups(matrix->cols, matrix->group_size), &count) ||
        !qmm_mul_size(count, qmm_dtype_size(dtype), &bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "scales of %zu rows overflow size_t", matrix->rows);
    *scales = malloc(bytes ? bytes : 1);
    *biases = malloc(bytes ? bytes : 1);
    qmm_status status = QMM_OK;
    if (!*scales || !*biases) status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of scales", bytes);
    if (status == QMM_OK) status = qmm_convert(matrix->scales, matrix->dtype, *scales, dtype, count);
    if (status == QMM_OK) status = qmm_convert(matrix->biases, matrix->dtype, *biases, dtype, count);
    if (status != QMM_OK) {
        free(*scales);
        free(*biases);
        *scales = *biases = NULL;
        return status;
    }
    *converted = *matrix;
    converted->scales = *scales;
    converted->biases = *biases;
    converted->dtype = dtype;
    return QMM_OK;
}

/* ───────────────────────────── qmm info ───────────────────────────── */

static void print_tensor_row(const qmm_tensor *t) {
    char shape[160];
    format_shape(shape, sizeof shape, t->ndim, t->shape);
    printf("  %-48s %-5s %s\n", t->name, qmm_dtype_name(t->dtype), shape);
}

static void print_layer_row(const qmm_layer *layer) {
    char format[64];
    format_format(format, sizeof format, &layer->matrix);
    printf("  %-40s N=%-6zu K=%-6zu %s\n", layer->name, layer->matrix.rows, layer->matrix.cols, format);
}

static int info_checkpoint(const command *c, const char *dir) {
    qmm_checkpoint *checkpoint = NULL;
    qmm_status status = qmm_checkpoint_open(dir, &checkpoint);
    if (status != QMM_OK) return library_error(c, status);
    int bits = 0, group_size = 0;
    size_t tensors = qmm_checkpoint_tensor_count(checkpoint), layers = qmm_checkpoint_layer_count(checkpoint);
    status = qmm_checkpoint_default_format(checkpoint, &bits, &group_size);
    if (status != QMM_OK) goto done;
    printf("%s: MLX checkpoint, %zu tensors, %zu quantized layers", dir, tensors, layers);
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
    char *dir = NULL;
    qmm_status status = qmm_safetensors_open(path, &file);
    if (status != QMM_OK) return library_error(c, status);
    size_t count = qmm_safetensors_count(file);
    printf("%s: safetensors, %zu tensors\ntensors:\n", path, count);
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
        fprintf(stderr, "qmm info: %s does not open as a checkpoint (%s), so formats are not shown\n", dir,
                qmm_last_error());
        checkpoint = NULL;
    }

    printf("quantized layers%s:\n", checkpoint ? " (formats from config.json beside the file)" : "");
    size_t found = 0;
    for (size_t i = 0; i < count; i++) {
        qmm_tensor scales, weight;
        if ((status = qmm_safetensors_get(file, i, &scales)) != QMM_OK) goto done;
        if (!ends_with(scales.name, ".scales")) continue;
        char name[1024];
        size_t length = strlen(scales.name) - strlen(".scales");
        if (length >= sizeof name - 8) continue;
        memcpy(name, scales.name, length);
        name[length] = '\0';
        qmm_layer layer;
        if (checkpoint && qmm_checkpoint_find_layer(checkpoint, name, &layer) == QMM_OK) {
            print_layer_row(&layer);
        } else {
            char weight_name[1040];
            snprintf(weight_name, sizeof weight_name, "%s.weight", name);
            if (qmm_safetensors_find(file, weight_name, &weight) != QMM_OK || weight.ndim != 2 || scales.ndim != 2 ||
                scales.shape[1] == 0) {
                printf("  %-40s (scales without a matching 2-D %s)\n", name, weight_name);
            } else {
                long long product = (long long)weight.shape[1] * 32 / (long long)scales.shape[1];
                printf("  %-40s N=%-6lld bits×group_size=%lld, scales %s (bits and group_size are in config.json)\n",
                       name, (long long)weight.shape[0], product, qmm_dtype_name(scales.dtype));
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
    return status == QMM_OK ? 0 : library_error(c, status);
}

static int info_gguf(const command *c, const char *path) {
    qmm_gguf *file = NULL;
    qmm_status status = qmm_gguf_open(path, &file);
    if (status != QMM_OK) return library_error(c, status);
    size_t count = qmm_gguf_tensor_count(file), importable = 0;
    const char *arch = qmm_gguf_metadata_string(file, "general.architecture");
    const char *name = qmm_gguf_metadata_string(file, "general.name");
    printf("%s: GGUF, %zu tensors, architecture %s%s%s%s\n", path, count, arch ? arch : "(none)",
           name ? " (\"" : "", name ? name : "", name ? "\")" : "");
    printf("  %-40s %-6s %-16s %s\n", "tensor", "type", "shape", "importable");
    for (size_t i = 0; i < count; i++) {
        qmm_gguf_tensor_info info;
        if ((status = qmm_gguf_tensor_info_get(file, i, &info)) != QMM_OK) break;
        char shape[160];
        format_shape(shape, sizeof shape, info.ndim, info.shape);
        const char *as = "no";
        if (info.importable) {
            importable++;
            switch (info.type) {
            case QMM_GGUF_Q4_0: as = "yes: 4-bit gs32 f16 (bias -8d)"; break;
            case QMM_GGUF_Q4_1: as = "yes: 4-bit gs32 f16"; break;
            case QMM_GGUF_Q8_0: as = "yes: 8-bit gs32 f16 (bias -128d)"; break;
            default: as = "yes: float"; break;
            }
        }
        printf("  %-40s %-6s %-16s %s\n", info.name, info.type_name, shape, as);
    }
    qmm_gguf_close(file);
    if (status != QMM_OK) return library_error(c, status);
    printf("%zu of %zu tensors importable\n", importable, count);
    return 0;
}

static int cmd_info(const command *c, int argc, char **argv) {
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
    /* The GGUF magic decides, not the extension. */
    unsigned char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return library_error(c, qmm_error(QMM_ERR_IO, "cannot open '%s': %s", path, strerror(errno)));
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0) return info_gguf(c, path);
    return info_safetensors(c, path);
}

/* ───────────────────────────── qmm convert ───────────────────────────── */

/* convert and quantize replace a checkpoint already in OUTDIR only when asked (--force): a slip of the
 * OUTDIR argument would otherwise overwrite, say, the fixture. Returns 0 or the exit code. */
static int refuse_existing_checkpoint(const command *c, const char *dir, int force) {
    static const char *const names[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    if (force) return 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[PATH_MAX];
        struct stat info;
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= (int)sizeof path)
            return usage_error(c, "OUTDIR is longer than %d bytes", PATH_MAX - 32);
        if (lstat(path, &info) == 0)
            return library_error(c, qmm_error(QMM_ERR_INVALID_ARGUMENT,
                                              "OUTDIR '%s' already holds a checkpoint (%s); pass --force to replace it",
                                              dir, names[i]));
    }
    return 0;
}

static int cmd_convert(const command *c, int argc, char **argv) {
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
    if ((rc = refuse_existing_checkpoint(c, positional[1], force))) return rc;
    for (size_t i = 0; i < prefix_count; i++)
        if (!prefixes[i][0]) return usage_error(c, "--only needs a non-empty PREFIX");
    fprintf(stderr, "qmm convert: %s -> %s\n", positional[0], positional[1]);
    qmm_status status = qmm_gguf_convert(positional[0], positional[1], prefixes, prefix_count);
    if (status != QMM_OK) return library_error(c, status);
    qmm_checkpoint *checkpoint = NULL;
    if ((status = qmm_checkpoint_open(positional[1], &checkpoint)) != QMM_OK) return library_error(c, status);
    printf("wrote %s: %zu tensors, %zu quantized layers\n", positional[1], qmm_checkpoint_tensor_count(checkpoint),
           qmm_checkpoint_layer_count(checkpoint));
    qmm_checkpoint_close(checkpoint);
    return 0;
}

/* ───────────────────────────── qmm quantize ───────────────────────────── */

static int cmd_quantize(const command *c, int argc, char **argv) {
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
    int bits = 0, group_size = 0;
    if (!bits_text) return usage_error(c, "--bits is required");
    if (!group_text) return usage_error(c, "--group-size is required");
    if (!parse_int(bits_text, &bits)) return usage_error(c, "--bits '%s' is not an integer", bits_text);
    if (!parse_int(group_text, &group_size))
        return usage_error(c, "--group-size '%s' is not an integer", group_text);
    qmm_convention convention = QMM_CONVENTION_CPU;
    if (convention_text) {
        if (strcmp(convention_text, "gpu") == 0) convention = QMM_CONVENTION_GPU;
        else if (strcmp(convention_text, "cpu") != 0)
            return usage_error(c, "--convention '%s' is not cpu or gpu", convention_text);
    }
    if ((rc = refuse_existing_checkpoint(c, positional[1], force))) return rc;
    qmm_status status = qmm_format_validate(bits, group_size);
    if (status != QMM_OK) return library_error(c, status);

    qmm_safetensors *file = NULL;
    qmm_tensor *tensors = NULL; /* copied as they are */
    qmm_layer *layers = NULL;   /* written by qmm_checkpoint_write as P.weight, P.scales, P.biases */
    char **names = NULL;        /* layer names, owned here */
    void **arrays = NULL;       /* w, scales, biases of each layer, owned here */
    size_t tensor_count = 0, layer_count = 0, array_count = 0;
    if ((status = qmm_safetensors_open(positional[0], &file)) != QMM_OK) return library_error(c, status);
    size_t count = qmm_safetensors_count(file);
    tensors = calloc(count + 1, sizeof *tensors);
    layers = calloc(count + 1, sizeof *layers);
    names = calloc(count + 1, sizeof *names);
    arrays = calloc(3 * count + 1, sizeof *arrays);
    if (!tensors || !layers || !names || !arrays) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the tensor list of %zu tensors", count);
        goto cleanup;
    }
    for (size_t i = 0; i < count; i++) {
        qmm_tensor t;
        if ((status = qmm_safetensors_get(file, i, &t)) != QMM_OK) goto cleanup;
        int quantize = qmm_is_float_dtype(t.dtype) && t.ndim == 2 && ends_with(t.name, ".weight") &&
                       t.shape[0] > 0 && t.shape[1] > 0 && t.shape[1] % group_size == 0;
        if (!quantize) {
            tensors[tensor_count++] = t;
            continue;
        }
        size_t rows = (size_t)t.shape[0], cols = (size_t)t.shape[1];
        size_t w_bytes, s_bytes;
        const qmm_qmatrix format = {NULL, NULL, NULL, t.dtype, rows, cols, bits, group_size};
        if ((status = qmm_qmatrix_bytes(&format, &w_bytes, &s_bytes)) != QMM_OK) goto cleanup;
        size_t length = strlen(t.name) - strlen(".weight");
        char *layer_name = names[layer_count] = malloc(length + 1);
        uint32_t *w = malloc(w_bytes);
        void *scales = malloc(s_bytes), *biases = malloc(s_bytes);
        arrays[array_count++] = w;
        arrays[array_count++] = scales;
        arrays[array_count++] = biases;
        if (!layer_name || !w || !scales || !biases) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the quantized '%s'", t.name);
            goto cleanup;
        }
        memcpy(layer_name, t.name, length);
        layer_name[length] = '\0';
        fprintf(stderr, "qmm quantize: %s [%zu, %zu] %s -> %d-bit gs%d\n", layer_name, rows, cols,
                qmm_dtype_name(t.dtype), bits, group_size);
        status = qmm_quantize(t.data, t.dtype, rows, cols, bits, group_size, convention, w, scales, biases);
        if (status != QMM_OK) goto cleanup;
        qmm_qmatrix m = {w, scales, biases, t.dtype, rows, cols, bits, group_size};
        layers[layer_count].name = layer_name;
        layers[layer_count].matrix = m;
        layer_count++;
    }
    status = qmm_checkpoint_write(positional[1], tensors, tensor_count, layers, layer_count, NULL);
    if (status == QMM_OK)
        printf("wrote %s: %zu tensors copied, %zu quantized layers (%d-bit gs%d, %s convention)\n", positional[1],
               tensor_count, layer_count, bits, group_size, convention == QMM_CONVENTION_GPU ? "gpu" : "cpu");
cleanup:
    for (size_t i = 0; names && i < count; i++) free(names[i]);
    for (size_t i = 0; arrays && i < array_count; i++) free(arrays[i]);
    free(names);
    free(arrays);
    free(tensors);
    free(layers);
    qmm_safetensors_close(file);
    return status == QMM_OK ? 0 : library_error(c, status);
}

/* ───────────────────────────── qmm matmul ───────────────────────────── */

static int cmd_matmul(const command *c, int argc, char **argv) {
    const char *layer_name = NULL, *m_text = NULL, *dtype_text = NULL, *kernel = NULL, *x_path = NULL,
               *seed_text = NULL, *backend = NULL;
    flag_spec flags[] = {{"--layer", NULL, &layer_name, NULL, NULL, 0, NULL}, {"-m", NULL, &m_text, NULL, NULL, 0, NULL},
                         {"--dtype", NULL, &dtype_text, NULL, NULL, 0, NULL}, {"--kernel", NULL, &kernel, NULL, NULL, 0, NULL},
                         {"--x", NULL, &x_path, NULL, NULL, 0, NULL},         {"--seed", NULL, &seed_text, NULL, NULL, 0, NULL},
                         {"--backend", NULL, &backend, NULL, NULL, 0, NULL}};
    const char *positional[1];
    size_t npositional;
    int rc = parse_args(c, argc, argv, flags, sizeof flags / sizeof flags[0], positional, 1, &npositional);
    if (rc) return rc;
    if (npositional != 1) return usage_error(c, "expected one checkpoint DIR");
    if (!layer_name) return usage_error(c, "--layer NAME is required");
    unsigned long long M = 0, seed = DEFAULT_SEED;
    if (m_text && !parse_unsigned(m_text, 1, MAX_M, &M))
        return usage_error(c, "-m '%s' is not an integer from 1 to %d", m_text, MAX_M);
    if (!m_text && !x_path) return usage_error(c, "-m M is required (or --x FILE)");
    if (seed_text && !parse_unsigned(seed_text, 0, ULLONG_MAX, &seed))
        return usage_error(c, "--seed '%s' is not a non-negative integer", seed_text);
    qmm_dtype dtype = QMM_F32;
    if (dtype_text && (qmm_dtype_parse(dtype_text, &dtype) != QMM_OK || !qmm_is_float_dtype(dtype)))
        return usage_error(c, "--dtype '%s' is not f32, f16 or bf16", dtype_text);
    if (!valid_backend_name(backend)) return usage_error(c, "--backend '%s' is not auto, cuda, cpu or ref", backend);

    qmm_checkpoint *checkpoint = NULL;
    qmm_safetensors *x_file = NULL;
    qmm_context *context = NULL;
    void *scales = NULL, *biases = NULL, *x = NULL;
    qmm_layer layer;
    layer_result result;
    size_t rows = (size_t)M;
    qmm_status status;
    memset(&result, 0, sizeof result);
    if ((status = qmm_checkpoint_open(positional[0], &checkpoint)) != QMM_OK) goto cleanup;
    if ((status = qmm_checkpoint_find_layer(checkpoint, layer_name, &layer)) != QMM_OK) goto cleanup;
    qmm_qmatrix matrix = layer.matrix;
    if (!dtype_text) dtype = matrix.dtype;
    const qmm_dtype stored = matrix.dtype;
    if (dtype != stored && (status = convert_scales(&layer.matrix, dtype, &matrix, &scales, &biases)) != QMM_OK)
        goto cleanup;

    if (x_path) {
        qmm_tensor tensor;
        if ((status = qmm_safetensors_open(x_path, &x_file)) != QMM_OK) goto cleanup;
        /* The tensor named like the layer, else the file's only tensor. */
        if (qmm_safetensors_find(x_file, layer_name, &tensor) != QMM_OK) {
            if (qmm_safetensors_count(x_file) != 1) {
                status = qmm_error(QMM_ERR_NOT_FOUND, "'%s' has no tensor named '%s' and more than one tensor", x_path,
                                   layer_name);
                goto cleanup;
            }
            if ((status = qmm_safetensors_get(x_file, 0, &tensor)) != QMM_OK) goto cleanup;
        }
        if ((status = load_activation(&tensor, matrix.cols, dtype, (size_t)M, &x, &rows)) != QMM_OK) goto cleanup;
    } else {
        size_t count, bytes;
        if (!qmm_mul_size(rows, matrix.cols, &count) || !qmm_mul_size(count, qmm_dtype_size(dtype), &bytes)) {
            status = qmm_error(QMM_ERR_OVERFLOW, "M=%zu × K=%zu overflows size_t", rows, matrix.cols);
            goto cleanup;
        }
        if (!(x = malloc(bytes))) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of x", bytes);
            goto cleanup;
        }
        if ((status = fill_random(seed, x, dtype, count)) != QMM_OK) goto cleanup;
    }

    if ((status = open_context(backend, &context)) != QMM_OK) goto cleanup;
    fprintf(stderr, "qmm matmul: %s on backend %s, M=%zu\n", layer_name, qmm_backend_name(qmm_context_backend(context)),
            rows);
    if ((status = check_product(context, &matrix, x, rows, kernel, 0.25, 0, &result)) != QMM_OK) goto cleanup;

    char format[64];
    format_format(format, sizeof format, &matrix);
    printf("layer              %s (N=%zu, K=%zu)\n", layer_name, matrix.rows, matrix.cols);
    printf("format             %s\n", format);
    if (dtype != stored)
        printf("note               scales/biases converted %s -> %s for --dtype %s (rounded once, to nearest even)\n",
               qmm_dtype_name(stored), qmm_dtype_name(dtype), qmm_dtype_name(dtype));
    if (x_path) printf("x                  %s, M=%zu, rounded to %s\n", x_path, rows, qmm_dtype_name(dtype));
    else printf("x                  random uniform [-1, 1), seed %llu, M=%zu, %s\n", seed, rows, qmm_dtype_name(dtype));
    printf("backend            %s\n", qmm_backend_name(qmm_context_backend(context)));
    printf("kernel             %s%s\n", result.kernel.name, kernel ? " (forced)" : " (selector's choice)");
    printf("max |error|        %.3e\n", result.max_abs_error);
    printf("max rel error      %.3e (max |error| / max |exact|)\n",
           result.max_exact > 0 ? result.max_abs_error / result.max_exact : result.max_abs_error);
    printf("worst error/bound  %.3g (qmm_error_bound, slack %g)\n", result.worst_ratio,
           result.kernel.tolerance_slack > 0 ? result.kernel.tolerance_slack : 1.0);
    printf("time               %.2f µs (median of %d chain runs)\n", result.microseconds, result.timing_runs);
    printf("bandwidth          %.3f GB/s (%.0f bytes: weights + scales + biases + x + out)\n",
           result.microseconds > 0 ? result.bytes / (result.microseconds * 1e3) : 0.0, result.bytes);
    if (result.outside) {
        printf("verdict            FAIL: %zu of %zu outputs outside bound (first: row %zu, column %zu)\n",
               result.outside, rows * matrix.rows, result.first_outside / matrix.rows,
               result.first_outside % matrix.rows);
    } else {
        printf("verdict            all %zu outputs within bound\n", rows * matrix.rows);
    }
cleanup:
    qmm_context_destroy(context);
    qmm_safetensors_close(x_file);
    qmm_checkpoint_close(checkpoint);
    free(scales);
    free(biases);
    free(x);
    if (status != QMM_OK) return library_error(c, status);
    return result.outside ? 1 : 0;
}

/* ───────────────────────────── qmm run ───────────────────────────── */

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The embedded fixture: the source tree this binary was built from, else the installed share dir
 * (<prefix>/bin/qmm -> <prefix>/share/qmm/). */
static qmm_status find_fixture(char *out, size_t size) {
    char exe[2048], installed[4096] = "";
    snprintf(out, size, "%s/data/%s", QMM_SOURCE_DIR, FIXTURE_NAME);
    if (is_dir(out)) return QMM_OK;
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
    return qmm_error(QMM_ERR_NOT_FOUND, "the fixture %s is in neither %s nor %s; pass a checkpoint DIR", FIXTURE_NAME,
                     out, installed[0] ? installed : "the install share dir");
}

static int cmd_run(const command *c, int argc, char **argv) {
    const char *seed_text = NULL, *backend = NULL;
    flag_spec flags[] = {{"--seed", NULL, &seed_text, NULL, NULL, 0, NULL}, {"--backend", NULL, &backend, NULL, NULL, 0, NULL}};
    const char *positional[1];
    size_t npositional;
    int rc = parse_args(c, argc, argv, flags, 2, positional, 1, &npositional);
    if (rc) return rc;
    unsigned long long seed = DEFAULT_SEED, faults = 0;
    if (seed_text && !parse_unsigned(seed_text, 0, ULLONG_MAX, &seed))
        return usage_error(c, "--seed '%s' is not a non-negative integer", seed_text);
    if (!valid_backend_name(backend)) return usage_error(c, "--backend '%s' is not auto, cuda, cpu or ref", backend);
    const char *inject = getenv("QMM_RUN_INJECT_FAULT");
    if (inject && inject[0] && !parse_unsigned(inject, 0, 1000000, &faults))
        return usage_error(c, "QMM_RUN_INJECT_FAULT='%s' is not a non-negative integer", inject);

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
    if ((status = open_context(backend, &context)) != QMM_OK) goto cleanup;

    fprintf(stderr, "qmm run: %s: %zu quantized layers, backend %s, activations %s\n", dir, count,
            qmm_backend_name(qmm_context_backend(context)), activations ? "activations.safetensors" : "(none)");
    if (faults) fprintf(stderr, "qmm run: QMM_RUN_INJECT_FAULT=%llu: corrupting one output of the first %llu layer(s)\n",
                        faults, faults);
    static const int widths[] = {22, 18, 17, 26, 12, 13, 10};
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
        if (activations && qmm_safetensors_find(activations, layer.name, &tensor) == QMM_OK) {
            if ((status = load_activation(&tensor, m->cols, m->dtype, 0, &x, &rows)) != QMM_OK) goto cleanup;
            random_x = 0;
        } else {
            size_t elements;
            if (!qmm_mul_size(rows, m->cols, &elements) || !(x = malloc(elements * qmm_dtype_size(m->dtype)))) {
                status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate x for layer '%s'", layer.name);
                goto cleanup;
            }
            if ((status = fill_random(seed + i, x, m->dtype, elements)) != QMM_OK) goto cleanup;
        }
        fprintf(stderr, "qmm run: %s ...\n", layer.name);
        status = check_product(context, m, x, rows, NULL, 0.05, i < faults, &result);
        free(x);
        x = NULL;
        if (status != QMM_OK) goto cleanup;
        char shape[64], format[64], error[32], ratio[32], time[32];
        snprintf(shape, sizeof shape, "%zu×%zu×%zu", rows, m->rows, m->cols);
        format_format(format, sizeof format, m);
        snprintf(error, sizeof error, "%.3e", result.max_abs_error);
        snprintf(ratio, sizeof ratio, "%.3f%s", result.worst_ratio, result.outside ? " FAIL" : "");
        snprintf(time, sizeof time, "%.1f", result.microseconds);
        const char *cells[] = {layer.name, shape, format, result.kernel.name, error, ratio, time};
        for (int k = 0; k < 7; k++) print_cell(cells[k], widths[k]);
        printf("%s\n", random_x ? "random x" : "real x");
        if (result.outside) failed++;
    }
    if (failed) printf("FAIL: %zu of %zu layers outside bound\n", failed, count);
    else printf("%zu layers, all within bound\n", count);
cleanup:
    free(x);
    qmm_context_destroy(context);
    qmm_safetensors_close(activations);
    qmm_checkpoint_close(checkpoint);
    if (status != QMM_OK) return library_error(c, status);
    return failed ? 1 : 0;
}

/* ───────────────────────────── main ───────────────────────────── */

/* ───────────────────────────── qmm kernels ───────────────────────────── */

/* Every backend's kernel table in selector order, or why the backend is not available here. */
static int cmd_kernels(const command *c, int argc, char **argv) {
    static const qmm_backend backends[] = {QMM_BACKEND_CUDA, QMM_BACKEND_CPU, QMM_BACKEND_REF};
    const char *positional[1];
    size_t npositional;
    int rc = parse_args(c, argc, argv, NULL, 0, positional, 0, &npositional);
    if (rc) return rc;
    for (size_t b = 0; b < sizeof backends / sizeof backends[0]; b++) {
        qmm_context *context = NULL;
        if (qmm_context_create(backends[b], 0, &context) != QMM_OK) {
            printf("backend %s: not available (%s)\n", qmm_backend_name(backends[b]), qmm_last_error());
            continue;
        }
        size_t count = qmm_kernel_count(context);
        printf("backend %s: %zu kernels, in the order the selector tries them\n", qmm_backend_name(backends[b]), count);
        for (size_t i = 0; i < count; i++) {
            qmm_kernel_info info;
            qmm_status status = qmm_kernel_get(context, i, &info);
            if (status != QMM_OK) {
                qmm_context_destroy(context);
                return library_error(c, status);
            }
            char tile[64];
            snprintf(tile, sizeof tile, "%dx%dx%d", info.bm, info.bn, info.bk);
            printf("  %-28s %-6s %-8s tile %-10s threads %-4d slack %-4g %s\n", info.name, qmm_op_name(info.op),
                   info.family, tile, info.threads, info.tolerance_slack, info.description);
        }
        qmm_context_destroy(context);
    }
    return 0;
}

static int cmd_help(const command *c, int argc, char **argv);

static const command commands[] = {
    {"info", "list a .safetensors, .gguf or MLX checkpoint dir: tensors, quantized layers, formats",
     "usage: qmm info FILE|DIR\n"
     "  FILE.safetensors  tensors (name, dtype, shape) and quantized layers (P.scales present); bits and\n"
     "                    group_size come from a config.json beside the file\n"
     "  FILE.gguf         every tensor's GGUF type, shape and whether qmm imports it (and as what)\n"
     "  DIR               an MLX checkpoint: tensors and every quantized layer's bits, group_size and scale dtype\n",
     cmd_info},
    {"convert", "convert a GGUF file into an MLX checkpoint directory",
     "usage: qmm convert IN.gguf OUTDIR [--only PREFIX]... [--force]\n"
     "  Imports F32/F16/BF16 tensors as they are and Q4_0/Q4_1/Q8_0 exactly as 4/8-bit gs32 layers with f16\n"
     "  scales (X.weight -> layer X). --only keeps the tensors whose names start with PREFIX (repeatable).\n"
     "  An unsupported tensor type stops the conversion and leaves OUTDIR without new files. An OUTDIR that\n"
     "  already holds a checkpoint is refused unless --force is given.\n",
     cmd_convert},
    {"quantize", "quantize the float weights of a safetensors file into an MLX checkpoint",
     "usage: qmm quantize IN.safetensors OUTDIR --bits B --group-size G [--convention cpu|gpu] [--force]\n"
     "  Every 2-D f32/f16/bf16 tensor named *.weight whose last dim is a multiple of G becomes a quantized\n"
     "  layer (weight U32, scales, biases in the weight's dtype); every other tensor is copied.\n"
     "  B: 2, 3, 4, 5, 6 or 8. G: 32, 64 or 128. --convention: MLX's CPU quantizer (default) or its GPU\n"
     "  quantizer (what mlx-community checkpoints were made with), bit for bit.\n",
     cmd_quantize},
    {"matmul", "run one layer's product through the runtime and check it against the f64 oracle",
     "usage: qmm matmul DIR --layer NAME -m M [--dtype f32|f16|bf16] [--kernel NAME] [--x FILE.safetensors]\n"
     "                  [--seed S] [--backend auto|cuda|cpu|ref]\n"
     "  out[M, N] = x[M, K] · Ŵᵀ for layer NAME of checkpoint DIR. x is uniform random in [-1, 1) (seed S,\n"
     "  default 42) or read from FILE (the tensor named NAME, else its only tensor; shape [T, K], first M\n"
     "  rows, all T rows (at most 65536) when -m is omitted). --dtype other than the layer's scale dtype\n"
     "  converts scales and biases (rounded once). Prints max |error| and max relative error (÷ max |exact|)\n"
     "  against qmm_ref_dense_f64, the worst error/bound ratio (qmm_error_bound), the median µs of chain runs,\n"
     "  GB/s (weights + scales + biases + x + out bytes / time) and the kernel used. Exit 1 when an output is\n"
     "  outside its bound. M: 1 to 65536. --backend auto: the first of cuda, cpu, ref that is available.\n",
     cmd_matmul},
    {"run", "the main job: every quantized layer of a real checkpoint, checked against the oracle",
     "usage: qmm run [DIR] [--seed S] [--backend auto|cuda|cpu|ref]\n"
     "  DIR defaults to the embedded fixture data/" FIXTURE_NAME " (7 linear layers of SmolLM2-135M\n"
     "  block 0, see data/NOTICE). For every quantized layer: x = DIR/activations.safetensors[layer name]\n"
     "  ([T, K], rounded to the layer's scale dtype; seeded random x when absent, marked \"random x\"), the\n"
     "  product through the runtime (selector's choice), every output compared with the f64 oracle under\n"
     "  qmm_error_bound. One row per layer: name, M×N×K, format, kernel, max |error|, worst error/bound, µs.\n"
     "  Ends with a verdict line; exit 1 when any layer is outside its bound.\n"
     "  Test hook: QMM_RUN_INJECT_FAULT=n (n >= 1) corrupts one output element of each of the first n layers\n"
     "  before the comparison, to prove the verdict can fail.\n",
     cmd_run},
    {"kernels", "list every backend's kernel table in selector order (or why a backend is unavailable)",
     "usage: qmm kernels\n"
     "  For each backend (cuda, cpu, ref): its rows in the order the selector tries them, with op, family,\n"
     "  tile BMxBNxBK, threads per block, the harness's tolerance slack and a description. Names follow\n"
     "  <backend>.<op>.<family>.<tile>[.<isa>] (docs/kernels.md).\n",
     cmd_kernels},
    {"help", "print this list, or a command's usage", "usage: qmm help [COMMAND]\n", cmd_help},
};
static const size_t command_count = sizeof commands / sizeof commands[0];

static void print_overview(FILE *out) {
    fprintf(out, "qmm %d.%d.%d — weight-only quantized matmul in the MLX affine format\n\nusage: qmm COMMAND [ARGS]\n\n",
            QMM_VERSION_MAJOR, QMM_VERSION_MINOR, QMM_VERSION_PATCH);
    for (size_t i = 0; i < command_count; i++) fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'qmm COMMAND --help' prints a command's usage.\n");
}

static const command *find_command(const char *name) {
    for (size_t i = 0; i < command_count; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

static int cmd_help(const command *c, int argc, char **argv) {
    if (argc == 0) {
        print_overview(stdout);
        return 0;
    }
    if (argc > 1) return usage_error(c, "expected at most one COMMAND");
    const command *target = find_command(argv[0]);
    if (!target) return usage_error(c, "unknown command '%s'", argv[0]);
    fputs(target->usage, stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_overview(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        print_overview(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("qmm %d.%d.%d\n", QMM_VERSION_MAJOR, QMM_VERSION_MINOR, QMM_VERSION_PATCH);
        return 0;
    }
    const command *c = find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "qmm: usage error: unknown command '%s'\nTry 'qmm help'.\n", argv[1]);
        return 2;
    }
    if (c->run != cmd_help && wants_help(argc - 2, argv + 2)) {
        fputs(c->usage, stdout);
        return 0;
    }
    return c->run(c, argc - 2, argv + 2);
}
