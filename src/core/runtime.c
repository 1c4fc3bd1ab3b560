/*
 * runtime.c — context, weights, buffers, matmul, chains and the kernel listing (DESIGN.md §3).
 *
 * A context binds one backend: its hooks (memory, copies, synchronisation) and its kernel table, which
 * is the backend's own rows followed by the reference rows. Weights are validated and copied once at
 * create time and never change; buffers are dtype + count; every matmul is validated here (so kernels
 * only see valid calls, src/core/kernel.h), then src/select.c picks the row. A chain is a recorded
 * list of such calls, validated and planned (kernel chosen) when each step is added, run in order and
 * timed per step. Backends: ref (the oracle rows), cpu (src/cpu/) and cuda (src/cuda/), each when built.
 *
 * Lifetimes: every object counts its holders. The caller holds what it created until it calls the
 * destroy function; each weights, buffer and chain holds its context; each chain step holds its weights
 * and its x and out buffers. An object is freed (and a context's backend closed) when its last holder
 * lets go, so any destroy order is safe and a chain keeps working after the caller destroyed the
 * handles it used. The counts are plain size_t: a context and its objects are used from one thread.
 */
#include "kernel.h"
#ifdef QMM_HAVE_CUDA
#include "cuda_backend.h"
#endif
#ifdef QMM_HAVE_CPU
#include "../cpu/cpu.h"
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *qmm_backend_name(qmm_backend backend) {
    switch (backend) {
    case QMM_BACKEND_REF: return "ref";
    case QMM_BACKEND_CPU: return "cpu";
    case QMM_BACKEND_CUDA: return "cuda";
    }
    return "?";
}

const char *qmm_op_name(qmm_op op) {
    switch (op) {
    case QMM_OP_QMM_T: return "qmm_t";
    case QMM_OP_QMM_N: return "qmm_n";
    case QMM_OP_GATHER: return "gather";
    }
    return "?";
}

/* ───────────────────────────── the host (reference) backend ───────────────────────────── */

/* 64-byte alignment: one cache line, and the widest vector load (AVX-512) a CPU kernel will use on
 * the same memory once the CPU backend shares these hooks. */
#define HOST_ALIGNMENT 64

static qmm_status host_open(int device, void **state) {
    *state = NULL;
    return QMM_OK;
}

static void host_close(void *state) {}

static qmm_status host_alloc(void *state, size_t bytes, void **memory) {
    size_t rounded;
    if (!qmm_add_size(bytes, HOST_ALIGNMENT - 1, &rounded))
        return qmm_error(QMM_ERR_OVERFLOW, "an allocation of %zu bytes overflows when rounded to %d", bytes,
                         HOST_ALIGNMENT);
    rounded -= rounded % HOST_ALIGNMENT;
    *memory = aligned_alloc(HOST_ALIGNMENT, rounded ? rounded : HOST_ALIGNMENT);
    if (!*memory) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "could not allocate %zu bytes of host memory", bytes);
    return QMM_OK;
}

static void host_release(void *state, void *memory) { free(memory); }

static qmm_status host_copy(void *state, void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
    return QMM_OK;
}

static qmm_status host_synchronize(void *state) { return QMM_OK; }

/* QMM_REF_STORED_BITS=1 (a test knob; 0 or unset: off): the reference backend stores 2/3-bit codes as 4-bit and
 * 5/6-bit as 8-bit, as the CUDA backend does (kernel.h, stored_bits), so that the runtime's stored-width path runs
 * where there is no GPU — the reference rows read whatever width a call carries, so no output may change
 * (tests/runtime/test_runtime.c). Read at each qmm_weights_create; another value is an error naming it. */
static qmm_status ref_stored_bits(void *state, int bits, int *stored) {
    (void)state;
    *stored = bits;
    const char *knob = getenv("QMM_REF_STORED_BITS");
    if (!knob || strcmp(knob, "0") == 0) return QMM_OK;
    if (strcmp(knob, "1") != 0)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "QMM_REF_STORED_BITS=%.40s: the knob takes 0 or 1", knob);
    *stored = qmm_decoder_bits(bits);
    return QMM_OK;
}

static const qmm_backend_hooks ref_backend = {
    .backend = QMM_BACKEND_REF,
    .host_memory = true,
    .kernels = NULL, /* the reference backend is the reference rows alone */
    .kernel_count = 0,
    .open = host_open,
    .close = host_close,
    .alloc = host_alloc,
    .release = host_release,
    .upload = host_copy,
    .download = host_copy,
    .synchronize = host_synchronize,
    .stored_bits = ref_stored_bits,
};

#ifdef QMM_HAVE_CPU
/* The CPU backend: the same host memory (so the reference rows run on it too), its own SIMD rows
 * (src/cpu/), and a state that carries the thread count its kernels read from call->backend_state. */
static const qmm_backend_hooks cpu_backend = {
    .backend = QMM_BACKEND_CPU,
    .host_memory = true,
    .kernels = qmm_cpu_kernels,
    .kernel_count = QMM_CPU_KERNEL_COUNT,
    .open = qmm_cpu_open,
    .close = qmm_cpu_close,
    .alloc = host_alloc,
    .release = host_release,
    .upload = host_copy,
    .download = host_copy,
    .synchronize = host_synchronize,
    .get_threads = qmm_cpu_get_threads,
    .set_threads = qmm_cpu_set_threads,
};
#endif

/* The hooks of a backend, or an error naming why there are none. A backend plugs in here: one case
 * returning its qmm_backend_hooks, compiled in when its build option is on. */
static qmm_status backend_hooks(qmm_backend backend, const qmm_backend_hooks **hooks) {
    switch (backend) {
    case QMM_BACKEND_REF: *hooks = &ref_backend; return QMM_OK;
    case QMM_BACKEND_CPU:
#ifdef QMM_HAVE_CPU
        *hooks = &cpu_backend;
        return QMM_OK;
#else
        return qmm_error(QMM_ERR_UNSUPPORTED, "backend cpu is not built (configured with QMM_WITH_CPU=OFF)");
#endif
    case QMM_BACKEND_CUDA:
#ifdef QMM_HAVE_CUDA
        *hooks = qmm_cuda_backend_hooks();
        return QMM_OK;
#else
        return qmm_error(QMM_ERR_UNSUPPORTED, "backend cuda is not built (configured with QMM_WITH_CUDA=OFF, or no nvcc was found)");
#endif
    }
    return qmm_error(QMM_ERR_INVALID_ARGUMENT, "backend=%d is not a qmm_backend (ref=0, cpu=1, cuda=2)", (int)backend);
}

