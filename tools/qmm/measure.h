/*
 * measure.h — what `qmm bench` (bench.c) and `qmm tune` (tune.c) share so that both measure a kernel the same
 * way (measure.c): option lists, shape files, a shape's random weights, weight copies that rotate beyond the
 * last-level cache (CPU) or the L2 (CUDA), and one kernel's median time through a chain with a step per copy.
 */
#ifndef QMM_TOOLS_MEASURE_H
#define QMM_TOOLS_MEASURE_H

#include "bench.h"

#define MAX_SHAPES 256
#define MAX_LIST 64
#define MAX_COPIES 512
/* The scalar reference rows run at about 4 GMAC/s on one thread; a row whose whole measurement (warm-up and
 * repeats over every copy) would take longer than SCALAR_BUDGET_S seconds is skipped and says so. */
#define SCALAR_MACS_PER_S 4e9
#define SCALAR_BUDGET_S 10.0
#define GENERIC_MACS_PER_S 16e9
/* cpu.qmm_t.scalar.r1, the portable CPU row: each call decodes the N·K weights once (0.3–0.7 G a second measured at
 * M = 1 on one Zen 4 core) and multiplies-adds M·N·K (3–4 G a second a thread at M = 16 on the 2-core VM of the
 * forty-second session: on two threads M = 1 ran 0.9–1.9 GMAC/s and M = 16 6.5–8.1, on 1536×576 and 1024²): both
 * rates taken low, so the estimate stays above the time. */
#define CPU_SCALAR_DECODES_PER_S 0.3e9
#define CPU_SCALAR_MACS_PER_S 3e9

typedef struct bench_shape {
    char name[64];
    size_t N, K;
} bench_shape;

/* "1,2,4" into values[MAX_LIST] (each in [min, max]); returns 0 or the usage exit code after printing why. */
int parse_size_list(const command *c, const char *option, const char *text, size_t min, size_t max, size_t *values,
                    size_t *count);
/* "f32,bf16" into values[MAX_LIST]; returns 0 or the usage exit code. */
int parse_dtype_list(const command *c, const char *text, qmm_dtype *values, size_t *count);
/* --shapes text, before any work: non-empty items, under 2048 bytes. Returns 0 or the usage exit code. */
int check_shapes_option(const command *c, const char *text);

/* The options qmm bench and qmm tune share, checked before any work (each text may be NULL: the value keeps
 * its default): --bits and --group-size (a supported pair), --repeats (1 to 1000), --m, --dtype and --shapes.
 * ms and dtypes hold MAX_LIST values. Returns 0 or the usage exit code after printing why. */
typedef struct measure_option_texts {
    const char *bits, *group_size, *repeats, *m, *dtype, *shapes;
} measure_option_texts;
int parse_measure_options(const command *c, const measure_option_texts *texts, int *bits, int *group_size,
                          int *repeats, size_t *ms, size_t *m_count, qmm_dtype *dtypes, size_t *dtype_count);
/* The dtypes a run measures when --dtype is not given: f32 (f16 on CUDA) and bf16; the first alone with --quick. */
void default_measure_dtypes(int quick, int cuda, qmm_dtype *dtypes, size_t *count);
/* The shapes of a run: --shapes (names or files) if given, else two tiny ones with --quick (those whose K is a
 * multiple of group_size), else the seed's. Errors: those of load_shapes. */
qmm_status load_measure_shapes(const char *shapes_text, int quick, int group_size, bench_shape *shapes, size_t *count);
/* "qmm NAME ARGS..." into out[size] for the JSON records (bench, tune): each argument as put_terminal_safe shows it
 * (a byte outside printable UTF-8 as \xNN), so the record is valid UTF-8; cut before a character that does not fit. */
void format_command_line(char *out, size_t size, const char *name, int argc, char **argv);
/* --shapes A,B: each a file of "name N K" lines ('#' comments) or the name of bench/shapes/NAME.txt, appended to
 * shapes[MAX_SHAPES]. Errors name the file, line and rule (K must be a multiple of group_size; a NUL byte; a file
 * without a shape, a directory). */
qmm_status load_shapes(bench_shape *shapes, size_t *shape_count, int group_size, const char *text);
/* Random f32 weights of one shape (deterministic per shape): random codes, scales in [2^-8, 2^-6), biases in
 * [-2^-4, 2^-4). The arrays are malloc'd into *w, *scales, *biases (free them even on failure). */
qmm_status make_master(int bits, int group_size, const bench_shape *shape, qmm_qmatrix *matrix, uint32_t **w,
                       float **scales, float **biases);

/* The machine's description and the cache the weight copies must exceed (CUDA: the L2; host: the LLC, or 64 MiB
 * when unknown). */
qmm_status measure_machine(qmm_backend backend, char *machine, size_t machine_size, size_t *cache_bytes,
                           char *cache_desc, size_t desc_size);
/* Copies that rotate through more than twice the cache (at least 2, at most MAX_COPIES; 2 when quick). */
size_t copies_for(size_t cache_bytes, int quick, double bytes_per_copy);
/* `copies` weights objects of matrix on context (destroy with weight_copies_destroy, also after a failure). */
qmm_status weight_copies_create(qmm_context *context, const qmm_qmatrix *matrix, size_t copies, qmm_weights ***weights);
void weight_copies_destroy(qmm_weights **weights, size_t copies);
/* x [M, K] of seeded random values (DEFAULT_SEED + M) and out [M, N], both dtype (destroy both, also on failure). */
qmm_status operands_create(qmm_context *context, qmm_dtype dtype, size_t M, size_t N, size_t K, qmm_buffer **x,
                           qmm_buffer **out);
/* Whether a scalar reference row's (or a CUDA generic row's) measurement would take more than SCALAR_BUDGET_S;
 * then note says so. */
int slow_row_skipped(const qmm_kernel_info *info, size_t M, size_t N, size_t K, size_t copies, int repeats, char *note,
                    size_t note_size);
/* Median µs of one product (op qmm_t or qmm_n) by `kernel` (NULL: the selector's choice): a chain with one step per
 * weight copy, step timing off, one warm-up run, then `repeats` runs, each giving qmm_chain_elapsed ÷ steps.
 * batch_invariant: every step with qmm_matmul_options.batch_invariant set (qmm bench --batch-invariant). */
qmm_status time_kernel(qmm_context *context, int repeats, qmm_weights **weights, size_t copies, qmm_buffer *x, size_t M,
                       qmm_buffer *out, qmm_op op, const char *kernel, int batch_invariant, double *us);

#endif
