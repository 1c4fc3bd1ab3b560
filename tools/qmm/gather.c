/*
 * gather.c — qmm gather: the MoE product of a checkpoint layer of experts (MLX gather_qmm) through the
 * runtime, with top-k routing drawn at random, checked against the f64 oracle.
 */
#include "common.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64, the routing stream (the same seed routes the same way on every machine). */
static uint64_t routing_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Top-k routing: token t goes to top_k distinct experts drawn at random (a partial Fisher–Yates shuffle of
 * 0..E−1 per token), pair t·top_k + j = (t, expert). Sorted: pairs reordered by expert, stably (tokens
 * ascending inside each expert's block), as an MoE block sorts them for gather_qmm's sorted_indices. */
static qmm_status route(uint64_t seed, size_t tokens, size_t top_k, size_t experts, int sorted, uint32_t *lhs,
                        uint32_t *rhs, size_t *experts_used) {
    uint64_t state = seed ^ 0x5DEECE66Dull; /* a stream apart from x's */
    uint32_t *deck = malloc(experts * sizeof *deck), *token_lhs = malloc(tokens * top_k * sizeof *token_lhs),
             *token_rhs = malloc(tokens * top_k * sizeof *token_rhs);
    size_t *count = calloc(experts + 1, sizeof *count);
    qmm_status status = QMM_OK;
    if (!deck || !token_lhs || !token_rhs || !count) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the routing of %zu tokens", tokens);
        goto cleanup;
    }
    for (size_t t = 0; t < tokens; t++) {
        for (size_t e = 0; e < experts; e++) deck[e] = (uint32_t)e;
        for (size_t j = 0; j < top_k; j++) {
            size_t pick = j + (size_t)(routing_next(&state) % (experts - j));
            uint32_t chosen = deck[pick];
            deck[pick] = deck[j];
            deck[j] = chosen;
            token_lhs[t * top_k + j] = (uint32_t)t;
            token_rhs[t * top_k + j] = chosen;
            count[chosen + 1]++;
        }
    }
    *experts_used = 0;
    for (size_t e = 0; e < experts; e++) *experts_used += count[e + 1] > 0;
    if (!sorted) {
        memcpy(lhs, token_lhs, tokens * top_k * sizeof *lhs);
        memcpy(rhs, token_rhs, tokens * top_k * sizeof *rhs);
        goto cleanup;
    }
    for (size_t e = 0; e < experts; e++) count[e + 1] += count[e]; /* count[e]: where expert e's block starts */
    for (size_t i = 0; i < tokens * top_k; i++) {
        size_t at = count[token_rhs[i]]++;
        lhs[at] = token_lhs[i];
        rhs[at] = token_rhs[i];
    }
cleanup:
    free(deck);
    free(token_lhs);
    free(token_rhs);
    free(count);
    return status;
}

/* The most host memory qmm gather holds at once for T tokens and B pairs against stacked's E experts (its dtype is
 * not read), in bytes — the arrays' sizes, in double (no size arithmetic can overflow): x [T, K] and the routing; the
 * output read back [B, N] in dtype, as f32, and the f64 oracle's values and sums of |terms|; the scales and biases
 * converted to dtype (converted); where the backend keeps them in host memory (ref, cpu), the weights and the x and out
 * buffers; and the larger of the f64 oracle's scratch (one expert's block at a time: x gathered [rows, K], its
 * [rows, N] values and sums, rows at most T since a token's experts are distinct; the pair order; qmm_ref_dense_f64's
 * rows: more than the reference gather rows' own) and a CPU gather's (the rows of x it gathers, at most [B, K], and a
 * tiled row's f32 copy of them). */
