/*
 * cuda_backend.c — the CUDA backend's host side (DESIGN.md §2–3): device, stream, memory, the repacked
 * weights, chains captured as CUDA graphs and timed with events, and the kernel table. C11 on the CUDA
 * runtime API; the kernels are in kernels.cu behind extern "C" launchers.
 *
 * Every CUDA call goes through CUDA_TRY, which turns a failure into QMM_ERR_BACKEND with the call, the
 * CUDA error string, the file and the line. Nothing here exits or prints.
 *
 * Memory: plain cudaMalloc (no managed memory). Copies are cudaMemcpyAsync on the context's stream
 * followed by a stream synchronize, so the caller's host arrays may be reused as soon as a call returns.
 */
#include "cuda_backend.h"
#include "cuda_internal.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_TRY(call)                                                                                          \
    do {                                                                                                        \
        cudaError_t cuda_try_error = (call);                                                                    \
        if (cuda_try_error != cudaSuccess)                                                                      \
            return cudaGetLastError(), qmm_error(QMM_ERR_BACKEND, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(cuda_try_error), \
                             __FILE__, __LINE__);                                                               \
    } while (0)

/* The status of a launcher's cudaError_t, naming the kernel. */
static qmm_status launch_status(int error, const char *kernel, const char *file, int line) {
    if (error == cudaSuccess) return QMM_OK;
    return qmm_error(QMM_ERR_BACKEND, "launch of %s failed: %s (%s:%d)", kernel, cudaGetErrorString((cudaError_t)error),
                     file, line);
}

/* ───────────────────────────── knobs ───────────────────────────── */

/* The backend's knobs: environment variables that force a choice the launchers otherwise make themselves (experiments,
 * the GPU tests, A/B runs; docs/kernels.md describes each where its choice is made). Unset or empty, a knob leaves the
 * choice to the launcher; a value outside its rule is an error naming the knob, the value and the rule
 * (QMM_ERR_INVALID_ARGUMENT), not a silent fallback. The context's knobs are checked when a context opens (cuda_open),
 * the calls' knobs at the start of every row's run (CALL_KNOBS_CHECK), before anything is launched; the launchers
 * then read them as they did. */
typedef struct knob {
    const char *name;
    const char *const *words; /* the accepted words, NULL-terminated; NULL: a whole number in [low, high] */
    long low, high;
    const char *rule; /* what the values mean, for the message */
} knob;

static const char *const knob_zero_one[] = {"0", "1", NULL};
static const char *const knob_cluster[] = {"0", "1", "require", NULL};
static const char *const knob_paths[] = {"split", "virtual", "last", "blocks", NULL};
static const char *const knob_tiles[] = {"0", "1", "mma", "wgmma", NULL};
static const char *const knob_tokens[] = {"32", "64", NULL};
static const char *const knob_one_two[] = {"1", "2", NULL};

/* Read when a context opens. */
static const knob context_knobs[] = {
    {"QMM_CUDA_PDL", knob_zero_one, 0, 0, "0 turns programmatic dependent launch off, 1 leaves it on (sm_90 and newer)"},
    {"QMM_CUDA_WARPS", NULL, 1, 16, "the mma_gemv family's warps per block"},
    {"QMM_CUDA_GEMV_WARPS_MODEL", knob_zero_one, 0, 0, "0: the one-wave rule for the mma_gemv warps, 1: the model"},
};
/* Read at the calls. */
static const knob call_knobs[] = {
    {"QMM_CUDA_SPLITS", NULL, 1, 16, "the split-K count, then capped by K and the workspace"},
    {"QMM_CUDA_GEMV_STAGED_X", knob_zero_one, 0, 0, "1 stages the staged tiles' x through shared memory, 0 does not"},
    {"QMM_CUDA_M16N64_ONE_GRID", knob_zero_one, 0, 0, "1: m16n64's chunks of 16 rows of x in one grid, 0: a launch each"},
    {"QMM_CUDA_WGMMA_LAST_WAVE", knob_zero_one, 0, 0, "0 turns the wgmma rows' split last wave off, 1 leaves it on"},
    {"QMM_CUDA_WGMMA32_BLOCKS", knob_one_two, 0, 0,
     "the 32-token wgmma tile's blocks an SM: 1 always one, 2 two (unsplit) wherever no split count is forced"},
    {"QMM_CUDA_WGMMA_CLUSTER", knob_cluster, 0, 0,
     "0: no thread-block cluster for the wgmma splits, 1: where it runs in no more waves, require: always (an error "
     "where it cannot)"},
    {"QMM_CUDA_INVARIANT_PATH", knob_paths, 0, 0, "the way batch-invariant mode runs the wgmma splits"},
    {"QMM_CUDA_INVARIANT_SLOTS", knob_zero_one, 0, 0, "0: as if the bf16 virtual splits' slots could not be had"},
    {"QMM_CUDA_GATHER_GROUPED", knob_zero_one, 0, 0,
     "0: a launch per expert block, 1: grouped launches (an error where they cannot run)"},
    {"QMM_CUDA_GATHER_TILES", knob_tiles, 0, 0,
     "0: the gather's blocks that are not cut get a launch each; 1, mma, wgmma: grouped tile launches of the default "
     "kind, of m64n64, of wgmma m32n128/m64n128 (an error where the grouped wgmma tiles cannot run) where they are not cut"},
    {"QMM_CUDA_GATHER_WGMMA_BLOCKS", NULL, 1, 65535,
     "the thread blocks of the gather's persistent wgmma tile launches (tests: several work items a block)"},
    {"QMM_CUDA_GATHER_WGMMA_TOKENS", knob_tokens, 0, 0,
     "the tokens of the gather's grouped wgmma tiles (unset: 32 where the tile class's largest block has <= 32 rows, "
     "else 64)"},
    {"QMM_CUDA_GATHER_CHUNK_ROWS", NULL, 16, 1L << 30,
     "the largest expert block the default mode cuts into chunks of 16 rows for the grouped launches (16: none)"},
};

static qmm_status knob_check(const knob *k) {
    const char *value = getenv(k->name);
    if (!value || !*value) return QMM_OK;
    if (k->words) {
        for (const char *const *w = k->words; *w; w++)
            if (strcmp(value, *w) == 0) return QMM_OK;
        char list[64] = ""; /* the accepted words, for the message */
        for (const char *const *w = k->words; *w; w++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", w == k->words ? "" : ", ", *w);
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s=%s is not one of %s (%s; unset: the launcher's choice)", k->name,
                         value, list, k->rule);
    }
    char *end = NULL;
    const long number = strtol(value, &end, 10);
    if (*end != '\0' || number < k->low || number > k->high)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s=%s is not a whole number in %ld–%ld (%s; unset: the launcher's "
                         "choice)", k->name, value, k->low, k->high, k->rule);
    return QMM_OK;
}

static qmm_status knobs_check(const knob *knobs, size_t count) {
    for (size_t i = 0; i < count; i++) {
        const qmm_status status = knob_check(&knobs[i]);
        if (status != QMM_OK) return status;
    }
    return QMM_OK;
}
#define CALL_KNOBS_CHECK()                                                                                       \
    do {                                                                                                        \
        const qmm_status knobs_status = knobs_check(call_knobs, sizeof call_knobs / sizeof call_knobs[0]);        \
        if (knobs_status != QMM_OK) return knobs_status;                                                        \
    } while (0)

typedef struct cuda_state {
    int device;
    int major, minor; /* compute capability */
    int multiprocessors;
    size_t shared_optin;  /* sharedMemPerBlockOptin */
    size_t shared_per_sm; /* sharedMemPerMultiprocessor */
    bool pdl; /* launch the kernels that support it with programmatic dependent launch (docs/kernels.md §9.5) */
    int forced_warps; /* QMM_CUDA_WARPS: the mma_gemv family's warps per block (0: the launcher's rule) */
    int gemv_warps_model; /* the launcher's rule for them: 1 its model, 0 (QMM_CUDA_GEMV_WARPS_MODEL=0) the one-wave rule */
    cudaStream_t stream;
    /* The split-K workspace of the tile families (mma_tile, mma_tile_n, wgmma_tile), allocated with the first
     * repacked weights (tile_workspace) and kept until the context closes (a captured graph holds these pointers):
     * QMM_TILE_PARTIAL_FLOATS f32 partial tiles and QMM_TILE_COUNTERS arrival counters (zeroed; each tile's
     * last split resets its counter). NULL until then: launches fall back to one split. */
    float *tile_partials;
    unsigned *tile_counters;
    /* The wgmma_tile rows' workspace for x prepared once per call (qmm_cuda_wgmma_prepared_bytes), grown on demand
     * outside stream captures; a buffer it outgrew is kept until the context closes (a captured graph may hold it). */
    void *wgmma_prepared;
    size_t wgmma_prepared_bytes;
    void **wgmma_prepared_retired;
    size_t wgmma_prepared_retired_count;
    /* gather scratch, grown on demand; a gather is not a chain step, so no graph holds these pointers: the gathered
     * rows of x, and the call's upload — the lhs indices (uint32, padded to 16 bytes) when x's rows must be gathered,
     * then the tables of the grouped classes too large for a launch's parameters (qmm_cuda_gemv_product) */
    void *gather_x;
    size_t gather_x_bytes;
    void *gather_upload;
    size_t gather_upload_bytes;
    /* the upload's host side: two malloc'd slots used in turn, each with an event recorded after its copy; a slot is
     * rewritten only once that event has completed (CUDA documents no point at which an asynchronous copy from
     * pageable memory has read its source, so the buffer is kept until the copy is done) */
    void *gather_staging[2];
    size_t gather_staging_bytes[2];
    cudaEvent_t gather_staged[2];
    int gather_slot;
} cuda_state;

/* The repacked arrays of one weights object (device pointers), or all NULL when its format has no
 * repacked kernel. */
typedef struct cuda_weights_extra {
    uint32_t *packed; /* tiles of 16 rows (qmm_cuda_repack): (ceil(N/16) + QMM_CUDA_PAD_ROW_TILES)·16·qmm_cuda_packed_words_per_row(K, bits) */
    void *sb;         /* (scale, bias) pairs in the tiled layout (qmm_cuda_repack_sb) */
} cuda_weights_extra;

/* ───────────────────────────── hooks ───────────────────────────── */

static qmm_status cuda_open(int device, void **state) {
    *state = NULL;
    int count = 0;
    cudaError_t error = cudaGetDeviceCount(&count);
    if (error == cudaErrorInsufficientDriver || error == cudaErrorNoDevice)
        return qmm_error(QMM_ERR_UNSUPPORTED, "no CUDA device: %s (cudaGetDeviceCount: %s)",
                         error == cudaErrorNoDevice ? "the driver sees no CUDA-capable GPU"
                                                    : "no NVIDIA driver is loaded, or it is older than this CUDA runtime",
                         cudaGetErrorString(error));
    if (error != cudaSuccess)
        return qmm_error(QMM_ERR_UNSUPPORTED, "no CUDA device: cudaGetDeviceCount failed: %s", cudaGetErrorString(error));
    if (count == 0) return qmm_error(QMM_ERR_UNSUPPORTED, "no CUDA device: the driver reports 0 devices");
    if (device < 0 || device >= count)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "CUDA device=%d does not exist: %d device(s), ordinals 0..%d", device,
                         count, count - 1);
    CUDA_TRY(cudaSetDevice(device));
    struct cudaDeviceProp properties;
    CUDA_TRY(cudaGetDeviceProperties(&properties, device));
    if (properties.major < 8)
        return qmm_error(QMM_ERR_UNSUPPORTED, "CUDA device %d (%s) has compute capability %d.%d; qmm needs 8.0 or newer",
                         device, properties.name, properties.major, properties.minor);
    /* after every reason the backend cannot be had here (UNSUPPORTED: `--backend auto` goes on to the CPU), so that a
     * stray knob stops only a backend that would otherwise open */
    const qmm_status knobs_status = knobs_check(context_knobs, sizeof context_knobs / sizeof context_knobs[0]);
    if (knobs_status != QMM_OK) return knobs_status;
    cuda_state *created = calloc(1, sizeof *created);
    if (!created) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "no memory for the CUDA backend state");
    created->device = device;
    created->major = properties.major;
    created->minor = properties.minor;
    created->multiprocessors = properties.multiProcessorCount;
    created->shared_optin = properties.sharedMemPerBlockOptin;
    created->shared_per_sm = properties.sharedMemPerMultiprocessor;
    /* programmatic dependent launch of the GEMV kernels (sm_90 and newer); QMM_CUDA_PDL=0 turns it off */
    const char *pdl = getenv("QMM_CUDA_PDL");
    created->pdl = properties.major >= 9 && !(pdl && strcmp(pdl, "0") == 0);
    /* QMM_CUDA_WARPS=n (1–16, checked above) forces the mma_gemv family's warps per block (experiments, docs/PERF.md) */
    const char *warps = getenv("QMM_CUDA_WARPS");
    created->forced_warps = warps && *warps ? (int)strtol(warps, NULL, 10) : 0;
    /* QMM_CUDA_GEMV_WARPS_MODEL=0: the mma_gemv launcher's one-wave rule instead of its model (kernels.cu gemv_warps;
     * A/B runs, docs/PERF.md) */
    const char *warps_model = getenv("QMM_CUDA_GEMV_WARPS_MODEL");
    created->gemv_warps_model = !(warps_model && strcmp(warps_model, "0") == 0);
    error = cudaStreamCreateWithFlags(&created->stream, cudaStreamNonBlocking);
    if (error != cudaSuccess) {
        free(created);
        return qmm_error(QMM_ERR_BACKEND, "cudaStreamCreateWithFlags failed: %s (%s:%d)", cudaGetErrorString(error),
                         __FILE__, __LINE__);
    }
    *state = created;
    return QMM_OK;
}

static void cuda_close(void *state) {
    cuda_state *s = state;
    if (!s) return;
    cudaSetDevice(s->device);
    cudaStreamSynchronize(s->stream);
    cudaStreamDestroy(s->stream);
    if (s->tile_partials) cudaFree(s->tile_partials);
    if (s->tile_counters) cudaFree(s->tile_counters);
    if (s->wgmma_prepared) cudaFree(s->wgmma_prepared);
    for (size_t i = 0; i < s->wgmma_prepared_retired_count; i++) cudaFree(s->wgmma_prepared_retired[i]);
    free(s->wgmma_prepared_retired);
    if (s->gather_x) cudaFree(s->gather_x);
    if (s->gather_upload) cudaFree(s->gather_upload);
    for (int slot = 0; slot < 2; slot++) {
        free(s->gather_staging[slot]);
        if (s->gather_staged[slot]) cudaEventDestroy(s->gather_staged[slot]);
    }
    free(s);
}

static qmm_status cuda_alloc(void *state, size_t bytes, void **memory) {
    cuda_state *s = state;
    *memory = NULL;
    CUDA_TRY(cudaSetDevice(s->device));
    cudaError_t error = cudaMalloc(memory, bytes ? bytes : 1);
    if (error == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* clear the sticky-free error so later calls are not blamed for it */
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cudaMalloc of %zu bytes failed: out of device memory", bytes);
    }
    if (error != cudaSuccess)
        return qmm_error(QMM_ERR_BACKEND, "cudaMalloc(%zu bytes) failed: %s (%s:%d)", bytes, cudaGetErrorString(error),
                         __FILE__, __LINE__);
    return QMM_OK;
}

static void cuda_release(void *state, void *memory) {
    cuda_state *s = state;
    if (!memory) return;
    cudaSetDevice(s->device);
    cudaStreamSynchronize(s->stream); /* queued work may still read it */
    cudaFree(memory);
}

static qmm_status cuda_upload(void *state, void *device_dst, const void *host_src, size_t bytes) {
    cuda_state *s = state;
    if (!bytes) return QMM_OK;
    CUDA_TRY(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, s->stream));
    CUDA_TRY(cudaStreamSynchronize(s->stream));
    return QMM_OK;
}

static qmm_status cuda_download(void *state, void *host_dst, const void *device_src, size_t bytes) {
    cuda_state *s = state;
    if (!bytes) return QMM_OK;
    CUDA_TRY(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, s->stream));
    CUDA_TRY(cudaStreamSynchronize(s->stream));
    return QMM_OK;
}

static qmm_status cuda_synchronize(void *state) {
    cuda_state *s = state;
    CUDA_TRY(cudaStreamSynchronize(s->stream));
    return QMM_OK;
}

/* Whether a tensor-core family can read a matrix of this format (and so whether to repack it): f16/bf16 for the
 * mma_gemv, mma_tile and wgmma_tile rows, f32 for mma_tile_bf16x3. */
static bool mma_format(const qmm_qmatrix *format) {
    return (format->bits == 4 || format->bits == 8) &&
           (format->dtype == QMM_F16 || format->dtype == QMM_BF16 || format->dtype == QMM_F32) &&
           format->cols <= 0x7fffffff && format->rows <= 0x7fffffff;
}

static void cuda_weights_release(void *state, void *extra) {
    cuda_weights_extra *e = extra;
    if (!e) return;
    cuda_release(state, e->packed);
    cuda_release(state, e->sb);
    free(e);
}

/* The mma_tile split-K workspace, allocated with the first weights the tile family reads (never during a
 * stream capture, and before any graph can hold its pointers) and kept until the context closes. */
static qmm_status tile_workspace(cuda_state *s) {
    if (s->tile_partials) return QMM_OK;
    void *partials = NULL, *counters = NULL;
    qmm_status status = cuda_alloc(s, QMM_TILE_PARTIAL_FLOATS * sizeof(float), &partials);
    if (status != QMM_OK) return status;
    if ((status = cuda_alloc(s, QMM_TILE_COUNTERS * sizeof(unsigned), &counters)) != QMM_OK) {
        cuda_release(s, partials);
        return status;
    }
    cudaError_t error = cudaMemsetAsync(counters, 0, QMM_TILE_COUNTERS * sizeof(unsigned), s->stream);
    if (error != cudaSuccess) {
        cuda_release(s, partials);
        cuda_release(s, counters);
        return qmm_error(QMM_ERR_BACKEND, "cudaMemsetAsync of the split-K counters failed: %s (%s:%d)",
                         cudaGetErrorString(error), __FILE__, __LINE__);
    }
    s->tile_partials = partials;
    s->tile_counters = counters;
    return QMM_OK;
}

/* The width this backend stores codes in (the stored_bits hook, src/core/kernel.h): 2- and 3-bit codes as 4-bit, 5-
 * and 6-bit as 8-bit, so that the tensor-core rows and ffma_gemv, which decode 4 and 8 bits, take every format (the
 * generic row, which decodes every width, takes about 1 ms for a 5120² product at M = 1 with f32 x, m8n64 6.5 µs
 * with f16 x: docs/PERF.md). The price: the bytes a product reads are the wider codes' (2-bit 2×, 3-bit 4/3, 5-bit
 * 8/5, 6-bit 4/3 of the format's), and the device memory that of a 4/8-bit matrix — the wider MLX-layout codes and
 * their repacked copy (weights_prepare; f16/bf16 scales), e.g. 2 × 4/3 = 2.67× a 3-bit matrix's code bytes, where the
 * generic rows needed 1×. QMM_CUDA_STORED_BITS=0 (read at each qmm_weights_create) keeps the caller's width. */
static const knob stored_bits_knob = {"QMM_CUDA_STORED_BITS", knob_zero_one, 0, 0,
                                      "0: 2/3/5/6-bit codes stored as they are (the generic rows), 1: as 4/8-bit ones"};
static qmm_status cuda_stored_bits(void *state, int bits, int *stored) {
    (void)state;
    *stored = bits;
    const qmm_status status = knob_check(&stored_bits_knob);
    if (status != QMM_OK) return status;
    const char *value = getenv(stored_bits_knob.name);
    if (!(value && strcmp(value, "0") == 0)) *stored = qmm_decoder_bits(bits);
    return QMM_OK;
}

/* Repacks the matrix for the mma families (docs/kernels.md §9) and uploads it; formats they do not read get no
 * extra arrays (*extra = NULL). The packed copy costs the weights' bytes once more on the device (rounded up to
 * 64 bytes per row and 16 rows); the MLX-layout arrays stay for the other kernels. */
