/*
 * common.c — what the qmm commands share: usage and library errors, flag parsing, number parsing,
 * small formatting helpers, seeded random x, the backend choice, one checked and timed product
 * (check_product), activations, scale conversion, the host memory check and the OUTDIR guard of convert and
 * quantize.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_ISSET, CPU_COUNT */
#include "common.h"

#include <sched.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *source_dir(void) {
    const char *dir = getenv("QMM_SOURCE_DIR");
    return dir && dir[0] ? dir : QMM_SOURCE_DIR;
}

size_t terminal_piece(const char *text, size_t size, char escaped[5], const char **piece, size_t *piece_size) {
    const size_t kept = qmm_printable_char(text, size);
    if (kept) {
        *piece = text, *piece_size = kept;
        return kept;
    }
    snprintf(escaped, 5, "\\x%02x", (unsigned char)text[0]);
    *piece = escaped, *piece_size = 4;
    return 1;
}

void put_terminal_safe(FILE *stream, const char *text) {
    const size_t size = strlen(text);
    char escaped[5];
    const char *piece;
    size_t piece_size;
    for (size_t i = 0; i < size;) {
        i += terminal_piece(text + i, size - i, escaped, &piece, &piece_size);
        fwrite(piece, 1, piece_size, stream);
    }
}

/* The whole message, however long (a path may be PATH_MAX bytes): formatted into memory sized to it; where that
 * memory cannot be had, straight to stderr unescaped rather than cut. */
static void vput_terminal_safe(FILE *stream, const char *format, va_list args) {
    va_list again;
    va_copy(again, args);
    const int length = vsnprintf(NULL, 0, format, args);
    char *message = length >= 0 ? malloc((size_t)length + 1) : NULL;
    if (message) {
        vsnprintf(message, (size_t)length + 1, format, again);
        put_terminal_safe(stream, message);
        free(message);
    } else {
        vfprintf(stream, format, again);
    }
    va_end(again);
}

void fprint_safe(FILE *stream, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vput_terminal_safe(stream, format, args);
    va_end(args);
}

void fprint_safe_line(FILE *stream, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vput_terminal_safe(stream, format, args);
    va_end(args);
    fputc('\n', stream);
}

int usage_error(const command *c, const char *format, ...) {
    va_list args;
    fprintf(stderr, "qmm %s: usage error: ", c->name);
    va_start(args, format);
    vput_terminal_safe(stderr, format, args);
    va_end(args);
    fprintf(stderr, "\nTry 'qmm %s --help'.\n", c->name);
    return QMM_EXIT_USAGE;
}

/* A failing library call (or a CLI-level check that set the message with qmm_error). */
int library_error(const command *c, qmm_status status) {
    const char *message = qmm_last_error();
    fprintf(stderr, "qmm %s: %s: ", c->name, qmm_status_string(status));
    put_terminal_safe(stderr, message && message[0] ? message : "(no message)");
    fputc('\n', stderr);
    return QMM_EXIT_ERROR;
}

/* ───────────────────────────── argument parsing ───────────────────────────── */

/* The flag that arg names ("--bits", "--bits=4" or the alias), or NULL; *name receives the spelling used
 * and *length its length (arg[*length] is '\0' or '='). */
static const flag_spec *find_flag(const flag_spec *flags, size_t flag_count, const char *arg, const char **name,
                                  size_t *length) {
    for (size_t f = 0; f < flag_count; f++) {
        const char *names[2] = {flags[f].name, flags[f].alias};
        for (int n = 0; n < 2; n++) {
            if (!names[n]) continue;
            size_t l = strlen(names[n]);
            if (strncmp(arg, names[n], l) == 0 && (arg[l] == '=' || arg[l] == '\0')) {
                *name = names[n];
                *length = l;
                return &flags[f];
            }
        }
    }
    return NULL;
}

/* Whether --help or -h stands where a flag may stand: the value of a flag that takes one ("--layer -h")
 * is a value, not a request for help. Unknown options are stepped over, so that help wins over them. */
static int asks_for_help(int argc, char **argv, const flag_spec *flags, size_t flag_count) {
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *name;
        size_t length;
        if (arg[0] != '-' || arg[1] == '\0') continue;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return 1;
        const flag_spec *match = find_flag(flags, flag_count, arg, &name, &length);
        if (match && !match->switched && arg[length] == '\0') i++; /* its value follows */
    }
    return 0;
}

/* The name of positional argument `index` in the command's usage line ("usage: qmm run [DIR] [--seed S]" gives
 * DIR for 0): the words after the command name that are not options, brackets stripped. */
static void positional_name(const command *c, size_t index, char *out, size_t size) {
    snprintf(out, size, "argument %zu", index + 1);
    const char *line = strstr(c->usage, "usage: qmm ");
    if (!line) return;
    line += strlen("usage: qmm ");
    const char *end = strchr(line, '\n');
    if (!end) end = line + strlen(line);
    size_t seen = 0;
    int first = 1;
    for (const char *p = line; p < end;) {
        while (p < end && *p == ' ') p++;
        const char *word = p;
        while (p < end && *p != ' ') p++;
        size_t length = (size_t)(p - word);
        if (length == 0) break;
        if (first) { /* the command's name */
            first = 0;
            continue;
        }
        if (word[0] == '[') word++, length--;
        while (length > 0 && (word[length - 1] == ']' || word[length - 1] == '.')) length--;
        if (length == 0 || word[0] == '-' || word[0] == '[') continue;
        if (seen++ == index) {
            snprintf(out, size, "%.*s", (int)length, word);
            return;
        }
    }
}