/* The host CPU's name: the first "model name" of /proc/cpuinfo, trimmed ("unknown CPU" without one). What a
 * tuning table measured on a ref or cpu context records as its device. */
static void host_device_name(char *name, size_t size) {
    snprintf(name, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *value = strchr(line, ':');
        if (!value) continue;
        value++;
        while (*value == ' ' || *value == '\t') value++;
        size_t length = strcspn(value, "\n");
        while (length > 0 && (value[length - 1] == ' ' || value[length - 1] == '\t')) length--;
        if (length == 0) continue;
        snprintf(name, size, "%.*s", (int)length, value);
        break;
    }
    fclose(f);
}

/* ───────────────────────────── objects ───────────────────────────── */

/* Every object starts with `references` = 1 (the caller) and `destroyed` = false; the destroy function
 * sets destroyed (the caller's handle may not be used again) and drops the caller's reference. */
struct qmm_context {
    size_t references; /* the caller until qmm_context_destroy, + each weights, buffer and chain of it */
    bool destroyed;
    const qmm_backend_hooks *hooks;
    void *state;
    const qmm_kernel **table; /* backend rows, then the reference rows */
    size_t table_count;
    char device[256];          /* the device's name, as a tuning table records it */
    qmm_tuning_table tuning;   /* the loaded tuning table (empty: none) */
    qmm_tuning_ignored tuning_ignored; /* what its load set aside */
};

struct qmm_weights {
    size_t references; /* the caller until qmm_weights_destroy, + each chain step that uses them */
    bool destroyed;
    qmm_context *context; /* held */
    qmm_qmatrix format; /* pointers NULL: the arrays below are backend memory */
    uint32_t *w;
    void *scales;
    void *biases;
    void *extra; /* the backend's repacked copy (weights_prepare), or NULL */
    int stored_bits; /* the width of the codes in w (hooks->stored_bits; format.bits without it): the calls' bits */
    size_t expert_count; /* experts stacked in the rows (qmm_weights_create_experts); 1 otherwise */
};

struct qmm_buffer {
    size_t references; /* the caller until qmm_buffer_destroy, + each chain step that reads or writes it */
    bool destroyed;
    qmm_context *context; /* held */
    qmm_dtype dtype;
    size_t count;
    void *memory;
};

typedef struct chain_step {
    qmm_weights *weights; /* held, with x and out, so that call's pointers stay valid */
    qmm_buffer *x;
    qmm_buffer *out;
    qmm_call call;
    const qmm_kernel *kernel;
    double microseconds;
} chain_step;

struct qmm_chain {
    qmm_context *context; /* held; nothing holds a chain but the caller */
    chain_step *steps;
    size_t length;
    size_t capacity;
    bool ran; /* the last qmm_chain_run completed, and no step was added since */
    double total_microseconds; /* device time of the whole last run */
    void *graph;               /* the backend's cached submission (chain_run hook), or NULL */
    bool whole_only;           /* qmm_chain_set_step_timing(chain, 0): no per-step events */
};

/* ───────────────────────────── context ───────────────────────────── */

qmm_status qmm_context_create(qmm_backend backend, int device, qmm_context **context) {
    if (!context) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_context_create: context is NULL");
    *context = NULL;
    const qmm_backend_hooks *hooks = NULL;
    qmm_status status = backend_hooks(backend, &hooks);
    if (status != QMM_OK) return status;

    qmm_context *created = calloc(1, sizeof *created);
    bool opened = false;
    if (!created) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_context_create: no memory for a context");
        goto cleanup;
    }
    created->references = 1;
    created->hooks = hooks;
    /* The reference rows read the call's pointers directly, so they join a table only where the
     * backend's memory is host memory (kernel.h); a device backend stages them in its own issue. */
    const size_t ref_rows = hooks->host_memory ? qmm_ref_kernel_count : 0;
    created->table_count = hooks->kernel_count + ref_rows;
    created->table = calloc(created->table_count ? created->table_count : 1, sizeof *created->table);
    if (!created->table) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_context_create: no memory for the kernel table");
        goto cleanup;
    }
    for (size_t i = 0; i < hooks->kernel_count; i++) created->table[i] = &hooks->kernels[i];
    for (size_t i = 0; i < ref_rows; i++) created->table[hooks->kernel_count + i] = &qmm_ref_kernels[i];
    status = hooks->open(device, &created->state);
    if (status != QMM_OK) goto cleanup;
    opened = true;
    if (hooks->device_name) {
        if ((status = hooks->device_name(created->state, created->device, sizeof created->device)) != QMM_OK)
            goto cleanup;
    } else {
        host_device_name(created->device, sizeof created->device);
    }
    *context = created;
    created = NULL;
    status = QMM_OK;

cleanup:
    if (created) {
        if (opened) hooks->close(created->state);
        free(created->table);
        free(created);
    }
    return status;
}

/* Drops one holder; the last one closes the backend and frees the context (and its tuning table). */
static void context_release(qmm_context *context) {
    if (--context->references > 0) return;
    context->hooks->close(context->state);
    qmm_tuning_free(&context->tuning);
    free(context->table);
    free(context);
}

static qmm_context *context_hold(qmm_context *context) {
    context->references++;
    return context;
}

void qmm_context_destroy(qmm_context *context) {
    if (!context || context->destroyed) return;
    context->destroyed = true;
    context_release(context);
}

/* The refusal for a handle its caller has destroyed while another object still holds it. */
#define DESTROYED_RULE "may not be used again (the objects that use it keep it alive only for themselves)"
static qmm_status destroyed_error(const char *function, const char *what, const char *destroy) {
    return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: %s, destroyed with %s, " DESTROYED_RULE, function, what, destroy);
}

qmm_backend qmm_context_backend(const qmm_context *context) {
    return context ? context->hooks->backend : QMM_BACKEND_REF;
}

int qmm_max_threads(void) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    return online > QMM_MAX_THREADS / 8 ? QMM_MAX_THREADS : (int)(8 * online);
}