static qmm_status cuda_weights_prepare(void *state, const qmm_qmatrix *matrix, void **extra) {
    *extra = NULL;
    if (!mma_format(matrix)) return QMM_OK;
    qmm_status workspace = tile_workspace(state);
    if (workspace != QMM_OK) return workspace;
    const size_t N = matrix->rows, K = matrix->cols;
    const size_t words = qmm_cuda_packed_words_per_row(K, matrix->bits);
    /* Both arrays hold QMM_CUDA_PAD_ROW_TILES zero tiles of 16 rows past the last (the mma_gemv copies check no row
     * against N). (N + 15 + 16·pad)·words·4 bytes bound both: the packed rows (tiles of 16 rows, the last one
     * zero-filled), and the pairs (≤ 4 per row and super-block of 16 packed words, ≤ 2 words each) */
    const size_t pad_rows = 16 * QMM_CUDA_PAD_ROW_TILES;
    size_t bound;
    if (N > SIZE_MAX - 15 - pad_rows || !qmm_mul_size(N + 15 + pad_rows, words, &bound) || !qmm_mul_size(bound, 4, &bound))
        return qmm_error(QMM_ERR_OVERFLOW, "the repacked weights of a %zu×%zu matrix overflow size_t", N, K);
    const int scale_bytes = (int)qmm_dtype_size(matrix->dtype);
    const size_t tiled_rows = (N + 15) / 16 * 16 + pad_rows; /* the zero padding is part of both uploads */
    const size_t packed_bytes = tiled_rows * words * 4,
                 pairs = qmm_cuda_sb_words(tiled_rows, K, matrix->bits, matrix->group_size, scale_bytes);
    qmm_status status = QMM_OK;
    uint32_t *host_packed = calloc(packed_bytes, 1); /* zero: the padding tiles (the repacks write the rest) */
    uint32_t *host_sb = calloc(pairs, 4);
    cuda_weights_extra *created = calloc(1, sizeof *created);
    if (!host_packed || !host_sb || !created) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "no host memory to repack a %zu×%zu matrix", N, K);
        goto cleanup;
    }
    qmm_cuda_repack(matrix->w, N, K, matrix->bits, host_packed);
    qmm_cuda_repack_sb(matrix->scales, matrix->biases, N, K, matrix->bits, matrix->group_size, scale_bytes, host_sb);
    if ((status = cuda_alloc(state, packed_bytes, (void **)&created->packed)) != QMM_OK) goto cleanup;
    if ((status = cuda_alloc(state, pairs * 4, &created->sb)) != QMM_OK) goto cleanup;
    if ((status = cuda_upload(state, created->packed, host_packed, packed_bytes)) != QMM_OK) goto cleanup;
    if ((status = cuda_upload(state, created->sb, host_sb, pairs * 4)) != QMM_OK) goto cleanup;
    *extra = created;
    created = NULL;

cleanup:
    if (created) cuda_weights_release(state, created);
    free(host_packed);
    free(host_sb);
    return status;
}

/* A chain's captured graph: one event before the first step and one after each. */
typedef struct cuda_graph {
    cudaGraphExec_t exec;
    cudaEvent_t *events; /* count + 1 when step_events, else 2 recorded outside the graph around its launch */
    size_t count;
    bool step_events;
} cuda_graph;

static void cuda_chain_release(void *state, void *graph) {
    cuda_graph *g = graph;
    if (!g) return;
    cuda_state *s = state;
    cudaSetDevice(s->device);
    cudaStreamSynchronize(s->stream);
    if (g->exec) cudaGraphExecDestroy(g->exec);
    for (size_t i = 0; g->events && i <= (g->step_events ? g->count : 1); i++)
        if (g->events[i]) cudaEventDestroy(g->events[i]);
    free(g->events);
    free(g);
}

/* Captures the chain's launches into one graph (stream capture, thread-local mode). */
static qmm_status capture(cuda_state *s, size_t count, qmm_status (*launch)(void *, size_t), void *argument,
                          bool step_events, cuda_graph **out) {
    qmm_status status = QMM_OK;
    cudaGraph_t graph = NULL;
    bool capturing = false;
    cuda_graph *created = calloc(1, sizeof *created);
    if (!created || !(created->events = calloc(count + 1, sizeof *created->events))) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "no memory for a chain of %zu steps", count);
        goto cleanup;
    }
    created->count = count;
    created->step_events = step_events;
    for (size_t i = 0; i <= (step_events ? count : 1); i++) {
        cudaError_t error = cudaEventCreate(&created->events[i]);
        if (error != cudaSuccess) {
            status = qmm_error(QMM_ERR_BACKEND, "cudaEventCreate failed: %s (%s:%d)", cudaGetErrorString(error), __FILE__,
                               __LINE__);
            goto cleanup;
        }
    }
    cudaError_t error = cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal);
    if (error != cudaSuccess) {
        status = qmm_error(QMM_ERR_BACKEND, "cudaStreamBeginCapture failed: %s (%s:%d)", cudaGetErrorString(error),
                           __FILE__, __LINE__);
        goto cleanup;
    }
    capturing = true;
    for (size_t i = 0; i <= count && status == QMM_OK; i++) {
        /* External: an event recorded inside a graph can be timed from outside it only with this flag. */
        error = step_events ? cudaEventRecordWithFlags(created->events[i], s->stream, cudaEventRecordExternal)
                            : cudaSuccess;
        if (error != cudaSuccess)
            status = qmm_error(QMM_ERR_BACKEND, "cudaEventRecord failed during capture: %s (%s:%d)",
                               cudaGetErrorString(error), __FILE__, __LINE__);
        else if (i < count)
            status = launch(argument, i);
    }
    capturing = false;
    error = cudaStreamEndCapture(s->stream, &graph);
    if (status != QMM_OK) goto cleanup;
    if (error != cudaSuccess) {
        status = qmm_error(QMM_ERR_BACKEND, "cudaStreamEndCapture failed: %s (%s:%d)", cudaGetErrorString(error),
                           __FILE__, __LINE__);
        goto cleanup;
    }
    error = cudaGraphInstantiate(&created->exec, graph, 0);
    if (error != cudaSuccess) {
        status = qmm_error(QMM_ERR_BACKEND, "cudaGraphInstantiate failed: %s (%s:%d)", cudaGetErrorString(error),
                           __FILE__, __LINE__);
        goto cleanup;
    }
    *out = created;
    created = NULL;

cleanup:
    if (capturing) {
        cudaGraph_t discarded = NULL;
        cudaStreamEndCapture(s->stream, &discarded);
        if (discarded) cudaGraphDestroy(discarded);
    }
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError(); /* a failed capture leaves an error behind: clear it */
    if (created) cuda_chain_release(s, created);
    return status;
}

static qmm_status cuda_chain_run(void *state, void **graph, size_t count, qmm_status (*launch)(void *, size_t),
                                 void *argument, double *microseconds, double *total_microseconds) {
    cuda_state *s = state;
    CUDA_TRY(cudaSetDevice(s->device));
    const bool step_events = microseconds != NULL;
    if (*graph && ((cuda_graph *)*graph)->step_events != step_events) {
        cuda_chain_release(s, *graph);
        *graph = NULL;
    }
    if (!*graph) {
        cuda_graph *created = NULL;
        qmm_status status = capture(s, count, launch, argument, step_events, &created);
        if (status != QMM_OK) return status;
        *graph = created;
    }
    cuda_graph *g = *graph;
    if (!step_events) CUDA_TRY(cudaEventRecord(g->events[0], s->stream));
    CUDA_TRY(cudaGraphLaunch(g->exec, s->stream));
    if (!step_events) CUDA_TRY(cudaEventRecord(g->events[1], s->stream));
    CUDA_TRY(cudaStreamSynchronize(s->stream));
    for (size_t i = 0; step_events && i < count; i++) {
        float ms = 0.0f;
        CUDA_TRY(cudaEventElapsedTime(&ms, g->events[i], g->events[i + 1]));
        microseconds[i] = 1000.0 * ms;
    }
    float ms = 0.0f;
    CUDA_TRY(cudaEventElapsedTime(&ms, g->events[0], g->events[step_events ? count : 1]));
    *total_microseconds = 1000.0 * ms;
    return QMM_OK;
}

/* ───────────────────────────── kernel rows ───────────────────────────── */

/* QMM_CUDA_GEMV_STAGED_X=1 or 0 forces the staged tiles' (m8n64, m8n48, m8n64_48) x through shared memory on or off
 * (experiments and the GPU tests; read at each call of those rows, like QMM_CUDA_SPLITS at a split count): 1, -1, or 0 — the
 * launcher's rule (kernels.cu, launch_mma_gemv) — when unset or any other value. */
static int staged_x_forced(void) {
    const char *forced = getenv("QMM_CUDA_GEMV_STAGED_X");
    if (!forced) return 0;
    return strcmp(forced, "1") == 0 ? 1 : strcmp(forced, "0") == 0 ? -1 : 0;
}

static qmm_cuda_launch launch_of(const qmm_call *call) {
    const cuda_state *s = call->backend_state;
    const cuda_weights_extra *e = call->weights_extra;
    qmm_cuda_launch launch = {
        .dtype = (int)call->dtype,
        .bits = call->bits,
        .group_size = call->group_size,
        .M = call->M,
        .N = call->N,
        .K = call->K,
        .x = call->x,
        .w = call->w,
        .scales = call->scales,
        .biases = call->biases,
        .packed = e ? e->packed : NULL,
        .sb = e ? e->sb : NULL,
        .out = call->out,
        .stream = s->stream,
        .warps = s->forced_warps,
        .gemv_warps_model = s->gemv_warps_model,
        .multiprocessors = s->multiprocessors,
        .shared_optin = s->shared_optin,
        .pdl = s->pdl,
    };
    return launch;
}

/* Grid limits of the generic kernels: 65535 blocks along y (rows of x, 8 per block, looped beyond) and
 * 2^31 − 1 along x (N/256 blocks). */
static bool generic_supports(const qmm_call *call, char *why_not, size_t size) {
    if (call->N / 256 >= 0x7fffffffu) {
        snprintf(why_not, size, "N=%zu exceeds the grid of the generic kernel (2^31 - 1 blocks of 256)", call->N);
        return false;
    }
    return true;
}

static qmm_status generic_t_run(const qmm_call *call) {
    CALL_KNOBS_CHECK();
    qmm_cuda_launch launch = launch_of(call);
    return launch_status(qmm_cuda_generic_qmm_t(&launch), "cuda.qmm_t.generic.m8n256", __FILE__, __LINE__);
}

static qmm_status generic_n_run(const qmm_call *call) {
    CALL_KNOBS_CHECK();
    qmm_cuda_launch launch = launch_of(call);
    return launch_status(qmm_cuda_generic_qmm_n(&launch), "cuda.qmm_n.generic.m8n256", __FILE__, __LINE__);
}

/* What every tensor-core row needs besides its dtype: 4- or 8-bit codes and mma.sync (sm_80). */
static bool tensor_core_supports(const qmm_call *call, char *why_not, size_t size) {
    const cuda_state *s = call->backend_state;
    if (call->bits != 4 && call->bits != 8) {
        snprintf(why_not, size, "bits=%d: the tensor-core families decode 4- and 8-bit codes only", call->bits);
        return false;
    }
    if (s->major < 8) {
        snprintf(why_not, size, "mma.sync m16n8k16 needs compute capability 8.0, the device has %d.%d", s->major, s->minor);
        return false;
    }
    return true;
}

/* ... and of the rows that read the repacked arrays: those arrays, within 32-bit offsets. */
static bool repacked_supports(const qmm_call *call, char *why_not, size_t size) {
    if (!tensor_core_supports(call, why_not, size)) return false;
    const size_t quads = qmm_cuda_packed_words_per_row(call->K, call->bits) / 4; /* 16-byte words per row */
    if ((call->N + 15) / 16 * 16 + 16 * QMM_CUDA_PAD_ROW_TILES > 0x7fffffffu / quads) {
        snprintf(why_not, size, "N=%zu rows (in tiles of 16, %d zero tiles after them) of %zu 16-byte words exceed the "
                 "family's 32-bit offsets (2^31 - 1)", call->N, QMM_CUDA_PAD_ROW_TILES, quads);
        return false;
    }
    if (!call->weights_extra) {
        snprintf(why_not, size, "the weights were not repacked for the mma family (N or K above 2^31 - 1)");
        return false;
    }
    return true;
}

/* The tile families' grid: tiles of `tokens` rows of x along grid.y (at most 65535; the wgmma rows number their tiles
 * along grid.x and keep the limit), and M, K < 2^31 (int offsets in the kernels). */
static bool tile_grid_supports(const qmm_call *call, size_t tokens, char *why_not, size_t size) {
    if (call->M > (size_t)65535 * tokens || call->M > 0x7fffffffu || call->K > 0x7fffffffu) {
        snprintf(why_not, size, "M=%zu exceeds the tile grid (65535 tiles of %zu rows of x, and M, K < 2^31)", call->M,
                 tokens);
        return false;
    }
    return true;
}

/* mma_tile_n (kernels_n.cu): qmm_n on the tensor cores from the MLX-layout arrays, f16/bf16, 4/8-bit, any M, N, K. */
static bool tile_n_supports(const qmm_call *call, int tile, char *why_not, size_t size) {
    if (!tensor_core_supports(call, why_not, size)) return false;
    if (call->dtype != QMM_F16 && call->dtype != QMM_BF16) {
        snprintf(why_not, size, "dtype %s: the mma_tile_n row multiplies f16 or bf16 (x·s as bf16 parts); f32 qmm_n runs "
                 "on the generic row", qmm_dtype_name(call->dtype));
        return false;
    }
    int bn, bm, bk;
    qmm_cuda_mma_tile_n_shape(tile, &bn, &bm, &bk);
    if (call->N > 0x7fffffffu || call->K > 0x7fffffffu - (size_t)bk) {
        snprintf(why_not, size, "N=%zu or K=%zu exceeds the mma_tile_n row's int offsets (N < 2^31, K < 2^31 - %d)",
                 call->N, call->K, bk);
        return false;
    }
    return tile_grid_supports(call, (size_t)bm, why_not, size);
}

/* The limits every split-K count keeps (split_k_count, wgmma_splits): QMM_CUDA_SPLITS=n replaces the wanted
 * `splits`; then ≥ 4 units (super-blocks or stages) per split, at most 16, a counter per tile and the partial tiles
 * (tile_floats f32 each) within the workspace; 1 in batch-invariant mode or before the workspace exists. */
static int split_limits(const qmm_call *call, const cuda_state *s, size_t tiles, size_t tile_floats, size_t units,
                        size_t splits) {
    const char *forced = getenv("QMM_CUDA_SPLITS");
    if (forced && *forced) splits = (size_t)strtoul(forced, NULL, 10);
    if (splits > units / 4) splits = units / 4;
    if (splits > 16) splits = 16;
    if (tiles > QMM_TILE_COUNTERS) splits = 1;
    while (splits > 1 && tiles * splits * tile_floats > QMM_TILE_PARTIAL_FLOATS) splits--;
    if (call->batch_invariant || splits <= 1 || !s->tile_partials) return 1;
    return (int)splits;
}

/* Splits of K for a split-K launch of the tile families (mma_tile, mma_tile_n; the workspace of tile_workspace): enough
 * blocks to give every SM `blocks_per_sm` of them when the bm × bn tiles alone are too few, each split keeping ≥ 4 of
 * the `units` along K (64-byte super-blocks, or stages), at most 16, within the workspace. 1 when the tiles already
 * fill the device, in batch-invariant mode (split-K changes the order of the sum over K), or before any repacked
 * weights made the workspace. QMM_CUDA_SPLITS=n forces n (experiments, docs/PERF.md). */
static int split_k_count(const qmm_call *call, size_t bn, size_t bm, size_t blocks_per_sm, size_t units,
                         const cuda_state *s) {
    const size_t tiles = ((call->N + bn - 1) / bn) * ((call->M + bm - 1) / bm);
    const size_t target = (size_t)s->multiprocessors * blocks_per_sm;
    return split_limits(call, s, tiles, bm * bn, units, tiles >= target ? 1 : (target + tiles - 1) / tiles);
}

/* A tile family's launch: launch_of's, with `splits` splits of K and the context's split-K workspace. */
static qmm_cuda_launch split_launch_of(const qmm_call *call, int splits) {
    const cuda_state *s = call->backend_state;
    qmm_cuda_launch launch = launch_of(call);
    launch.splits = splits;
    launch.partials = s->tile_partials;
    launch.counters = s->tile_counters;
    return launch;
}

/* Splits of K for an mma_tile launch (split_k_count): the blocks one SM holds by the register cap, fewer where shared
 * memory (1 KB per block for the driver) runs out first (m16n256: 2 on an H100/H200, 1 on an A100); 64-byte
 * super-blocks as the units. */
static int tile_splits(const qmm_call *call, int tile) {
    const cuda_state *s = call->backend_state;
    int bn, bm, threads, blocks_per_sm;
    size_t shared;
    qmm_cuda_mma_tile_shape(tile, call->bits, &bn, &bm, &threads, &blocks_per_sm, &shared);
    const size_t by_shared = s->shared_per_sm / (shared + 1024);
    if (by_shared >= 1 && by_shared < (size_t)blocks_per_sm) blocks_per_sm = (int)by_shared;
    const size_t super_blocks = qmm_cuda_packed_words_per_row(call->K, call->bits) / 16; /* 64 bytes each */
    return split_k_count(call, (size_t)bn, (size_t)bm, (size_t)blocks_per_sm, super_blocks, s);
}

/* Splits of K for an mma_tile_n launch (split_k_count): 4 blocks per SM (its register and shared-memory budget),
 * stages of 64 rows k as the units. */
static int tile_n_splits(const qmm_call *call, int tile) {
    const cuda_state *s = call->backend_state;
    int bn, bm, bk;
    qmm_cuda_mma_tile_n_shape(tile, &bn, &bm, &bk);
    return split_k_count(call, (size_t)bn, (size_t)bm, 4, (call->K + (size_t)bk - 1) / (size_t)bk, s);
}

#define TILE_N_ROW(NAME, TILE)                                                                                    \
    static bool NAME##_supports(const qmm_call *call, char *why_not, size_t size) {                               \
        return tile_n_supports(call, TILE, why_not, size);                                                        \
    }                                                                                                             \
    static qmm_status NAME##_run(const qmm_call *call) {                                                          \
        CALL_KNOBS_CHECK();                                                                                       \
        qmm_cuda_launch launch = split_launch_of(call, tile_n_splits(call, TILE));                                \
        return launch_status(qmm_cuda_mma_tile_qmm_n(&launch, TILE), #NAME, __FILE__, __LINE__);                 \
    }

TILE_N_ROW(tile_n_m32n64, 0)
TILE_N_ROW(tile_n_m8n128, 1)

/* mma_gemv rows: row_tiles × 16 weight rows per warp, token_tiles × 8 rows of x (and the f16/bf16 tile rows).
 * The 16-token tiles (m16n32, m16n64) also take M = 17 … 64 in chunks of 16 rows of x on the same weights (m16n64
 * in one grid, below; the selector takes it so at M = 17–32, docs/kernels.md §9.1); the 32-token tile takes any M
 * through grid.y (the kernel's own chunks of 32). */
#define MMA_GEMV_CHUNKED_MAX_M 64
static bool mma_supports(const qmm_call *call, size_t max_m, size_t max_n, char *why_not, size_t size) {
    if (call->dtype != QMM_F16 && call->dtype != QMM_BF16) {
        snprintf(why_not, size, "dtype %s: this family multiplies f16 or bf16 on the tensor cores (f32 runs on "
                 "mma_tile_bf16x3, ffma_gemv or the generic kernel, at f32 accuracy)", qmm_dtype_name(call->dtype));
        return false;
    }
    if (call->M > max_m) {
        snprintf(why_not, size, "M=%zu exceeds this row's %zu rows of x", call->M, max_m);
        return false;
    }
    if (call->N > max_n) {
        snprintf(why_not, size, "N=%zu exceeds this row's %zu rows of weights (the most row tiles its grid.y holds)",
                 call->N, max_n);
        return false;
    }
    return repacked_supports(call, why_not, size);
}