/* Splits argv into flags (--name VALUE or --name=VALUE) and positional arguments. Returns 0, the
 * usage-error exit code (2) after printing the reason, or QMM_HELP_SHOWN after printing the command's
 * usage to stdout (--help or -h where a flag may stand). */
int parse_args(const command *c, int argc, char **argv, const flag_spec *flags, size_t flag_count,
               const char **positional, size_t max_positional, size_t *positional_count) {
    *positional_count = 0;
    if (asks_for_help(argc, argv, flags, flag_count)) {
        fputs(c->usage, stdout);
        return QMM_HELP_SHOWN;
    }
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || arg[1] == '\0') {
            if (*positional_count == max_positional)
                return usage_error(c, "unexpected argument '%s' (at most %zu positional argument%s)", arg,
                                   max_positional, max_positional == 1 ? "" : "s");
            if (!arg[0]) { /* '' names no file or directory: never a path, never a value */
                char name[64];
                positional_name(c, *positional_count, name, sizeof name);
                return usage_error(c, "%s is empty ('')", name);
            }
            positional[(*positional_count)++] = arg;
            continue;
        }
        const char *value = NULL, *name = NULL;
        size_t length = 0;
        const flag_spec *match = find_flag(flags, flag_count, arg, &name, &length);
        if (!match) return usage_error(c, "unknown option '%s'", arg);
        if (arg[length] == '=') {
            if (match->switched) return usage_error(c, "%s takes no value", name);
            value = arg + length + 1;
        } else if (!match->switched) {
            if (i + 1 >= argc) return usage_error(c, "%s needs a value", name);
            value = argv[++i]; /* whatever it looks like: "--layer -h" names a layer "-h" */
        }
        if (match->switched) {
            if (*match->switched) return usage_error(c, "%s given twice", match->name);
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
int parse_unsigned(const char *text, unsigned long long min, unsigned long long max,
                   unsigned long long *out) {
    if (!text || text[0] < '0' || text[0] > '9') return 0;
    errno = 0;
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || value < min || value > max) return 0;
    *out = value;
    return 1;
}

int parse_seed(const command *c, const char *text, unsigned long long *seed) {
    if (!text || parse_unsigned(text, 0, ULLONG_MAX, seed)) return 0;
    return usage_error(c, "--seed '%s' is not an integer from 0 to %llu", text, ULLONG_MAX);
}

int parse_inject_fault(const command *c, unsigned long long *faults) {
    const char *inject = getenv("QMM_RUN_INJECT_FAULT");
    if (!inject || !inject[0] || parse_unsigned(inject, 0, 1000000, faults)) return 0;
    return usage_error(c, "QMM_RUN_INJECT_FAULT='%.64s' is not a whole number from 0 to 1000000", inject);
}

/* A format number (--bits, --group-size) as the other numbers parse (parse_unsigned: digits only), up to INT_MAX;
 * which values the format takes, the library's qmm_format_validate says. */
int parse_format_number(const char *text, int *out) {
    unsigned long long value;
    if (!parse_unsigned(text, 0, INT_MAX, &value)) return 0;
    *out = (int)value;
    return 1;
}

/* ───────────────────────────── small helpers ───────────────────────────── */

const char *whole_utf8(const char *text, char *buffer, size_t size) {
    if (!size) return buffer;
    snprintf(buffer, size, "%s", text);
    buffer[qmm_utf8_cut(buffer, strlen(buffer))] = '\0';
    return buffer;
}

int ends_with(const char *text, const char *suffix) {
    size_t a = strlen(text), b = strlen(suffix);
    return a >= b && strcmp(text + a - b, suffix) == 0;
}

const char *printable(const char *text, char *buffer, size_t size) {
    return qmm_printable(text, strlen(text), buffer, size);
}

void format_shape(char *out, size_t size, int ndim, const int64_t *shape) {
    size_t used = 0;
    used += (size_t)snprintf(out, size, "[");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(out + used, size - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used < size) snprintf(out + used, size - used, "]");
}

void format_format(char *out, size_t size, const qmm_qmatrix *m) {
    snprintf(out, size, "%d-bit gs%d %s", m->bits, m->group_size, qmm_dtype_name(m->dtype));
}

/* The UTF-8 code points of text (so "×" and "µ" count as one). */
int display_chars(const char *text) {
    int chars = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        if ((*p & 0xC0) != 0x80) chars++;
    return chars;
}

/* Prints text left-aligned in a column of `width` characters (display_chars), with at least one space after it. */
void print_cell(const char *text, int width) {
    int chars = display_chars(text);
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
qmm_status fill_random(uint64_t seed, void *x, qmm_dtype dtype, size_t count) {
    float *tmp = malloc(count * sizeof *tmp);
    if (!tmp) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu floats of random x", count);
    uint64_t state = seed;
    for (size_t i = 0; i < count; i++)
        tmp[i] = (float)(-1.0 + 2.0 * (double)(rng_next(&state) >> 11) * 0x1.0p-53);
    qmm_status status = qmm_convert(tmp, QMM_F32, x, dtype, count);
    free(tmp);
    return status;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double load_average(void) {
    const char *forced = getenv("QMM_TEST_LOAD_AVERAGE"); /* the tests' hook: a load to pretend */
    if (forced && *forced) return strtod(forced, NULL);
    double load = 0.0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load) != 1) load = 0.0;
        fclose(f);
    }
    return load;
}