qmm_status qmm_context_set_threads(qmm_context *context, int threads) {
    if (!context) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_context_set_threads: context is NULL");
    if (context->destroyed) return destroyed_error("qmm_context_set_threads", "the context", "qmm_context_destroy");
    if (threads < 0)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_context_set_threads: threads=%d is negative (0 = the default)",
                         threads);
    const int max = qmm_max_threads();
    if (threads > max)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT,
                         "qmm_context_set_threads: threads=%d is above the limit %d (8 x the %ld CPUs online, at most "
                         "QMM_MAX_THREADS=%d)",
                         threads, max, sysconf(_SC_NPROCESSORS_ONLN), QMM_MAX_THREADS);
    if (context->hooks->set_threads) context->hooks->set_threads(context->state, threads);
    else if (threads > 1)
        return qmm_error(QMM_ERR_UNSUPPORTED, "qmm_context_set_threads: backend %s runs its kernels on %s, threads=%d",
                         qmm_backend_name(context->hooks->backend),
                         context->hooks->host_memory ? "one host thread" : "its device", threads);
    return QMM_OK;
}

int qmm_context_threads(const qmm_context *context) {
    if (!context) return 0;
    return context->hooks->get_threads ? context->hooks->get_threads(context->state) : 1;
}

const char *qmm_context_device(const qmm_context *context) { return context ? context->device : ""; }

/* ───────────────────────────── tuning table ───────────────────────────── */

/* A tuning file is a few KB per shape; anything past this is not one. */
#define TUNING_MAX_BYTES ((size_t)64 << 20)

qmm_status qmm_context_load_tuning(qmm_context *context, const char *path) {
    if (!context || !path) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_context_load_tuning: null argument");
    if (context->destroyed) return destroyed_error("qmm_context_load_tuning", "the context", "qmm_context_destroy");
    qmm_status status = QMM_OK;
    char *text = NULL;
    qmm_tuning_table loaded = {0};
    qmm_tuning_ignored ignored = {0};
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait forever for a writer; the fstat below refuses
     * everything that is not a regular file (where O_NONBLOCK changes nothing) */
    FILE *f = NULL;
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 || !(f = fdopen(fd, "rb"))) {
        status = qmm_error(QMM_ERR_IO, "cannot open tuning table '%s': %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        goto cleanup;
    }
    struct stat info;
    if (fstat(fileno(f), &info) != 0 || !S_ISREG(info.st_mode)) {
        status = qmm_error(QMM_ERR_IO, "tuning table '%s' is not a regular file", path);
        goto cleanup;
    }
    if ((unsigned long long)info.st_size > TUNING_MAX_BYTES) {
        status = qmm_error(QMM_ERR_CORRUPT, "tuning table '%s' has %lld bytes, more than the %zu MiB a tuning table may have",
                           path, (long long)info.st_size, TUNING_MAX_BYTES >> 20);
        goto cleanup;
    }
    size_t size = (size_t)info.st_size;
    if (!(text = malloc(size ? size : 1))) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for tuning table '%s'", size, path);
        goto cleanup;
    }
    if (fread(text, 1, size, f) != size) {
        status = qmm_error(QMM_ERR_IO, "cannot read tuning table '%s': %s", path, ferror(f) ? strerror(errno) : "short read");
        goto cleanup;
    }
    status = qmm_tuning_parse(text, size, path, context->hooks->backend, context->device, context->table,
                              context->table_count, &loaded, &ignored);
    if (status != QMM_OK) goto cleanup;
    /* Replace the previous table only now: a refused file leaves the context as it was. */
    qmm_tuning_free(&context->tuning);
    context->tuning = loaded;
    context->tuning_ignored = ignored;
    loaded.entries = NULL;

cleanup:
    if (f) fclose(f);
    free(text);
    qmm_tuning_free(&loaded);
    return status;
}

qmm_status qmm_context_clear_tuning(qmm_context *context) {
    if (!context) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_context_clear_tuning: context is NULL");
    if (context->destroyed) return destroyed_error("qmm_context_clear_tuning", "the context", "qmm_context_destroy");
    qmm_tuning_free(&context->tuning);
    memset(&context->tuning_ignored, 0, sizeof context->tuning_ignored);
    return QMM_OK;
}

size_t qmm_context_tuning_count(const qmm_context *context, size_t *other_device, size_t *unknown_kernel) {
    if (other_device) *other_device = context ? context->tuning_ignored.other_device : 0;
    if (unknown_kernel) *unknown_kernel = context ? context->tuning_ignored.unknown_kernel : 0;
    return context ? context->tuning.count : 0;
}

/* ───────────────────────────── weights ───────────────────────────── */

qmm_status qmm_weights_create(qmm_context *context, const qmm_qmatrix *matrix, qmm_weights **weights) {
    if (!weights) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_weights_create: weights is NULL");
    *weights = NULL;
    if (!context) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_weights_create: context is NULL");
    if (context->destroyed) return destroyed_error("qmm_weights_create", "the context", "qmm_context_destroy");
    if (!matrix) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_weights_create: matrix is NULL");
    qmm_status status = qmm_qmatrix_validate(matrix);
    if (status != QMM_OK) return status;

    const qmm_backend_hooks *hooks = context->hooks;
    /* The backend's stored width (kernel.h, stored_bits): the codes re-packed into wider words on the host first */
    qmm_qmatrix stored = *matrix;
    uint32_t *widened = NULL;
    int stored_bits = matrix->bits;
    if (hooks->stored_bits && (status = hooks->stored_bits(context->state, matrix->bits, &stored_bits)) != QMM_OK)
        return status;
    if (stored_bits < matrix->bits || qmm_format_validate(stored_bits, matrix->group_size) != QMM_OK)
        return qmm_error(QMM_ERR_BACKEND, "qmm_weights_create: backend %s would store %d-bit codes as %d-bit ones (the "
                         "stored width must be a format's and no narrower)", qmm_backend_name(hooks->backend),
                         matrix->bits, stored_bits);
    if (stored_bits != matrix->bits) {
        if ((status = qmm_widen_codes(matrix->w, matrix->rows, matrix->cols, matrix->bits, stored_bits, &widened)) !=
            QMM_OK)
            return status;
        stored.bits = stored_bits;
        stored.w = widened;
    }
    size_t w_bytes, group_bytes;
    qmm_weights *created = NULL;
    if ((status = qmm_qmatrix_bytes(&stored, &w_bytes, &group_bytes)) != QMM_OK) goto cleanup;

    created = calloc(1, sizeof *created);
    if (!created) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_weights_create: no memory for a weights object");
        goto cleanup;
    }
    created->stored_bits = stored_bits;
    created->references = 1;
    created->context = context_hold(context);
    created->expert_count = 1;
    created->format = *matrix;
    created->format.w = NULL;
    created->format.scales = NULL;
    created->format.biases = NULL;
    void *w_memory = NULL;
    if ((status = hooks->alloc(context->state, w_bytes, &w_memory)) != QMM_OK) goto cleanup;
    created->w = w_memory;
    if ((status = hooks->alloc(context->state, group_bytes, &created->scales)) != QMM_OK) goto cleanup;
    if ((status = hooks->alloc(context->state, group_bytes, &created->biases)) != QMM_OK) goto cleanup;
    if ((status = hooks->upload(context->state, created->w, stored.w, w_bytes)) != QMM_OK) goto cleanup;
    if ((status = hooks->upload(context->state, created->scales, matrix->scales, group_bytes)) != QMM_OK) goto cleanup;
    if ((status = hooks->upload(context->state, created->biases, matrix->biases, group_bytes)) != QMM_OK) goto cleanup;
    if (hooks->weights_prepare &&
        (status = hooks->weights_prepare(context->state, &stored, &created->extra)) != QMM_OK)
        goto cleanup;
    /* The copies above may be asynchronous on a device; the caller may free its arrays on return. */
    if ((status = hooks->synchronize(context->state)) != QMM_OK) goto cleanup;
    *weights = created;
    created = NULL;
    status = QMM_OK;