/* m16n64 past M = 16: one grid of ceil(M/16) chunks per row tile (the kernel's grid.x, so the chunks of a row tile
 * run side by side and share its weights in L2), except where that gives no SM fewer blocks than separate launches
 * of 16 rows of x which each already fill every SM and stay in the row's measured M ≤ 16 box (≤ M16N64_ALONE_MAX
 * blocks; past it a lone launch lost to m16n32). Measured on the H200 at M = 20 and 32 (docs/PERF.md, fifteenth
 * session), one grid against one launch per chunk: 0.51–0.56× the time on 4096 rows (64 blocks, half the SMs idle in
 * each launch), 0.73 on 12288 (192 → 384 blocks), 0.84 on 27648 (432 → 864), 0.86–0.90 on 5120, 0.93–0.99 on 17408 —
 * but 1.05–1.10× on 14336×5120, whose 224 blocks per launch and 448 in one grid both put 4 on the busiest SM.
 * QMM_CUDA_M16N64_ONE_GRID=1/0 forces one grid / one launch per chunk (tests, experiments). */
#define M16N64_ALONE_MAX 300
/* m16n64's blocks (64 rows × 16 rows of x) times K from M = 33 (the selector's prefer_max_tiles_k): 5120² at M = 48.
 * Measured against the H200's wgmma tile, on shapes with K ≥ 4096 (docs/PERF.md, twenty-seventh session); where the
 * device has no wgmma rows (sm_80–89) the calls past it go to the mma_tile rows, which nobody has timed against
 * m16n64 there — `qmm tune` measures both on such a device. */
#define M16N64_MAX_WORK ((size_t)3 * 80 * 5120)
static bool m16n64_one_grid(const qmm_cuda_launch *launch) {
    const char *forced = getenv("QMM_CUDA_M16N64_ONE_GRID");
    if (forced && strcmp(forced, "1") == 0) return true;
    if (forced && strcmp(forced, "0") == 0) return false;
    const size_t chunks = (launch->M + 15) / 16, blocks = (launch->N + 63) / 64;
    if (chunks == 1 || launch->multiprocessors <= 0) return true;
    const size_t sms = (size_t)launch->multiprocessors;
    const size_t busiest_alone = chunks * ((blocks + sms - 1) / sms), busiest_one = (chunks * blocks + sms - 1) / sms;
    return blocks < sms || blocks > M16N64_ALONE_MAX || busiest_one < busiest_alone;
}

/* The 16-token tiles past M = 16: m16n64 one grid (above) or, like m16n32, one launch per chunk of 16 rows of x,
 * x and out advanced by the chunk's rows (f16/bf16: 2 bytes an element). Every other call is one launch. */
static qmm_status mma_gemv_launch(qmm_cuda_launch launch, int row_tiles, int token_tiles, const char *name) {
    const bool one_launch = token_tiles != 2 || (row_tiles == 4 && m16n64_one_grid(&launch));
    const size_t M = launch.M, chunk = one_launch ? M : 16;
    const char *x = launch.x;
    char *out = launch.out;
    for (size_t m0 = 0; m0 < M; m0 += chunk) {
        launch.x = x + m0 * launch.K * 2;
        launch.out = out + m0 * launch.N * 2;
        launch.M = M - m0 < chunk ? M - m0 : chunk;
        const qmm_status status =
            launch_status(qmm_cuda_mma_gemv_qmm_t(&launch, row_tiles, token_tiles), name, __FILE__, __LINE__);
        if (status != QMM_OK) return status;
    }
    return QMM_OK;
}

#define MMA_ROW(NAME, RT, TT)                                                                                     \
    static bool NAME##_supports(const qmm_call *call, char *why_not, size_t size) {                               \
        return mma_supports(call, (TT) == 4 ? (size_t)65535 * 32 : (TT) == 2 ? MMA_GEMV_CHUNKED_MAX_M : 8 * (TT),  \
                            (RT) == 4 && (TT) == 2 ? (size_t)65535 * 64 : SIZE_MAX, why_not, size);               \
    }                                                                                                             \
    static qmm_status NAME##_run(const qmm_call *call) {                                                          \
        CALL_KNOBS_CHECK();                                                                                       \
        qmm_cuda_launch launch = launch_of(call);                                                                 \
        if ((RT) >= 3 && (TT) == 1) launch.staged_x = staged_x_forced(); /* the tiles that stage x */             \
        return mma_gemv_launch(launch, RT, TT, #NAME);                                                            \
    }

MMA_ROW(mma_m8n16, 1, 1)
MMA_ROW(mma_m8n32, 2, 1)
MMA_ROW(mma_m8n48, 3, 1)
MMA_ROW(mma_m8n64, 4, 1)
MMA_ROW(mma_m16n32, 2, 2)
MMA_ROW(mma_m16n64, 4, 2)
MMA_ROW(mma_m16n48, 3, 2)
MMA_ROW(mma_m32n16, 1, 4)

/* m8n64_48: the 8-token staged tile in blocks of 64 and 48 rows, so that every SM gets the same number of blocks
 * (kernels.cu mma_gemv_mixed_kernel, mixed_blocks); M ≤ 8, one launch. It takes the calls m8n64 takes (m8n64's
 * supports in the table). */
static qmm_status mixed_run(const qmm_call *call, int token_tiles, const char *name) {
    CALL_KNOBS_CHECK();
    qmm_cuda_launch launch = launch_of(call);
    if (token_tiles == 1) launch.staged_x = staged_x_forced(); /* the 8-token tile stages x (the 16-token one never) */
    return launch_status(qmm_cuda_mma_gemv_mixed_qmm_t(&launch, token_tiles), name, __FILE__, __LINE__);
}
static qmm_status mma_m8n64_48_run(const qmm_call *call) { return mixed_run(call, 1, "mma_m8n64_48"); }

/* The device's SM count for the rows' own selector rules below (0: unknown). */
static int device_sms(const qmm_call *call) {
    const cuda_state *s = call->backend_state;
    return s ? s->multiprocessors : 0;
}

/* The mixed tiles' selector rule (qmm_kernel.prefer): only where their launcher cuts some 64-row blocks to 48 rows
 * (kernels.cu mixed_blocks, on the device's SM count) — elsewhere every block is 64 rows, m8n64's / m16n64's launch,
 * and the table's next rows decide (m16n64 is passed over past N = 19200 at M ≤ 16 for m16n32). */
static bool mixed_splits(const qmm_call *call) { return qmm_cuda_mixed_splits(call->N, device_sms(call)); }

/* m8n48's and m16n48's own rule (qmm_kernel.prefer), after their fill rule: not where blocks of 32 rows fit one wave on
 * the device's SMs and K ≥ QMM_GEMV_LONG_K. Every block then has an SM to itself whichever height it has, and over a
 * long K the busiest SM's 48 rows cost more than the taller block saves: on 4096×12288 (128 blocks of 32 rows, 86 of
 * 48) m16n32 took 0.84–0.97× m16n48's time at M = 9–16 on the H200 and the H100, m8n32 0.89–1.01× m8n48's at M ≤ 8
 * on the H200 (0.96–1.04 on the H100); on 4096² m8n48 stays ahead (0.85–0.96× m8n32's time) and m16n48 level
 * (0.93–1.04× m16n32's) — fiftieth session, docs/PERF.md. The bound on K lies between the two measured Ks (4096,
 * 12288); none between them was measured. Without the device's SM count the row is kept (the rule before it). */
#define QMM_GEMV_LONG_K 8192
static bool short_k_or_many_rows(const qmm_call *call) {
    const int sms = device_sms(call);
    return sms <= 0 || call->K < QMM_GEMV_LONG_K || (call->N + 31) / 32 > (size_t)sms;
}

/* m16n64_48: the 16-token tile in blocks of 64 and 48 rows (m16n64's and m16n48's bodies, mixed_blocks' counts), M ≤ 16
 * in one launch (one chunk of 16 rows of x). */
static bool mma_m16n64_48_supports(const qmm_call *call, char *why_not, size_t size) {
    return mma_supports(call, 16, SIZE_MAX, why_not, size);
}
static qmm_status mma_m16n64_48_run(const qmm_call *call) { return mixed_run(call, 2, "mma_m16n64_48"); }

/* ffma_gemv row: f32 activations with 4- or 8-bit weights, on the CUDA cores (kernels_ffma.cu). */
static bool ffma_supports(const qmm_call *call, char *why_not, size_t size) {
    if (call->dtype != QMM_F32) {
        snprintf(why_not, size, "dtype %s: the ffma_gemv row computes f32 activations (f16/bf16 go to the tensor cores)",
                 qmm_dtype_name(call->dtype));
        return false;
    }
    if (call->bits != 4 && call->bits != 8) {
        snprintf(why_not, size, "bits=%d: the ffma_gemv row decodes 4- and 8-bit codes only", call->bits);
        return false;
    }
    if (call->M > (size_t)65535 * 8 || call->N > 0x7fffffffu || call->K > 0x7fffffffu) {
        snprintf(why_not, size, "M=%zu, N=%zu or K=%zu exceeds the ffma_gemv grid (M ≤ 65535·8, N and K < 2^31)", call->M,
                 call->N, call->K);
        return false;
    }
    return true;
}

static qmm_status ffma_run(const qmm_call *call) {
    CALL_KNOBS_CHECK();
    qmm_cuda_launch launch = launch_of(call);
    return launch_status(qmm_cuda_ffma_gemv_qmm_t(&launch), "cuda.qmm_t.ffma_gemv.m8n16", __FILE__, __LINE__);
}


/* mma_tile rows (M > 32 by the selector's order, m16n256 also M 17–32 in batch-invariant calls; any M when forced or
 * batch-invariant). A tile whose block needs
 * more shared memory than the device lets a block have (m32n256 at 4 bits: 112 KB, above sm_86/89's 99 KB) refuses.
 * Tile 4 (mma_tile_bf16x3) takes f32 only, the others f16 and bf16. */
static bool tile_supports(const qmm_call *call, int tile, char *why_not, size_t size) {
    const cuda_state *s = call->backend_state;
    if (tile == 4) {
        if (call->dtype != QMM_F32) {
            snprintf(why_not, size, "dtype %s: the mma_tile_bf16x3 row takes f32 activations (as three bf16 parts); "
                     "f16 and bf16 go to the other tensor-core rows", qmm_dtype_name(call->dtype));
            return false;
        }
        if (!repacked_supports(call, why_not, size)) return false;
    } else if (!mma_supports(call, SIZE_MAX, SIZE_MAX, why_not, size))
        return false;
    int bn, bm, threads, resident;
    size_t shared;
    qmm_cuda_mma_tile_shape(tile, call->bits, &bn, &bm, &threads, &resident, &shared);
    if (shared > s->shared_optin) {
        snprintf(why_not, size, "the tile's block needs %zu bytes of shared memory at %d bits, the device allows %zu",
                 shared, call->bits, s->shared_optin);
        return false;
    }
    return tile_grid_supports(call, (size_t)bm, why_not, size);
}

#define TILE_ROW(NAME, TILE)                                                                                      \
    static bool NAME##_supports(const qmm_call *call, char *why_not, size_t size) {                               \
        return tile_supports(call, TILE, why_not, size);                                                          \
    }                                                                                                             \
    static qmm_status NAME##_run(const qmm_call *call) {                                                          \
        CALL_KNOBS_CHECK();                                                                                       \
        qmm_cuda_launch launch = split_launch_of(call, tile_splits(call, TILE));                                  \
        return launch_status(qmm_cuda_mma_tile_qmm_t(&launch, TILE), #NAME, __FILE__, __LINE__);                 \
    }

TILE_ROW(tile_m64n64, 0)
TILE_ROW(tile_m64n128, 1)
TILE_ROW(tile_m16n256, 2)
TILE_ROW(tile_m32n256, 3)
TILE_ROW(tile_bf16x3_m32n128, 4)

/* wgmma_tile rows (kernels_wgmma.cu): sm_90a code, so a compute capability 9.0 device. */
static bool wgmma_supports(const qmm_call *call, size_t tokens, char *why_not, size_t size) {
    const cuda_state *s = call->backend_state;
    if (!mma_supports(call, SIZE_MAX, SIZE_MAX, why_not, size)) return false;
    if (s->major != 9 || s->minor != 0) {
        snprintf(why_not, size, "wgmma is Hopper's (sm_90a code, compute capability 9.0): the device has %d.%d", s->major,
                 s->minor);
        return false;
    }
    if (!tile_grid_supports(call, tokens, why_not, size)) return false;
    const size_t tiles_n = (call->N + 127) / 128, tiles_m = (call->M + tokens - 1) / tokens;
    if (tiles_n > (size_t)INT_MAX / tiles_m) { /* one block per tile along grid.x, numbered in an int */
        snprintf(why_not, size, "N=%zu and M=%zu make %zu × %zu tiles of 128 rows × %zu tokens: the wgmma grid holds < 2^31",
                 call->N, call->M, tiles_n, tiles_m, tokens);
        return false;
    }
    return true;
}

/* Splits of K for a wgmma_tile launch, and its blocks an SM (*blocks: 2 for the 32-token tile's unsplit launch by the
 * rule below, else 1). Otherwise its block has an SM to itself (384 threads at 168 registers, 100–170 KB of
 * shared memory), so a grid of fewer tiles than SMs leaves SMs idle, and every split adds a fixed cost (its pipeline
 * filling and draining, the partial tile written and summed). The count minimises waves × (super-blocks per split +
 * 8), the 8 fitted to the tenth session's A/B on the H200 (docs/PERF.md: 40 tiles of 5120² at M = 128 → 3 splits,
 * 43 vs 77 µs; 112 tiles of 14336×5120 → 1, where 7 splits cost 1.2×) — then split_limits (QMM_CUDA_SPLITS, at
 * most 16, ≥ 4 super-blocks per split, the workspace).
 * The last wave: where the tiles fill some whole waves and a part of one (160 tiles of 5120² at M = 512 on 132
 * SMs: one wave and 28 tiles), the whole waves may run unsplit and only the rest be split across the SMs — two
 * launches (*whole_tiles = the tiles of the whole waves, the return value the rest's splits), chosen where the same
 * model costs it less: 5120² M = 512, 40 super-blocks, 48 + 18 against 96 for two unsplit waves (the workspace
 * holds no 2 splits of all 160 tiles). Only where the rest is at most half a wave: a part-full wave runs each of its
 * tiles faster than a full one (less contention for HBM and L2), which the model does not see — measured on the
 * H200 (twenty-third session), the split rest cost 1.03–1.09× where it filled 55–64 % of a wave (27648×5120 at
 * M = 64/128/512) and gained 0.74–0.98× where it filled 21–39 % (about half the model's saving, and nothing where
 * the model saved 2.5 %: 27648×5120 at M = 2048) — and only where the model saves ≥ 5 %. Not with a forced count;
 * QMM_CUDA_WGMMA_LAST_WAVE=0 turns it off (experiments, docs/PERF.md). */
static int wgmma_splits(const qmm_call *call, size_t tokens, int *whole_tiles, int *blocks) {
    const cuda_state *s = call->backend_state;
    const size_t tiles = ((call->N + 127) / 128) * ((call->M + tokens - 1) / tokens);
    const size_t units = qmm_cuda_packed_words_per_row(call->K, call->bits) / 16, sms = (size_t)s->multiprocessors;
    *whole_tiles = 0;
    *blocks = 1;
    const char *forced = getenv("QMM_CUDA_SPLITS"), *last_wave = getenv("QMM_CUDA_WGMMA_LAST_WAVE"),
               *two = getenv("QMM_CUDA_WGMMA32_BLOCKS");
    /* The 32-token tile two blocks an SM, unsplit, where its tiles are at least 1.4 waves of single blocks: 216 tiles
     * of 27648×5120 at M = 17–32 in 0.82–0.85× the time of two waves (the second of 84 tiles, too many for the split
     * last wave), 192 / 256 / 266 / 300 / 320 / 512 tiles 0.94 / 0.83 / 0.99 / 0.95 / 0.91 / 0.82; not at 136 and 160,
     * where the one-block launch's split last wave took 0.90–0.95× the two blocks' time, nor where the tiles fit one
     * wave of single blocks (a two-block form whose model counted 264 slots, and so split further, took 0.85–1.08×
     * there) (H100, docs/PERF.md, fifty-second session).
     * QMM_CUDA_WGMMA32_BLOCKS=2 takes it at every unforced count (tests: every shape through it), =1 never. */
    if (tokens == 32 && !(forced && *forced) && sms > 0 && !(two && strcmp(two, "1") == 0) &&
        (tiles * 5 >= sms * 7 || (two && strcmp(two, "2") == 0))) {
        *blocks = 2;
        return 1;
    }
    /* the most splits the limits allow (the forced count, where there is one: split_limits returns it again below) */
    const size_t most = (size_t)split_limits(call, s, tiles, tokens * 128, units, 16);
    size_t best = 1, best_cost = SIZE_MAX;
    for (size_t splits = 1; sms > 0 && splits <= most; splits++) {
        const size_t waves = (tiles * splits + sms - 1) / sms, cost = waves * ((units + splits - 1) / splits + 8);
        if (cost < best_cost) best = splits, best_cost = cost;
    }
    const bool try_last_wave = !(forced && *forced) && !(last_wave && strcmp(last_wave, "0") == 0);
    const size_t rest = sms > 0 ? tiles % sms : 0, whole = tiles - rest;
    if (try_last_wave && tiles > sms && rest > 0 && rest * 2 <= sms && tiles <= (size_t)INT_MAX) {
        const size_t rest_most = (size_t)split_limits(call, s, rest, tokens * 128, units, 16);
        size_t rest_best = 1, rest_cost = SIZE_MAX;
        for (size_t splits = 2; splits <= rest_most; splits++) {
            const size_t cost = whole / sms * (units + 8) +
                                (rest * splits + sms - 1) / sms * ((units + splits - 1) / splits + 8);
            if (cost < rest_cost) rest_best = splits, rest_cost = cost;
        }
        if (rest_cost != SIZE_MAX && rest_cost * 20 <= best_cost * 19) { /* the model saves ≥ 5 % */
            *whole_tiles = (int)whole;
            return split_limits(call, s, rest, tokens * 128, units, rest_best);
        }
    }
    return split_limits(call, s, tiles, tokens * 128, units, best);
}

/* Whether the wgmma rows' splits of a tile may run as one thread-block cluster that sums them in shared memory
 * (kernels_wgmma.cu cluster_finish; sm_90, 2–8 splits, where the device runs the clusters in no more waves than the
 * workspace launch) rather than through the split-K workspace; the same bits either way: 1 yes, 0 no, 2 always where
 * the device can run the cluster at all, and the call fails where it cannot (tests). QMM_CUDA_WGMMA_CLUSTER=0 turns it
 * off, =require gives 2 (experiments, tests). */
static int wgmma_cluster(const qmm_call *call) {
    const cuda_state *s = call->backend_state;
    const char *mode = getenv("QMM_CUDA_WGMMA_CLUSTER");
    if (s->major < 9 || (mode && strcmp(mode, "0") == 0)) return 0;
    return mode && strcmp(mode, "require") == 0 ? 2 : 1;
}

/* The wgmma model's cost of `tiles` blocks in `splits` splits of `units` super-blocks (wgmma_splits): waves × (units
 * per split + 8). */
static double wgmma_model_cost(size_t tiles, size_t units, size_t splits, size_t sms) {
    return (double)((tiles * splits + sms - 1) / sms) * (double)((units + splits - 1) / splits + 8);
}

/* The model's cost of the same sums in `tiles` unsplit blocks that each take the splits' ranges in turn (virtual
 * splits, wgmma_tile_kernel): waves of every super-block, + 8, + 2 for each range's end (fitted when every dtype's
 * partials went through global memory; kept so that wgmma_invariant_splits' counts, and so the mode's bits, stay as
 * they were). Measured on the H200, 4096² at M = 2048, 2 splits, where the model says 1.05× the unsplit time: f16
 * (partials in registers) 1.03×, bf16 (in slots) 1.14× (docs/PERF.md, thirty-first session). */
static double wgmma_virtual_cost(size_t tiles, size_t units, size_t splits, size_t sms) {
    return (double)((tiles + sms - 1) / sms) * (double)(units + 8 + 2 * (splits - 1));
}

/* Batch-invariant calls on the default (PREP) wgmma rows (order WGMMA_PREP_ORDER, docs/kernels.md §11): K is cut into
 * the same splits at every M, so the count depends on the weights' shape and the device only — N's 128-row tiles,
 * K's 64-byte super-blocks, the SM count. Of 1 … 8 splits (a cluster's most; ≥ 4 super-blocks each; few enough that
 * one row of 128-token tiles fits the split-K workspace, the way wgmma_invariant_run takes where no cluster runs),
 * the count whose model cost, against the model's own best count for default calls, has the least geometric mean
 * over M = 128, 512 and 2048 in tiles of 64 and of 128 tokens (ties: fewer splits) — costed the way
 * wgmma_invariant_run may run it: split blocks (wgmma_model_cost) or, where that is cheaper, virtual splits
 * (wgmma_virtual_cost). On 132 SMs: 5120², 5120×14336, 5120×17408 3; 4096×12288, the 1024-row k_proj shapes,
 * 768×2048 and 1000×2048 4; 4096² 2; 14336×5120, 12288×4096, 17408×5120, 27648×5120 and 2048×768 1. */