/* The busy and total jiffies so far of the CPUs in `cpus` (the "cpuN" lines of /proc/stat: idle and iowait are not
 * busy — a container sees the host's CPUs there, so only those this process may run on count); false where they
 * cannot be read. */
static bool cores_jiffies(const cpu_set_t *cpus, unsigned long long *busy, unsigned long long *total) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return false;
    char line[512];
    int found = 0;
    *busy = *total = 0;
    while (fgets(line, sizeof line, f)) {
        int cpu;
        unsigned long long v[8] = {0};
        if (sscanf(line, "cpu%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7]) < 5 ||
            cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, cpus))
            continue;
        unsigned long long all = 0;
        for (int i = 0; i < 8; i++) all += v[i];
        *total += all;
        *busy += all - v[3] - v[4]; /* less idle and iowait */
        found++;
    }
    fclose(f);
    return found > 0;
}

/* This process's user + system jiffies so far (/proc/self/stat fields 14 and 15); false where unknown. */
static bool own_jiffies(unsigned long long *used) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return false;
    char line[1024];
    const bool read = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    const char *after = read ? strrchr(line, ')') : NULL; /* the command name may hold spaces and parentheses */
    unsigned long long utime, stime;
    if (!after || sscanf(after + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        return false;
    *used = utime + stime;
    return true;
}

double busy_cores_elsewhere(double seconds, int *cores) {
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) != 0 || CPU_COUNT(&cpus) < 1) return -1.0;
    *cores = CPU_COUNT(&cpus);
    const char *forced = getenv("QMM_TEST_BUSY_CORES"); /* the tests' hook: a number to pretend */
    if (forced && *forced) return strtod(forced, NULL);
    unsigned long long busy0, total0, own0, busy1, total1, own1;
    if (!cores_jiffies(&cpus, &busy0, &total0) || !own_jiffies(&own0)) return -1.0;
    const struct timespec pause = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&pause, NULL);
    if (!cores_jiffies(&cpus, &busy1, &total1) || !own_jiffies(&own1) || total1 <= total0) return -1.0;
    const double others = (double)(busy1 - busy0) - (double)(own1 - own0); /* jiffies of other processes */
    return (others > 0 ? others : 0.0) / (double)(total1 - total0) * (double)CPU_COUNT(&cpus);
}

bool competing_load(int threads, char *what, size_t size) {
    const char *forced = getenv("QMM_TEST_LOAD_AVERAGE");
    const double load = load_average();
    if (load > 0.5 * threads) {
        snprintf(what, size, "load average %.2f", load);
        return true;
    }
    if (forced && *forced) return false; /* the tests' pretended load alone decides */
    int cores = 0; /* busy elsewhere beyond the cores the team leaves free: a thread of it waits */
    const double busy = busy_cores_elsewhere(0.1, &cores);
    if (busy > (double)(cores > threads ? cores - threads : 0) + 0.5) {
        snprintf(what, size, "%.1f cores busy with other processes (sampled over 0.1 s)", busy);
        return true;
    }
    return false;
}

bool warn_if_loaded(const command *c, qmm_context *context) {
    const int threads = qmm_context_threads(context);
    char what[96];
    if (qmm_context_backend(context) == QMM_BACKEND_CUDA || threads <= 1 || !competing_load(threads, what, sizeof what))
        return false;
    /* not "qmm CMD: kind: message", the form of an error */
    fprintf(stderr, "qmm %s: %s with %d threads — a warning: other processes compete for the cores, "
            "so times may be far above the idle figures (a descheduled thread holds its team back); --threads 1 "
            "suffers least\n", c->name, what, threads);
    return true;
}

void print_scale_conversion(qmm_dtype stored, qmm_dtype dtype) {
    printf("note               scales/biases converted %s -> %s for --dtype %s (%s)\n", qmm_dtype_name(stored),
           qmm_dtype_name(dtype), qmm_dtype_name(dtype),
           dtype == QMM_F32 ? "exact: f32 holds every f16 and bf16 value" : "rounded once, to nearest even");
}

/* qsort order for doubles, ascending (every timing median of the CLI). */
int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The order auto tries, which is also the order qmm kernels lists. */
static const qmm_backend backend_order[] = {QMM_BACKEND_CUDA, QMM_BACKEND_CPU, QMM_BACKEND_REF};

int parse_backend(const command *c, const char *text, int *backend) {
    *backend = BACKEND_AUTO;
    if (!text || strcmp(text, "auto") == 0) return 0;
    for (size_t i = 0; i < sizeof backend_order / sizeof backend_order[0]; i++) {
        if (strcmp(text, qmm_backend_name(backend_order[i])) == 0) {
            *backend = (int)backend_order[i];
            return 0;
        }
    }
    return usage_error(c, "--backend '%s' is not auto, cuda, cpu or ref", text);
}

int parse_threads(const command *c, const char *text, int *threads) {
    unsigned long long value;
    *threads = 0;
    if (!text) return 0;
    const int limit = qmm_max_threads(); /* 8 × the CPUs online, at most QMM_MAX_THREADS (qmm.h) */
    if (!parse_unsigned(text, 1, (unsigned long long)limit, &value))
        return usage_error(c, "--threads '%s' is not a whole number from 1 to %d (8 x the CPUs online)", text, limit);
    *threads = (int)value;
    return 0;
}