cleanup:
    qmm_weights_destroy(created);
    free(widened); /* after the synchronize above (or a failure): the uploads have read it */
    return status;
}

static void weights_release(qmm_weights *weights) {
    if (--weights->references > 0) return;
    qmm_context *context = weights->context;
    if (weights->w) context->hooks->release(context->state, weights->w);
    if (weights->scales) context->hooks->release(context->state, weights->scales);
    if (weights->biases) context->hooks->release(context->state, weights->biases);
    if (weights->extra && context->hooks->weights_release) context->hooks->weights_release(context->state, weights->extra);
    free(weights);
    context_release(context);
}

void qmm_weights_destroy(qmm_weights *weights) {
    if (!weights || weights->destroyed) return;
    weights->destroyed = true;
    weights_release(weights);
}

qmm_status qmm_weights_describe(const qmm_weights *weights, qmm_qmatrix *format) {
    if (!weights || !format) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_weights_describe: null argument");
    if (weights->destroyed) return destroyed_error("qmm_weights_describe", "weights", "qmm_weights_destroy");
    *format = weights->format;
    return QMM_OK;
}

/* ───────────────────────────── buffers ───────────────────────────── */

qmm_status qmm_buffer_create(qmm_context *context, qmm_dtype dtype, size_t count, qmm_buffer **buffer) {
    if (!buffer) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_buffer_create: buffer is NULL");
    *buffer = NULL;
    if (!context) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_buffer_create: context is NULL");
    if (context->destroyed) return destroyed_error("qmm_buffer_create", "the context", "qmm_context_destroy");
    if (!qmm_is_float_dtype(dtype))
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_buffer_create: dtype %s is not an activation dtype (f32, f16, bf16)",
                         qmm_dtype_name(dtype));
    if (count == 0) return qmm_error(QMM_ERR_SHAPE, "qmm_buffer_create: count=0, a buffer holds at least 1 element");
    size_t bytes;
    if (!qmm_mul_size(count, qmm_dtype_size(dtype), &bytes))
        return qmm_error(QMM_ERR_OVERFLOW, "qmm_buffer_create: %zu elements of %s overflow a byte count", count,
                         qmm_dtype_name(dtype));
    qmm_status status;
    qmm_buffer *created = calloc(1, sizeof *created);
    if (!created) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_buffer_create: no memory for a buffer object");
        goto cleanup;
    }
    created->references = 1;
    created->context = context_hold(context);
    created->dtype = dtype;
    created->count = count;
    if ((status = context->hooks->alloc(context->state, bytes, &created->memory)) != QMM_OK) goto cleanup;
    *buffer = created;
    created = NULL;
    status = QMM_OK;

cleanup:
    qmm_buffer_destroy(created);
    return status;
}

static void buffer_release(qmm_buffer *buffer) {
    if (--buffer->references > 0) return;
    qmm_context *context = buffer->context;
    if (buffer->memory) context->hooks->release(context->state, buffer->memory);
    free(buffer);
    context_release(context);
}

void qmm_buffer_destroy(qmm_buffer *buffer) {
    if (!buffer || buffer->destroyed) return;
    buffer->destroyed = true;
    buffer_release(buffer);
}

size_t qmm_buffer_count(const qmm_buffer *buffer) { return buffer ? buffer->count : 0; }

qmm_dtype qmm_buffer_dtype(const qmm_buffer *buffer) { return buffer ? buffer->dtype : QMM_F32; }

/* The checks shared by write and read; the byte count of `count` elements. */
static qmm_status check_transfer(const char *function, const qmm_buffer *buffer, const void *host, size_t count,
                                 size_t *bytes) {
    if (!buffer) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: buffer is NULL", function);
    if (buffer->destroyed) return destroyed_error(function, "the buffer", "qmm_buffer_destroy");
    if (!host && count > 0) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: host is NULL with count=%zu", function, count);
    if (count > buffer->count)
        return qmm_error(QMM_ERR_SHAPE, "%s: count=%zu exceeds the buffer's %zu elements", function, count,
                         buffer->count);
    *bytes = count * qmm_dtype_size(buffer->dtype); /* ≤ the buffer's byte size, checked at create */
    return QMM_OK;
}

qmm_status qmm_buffer_write(qmm_buffer *buffer, const void *host, size_t count) {
    size_t bytes = 0;
    qmm_status status = check_transfer("qmm_buffer_write", buffer, host, count, &bytes);
    if (status != QMM_OK || bytes == 0) return status;
    const qmm_context *context = buffer->context;
    return context->hooks->upload(context->state, buffer->memory, host, bytes);
}

