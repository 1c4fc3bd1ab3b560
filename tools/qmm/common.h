/*
 * common.h — what the qmm commands share (common.c): the command type, usage and library errors, flag
 * parsing, small helpers, the backend choice and one checked and timed product. Each command is one
 * file (info.c, convert.c, ...) exposing one cmd_<name>; main.c holds the command table.
 */
#ifndef QMM_TOOLS_COMMON_H
#define QMM_TOOLS_COMMON_H

#include "qmm.h"
#include "internal.h" /* qmm_error (CLI-level errors share the library's message format), qmm_mul_size */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifndef QMM_SOURCE_DIR
#define QMM_SOURCE_DIR "."
#endif
/* QMM_SOURCE_DIR from the environment, else the build's source directory (the fixture under data/, bench/shapes/,
 * bench/peers/): the environment names the tree where a binary runs away from the one it was built in. */
const char *source_dir(void);

/* The embedded real-model fixture (data/NOTICE says what it is and how tools/make_fixture.sh makes it). */
#define FIXTURE_NAME "smollm2-135m-block0"
/* Rows of seeded random x when a layer has no recorded activations (the fixture has 16 tokens). */
#define RANDOM_ROWS 16
/* -m is capped so that x, out and the f64 oracle's two arrays stay within a few GB for real layers. */
#define MAX_M 65536
#define DEFAULT_SEED 42

/* ───────────────────────────── commands, usage and errors ───────────────────────────── */

/* Exit codes, the CLI's contract with scripts (`qmm help` prints them; tests/cli/exit_codes.sh checks each). */
enum {
    QMM_EXIT_OK = 0,
    QMM_EXIT_ERROR = 1, /* a library or run-time error: a file that is missing or broken, an unusable OUTDIR, a
                           layer or kernel name the checkpoint or backend does not have, a backend that is absent */
    QMM_EXIT_USAGE = 2, /* bad command-line input: unknown command or option, missing or malformed value, a value
                           outside its rule (--bits 7), found before any work is done */
    QMM_EXIT_FAIL = 3,  /* the product ran, but some outputs are outside the error bound (qmm matmul, qmm run) */
};
/* parse_args' answer when --help or -h was given and the usage is printed: not an exit code; main exits 0. */
#define QMM_HELP_SHOWN (-1)

typedef struct command {
    const char *name;
    const char *summary;
    const char *usage; /* the full --help text */
    int (*run)(const struct command *self, int argc, char **argv);
} command;

/* The commands (one file each). argv holds the arguments after the command name. Each returns the exit code. */
int cmd_info(const command *self, int argc, char **argv);
int cmd_convert(const command *self, int argc, char **argv);
int cmd_quantize(const command *self, int argc, char **argv);
int cmd_matmul(const command *self, int argc, char **argv);
int cmd_gather(const command *self, int argc, char **argv);
int cmd_run(const command *self, int argc, char **argv);
int cmd_kernels(const command *self, int argc, char **argv);
int cmd_bench(const command *self, int argc, char **argv);
int cmd_tune(const command *self, int argc, char **argv);

/* Prints "qmm CMD: usage error: ..." and a hint to stderr (the message through put_terminal_safe, whole); returns
 * QMM_EXIT_USAGE. */
int usage_error(const command *c, const char *format, ...) QMM_PRINTF(2, 3);
/* A failing library call (or a CLI-level check that set the message with qmm_error): prints
 * "qmm CMD: STATUS: message" to stderr (the message through put_terminal_safe); returns QMM_EXIT_ERROR. */
int library_error(const command *c, qmm_status status);
/* text to stream with every byte that is not part of a printable UTF-8 character (qmm_printable_char: control
 * characters, invalid UTF-8, bidirectional controls) as \xNN — a message that quotes the caller's arguments or paths
 * (an escape sequence pasted into one would otherwise reach the terminal as typed). Backslashes stay as they are, so
 * text already escaped by printable() (file names in the library's messages) is shown once, not twice. */
void put_terminal_safe(FILE *stream, const char *text);
/* The next piece of text[0, size) as put_terminal_safe shows it: *piece, *piece_size (the printable character itself,
 * or escaped[] holding "\xNN" for a byte that is not part of one); returns the bytes of text it stands for. */
size_t terminal_piece(const char *text, size_t size, char escaped[5], const char **piece, size_t *piece_size);
/* The formatted text, whole, through put_terminal_safe to stream (text that names a path or an argument; a newline
 * in it would be escaped too: the caller ends the line). Where memory for it cannot be had, unescaped rather than
 * cut. */