qmm_status apply_threads(qmm_context *context, int threads) {
    if (threads <= 0) return QMM_OK;
    qmm_status status = qmm_context_set_threads(context, threads);
    if (status != QMM_OK) {
        char reason[512];
        snprintf(reason, sizeof reason, "%s", qmm_last_error());
        status = qmm_error(status, "--threads %d: %s", threads, reason);
    }
    return status;
}

/* --backend auto meeting a backend that is here but was asked for wrongly (a CUDA knob outside its rule,
 * docs/kernels.md §12): the error, not the next backend. */
static qmm_status auto_stop(qmm_backend backend) {
    char reason[512];
    snprintf(reason, sizeof reason, "%s", qmm_last_error());
    return qmm_error(QMM_ERR_INVALID_ARGUMENT, "--backend auto: %s: %s", qmm_backend_name(backend), reason);
}

qmm_status open_context(int backend, qmm_context **context) {
    *context = NULL;
    if (backend == BACKEND_AUTO) {
        qmm_status status = QMM_OK;
        for (size_t i = 0; i < sizeof backend_order / sizeof backend_order[0]; i++) {
            status = qmm_context_create(backend_order[i], 0, context);
            if (status == QMM_OK) return QMM_OK;
            if (status == QMM_ERR_INVALID_ARGUMENT) return auto_stop(backend_order[i]);
        }
        return status; /* not reached while the reference backend is built in */
    }
    qmm_status status = qmm_context_create((qmm_backend)backend, 0, context);
    if (status != QMM_OK) {
        /* The library names the backend and why; say which option asked for it and what else to do. */
        char reason[512];
        snprintf(reason, sizeof reason, "%s", qmm_last_error());
        status = status == QMM_ERR_INVALID_ARGUMENT
                     ? qmm_error(status, "--backend %s: %s", qmm_backend_name((qmm_backend)backend), reason)
                     : qmm_error(status, "--backend %s: %s ('qmm kernels' lists the backends available here; "
                                         "--backend auto takes the first of them)",
                                 qmm_backend_name((qmm_backend)backend), reason);
    }
    return status;
}

qmm_status load_tuning_option(qmm_context *context, const char *path, char *note, size_t size) {
    qmm_status status = qmm_context_load_tuning(context, path);
    if (status != QMM_OK) return status;
    size_t other_device = 0, unknown_kernel = 0;
    size_t in_use = qmm_context_tuning_count(context, &other_device, &unknown_kernel);
    char shown[PRINTABLE_SIZE]; /* the note goes into bench's JSON too: valid UTF-8 */
    int used = snprintf(note, size, "tuning table %s: %zu entr%s in use", printable(path, shown, sizeof shown), in_use,
                        in_use == 1 ? "y" : "ies");
    if (other_device && used >= 0 && (size_t)used < size)
        used += snprintf(note + used, size - (size_t)used, "; %zu set aside: measured on another device than \"%s\"",
                         other_device, qmm_context_device(context));
    if (unknown_kernel && used >= 0 && (size_t)used < size)
        snprintf(note + used, size - (size_t)used, "; %zu set aside: naming a kernel this build lacks", unknown_kernel);
    return QMM_OK;
}

static bool has_op(const qmm_context *context, qmm_op op, int batch_invariant) {
    qmm_kernel_info info;
    for (size_t i = 0; i < qmm_kernel_count(context); i++)
        if (qmm_kernel_get(context, i, &info) == QMM_OK && info.op == op &&
            (!batch_invariant || info.batch_invariant_order))
            return true;
    return false;
}

qmm_status open_context_for(int backend, qmm_op op, int batch_invariant, qmm_context **context) {
    if (backend != BACKEND_AUTO) return open_context(backend, context);
    *context = NULL;
    qmm_status status = QMM_OK;
    for (size_t i = 0; i < sizeof backend_order / sizeof backend_order[0]; i++) {
        if ((status = qmm_context_create(backend_order[i], 0, context)) == QMM_ERR_INVALID_ARGUMENT)
            return auto_stop(backend_order[i]);
        if (status != QMM_OK) continue;
        if (has_op(*context, op, batch_invariant)) return QMM_OK;
        qmm_context_destroy(*context);
        *context = NULL;
    }
    return qmm_error(QMM_ERR_UNSUPPORTED, "--backend auto: no backend built here has a %s kernel%s", qmm_op_name(op),
                     batch_invariant ? " with a batch-invariant order" : "");
}

/* ───────────────────────────── one product, checked and timed ───────────────────────────── */

/* Runs out = x·Ŵᵀ (x: M×K of matrix->dtype) through the runtime — kernel forced when `kernel` is not
 * NULL, else the selector's choice, with qmm_matmul_options.batch_invariant = batch_invariant — compares every output with qmm_ref_dense_f64 (the same x, the
 * same scales) under qmm_output_check (the bound with the kernel's documented slack; ±inf where the exact
 * value rounds beyond the dtype's range), then times the product with a chain for about `time_budget`
 * seconds (at least 3 runs, median) after as long an untimed warm-up. inject_fault changes one output element
 * before the comparison (the QMM_RUN_INJECT_FAULT test hook). With batch_invariant, up to
 * INVARIANT_SAMPLES rows (all of them when M is smaller; else evenly spaced, first and last included) are
 * also computed alone (M = 1, the same options) and compared bit for bit with the same rows of the product. */