int qmm_cuda_wgmma_invariant_splits(size_t N, size_t K, int bits, int multiprocessors) {
    const size_t row_tiles = (N + 127) / 128, units = qmm_cuda_packed_words_per_row(K, bits) / 16;
    const size_t sms = multiprocessors > 0 ? (size_t)multiprocessors : 1;
    size_t most = units / 4 < 8 ? units / 4 : 8;
    while (most > 1 && row_tiles * most * 128 * 128 > QMM_TILE_PARTIAL_FLOATS) most--;
    if (most < 1 || row_tiles > QMM_TILE_COUNTERS) most = 1;
    /* the cells: M = 128, 512, 2048 in tiles of 64 and of 128 tokens; each cell's best cost for default calls */
    static const size_t ms[] = {128, 512, 2048}, tokens[] = {64, 128};
    enum { CELLS = 6 };
    size_t tiles[CELLS];
    double least[CELLS];
    for (size_t c = 0; c < CELLS; c++) {
        tiles[c] = row_tiles * ((ms[c / 2] + tokens[c % 2] - 1) / tokens[c % 2]);
        least[c] = wgmma_model_cost(tiles[c], units, 1, sms);
        for (size_t other = 2; other <= most; other++)
            if (wgmma_model_cost(tiles[c], units, other, sms) < least[c])
                least[c] = wgmma_model_cost(tiles[c], units, other, sms);
    }
    size_t best = 1;
    double best_score = 0;
    for (size_t splits = 1; splits <= most; splits++) {
        double score = 1; /* the product of cost ÷ least: the geometric mean's order */
        for (size_t c = 0; c < CELLS; c++) {
            double cost = wgmma_model_cost(tiles[c], units, splits, sms);
            if (splits > 1 && wgmma_virtual_cost(tiles[c], units, splits, sms) < cost)
                cost = wgmma_virtual_cost(tiles[c], units, splits, sms); /* wgmma_invariant_run's choice */
            score *= cost / least[c];
        }
        if (splits == 1 || score < best_score * (1 - 1e-9)) best = splits, best_score = score;
    }
    return (int)best;
}
static int wgmma_invariant_splits(const qmm_call *call) {
    const cuda_state *s = call->backend_state;
    return qmm_cuda_wgmma_invariant_splits(call->N, call->K, call->bits, s->multiprocessors);
}

/* The bytes of a batch-invariant call's virtual-split partials (wgmma_invariant_run): splits − 1 slots (one block a
 * tile, bf16; f16 sums them in registers: kernels_wgmma.cu VIRTUAL) or, every_range, splits slots (blocks of virtual
 * ranges, any dtype) of a tile's 128 rows × its tokens floats for every tile, in tiles of 64 tokens or of 128 (both
 * fit: M rounded up to 128), after the prepared x at a 256-byte boundary; 0 for other calls. (splits − 1 times the
 * f32 output: 5120² at M = 2048, 3 splits, 84 MB.) */
static size_t wgmma_virtual_sums_bytes(const qmm_call *call, int splits, bool every_range) {
    if (!call->batch_invariant || splits <= 1 || (call->dtype != QMM_BF16 && !every_range)) return 0;
    return (call->N + 127) / 128 * ((call->M + 127) / 128 * 128) * 128 * sizeof(float) *
           (size_t)(every_range ? splits : splits - 1);
}
static size_t wgmma_virtual_sums_at(const qmm_call *call) {
    return (qmm_cuda_wgmma_prepared_bytes(call->bits, call->group_size, call->M, call->K) + 255) / 256 * 256;
}

/* The wgmma rows' workspace for this call's prepared x (cuda_state.wgmma_prepared), grown if need be; NULL where it
 * cannot be had now — inside a stream capture (no allocation there: a chain's steps reserve it when recorded, the
 * rows' reserve hook) or out of device memory — and the call then runs the _fma variant (x permuted in each block),
 * the same product within the bound. `sums`: the bytes of virtual-split partials kept after it (wgmma_virtual_sums_bytes;
 * 0 but for batch-invariant calls). */
static void *wgmma_prepared_workspace(cuda_state *s, const qmm_call *call, size_t sums) {
    const size_t bytes = sums ? wgmma_virtual_sums_at(call) + sums
                              : qmm_cuda_wgmma_prepared_bytes(call->bits, call->group_size, call->M, call->K);
    if (s->wgmma_prepared_bytes >= bytes) return s->wgmma_prepared;
    enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s->stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
        cudaGetLastError();
        return NULL;
    }
    if (s->wgmma_prepared) { /* room to keep the buffer this one replaces */
        void **retired = realloc(s->wgmma_prepared_retired, (s->wgmma_prepared_retired_count + 1) * sizeof *retired);
        if (!retired) return NULL;
        s->wgmma_prepared_retired = retired;
    }
    if (cudaSetDevice(s->device) != cudaSuccess) { /* the reserve hook runs outside any other call of the context */
        cudaGetLastError();
        return NULL;
    }
    void *memory = NULL;
    size_t grown = bytes > 2 * s->wgmma_prepared_bytes ? bytes : 2 * s->wgmma_prepared_bytes;
    if (cudaMalloc(&memory, grown) != cudaSuccess) { /* then the exact size */
        cudaGetLastError();
        grown = bytes;
        if (cudaMalloc(&memory, grown) != cudaSuccess) {
            cudaGetLastError(); /* not the call's failure: it runs without the workspace */
            return NULL;
        }
    }
    if (s->wgmma_prepared) s->wgmma_prepared_retired[s->wgmma_prepared_retired_count++] = s->wgmma_prepared;
    s->wgmma_prepared = memory;
    s->wgmma_prepared_bytes = grown;
    return memory;
}

/* Virtual splits for `launch` (wgmma_invariant_run): the prepared-x workspace grown by `bytes` of partials' slots
 * (wgmma_virtual_sums_bytes; 0: none, f16 in registers) and the launch pointed at it, summing as its splits would;
 * false, the launch unchanged, where the workspace cannot be had. */
static bool wgmma_virtual_workspace(qmm_cuda_launch *launch, const qmm_call *call, size_t bytes) {
    char *workspace = wgmma_prepared_workspace(call->backend_state, call, bytes);
    if (!workspace) return false;
    launch->wgmma_prepared = workspace; /* the prepared x is written by the launch: a grown buffer is as good */
    launch->wgmma_virtual_splits = launch->splits;
    launch->wgmma_virtual_sums = bytes ? (float *)(workspace + wgmma_virtual_sums_at(call)) : NULL;
    return true;
}

/* A wgmma row's launch for this call: splits, last wave, cluster mode and (PREPARED rows) the prepared-x workspace.
 * A batch-invariant call on a PREPARED row: wgmma_invariant_splits, no last wave, cluster mode 2 (wgmma_invariant_run
 * then chooses how the splits run); `sums`: room for its virtual-split partials after the prepared x too where it can be
 * had (the reserve hook: a chain's step cannot allocate inside the capture), the prepared x alone where not. */
static qmm_cuda_launch wgmma_launch_of(const qmm_call *call, int tokens, bool prepared, bool sums) {
    int whole_tiles = 0, blocks = 1;
    const bool invariant = prepared && call->batch_invariant;
    qmm_cuda_launch launch = split_launch_of(
        call, invariant ? wgmma_invariant_splits(call) : wgmma_splits(call, tokens, &whole_tiles, &blocks));
    launch.wgmma_whole_tiles = whole_tiles;
    launch.wgmma_blocks = blocks;
    launch.wgmma_cluster = wgmma_cluster(call);
    if (invariant && launch.wgmma_cluster) launch.wgmma_cluster = 2;
    if (prepared) {
        const size_t sums_bytes = sums ? wgmma_virtual_sums_bytes(call, launch.splits, false) : 0;
        launch.wgmma_prepared = wgmma_prepared_workspace(call->backend_state, call, sums_bytes);
        if (!launch.wgmma_prepared && sums_bytes)
            launch.wgmma_prepared = wgmma_prepared_workspace(call->backend_state, call, 0);
    }
    return launch;
}

/* The waves of `tiles` tiles in `splits` split blocks: through the split-K workspace, or as clusters (`clusters` of them
 * at a time, 0: none) where they take fewer (launch_wgmma's rule) or where the workspace does not hold the tiles
 * (!fits; clusters of 3 run 39 at a time on the H200, 117 SMs). */
static size_t split_waves(size_t tiles, size_t splits, size_t sms, int clusters, bool fits) {
    const size_t workspace = (tiles * splits + sms - 1) / sms;
    if (clusters <= 0) return workspace;
    const size_t as_clusters = (tiles + (size_t)clusters - 1) / (size_t)clusters;
    return !fits || as_clusters < workspace ? as_clusters : workspace;
}

/* A batch-invariant call on a PREPARED wgmma row (wgmma_launch_of): its bits may not depend on M, so nothing falls back
 * to another order — no prepared-x workspace is an error (the _fma variant would add b·Σx another way). The splits of
 * wgmma_invariant_splits run the way the model finds cheapest for this call: as blocks of virtual ranges (a few
 * blocks a tile, each a run of the ranges, every partial in a slot; only where a split has ≥ 8 super-blocks); as
 * virtual splits (one unsplit block a tile, wgmma_tile_kernel's VIRT) where the tiles keep the device busy — or the
 * last wave, the whole waves so and the rest split; otherwise as split blocks — where the split-K workspace holds
 * every tile's splits, clusters or the workspace as for default calls; where it does not, as clusters, and where the
 * device runs none (or QMM_CUDA_WGMMA_CLUSTER=0: tests) through the workspace in chunks of whole token tiles that it
 * holds. Where a form's slots cannot be had (bf16 virtual splits, blocks of ranges), split blocks run instead. The
 * same sums in the same split order every way (the kernel's `run` or virtual_split_sum, cluster_finish,
 * reduce_splits). */
static qmm_status wgmma_invariant_run(const qmm_call *call, int tokens) {
    const cuda_state *s = call->backend_state;
    if (tokens != 64 && tokens != 128) /* the 32-token row declares no order: the selector never gives it such a call */
        return qmm_error(QMM_ERR_UNSUPPORTED, "cuda.qmm_t.wgmma_tile.m%dn128 declares no batch-invariant order", tokens);
    const char *name = tokens == 64 ? "cuda.qmm_t.wgmma_tile.m64n128" : "cuda.qmm_t.wgmma_tile.m128n128";
    qmm_cuda_launch launch = wgmma_launch_of(call, tokens, true, false);
    if (!launch.wgmma_prepared)
        return qmm_error(QMM_ERR_OUT_OF_MEMORY,
                         "%s: a batch-invariant call needs the prepared-x workspace (%zu bytes for M=%zu, K=%zu), which "
                         "could not be allocated now (or not inside a stream capture: a chain reserves it when its step "
                         "is added)", name, qmm_cuda_wgmma_prepared_bytes(call->bits, call->group_size, call->M, call->K),
                         call->M, call->K);
    /* QMM_CUDA_INVARIANT_PATH=split|virtual|last|blocks forces one way of running the splits (tests: the same bits
     * each way). A forced way this call cannot take is an error, so a test that passes ran the way it named; only a
     * form's slots that cannot be had still fall back to split blocks (QMM_CUDA_INVARIANT_SLOTS=0 below). */
    enum { WAY_MODEL, WAY_SPLIT, WAY_VIRTUAL, WAY_LAST, WAY_BLOCKS };
    static const char *const ways[] = {NULL, "split", "virtual", "last", "blocks"};
    const char *forced_name = getenv("QMM_CUDA_INVARIANT_PATH");
    int forced = WAY_MODEL;
    if (forced_name && *forced_name) {
        for (int way = WAY_SPLIT; way <= WAY_BLOCKS; way++)
            if (strcmp(forced_name, ways[way]) == 0) forced = way;
        if (forced == WAY_MODEL)
            return qmm_error(QMM_ERR_INVALID_ARGUMENT,
                             "%s: QMM_CUDA_INVARIANT_PATH=%s is not a way of running the splits (split, virtual, last "
                             "or blocks)", name, forced_name);
    }
    if (forced && launch.splits <= 1)
        return qmm_error(QMM_ERR_UNSUPPORTED,
                         "%s: QMM_CUDA_INVARIANT_PATH=%s cannot run for this call: its K=%zu is one split (N=%zu), "
                         "there is no way of running splits to force", name, forced_name, call->K, call->N);
    if (launch.splits <= 1) return launch_status(qmm_cuda_wgmma_tile_qmm_t(&launch, tokens), name, __FILE__, __LINE__);
    const size_t row_tiles = (call->N + 127) / 128, tiles = row_tiles * ((call->M + (size_t)tokens - 1) / (size_t)tokens);
    const size_t units = qmm_cuda_packed_words_per_row(call->K, call->bits) / 16;
    const size_t sms = s->multiprocessors > 0 ? (size_t)s->multiprocessors : 1;
    const size_t splits = (size_t)launch.splits;
    const bool fits = s->tile_partials && tiles <= QMM_TILE_COUNTERS &&
                      tiles * splits * (size_t)tokens * 128 <= QMM_TILE_PARTIAL_FLOATS;
    int clusters = 0; /* how many clusters of the splits the device runs at a time (0: none, or not known) */
    if (launch.wgmma_cluster) {
        qmm_cuda_launch ask = launch;
        ask.wgmma_prime = 1;
        ask.wgmma_clusters_out = &clusters;
        if (qmm_cuda_wgmma_tile_qmm_t(&ask, tokens) != 0) cudaGetLastError(), clusters = 0;
    }
    const size_t waves = split_waves(tiles, splits, sms, clusters, fits);
    const double split_units = (double)((units + splits - 1) / splits + 8), split_cost = (double)waves * split_units;
    const double virtual_cost = wgmma_virtual_cost(tiles, units, splits, sms);
    /* the last wave (as wgmma_splits for default calls): the whole waves' tiles with virtual splits, the rest split */
    const size_t rest = tiles % sms, whole = tiles - rest;
    double last_cost = -1;
    bool rest_fits = false;
    if (tiles > sms && rest > 0 && whole <= (size_t)INT_MAX) {
        rest_fits = s->tile_partials && rest * splits * (size_t)tokens * 128 <= QMM_TILE_PARTIAL_FLOATS;
        const size_t rest_waves =
            rest_fits || clusters > 0 ? split_waves(rest, splits, sms, clusters, rest_fits) : SIZE_MAX;
        if (rest_waves != SIZE_MAX)
            last_cost = wgmma_virtual_cost(whole, units, splits, sms) + (double)rest_waves * split_units;
    }
    /* blocks of virtual ranges: `range_blocks` blocks a tile, each ⌈splits / range_blocks⌉ ranges in turn, every
     * partial to a slot (splits of them a tile, any dtype), the tile's last block to arrive sums them (the split-K
     * counters: one a tile). Only where a split has 8 super-blocks or more: the last block's sum of every range is a
     * cost the model does not count, which outweighed the wave saved at 4 (768×2048 at M = 512: 17.8 µs against split
     * blocks' 17.2, where the 1024-row k_proj shapes, 8 and 10, went from 1.32–1.41× the default to 1.22–1.26×;
     * docs/PERF.md, thirty-first session). */
    size_t range_blocks = 0;
    double blocks_cost = -1;
    if (s->tile_partials && tiles <= QMM_TILE_COUNTERS)
        for (size_t b = 2; b < splits; b++) {
            const size_t per_block = (splits + b - 1) / b, blocks = (splits + per_block - 1) / per_block;
            const double cost = (double)((tiles * blocks + sms - 1) / sms) *
                                (double)(per_block * ((units + splits - 1) / splits) + 8 + 2 * (per_block - 1));
            if (blocks_cost < 0 || cost < blocks_cost) blocks_cost = cost, range_blocks = blocks;
        }
    /* a forced `last` needs tiles past a wave with a partial last wave whose splits can run; a forced `blocks` (2 a
     * tile) 3 splits or more and a split-K counter for every tile */
    const bool cannot_last = forced == WAY_LAST && last_cost < 0;
    if (cannot_last || (forced == WAY_BLOCKS && range_blocks == 0))
        return qmm_error(QMM_ERR_UNSUPPORTED,
                         "%s: QMM_CUDA_INVARIANT_PATH=%s cannot run for this call (M=%zu: %zu tiles of %d tokens on %zu "
                         "SMs, %d splits): %s", name, forced_name, call->M, tiles, tokens, sms, launch.splits,
                         cannot_last ? (tiles <= sms   ? "its tiles fit in one wave, there is no last wave"
                                        : rest == 0    ? "its tiles fill whole waves, there is no partial last wave"
                                                       : "the last wave's splits fit neither the split-K workspace nor "
                                                         "a cluster launch")
                         : splits < 3 ? "blocks of virtual ranges need 3 splits or more"
                                      : "blocks of virtual ranges need a split-K counter for every tile");
    const bool take_blocks = forced ? forced == WAY_BLOCKS
                                    : blocks_cost >= 0 && blocks_cost < split_cost && blocks_cost < virtual_cost &&
                                          (last_cost < 0 || blocks_cost < last_cost) && (units + splits - 1) / splits >= 8;
    if (forced == WAY_BLOCKS) range_blocks = 2;
    if (take_blocks && wgmma_virtual_workspace(&launch, call, wgmma_virtual_sums_bytes(call, launch.splits, true))) {
        launch.wgmma_virtual_blocks = (int)range_blocks;
        launch.splits = 1;
        launch.wgmma_cluster = 0;
        return launch_status(qmm_cuda_wgmma_tile_qmm_t(&launch, tokens), name, __FILE__, __LINE__);
    }
    bool take_virtual = virtual_cost <= split_cost || (last_cost >= 0 && last_cost < split_cost);
    bool take_last = last_cost >= 0 && last_cost < virtual_cost;
    if (forced == WAY_SPLIT || forced == WAY_BLOCKS) take_virtual = false; /* blocks: its slots could not be had */
    if (forced == WAY_VIRTUAL) take_virtual = true, take_last = false;
    if (forced == WAY_LAST) take_virtual = true, take_last = true; /* last_cost ≥ 0: refused above otherwise */
    /* bf16: the partials' slots after the prepared x, asked for only now (splits − 1 times the f32 output): where they
     * cannot be had, the splits run as split blocks, which need none (QMM_CUDA_INVARIANT_SLOTS=0: as if they could
     * not; tests). f16 needs none. */
    const size_t sums = wgmma_virtual_sums_bytes(call, launch.splits, false);
    const char *slots = getenv("QMM_CUDA_INVARIANT_SLOTS");
    if (take_virtual && !(sums && slots && strcmp(slots, "0") == 0) && wgmma_virtual_workspace(&launch, call, sums)) {
        /* tiles enough to keep the device busy unsplit: one block a tile computes the splits' sums in turn — every
         * tile, or those of the whole waves, the rest's splits in blocks of their own */
        if (take_last) {
            launch.wgmma_whole_tiles = (int)whole;
            if (rest_fits && launch.wgmma_cluster == 2) launch.wgmma_cluster = 1;
        } else {
            launch.splits = 1;
            launch.wgmma_cluster = 0;
        }
        return launch_status(qmm_cuda_wgmma_tile_qmm_t(&launch, tokens), name, __FILE__, __LINE__);
    }
    if (fits) {
        /* the workspace holds every tile's splits: clusters where they take no more waves than it (the default rows'
         * rule, launch_wgmma), the workspace otherwise (40 tiles of 3 splits: two waves of clusters, one of the
         * workspace) */
        if (launch.wgmma_cluster == 2) launch.wgmma_cluster = 1;
        return launch_status(qmm_cuda_wgmma_tile_qmm_t(&launch, tokens), name, __FILE__, __LINE__);
    }
    if (launch.wgmma_cluster == 2) {
        const int error = qmm_cuda_wgmma_tile_qmm_t(&launch, tokens);
        if (error != (int)cudaErrorNotSupported) return launch_status(error, name, __FILE__, __LINE__);
    }
    const size_t per_tile = row_tiles * (size_t)launch.splits * (size_t)tokens * 128;
    size_t token_tiles = QMM_TILE_PARTIAL_FLOATS / per_tile;
    if (token_tiles > QMM_TILE_COUNTERS / row_tiles) token_tiles = QMM_TILE_COUNTERS / row_tiles;
    if (!s->tile_partials || token_tiles == 0) /* wgmma_invariant_splits keeps a row of 128-token tiles within both */
        return qmm_error(QMM_ERR_BACKEND, "%s: a batch-invariant call's %d splits of K run neither as a thread-block "
                         "cluster on this device nor through the split-K workspace", name, launch.splits);
    launch.wgmma_cluster = 0;
    const size_t M = call->M, chunk = token_tiles * (size_t)tokens;
    const char *x = launch.x;
    char *out = launch.out;
    for (size_t m0 = 0; m0 < M; m0 += chunk) { /* f16/bf16: 2 bytes an element */
        launch.x = x + m0 * call->K * 2;
        launch.out = out + m0 * call->N * 2;
        launch.M = M - m0 < chunk ? M - m0 : chunk;
        const qmm_status status = launch_status(qmm_cuda_wgmma_tile_qmm_t(&launch, tokens), name, __FILE__, __LINE__);
        if (status != QMM_OK) return status;
    }
    return QMM_OK;
}