void fprint_safe(FILE *stream, const char *format, ...) QMM_PRINTF(2, 3);
/* fprint_safe, then the newline that ends the line. */
void fprint_safe_line(FILE *stream, const char *format, ...) QMM_PRINTF(2, 3);

/* ───────────────────────────── argument parsing ───────────────────────────── */

/* One flag of a command. Single-valued flags store their text in *value; repeatable flags (values != NULL)
 * append to values[*count]; switches (switched != NULL, starting at 0) take no value and set *switched = 1.
 * A single-valued flag or a switch given twice is a usage error ("--force given twice"). Values are parsed
 * afterwards. */
typedef struct flag_spec {
    const char *name;  /* "--bits" */
    const char *alias; /* "-m", or NULL */
    const char **value;
    const char **values;
    size_t *count;
    size_t capacity;
    int *switched;
} flag_spec;

/* Splits argv into flags (--name VALUE or --name=VALUE) and positional arguments. A flag's value is the
 * next argument whatever it looks like ("--layer -h"). An empty positional argument ('') is a usage error
 * naming it as c->usage does ("DIR is empty ('')"). Returns 0; QMM_EXIT_USAGE after printing the
 * reason; or QMM_HELP_SHOWN after printing c->usage when --help or -h stands where a flag may stand. */
int parse_args(const command *c, int argc, char **argv, const flag_spec *flags, size_t flag_count,
               const char **positional, size_t max_positional, size_t *positional_count);
/* Whether text is a whole decimal number in [min, max] (no sign, no spaces, no suffix). */
int parse_unsigned(const char *text, unsigned long long min, unsigned long long max, unsigned long long *out);
/* --seed S (text NULL: *seed keeps its default): a whole number from 0 to ULLONG_MAX; returns 0 or QMM_EXIT_USAGE
 * after the usage error. */
int parse_seed(const command *c, const char *text, unsigned long long *seed);
/* The QMM_RUN_INJECT_FAULT test hook (unset or empty: *faults keeps its default): a whole number from 0 to 1000000;
 * returns 0 or QMM_EXIT_USAGE after the usage error (matmul, gather, run). */
int parse_inject_fault(const command *c, unsigned long long *faults);
/* --bits or --group-size: digits only (as parse_unsigned), up to INT_MAX, into *out; 0 where text is not such a number
 * (the caller's usage error names the format's set; which values it takes, qmm_format_validate says). */
int parse_format_number(const char *text, int *out);

/* ───────────────────────────── small helpers ───────────────────────────── */

int ends_with(const char *text, const char *suffix);
/* text into buffer[size] without a UTF-8 character cut at its end (text cut by snprintf, which counts bytes).
 * Returns buffer. */
const char *whole_utf8(const char *text, char *buffer, size_t size);
/* Untrusted text — a tensor or layer name from a file (or given to match one), a line a peer script printed — made
 * safe for the terminal: the library's qmm_printable (internal.h) into buffer[size], printable UTF-8 kept, control
 * characters, invalid UTF-8 and backslashes escaped (\x1b, \\), "..." where cut. Returns buffer. */
const char *printable(const char *text, char *buffer, size_t size);
#define PRINTABLE_SIZE 512
/* "[d0, d1, ...]" */
void format_shape(char *out, size_t size, int ndim, const int64_t *shape);
/* "4-bit gs32 f16" */
void format_format(char *out, size_t size, const qmm_qmatrix *m);
/* The characters of UTF-8 text (its code points: the table's text has no wide or combining ones). */
int display_chars(const char *text);
/* Prints text left-aligned in a column of `width` characters (UTF-8 aware), at least one space after it. */
void print_cell(const char *text, int width);
/* count values uniform in [-1, 1) from a splitmix64 stream seeded with seed, rounded to dtype. */
qmm_status fill_random(uint64_t seed, void *x, qmm_dtype dtype, size_t count);
/* CLOCK_MONOTONIC in seconds. */
double now_seconds(void);
/* The 1-minute load average (/proc/loadavg), or 0 where it cannot be read; QMM_TEST_LOAD_AVERAGE=x pretends x
 * (tests). */
double load_average(void);
/* Cores' worth of time other processes used over `seconds` on the `cores` this process may run on (sampled now:
 * /proc/stat less this process's own time), or −1 where /proc cannot say; QMM_TEST_BUSY_CORES=x pretends x (tests). */