static qmm_status check_invariance(qmm_context *context, qmm_weights *weights, const qmm_qmatrix *matrix,
                                   const void *x, size_t M, const qmm_matmul_options *options, const void *out_host,
                                   layer_result *result) {
    const size_t N = matrix->rows, K = matrix->cols, element = qmm_dtype_size(matrix->dtype);
    qmm_buffer *x_row = NULL, *out_row = NULL;
    unsigned char *alone = malloc(N * element);
    qmm_status status = alone ? QMM_OK : qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate one output row");
    if (status == QMM_OK) status = qmm_buffer_create(context, matrix->dtype, K, &x_row);
    if (status == QMM_OK) status = qmm_buffer_create(context, matrix->dtype, N, &out_row);
    for (size_t s = 0; status == QMM_OK && s < invariant_samples(M); s++) {
        const size_t row = invariant_sample(s, M);
        if ((status = qmm_buffer_write(x_row, (const unsigned char *)x + row * K * element, K)) != QMM_OK) break;
        if ((status = qmm_buffer_poison(out_row)) != QMM_OK) break;
        if ((status = qmm_matmul(context, weights, x_row, 1, out_row, options, NULL)) != QMM_OK) break;
        if ((status = qmm_buffer_read(out_row, alone, N)) != QMM_OK) break;
        result->invariant_checked++;
        if (memcmp(alone, (const unsigned char *)out_host + row * N * element, N * element) != 0) {
            if (result->invariant_differ == 0) result->first_differ = row;
            result->invariant_differ++;
        }
    }
    qmm_buffer_destroy(x_row);
    qmm_buffer_destroy(out_row);
    free(alone);
    return status;
}

/* The first non-finite element of array (count elements of dtype: row `row` of a matrix with `cols` columns), as
 * "NAME[row, j] is V" in buffer; false when every element is finite. Only on the error path: one element at a time. */
static bool first_non_finite(const char *name, const void *array, qmm_dtype dtype, size_t count, size_t row,
                             size_t cols, char *buffer, size_t size) {
    const size_t element = qmm_dtype_size(dtype);
    for (size_t i = 0; i < count; i++) {
        float value;
        if (qmm_convert((const unsigned char *)array + i * element, dtype, &value, QMM_F32, 1) != QMM_OK) return false;
        if (!isfinite(value)) {
            snprintf(buffer, size, "%s[%zu, %zu] is %g", name, row + i / cols, i % cols, (double)value);
            return true;
        }
    }
    return false;
}