/* The wgmma rows (PREPARED: x prepared once per call, b·Σx on the tensor cores) and their _fma twins (x permuted in
 * each block, b·Σx by FMA: the mma_tile rows' order; batch-invariant calls on Hopper run the PREPARED rows). The reserve hook runs when a chain
 * step is recorded, before any capture: it sets up the prepared-x workspace (PREPARED) and asks the device what the
 * cluster launch needs to know (wgmma_prime), neither of which can be done inside the capture. */
#define WGMMA_ROW(NAME, TOKENS, PREPARED)                                                                         \
    static bool NAME##_supports(const qmm_call *call, char *why_not, size_t size) {                               \
        return wgmma_supports(call, TOKENS, why_not, size);                                                       \
    }                                                                                                             \
    static qmm_status NAME##_run(const qmm_call *call) {                                                          \
        CALL_KNOBS_CHECK();                                                                                       \
        if ((PREPARED) && call->batch_invariant) return wgmma_invariant_run(call, TOKENS);                    \
        qmm_cuda_launch launch = wgmma_launch_of(call, TOKENS, PREPARED, false);                                  \
        if ((TOKENS) == 32 && !launch.wgmma_prepared) { /* no prepared x: the 64-token _fma kernels (above) */  \
            launch = wgmma_launch_of(call, 64, false, false);                                                     \
            return launch_status(qmm_cuda_wgmma_tile_qmm_t(&launch, 64), #NAME, __FILE__, __LINE__);             \
        }                                                                                                         \
        return launch_status(qmm_cuda_wgmma_tile_qmm_t(&launch, TOKENS), #NAME, __FILE__, __LINE__);             \
    }                                                                                                             \
    static void NAME##_reserve(const qmm_call *call) {                                                            \
        const cuda_state *s = call->backend_state;                                                                \
        if (cudaSetDevice(s->device) != cudaSuccess) {                                                            \
            cudaGetLastError(); /* the step then runs through the workspace (and without prepared x) */           \
            return;                                                                                               \
        }                                                                                                         \
        qmm_cuda_launch launch = wgmma_launch_of(call, TOKENS, PREPARED, true);                                   \
        launch.wgmma_prime = 1; /* nothing enqueued; where a question fails, the step takes the workspace */      \
        if (qmm_cuda_wgmma_tile_qmm_t(&launch, TOKENS) != 0) cudaGetLastError();                                  \
    }

WGMMA_ROW(wgmma_m128n128, 128, true)
WGMMA_ROW(wgmma_m64n128, 64, true)
WGMMA_ROW(wgmma_m32n128, 32, true)
WGMMA_ROW(wgmma_fma_m128n128, 128, false)
WGMMA_ROW(wgmma_fma_m64n128, 64, false)

/* The mma_tile rows' batch-invariant order (docs/kernels.md §11): per output, the 64-byte super-blocks of K in
 * order; in each, the group segments in order; a segment's q·x MMAs (and the all-ones Σx MMAs) chained in the
 * lane-pairing k order; then acc = fma(s, Σq·x, fma(b, Σx, acc)). One split (no split-K) in this mode; the
 * tile shape, the warp and M do not enter an output's arithmetic. */
#define TILE_ORDER "tc-segment-fma"
/* The default wgmma rows' batch-invariant order (docs/kernels.md §11): per output, K cut into the splits of
 * wgmma_invariant_splits (from N, K and the SM count, never M); in each split from 0, per 64-byte super-block the
 * stage's b·Σx as one wgmma k8 tf32 per chunk of 8 slots (Σx per group segment by wgmma_prepare_x's per-token tree,
 * in three exact tf32 pieces), then per group segment acc = fma(s, Σq·x, acc) with Σq·x the segment's chained wgmma
 * k16 steps; the splits' partials summed 0 + p0 + p1 + … in split order (split blocks through a cluster or the
 * workspace, virtual splits in one block, or blocks of virtual ranges: the same sums). The token tile (64 or 128) does
 * not enter an output's arithmetic. */
/* mma_tile_bf16x3 (f32): the same order with three x parts: per 32-code block, the hi part's MMAs over both k16
 * steps, then mid's, then lo's (into one accumulator; Σx the same), then Σq·x and Σx scaled back by 2^-24 (exact)
 * before the same two FMAs. */
#define TILE_BF16X3_ORDER "tc-bf16x3-segment-fma"
/* mma_tile_n (qmm_n): per output, k in steps of 16 in order, the x·s parts' MMAs chained into one accumulator and the
 * bias MMA into another, then their sum scaled by 2^-48 (kernels_n.cu). */
#define TILE_N_ORDER "tc-n-xs-parts"
/* The smallest M for which the selector takes mma_tile_bf16x3 over ffma_gemv (f32). */
#define F32_TILE_MIN_M 4
#define TILE_INFO(NAME, BM, BN, THREADS, TEXT)                                                                   \
    {.name = NAME, .backend = QMM_BACKEND_CUDA, .op = QMM_OP_QMM_T, .family = "mma_tile", .bm = BM, .bn = BN,    \
     .bk = 128, .threads = THREADS, .tolerance_slack = 2.0, .description = TEXT, .batch_invariant_order = TILE_ORDER}

/* wgmma_tile rows: BM tokens × 128 weight rows per block of 3 warpgroups. The _fma rows' order is the mma_tile rows'
 * (§9.6): the same segments, the same chained k16 steps and all-ones Σx MMAs (a wgmma k16 step adds as mma.sync
 * m16n8k16 does: the same bits, measured on the H200 — docs/PERF.md, eleventh session; test_cuda checks it), the same
 * two FMAs; one split in batch-invariant mode. The default (PREP) rows sum x ahead of the tile and add b·Σx on the
 * tensor cores (tf32 pieces), an order of their own (WGMMA_PREP_ORDER); being first in the table among the rows that
 * declare an order, they set a Hopper device's order for 4/8-bit f16/bf16 qmm_t at every M. */
#define WGMMA_PREP_ORDER "wgmma-prep-fixed-splits"
#define WGMMA_INFO(NAME, BM, TEXT, ORDER)                                                                        \
    {.name = NAME, .backend = QMM_BACKEND_CUDA, .op = QMM_OP_QMM_T, .family = "wgmma_tile", .bm = BM, .bn = 128, \
     .bk = 128, .threads = 384, .tolerance_slack = 2.0, .description = TEXT, .batch_invariant_order = ORDER}

#define MMA_INFO(NAME, BM, BN, TEXT)                                                                             \
    {.name = NAME, .backend = QMM_BACKEND_CUDA, .op = QMM_OP_QMM_T, .family = "mma_gemv", .bm = BM, .bn = BN,    \
     .bk = 128, .threads = 256, .tolerance_slack = 2.0, .description = TEXT}

/* cuda.gather.blocks.auto (defined below the table, whose rows it selects among); its batch-invariant order
 * (gather_piece_end, docs/kernels.md §11) */
#define GATHER_INVARIANT_ORDER "gather-fixed-per-format"
static bool gather_supports(const qmm_call *call, char *why_not, size_t size);
static qmm_status gather_run(const qmm_call *call);

/* Selector order (src/select.c walks it; the hints bound where the selector takes a row unforced), from
 * `qmm bench` on the H200 (docs/PERF.md, 2026-11-30, cp.async version; M ≤ 8 revised in the sixth session,
 * with the launcher's warps-per-block rule, over the 120 seed and Qwen3 cells M ≤ 8: 115 within 5 % of the
 * fastest row, 101 with the earlier m8n64/m8n16 split):
 *   M 17–32 on Hopper with 40 tiles of 128 rows or more (N ≥ 4993) and K ≥ 5120: wgmma_tile m32n128 — the wgmma tile
 *            with 32 tokens (wgmma m64n32: half the 64-token tile's x tile, two thirds of its stage), which reads the
 *            weights once where mma_gemv m16n64 reads them once per 16 rows of x (two chunks past M = 16): at M = 17,
 *            24 and 32 (the thirty-eighth session, every seed and Qwen3 shape, f16 and bf16, 4-bit group 64 — other
 *            formats take the box unmeasured; `qmm tune` measures them) 0.68–0.74× m16n64's time
 *            on 5120×14336 and 5120×17408, 0.75–0.79× on 14336×5120, 0.89–0.94× on 27648×5120, 0.91–0.98× on
 *            17408×5120, 0.91–0.95× on 5120² — and 1.08–1.12× on 12288×4096 (K = 4096), 1.10–1.19× on 4096×12288 (32
 *            tiles), 1.15–1.31× on the 1024-row k_proj shapes, 1.41–1.54× on 4096², 1.65–2.2× on the experts; at M = 16
 *            1.26× or more everywhere. It took 0.74–0.88× the 64-token tile's time in every cell. It declares no
 *            batch-invariant order (its sums were not compared with the other wgmma rows' bit for bit), so the mode
 *            passes it over; and where the prepared-x workspace cannot be had, it runs the 64-token tile's _fma
 *            kernels (measured, tested) rather than 32-token kernels without prepared x, which no test reaches.
 *   M ≤ 8, N ≥ 4096 where 48-row blocks fill the last wave over 132 SMs ≥ 1.2× as well as 64-row blocks
 *            (prefer_fill: 4096, 5120, 12288, 17408 rows; not 14336 (299 blocks against 224) or 27648 (576 against
 *            432)): mma_gemv m8n48 — m8n64 with three row tiles; it costs about 1.1–1.25× m8n64's time per byte where
 *            both fill the SMs alike, and the ratio of fills is either ≈ 1.33 or ≤ 1.07 on the measured shapes. On
 *            the H200 at M = 1–8 (forty-eighth session, every seed and Qwen3 shape, f16 and bf16, 4-bit group 64):
 *            0.84–0.93× m8n64's time at M = 1–4 on 5120×5120, 5120×14336 and 5120×17408 (0.75–0.85 at M = 8),
 *            0.83–0.90× the selected m8n32 on 17408×5120, 0.86–0.94× m8n64 on 12288×4096, 0.85–0.97× m8n32 on 4096²;
 *            1.06–1.24× m8n64 on 14336×5120 and 27648×5120 (the rule passes it over there), and 0.99–1.11× m8n32 on
 *            4096×12288 — passed over there since the fiftieth session by its own rule (prefer =
 *            short_k_or_many_rows): not where blocks of 32 rows fit one wave (N ≤ 32 · SMs) and K ≥ 8192; 4096² keeps
 *            it (0.85–0.96× m8n32's time on both cards).
 *   M ≤ 8, N ≥ 5120, m8n64's box below, where mixed_blocks splits (prefer = mixed_splits: 3·k·SMs ≤ row tiles of
 *            16 ≤ (4·k − 1)·SMs, k blocks per SM — the busiest SM then gets fewer rows; on 132 SMs 14336 rows, 104 +
 *            160 blocks, and 27648, 144 + 384): mma_gemv m8n64_48 — m8n64 with some blocks of 48 rows, as many
 *            blocks on every SM. On an H100 at M = 1–8 (forty-ninth session, f16 and
 *            bf16): 0.956–0.972× m8n64's time on 27648×5120, 0.987–1.004× on 14336×5120; on the H200 (fiftieth)
 *            0.909–0.971 and 0.941–1.028.
 *   M ≤ 8, N ≥ 5120 where m8n48's and m8n64_48's rules say no: mma_gemv m8n64 — 64 rows per warp amortise x, its
 *            pairing and the Σx MMA over four row tiles (27648×5120 M=1 f16, before m8n64_48: 28.7 µs vs 29.6 for
 *            m8n32, 37.3 for m8n16). Not at 265–396 blocks of 64
 *            rows (prefer_gap_tiles: 2–3 blocks per SM of the H200's 132), where m8n64's blocks get 4–6 warps under
 *            either rule of gemv_warps (the model's one miss in its sweeps: 8 were best, 0.96–0.97× the one-wave
 *            rule's time at M = 1) and m8n32's 8-warp blocks keep 16 per SM —
 *            17408×5120 (Qwen3-14B gate/up, 272 blocks) at M = 1–8: m8n32 0.93–1.01× m8n64's time, geomean 0.97
 *            (docs/PERF.md, twenty-sixth session); with the model 0.94–1.00 (twenty-seventh).
 *   M ≤ 8, N ≥ 4096: mma_gemv m8n32 — 4096×4096 f16: 5.3 µs vs 5.8 for m8n16; 4096×12288: 11.6 vs 13.1.
 *   M ≤ 8:   mma_gemv m8n16 — 16 rows per warp, the most blocks: the best for N ≤ 2048 (1024×4096 bf16: 1.3×
 *            faster than m8n32).
 *   M 9–16, N ≥ 4096, where its 48-row blocks fill the last wave over 132 SMs ≥ 1.2× as well as 64-row blocks (the
 *            m8n48 rule, prefer_fill) and blocks × K ≥ 48 · 4096 (m16n64's floor): mma_gemv m16n48 — m16n64 with
 *            three row tiles (12 warps at most, as m16n64). On an H100 at M = 9, 12, 16 (forty-eighth session, every
 *            seed and Qwen3 shape, f16 and bf16, 4-bit group 64): 0.87–0.94× m16n64's time on 5120², 5120×14336 and
 *            5120×17408, 0.87–0.94× on 12288×4096, 0.84–0.91× on 17408×5120, 0.93–0.99× m16n32's on 4096²; 1.06–1.14×
 *            m16n64 on 14336×5120 and 1.08–1.09× on 27648×5120 (the rule passes it over), 1.02–1.14× m16n32 on
 *            4096×12288 (1.03–1.19 on both cards in the fiftieth session: passed over there since, by m8n48's own
 *            rule, short_k_or_many_rows). Over the 90 cells the rule's choice is within 5 % of the fastest
 *            row in 83 (47 before; 82/90 measured after the change).
 *   M 9–16, N ≥ 19201 (past m16n64's box below), blocks × K ≥ 48 · 4096, where mixed_blocks splits (m8n64_48's
 *            rule; not 24576 or 32768 rows on 132 SMs, whose blocks stay 64 rows: m16n32 there): mma_gemv m16n64_48
 *            — the 16-token tile's m16n64 and m16n48 bodies in mixed_blocks' counts (one chunk: M ≤ 16). On an H100
 *            (forty-ninth session, M = 9, 12, 16, f16 and bf16): 27648×5120 0.89–0.93× m16n64's time and 0.86–0.93×
 *            m16n32's (the row taken there before: 1.46–1.62× the floor, now 1.33–1.41); 14336×5120 1.00–1.025× m16n64
 *            (not in its box); 5120² and 17408×5120, where it does not split, 0.95–1.03×. On the H200
 *            (fiftieth session): 27648×5120 0.900–0.924× m16n64's time, 0.901–0.924× m16n32's.
 *   M 9–16 with 72–300 blocks of 64 rows (N 4545–19200) where m16n48's rule says no, M 17–32 with 72 blocks or
 *            more of 64 rows × 16 rows of x (N ≥ 2241), M 33–64 with 48 or more (N ≥ 961 to M = 48, ≥ 705 beyond:
 *            Qwen3's k_proj/v_proj), those blocks times K ≥ 48 · 4096 (a short K: below) and, from M = 33,
 *            ≤ 240 · 5120 (M16N64_MAX_WORK: 5120² to M = 48, 4096² to M = 64):
 *            mma_gemv m16n64 — 64 rows per warp, blocks of up to 12
 *            warps at 168 registers, one such block per SM (past one wave gemv_warps may take smaller ones, several
 *            per SM; x no longer a super-block ahead in registers, the fourteenth
 *            session: 0.78–0.94× the time of the 242-register version where it is selected); past M = 16 one grid of a block per 16 rows of x and row
 *            tile (m16n64_one_grid). At M 9–16 against m16n32 (the fourteenth session, seed and Qwen3 shapes at M = 12
 *            and 16): faster on 80 blocks (5120² 9.7 vs 10.9 µs f16, 5120×14336 21.6 vs 27.4, 5120×17408 25.8 vs 33.0),
 *            224 (14336×5120 17.8 vs 21.4) and 272 (17408×5120 25.1 vs 28.4); within 5 % at 192 (12288×4096 bf16 15.9
 *            vs 15.1, the box's one loss) and slower at 432 (27648×5120 bf16: 43.3 vs 40.5, the fifteenth session;
 *            prefer_large_n) and with fewer blocks (4096 rows, 64 blocks: 7.7 vs 7.0; 1024 rows: 7.2 vs 4.8). At
 *            M = 17–32 in one grid (the fifteenth session, M = 20 and 32): the fastest row from 40 blocks (2560×4096
 *            M = 32 f16 7.9 µs vs 12.6 for m32n16; 4096² 8.9 vs 12.7 for m16n32; 27648×5120 66.6 vs 82.6; 12288×4096
 *            20.3 vs 27.9 in two launches), slower at 32 blocks with a short K (2048×768: 4.4 vs 3.7) and at 16 (1024
 *            rows: 8.1 vs 7.4). M 33–64 while its blocks times K stay within 240 · 5120: the twenty-seventh session's
 *            sweep (M = 32–64, every row, seed and Qwen3 shapes, with the warps model) found the wgmma tile faster than
 *            it wherever they exceed that (M = 48: 12288×4096 and 4096×12288 1.13–1.28×, 5120×14336 1.04–1.09,
 *            17408×5120 1.02–1.10, 14336×5120 and 27648×5120 1.25–1.58; M = 56–64 on 5120² 1.03–1.11, on 5120 rows
 *            with K ≥ 12288 1.19–1.63) and slower within it (4096² at M = 48–64 0.77–0.83×, 5120² at M = 48 0.76–0.80),
 *            the small-N rows aside (bench-cuda-h200-2026-12-03-s27-m48-64.json). The floor of 48 blocks from M = 33
 *            (prefer_min_tiles_large_m; 72 before): on 1024×4096 and 1024×5120 (48–64 blocks) m16n64 took 0.83–0.95×
 *            m32n16's time in f16 at M = 33–64, in bf16 0.91–0.95× at M = 64 and 0.99–1.04× at M = 33–48 (the
 *            twenty-seventh and twenty-eighth sessions' sweeps). M ≤ 32 keeps 72: the calls a floor of 48 would add
 *            there (N 1537–2240 at M 17–32) were not measured; 1024 rows at M ≤ 32 are 32 blocks, under either.
 *            Before it, M 33–48 with 72 tiles or more, and M 49–64 as well where N ≤ 5120 and K ≤ 12288 (the seventeenth
 *            session's sweep, M = 48 and 64, against wgmma_tile m64n128 which had them): M = 48 faster on every seed and
 *            Qwen3 shape of ≥ 4096 rows (0.60–1.00× its time: 5120² f16 16.6 vs 27.8 µs, 17408×5120 65.0 vs 94.6,
 *            27648×5120 94.0 vs 106.7); M = 64 faster on N ≤ 5120 with K ≤ 12288 (4096² 13.8 vs 20.0, 5120² 23.0 vs
 *            28.0, 4096×12288 35.4 vs 39.6) but 1.03–1.12× slower at 5120 rows with K ≥ 14336 (1.34–1.44× once the
 *            wgmma tile had gained: 5120×14336 f16 58.4 vs 43.5 µs, bf16 67.1 vs 46.4, the twenty-third session —
 *            so the box ended at K = 12288) and 1.08–1.27× on 12288,
 *            14336 and 27648 rows (14336×5120 bf16 71.9 vs 56.5), where wgmma kept M ≥ 49 — though on 17408 rows
 *            (136 wgmma tiles, just over a wave) m16n64 took 0.86–0.90× its time; and 1.11–1.27× m32n16's time on
 *            2048×768 at M = 40–64 (3.8 vs 4.7 µs; the eighteenth session's sweep 1.10–1.24 at M = 48/64), which the
 *            floor of 48 · 4096 on tiles × K gives back to m32n16 (96–128 tiles × 768; in that sweep it moves no
 *            other cell: the box's others all have K ≥ 4096). The numbers are the H200's (132 SMs): on other GPUs
 *            the box is a guess (`qmm tune` measures).
 *   M ≤ 16:  mma_gemv m16n32 — two token tiles, 32 rows per warp, 2 blocks per SM. It also takes M ≤ 64 when forced,
 *            in launches of 16 rows of x (the fourteenth session's row at M = 17–32 for N ≥ 4096, until m16n64's one
 *            grid beat it there by 0.69–0.85×).
 *   M 17–32, N ≥ 12288, batch-invariant calls on devices without wgmma: mma_tile m16n256 (256 weight rows per block
 *            of 8 warps that share x through shared memory; below the wgmma rows since the thirtieth session, which
 *            set a Hopper device's order) — the default mode's row there from the eighth session until the 16-token
 *            GEMVs, which come first, took M = 17–32 in the fourteenth (0.75–0.99× its time); they declare no order,
 *            so it keeps the box for batch-invariant calls (default calls with a K too short for m16n64's box, below
 *            512 at N = 12288, now go to m32n16). mma_tile m32n256 is for `qmm tune` and forcing.
 *   M 17–32 with N < 2241: mma_gemv m32n16 — four token tiles, 16 rows per warp, x read block by block (1 block per SM:
 *            the register cap of 2 would spill). Larger M runs in chunks of 32 rows of x along grid.y; with
 *            N ≤ 2048 the selector keeps it up to M = 128 (before the wgmma rows) where m16n64's box (first in the
 *            table) does not take the call — at M 33–64 it does from 48 tiles (N ≥ 961 at M ≤ 48, N ≥ 705 at
 *            M 49–64) with tiles × K ≥ 48 · 4096 and ≤ 240 · 5120: the tiles are too few there
 *            (768×2048 M = 64: 6.1 vs 11.8 µs for mma_tile; 1024×5120 M = 128: 22.2 vs 24.7; every N ≤ 2048 cell
 *            with M 33–128 within 3 % of the tile or faster, and faster than the wgmma rows with split-K in the
 *            tenth session's sweep; from M = 192 the tiles win; docs/PERF.md, third and tenth sessions).
 *   On Hopper, the wgmma_tile rows (the seventh session's sweep, 330 cells; the tenth session's with split-K in
 *   the wgmma rows, docs/PERF.md), where their 128-row tiles times K are enough work to fill the device, split-K
 *   included (prefer_min_tiles_k; wgmma_splits):
 *   M ≥ 65, ≥ 33 tiles of 128 × 128 tokens, times K ≥ 32 · 4096: wgmma_tile m128n128 — wgmma with the decoded weights
 *            in registers, x by TMA: the fastest row in every bf16 cell with N ≥ 4096 at M = 128 (5120²: 43 vs
 *            53 µs for mma_tile m64n64; 4096×12288: 60 vs 86; 5120² M = 2048 f16: 358 vs 567). Few tiles with a
 *            short K do not split (the 30B-A3B experts' K = 768 or 2048 at M = 256–512: the other rows are faster);
 *            many of them do not need to (768×2048 at M = 2048, 96 tiles: the fastest row). At 32 tiles m64n128's
 *            64 in 2 splits are faster, their clusters of 2 fitting where m128n128's of 4 would take two waves
 *            (twenty-fifth session, f16: 4096² M = 128 18.7 vs 26.7 µs; 1024×4096 and 1024×5120 at M = 512 20.3
 *            vs 28.2 and 23.6 vs 30.9; 4096×12288 M = 128 41.3 vs 44.1); at 40 tiles the two are level (5120²
 *            M = 128) or m128n128 is faster (5120×14336 M = 128: 60 vs 70).
 *   M ≥ 33, tiles of 128 × 64 tokens times K ≥ 128 · 768 (outside mma_gemv m16n64's box, which comes first):
 *            wgmma_tile m64n128 — the same kernel with 64 tokens per block: the fastest tile row at M = 64 for
 *            N ≥ 4096 (4096²: 20.6 vs 26.3 µs for m64n64; 5120×14336: 60 vs 79), except where the tiles come to just
 *            over one wave (17408×5120 M = 64, 136 tiles: 101 vs 93 for m64n64), and at M = 256–512 on 1024-row
 *            shapes (1024×4096 M = 256: 20.1 vs 25.9).
 *   In batch-invariant mode on Hopper the default wgmma rows declare the order (WGMMA_PREP_ORDER: K in the splits of
 *            wgmma_invariant_splits at every M) and keep their hints; where the hints pass both over (M ≤ 32, or
 *            too little work) m64n128 runs (the order's row with the fewest rows of x per tile, src/select.c). On other devices the mode runs the mma_tile rows
 *            (one split). The _fma rows, which declare the mma_tile rows' order, are never the mode's rows on
 *            Hopper; their prefer_min_tiles_unsplit (80 tiles of their own, measured with QMM_CUDA_SPLITS=1 in the
 *            eleventh session: m128n128 the fastest unsplit row from 80 tiles — 5120² M = 256: 77 vs 97 µs for
 *            m64n64 —, not at 64) stays for a table where they would be.
 *   M > 32:  mma_tile m64n64 — 3 blocks of 4 warps per SM, split-K when its tiles are too few: faster than
 *            m64n128 (one block of 8 warps per SM) in 56 of 60 seed cells, M = 32 … 2048, and within 4 % in the
 *            other 4 (5120² M=2048: 615 vs 706 µs; M=128: 68 vs 91 µs; docs/PERF.md, tile v2).
 *   mma_tile m64n128 is there for `qmm tune` and forcing.
 *   f32 activations, 4/8-bit, M ≥ F32_TILE_MIN_M (4): mma_tile_bf16x3 m32n128 — x as three exact bf16 parts on
 *            the tensor cores (docs/kernels.md §9.7); the ninth session's f32 sweep (seed shapes): at M = 4 faster
 *            than ffma_gemv on 3 of 5 shapes (27648×5120: 145 vs 172 µs; 5120²: 38.2 vs 35.4), from M = 8 on all
 *            (2.0–3.9× at M = 16, 10× from M = 64);
 *   f32 activations, 4/8-bit, smaller M: ffma_gemv m8n16 — CUDA-core FMAs on the MLX layout, where the tile's 32
 *            tokens would be mostly empty; the generic row's one thread per output reads W uncoalesced (100× the
 *            HBM floor at decode).
 *   qmm_n (x·Ŵ), f16/bf16, 4/8-bit: mma_tile_n m8n128 for M ≤ 16, m32n64 beyond — with split-K, on the H200
 *            (ninth session, seed shapes, 4-bit g64): m8n128 1.2–3.1× faster than m32n64 at M = 1 (27648×5120:
 *            66–73 vs 170–199 µs), 1.1–1.3× at M = 16 (in two token tiles); the generic row's one thread per output
 *            column is ~16 GMAC/s (5120² M = 1: 2.5 ms, m8n128 18–20 µs).
 *   Then the generic rows, which take every call.
 * Batch-invariant order (docs/kernels.md "Batch-invariant mode"): the generic rows compute the oracle's f32
 * order bit for bit for each output whatever M (8 rows of x per thread, each its own accumulator), so they
 * declare "oracle" and take every batch-invariant call; the mma_gemv rows declare none (the tensor cores'
 * internal add order is not IEEE-sequential, and the 8- and 16-token tiles take only M ≤ 8 and M ≤ 64).
 * tolerance_slack 2: the tensor cores add the f32 products of an MMA with their own rounding (not always to
 * nearest), which can cost up to twice the unit roundoff per add (docs/kernels.md §9). */
