/*
 * measure.c — what `qmm bench` and `qmm tune` share to measure kernels the same way (measure.h): option lists,
 * shape files, the random weights of a shape, the weight copies that rotate beyond the cache, and the timing of
 * one kernel through a chain.
 */
#include "measure.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* splitmix64, for the random weights. */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ───────────────────────────── options ───────────────────────────── */

/* "1,2,4" into values (each in [min, max]); returns 0 or the usage exit code. */
int parse_size_list(const command *c, const char *option, const char *text, size_t min, size_t max,
                           size_t *values, size_t *count) {
    *count = 0;
    const char *p = text;
    while (1) {
        const char *comma = strchr(p, ',');
        size_t length = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        unsigned long long value;
        if (length == 0 || length >= sizeof item)
            return usage_error(c, "%s '%s': an empty or overlong item (want comma-separated numbers)", option, text);
        memcpy(item, p, length);
        item[length] = '\0';
        if (!parse_unsigned(item, min, max, &value))
            return usage_error(c, "%s '%s': '%s' is not a whole number in [%zu, %zu]", option, text, item, min, max);
        if (*count == MAX_LIST) return usage_error(c, "%s '%s': more than %d values", option, text, MAX_LIST);
        values[(*count)++] = (size_t)value;
        if (!comma) break;
        p = comma + 1;
    }
    return 0;
}

int parse_dtype_list(const command *c, const char *text, qmm_dtype *values, size_t *count) {
    *count = 0;
    const char *p = text;
    while (1) {
        const char *comma = strchr(p, ',');
        size_t length = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        qmm_dtype dtype;
        if (length == 0 || length >= sizeof item)
            return usage_error(c, "--dtype '%s': an empty or overlong item (want e.g. f32,bf16)", text);
        memcpy(item, p, length);
        item[length] = '\0';
        if (qmm_dtype_parse(item, &dtype) != QMM_OK || (dtype != QMM_F32 && dtype != QMM_F16 && dtype != QMM_BF16))
            return usage_error(c, "--dtype '%s': '%s' is not f32, f16 or bf16 (or float32, float16, bfloat16)", text, item);
        if (*count == MAX_LIST) return usage_error(c, "--dtype '%s': more than %d values", text, MAX_LIST);
        values[(*count)++] = dtype;
        if (!comma) break;
        p = comma + 1;
    }
    return 0;
}

static int valid_shape_name(const char *name) {
    if (!name[0]) return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '_' || *p == '-'))
            return 0;
    return 1;
}

/* Appends the shapes of one file ("name N K" lines, '#' comments). Errors name the file, line and rule. */
static bool shape_named(const bench_shape *shapes, size_t count, const char *name) {
    for (size_t i = 0; i < count; i++)
        if (strcmp(shapes[i].name, name) == 0) return true;
    return false;
}

/* The first `limit` bytes of a field of a shapes file for a message: printable (a control character escaped), "…" after
 * a longer field. */
static const char *field_text(const char *field, size_t limit, char *buffer, size_t size) {
    const size_t length = strlen(field);
    /* cut before a character, not inside one (its first bytes would read as invalid UTF-8, escaped) */
    const size_t kept = length < limit ? length : qmm_utf8_cut(field, limit);
    qmm_printable(field, kept, buffer, size - 4);
    if (length > kept) strcat(buffer, "…");
    return buffer;
}