qmm_status check_product(qmm_context *context, const qmm_qmatrix *matrix, const void *x, size_t M,
                         const char *kernel, int batch_invariant, double time_budget, int inject_fault,
                         layer_result *result) {
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

    qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = kernel, .batch_invariant = batch_invariant};
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
    if (batch_invariant &&
        (status = check_invariance(context, weights, matrix, x, M, &options, out_host, result)) != QMM_OK)
        goto cleanup;
    if ((status = qmm_convert(out_host, matrix->dtype, got, QMM_F32, count_out)) != QMM_OK) goto cleanup;
    if (inject_fault) got[0] += 1.0f + fabsf(got[0]); /* test hook: an error far outside any bound */

    if ((status = qmm_ref_dense_f64(matrix, x, M, 1, exact, abs_dot)) != QMM_OK) goto cleanup;
    /* The f64 sum of finite f32/f16/bf16 products cannot overflow, so a non-finite exact value means a NaN
     * or Inf in the input; comparing against it would blame the kernel ("outside bound") for bad input. */
    for (size_t i = 0; i < count_out; i++) {
        if (!isfinite(exact[i])) {
            /* name the first non-finite input: x as the product reads it (rounded to the dtype: a value beyond f16's
             * range is inf there), then the row's scales and biases */
            char culprit[96] = "";
            const size_t groups = K / (size_t)matrix->group_size, m = i / N, n = i % N;
            const void *x_row = (const unsigned char *)x + m * K * element;
            const void *row_scales = (const unsigned char *)matrix->scales + n * groups * element;
            const void *row_biases = (const unsigned char *)matrix->biases + n * groups * element;
            if (!first_non_finite("x", x_row, matrix->dtype, K, m, K, culprit, sizeof culprit) &&
                !first_non_finite("scales", row_scales, matrix->dtype, groups, n, groups, culprit, sizeof culprit) &&
                !first_non_finite("biases", row_biases, matrix->dtype, groups, n, groups, culprit, sizeof culprit))
                snprintf(culprit, sizeof culprit, "an input is NaN or Inf");
            status = qmm_error(QMM_ERR_NUMERIC,
                               "the exact output at row %zu, column %zu is %g: %s (in %s); the product is checked only "
                               "for finite inputs",
                               m, n, exact[i], culprit, qmm_dtype_name(matrix->dtype));
            goto cleanup;
        }
    }
    double slack = result->kernel.tolerance_slack > 0 ? result->kernel.tolerance_slack : 1.0;
    for (size_t i = 0; i < count_out; i++) {
        /* The one verdict (qmm_output_check, docs/kernels.md §6): within the bound, or ±inf where correct
         * rounding of the exact value to the output dtype overflows (the value is beyond its range). */
        double ratio;
        int ok = qmm_output_check(K, matrix->dtype, (double)got[i], exact[i], abs_dot[i], slack, &ratio);
        if (ok && isinf(got[i])) {
            result->overflowed++; /* right, and no finite |error| to report */
        } else {
            double error = fabs((double)got[i] - exact[i]);
            if (isnan(error)) error = INFINITY;
            if (error > result->max_abs_error) result->max_abs_error = error;
        }
        if (fabs(exact[i]) > result->max_exact) result->max_exact = fabs(exact[i]);
        if (ratio > result->worst_ratio) result->worst_ratio = ratio;
        if (!ok) {
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
    /* Warm-up, untimed, as long as the timing itself (at least one run): the first runs pay for waking
     * (or creating) the CPU backend's thread team, and on some machines the OS takes tens of milliseconds
     * to move a new worker off its master's core — each run of that window costs a scheduler slice (8 ms
     * measured on a 2-core VM), which became the reported median of the first layer in most runs of
     * `qmm run` there (a fifth of the budget as warm-up was not enough; as long as the budget was). */
    double start = now_seconds();
    do {
        if ((status = qmm_chain_run(chain)) != QMM_OK) goto cleanup;
    } while (now_seconds() - start < time_budget);
    start = now_seconds();
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

/* check_product's arrays at their peak, the timing runs after the oracle (every array still held, the kernel running
 * again), or the oracle's own scratch if larger; the caller's x and, on a host backend, the runtime's copies. */
static double product_host_bytes(const qmm_qmatrix *matrix, qmm_dtype dtype, size_t M, qmm_backend backend) {
    const double N = (double)matrix->rows, K = (double)matrix->cols, rows = (double)M;
    const double element = (double)qmm_dtype_size(dtype);
    const double groups = N * (double)qmm_groups(matrix->cols, matrix->group_size);
    const double weights = N * (double)qmm_packed_words(matrix->cols, matrix->bits) * 4.0 + 2.0 * groups * element;
    /* x; the output read back (dtype), as f32, and the f64 oracle's values and sums of |terms| */
    double held = rows * K * element + rows * N * (element + 4.0 + 8.0 + 8.0);
    /* the runtime's weights and x and out buffers live in host memory on the ref and cpu backends */
    if (backend != QMM_BACKEND_CUDA) held += weights + rows * K * element + rows * N * element;
    /* while a kernel runs, a tiled CPU row's f32 copy of x (xᵀ, simd_kernels.h); before, the oracle's scratch
     * (qmm_ref_dense_f64: 32 rows of x and of |x|, one decoded row and its |ŵ|, in f64) */
    const double kernel_scratch = backend == QMM_BACKEND_CPU ? rows * K * 4.0 : 0.0;
    const double oracle_scratch = (2.0 * 32.0 + 2.0) * K * 8.0;
    return held + (kernel_scratch > oracle_scratch ? kernel_scratch : oracle_scratch);
}

qmm_status check_product_fits(qmm_context *context, const char *name, const qmm_qmatrix *matrix, qmm_dtype dtype,
                              size_t M, double extra, const char *advice) {
    const qmm_backend backend = qmm_context_backend(context);
    char subject[PRINTABLE_SIZE + 96];
    snprintf(subject, sizeof subject, "layer '%s' (N=%zu, K=%zu) at M=%zu in %s", name, matrix->rows, matrix->cols, M,
             qmm_dtype_name(dtype));
    return check_host_memory(product_host_bytes(matrix, dtype, M, backend) + extra, subject,
                             backend != QMM_BACKEND_CUDA
                                 ? "x, the output, its f64 oracle, the weights and the backend's buffers"
                                 : "x, the output and its f64 oracle",
                             advice);
}

/* ───────────────────────────── activations ───────────────────────────── */

qmm_status activation_rows(const qmm_tensor *tensor, size_t K, size_t M, size_t *rows) {
    char name[PRINTABLE_SIZE]; /* from a file */
    printable(tensor->name, name, sizeof name);
    if (!qmm_is_float_dtype(tensor->dtype))
        return qmm_error(QMM_ERR_FORMAT, "activation tensor '%s' has dtype %s, want f32, f16 or bf16", name,
                         qmm_dtype_name(tensor->dtype));
    int64_t last = tensor->ndim >= 1 ? tensor->shape[tensor->ndim - 1] : 0;
    int64_t T = tensor->ndim == 2 ? tensor->shape[0] : 1;
    if ((tensor->ndim != 1 && tensor->ndim != 2) || last != (int64_t)K || T < 1) {
        char shape[128];
        format_shape(shape, sizeof shape, tensor->ndim, tensor->shape);
        return qmm_error(QMM_ERR_SHAPE, "activation tensor '%s' has shape %s, want [T, K=%zu] with T >= 1 (or [K=%zu]: T = 1)",
                         name, shape, K, K);
    }
    if (M == 0 && T > MAX_M) /* -m is capped at MAX_M; all T rows must not bypass the cap */
        return qmm_error(QMM_ERR_SHAPE, "activation tensor '%s' has T=%lld rows, more than the %d one product may use "
                         "(qmm matmul -m M takes the first M)", name, (long long)T, MAX_M);
    if (M > (size_t)T)
        return qmm_error(QMM_ERR_SHAPE, "-m %zu asks for more rows than activation tensor '%s' has (T=%lld)", M,
                         name, (long long)T);
    *rows = M ? M : (size_t)T;
    return QMM_OK;
}

/* Copies the first M rows of a float tensor [T, K] (or [K] as one row) into x (dtype), rounding once.
 * *rows receives the row count. Errors name the tensor and the disagreement. */
qmm_status load_activation(const qmm_tensor *tensor, size_t K, qmm_dtype dtype, size_t M, void **x,
                           size_t *rows) {
    *x = NULL;
    qmm_status status = activation_rows(tensor, K, M, &M);
    if (status != QMM_OK) return status;
    size_t count, bytes;
    if (!qmm_mul_size(M, K, &count) || !qmm_mul_size(count, qmm_dtype_size(dtype), &bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "M=%zu × K=%zu overflows size_t", M, K);
    *x = malloc(bytes);
    if (!*x) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of x", bytes);
    status = qmm_convert(tensor->data, tensor->dtype, *x, dtype, count);
    if (status != QMM_OK) {
        free(*x);
        *x = NULL;
        return status;
    }
    *rows = M;
    return QMM_OK;
}

/* A copy of matrix with scales and biases converted to dtype (the new arrays are malloc'd, returned in scales and biases). */
qmm_status convert_scales(const qmm_qmatrix *matrix, qmm_dtype dtype, qmm_qmatrix *converted,
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

/* ───────────────────────────── host memory ───────────────────────────── */

double host_memory_available(void) {
    const char *forced = getenv("QMM_TEST_MEM_AVAILABLE"); /* the tests' hook: bytes to pretend */
    if (forced && *forced) return strtod(forced, NULL);
    FILE *file = fopen("/proc/meminfo", "r");
    if (!file) return 0.0;
    char line[256];
    double kib = 0.0;
    while (fgets(line, sizeof line, file))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
    fclose(file);
    return kib * 1024.0;
}

qmm_status check_host_memory(double needed, const char *subject, const char *held, const char *advice) {
    const double available = host_memory_available();
    if (available <= 0.0 || needed <= available) return QMM_OK; /* fits, or nothing to compare with */
    /* Both sizes in the unit of the available one (under a GiB, "~0.0 GiB, more than the 0.0 GiB available" named
     * neither), with as many decimals as it takes to tell them apart. */
    static const struct { double bytes; const char *name; } units[] = {
        {1073741824.0, "GiB"}, {1048576.0, "MiB"}, {1024.0, "KiB"}, {1.0, "bytes"}};
    size_t u = 0;
    while (u + 1 < sizeof units / sizeof units[0] && available < units[u].bytes) u++;
    char needed_text[64], available_text[64];
    for (int digits = units[u].bytes > 1.0 ? 1 : 0; digits <= 10; digits++) {
        snprintf(needed_text, sizeof needed_text, "%.*f %s", digits, needed / units[u].bytes, units[u].name);
        snprintf(available_text, sizeof available_text, "%.*f %s", digits, available / units[u].bytes, units[u].name);
        if (strcmp(needed_text, available_text) != 0) break;
    }
    return qmm_error(QMM_ERR_OUT_OF_MEMORY,
                     "%s would hold ~%s of host memory at once (%s), more than the %s available "
                     "(MemAvailable in /proc/meminfo): %s",
                     subject, needed_text, held, available_text, advice);
}

/* ───────────────────────────── OUTDIR of convert and quantize ───────────────────────────── */

/* Checked here, before minutes of quantizing, rather than found by the writer at the end. A checkpoint
 * already in OUTDIR is replaced only when asked (--force): a slip of the OUTDIR argument would otherwise
 * overwrite, say, the fixture. The stale-shard rule is the writer's (qmm_checkpoint_write), applied early. */
int check_outdir(const command *c, const char *dir, int force) {
    static const char *const names[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    char path[PATH_MAX];
    struct stat info;
    if (!dir[0]) return usage_error(c, "OUTDIR is empty");
    if (strlen(dir) > PATH_MAX - 64) return usage_error(c, "OUTDIR is longer than %d bytes", PATH_MAX - 64);
    if (stat(dir, &info) != 0) {
        if (errno != ENOENT && errno != ENOTDIR) /* ENOTDIR: a parent is a file, said below */
            return library_error(c, qmm_error(QMM_ERR_IO, "cannot use OUTDIR '%s': %s", dir, strerror(errno)));
        /* Only OUTDIR itself is created, so its parent must be an existing, writable directory. */
        snprintf(path, sizeof path, "%s", dir);
        size_t length = strlen(path);
        while (length > 1 && path[length - 1] == '/') path[--length] = '\0';
        /* ... and OUTDIR itself must not exist in some other form: "afile/" (a file, named with a slash) or a
         * symbolic link to nowhere, which stat() reports as missing but mkdir() would refuse after all the work */
        if (lstat(path, &info) == 0) {
            if (S_ISLNK(info.st_mode))
                return library_error(c, qmm_error(QMM_ERR_IO, "OUTDIR '%s' is a symbolic link to nothing (its target "
                                                  "does not exist): name a directory or a new path", dir));
            return library_error(c, qmm_error(QMM_ERR_IO, "OUTDIR '%s' exists and is not a directory", dir));
        }
        char *slash = strrchr(path, '/');
        if (!slash) snprintf(path, sizeof path, ".");
        else if (slash == path) path[1] = '\0';
        else *slash = '\0';
        if (stat(path, &info) != 0) {
            int err = errno;
            return library_error(c, qmm_error(err == ENOENT ? QMM_ERR_NOT_FOUND : QMM_ERR_IO,
                                              "OUTDIR '%s' cannot be created: its parent '%s' %s", dir, path,
                                              err == ENOENT ? "does not exist" : strerror(err)));
        }
        if (!S_ISDIR(info.st_mode))
            return library_error(c, qmm_error(QMM_ERR_IO, "OUTDIR '%s' cannot be created: its parent '%s' is not a directory",
                                              dir, path));
        if (access(path, W_OK | X_OK) != 0)
            return library_error(c, qmm_error(QMM_ERR_IO, "OUTDIR '%s' cannot be created in '%s': %s", dir, path,
                                              strerror(errno)));
        /* access() can say yes where mkdir() says no (root in /sys or /proc, a read-only mount): tried once now,
         * and removed — the writer creates it again at the end */
        if (mkdir(dir, 0777) != 0)
            return library_error(c, qmm_error(QMM_ERR_IO, "OUTDIR '%s' cannot be created: %s", dir, strerror(errno)));
        rmdir(dir);
        return 0;
    }
    if (!S_ISDIR(info.st_mode))
        return library_error(c, qmm_error(QMM_ERR_IO, "OUTDIR '%s' exists and is not a directory", dir));
    if (access(dir, W_OK | X_OK) != 0)
        return library_error(c, qmm_error(QMM_ERR_IO, "OUTDIR '%s' is not writable: %s", dir, strerror(errno)));
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (lstat(path, &info) != 0) continue;
        if (!force)
            return library_error(c, qmm_error(QMM_ERR_INVALID_ARGUMENT,
                                              "OUTDIR '%s' already holds a checkpoint (%s); pass --force to replace it",
                                              dir, names[i]));
        /* config.json and model.safetensors (names[0], [1]: the files the writer replaces) as what the writer's
         * qmm_atomic_begin would refuse after the work */
        if (i < 2 && !S_ISREG(info.st_mode) && !S_ISLNK(info.st_mode))
            return library_error(c, qmm_error(QMM_ERR_IO, "OUTDIR '%s' holds %s as %s, which --force does not replace "
                                              "(a regular file or a symbolic link would be)",
                                              dir, names[i], qmm_file_kind(info.st_mode)));
    }
    DIR *listing = opendir(dir);
    if (!listing) return library_error(c, qmm_error(QMM_ERR_IO, "cannot list OUTDIR '%s': %s", dir, strerror(errno)));
    const struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        const char *name = entry->d_name;
        if (strcmp(name, "model.safetensors.index.json") == 0 ||
            (strncmp(name, "model", 5) == 0 && ends_with(name, ".safetensors") && strcmp(name, "model.safetensors") != 0)) {
            qmm_status status = qmm_error(QMM_ERR_INVALID_ARGUMENT,
                                          "OUTDIR '%s' holds '%s', which a reader would mix with the new "
                                          "model.safetensors (--force replaces only config.json and model.safetensors); "
                                          "remove it or write into a new directory",
                                          dir, name);
            closedir(listing);
            return library_error(c, status);
        }
    }
    closedir(listing);
    return 0;
}

/* ───────────────────────────── output files (bench --json, tune --out) ───────────────────────────── */

/* An existing path that is not a regular file: refused with a message naming it and what it is. */
static qmm_status refuse_non_regular(const char *option, const char *path, int *refused) {
    struct stat info;
    *refused = 0;
    if (lstat(path, &info) != 0 || S_ISREG(info.st_mode)) return QMM_OK;
    *refused = 1;
    if (S_ISDIR(info.st_mode))
        return qmm_error(QMM_ERR_IO, "%s '%s' is a directory (want a file path)", option, path);
    return qmm_error(QMM_ERR_IO,
                     "%s '%s' exists and is %s, not a regular file: writing the results would replace it; name a "
                     "regular file or a new path", option, path, qmm_file_kind(info.st_mode));
}

int check_output_file(const command *c, const char *option, const char *path) {
    if (!path[0]) return usage_error(c, "%s is empty (want a file path)", option);
    if (strlen(path) >= PATH_MAX - 32) return usage_error(c, "%s is longer than %d bytes", option, PATH_MAX - 32);
    int refused;
    qmm_status status = refuse_non_regular(option, path, &refused);
    if (refused) return library_error(c, status);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    struct stat info;
    if (stat(dir, &info) != 0 || !S_ISDIR(info.st_mode))
        return library_error(c, qmm_error(QMM_ERR_NOT_FOUND, "%s '%s': '%s' %s", option, path, dir,
                                          stat(dir, &info) == 0 ? "is not a directory" : "does not exist"));
    if (access(dir, W_OK | X_OK) != 0)
        return library_error(c, qmm_error(QMM_ERR_IO, "%s '%s': directory '%s' is not writable: %s", option, path, dir,
                                          strerror(errno)));
    /* access() says yes to root everywhere, and a file system may still refuse a new file (/proc): create the
     * temporary file the write will use, then remove it, so that a long run is not lost at its end. */
    qmm_atomic_file probe = QMM_ATOMIC_FILE_NONE;
    qmm_status probed = qmm_atomic_begin(&probe, path);
    qmm_atomic_abort(&probe);
    if (probed != QMM_OK)
        return library_error(c, qmm_error(QMM_ERR_IO, "%s '%s': cannot write there (checked before the work): %s",
                                          option, path, qmm_last_error()));
    return 0;
}

qmm_status write_output_file(const char *option, const char *path, const void *bytes, size_t size) {
    qmm_atomic_file file = QMM_ATOMIC_FILE_NONE;
    int refused = 0;
    qmm_status status = qmm_atomic_begin(&file, path);
    if (status == QMM_OK) status = qmm_atomic_write(&file, bytes, size);
    if (status == QMM_OK) status = qmm_atomic_finish(&file);
    if (status == QMM_OK) status = refuse_non_regular(option, path, &refused);
    if (status == QMM_OK) status = qmm_atomic_rename(&file);
    qmm_atomic_abort(&file);
    if (status != QMM_OK && !refused) /* the refusal names option and path already */
        status = qmm_error(status, "cannot write %s '%s': %s", option, path, qmm_last_error());
    return status;
}