static const qmm_kernel cuda_kernels[] = {
    {.info = WGMMA_INFO("cuda.qmm_t.wgmma_tile.m32n128", 32,
                        "Hopper wgmma tile, 128 rows x 32 tokens, x prepared per call, TMA, 4/8-bit f16/bf16", NULL),
     .supports = wgmma_m32n128_supports, .run = wgmma_m32n128_run, .reserve = wgmma_m32n128_reserve,
     .prefer_min_m = 17, .prefer_max_m = 32, .prefer_min_tiles = 40, .prefer_min_k = 5120},
    {.info = MMA_INFO("cuda.qmm_t.mma_gemv.m8n48", 8, 48, "tensor-core GEMV, 48 rows/warp, 8 tokens, 4/8-bit f16/bf16"),
     .supports = mma_m8n48_supports, .run = mma_m8n48_run, .prefer_max_m = 8, .prefer_min_n = 4096,
     .prefer_fill_sms = 132, .prefer_fill_over_bn = 64, .prefer_fill_ratio_pct = 120, .prefer = short_k_or_many_rows},
    {.info = MMA_INFO("cuda.qmm_t.mma_gemv.m8n64_48", 8, 64,
                      "tensor-core GEMV, blocks of 64 and 48 rows (the same per SM), 8 tokens, 4/8-bit f16/bf16"),
     .supports = mma_m8n64_supports, .run = mma_m8n64_48_run, .prefer_max_m = 8, .prefer_min_n = 5120,
     .prefer_gap_tiles_min = 2 * 132 + 1, .prefer_gap_tiles_max = 3 * 132, .prefer = mixed_splits},
    {.info = MMA_INFO("cuda.qmm_t.mma_gemv.m8n64", 8, 64, "tensor-core GEMV, 64 rows/warp, 8 tokens, 4/8-bit f16/bf16"),
     .supports = mma_m8n64_supports, .run = mma_m8n64_run, .prefer_max_m = 8, .prefer_min_n = 5120,
     .prefer_gap_tiles_min = 2 * 132 + 1, .prefer_gap_tiles_max = 3 * 132},
    {.info = MMA_INFO("cuda.qmm_t.mma_gemv.m8n32", 8, 32, "tensor-core GEMV, 32 rows/warp, 8 tokens, 4/8-bit f16/bf16"),
     .supports = mma_m8n32_supports, .run = mma_m8n32_run, .prefer_max_m = 8, .prefer_min_n = 4096},
    {.info = MMA_INFO("cuda.qmm_t.mma_gemv.m8n16", 8, 16, "tensor-core GEMV, 16 rows/warp, 8 tokens, 4/8-bit f16/bf16"),
     .supports = mma_m8n16_supports, .run = mma_m8n16_run, .prefer_max_m = 8},
    {.info = MMA_INFO("cuda.qmm_t.mma_gemv.m16n48", 16, 48, "tensor-core GEMV, 48 rows/warp, 16 tokens, 4/8-bit f16/bf16"),
     .supports = mma_m16n48_supports, .run = mma_m16n48_run, .prefer_max_m = 16, .prefer_min_n = 4096,
     .prefer_min_tiles_k = 48 * 4096, .prefer_fill_sms = 132, .prefer_fill_over_bn = 64, .prefer_fill_ratio_pct = 120,
     .prefer = short_k_or_many_rows},
    {.info = MMA_INFO("cuda.qmm_t.mma_gemv.m16n64_48", 16, 64,
                      "tensor-core GEMV, blocks of 64 and 48 rows (the same per SM), 16 tokens, 4/8-bit f16/bf16"),
     .supports = mma_m16n64_48_supports, .run = mma_m16n64_48_run, .prefer_min_m = 9, .prefer_max_m = 16,
     .prefer_min_n = M16N64_ALONE_MAX * 64 + 1, .prefer_min_tiles_k = 48 * 4096, .prefer = mixed_splits},
    {.info = MMA_INFO("cuda.qmm_t.mma_gemv.m16n64", 16, 64, "tensor-core GEMV, 64 rows/warp, 16 tokens, 4/8-bit f16/bf16"),
     .supports = mma_m16n64_supports, .run = mma_m16n64_run, .prefer_max_m = 64, .prefer_min_tiles = 72,
     .prefer_large_m = 33, .prefer_min_tiles_large_m = 48,
     .prefer_min_tiles_k = 48 * 4096, .prefer_max_tiles_k = M16N64_MAX_WORK, .prefer_max_tiles_k_min_m = 33,
     .prefer_large_n = M16N64_ALONE_MAX * 64 + 1, .prefer_min_m_large_n = 17},
    {.info = MMA_INFO("cuda.qmm_t.mma_gemv.m16n32", 16, 32, "tensor-core GEMV, 32 rows/warp, 16 tokens, 4/8-bit f16/bf16"),
     .supports = mma_m16n32_supports, .run = mma_m16n32_run, .prefer_max_m = 16},
    {.info = MMA_INFO("cuda.qmm_t.mma_gemv.m32n16", 32, 16, "tensor-core GEMV, 16 rows/warp, 32 tokens, 4/8-bit f16/bf16"),
     .supports = mma_m32n16_supports, .run = mma_m32n16_run, .prefer_max_m = 32, .prefer_small_n = 2048,
     .prefer_max_m_small_n = 128},
    {.info = WGMMA_INFO("cuda.qmm_t.wgmma_tile.m128n128", 128,
                        "Hopper wgmma tile, 128 rows x 128 tokens, x prepared per call, TMA, 4/8-bit f16/bf16", WGMMA_PREP_ORDER),
     .supports = wgmma_m128n128_supports, .run = wgmma_m128n128_run, .reserve = wgmma_m128n128_reserve,
     .prefer_min_m = 65, .prefer_min_tiles = 33,
     .prefer_min_tiles_k = 32 * 4096},
    {.info = WGMMA_INFO("cuda.qmm_t.wgmma_tile.m64n128", 64,
                        "Hopper wgmma tile, 128 rows x 64 tokens, x prepared per call, TMA, 4/8-bit f16/bf16", WGMMA_PREP_ORDER),
     .supports = wgmma_m64n128_supports, .run = wgmma_m64n128_run, .reserve = wgmma_m64n128_reserve,
     .prefer_min_m = 33,
     .prefer_min_tiles_k = 128 * 768},
    {.info = TILE_INFO("cuda.qmm_t.mma_tile.m16n256", 16, 256, 256,
                       "tensor-core tile, 256 rows x 16 tokens, 8 warps sharing x, split-K, 4/8-bit f16/bf16"),
     .supports = tile_m16n256_supports, .run = tile_m16n256_run, .prefer_min_m = 17, .prefer_max_m = 32,
     .prefer_min_n = 12288},
    /* the same tiles in the mma_tile rows' order (batch-invariant calls; default calls take the rows above) */
    {.info = WGMMA_INFO("cuda.qmm_t.wgmma_tile_fma.m128n128", 128,
                        "Hopper wgmma tile, 128 rows x 128 tokens, TMA x, b*sum(x) by FMA, 4/8-bit f16/bf16", TILE_ORDER),
     .supports = wgmma_fma_m128n128_supports, .run = wgmma_fma_m128n128_run, .reserve = wgmma_fma_m128n128_reserve,
     .prefer_min_m = 65, .prefer_min_tiles = 33,
     .prefer_min_tiles_k = 32 * 4096, .prefer_min_tiles_unsplit = 80},
    {.info = WGMMA_INFO("cuda.qmm_t.wgmma_tile_fma.m64n128", 64,
                        "Hopper wgmma tile, 128 rows x 64 tokens, TMA x, b*sum(x) by FMA, 4/8-bit f16/bf16", TILE_ORDER),
     .supports = wgmma_fma_m64n128_supports, .run = wgmma_fma_m64n128_run, .reserve = wgmma_fma_m64n128_reserve,
     .prefer_min_m = 33,
     .prefer_min_tiles_k = 128 * 768, .prefer_min_tiles_unsplit = 80},
    {.info = TILE_INFO("cuda.qmm_t.mma_tile.m64n64", 64, 64, 128,
                       "tensor-core tile, 64 rows x 64 tokens, cp.async pipeline, split-K, 4/8-bit f16/bf16"),
     .supports = tile_m64n64_supports, .run = tile_m64n64_run},
    {.info = TILE_INFO("cuda.qmm_t.mma_tile.m32n256", 32, 256, 256,
                       "tensor-core tile, 256 rows x 32 tokens, 8 warps sharing x, split-K, 4/8-bit f16/bf16"),
     .supports = tile_m32n256_supports, .run = tile_m32n256_run, .tune_only = true},
    {.info = TILE_INFO("cuda.qmm_t.mma_tile.m64n128", 64, 128, 256,
                       "tensor-core tile, 128 rows x 64 tokens, cp.async pipeline, split-K, 4/8-bit f16/bf16"),
     .supports = tile_m64n128_supports, .run = tile_m64n128_run, .tune_only = true},
    {.info = {.name = "cuda.qmm_t.mma_tile_bf16x3.m32n128", .backend = QMM_BACKEND_CUDA, .op = QMM_OP_QMM_T,
              .family = "mma_tile_bf16x3", .bm = 32, .bn = 128, .bk = 128, .threads = 128, .tolerance_slack = 2.0,
              .description = "f32 activations on the tensor cores: x as three bf16 parts (exact), 128 rows x 32 tokens, "
                             "cp.async pipeline, split-K, 4/8-bit",
              .batch_invariant_order = TILE_BF16X3_ORDER},
     .supports = tile_bf16x3_m32n128_supports, .run = tile_bf16x3_m32n128_run, .prefer_min_m = F32_TILE_MIN_M},
    {.info = {.name = "cuda.qmm_t.ffma_gemv.m8n16", .backend = QMM_BACKEND_CUDA, .op = QMM_OP_QMM_T, .family = "ffma_gemv",
              .bm = 8, .bn = 16, .bk = 32, .threads = 128, .tolerance_slack = 1.0,
              .description = "f32 activations: CUDA-core GEMV, 4 rows/warp, coalesced MLX-layout reads, f32 FMAs, 4/8-bit"},
     .supports = ffma_supports, .run = ffma_run},
    {.info = {.name = "cuda.qmm_t.generic.m8n256", .backend = QMM_BACKEND_CUDA, .op = QMM_OP_QMM_T, .family = "generic",
              .bm = 8, .bn = 256, .bk = 1, .threads = 256, .tolerance_slack = 1.0,
              .description = "every format: a thread per output feature, the oracle's f32 order bit for bit",
              .batch_invariant_order = "oracle"},
     .supports = generic_supports, .run = generic_t_run},
    {.info = {.name = "cuda.qmm_n.mma_tile_n.m8n128", .backend = QMM_BACKEND_CUDA, .op = QMM_OP_QMM_N,
              .family = "mma_tile_n", .bm = 8, .bn = 128, .bk = 64, .threads = 128, .tolerance_slack = 2.0,
              .description = "x*W on the tensor cores: x*s as exact bf16 parts, biases as an MMA, MLX layout read "
                             "as it is, 128 columns x 8 tokens, 4/8-bit f16/bf16",
              .batch_invariant_order = TILE_N_ORDER},
     .supports = tile_n_m8n128_supports, .run = tile_n_m8n128_run, .prefer_max_m = 16},
    {.info = {.name = "cuda.qmm_n.mma_tile_n.m32n64", .backend = QMM_BACKEND_CUDA, .op = QMM_OP_QMM_N,
              .family = "mma_tile_n", .bm = 32, .bn = 64, .bk = 64, .threads = 128, .tolerance_slack = 2.0,
              .description = "x*W on the tensor cores: x*s as exact bf16 parts, biases as an MMA, MLX layout read "
                             "as it is, 64 columns x 32 tokens, 4/8-bit f16/bf16",
              .batch_invariant_order = TILE_N_ORDER},
     .supports = tile_n_m32n64_supports, .run = tile_n_m32n64_run},
    {.info = {.name = "cuda.qmm_n.generic.m8n256", .backend = QMM_BACKEND_CUDA, .op = QMM_OP_QMM_N, .family = "generic",
              .bm = 8, .bn = 256, .bk = 1, .threads = 256, .tolerance_slack = 1.0,
              .description = "every format: a thread per output column, x·(s·q + b) summed over k in f32",
              .batch_invariant_order = "oracle"},
     .supports = generic_supports, .run = generic_n_run},
    {.info = {.name = "cuda.gather.blocks.auto", .backend = QMM_BACKEND_CUDA, .op = QMM_OP_GATHER, .family = "blocks",
              .bm = 16, .bn = 64, .bk = 128, .threads = 128, .tolerance_slack = 2.0,
              .description = "MoE gather: one product per expert block, blocks of <= 16 rows in two grouped GEMV "
                             "launches, larger blocks of <= 2^30 multiply-adds in grouped tile launches (wgmma "
                             "m32n128/m64n128 on Hopper, else m64n64), the "
                             "others on the CUDA qmm_t row picked for their rows (batch-invariant: f16/bf16 "
                             "chunks of <= 16 rows in m16n32 launches of fixed warps, other formats every "
                             "block on the qmm_t rows of the mode)",
              .batch_invariant_order = GATHER_INVARIANT_ORDER},
     .supports = gather_supports, .run = gather_run},
};