qmm_status qmm_buffer_read(const qmm_buffer *buffer, void *host, size_t count) {
    size_t bytes = 0;
    qmm_status status = check_transfer("qmm_buffer_read", buffer, host, count, &bytes);
    if (status != QMM_OK || bytes == 0) return status;
    const qmm_context *context = buffer->context;
    if ((status = context->hooks->synchronize(context->state)) != QMM_OK) return status;
    return context->hooks->download(context->state, host, buffer->memory, bytes);
}

qmm_status qmm_buffer_poison(qmm_buffer *buffer) {
    if (!buffer) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_buffer_poison: buffer is NULL");
    if (buffer->destroyed) return destroyed_error("qmm_buffer_poison", "the buffer", "qmm_buffer_destroy");
    /* Quiet NaN patterns of each dtype, uploaded from a host chunk so that device memory works too. The chunk is
     * on the heap: as a thread-local array its 16 KiB sat in every thread's static TLS, OpenMP workers' included,
     * whose stacks hold it (a small OMP_STACKSIZE then crashed `qmm run`; a break-it helper). */
    enum { CHUNK = 4096 };
    union nan_chunk {
        float f32[CHUNK];
        uint16_t f16[CHUNK];
    } *nan_chunk = malloc(sizeof *nan_chunk);
    if (!nan_chunk)
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_buffer_poison: %zu bytes for the NaN chunk", sizeof *nan_chunk);
    const size_t size = qmm_dtype_size(buffer->dtype);
    for (size_t i = 0; i < CHUNK; i++) {
        switch (buffer->dtype) {
        case QMM_F16: nan_chunk->f16[i] = 0x7E00; break;
        case QMM_BF16: nan_chunk->f16[i] = 0x7FC0; break;
        default: nan_chunk->f32[i] = __builtin_nanf(""); break;
        }
    }
    const qmm_context *context = buffer->context;
    qmm_status status = QMM_OK;
    for (size_t done = 0; done < buffer->count && status == QMM_OK; done += CHUNK) {
        size_t elements = buffer->count - done < CHUNK ? buffer->count - done : CHUNK;
        status = context->hooks->upload(context->state, (char *)buffer->memory + done * size, nan_chunk, elements * size);
    }
    free(nan_chunk);
    return status;
}

/* ───────────────────────────── matmul ───────────────────────────── */

/* Validates everything about a product but the buffers and fills call (pointers but x/out set); kernel.h. */
qmm_status qmm_prepare_call(const char *function, const qmm_context *context, const qmm_weights *weights, size_t M,
                            const qmm_matmul_options *options, qmm_call *call) {
    if (!context) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: context is NULL", function);
    if (!weights) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: weights is NULL", function);
    if (weights->destroyed) return destroyed_error(function, "the weights", "qmm_weights_destroy");
    if (weights->context != context)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: the weights belong to another context", function);
    const qmm_op op = options ? options->op : QMM_OP_QMM_T;
    if (op == QMM_OP_GATHER)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: op=gather takes index arrays: call qmm_gather_matmul", function);
    if (weights->expert_count > 1)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT,
                         "%s: the weights hold %zu experts (qmm_weights_create_experts); multiply them with "
                         "qmm_gather_matmul", function, weights->expert_count);
    if (op != QMM_OP_QMM_T && op != QMM_OP_QMM_N)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: op=%d is not a qmm_op (qmm_t=0, qmm_n=1)", function, (int)op);
    const qmm_qmatrix *format = &weights->format;
    memset(call, 0, sizeof *call);
    call->op = op;
    call->dtype = format->dtype;
    call->bits = weights->stored_bits;
    call->format_bits = format->bits;
    call->group_size = format->group_size;
    call->M = M;
    /* MLX's transpose flag: the same weights are N×K for x·Ŵᵀ and K×N for x·Ŵ. */
    call->N = op == QMM_OP_QMM_T ? format->rows : format->cols;
    call->K = op == QMM_OP_QMM_T ? format->cols : format->rows;
    call->w = weights->w;
    call->scales = weights->scales;
    call->biases = weights->biases;
    call->backend_state = context->state;
    call->weights_extra = weights->extra;
    call->batch_invariant = options && options->batch_invariant;
    if (M == 0) return qmm_error(QMM_ERR_SHAPE, "%s: M=0, a matmul needs M >= 1 rows of x", function);
    size_t elements;
    if (!qmm_mul_size(M, call->K, &elements) || !qmm_mul_size(elements, qmm_dtype_size(call->dtype), &elements))
        return qmm_error(QMM_ERR_OVERFLOW, "%s: x of M*K = %zu*%zu %s elements overflows size_t", function, M, call->K,
                         qmm_dtype_name(call->dtype));
    if (!qmm_mul_size(M, call->N, &elements) || !qmm_mul_size(elements, qmm_dtype_size(call->dtype), &elements))
        return qmm_error(QMM_ERR_OVERFLOW, "%s: out of M*N = %zu*%zu %s elements overflows size_t", function, M,
                         call->N, qmm_dtype_name(call->dtype));
    return QMM_OK;
}

/* Checks one operand buffer: present, same context, the weights' scale dtype, at least `needed`. */
static qmm_status check_operand(const char *function, const char *name, const qmm_context *context,
                                const qmm_buffer *buffer, qmm_dtype dtype, size_t rows, size_t cols,
                                const char *shape) {
    if (!buffer) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: %s is NULL", function, name);
    if (buffer->destroyed)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: buffer %s, destroyed with qmm_buffer_destroy, " DESTROYED_RULE,
                         function, name);
    if (buffer->context != context)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: buffer %s belongs to another context", function, name);
    if (buffer->dtype != dtype)
        return qmm_error(QMM_ERR_SHAPE, "%s: %s has dtype %s but the weights' scales are %s (x and out must match them)",
                         function, name, qmm_dtype_name(buffer->dtype), qmm_dtype_name(dtype));
    if (buffer->count < rows * cols) /* rows·cols checked by qmm_prepare_call */
        return qmm_error(QMM_ERR_SHAPE, "%s: %s holds %zu elements but %s = %zu*%zu = %zu are needed", function, name,
                         buffer->count, shape, rows, cols, rows * cols);
    return QMM_OK;
}

