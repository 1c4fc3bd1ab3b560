/*
 * matmul.c — qmm matmul: one layer's product through the runtime, checked against the f64 oracle.
 */
#include "common.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ───────────────────────────── qmm matmul ───────────────────────────── */

int cmd_matmul(const command *c, int argc, char **argv) {
    const char *layer_name = NULL, *m_text = NULL, *dtype_text = NULL, *kernel = NULL, *x_path = NULL,
               *seed_text = NULL, *backend = NULL, *tuning = NULL, *threads_text = NULL;
    int batch_invariant = 0;
    flag_spec flags[] = {{"--layer", NULL, &layer_name, NULL, NULL, 0, NULL}, {"-m", NULL, &m_text, NULL, NULL, 0, NULL},
                         {"--dtype", NULL, &dtype_text, NULL, NULL, 0, NULL}, {"--kernel", NULL, &kernel, NULL, NULL, 0, NULL},
                         {"--x", NULL, &x_path, NULL, NULL, 0, NULL},         {"--seed", NULL, &seed_text, NULL, NULL, 0, NULL},
                         {"--backend", NULL, &backend, NULL, NULL, 0, NULL}, {"--tuning", NULL, &tuning, NULL, NULL, 0, NULL},
                         {"--threads", NULL, &threads_text, NULL, NULL, 0, NULL},
                         {"--batch-invariant", NULL, NULL, NULL, NULL, 0, &batch_invariant}};
    const char *positional[1];
    size_t npositional;
    int rc = parse_args(c, argc, argv, flags, sizeof flags / sizeof flags[0], positional, 1, &npositional);
    if (rc) return rc;
    if (npositional != 1) return usage_error(c, "expected one checkpoint DIR");
    if (!layer_name) return usage_error(c, "--layer NAME is required");
    char layer_shown[PRINTABLE_SIZE]; /* the name of a layer from the file, printed escaped */
    printable(layer_name, layer_shown, sizeof layer_shown);
    unsigned long long M = 0, seed = DEFAULT_SEED;
    if (m_text && !parse_unsigned(m_text, 1, MAX_M, &M))
        return usage_error(c, "-m '%s' is not an integer from 1 to %d", m_text, MAX_M);
    if (!m_text && !x_path) return usage_error(c, "-m M is required (or --x FILE)");
    if ((rc = parse_seed(c, seed_text, &seed))) return rc;
    qmm_dtype dtype = QMM_F32;
    if (dtype_text && (qmm_dtype_parse(dtype_text, &dtype) != QMM_OK || !qmm_is_float_dtype(dtype)))
        return usage_error(c, "--dtype '%s' is not f32, f16 or bf16 (or float32, float16, bfloat16)", dtype_text);
    if (tuning && !tuning[0]) return usage_error(c, "--tuning is empty (want a tuning table from 'qmm tune')");
    if (x_path && !x_path[0]) return usage_error(c, "--x is empty (want a safetensors file of activations)");
    int backend_choice, threads;
    if ((rc = parse_backend(c, backend, &backend_choice))) return rc;
    if ((rc = parse_threads(c, threads_text, &threads))) return rc;
    unsigned long long faults = 0;
    if ((rc = parse_inject_fault(c, &faults))) return rc;

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

    qmm_tensor tensor;
    if (x_path) {
        if ((status = qmm_safetensors_open(x_path, &x_file)) != QMM_OK) goto cleanup;
        /* The tensor named like the layer, else the file's only tensor. */
        if (qmm_safetensors_find(x_file, layer_name, &tensor) != QMM_OK) {
            const size_t count = qmm_safetensors_count(x_file);
            if (count == 0) {
                status = qmm_error(QMM_ERR_NOT_FOUND, "'%s' holds no tensors (want x [M, K=%zu]: a tensor named '%s', or "
                                   "the file's only tensor)", x_path, matrix.cols, layer_shown);
                goto cleanup;
            }
            if (count > 1) {
                status = qmm_error(QMM_ERR_NOT_FOUND, "'%s' has no tensor named '%s' and %zu tensors (want x [M, K=%zu]: "
                                   "a tensor named '%s', or the file's only tensor)", x_path, layer_shown, count,
                                   matrix.cols, layer_shown);
                goto cleanup;
            }
            if ((status = qmm_safetensors_get(x_file, 0, &tensor)) != QMM_OK) goto cleanup;
        }
        if ((status = activation_rows(&tensor, matrix.cols, (size_t)M, &rows)) != QMM_OK) goto cleanup;
    }

    if ((status = open_context(backend_choice, &context)) != QMM_OK) goto cleanup;
    if ((status = apply_threads(context, threads)) != QMM_OK) goto cleanup;
    warn_if_loaded(c, context);
    if (tuning) {
        char note[1024];
        if ((status = load_tuning_option(context, tuning, note, sizeof note)) != QMM_OK) goto cleanup;
        fprintf(stderr, "qmm matmul: %s\n", note);
    }

    /* Before anything of the product's size is allocated: refused if it would not fit in the host memory (-m 65536 on a
     * layer of 20480 rows holds tens of GiB; past the memory the system kills the process, with nothing said). */
    double converted = 0.0; /* the scales and biases converted to --dtype */
    if (dtype != stored)
        converted = 2.0 * (double)matrix.rows * (double)qmm_groups(matrix.cols, matrix.group_size) *
                    (double)qmm_dtype_size(dtype);
    if ((status = check_product_fits(context, layer_shown, &matrix, dtype, rows, converted,
                                     "use a smaller -m (the first rows of --x), or a larger machine")) != QMM_OK)
        goto cleanup;
    if (dtype != stored && (status = convert_scales(&layer.matrix, dtype, &matrix, &scales, &biases)) != QMM_OK)
        goto cleanup;
    if (x_path) {
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
    fprintf(stderr, "qmm matmul: %s on backend %s, M=%zu\n", layer_shown, qmm_backend_name(qmm_context_backend(context)),
            rows);
    if ((status = check_product(context, &matrix, x, rows, kernel, batch_invariant, 0.25, faults > 0, &result)) != QMM_OK) goto cleanup;

    char format[64];
    format_format(format, sizeof format, &matrix);
    printf("layer              %s (N=%zu, K=%zu)\n", layer_shown, matrix.rows, matrix.cols);
    printf("format             %s\n", format);
    if (layer.experts > 1) /* the stacked product: every token against every expert's rows */
        printf("note               the layer holds %zu experts of %zu rows: multiplied here as one stacked matrix of %zu "
               "rows (every token by every expert); `qmm gather` routes tokens to experts\n",
               layer.experts, matrix.rows / layer.experts, matrix.rows);
    if (dtype != stored)
        print_scale_conversion(stored, dtype);
    if (x_path) {
        fprint_safe_line(stdout, "x                  %s, M=%zu, rounded to %s", x_path, rows, qmm_dtype_name(dtype));
    } else printf("x                  random uniform [-1, 1), seed %llu, M=%zu, %s\n", seed, rows, qmm_dtype_name(dtype));
    printf("backend            %s\n", qmm_backend_name(qmm_context_backend(context)));
    printf("threads            %d\n", qmm_context_threads(context));
    printf("kernel             %s%s\n", result.kernel.name, kernel ? " (forced)" : " (selector's choice)");
    if (batch_invariant)
        printf("batch-invariant    order \"%s\"; %zu of %zu rows checked alone (M=1) are bit for bit the same inside "
               "M=%zu%s\n", result.kernel.batch_invariant_order, result.invariant_checked - result.invariant_differ,
               result.invariant_checked, rows, result.invariant_differ ? " — FAIL" : "");
    printf("max |error|        %.3e\n", result.max_abs_error);
    printf("max rel error      %.3e (max |error| / max |exact|)\n",
           result.max_exact > 0 ? result.max_abs_error / result.max_exact : result.max_abs_error);
    printf("worst error/bound  %.3g (qmm_error_bound, slack %g)\n", result.worst_ratio,
           result.kernel.tolerance_slack > 0 ? result.kernel.tolerance_slack : 1.0);
    if (result.overflowed)
        printf("note               %zu outputs are ±inf, as correct rounding to %s gives: their exact value is beyond "
               "its range (max |exact| %.4g)\n", result.overflowed, qmm_dtype_name(dtype), result.max_exact);
    printf("time               %.2f µs (median of %d chain runs)\n", result.microseconds, result.timing_runs);
    printf("bandwidth          %.3f GB/s (%.0f bytes: weights + scales + biases + x + out)\n",
           result.microseconds > 0 ? result.bytes / (result.microseconds * 1e3) : 0.0, result.bytes);
    if (result.outside) {
        printf("verdict            FAIL: %zu of %zu outputs outside bound (first: row %zu, column %zu)\n",
               result.outside, rows * matrix.rows, result.first_outside / matrix.rows,
               result.first_outside % matrix.rows);
    } else if (result.invariant_differ) {
        printf("verdict            FAIL: %zu rows differ from the same row computed alone (first: row %zu)\n",
               result.invariant_differ, result.first_differ);
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
    return result.outside || result.invariant_differ ? QMM_EXIT_FAIL : QMM_EXIT_OK;
}