static qmm_status load_shape_file(bench_shape *shapes, size_t *shape_count, int group_size, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return qmm_error(QMM_ERR_IO, "cannot open shapes file '%s': %s", path, strerror(errno));
    /* Whole lines of any length (a long comment is fine), split at blanks: an overlong field is named as
     * such, never cut into two fields. */
    char *line = NULL;
    size_t capacity = 0;
    int number = 0;
    qmm_status status = QMM_OK;
    while (status == QMM_OK) {
        errno = 0;
        const ssize_t length = getline(&line, &capacity, f);
        if (length == -1) {
            if (errno != 0 || ferror(f)) /* a read error, or a line too long for memory: never a silent end */
                status = qmm_error(errno == ENOMEM ? QMM_ERR_OUT_OF_MEMORY : QMM_ERR_IO, "%s:%d: cannot read the line: %s",
                                   path, number + 1, strerror(errno ? errno : EIO));
            break;
        }
        number++;
        /* The line is read as a C string below: a NUL byte would end it there, dropping the text after it (or the
         * whole line, at its start) without a word. */
        const size_t nul = strlen(line);
        if (nul < (size_t)length) {
            status = qmm_error(QMM_ERR_CORRUPT, "%s:%d: a NUL byte at column %zu; a shapes file is text (\"name N K\" "
                               "lines)", path, number, nul + 1);
            break;
        }
        line[strcspn(line, "#\n")] = '\0';
        char *field[3] = {NULL, NULL, NULL}, *save = NULL;
        int fields = 0;
        for (char *token = strtok_r(line, " \t\r\v\f", &save); token; token = strtok_r(NULL, " \t\r\v\f", &save))
            if (fields++ < 3) field[fields - 1] = token;
        if (fields == 0) continue;
        const char *name = field[0], *n_text = field[1], *k_text = field[2];
        char shown[2][PRINTABLE_SIZE];
        unsigned long long N, K;
        if (fields != 3) {
            status = qmm_error(QMM_ERR_CORRUPT, "%s:%d: want \"name N K\" (3 fields), got %d", path, number, fields);
        } else if (!valid_shape_name(name)) {
            status = qmm_error(QMM_ERR_CORRUPT, "%s:%d: shape name '%s' must be 1-63 characters of A-Z a-z 0-9 . _ -",
                               path, number, field_text(name, 64, shown[0], sizeof shown[0]));
        } else if (strlen(name) >= sizeof shapes[0].name) {
            status = qmm_error(QMM_ERR_CORRUPT, "%s:%d: shape name '%.32s…' is longer than %zu characters", path, number,
                               name, sizeof shapes[0].name - 1);
        } else if (!parse_unsigned(n_text, 1, 1u << 30, &N) || !parse_unsigned(k_text, 1, 1u << 30, &K)) {
            status = qmm_error(QMM_ERR_CORRUPT, "%s:%d: N='%s' and K='%s' must be whole numbers in [1, 2^30]", path,
                               number, field_text(n_text, 32, shown[0], sizeof shown[0]),
                               field_text(k_text, 32, shown[1], sizeof shown[1]));
        } else if (K % (unsigned long long)group_size != 0) {
            status = qmm_error(QMM_ERR_SHAPE, "%s:%d: shape %s has K=%llu, not a multiple of --group-size %d", path,
                               number, name, K, group_size);
        } else if (*shape_count == MAX_SHAPES) {
            status = qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s:%d: more than %d shapes in all", path, number, MAX_SHAPES);
        } else if (shape_named(shapes, *shape_count, name)) {
            /* results (and the peers' lines) are matched to cells by shape name */
            status = qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s:%d: shape name '%s' is already used (names must be unique)",
                               path, number, name);
        } else {
            bench_shape *shape = &shapes[(*shape_count)++];
            memcpy(shape->name, name, strlen(name) + 1); /* fits: checked above */
            shape->N = (size_t)N;
            shape->K = (size_t)K;
        }
    }
    free(line);
    fclose(f);
    return status;
}

/* The text of --shapes, checked before any work: non-empty items separated by single commas, under
 * SHAPES_TEXT_MAX bytes. Returns 0 or the usage exit code. */
#define SHAPES_TEXT_MAX 2048
int check_shapes_option(const command *c, const char *text) {
    if (!text[0]) return usage_error(c, "--shapes is empty (want a shapes file or a name in bench/shapes/: seed, qwen3)");
    if (strlen(text) >= SHAPES_TEXT_MAX)
        return usage_error(c, "--shapes is %zu bytes long; the limit is %d", strlen(text), SHAPES_TEXT_MAX - 1);
    for (const char *p = text;; p++) {
        const char *comma = strchr(p, ',');
        const size_t length = (size_t)((comma ? comma : p + strlen(p)) - p);
        if (length == 0) return usage_error(c, "--shapes '%s': an empty item (want comma-separated files or names)", text);
        for (const char *q = text; q < p;) { /* an item named twice would load its shapes twice */
            const char *q_end = strchr(q, ',');
            if ((size_t)(q_end - q) == length && strncmp(q, p, length) == 0)
                return usage_error(c, "--shapes '%s': '%.*s' is listed twice", text, (int)length, p);
            q = q_end + 1;
        }
        if (!comma) break;
        p = comma;
    }
    return 0;
}