/* ───────────────────────────── gather (MoE) ───────────────────────────── */

/* The table as the selector takes it (pointers, in order), for a gather block's qmm_t call: the selector
 * passes over rows of another op, this gather row included. */
#define CUDA_ROW_COUNT (sizeof cuda_kernels / sizeof cuda_kernels[0])

static void collect_rows(const qmm_kernel *rows[CUDA_ROW_COUNT]) {
    for (size_t i = 0; i < CUDA_ROW_COUNT; i++) rows[i] = &cuda_kernels[i];
}

/* Grows a device scratch allocation to at least bytes (old contents dropped). cudaFree waits for the device,
 * so work still reading the old allocation has finished. */
static qmm_status grow_scratch(cuda_state *s, void **memory, size_t *have, size_t bytes) {
    if (*have >= bytes) return QMM_OK;
    if (*memory) cuda_release(s, *memory);
    *memory = NULL;
    *have = 0;
    qmm_status status = cuda_alloc(s, bytes, memory);
    if (status == QMM_OK) *have = bytes;
    return status;
}

/* The qmm_t call of rows i0 … i1−1 of a gather, all of one expert: qmm_gather_block_call's (the expert's slices
 * of the MLX-layout arrays, out rows i0 …, x in place), plus the slices of the repacked arrays (in extra_out)
 * and, when the rows of x were gathered into device scratch in pair order, x from there. */
static qmm_call expert_block_call(const qmm_call *gather, const char *gathered_x, size_t i0, size_t i1,
                                  cuda_weights_extra *extra_out) {
    qmm_call block = qmm_gather_block_call(gather, i0, i1); /* the expert's MLX-layout slices, out rows i0 … */
    if (gathered_x) block.x = gathered_x + i0 * gather->K * qmm_dtype_size(gather->dtype);
    const cuda_weights_extra *extra = gather->weights_extra;
    /* and of the repacked arrays, where the expert starts on a 16-row tile of the pairs' layout (N a multiple of
     * 16, as every MoE model's is); otherwise the block goes without them, to the generic row */
    if (extra && gather->N % 16 == 0) {
        const size_t first_row = (size_t)gather->rhs_indices[i0] * gather->N;
        extra_out->packed = extra->packed + first_row * qmm_cuda_packed_words_per_row(gather->K, gather->bits);
        extra_out->sb = (uint32_t *)extra->sb + qmm_cuda_sb_words(first_row, gather->K, gather->bits, gather->group_size,
                                                                  (int)qmm_dtype_size(gather->dtype));
        block.weights_extra = extra_out;
    }
    return block;
}

/* cuda.gather.blocks.auto: one qmm_t product per expert block (a maximal run of pairs with the same expert; with sorted
 * indices one per expert used, so each expert's weights are read once for all its rows) — blocks of ≤ 16 rows (and the
 * chunks of 16 rows of the blocks gather_chunk_rows cuts) in the grouped GEMV launches, larger blocks of small work
 * (gather_small_rows) in the grouped tile launches (gather_tiles: wgmma on Hopper, else m64n64), where the mma_gemv
 * rows take them (gather_grouping); the others each on the CUDA row the selector picks for that block's M (mma_gemv,
 * mma_tile, wgmma or generic). Where some block's rows of x (named by lhs_indices) are not consecutive rows of x, the
 * rows are first gathered into device scratch in pair order (one kernel), so every block's x is contiguous — but the
 * wgmma tile class's pre-pass reads them through the uploaded indices (plan.x_rows), so only another class's such
 * blocks have x gathered; otherwise (lhs_indices NULL, blocks of one row, runs of consecutive tokens) every block
 * reads x in place. */
static bool gather_supports(const qmm_call *call, char *why_not, size_t size) {
    if (call->op != QMM_OP_GATHER) {
        snprintf(why_not, size, "cuda.gather.blocks.auto computes gather only");
        return false;
    }
    if (call->M > 0x7fffffffu) {
        snprintf(why_not, size, "B=%zu index pairs exceed the gather grid (2^31 - 1)", call->M);
        return false;
    }
    const qmm_kernel *cuda_rows[CUDA_ROW_COUNT];
    collect_rows(cuda_rows);
    /* every block is a qmm_t call of this format: ask the rows about the largest possible block */
    qmm_call probe = expert_block_call(call, NULL, 0, call->M, &(cuda_weights_extra){0});
    const qmm_kernel *row;
    if (qmm_select_kernel(cuda_rows, CUDA_ROW_COUNT, &probe, NULL, &row) != QMM_OK) {
        snprintf(why_not, size, "no CUDA qmm_t row takes its blocks: %s", qmm_last_error());
        return false;
    }
    return true;
}

/* Whether gather_run puts its blocks of ≤ 16 rows into grouped GEMV launches (one launch of m8n32 for every block
 * of ≤ 8 rows, one of m16n32 for 9–16) instead of a launch per block: where the mma_gemv rows take the blocks (f16
 * or bf16, 4- or 8-bit, the repacked arrays: N a multiple of 16); why_not says why not. Larger blocks go to grouped
 * launches too (in batch-invariant mode every block, in chunks of ≤ 16 rows; by default the tile launches or the
 * chunks gather_chunk_rows names: gather_small_rows). Measured on the H200
 * (docs/PERF.md, sixteenth session): a launch per expert block cost about 3.2 µs of wall time each (Qwen3-30B-A3B's
 * experts at T = 128: 128 blocks, 413 µs). QMM_CUDA_GATHER_GROUPED=0 turns it off; =1 makes a call that cannot group
 * an error (tests: that grouping happened where it should). */
static int gather_grouped_forced(void) { /* QMM_CUDA_GATHER_GROUPED: 0 or 1, else −1 */
    const char *forced = getenv("QMM_CUDA_GATHER_GROUPED");
    return forced && strcmp(forced, "0") == 0 ? 0 : forced && strcmp(forced, "1") == 0 ? 1 : -1;
}
/* Where the default mode puts an expert block of > 16 rows when grouping (gather_plan, gather_piece_end,
 * gather_piece_class). A launch of its own costs about 5 µs of wall time whatever its work, so a block whose work is
 * small — rows·N·K ≤ GATHER_GROUPED_MACS multiply-adds — goes to a grouped launch: the tile launches over a table of
 * such blocks (gather_tiles), or with the tiles off or too few of them (gather_chunk_rows), where it has ≤ 256 rows,
 * chunks of 16 rows in the grouped GEMV launches; a block of more work keeps a launch of its own on the selector's row
 * (the wgmma and tile rows tuned for one large product). QMM_CUDA_GATHER_CHUNK_ROWS=R cuts exactly the blocks of 17–R
 * rows into chunks (16: none), whatever their work; the others as above. Measured on the H100 (docs/PERF.md,
 * forty-second session), Qwen3-30B-A3B's 768×2048 experts (f16): against a launch per block of > 16 rows, chunks took
 * 0.21–0.28× the time at T = 512 (about 32 rows a block), 0.34–0.52× at T = 2048 (128 rows), and the tiles 0.23× and
 * 0.27–0.30× — tiles against chunks 1.02 and 0.82 at T = 512, 0.78 and 0.61 at T = 2048 (gate_up, down); Qwen3-235B-
 * A22B's 1536×4096 (chunks only) 0.42× at T = 512 and 0.67× at T = 2048 (0.8 G multiply-adds a block); Mixtral-8x7B's
 * 14336×4096 (8 experts, 2 a token) slower grouped: chunks 1.21–2.50×, tiles 1.23–1.74× at T = 128–2048 (32 rows and
 * more, ≥ 1.9 G a block) — hence the bound on the work. */
#define GATHER_GROUPED_MACS (1ull << 30)
#define GATHER_CHUNK_ROWS 256
/* The most rows a block of small work has: GATHER_GROUPED_MACS / (N·K). */
static size_t gather_small_rows(const qmm_call *call) {
    const unsigned long long per_row = (unsigned long long)call->N * call->K; /* a gather's N·K fits: validated */
    return (size_t)(GATHER_GROUPED_MACS / (per_row ? per_row : 1));
}
/* Which grouped tile launches take this call's blocks of small work (QMM_CUDA_GATHER_TILES, CALL_KNOBS_CHECK: 0, 1,
 * mma or wgmma): none (0); the wgmma tile (32 or 64 tokens: gather_wgmma_tokens) where its row takes an expert block
 * of this format (wgmma_supports: a Hopper device) — by default, or forced by `wgmma` (then GATHER_TILES_REFUSED where
 * it cannot, why_not says why; *wgmma_only says it was forced); else, or forced by `mma`, the m64n64 mma_tile where it takes one (tile_supports: its
 * shared memory, K). A block of small work has rows ≤ 2^30 / (N·K) ≤ 2^21: grid.y ≤ 32768 tiles of m64n64; the wgmma
 * launch's work items, ⌈N / 128⌉·⌈rows / 32⌉ ≤ N·rows / 4096 + N / 128 + rows / 32 + 1 (N·rows ≤ 2^25) per block at
 * most (32-token tiles), are checked against int by its launcher (cudaErrorInvalidValue past it). The probe's M is 1:
 * wgmma_supports answers alike for 32 and 64 tokens there. */
enum { GATHER_TILES_REFUSED = -1, GATHER_TILES_NONE, GATHER_TILES_MMA, GATHER_TILES_WGMMA };
static int gather_tiles(const qmm_call *call, bool *wgmma_only, char *why_not, size_t size) {
    const char *forced = getenv("QMM_CUDA_GATHER_TILES");
    *wgmma_only = forced && strcmp(forced, "wgmma") == 0;
    if (forced && strcmp(forced, "0") == 0) return GATHER_TILES_NONE;
    qmm_call probe = expert_block_call(call, NULL, 0, 1, &(cuda_weights_extra){0});
    const bool mma_only = forced && strcmp(forced, "mma") == 0;
    if (!mma_only && wgmma_supports(&probe, QMM_CUDA_WGMMA_GROUPED_TOKENS, why_not, size)) return GATHER_TILES_WGMMA;
    if (*wgmma_only) return GATHER_TILES_REFUSED;
    return tile_supports(&probe, 0, why_not, size) ? GATHER_TILES_MMA : GATHER_TILES_NONE;
}
/* The tile launches' thread blocks for this call's expert blocks of 17 … tile_limit rows, uncut: ⌈rows / 64⌉ tiles of
 * 64 tokens by ⌈N / 128⌉ (wgmma) or ⌈N / 64⌉ (m64n64) row tiles each. (The wgmma class runs 32-token tiles only where
 * every block has ≤ 32 rows — one tile either way — unless QMM_CUDA_GATHER_WGMMA_TOKENS=32 forces them: then this
 * counts fewer items than run, which matters only to the chunk rule below.) */
static size_t gather_tile_blocks(const qmm_call *call, size_t tile_limit, bool wgmma) {
    const size_t rows_per_tile = wgmma ? 128 : 64, row_tiles = (call->N + rows_per_tile - 1) / rows_per_tile;
    size_t blocks = 0;
    for (size_t i0 = 0, i1; i0 < call->M; i0 = i1) {
        i1 = qmm_gather_block_end(call, i0);
        if (i1 - i0 > 16 && i1 - i0 <= tile_limit) blocks += (i1 - i0 + 63) / 64 * row_tiles;
    }
    return blocks;
}
/* The largest block the default mode cuts into chunks of 16 rows (16 or less: none): QMM_CUDA_GATHER_CHUNK_ROWS where
 * set (CALL_KNOBS_CHECK: 16 … 2^30); else with the tile launches none, unless they would run fewer thread blocks than
 * the device has SMs (tile_blocks: gather_tile_blocks) — then, as with the tiles off, the blocks of ≤ 256 rows and
 * small work (small_rows: gather_small_rows). A tile launch of a few expert blocks runs their K one stage after another
 * on a few SMs, a latency of its own after the GEMV launches: measured on the H100 (docs/PERF.md, forty-third session),
 * Qwen3-30B-A3B's and Qwen3-235B-A22B's experts at T = 128 (about 8 rows a block, a few past 16) took 0.87–0.93× the
 * time with those blocks cut, where at T = 512 (about 32 rows a block, hundreds of tiles) cutting the blocks of ≤ 32
 * rows took 1.11–1.19×. */
static size_t gather_chunk_rows(bool tiles, size_t small_rows, size_t tile_blocks, int multiprocessors) {
    const char *forced = getenv("QMM_CUDA_GATHER_CHUNK_ROWS");
    if (forced && *forced) return (size_t)strtol(forced, NULL, 10);
    if (tiles && tile_blocks >= (size_t)(multiprocessors > 0 ? multiprocessors : 1)) return 16;
    return small_rows < GATHER_CHUNK_ROWS ? small_rows : GATHER_CHUNK_ROWS;
}
static bool gather_grouping(const qmm_call *call, int forced, char *why_not, size_t size) {
    if (forced == 0) {
        snprintf(why_not, size, "QMM_CUDA_GATHER_GROUPED=0");
        return false;
    }
    cuda_weights_extra extra = {0};
    qmm_call probe = expert_block_call(call, NULL, 0, 1, &extra);
    return mma_supports(&probe, 16, SIZE_MAX, why_not, size);
}

/* block (expert_block_call's: a piece of any size) as offsets from the gather's arrays: x from gathered_x (or the
 * call's x), out, the MLX-layout w, scales and biases (one offset: both [rows, groups]) and the repacked packed and
 * sb. */
static qmm_cuda_gemv_product grouped_product(const qmm_call *call, const char *gathered_x, const qmm_call *block) {
    const size_t size = qmm_dtype_size(call->dtype);
    const cuda_weights_extra *all = call->weights_extra, *mine = block->weights_extra;
    const char *x = gathered_x ? gathered_x : call->x;
    return (qmm_cuda_gemv_product){
        .x = (unsigned long long)((const char *)block->x - x) / size,
        .out = (unsigned long long)((const char *)block->out - (const char *)call->out) / size,
        .packed = (unsigned long long)(mine->packed - all->packed) / 4,
        .sb = (unsigned long long)((const uint32_t *)mine->sb - (const uint32_t *)all->sb),
        .w = (unsigned long long)(block->w - call->w),
        .scales = (unsigned long long)((const char *)block->scales - (const char *)call->scales) / size,
        .M = (unsigned)block->M,
    };
}

/* The next staging slot for a gather's upload, of at least bytes, once the copy that last read it has completed (its
 * event, created with the slot's first use). */
static qmm_status gather_staging_slot(cuda_state *s, size_t bytes, int *slot_out) {
    const int slot = s->gather_slot;
    if (s->gather_staged[slot]) CUDA_TRY(cudaEventSynchronize(s->gather_staged[slot]));
    else CUDA_TRY(cudaEventCreateWithFlags(&s->gather_staged[slot], cudaEventDisableTiming));
    if (s->gather_staging_bytes[slot] < bytes) {
        free(s->gather_staging[slot]);
        s->gather_staging_bytes[slot] = 0;
        s->gather_staging[slot] = malloc(bytes);
        if (!s->gather_staging[slot])
            return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cuda.gather.blocks.auto: no host memory for the %zu-byte upload of "
                             "the indices and the grouped launches' tables", bytes);
        s->gather_staging_bytes[slot] = bytes;
    }
    *slot_out = slot;
    return QMM_OK;
}

/* A wgmma tile-class piece's rows in the prepared x: its rows to the end of its last tile of `tokens`. */
static size_t gather_prepared_rows(size_t rows, int tokens) {
    return (rows + (size_t)tokens - 1) / (size_t)tokens * (size_t)tokens;
}

/* The grouped wgmma tiles' tokens for a tile class whose largest block has tile_rows rows: QMM_CUDA_GATHER_WGMMA_TOKENS
 * (32 or 64; CALL_KNOBS_CHECK) where set, else 32 where every block fits one 32-token tile, else 64. Measured on the
 * H100 (docs/PERF.md, forty-fifth session), Qwen3-30B-A3B's experts: at T = 256 (blocks of 17–30 rows in the class)
 * the 32-token tiles took 0.89–0.92× the time of the 64-token ones, which pad those blocks to 64 rows; at T = 512
 * (blocks of up to about 50 rows) 0.97–1.08× (gate_up 1.03–1.08: a block of 33–64 rows decodes its weights twice in
 * 32-token tiles). */
static int gather_wgmma_tokens(size_t tile_rows) {
    const char *value = getenv("QMM_CUDA_GATHER_WGMMA_TOKENS");
    if (value && *value) return strcmp(value, "32") == 0 ? 32 : 64;
    return tile_rows <= 32 ? 32 : 64;
}

/* The GEMV launches' token tiles for a piece of `rows` rows: 1 (≤ 8 rows, m8n32), 2 (9–16, m16n32), else 0 (the
 * larger pieces: gather_piece_class decides). */
static int grouped_token_tiles(size_t rows) { return rows <= 8 ? 1 : rows <= 16 ? 2 : 0; }

/* The gather's pieces: the products gather_run launches, pairs i0 … i1−1 of one expert. By default a piece is an
 * expert block (qmm_gather_block_end) or, when grouping, a chunk of 16 rows of a block of > 16 rows and ≤ chunk_rows
 * (gather_chunk_rows; the block's last chunk may be smaller), in the grouped class gather_piece_class gives it when
 * grouping (a GEMV class, or the tile class for a larger block of small work), else a launch of its own.
 * Batch-invariant mode, where grouping (order GATHER_INVARIANT_ORDER, docs/kernels.md §11): each block is cut into
 * chunks of ≤ 16 rows, every chunk in the m16n32 class, and its launches run GATHER_INVARIANT_WARPS warps
 * (QMM_CUDA_WARPS where set) — so a pair's bits are those of the m16n32 tile of those warps on its x row and expert
 * alone: the tile computes each token's column on its own (its MMAs' columns and its Σx are per token), and warp w
 * sums super-blocks w, w + W, … of K, the warps' sums then added in warp order, so with W fixed by the format (and
 * capped by K's super-blocks, gemv_launch_warps) nothing depends on the other pairs. Without grouping (f32, N not a
 * multiple of 16, QMM_CUDA_GATHER_GROUPED=0) every block is a qmm_t call of its own on the row the selector picks for
 * it among the rows of the mode, whose order is fixed by the format too (§11). Measured (docs/PERF.md, forty-first
 * session): the chunks' launches against each block as a batch-invariant qmm_t call. */
#define GATHER_INVARIANT_WARPS 8
/* How gather_run splits a call into pieces and launches (made once per call, the same for every pass over the pieces):
 * grouping (gather_grouping), the largest block cut into chunks (gather_chunk_rows), and the largest block of > 16
 * rows that is not cut and goes to the grouped tile launches (gather_small_rows where gather_tiles, else 0). */
typedef struct gather_plan {
    bool grouping;
    size_t chunk_rows, tile_limit;
    /* the tile class in wgmma launches (GATHER_TILES_WGMMA; then its table always uploaded, each product with its x_row),
     * and whether QMM_CUDA_GATHER_TILES=wgmma asks for them (no fallback to the m64n64 launches) */
    bool wgmma, wgmma_forced;
    int wgmma_tokens; /* the wgmma tile class's tokens per tile (gather_wgmma_tokens) */
    /* the wgmma tile class reads x through the uploaded lhs indices (some piece's rows are not consecutive rows of x):
     * its products' x is their first pair (qmm_cuda_wgmma_tile_grouped's x_rows) */
    bool x_rows;
} gather_plan;
static size_t gather_piece_end(const qmm_call *call, const gather_plan *plan, size_t i0) {
    const size_t i1 = qmm_gather_block_end(call, i0);
    const bool chunked = plan->grouping && i1 - i0 > 16 && (call->batch_invariant || i1 - i0 <= plan->chunk_rows);
    return chunked ? i0 + 16 : i1;
}
/* A piece's class: 1 (m8n32) or 2 (m16n32) for pieces of ≤ 16 rows, GATHER_TILE_CLASS for the larger ones in the
 * grouped tile launches, 0 for a launch of its own on the selector's row. */