/* A fully validated call: qmm_prepare_call plus the x and out buffers. */
static qmm_status build_call(const char *function, const qmm_context *context, const qmm_weights *weights,
                             const qmm_buffer *x, size_t M, qmm_buffer *out, const qmm_matmul_options *options,
                             qmm_call *call) {
    qmm_status status = qmm_prepare_call(function, context, weights, M, options, call);
    if (status != QMM_OK) return status;
    if ((status = check_operand(function, "x", context, x, call->dtype, M, call->K, "M*K")) != QMM_OK) return status;
    if ((status = check_operand(function, "out", context, out, call->dtype, M, call->N, "M*N")) != QMM_OK)
        return status;
    if (x == out) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: x and out are the same buffer", function);
    call->x = x->memory;
    call->out = out->memory;
    return QMM_OK;
}

static qmm_status choose(const qmm_context *context, const qmm_call *call, const qmm_matmul_options *options,
                         const qmm_kernel **chosen) {
    return qmm_select_kernel_tuned(context->table, context->table_count, &context->tuning, call,
                                   options ? options->kernel : NULL, chosen);
}

qmm_status qmm_matmul(qmm_context *context, const qmm_weights *weights, const qmm_buffer *x, size_t M,
                      qmm_buffer *out, const qmm_matmul_options *options, qmm_kernel_info *info) {
    /* (A chain adds steps through build_call on the context it holds, whoever destroyed the handle.) */
    if (context && context->destroyed) return destroyed_error("qmm_matmul", "the context", "qmm_context_destroy");
    qmm_call call;
    qmm_status status = build_call("qmm_matmul", context, weights, x, M, out, options, &call);
    if (status != QMM_OK) return status;
    const qmm_kernel *kernel;
    if ((status = choose(context, &call, options, &kernel)) != QMM_OK) return status;
    if ((status = kernel->run(&call)) != QMM_OK) return status;
    if (info) *info = kernel->info;
    return QMM_OK;
}

qmm_status qmm_select(qmm_context *context, const qmm_weights *weights, size_t M, const qmm_matmul_options *options,
                      qmm_kernel_info *info) {
    if (context && context->destroyed) return destroyed_error("qmm_select", "the context", "qmm_context_destroy");
    qmm_call call;
    qmm_status status = qmm_prepare_call("qmm_select", context, weights, M, options, &call);
    if (status != QMM_OK) return status;
    if (!info) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_select: info is NULL");
    const qmm_kernel *kernel;
    if ((status = choose(context, &call, options, &kernel)) != QMM_OK) return status;
    *info = kernel->info;
    return QMM_OK;
}

/* ───────────────────────────── gather (MoE) ───────────────────────────── */

qmm_status qmm_weights_create_experts(qmm_context *context, const qmm_qmatrix *stacked, size_t expert_count,
                                      qmm_weights **weights) {
    if (!weights) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_weights_create_experts: weights is NULL");
    *weights = NULL;
    if (stacked && expert_count == 0)
        return qmm_error(QMM_ERR_SHAPE, "qmm_weights_create_experts: expert_count=0, the weights need at least 1 expert");
    if (stacked && stacked->rows % expert_count != 0)
        return qmm_error(QMM_ERR_SHAPE, "qmm_weights_create_experts: rows=%zu of the stacked matrix are not a multiple "
                         "of expert_count=%zu", stacked->rows, expert_count);
    qmm_status status = qmm_weights_create(context, stacked, weights);
    if (status == QMM_OK) (*weights)->expert_count = expert_count;
    return status;
}

size_t qmm_weights_expert_count(const qmm_weights *weights) { return weights ? weights->expert_count : 0; }

/* Whether any row of the context's table computes op (a device backend may have none for an op yet: the
 * reference rows, which read host memory, join only host backends' tables). */
static bool table_has_op(const qmm_context *context, qmm_op op) {
    for (size_t i = 0; i < context->table_count; i++)
        if (context->table[i]->info.op == op) return true;
    return false;
}

/* The gather call of qmm_gather_matmul (with_buffers: x and out checked and set) or of qmm_select_gather (without:
 * call->x and ->out NULL, which no row's supports() reads), validated, and the row the selector (or options->kernel)
 * takes for it. */
static qmm_status gather_select(const char *function, qmm_context *context, const qmm_weights *weights,
                                bool with_buffers, const qmm_buffer *x, size_t T, const uint32_t *lhs_indices,
                                const uint32_t *rhs_indices, size_t B, qmm_buffer *out,
                                const qmm_gather_options *options, qmm_call *call_out, const qmm_kernel **kernel) {
    /* Lifetimes as for qmm_matmul: the caller's handles must be live; the call holds nothing after it
     * returns (a gather is not a chain step), so there is no reference to take. */
    if (!context) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: context is NULL", function);
    if (context->destroyed) return destroyed_error(function, "the context", "qmm_context_destroy");
    if (!weights) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: weights is NULL", function);
    if (weights->destroyed) return destroyed_error(function, "the weights", "qmm_weights_destroy");
    if (weights->context != context)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: the weights belong to another context", function);
    const qmm_qmatrix *format = &weights->format;
    qmm_call call;
    memset(&call, 0, sizeof call);
    bool sorted = false;
    qmm_status status;
    /* x and out first (their handles and sizes, not their contents): the index arrays must hold B entries, and a B
     * beyond what out holds would have the checks below read past them. Where T·K or B·N overflows,
     * qmm_gather_validate says so. */
    if (with_buffers && weights->expert_count > 0) {
        const size_t N = format->rows / weights->expert_count;
        size_t elements;
        if (qmm_mul_size(T, format->cols, &elements) &&
            (status = check_operand(function, "x", context, x, format->dtype, T, format->cols, "T*K")) != QMM_OK)
            return status;
        if (qmm_mul_size(B, N, &elements) &&
            (status = check_operand(function, "out", context, out, format->dtype, B, N, "B*N")) != QMM_OK)
            return status;
    }
    /* Every index is checked here, before any buffer is touched: a bad one leaves out as it was. */
    status = qmm_gather_validate(function, format->rows, format->cols, format->dtype, weights->expert_count, T,
                                 lhs_indices, rhs_indices, B, &call.N, &sorted);
    if (status != QMM_OK) return status;
    if (options && options->sorted_indices && !sorted) {
        size_t i = 1;
        while (rhs_indices[i] >= rhs_indices[i - 1]) i++; /* exists: not sorted */
        return qmm_error(QMM_ERR_INVALID_ARGUMENT,
                         "%s: sorted_indices is set but rhs_indices[%zu]=%u < rhs_indices[%zu]=%u (indices sorted by "
                         "expert must not decrease)", function, i, rhs_indices[i], i - 1, rhs_indices[i - 1]);
    }
    if (with_buffers && x == out) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "%s: x and out are the same buffer", function);
    call.op = QMM_OP_GATHER;
    call.dtype = format->dtype;
    call.bits = weights->stored_bits;
    call.format_bits = format->bits;
    call.group_size = format->group_size;
    call.M = B;
    call.K = format->cols;
    call.x = with_buffers ? x->memory : NULL;
    call.w = weights->w;
    call.scales = weights->scales;
    call.biases = weights->biases;
    call.out = with_buffers ? out->memory : NULL;
    call.backend_state = context->state;
    call.weights_extra = weights->extra;
    call.T = T;
    call.expert_count = weights->expert_count;
    call.lhs_indices = lhs_indices;
    call.rhs_indices = rhs_indices;
    call.rhs_sorted = sorted;
    call.batch_invariant = options && options->batch_invariant;
    if (!(options && options->kernel) && !table_has_op(context, QMM_OP_GATHER))
        return qmm_error(QMM_ERR_UNSUPPORTED,
                         "%s: no kernel of backend %s computes gather yet (the reference gather rows read host "
                         "memory, so they are not in a %s context's table)",
                         function, qmm_backend_name(context->hooks->backend), qmm_backend_name(context->hooks->backend));
    *call_out = call;
    return qmm_select_kernel(context->table, context->table_count, &call, options ? options->kernel : NULL, kernel);
}