/* --shapes A,B: each a file path, or a name of bench/shapes/NAME.txt; every file must hold a shape. */
qmm_status load_shapes(bench_shape *shapes, size_t *shape_count, int group_size, const char *text) {
    char copy[SHAPES_TEXT_MAX];
    if (!text[0] || strlen(text) >= sizeof copy) /* check_shapes_option refused these already */
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "--shapes is empty or longer than %zu bytes", sizeof copy - 1);
    snprintf(copy, sizeof copy, "%s", text);
    for (char *item = strtok(copy, ","); item; item = strtok(NULL, ",")) {
        char path[PATH_MAX];
        struct stat info;
        if (stat(item, &info) == 0) {
            if (!S_ISREG(info.st_mode))
                return qmm_error(QMM_ERR_IO, "--shapes '%s' is %s, not a shapes file", item,
                                 S_ISDIR(info.st_mode) ? "a directory" : "not a regular file");
            snprintf(path, sizeof path, "%s", item);
        } else {
            snprintf(path, sizeof path, "%s/bench/shapes/%s.txt", source_dir(), item);
            if (stat(path, &info) != 0)
                return qmm_error(QMM_ERR_NOT_FOUND, "--shapes '%s': no file '%s' and no %s (a shapes file or the name "
                                 "of one in bench/shapes/: seed, qwen3)", item, item, path);
        }
        size_t before = *shape_count;
        qmm_status status = load_shape_file(shapes, shape_count, group_size, path);
        if (status != QMM_OK) return status;
        if (*shape_count == before)
            return qmm_error(QMM_ERR_CORRUPT, "shapes file '%s' has no shapes (want \"name N K\" lines)", path);
    }
    return QMM_OK;
}

/* ───────────────────────────── measurement ───────────────────────────── */

/* Median µs of one product: a chain with one step per weight copy, one warm-up run, then `repeats` runs,
 * each giving qmm_chain_elapsed ÷ steps. batch_invariant: qmm_matmul_options.batch_invariant of every step. */
qmm_status time_kernel(qmm_context *context, int repeats, qmm_weights **weights, size_t copies, qmm_buffer *x, size_t M,
                       qmm_buffer *out, qmm_op op, const char *kernel, int batch_invariant, double *us) {
    qmm_chain *chain = NULL;
    double *samples = malloc((size_t)repeats * sizeof *samples);
    qmm_status status = samples ? qmm_chain_create(context, &chain)
                                : qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %d samples", repeats);
    qmm_matmul_options options = {.op = op, .kernel = kernel, .batch_invariant = batch_invariant};
    /* Whole-chain timing: on CUDA the graph then holds only the kernels (no event nodes between steps), and host
     * backends synchronize once per run. */
    if (status == QMM_OK) status = qmm_chain_set_step_timing(chain, 0);
    for (size_t i = 0; status == QMM_OK && i < copies; i++)
        status = qmm_chain_add_matmul(chain, weights[i], x, M, out, &options);
    if (status == QMM_OK) status = qmm_chain_run(chain); /* warm-up (and, on CUDA, the graph capture) */
    for (int r = 0; status == QMM_OK && r < repeats; r++) {
        double elapsed = 0.0;
        if ((status = qmm_chain_run(chain)) == QMM_OK && (status = qmm_chain_elapsed(chain, &elapsed)) == QMM_OK)
            samples[r] = elapsed / (double)copies;
    }
    if (status == QMM_OK) {
        qsort(samples, (size_t)repeats, sizeof *samples, compare_doubles);
        *us = samples[repeats / 2];
    }
    qmm_chain_destroy(chain);
    free(samples);
    return status;
}

/* Copies that rotate through more than twice the cache (at least 2, at most MAX_COPIES). */
size_t copies_for(size_t cache_bytes, int quick, double bytes_per_copy) {
    if (quick) return 2;
    double wanted = ceil(2.0 * (double)cache_bytes / bytes_per_copy);
    if (wanted < 2) wanted = 2;
    if (wanted > MAX_COPIES) wanted = MAX_COPIES;
    return (size_t)wanted;
}