double busy_cores_elsewhere(double seconds, int *cores);
/* Whether other work competes with `threads` threads: the load average over half of them, or (the average is a
 * minute long: a single busy core at a load of 1 passed under it) more than half a core busy elsewhere over 0.1 s
 * beyond the cores the threads leave free;
 * what says which ("load average 2.10", "1.0 cores busy with other processes …"). With QMM_TEST_LOAD_AVERAGE set,
 * that load alone decides (tests). */
bool competing_load(int threads, char *what, size_t size);
/* For the commands that print host-timed CPU products (run, matmul, gather, tune): a warning on stderr when other
 * work competes for the context's threads (competing_load; and it has more than one) — a thread of the team
 * descheduled inside a product holds the others back by a scheduler slice, so times can read milliseconds. No-op on
 * CUDA. Returns whether it warned (qmm run repeats it under its table, where the times are read). */
bool warn_if_loaded(const command *c, qmm_context *context);
/* The "note" line of qmm matmul and qmm gather when --dtype converts the layer's scales and biases. */
void print_scale_conversion(qmm_dtype stored, qmm_dtype dtype);
/* qsort order for doubles, ascending (the medians of every timing in the CLI). */
int compare_doubles(const void *a, const void *b);

/* --backend auto|cuda|cpu|ref: a qmm_backend, or BACKEND_AUTO = the first of cuda, cpu, ref whose context can
 * be created. parse_backend reads the option's text (NULL: auto) into *backend; returns 0 or QMM_EXIT_USAGE. */
#define BACKEND_AUTO (-1)
int parse_backend(const command *c, const char *text, int *backend);
/* A context on the parsed backend (device 0). A named backend that cannot be created (not built in, no
 * device) is an error naming the option and the library's reason; auto falls back to the next backend. */
qmm_status open_context(int backend, qmm_context **context);
/* open_context, but --backend auto takes the first backend whose table has a kernel of op — with batch_invariant, a
 * kernel of op that declares a batch-invariant order (every backend's gather row does since the fortieth session). */
qmm_status open_context_for(int backend, qmm_op op, int batch_invariant, qmm_context **context);
/* --batch-invariant's check (matmul, run, gather): up to INVARIANT_SAMPLES of count rows (pairs) are recomputed alone,
 * all of them when count is smaller, else evenly spaced with the first and the last: invariant_samples(count) of them,
 * sample s being row invariant_sample(s, count). */
#define INVARIANT_SAMPLES 64
static inline size_t invariant_samples(size_t count) { return count < INVARIANT_SAMPLES ? count : INVARIANT_SAMPLES; }
static inline size_t invariant_sample(size_t s, size_t count) {
    const size_t samples = invariant_samples(count);
    return samples == count ? s : s * (count - 1) / (samples - 1);
}

/* --tuning FILE (bench, run, matmul): loads a tuning table (qmm tune) into the context and describes it in
 * note[size]: "tuning table FILE: N entries in use[; X set aside: measured on another device; Y set aside: naming
 * a kernel this build lacks]". Returns the library's status (its message names the file and the rule). */
qmm_status load_tuning_option(qmm_context *context, const char *path, char *note, size_t size);

/* --threads N: the host threads the CPU kernels use (qmm_context_set_threads). parse_threads reads the
 * option's text (NULL: 0 = the context's default, the cores this process may use) and refuses anything but a
 * whole number from 1 to qmm_max_threads() (8 × the CPUs online); returns 0 or QMM_EXIT_USAGE. apply_threads sets a parsed count (> 0) on
 * a context: a backend without host threads refuses N > 1 with the library's reason, naming the option. */
int parse_threads(const command *c, const char *text, int *threads);
qmm_status apply_threads(qmm_context *context, int threads);

/* ───────────────────────────── one product, checked and timed ───────────────────────────── */

typedef struct layer_result {
    qmm_kernel_info kernel;
    double max_abs_error; /* over the outputs that are not rightly ±inf */
    double max_exact;   /* max |exact|, the denominator of the (normwise) relative error */
    double worst_ratio; /* max over outputs of qmm_output_check's ratio (|error| / bound; NaN output: infinity) */
    size_t outside;     /* outputs that fail qmm_output_check (outside the bound) */
    size_t overflowed;  /* outputs that are ±inf rightly: the exact value rounds beyond the dtype's range */
    size_t first_outside;
    double microseconds; /* median device time of one product, from a chain */
    int timing_runs;
    double bytes; /* weights + scales + biases + x + out */
    /* batch_invariant only: rows of the product recomputed alone (M = 1) and compared bit for bit */
    size_t invariant_checked;
    size_t invariant_differ; /* of those, rows whose bits differ from the same row inside the product */
    size_t first_differ;
} layer_result;