qmm_status qmm_gather_matmul(qmm_context *context, const qmm_weights *weights, const qmm_buffer *x, size_t T,
                             const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B, qmm_buffer *out,
                             const qmm_gather_options *options, qmm_kernel_info *info) {
    qmm_call call;
    const qmm_kernel *kernel;
    qmm_status status = gather_select("qmm_gather_matmul", context, weights, true, x, T, lhs_indices, rhs_indices, B,
                                      out, options, &call, &kernel);
    if (status != QMM_OK) return status;
    if ((status = kernel->run(&call)) != QMM_OK) return status;
    if (info) *info = kernel->info;
    return QMM_OK;
}

qmm_status qmm_select_gather(qmm_context *context, const qmm_weights *weights, size_t T, const uint32_t *lhs_indices,
                             const uint32_t *rhs_indices, size_t B, const qmm_gather_options *options,
                             qmm_kernel_info *info) {
    if (!info) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_select_gather: info is NULL"); /* before a choice */
    qmm_call call;
    const qmm_kernel *kernel;
    qmm_status status = gather_select("qmm_select_gather", context, weights, false, NULL, T, lhs_indices, rhs_indices, B,
                                      NULL, options, &call, &kernel);
    if (status != QMM_OK) return status;
    *info = kernel->info;
    return QMM_OK;
}

/* ───────────────────────────── kernel listing ───────────────────────────── */

size_t qmm_kernel_count(const qmm_context *context) { return context ? context->table_count : 0; }

qmm_status qmm_kernel_get(const qmm_context *context, size_t index, qmm_kernel_info *info) {
    if (!context || !info) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_kernel_get: null argument");
    if (context->destroyed) return destroyed_error("qmm_kernel_get", "the context", "qmm_context_destroy");
    if (index >= context->table_count)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_kernel_get: index %zu is out of range: backend %s has %zu kernels",
                         index, qmm_backend_name(context->hooks->backend), context->table_count);
    *info = context->table[index]->info;
    return QMM_OK;
}

int qmm_kernel_usable(const qmm_context *context, size_t index, const char **why_not) {
    static _Thread_local char reason[256];
    reason[0] = '\0';
    if (why_not) *why_not = reason;
    if (!context) {
        qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_kernel_usable: context is NULL");
        return -1;
    }
    if (context->destroyed) {
        destroyed_error("qmm_kernel_usable", "the context", "qmm_context_destroy");
        return -1;
    }
    if (index >= context->table_count) {
        qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_kernel_usable: index %zu is out of range: backend %s has %zu kernels",
                  index, qmm_backend_name(context->hooks->backend), context->table_count);
        return -1;
    }
    const qmm_kernel *row = context->table[index];
    return !row->usable || row->usable(reason, sizeof reason) ? 1 : 0;
}

int qmm_kernel_supports(const qmm_context *context, const char *name, const qmm_weights *weights, size_t M, qmm_op op,
                        const char **why_not) {
    static _Thread_local char reason[256];
    reason[0] = '\0';
    if (why_not) *why_not = reason;
    if (!name) {
        qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_kernel_supports: name is NULL");
        return -1;
    }
    if (context && context->destroyed) {
        destroyed_error("qmm_kernel_supports", "the context", "qmm_context_destroy");
        return -1;
    }
    qmm_matmul_options options = {.op = op, .kernel = name};
    qmm_call call;
    qmm_status status = qmm_prepare_call("qmm_kernel_supports", context, weights, M, &options, &call);
    if (status == QMM_ERR_INVALID_ARGUMENT) return -1;
    const qmm_kernel *row = NULL;
    for (size_t i = 0; i < context->table_count && !row; i++)
        if (strcmp(context->table[i]->info.name, name) == 0) row = context->table[i];
    if (!row) {
        char shown[QMM_PRINTABLE_SIZE]; /* the caller's bytes, escaped */
        qmm_error(QMM_ERR_NOT_FOUND, "qmm_kernel_supports: kernel \"%s\" is not registered in backend %s",
                  qmm_printable(name, strlen(name), shown, sizeof shown), qmm_backend_name(context->hooks->backend));
        return -1;
    }
    if (status != QMM_OK) { /* M = 0 or an overflow: no kernel supports that call */
        snprintf(reason, sizeof reason, "%s", qmm_last_error());
        return 0;
    }
    return qmm_kernel_accepts(row, &call, reason, sizeof reason) ? 1 : 0;
}

/* ───────────────────────────── chains ───────────────────────────── */