/* Random weights of one shape: random codes, scales in [2^-8, 2^-6), biases in [-2^-4, 2^-4), f32. */
qmm_status make_master(int bits, int group_size, const bench_shape *shape, qmm_qmatrix *matrix, uint32_t **w, float **scales,
                       float **biases) {
    size_t words = shape->N * qmm_packed_words(shape->K, bits);
    size_t groups = shape->N * qmm_groups(shape->K, group_size);
    *w = malloc(words * sizeof **w);
    *scales = malloc(groups * sizeof **scales);
    *biases = malloc(groups * sizeof **biases);
    if (!*w || !*scales || !*biases)
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the weights of %s (%zu×%zu)", shape->name, shape->N,
                         shape->K);
    uint64_t state = 0x5eed0000u + shape->N * 31u + shape->K;
    for (size_t i = 0; i < words; i++) (*w)[i] = (uint32_t)next_random(&state);
    for (size_t i = 0; i < groups; i++) {
        double u = (double)(next_random(&state) >> 11) * 0x1.0p-53, v = (double)(next_random(&state) >> 11) * 0x1.0p-53;
        (*scales)[i] = (float)(0x1.0p-8 * (1.0 + 3.0 * u));
        (*biases)[i] = (float)(0x1.0p-4 * (2.0 * v - 1.0));
    }
    qmm_qmatrix m = {*w, *scales, *biases, QMM_F32, shape->N, shape->K, bits, group_size};
    *matrix = m;
    return qmm_qmatrix_validate(matrix);
}

int slow_row_skipped(const qmm_kernel_info *info, size_t M, size_t N, size_t K, size_t copies, int repeats, char *note,
                    size_t note_size) {
    /* The scalar reference rows (~4 GMAC/s on a core) and the CUDA generic kernels (the oracle's order, one
     * thread per output: ~16 GMAC/s measured on the H200 at M = 1, docs/PERF.md) */
    const bool scalar = strcmp(info->family, "scalar") == 0, generic = strcmp(info->family, "generic") == 0;
    if (!scalar && !generic) return 0;
    /* cpu.qmm_t.scalar.r1 (portable C in the split form, no FMA contraction): a decode of the weights per call and
     * the multiply-adds (measure.h), or a --m 65536 cell runs for minutes; its rate below is the whole call's */
    const bool cpu_scalar = scalar && info->backend == QMM_BACKEND_CPU;
    const double macs = (double)M * (double)N * (double)K;
    const double call_s = cpu_scalar ? (double)N * (double)K / CPU_SCALAR_DECODES_PER_S + macs / CPU_SCALAR_MACS_PER_S
                                     : macs / (scalar ? SCALAR_MACS_PER_S : GENERIC_MACS_PER_S);
    const double rate = macs / call_s, estimate = call_s * (double)copies * (repeats + 1);
    if (estimate <= SCALAR_BUDGET_S) return 0;
    snprintf(note, note_size, "skipped: the %s row would take ~%.0f s here (M·N·K = %.3g at ~%.2g GMAC/s, %zu copies × %d runs)",
             info->family, estimate, macs, rate / 1e9, copies, repeats + 1);
    return 1;
}

qmm_status measure_machine(qmm_backend backend, char *machine, size_t machine_size, size_t *cache_bytes,
                           char *cache_desc, size_t desc_size) {
    if (backend == QMM_BACKEND_CUDA) {
        size_t l2 = 0;
        qmm_status status = bench_cuda_machine(machine, machine_size, &l2);
        *cache_bytes = l2;
        snprintf(cache_desc, desc_size, "L2 %.0f MiB", (double)l2 / 1048576.0);
        return status;
    }
    char model[200];
    bench_host_cpu_model(model, sizeof model);
    snprintf(machine, machine_size, "%s, %d thread%s", model, bench_host_threads(), bench_host_threads() == 1 ? "" : "s");
    *cache_bytes = bench_host_llc_bytes(cache_desc, desc_size);
    if (*cache_bytes == 0) *cache_bytes = (size_t)64 << 20; /* unknown: assume a large one */
    return QMM_OK;
}

qmm_status weight_copies_create(qmm_context *context, const qmm_qmatrix *matrix, size_t copies, qmm_weights ***weights) {
    *weights = calloc(copies, sizeof **weights);
    if (!*weights) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu weight copies", copies);
    qmm_status status = QMM_OK;
    for (size_t i = 0; status == QMM_OK && i < copies; i++) status = qmm_weights_create(context, matrix, &(*weights)[i]);
    return status;
}

void weight_copies_destroy(qmm_weights **weights, size_t copies) {
    for (size_t i = 0; weights && i < copies; i++) qmm_weights_destroy(weights[i]);
    free(weights);
}