static double gather_host_bytes(const qmm_qmatrix *stacked, size_t E, qmm_dtype dtype, int converted, size_t T,
                                size_t B, qmm_backend backend) {
    const double rows = (double)stacked->rows, N = rows / (double)E, K = (double)stacked->cols;
    const double element = (double)qmm_dtype_size(dtype), pairs = (double)B, tokens = (double)T;
    const double groups = rows * (double)qmm_groups(stacked->cols, stacked->group_size);
    const double weights = rows * (double)qmm_packed_words(stacked->cols, stacked->bits) * 4.0 + 2.0 * groups * element;
    double held = tokens * K * element + pairs * 2.0 * sizeof(uint32_t) + pairs * N * (element + 4.0 + 8.0 + 8.0);
    if (converted) held += 2.0 * groups * element;
    if (backend != QMM_BACKEND_CUDA) held += weights + tokens * K * element + pairs * N * element;
    const double block = tokens < pairs ? tokens : pairs; /* the largest expert's rows */
    /* and, inside it, qmm_ref_dense_f64's own (32 rows of x and of |x|, one decoded row and its |ŵ|, in f64) */
    const double oracle_scratch = block * K * element + block * N * 16.0 + pairs * 8.0 + ((double)E + 1.0) * 8.0 +
                                  (2.0 * 32.0 + 2.0) * K * 8.0;
    const double kernel_scratch = backend == QMM_BACKEND_CPU ? pairs * K * (element + 4.0) : 0.0;
    return held + (oracle_scratch > kernel_scratch ? oracle_scratch : kernel_scratch);
}