qmm_status qmm_chain_create(qmm_context *context, qmm_chain **chain) {
    if (!chain) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_chain_create: chain is NULL");
    *chain = NULL;
    if (!context) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_chain_create: context is NULL");
    if (context->destroyed) return destroyed_error("qmm_chain_create", "the context", "qmm_context_destroy");
    qmm_chain *created = calloc(1, sizeof *created);
    if (!created) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_chain_create: no memory for a chain");
    created->context = context_hold(context);
    *chain = created;
    return QMM_OK;
}

/* Drops the backend's cached submission (the steps changed, or the chain goes). */
static void chain_drop_graph(qmm_chain *chain) {
    if (chain->graph && chain->context->hooks->chain_release)
        chain->context->hooks->chain_release(chain->context->state, chain->graph);
    chain->graph = NULL;
}

void qmm_chain_destroy(qmm_chain *chain) {
    if (!chain) return;
    chain_drop_graph(chain); /* before the steps' holds go: the graph points into their memory */
    for (size_t i = 0; i < chain->length; i++) {
        weights_release(chain->steps[i].weights);
        buffer_release(chain->steps[i].x);
        buffer_release(chain->steps[i].out);
    }
    free(chain->steps);
    context_release(chain->context);
    free(chain);
}

qmm_status qmm_chain_add_matmul(qmm_chain *chain, const qmm_weights *weights, const qmm_buffer *x, size_t M,
                                qmm_buffer *out, const qmm_matmul_options *options) {
    if (!chain) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_chain_add_matmul: chain is NULL");
    chain_step step = {0};
    qmm_status status = build_call("qmm_chain_add_matmul", chain->context, weights, x, M, out, options, &step.call);
    if (status != QMM_OK) return status;
    /* Plan once, run many: the kernel is chosen now, not at every run. */
    if ((status = choose(chain->context, &step.call, options, &step.kernel)) != QMM_OK) return status;
    if (step.kernel->reserve) step.kernel->reserve(&step.call); /* before any capture of the chain's graph */
    if (chain->length == chain->capacity) {
        size_t capacity = chain->capacity ? chain->capacity * 2 : 8, bytes;
        if (!qmm_mul_size(capacity, sizeof *chain->steps, &bytes))
            return qmm_error(QMM_ERR_OVERFLOW, "qmm_chain_add_matmul: a chain of %zu steps overflows", capacity);
        chain_step *grown = realloc(chain->steps, bytes);
        if (!grown) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_chain_add_matmul: no memory for %zu steps", capacity);
        chain->steps = grown;
        chain->capacity = capacity;
    }
    /* The step holds what its call points into (the objects are the library's own, never const). */
    step.weights = (qmm_weights *)weights;
    step.x = (qmm_buffer *)x;
    step.out = out;
    step.weights->references++;
    step.x->references++;
    step.out->references++;
    chain->steps[chain->length++] = step;
    chain->ran = false;
    chain_drop_graph(chain);
    return QMM_OK;
}

size_t qmm_chain_length(const qmm_chain *chain) { return chain ? chain->length : 0; }

static double monotonic_microseconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec * 1e6 + (double)now.tv_nsec * 1e-3;
}

/* Enqueues step i (the chain_run hook's launch callback). */
static qmm_status launch_step(void *argument, size_t i) {
    const chain_step *step = &((const qmm_chain *)argument)->steps[i];
    return step->kernel->run(&step->call);
}

qmm_status qmm_chain_run(qmm_chain *chain) {
    if (!chain) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_chain_run: chain is NULL");
    const qmm_context *context = chain->context;
    chain->ran = false;
    if (context->hooks->chain_run && chain->length > 0) {
        /* A device backend: one submission (CUDA: a captured graph, replayed), timed on the device. */
        double *times = malloc(chain->length * sizeof *times);
        if (!times) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "qmm_chain_run: no memory for %zu step times", chain->length);
        qmm_status status = context->hooks->chain_run(context->state, &chain->graph, chain->length, launch_step, chain,
                                                      chain->whole_only ? NULL : times, &chain->total_microseconds);
        if (status == QMM_OK)
            for (size_t i = 0; i < chain->length; i++)
                chain->steps[i].microseconds = chain->whole_only ? __builtin_nan("") : times[i];
        free(times);
        if (status != QMM_OK) return status;
        chain->ran = true;
        return QMM_OK;
    }
    /* Host backends: each step is timed with CLOCK_MONOTONIC around the kernel and a synchronize; with
     * step timing off, the whole loop is timed once. */
    const double begin = monotonic_microseconds();
    for (size_t i = 0; i < chain->length; i++) {
        chain_step *step = &chain->steps[i];
        const double start = monotonic_microseconds();
        qmm_status status = step->kernel->run(&step->call);
        if (status == QMM_OK && !chain->whole_only) status = context->hooks->synchronize(context->state);
        if (status != QMM_OK) return status;
        step->microseconds = chain->whole_only ? __builtin_nan("") : monotonic_microseconds() - start;
    }
    qmm_status status = context->hooks->synchronize(context->state);
    if (status != QMM_OK) return status;
    chain->total_microseconds = monotonic_microseconds() - begin;
    chain->ran = true;
    return QMM_OK;
}

qmm_status qmm_chain_step(const qmm_chain *chain, size_t step, double *microseconds, qmm_kernel_info *info) {
    if (!chain) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_chain_step: chain is NULL");
    if (step >= chain->length)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_chain_step: step %zu is out of range: the chain has %zu steps",
                         step, chain->length);
    if (!chain->ran)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT,
                         "qmm_chain_step: the chain has not run since its last step was added or its step timing "
                         "changed (call qmm_chain_run)");
    if (microseconds) *microseconds = chain->steps[step].microseconds;
    if (info) *info = chain->steps[step].kernel->info;
    return QMM_OK;
}

qmm_status qmm_chain_elapsed(const qmm_chain *chain, double *microseconds) {
    if (!chain || !microseconds) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_chain_elapsed: null argument");
    if (!chain->ran)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT,
                         "qmm_chain_elapsed: the chain has not run since its last step was added or its step timing "
                         "changed (call qmm_chain_run)");
    *microseconds = chain->total_microseconds;
    return QMM_OK;
}

qmm_status qmm_chain_set_step_timing(qmm_chain *chain, int enabled) {
    if (!chain) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_chain_set_step_timing: chain is NULL");
    if ((bool)!enabled != chain->whole_only) {
        chain->whole_only = !enabled;
        chain->ran = false;
        chain_drop_graph(chain);
    }
    return QMM_OK;
}