qmm_status operands_create(qmm_context *context, qmm_dtype dtype, size_t M, size_t N, size_t K, qmm_buffer **x,
                           qmm_buffer **out) {
    *x = *out = NULL;
    const size_t element = qmm_dtype_size(dtype);
    void *host_x = malloc(M * K * element);
    qmm_status status = host_x ? QMM_OK : qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate x of %zu×%zu", M, K);
    if (status == QMM_OK) status = fill_random(DEFAULT_SEED + M, host_x, dtype, M * K);
    if (status == QMM_OK) status = qmm_buffer_create(context, dtype, M * K, x);
    if (status == QMM_OK) status = qmm_buffer_create(context, dtype, M * N, out);
    if (status == QMM_OK) status = qmm_buffer_write(*x, host_x, M * K);
    free(host_x);
    return status;
}

int parse_measure_options(const command *c, const measure_option_texts *texts, int *bits, int *group_size,
                          int *repeats, size_t *ms, size_t *m_count, qmm_dtype *dtypes, size_t *dtype_count) {
    int rc;
    unsigned long long value;
    if (texts->bits && !parse_format_number(texts->bits, bits))
        return usage_error(c, "--bits '%s' is not one of 2, 3, 4, 5, 6, 8", texts->bits);
    if (texts->group_size && !parse_format_number(texts->group_size, group_size))
        return usage_error(c, "--group-size '%s' is not one of 32, 64, 128", texts->group_size);
    if (qmm_format_validate(*bits, *group_size) != QMM_OK)
        return usage_error(c, "--bits %d --group-size %d: %s", *bits, *group_size, qmm_last_error());
    if (texts->repeats) {
        if (!parse_unsigned(texts->repeats, 1, 1000, &value))
            return usage_error(c, "--repeats '%s' is not a whole number in [1, 1000]", texts->repeats);
        *repeats = (int)value;
    }
    if (texts->m && (rc = parse_size_list(c, "--m", texts->m, 1, MAX_M, ms, m_count))) return rc;
    for (size_t i = 0; texts->m && i < *m_count; i++)
        for (size_t j = 0; j < i; j++)
            if (ms[i] == ms[j]) return usage_error(c, "--m '%s' names %zu twice (each M is one cell)", texts->m, ms[i]);
    if (texts->dtype && (rc = parse_dtype_list(c, texts->dtype, dtypes, dtype_count))) return rc;
    for (size_t i = 0; texts->dtype && i < *dtype_count; i++)
        for (size_t j = 0; j < i; j++)
            if (dtypes[i] == dtypes[j])
                return usage_error(c, "--dtype '%s' names %s twice (each dtype is one cell)", texts->dtype,
                                   qmm_dtype_name(dtypes[i]));
    if (texts->shapes && (rc = check_shapes_option(c, texts->shapes))) return rc;
    return 0;
}

void default_measure_dtypes(int quick, int cuda, qmm_dtype *dtypes, size_t *count) {
    *count = quick ? 1 : 2;
    dtypes[0] = cuda ? QMM_F16 : QMM_F32;
    dtypes[1] = QMM_BF16;
}

qmm_status load_measure_shapes(const char *shapes_text, int quick, int group_size, bench_shape *shapes, size_t *count) {
    if (shapes_text) return load_shapes(shapes, count, group_size, shapes_text);
    if (!quick) return load_shapes(shapes, count, group_size, "seed");
    const bench_shape tiny[] = {{"quick.256x512", 256, 512}, {"quick.64x1024", 64, 1024}};
    for (size_t i = 0; i < 2; i++)
        if (tiny[i].K % (size_t)group_size == 0) shapes[(*count)++] = tiny[i];
    return QMM_OK;
}

void format_command_line(char *out, size_t size, const char *name, int argc, char **argv) {
    size_t used = (size_t)snprintf(out, size, "qmm %s", name);
    /* each argument as put_terminal_safe shows it (a byte outside printable UTF-8 as \xNN), so the JSON that records
     * the line is valid UTF-8; cut before a character that does not fit */
    for (int i = 0; i < argc && used + 1 < size; i++) {
        out[used++] = ' ';
        const char *arg = argv[i];
        const size_t length = strlen(arg);
        for (size_t at = 0; at < length;) {
            char escaped[5];
            const char *piece;
            size_t piece_size;
            at += terminal_piece(arg + at, length - at, escaped, &piece, &piece_size);
            if (used + piece_size >= size) {
                i = argc; /* the line is full */
                break;
            }
            memcpy(out + used, piece, piece_size);
            used += piece_size;
        }
    }
    out[used < size ? used : size - 1] = '\0';
}