/* out = x·Ŵᵀ through the runtime, compared with the f64 oracle and timed (common.c says how).
 * batch_invariant: qmm_matmul_options.batch_invariant on, and the invariance checked on sampled rows. */
qmm_status check_product(qmm_context *context, const qmm_qmatrix *matrix, const void *x, size_t M,
                         const char *kernel, int batch_invariant, double time_budget, int inject_fault,
                         layer_result *result);
/* Before a checked product is allocated (matmul, run): check_host_memory for the most check_product holds at once for
 * M rows of x in dtype against matrix's N×K (its dtype is not read), with the caller's x [M, K] and `extra` bytes more
 * that the caller holds — the arrays' sizes, in double (no size arithmetic can overflow); the weights and buffers count
 * where the context's backend keeps them in host memory (ref, cpu). The message names layer `name` (printable), the
 * shape, M and dtype, and ends with advice. */
qmm_status check_product_fits(qmm_context *context, const char *name, const qmm_qmatrix *matrix, qmm_dtype dtype,
                              size_t M, double extra, const char *advice);
/* The rows the first M rows (all T when M is 0) of a float tensor [T, K] or [K] make: checked as load_activation
 * checks them (dtype, shape, T ≤ MAX_M when M is 0, M ≤ T), without reading the data. */
qmm_status activation_rows(const qmm_tensor *tensor, size_t K, size_t M, size_t *rows);
/* The first M rows (all T when M is 0) of a float tensor [T, K] or [K], rounded once to dtype, in a
 * malloc'd *x; *rows receives the row count. */
qmm_status load_activation(const qmm_tensor *tensor, size_t K, qmm_dtype dtype, size_t M, void **x, size_t *rows);

/* ───────────────────────────── host memory ───────────────────────────── */

/* The host memory the system can give without swapping (Linux /proc/meminfo MemAvailable), in bytes; 0 where it
 * cannot be read (not Linux): then nothing is refused. QMM_TEST_MEM_AVAILABLE=bytes pretends that many (tests). */
double host_memory_available(void);
/* Before a command allocates its arrays: QMM_ERR_OUT_OF_MEMORY when `needed` bytes — the most it would hold at once,
 * estimated in double from the shapes — exceed host_memory_available(), with the message "<subject> would hold ~X GiB
 * of host memory at once (<held>), more than the Y GiB available (MemAvailable in /proc/meminfo): <advice>" (both in
 * MiB, KiB or bytes when less than a GiB is available; more decimals where one would print them the same). Past it,
 * the allocations may each succeed and the process be killed by the system when they are touched, with nothing said.
 * QMM_OK otherwise. */
qmm_status check_host_memory(double needed, const char *subject, const char *held, const char *advice);
/* A copy of matrix with scales and biases converted to dtype (malloc'd, returned in scales and biases). */
qmm_status convert_scales(const qmm_qmatrix *matrix, qmm_dtype dtype, qmm_qmatrix *converted, void **scales,
                          void **biases);

/* convert and quantize, before any work: OUTDIR is an existing writable directory or can be created (its
 * parent exists); a checkpoint already in it is replaced only with --force; numbered shards or an index
 * in it, which a reader would mix with the new model.safetensors, are refused. Returns 0 or the exit code. */
int check_outdir(const command *c, const char *dir, int force);

/* ───────────────────────────── output files (bench --json, tune --out) ───────────────────────────── */

/* An output FILE named by option ("--json", "--out"), checked before any work: not empty (usage error); not an
 * existing entry that is not a regular file — a directory, a symbolic link, a device, a FIFO, a socket, which
 * the final rename would replace (as root, `--json /dev/full` would replace the device); its directory exists
 * and is writable. Returns 0, or the exit code after printing the reason. */
int check_output_file(const command *c, const char *option, const char *path);
/* Writes size bytes to path through a unique temporary file beside it (the library's atomic writer:
 * O_CREAT|O_EXCL, mode 0666 under the umask, fsync, rename), refusing again, just before the rename, a path
 * that is now something other than a regular file. Nothing is left behind on failure; an existing file of any
 * other name (FILE.tmp included) is never touched. Errors (QMM_ERR_IO) name option and path. */
qmm_status write_output_file(const char *option, const char *path, const void *bytes, size_t size);

#endif