#define GATHER_CLASSES 3
#define GATHER_TILE_CLASS 3
static int gather_piece_class(const qmm_call *call, const gather_plan *plan, size_t rows) {
    if (!plan->grouping) return 0;
    if (call->batch_invariant) return 2;
    return rows <= 16 ? grouped_token_tiles(rows) : rows <= plan->tile_limit ? GATHER_TILE_CLASS : 0;
}

/* The products of one class of pieces (gather_piece_end: expert blocks or their chunks) for the grouped launches
 * (gather_piece_class), in pair order, into products (room for all of them) — the wgmma tile class's (plan->wgmma) an
 * entry per token tile of its prepared x (qmm_cuda_wgmma_tile_grouped's tile_products: prepared_rows /
 * plan->wgmma_tokens of them), each with its piece's region from x_row, x its first pair where plan->x_rows. */
static void gather_grouped_products(const qmm_call *call, const gather_plan *plan, const char *gathered_x,
                                    int piece_class, qmm_cuda_gemv_product *products) {
    size_t count = 0, x_row = 0; /* the wgmma tile class: each piece's region of the prepared x (gather_prepared_rows) */
    for (size_t i0 = 0, i1; i0 < call->M; i0 = i1) {
        i1 = gather_piece_end(call, plan, i0);
        if (gather_piece_class(call, plan, i1 - i0) != piece_class) continue;
        cuda_weights_extra extra = {0};
        qmm_call block = expert_block_call(call, gathered_x, i0, i1, &extra);
        const bool x_rows = plan->x_rows && piece_class == GATHER_TILE_CLASS; /* x through the indices, from pair i0 */
        if (x_rows) block.x = call->x;                                       /* (x not gathered for it) */
        qmm_cuda_gemv_product product = grouped_product(call, x_rows ? NULL : gathered_x, &block);
        if (x_rows) product.x = i0;
        if (!plan->wgmma || piece_class != GATHER_TILE_CLASS) {
            products[count++] = product;
            continue;
        }
        product.x_row = (unsigned)x_row; /* the wgmma tile class: the entry once per token tile of its region */
        const size_t rows = gather_prepared_rows(i1 - i0, plan->wgmma_tokens);
        for (size_t t = 0; t < rows / (size_t)plan->wgmma_tokens; t++) products[count++] = product;
        x_row += rows;
    }
}

/* Whether a grouped class's table goes in the call's upload (not the launch's parameter): more than
 * QMM_CUDA_GROUPED_MAX pieces, or the tile class in wgmma launches (its pre-pass reads the table too). */
static bool gather_class_uploaded(const gather_plan *plan, int piece_class, size_t count) {
    return count > QMM_CUDA_GROUPED_MAX || (count > 0 && plan->wgmma && piece_class == GATHER_TILE_CLASS);
}

/* One grouped launch of a class: the GEMV (class 1 or 2: its token tiles) or the m64n64 tile (GATHER_TILE_CLASS). */
static int gather_grouped_launch(const qmm_cuda_launch *launch, int piece_class, const qmm_cuda_gemv_product *host,
                                 const qmm_cuda_gemv_product *device, int count) {
    return piece_class == GATHER_TILE_CLASS ? qmm_cuda_mma_tile_grouped(launch, host, device, count)
                                            : qmm_cuda_mma_gemv_grouped(launch, host, device, count, piece_class);
}

/* The grouped launches of one class of `count` pieces: a class of ≤ QMM_CUDA_GROUPED_MAX pieces in one launch whose
 * parameter holds the table (built here), a larger one from its table in the call's upload (device_table), 65535 pieces
 * per launch (grid.z). tile_rows: the class's largest piece (its 64-token tiles: the m64n64 launches' grid.y). The
 * wgmma tile class (plan->wgmma): one launch over its uploaded table of token tiles (gather_run's upload), its
 * prepared_rows of prepared x (gather_prepared_rows) in `prepared`, the workspace gather_run had for them, x read
 * through the uploaded lhs indices (x_rows) where plan->x_rows. */
static qmm_status gather_grouped_launches(const qmm_call *call, const gather_plan *plan, const char *gathered_x,
                                          int piece_class, size_t count, size_t tile_rows, size_t prepared_rows,
                                          void *prepared, const qmm_cuda_gemv_product *device_table,
                                          const unsigned *x_rows) {
    qmm_cuda_launch launch = launch_of(call);
    launch.x = gathered_x ? gathered_x : call->x;
    if (call->batch_invariant && launch.warps <= 0) launch.warps = GATHER_INVARIANT_WARPS; /* gather_piece_end */
    if (piece_class == GATHER_TILE_CLASS) launch.M = tile_rows;
    if (piece_class == GATHER_TILE_CLASS && plan->wgmma) {
        launch.x = call->x; /* (a gathered copy, where there is one, is for the other classes) */
        launch.wgmma_prepared = prepared;
        const char *blocks = getenv("QMM_CUDA_GATHER_WGMMA_BLOCKS"); /* CALL_KNOBS_CHECK: 1 … 65535 */
        if (blocks && *blocks) launch.multiprocessors = (int)strtol(blocks, NULL, 10); /* the persistent grid's size */
        return launch_status(qmm_cuda_wgmma_tile_grouped(&launch, device_table, prepared_rows,
                                                         plan->x_rows ? x_rows : NULL, plan->wgmma_tokens),
                             plan->wgmma_tokens == 32 ? "grouped wgmma_tile m32n128" : "grouped wgmma_tile m64n128",
                             __FILE__, __LINE__);
    }
    const char *what = piece_class == 1   ? "grouped mma_m8n32"
                       : piece_class == 2 ? "grouped mma_m16n32"
                                          : "grouped mma_tile m64n64";
    if (!device_table) {
        if (count > QMM_CUDA_GROUPED_MAX) /* gather_run uploads such a class's table: never here */
            return qmm_error(QMM_ERR_BACKEND, "cuda.gather.blocks.auto: %zu pieces of a grouped class, more than a "
                             "launch's parameters hold (%d), and no uploaded table", count, QMM_CUDA_GROUPED_MAX);
        qmm_cuda_gemv_product products[QMM_CUDA_GROUPED_MAX];
        gather_grouped_products(call, plan, gathered_x, piece_class, products);
        return launch_status(gather_grouped_launch(&launch, piece_class, products, NULL, (int)count), what, __FILE__,
                             __LINE__);
    }
    for (size_t at = 0; at < count; at += 65535) {
        const int part = (int)(count - at < 65535 ? count - at : 65535);
        const qmm_status status =
            launch_status(gather_grouped_launch(&launch, piece_class, NULL, device_table + at, part), what, __FILE__,
                          __LINE__);
        if (status != QMM_OK) return status;
    }
    return QMM_OK;
}

/* The gather's order on the stream: one upload, when there is anything to upload (the lhs indices when some block's
 * rows are not consecutive rows of x — else every block reads x in place, and a decode step's blocks of one row always
 * do — and the table of a grouped class of more than QMM_CUDA_GROUPED_MAX blocks, or of the wgmma tile class), built on
 * the host first so that nothing is launched before everything the launches need is in place (the wgmma class's
 * prepared-x workspace too); the gather of x's rows; a launch per piece outside the grouped classes (a block of > 16
 * rows of more work, or with the tiles off one not cut, or every block when not grouping); the grouped launches (a
 * class of ≤ QMM_CUDA_GROUPED_MAX pieces with its table in the launch's parameter, but for wgmma). The upload is a copy
 * from pageable memory (a staging slot, gather_staging_slot): measured on the H200 (docs/PERF.md, seventeenth session)
 * the same bytes in pinned memory made the calls 1.07–1.28× slower at T ≥ 8 (probably the copy-engine transfer on the
 * stream between kernels). A decode step (T = 1) uploads nothing: 0.53–0.81× the time of one upload of its table
 * (eighteenth session). */
static qmm_status gather_run(const qmm_call *call) {
    CALL_KNOBS_CHECK();
    cuda_state *s = call->backend_state;
    const qmm_kernel *cuda_rows[CUDA_ROW_COUNT];
    collect_rows(cuda_rows);
    const size_t B = call->M, K = call->K, size = qmm_dtype_size(call->dtype);
    /* Pieces (gather_piece_end) go to the grouped launches when grouping: grouped[0] of ≤ 8 rows, grouped[1] of 9–16
     * (in batch-invariant mode all in grouped[1]), grouped[2] the larger ones where the tile launches take them
     * (gather_piece_class − 1); the others get a launch each on the row the selector picks. */
    size_t grouped[GATHER_CLASSES] = {0, 0, 0}, tile_rows = 0, prepared_rows = 0, prepared_32 = 0;
    char why_not[256] = "";
    const int forced = gather_grouped_forced();
    const bool grouping = gather_grouping(call, forced, why_not, sizeof why_not);
    if (!grouping && forced == 1)
        return qmm_error(QMM_ERR_UNSUPPORTED, "cuda.gather.blocks.auto: QMM_CUDA_GATHER_GROUPED=1, but these expert blocks "
                         "cannot go to the grouped GEMV launches: %s", why_not);
    /* (batch-invariant mode has no tile class: gather_piece_class) */
    bool wgmma_forced = false;
    const int tiles = grouping && !call->batch_invariant ? gather_tiles(call, &wgmma_forced, why_not, sizeof why_not)
                                                         : GATHER_TILES_NONE;
    if (tiles == GATHER_TILES_REFUSED)
        return qmm_error(QMM_ERR_UNSUPPORTED, "cuda.gather.blocks.auto: QMM_CUDA_GATHER_TILES=wgmma, but the wgmma tile "
                         "cannot take these expert blocks: %s", why_not);
    const size_t small_rows = gather_small_rows(call);
    const size_t tile_blocks =
        tiles != GATHER_TILES_NONE ? gather_tile_blocks(call, small_rows, tiles == GATHER_TILES_WGMMA) : 0;
    gather_plan plan = {.grouping = grouping,
                        .chunk_rows = gather_chunk_rows(tiles != GATHER_TILES_NONE, small_rows, tile_blocks,
                                                        s->multiprocessors),
                        .tile_limit = tiles != GATHER_TILES_NONE ? small_rows : 0,
                        .wgmma = tiles == GATHER_TILES_WGMMA,
                        .wgmma_forced = wgmma_forced};
    /* One pass over the pieces: the classes' counts, and whether some piece's rows of x are not consecutive rows of x
     * (then the lhs indices are uploaded): a tile piece's (tile_apart), another's (other_apart) */
    bool tile_apart = false, other_apart = false;
    for (size_t i0 = 0, i1; i0 < B; i0 = i1) {
        i1 = gather_piece_end(call, &plan, i0);
        const int piece_class = gather_piece_class(call, &plan, i1 - i0);
        if (!qmm_gather_block_in_place(call, i0, i1)) {
            if (piece_class == GATHER_TILE_CLASS) tile_apart = true;
            else other_apart = true;
        }
        if (piece_class) grouped[piece_class - 1]++;
        if (piece_class == GATHER_TILE_CLASS && i1 - i0 > tile_rows) tile_rows = i1 - i0;
        if (piece_class == GATHER_TILE_CLASS) { /* the prepared rows with tiles of 64 and of 32 tokens */
            prepared_rows += gather_prepared_rows(i1 - i0, QMM_CUDA_WGMMA_GROUPED_TOKENS);
            prepared_32 += gather_prepared_rows(i1 - i0, 32);
        }
    }
    plan.wgmma_tokens = gather_wgmma_tokens(tile_rows);
    if (plan.wgmma_tokens == 32) prepared_rows = prepared_32;
    /* The wgmma tile class's workspace, had before anything is launched: where it cannot be — more prepared rows than
     * the launch takes, no device memory, or a stream capture it would have to grow in — the m64n64 launches take the
     * class (the same pieces), unless QMM_CUDA_GATHER_TILES=wgmma asked for wgmma (then an error, nothing enqueued). */
    void *prepared = NULL;
    if (plan.wgmma && grouped[GATHER_TILE_CLASS - 1]) {
        if (prepared_rows > QMM_CUDA_WGMMA_GROUPED_ROWS_MAX) {
            if (plan.wgmma_forced)
                return qmm_error(QMM_ERR_UNSUPPORTED, "cuda.gather.blocks.auto: QMM_CUDA_GATHER_TILES=wgmma, but the tile "
                                 "class's %zu rows of prepared x (each block to a multiple of %d) exceed 2^30",
                                 prepared_rows, plan.wgmma_tokens);
        } else {
            qmm_call sized = *call; /* the workspace's size: the prepared rows' */
            sized.M = prepared_rows;
            prepared = wgmma_prepared_workspace(s, &sized, 0);
            if (!prepared && plan.wgmma_forced) {
                enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
                const bool capturing = cudaStreamIsCapturing(s->stream, &capture) == cudaSuccess &&
                                       capture != cudaStreamCaptureStatusNone;
                cudaGetLastError();
                return qmm_error(capturing ? QMM_ERR_UNSUPPORTED : QMM_ERR_OUT_OF_MEMORY,
                                 "cuda.gather.blocks.auto: QMM_CUDA_GATHER_TILES=wgmma, but the prepared-x workspace "
                                 "(%zu bytes for %zu rows, K=%zu) cannot be had %s", qmm_cuda_wgmma_prepared_bytes(
                                 call->bits, call->group_size, prepared_rows, call->K), prepared_rows, call->K,
                                 capturing ? "inside a stream capture (it would have to grow)" : "(out of device memory)");
            }
        }
        plan.wgmma = prepared != NULL;
    }
    /* x's rows gathered into scratch in pair order for the pieces that read x as a contiguous block (the wgmma tile
     * class's pre-pass reads them through the indices instead: plan.x_rows) */
    const bool gather_x = tile_apart || other_apart;
    plan.x_rows = plan.wgmma && grouped[GATHER_TILE_CLASS - 1] && gather_x;
    const bool gather_rows = other_apart || (tile_apart && !plan.wgmma);
    const char *gathered_x = NULL;
    if (gather_rows) {
        size_t x_bytes;
        if (!qmm_mul_size(B, K, &x_bytes) || !qmm_mul_size(x_bytes, size, &x_bytes))
            return qmm_error(QMM_ERR_OVERFLOW, "cuda.gather.blocks.auto: B=%zu gathered rows of K=%zu overflow size_t", B, K);
        const qmm_status status = grow_scratch(s, &s->gather_x, &s->gather_x_bytes, x_bytes);
        if (status != QMM_OK) return status;
        gathered_x = s->gather_x;
    }
    /* The upload: [lhs indices, padded to 16 bytes][the table of each class of more than QMM_CUDA_GROUPED_MAX pieces,
     * and of the wgmma tile class, in class order (gather_class_uploaded) — the wgmma tile class's an entry per token
     * tile, prepared_rows / plan.wgmma_tokens of them (qmm_cuda_wgmma_tile_grouped)]. B ≤ 2^31 − 1
     * (gather_supports), at most B products and prepared_rows ≤ 2^30: no overflow. */
    const size_t index_bytes = gather_x ? (B * sizeof(uint32_t) + 15) / 16 * 16 : 0;
    size_t entries[GATHER_CLASSES]; /* each class's table's entries */
    for (int c = 0; c < GATHER_CLASSES; c++)
        entries[c] = c + 1 == GATHER_TILE_CLASS && plan.wgmma ? prepared_rows / (size_t)plan.wgmma_tokens : grouped[c];
    size_t upload_bytes = index_bytes;
    for (int c = 0; c < GATHER_CLASSES; c++)
        if (gather_class_uploaded(&plan, c + 1, grouped[c])) upload_bytes += entries[c] * sizeof(qmm_cuda_gemv_product);
    /* a class's uploaded table, or NULL: in the parameters */
    const qmm_cuda_gemv_product *tables[GATHER_CLASSES] = {NULL, NULL, NULL};
    if (upload_bytes) {
        int slot = 0;
        qmm_status status = gather_staging_slot(s, upload_bytes, &slot);
        if (status == QMM_OK) status = grow_scratch(s, &s->gather_upload, &s->gather_upload_bytes, upload_bytes);
        if (status != QMM_OK) return status;
        char *staging = s->gather_staging[slot];
        if (index_bytes) {
            memcpy(staging, call->lhs_indices, B * sizeof(uint32_t));
            memset(staging + B * sizeof(uint32_t), 0, index_bytes - B * sizeof(uint32_t)); /* the padding */
        }
        size_t at = index_bytes; /* bytes from the start of the upload (the products are 8-byte aligned there) */
        for (int c = 0; c < GATHER_CLASSES; c++)
            if (gather_class_uploaded(&plan, c + 1, grouped[c])) {
                gather_grouped_products(call, &plan, gathered_x, c + 1, (qmm_cuda_gemv_product *)(staging + at));
                tables[c] = (const qmm_cuda_gemv_product *)((const char *)s->gather_upload + at);
                at += entries[c] * sizeof(qmm_cuda_gemv_product);
            }
        CUDA_TRY(cudaMemcpyAsync(s->gather_upload, staging, upload_bytes, cudaMemcpyHostToDevice, s->stream));
        const cudaError_t recorded = cudaEventRecord(s->gather_staged[slot], s->stream);
        if (recorded != cudaSuccess) { /* the slot's event is an older one: wait for the copy before it is rewritten */
            cudaGetLastError();
            cudaStreamSynchronize(s->stream);
            cudaGetLastError();
            return qmm_error(QMM_ERR_BACKEND, "cudaEventRecord(gather_staged[%d]) failed: %s (%s:%d)", slot,
                             cudaGetErrorString(recorded), __FILE__, __LINE__);
        }
        s->gather_slot = slot ^ 1;
    }
    if (gather_rows) {
        const qmm_status launched = launch_status(qmm_cuda_gather_rows(call->x, s->gather_upload, s->gather_x, B,
                                                                       K * size, s->stream),
                                                  "gather_rows", __FILE__, __LINE__);
        if (launched != QMM_OK) return launched;
    }
    qmm_status status = QMM_OK;
    for (size_t i0 = 0, i1; i0 < B && status == QMM_OK; i0 = i1) {
        i1 = gather_piece_end(call, &plan, i0);
        if (gather_piece_class(call, &plan, i1 - i0)) continue;
        cuda_weights_extra extra = {0};
        qmm_call block = expert_block_call(call, gathered_x, i0, i1, &extra);
        const qmm_kernel *row;
        status = qmm_select_kernel(cuda_rows, CUDA_ROW_COUNT, &block, NULL, &row);
        if (status == QMM_OK) status = row->run(&block);
    }
    for (int c = 0; c < GATHER_CLASSES && status == QMM_OK; c++)
        if (grouped[c])
            status = gather_grouped_launches(call, &plan, gathered_x, c + 1, grouped[c], tile_rows, prepared_rows,
                                             prepared, tables[c], (const unsigned *)s->gather_upload);
    /* lhs_indices and the uploaded tables were copied into the staging slot, the others into their launches'
     * parameters, rhs_indices read above: nothing of the caller's host arrays is used after this call returns. */
    return status;
}


/* The GPU's name as the driver gives it ("NVIDIA H200"): what a tuning table measured here records. */
static qmm_status cuda_device_name(void *state, char *name, size_t size) {
    const cuda_state *cuda = state;
    struct cudaDeviceProp properties;
    CUDA_TRY(cudaGetDeviceProperties(&properties, cuda->device));
    snprintf(name, size, "%s", properties.name);
    return QMM_OK;
}

static const qmm_backend_hooks cuda_hooks = {
    .backend = QMM_BACKEND_CUDA,
    .host_memory = false,
    .kernels = cuda_kernels,
    .kernel_count = sizeof cuda_kernels / sizeof cuda_kernels[0],
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .synchronize = cuda_synchronize,
    .weights_prepare = cuda_weights_prepare,
    .weights_release = cuda_weights_release,
    .stored_bits = cuda_stored_bits,
    .chain_run = cuda_chain_run,
    .chain_release = cuda_chain_release,
    .device_name = cuda_device_name,
};

const qmm_backend_hooks *qmm_cuda_backend_hooks(void) { return &cuda_hooks; }