int cmd_gather(const command *c, int argc, char **argv) {
    const char *layer_name = NULL, *tokens_text = NULL, *top_k_text = NULL, *dtype_text = NULL, *kernel = NULL,
               *seed_text = NULL, *backend = NULL, *threads_text = NULL;
    int unsorted = 0, batch_invariant = 0;
    flag_spec flags[] = {{"--layer", NULL, &layer_name, NULL, NULL, 0, NULL},
                         {"--tokens", "-t", &tokens_text, NULL, NULL, 0, NULL},
                         {"--experts-per-token", "-k", &top_k_text, NULL, NULL, 0, NULL},
                         {"--unsorted", NULL, NULL, NULL, NULL, 0, &unsorted},
                         {"--dtype", NULL, &dtype_text, NULL, NULL, 0, NULL},
                         {"--kernel", NULL, &kernel, NULL, NULL, 0, NULL},
                         {"--seed", NULL, &seed_text, NULL, NULL, 0, NULL},
                         {"--backend", NULL, &backend, NULL, NULL, 0, NULL},
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
    unsigned long long tokens = RANDOM_ROWS, top_k = 8, seed = DEFAULT_SEED, faults = 0;
    if (tokens_text && !parse_unsigned(tokens_text, 1, MAX_M, &tokens))
        return usage_error(c, "--tokens '%s' is not an integer from 1 to %d", tokens_text, MAX_M);
    if (top_k_text && !parse_unsigned(top_k_text, 1, 1u << 20, &top_k))
        return usage_error(c, "--experts-per-token '%s' is not an integer from 1 to %u", top_k_text, 1u << 20);
    if ((rc = parse_seed(c, seed_text, &seed))) return rc;
    qmm_dtype dtype = QMM_F32;
    if (dtype_text && (qmm_dtype_parse(dtype_text, &dtype) != QMM_OK || !qmm_is_float_dtype(dtype)))
        return usage_error(c, "--dtype '%s' is not f32, f16 or bf16 (or float32, float16, bfloat16)", dtype_text);
    int backend_choice, threads;
    if ((rc = parse_backend(c, backend, &backend_choice))) return rc;
    if ((rc = parse_threads(c, threads_text, &threads))) return rc;
    if ((rc = parse_inject_fault(c, &faults))) return rc;

    qmm_checkpoint *checkpoint = NULL;
    qmm_context *context = NULL;
    qmm_weights *weights = NULL;
    qmm_buffer *x_buffer = NULL, *out_buffer = NULL, *pair_buffer = NULL;
    void *scales = NULL, *biases = NULL, *x = NULL, *out_host = NULL, *alone = NULL;
    uint32_t *lhs = NULL, *rhs = NULL;
    float *got = NULL;
    double *exact = NULL, *abs_dot = NULL, *times = NULL;
    size_t outside = 0, first_outside = 0, experts_used = 0, checked = 0, differ = 0, first_differ = 0;
    qmm_status status;
    if ((status = qmm_checkpoint_open(positional[0], &checkpoint)) != QMM_OK) goto cleanup;
    qmm_layer layer;
    if ((status = qmm_checkpoint_find_layer(checkpoint, layer_name, &layer)) != QMM_OK) goto cleanup;
    const size_t E = layer.experts ? layer.experts : 1, N = layer.matrix.rows / E, K = layer.matrix.cols;
    if (!top_k_text && top_k > E) top_k = E; /* the default, 8, capped at the layer's experts */
    if (top_k > E) { /* a rule of this layer: checked before any work */
        qmm_checkpoint_close(checkpoint);
        return usage_error(c, "--experts-per-token %llu exceeds the %zu expert%s of layer '%s'", top_k, E,
                           E == 1 ? "" : "s", layer_name); /* usage_error escapes its message */
    }
    qmm_qmatrix matrix = layer.matrix;
    if (!dtype_text) dtype = matrix.dtype;
    const qmm_dtype stored = matrix.dtype;
    const size_t T = (size_t)tokens, B = T * (size_t)top_k; /* ≤ 65536·2^20: no overflow */

    if ((status = open_context_for(backend_choice, QMM_OP_GATHER, batch_invariant, &context)) != QMM_OK) goto cleanup;
    if ((status = apply_threads(context, threads)) != QMM_OK) goto cleanup;
    warn_if_loaded(c, context);
    /* Before anything of the product's size is allocated: refused if it would not fit in the host memory (-t 65536 on
     * a large layer holds tens of GiB; past the memory the system kills the process, with nothing said). */
    {
        const qmm_backend on = qmm_context_backend(context);
        char subject[PRINTABLE_SIZE + 128];
        snprintf(subject, sizeof subject, "layer '%s' (%zu expert%s of N=%zu, K=%zu) at T=%zu, B=%zu in %s", layer_shown,
                 E, E == 1 ? "" : "s", N, K, T, B, qmm_dtype_name(dtype));
        status = check_host_memory(gather_host_bytes(&layer.matrix, E, dtype, dtype != stored, T, B, on), subject,
                                   on != QMM_BACKEND_CUDA ? "x, the routing, the output, its f64 oracle, the weights "
                                                            "and the backend's buffers"
                                                          : "x, the routing, the output and its f64 oracle",
                                   "use fewer --tokens or --experts-per-token, or a larger machine");
        if (status != QMM_OK) goto cleanup;
    }
    if (dtype != stored && (status = convert_scales(&layer.matrix, dtype, &matrix, &scales, &biases)) != QMM_OK)
        goto cleanup;

    size_t count_x, count_out, bytes;
    if (!qmm_mul_size(T, K, &count_x) || !qmm_mul_size(B, N, &count_out) ||
        !qmm_mul_size(count_out, sizeof(double), &bytes)) {
        status = qmm_error(QMM_ERR_OVERFLOW, "T=%zu, B=%zu, N=%zu, K=%zu overflow size_t", T, B, N, K);
        goto cleanup;
    }
    const size_t element = qmm_dtype_size(dtype);
    x = malloc(count_x * element);
    out_host = malloc(count_out * element);
    got = malloc(count_out * sizeof *got);
    exact = malloc(bytes);
    abs_dot = malloc(bytes);
    lhs = malloc(B * sizeof *lhs);
    rhs = malloc(B * sizeof *rhs);
    if (!x || !out_host || !got || !exact || !abs_dot || !lhs || !rhs) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate x, out and the oracle of B=%zu pairs × N=%zu", B, N);
        goto cleanup;
    }
    if ((status = fill_random(seed, x, dtype, count_x)) != QMM_OK) goto cleanup;
    if ((status = route(seed, T, (size_t)top_k, E, !unsorted, lhs, rhs, &experts_used)) != QMM_OK) goto cleanup;

    fprintf(stderr, "qmm gather: %s on backend %s, %zu expert(s), T=%zu, B=%zu\n", layer_shown,
            qmm_backend_name(qmm_context_backend(context)), E, T, B);
    if ((status = qmm_weights_create_experts(context, &matrix, E, &weights)) != QMM_OK) goto cleanup;
    if ((status = qmm_buffer_create(context, dtype, count_x, &x_buffer)) != QMM_OK) goto cleanup;
    if ((status = qmm_buffer_create(context, dtype, count_out, &out_buffer)) != QMM_OK) goto cleanup;
    if ((status = qmm_buffer_write(x_buffer, x, count_x)) != QMM_OK) goto cleanup;
    if ((status = qmm_buffer_poison(out_buffer)) != QMM_OK) goto cleanup; /* unwritten outputs show as NaN */
    qmm_gather_options options = {.kernel = kernel, .sorted_indices = !unsorted, .batch_invariant = batch_invariant};
    qmm_kernel_info ran;
    if ((status = qmm_gather_matmul(context, weights, x_buffer, T, lhs, rhs, B, out_buffer, &options, &ran)) != QMM_OK)
        goto cleanup;
    if ((status = qmm_buffer_read(out_buffer, out_host, count_out)) != QMM_OK) goto cleanup;
    if ((status = qmm_convert(out_host, dtype, got, QMM_F32, count_out)) != QMM_OK) goto cleanup;
    if (faults) got[0] += 1.0f + fabsf(got[0]); /* test hook: an error far outside any bound */
    /* --batch-invariant: up to 64 pairs (all when B is smaller; else evenly spaced, first and last included) computed
     * alone (B = 1: the pair's token and expert, the same options) must give the same bits as inside the gather. */
    if (batch_invariant) {
        if (!(alone = malloc(N * element))) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate one output row");
            goto cleanup;
        }
        if ((status = qmm_buffer_create(context, dtype, N, &pair_buffer)) != QMM_OK) goto cleanup;
        for (size_t s = 0; s < invariant_samples(B); s++) {
            const size_t i = invariant_sample(s, B);
            if ((status = qmm_buffer_poison(pair_buffer)) != QMM_OK) goto cleanup;
            if ((status = qmm_gather_matmul(context, weights, x_buffer, T, &lhs[i], &rhs[i], 1, pair_buffer, &options,
                                            NULL)) != QMM_OK)
                goto cleanup;
            if ((status = qmm_buffer_read(pair_buffer, alone, N)) != QMM_OK) goto cleanup;
            checked++;
            if (memcmp(alone, (const unsigned char *)out_host + i * N * element, N * element) != 0 && differ++ == 0)
                first_differ = i;
        }
    }

    if ((status = qmm_ref_gather_dense_f64(&matrix, E, x, T, lhs, rhs, B, exact, abs_dot)) != QMM_OK) goto cleanup;
    double max_error = 0.0, max_exact = 0.0, worst = 0.0;
    const double slack = ran.tolerance_slack > 0 ? ran.tolerance_slack : 1.0;
    for (size_t i = 0; i < count_out; i++) {
        if (!isfinite(exact[i])) {
            status = qmm_error(QMM_ERR_NUMERIC, "the exact output at pair %zu, column %zu is %g: the layer's scales or "
                               "biases hold NaN or Inf%s%s%s", i / N, i % N, exact[i],
                               dtype != stored ? " (or overflow when converted from " : "",
                               dtype != stored ? qmm_dtype_name(stored) : "",
                               dtype != stored ? (dtype == QMM_F16 ? " to f16 by --dtype: f16's largest value is 65504)"
                                                                   : " by --dtype)")
                                               : "");
            goto cleanup;
        }
        /* The one verdict (qmm_output_check, docs/kernels.md §6): within the bound, or ±inf where correct
         * rounding of the exact value to dtype overflows (no finite |error| to report for those). */
        double ratio;
        int ok = qmm_output_check(K, dtype, (double)got[i], exact[i], abs_dot[i], slack, &ratio);
        double error = ok && isinf(got[i]) ? 0.0 : fabs((double)got[i] - exact[i]);
        if (isnan(error)) error = INFINITY;
        if (error > max_error) max_error = error;
        if (fabs(exact[i]) > max_exact) max_exact = fabs(exact[i]);
        if (ratio > worst) worst = ratio;
        if (!ok && outside++ == 0) first_outside = i;
    }

    /* Timing: repeated products for about 0.25 s (at least 3), the median on the host clock. */
    enum { MAX_RUNS = 200, MIN_RUNS = 3 };
    if (!(times = malloc(MAX_RUNS * sizeof *times))) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate timing samples");
        goto cleanup;
    }
    int runs = 0;
    const double start = now_seconds();
    while (runs < MAX_RUNS && (runs < MIN_RUNS || now_seconds() - start < 0.25)) {
        const double begin = now_seconds();
        if ((status = qmm_gather_matmul(context, weights, x_buffer, T, lhs, rhs, B, out_buffer, &options, NULL)) != QMM_OK)
            goto cleanup;
        if ((status = qmm_buffer_read(out_buffer, out_host, 1)) != QMM_OK) goto cleanup; /* waits for the work */
        times[runs++] = (now_seconds() - begin) * 1e6;
    }
    qsort(times, (size_t)runs, sizeof *times, compare_doubles);

    char format[64];
    format_format(format, sizeof format, &matrix);
    printf("layer              %s (%zu expert%s of N=%zu, K=%zu)\n", layer_shown, E, E == 1 ? "" : "s", N, K);
    printf("format             %s\n", format);
    if (dtype != stored)
        print_scale_conversion(stored, dtype);
    printf("routing            T=%zu tokens × %llu expert%s per token = B=%zu pairs, seed %llu, %s; %zu of %zu expert%s "
           "used\n", T, top_k, top_k == 1 ? "" : "s", B, seed, unsorted ? "token order (unsorted)" : "sorted by expert",
           experts_used, E, E == 1 ? "" : "s");
    printf("x                  random uniform [-1, 1), seed %llu, T=%zu, %s\n", seed, T, qmm_dtype_name(dtype));
    printf("backend            %s\n", qmm_backend_name(qmm_context_backend(context)));
    printf("threads            %d\n", qmm_context_threads(context));
    printf("kernel             %s%s\n", ran.name, kernel ? " (forced)" : " (selector's choice)");
    if (batch_invariant)
        printf("batch-invariant    order \"%s\"; %zu of %zu pairs checked alone (B=1) are bit for bit the same inside "
               "B=%zu%s\n", ran.batch_invariant_order, checked - differ, checked, B, differ ? " — FAIL" : "");
    printf("max |error|        %.3e\n", max_error);
    printf("max rel error      %.3e (max |error| / max |exact|)\n", max_exact > 0 ? max_error / max_exact : max_error);
    printf("worst error/bound  %.3g (qmm_error_bound, slack %g)\n", worst, slack);
    printf("time               %.2f µs (median of %d runs, host clock)\n", times[runs / 2], runs);
    if (outside)
        printf("verdict            FAIL: %zu of %zu outputs outside bound (first: pair %zu (token %u, expert %u), "
               "column %zu)\n", outside, count_out, first_outside / N, lhs[first_outside / N], rhs[first_outside / N],
               first_outside % N);
    else if (differ)
        printf("verdict            FAIL: %zu pairs differ from the same pair computed alone (first: pair %zu (token %u, "
               "expert %u))\n", differ, first_differ, lhs[first_differ], rhs[first_differ]);
    else
        printf("verdict            all %zu outputs within bound\n", count_out);
cleanup:
    qmm_buffer_destroy(x_buffer);
    qmm_buffer_destroy(out_buffer);
    qmm_buffer_destroy(pair_buffer);
    qmm_weights_destroy(weights);
    qmm_context_destroy(context);
    qmm_checkpoint_close(checkpoint);
    free(scales);
    free(biases);
    free(x);
    free(out_host);
    free(alone);
    free(got);
    free(exact);
    free(abs_dot);
    free(lhs);
    free(rhs);
    free(times);
    if (status != QMM_OK) return library_error(c, status);
    return outside || differ ? QMM_EXIT_FAIL : QMM_EXIT_OK;
}
