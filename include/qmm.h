/*
 * qmm.h — weight-only quantized matrix multiplication in the MLX "affine" format.
 *
 * The one public header of libqmm. Every function returns a qmm_status; on failure a thread-local
 * message (qmm_last_error) names the bad value and the rule it broke. The library never prints,
 * never aborts on bad input and never leaves a half-written file behind.
 *
 * The format (see docs/kernels.md): a matrix of R rows × C columns is cut along each
 * row into groups of group_size ∈ {32, 64, 128} values; group g of row r has a scale s and a bias b
 * (f32, f16 or bf16) and each value is an unsigned code q of bits ∈ {2, 3, 4, 5, 6, 8} bits, decoding
 * as ŵ = s·q + b. Codes are packed into uint32 words: each row is one little-endian, LSB-first bit
 * stream (code j occupies stream bits [j·bits, (j+1)·bits)), so a row has C·bits/32 words.
 * Source: MLX mx.quantize / mx.dequantize / mx.quantized_matmul (mlx/backend/cpu/quantized.cpp).
 */
#ifndef QMM_H
#define QMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QMM_VERSION_MAJOR 0
#define QMM_VERSION_MINOR 1
#define QMM_VERSION_PATCH 0

/* ───────────────────────────── Status and errors ───────────────────────────── */

typedef enum qmm_status {
    QMM_OK = 0,
    QMM_ERR_INVALID_ARGUMENT = 1, /* null pointer, bad enum, option out of range */
    QMM_ERR_SHAPE = 2,            /* M/N/K zero, not a multiple of group_size, sizes disagree */
    QMM_ERR_FORMAT = 3,           /* bits or group_size outside the supported sets */
    QMM_ERR_OVERFLOW = 4,         /* a size computation (M·K, bytes) overflows */
    QMM_ERR_OUT_OF_MEMORY = 5,
    QMM_ERR_IO = 6,               /* open/read/write/rename/mmap failed */
    QMM_ERR_CORRUPT = 7,          /* a file's contents break its format's rules */
    QMM_ERR_UNSUPPORTED = 8,      /* valid input that qmm does not handle (a GGUF type, a backend) */
    QMM_ERR_NOT_FOUND = 9,        /* a named tensor, layer or kernel does not exist */
    QMM_ERR_NUMERIC = 10,         /* NaN/Inf where a finite value is required */
    QMM_ERR_BACKEND = 11,         /* a device/runtime call failed (carries call, file, line) */
} qmm_status;

/* A short constant English name of a status ("invalid argument"). Never NULL; unknown values give
 * "unknown status". Thread-safe. */
const char *qmm_status_string(qmm_status status);

/* The message set by the last failing qmm call on this thread, e.g.
 * "K=576 is not a multiple of group_size=128". "" when no call has failed. The pointer stays valid
 * until the next qmm call on this thread. */
const char *qmm_last_error(void);

/* ───────────────────────────── Data types ───────────────────────────── */

/* Element types. F32/F16/BF16 are the activation/scale dtypes; the others appear in checkpoints
 * (U32 holds packed codes). The numbering is stable. */
typedef enum qmm_dtype {
    QMM_F32 = 0,
    QMM_F16 = 1,
    QMM_BF16 = 2,
    QMM_F64 = 3,
    QMM_U8 = 4,
    QMM_I8 = 5,
    QMM_U16 = 6,
    QMM_I16 = 7,
    QMM_U32 = 8,
    QMM_I32 = 9,
    QMM_U64 = 10,
    QMM_I64 = 11,
    QMM_BOOL = 12,
    QMM_DTYPE_COUNT = 13
} qmm_dtype;

/* Bytes per element (0 for an unknown value). */
size_t qmm_dtype_size(qmm_dtype dtype);
/* Lower-case name: "f32", "f16", "bf16", "f64", "u8", ... ; "?" for an unknown value. */
const char *qmm_dtype_name(qmm_dtype dtype);
/* Parses a name as printed by qmm_dtype_name, or its long name ("float32", "float16", "bfloat16", "float64", "uint8",
 * "int8", …, "uint64", "int64", "bool"). Errors: QMM_ERR_INVALID_ARGUMENT for null pointers or an unknown name (the
 * message shows the name escaped). */
qmm_status qmm_dtype_parse(const char *name, qmm_dtype *dtype);

/* IEEE binary16 / bfloat16 <-> binary32. Narrowing rounds to nearest, ties to even; NaN stays NaN
 * (quiet, sign kept); subnormals are produced and read exactly; overflow gives ±Inf. */
uint16_t qmm_f32_to_f16(float value);
float qmm_f16_to_f32(uint16_t bits);
uint16_t qmm_f32_to_bf16(float value);
float qmm_bf16_to_f32(uint16_t bits);

/* Converts count elements between the float dtypes F32/F16/BF16 (any pair, same-type is a copy). src and dst may
 * overlap (in place, e.g. f16 -> f32 widened into the same buffer: every element is read before it is overwritten).
 * Errors: QMM_ERR_INVALID_ARGUMENT for null pointers (with count > 0) or a non-float dtype,
 * QMM_ERR_OVERFLOW when count elements overflow a byte count, QMM_ERR_OUT_OF_MEMORY where an overlap that
 * neither direction can convert in place needs a copy of the source and it cannot be allocated. */
qmm_status qmm_convert(const void *src, qmm_dtype src_dtype, void *dst, qmm_dtype dst_dtype, size_t count);

/* ───────────────────────────── The affine format ───────────────────────────── */

/* A quantized matrix in host memory, R rows × C columns (unpacked), quantized along each row.
 *   w       uint32 [rows, cols·bits/32]   packed codes
 *   scales  dtype  [rows, cols/group_size]
 *   biases  dtype  [rows, cols/group_size]
 * dtype is QMM_F32, QMM_F16 or QMM_BF16. For out = x·Ŵᵀ (qmm_t, a linear layer) rows = N and
 * cols = K; for out = x·Ŵ (qmm_n) rows = K and cols = N. The struct borrows its arrays; w must be
 * 4-byte aligned (QMM_ERR_INVALID_ARGUMENT otherwise; scales and biases may be at any address). */
typedef struct qmm_qmatrix {
    const uint32_t *w;
    const void *scales;
    const void *biases;
    qmm_dtype dtype;
    size_t rows;
    size_t cols;
    int bits;
    int group_size;
} qmm_qmatrix;

/* Checks bits ∈ {2,3,4,5,6,8} and group_size ∈ {32,64,128}.
 * Errors: QMM_ERR_FORMAT, message names the value and the allowed set. */
qmm_status qmm_format_validate(int bits, int group_size);

/* Validates a whole qmm_qmatrix: format, non-null arrays, rows ≥ 1, cols ≥ 1, cols a multiple of
 * group_size, float dtype, byte sizes that fit in size_t. Errors: QMM_ERR_FORMAT, QMM_ERR_SHAPE,
 * QMM_ERR_INVALID_ARGUMENT, QMM_ERR_OVERFLOW. */
qmm_status qmm_qmatrix_validate(const qmm_qmatrix *matrix);

/* Byte sizes of a matrix's arrays: *w_bytes of w (rows·cols·bits/32 uint32), *group_bytes of scales
 * and of biases each (rows·cols/group_size elements of dtype); either output may be NULL. The array
 * pointers are not looked at, so this sizes the outputs of qmm_quantize. Errors: those of
 * qmm_qmatrix_validate other than the NULL-array ones. */
qmm_status qmm_qmatrix_bytes(const qmm_qmatrix *matrix, size_t *w_bytes, size_t *group_bytes);

/* Words of packed codes per row: cols·bits/32 (cols must be a multiple of group_size, so exact). */
size_t qmm_packed_words(size_t cols, int bits);
/* Groups per row: cols / group_size. */
size_t qmm_groups(size_t cols, int group_size);

/* Packs codes[rows·cols] (each < 2^bits, one per byte) into w[rows, cols·bits/32] (LSB-first stream
 * per row; 3/5/6-bit codes may straddle two words). Errors: QMM_ERR_FORMAT (bits), QMM_ERR_SHAPE
 * (cols·bits not a multiple of 32), QMM_ERR_INVALID_ARGUMENT (null, w not 4-byte aligned, a code ≥ 2^bits:
 * nothing is written),
 * QMM_ERR_OVERFLOW (rows·cols or the word count overflows size_t), QMM_ERR_OUT_OF_MEMORY (codes and w overlap —
 * in place is allowed — and the copy of codes that needs cannot be allocated). */
qmm_status qmm_pack(const uint8_t *codes, size_t rows, size_t cols, int bits, uint32_t *w);
/* The inverse of qmm_pack; w and codes may overlap (in place) as there. Same errors (without the code check). */
qmm_status qmm_unpack(const uint32_t *w, size_t rows, size_t cols, int bits, uint8_t *codes);

/* Which of MLX's two quantizers to reproduce bit for bit.
 * CPU: min/max over the group, round = rint (ties to even) — mlx/backend/cpu/quantized.cpp.
 * GPU: running max starts at 0 (an all-negative group uses [min, 0]; the min is not clamped, so an
 *      all-positive group still uses [min, max]), round = half away from zero —
 *      mlx/backend/metal/kernels/quantized.h (what mlx-community checkpoints were made with). */
typedef enum qmm_convention { QMM_CONVENTION_CPU = 0, QMM_CONVENTION_GPU = 1 } qmm_convention;

/* Quantizes a float matrix w[rows, cols] of dtype F32/F16/BF16 (MLX keeps scales and biases in the
 * weight dtype, so scales/biases have this dtype too):
 *   out_w       uint32 [rows, cols·bits/32]
 *   out_scales  dtype  [rows, cols/group_size]
 *   out_biases  dtype  [rows, cols/group_size]     (all allocated by the caller)
 * All arithmetic is IEEE f32 as in MLX; scales and biases are rounded once to dtype. An output may overlap w (in
 * place: w is then read from a copy); the three outputs must not overlap each other.
 * Errors: QMM_ERR_FORMAT, QMM_ERR_SHAPE (rows/cols 0, cols not a multiple of group_size),
 * QMM_ERR_INVALID_ARGUMENT (null, out_w not 4-byte aligned, non-float dtype, bad convention, outputs that overlap each
 * other), QMM_ERR_OUT_OF_MEMORY (the copy of an overlapped w), QMM_ERR_OVERFLOW,
 * QMM_ERR_NUMERIC (NaN or
 * Inf in w: the message names row and column, and nothing is written; or a group whose max − min overflows
 * f32, named by row and columns, after earlier groups were written). Source: mx.quantize(w, group_size, bits). */
qmm_status qmm_quantize(const void *w, qmm_dtype dtype, size_t rows, size_t cols, int bits, int group_size,
                        qmm_convention convention, uint32_t *out_w, void *out_scales, void *out_biases);

/* Dequantizes matrix into out[rows, cols] of out_dtype (F32/F16/BF16), bit for bit what
 * mx.dequantize(...).astype(out_dtype) gives for the same arrays: in the scales' dtype T,
 * ŵ = round_T(round_T(s·q) + b) — two roundings, never a fused multiply-add — then converted to out_dtype
 * (exact when widening, one round-to-nearest-even when narrowing). See src/core/quantize.c.
 * out may overlap the matrix's arrays (in place: an overlapped array is read from a copy).
 * Errors: as qmm_qmatrix_validate, plus QMM_ERR_INVALID_ARGUMENT for out or a non-float out_dtype,
 * QMM_ERR_OUT_OF_MEMORY (the copy of an overlapped array). Source: mx.dequantize (checked against mlx 0.32.4, CPU). */
qmm_status qmm_dequantize(const qmm_qmatrix *matrix, void *out, qmm_dtype out_dtype);

/* ───────────────────────────── The oracle (reference products) ───────────────────────────── */

/* out[M, N] = x[M, K] · Ŵᵀ with matrix rows = N, cols = K (MLX quantized_matmul transpose=True).
 * x and out have matrix->dtype. Accumulates in f32 with the per-group split
 * acc += s·Σ(q·x) + b·Σx, one rounding to the output dtype at the end. Non-finite rule: where an
 * output's f32 accumulator ends ±inf or NaN (a non-finite input, or a partial sum that overflowed), it
 * is replaced by the f64 direct form Σ(s·q + b)·x — qmm_ref_dense_f64's value — rounded to f32, so the
 * output is NaN only where the IEEE product is NaN and ±inf only where an input is infinite or the
 * product is beyond the f32 range (docs/kernels.md §2). Single-threaded, scalar: this is the reference
 * every kernel is tested against.
 * Errors: QMM_ERR_SHAPE (M = 0), QMM_ERR_OVERFLOW (M·K or M·N overflow), QMM_ERR_INVALID_ARGUMENT
 * (x or out NULL), validation errors, QMM_ERR_OUT_OF_MEMORY (scratch of a few rows of x). */
qmm_status qmm_ref_qmm_t(const qmm_qmatrix *matrix, const void *x, size_t M, void *out);
/* out[M, N] = x[M, K] · Ŵ with matrix rows = K, cols = N (MLX quantized_matmul transpose=False).
 * MLX CPU's arithmetic for this case (mlx/backend/cpu/quantized.cpp, _qmm): no split; for each output
 * the f32 sum over k = 0, 1, ... in order of x[m, k]·ŵ with ŵ = s·q + b formed first, then one rounding
 * to the output dtype at the end (MLX rounds every operation to the activation dtype; qmm accumulates
 * in f32, so the two agree bit for bit for f32 wherever the f32 result is finite). The same non-finite
 * rule as qmm_ref_qmm_t. Same errors. */
qmm_status qmm_ref_qmm_n(const qmm_qmatrix *matrix, const void *x, size_t M, void *out);
/* The f64 dense oracle used by tests and `qmm run`: dequantizes each ŵ in f64 (s·q is exact, + b
 * rounds at most once, by 2^-53 relative) and accumulates Σ ŵ·x in f64 in increasing k; out_f64[M, N]
 * is never rounded to a dtype. transpose = 1 for qmm_t, 0 for qmm_n (else QMM_ERR_INVALID_ARGUMENT).
 * If abs_dot is not NULL it receives Σ|ŵ|·|x| style magnitudes (Σ_k (|s·q| + |b|)·|x_k|) per output,
 * the input of the error bound qmm_error_bound. Same errors. */
qmm_status qmm_ref_dense_f64(const qmm_qmatrix *matrix, const void *x, size_t M, int transpose,
                             double *out_f64, double *abs_dot);

/* The MoE gather product (MLX gather_qmm(x, w, scales, biases, lhs_indices, rhs_indices, transpose=True,
 * group_size, bits), mlx/backend/cpu/quantized.cpp), for B index pairs:
 *     out[i, :] = x[lhs_indices[i], :] · Ŵ[rhs_indices[i]]ᵀ          i = 0 … B−1
 *   stacked      the weights of E = expert_count experts, stored contiguously as MLX stores w [E, N, K·bits/32]
 *                and scales/biases [E, N, K/group_size]: one qmm_qmatrix with rows = E·N and cols = K, expert e
 *                being rows [e·N, (e+1)·N). A checkpoint layer with a leading expert dimension is exactly this
 *                (qmm_layer.matrix with qmm_layer.experts).
 *   x            stacked->dtype [T, K]; out stacked->dtype [B, N]
 *   lhs_indices  uint32 [B], each < T; NULL means lhs_indices[i] = i (then B ≤ T)
 *   rhs_indices  uint32 [B], each < E (any order; repeats and unused experts are fine)
 * Each output row is computed exactly as qmm_ref_qmm_t computes row 0 of x[lhs_indices[i]] times expert
 * rhs_indices[i] (f32, per-group split, one rounding to the dtype), so rows do not depend on B, on the
 * order of the pairs or on the other pairs. Every index is checked before anything is written.
 * Errors: validation errors of stacked; QMM_ERR_SHAPE (expert_count 0 or not dividing stacked->rows, T = 0,
 * B = 0, lhs_indices NULL with B > T); QMM_ERR_INVALID_ARGUMENT (x, rhs_indices or out NULL; an index array
 * not 4-byte aligned; an index out
 * of range: the message names the array, the position, the value and the bound, e.g.
 * "rhs_indices[5]=8 is out of range: the weights hold 8 experts (0..7)"); QMM_ERR_OVERFLOW (T·K or B·N);
 * QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_ref_gather_qmm(const qmm_qmatrix *stacked, size_t expert_count, const void *x, size_t T,
                              const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B, void *out);
/* The f64 check of the gather product: qmm_ref_dense_f64 (transpose = 1) of each pair's x row and expert,
 * out_f64[B, N] and, when abs_dot is not NULL, abs_dot[B, N] (the input of qmm_error_bound with K = cols).
 * Same arguments and errors as qmm_ref_gather_qmm. */
qmm_status qmm_ref_gather_dense_f64(const qmm_qmatrix *stacked, size_t expert_count, const void *x, size_t T,
                                    const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B,
                                    double *out_f64, double *abs_dot);

/* The documented error bound for one output of a kernel that accumulates K products in f32 and rounds
 * once to out_dtype (docs/kernels.md §6, "Tolerance"):
 *     bound = slack·( (1 + u(out_dtype))·( γ(K + 2)·abs_dot + (1 + γ(K + 2))·K·2^-149 )
 *                     + u(out_dtype)·|exact| + tiny(out_dtype) )
 * with γ(n) = n·u32/(1 − n·u32), u32 = 2^-24, u(f32) = 2^-24, u(f16) = 2^-11, u(bf16) = 2^-8,
 * tiny = the smallest subnormal of out_dtype. The K·2^-149 term covers f32 underflow inside the
 * accumulation (each of at most 2K multiplications may lose 2^-150 absolute to a subnormal result);
 * the factor (1 + u) is the final rounding acting on the accumulated error. exact and abs_dot are
 * qmm_ref_dense_f64's outputs. Assumptions: no partial sum overflows f32 and |exact| + error stays
 * inside out_dtype's range (outputs beyond them fall under the non-finite rule, docs/kernels.md §2).
 * slack multiplies the whole bound (1 for the oracle and exact-order kernels; a kernel table row may
 * document a larger one with its reason). Returns NaN (so that every comparison fails) for a non-float
 * out_dtype, a slack that is not finite and > 0 (0, negative, NaN, +inf), a non-finite exact or
 * abs_dot (non-finite outputs are compared exactly, not within a bound), or K with (K + 2)·u32 ≥ 1,
 * i.e. K ≥ 2^24 − 2. Thread-safe. */
double qmm_error_bound(size_t K, qmm_dtype out_dtype, double exact, double abs_dot, double slack);

/* The verdict on one output `got` (the kernel's value in out_dtype, widened to double) against the exact
 * value — the one rule every checker applies (tests, qmm matmul, qmm run; docs/kernels.md §6, "Verdict").
 * Right when: exact is not finite and got is the same value (NaN for NaN, the same infinity); got is finite
 * and |got − exact| ≤ qmm_error_bound(K, out_dtype, exact, abs_dot, slack); or got is ±inf of exact's sign
 * and |exact| + bound reaches the overflow threshold of out_dtype (its largest finite value plus half an
 * ulp: 65520 for f16, (2 − 2^-24)·2^128 for f32, (2 − 2^-8)·2^128 for bf16), i.e. correct rounding to
 * out_dtype of exact — or of a value within the bound of it — is ±inf. Returns 1 when right, else 0.
 * If ratio is not NULL it receives error/bound for a finite got, (threshold − |exact|)/bound (≥ 0) for an
 * accepted or rejected infinity of the right sign, 0 for a matched non-finite exact, +inf otherwise (NaN
 * output, NaN bound, infinity of the wrong sign). Thread-safe. */
int qmm_output_check(size_t K, qmm_dtype out_dtype, double got, double exact, double abs_dot, double slack,
                     double *ratio);

/* ───────────────────────────── Runtime: context, weights, buffers ───────────────────────────── */

typedef enum qmm_backend {
    QMM_BACKEND_REF = 0,  /* the scalar oracle kernels only */
    QMM_BACKEND_CPU = 1,  /* CPU SIMD kernels (AVX-512, AVX2, portable C; picked at run time), then the reference rows */
    QMM_BACKEND_CUDA = 2, /* NVIDIA GPUs, compute capability ≥ 8.0: tensor-core and generic kernels (docs/kernels.md §9) */
} qmm_backend;

/* "ref", "cpu", "cuda". */
const char *qmm_backend_name(qmm_backend backend);

typedef struct qmm_context qmm_context;
typedef struct qmm_weights qmm_weights;
typedef struct qmm_buffer qmm_buffer;
typedef struct qmm_chain qmm_chain;

/* Lifetimes. Contexts, weights, buffers and chains may be destroyed in any order. Each object counts
 * its holders: the caller holds what it created until it calls the destroy function; every weights,
 * buffer and chain holds its context; every chain step holds its weights and its x and out buffers.
 * destroy drops the caller's hold, and an object's memory (and, for a context, its backend: device,
 * stream, threads) goes when the last holder goes. So a chain keeps running, with the same results,
 * after the caller destroyed the weights, buffers or context it uses, and a context destroyed before
 * its weights is closed when the last of them is destroyed.
 * After destroy the caller's handle is spent: while another object still holds it, passing it to a
 * qmm function fails with QMM_ERR_INVALID_ARGUMENT ("... destroyed with qmm_weights_destroy, may not
 * be used again ...") and a second destroy is ignored; once the last holder is gone it is a dangling
 * pointer like any freed one. (A chain whose context handle was destroyed still accepts steps: it uses
 * its own hold.) The counts are not atomic: a context and all its objects are used from one thread. */

/* Creates a context bound to one backend (for CUDA: device ordinal `device`, one stream of its own;
 * ignored otherwise). Weights and buffers of a CUDA context live in device memory (cudaMalloc); matmuls
 * are queued on the stream and qmm_buffer_read waits for them.
 * Errors: QMM_ERR_UNSUPPORTED when the backend is not built in, or (CUDA) there is no usable device
 * ("no CUDA device: …", or a compute capability below 8.0); QMM_ERR_INVALID_ARGUMENT for a CUDA device
 * ordinal that does not exist, or a CUDA knob outside its rule (QMM_CUDA_WARPS, QMM_CUDA_PDL,
 * QMM_CUDA_GEMV_WARPS_MODEL: environment variables for experiments, docs/kernels.md §12; the message names
 * the variable, its value and the rule); QMM_ERR_BACKEND for a failing CUDA call (naming the call, file and line);
 * QMM_ERR_OUT_OF_MEMORY. A context is not thread-safe: use one per thread. */
qmm_status qmm_context_create(qmm_backend backend, int device, qmm_context **context);
/* Drops the caller's hold on the context (see "Lifetimes"): it is closed and freed now, or when the
 * last weights, buffer or chain created from it is destroyed. NULL ok. */
void qmm_context_destroy(qmm_context *context);
/* The backend the context was created with (QMM_BACKEND_REF for NULL). */
qmm_backend qmm_context_backend(const qmm_context *context);
/* Sets the number of host threads the context's kernels use for each matmul: threads ≥ 1 sets it,
 * 0 restores the default (the number of cores this process may run on, sched_getaffinity, at most
 * qmm_max_threads()). Only the CPU backend runs kernels on several host threads (OpenMP, over N and M);
 * a caller that runs its own threads sets 1 here so that the two are not oversubscribed. On the ref
 * backend (one thread) and on device backends only 0 and 1 are accepted. Takes effect from the next
 * matmul or chain run (a chain reads it when it runs). The context is not thread-safe: do not call this
 * while a matmul on the same context is running.
 * The count is bounded by qmm_max_threads(): every output is computed by one thread, so threads beyond
 * the cores only add scheduling, per-thread scratch (up to about 0.4 MiB each on the tiled rows) and
 * OpenMP team bookkeeping (libgomp keeps some of it on the caller's stack: 100000 threads overflowed it).
 * Starting the team can still fail below the bound where the process may not create threads (RLIMIT_NPROC,
 * a memory limit); libgomp then ends the process, which no return value can report.
 * Errors: QMM_ERR_INVALID_ARGUMENT (NULL or destroyed context, threads < 0, threads > qmm_max_threads(),
 * naming the value and the limit), QMM_ERR_UNSUPPORTED (threads > 1 on a backend without host threads). */
qmm_status qmm_context_set_threads(qmm_context *context, int threads);
/* The largest thread count qmm_context_set_threads accepts: 8 × the CPUs online (sysconf
 * _SC_NPROCESSORS_ONLN; room for oversubscription experiments and for a process moved onto more cores),
 * but at most QMM_MAX_THREADS. Never below 8. */
#define QMM_MAX_THREADS 1024
int qmm_max_threads(void);
/* The number of host threads the context's kernels use (≥ 1), or 0 for a NULL context. A CPU
 * backend built without OpenMP always reports 1. */
int qmm_context_threads(const qmm_context *context);

/* Creates immutable device-resident weights from a host qmm_qmatrix (copied; the caller's arrays may
 * be freed afterwards). The same weights serve both qmm_t and qmm_n (MLX's transpose flag). On CUDA
 * 2/3-bit codes are stored as 4-bit and 5/6-bit as 8-bit ones (the same values: docs/kernels.md §9,
 * "Stored widths"; QMM_CUDA_STORED_BITS=0 keeps them), and a matrix with f16/bf16 scales is also repacked
 * once for the tensor-core kernels (the layout of §9.1), so it takes its (stored) code bytes twice in
 * device memory; qmm_weights_describe still gives the caller's bits.
 * The weights hold the context. Errors: validation errors of qmm_qmatrix_validate,
 * QMM_ERR_INVALID_ARGUMENT (a NULL argument, a destroyed context), QMM_ERR_OUT_OF_MEMORY, QMM_ERR_BACKEND. */
qmm_status qmm_weights_create(qmm_context *context, const qmm_qmatrix *matrix, qmm_weights **weights);
/* Creates the weights of expert_count MoE experts for qmm_gather_matmul: stacked holds them contiguously,
 * rows = expert_count·N and cols = K (MLX gather_qmm's w [E, N, K·bits/32], scales/biases [E, N, K/group_size];
 * expert e is rows [e·N, (e+1)·N); see qmm_ref_gather_qmm). Copied like qmm_weights_create, whose call with
 * one matrix is the same as expert_count = 1. Weights of more than one expert serve only qmm_gather_matmul
 * (qmm_matmul refuses them: their rows are not one matrix). qmm_weights_describe reports the stacked format.
 * The weights hold the context and are counted like any weights (qmm_weights_destroy, chains).
 * Errors: those of qmm_weights_create; QMM_ERR_SHAPE when expert_count is 0 or does not divide
 * stacked->rows (the message gives both). */
qmm_status qmm_weights_create_experts(qmm_context *context, const qmm_qmatrix *stacked, size_t expert_count,
                                      qmm_weights **weights);
/* Experts of the weights: E for qmm_weights_create_experts, 1 for qmm_weights_create, 0 for NULL. */
size_t qmm_weights_expert_count(const qmm_weights *weights);
/* Drops the caller's hold: freed now, or when the last chain that uses them is destroyed. NULL ok. */
void qmm_weights_destroy(qmm_weights *weights);
/* The format of the weights (pointers in the result are NULL: data lives on the device).
 * Errors: QMM_ERR_INVALID_ARGUMENT for a NULL argument or destroyed weights. */
qmm_status qmm_weights_describe(const qmm_weights *weights, qmm_qmatrix *format);

/* A device buffer of count elements of dtype (F32/F16/BF16). Contents start undefined. The buffer holds
 * the context. Errors: QMM_ERR_INVALID_ARGUMENT (a NULL argument, a destroyed context, a non-float
 * dtype), QMM_ERR_SHAPE (count 0), QMM_ERR_OVERFLOW, QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_buffer_create(qmm_context *context, qmm_dtype dtype, size_t count, qmm_buffer **buffer);
/* Drops the caller's hold: freed now, or when the last chain that uses it is destroyed. NULL ok. */
void qmm_buffer_destroy(qmm_buffer *buffer);
/* Elements and dtype of a buffer (0 and QMM_F32 for NULL). */
size_t qmm_buffer_count(const qmm_buffer *buffer);
qmm_dtype qmm_buffer_dtype(const qmm_buffer *buffer);
/* Copies count elements from host memory (buffer's dtype) into the buffer starting at element 0.
 * Errors: QMM_ERR_INVALID_ARGUMENT (NULL or destroyed buffer, or NULL host with count > 0),
 * QMM_ERR_SHAPE when count exceeds the buffer, QMM_ERR_BACKEND. */
qmm_status qmm_buffer_write(qmm_buffer *buffer, const void *host, size_t count);
/* Copies count elements of the buffer to host memory, waiting for queued work. Same errors. */
qmm_status qmm_buffer_read(const qmm_buffer *buffer, void *host, size_t count);
/* Fills the buffer with NaN (used by tests to poison outputs). Errors: QMM_ERR_INVALID_ARGUMENT (NULL
 * or destroyed), QMM_ERR_OUT_OF_MEMORY, QMM_ERR_BACKEND. */
qmm_status qmm_buffer_poison(qmm_buffer *buffer);

/* The operations of the kernel table. */
typedef enum qmm_op {
    QMM_OP_QMM_T = 0, /* out = x·Ŵᵀ, weights rows = N, cols = K */
    QMM_OP_QMM_N = 1, /* out = x·Ŵ,  weights rows = K, cols = N */
    QMM_OP_GATHER = 2, /* out[i] = x[lhs_indices[i]]·Ŵ[rhs_indices[i]]ᵀ over E experts (qmm_gather_matmul only) */
} qmm_op;
/* "qmm_t", "qmm_n", "gather". */
const char *qmm_op_name(qmm_op op);

/* Options of one matmul. Zero-initialised means: op qmm_t, selector's choice, batch-invariant mode off. */
typedef struct qmm_matmul_options {
    qmm_op op;
    const char *kernel; /* NULL: the selector chooses; else a registered kernel name, forced */
    /* Nonzero: batch-invariant mode. The bits of output row i then depend only on row i of x and the
     * weights (and the context's backend and machine): not on M, not on the other rows of x, not on which
     * kernel ran, not on the thread count. Only rows that declare a batch-invariant order
     * (qmm_kernel_info.batch_invariant_order) take such a call, and only those whose order is the call's
     * order: that of the first row of the table (in table order, hints aside) that declares one and
     * accepts the call (docs/kernels.md "Batch-invariant mode"). The selector and a tuning table choose
     * among those only. On the CPU with AVX2 or AVX-512, qmm_t at M ≤ 16 then runs the ordered GEMV rows
     * instead of the GEMV rows (another order), which costs time there (about 2× at M ≤ 4); qmm_n and larger M
     * run the same rows as without the mode. On CUDA, f16/bf16 qmm_t (2/3/5/6-bit codes stored as 4/8-bit)
     * runs the tensor-core tile rows (on Hopper the wgmma tiles among them) at every M, without split-K:
     * about the default's time at M ≥ 512, 1.4× it at M = 128 (geomean), 2.4–4.9× at M ≤ 16 (H200).
     * Row i of a product with the mode on is not promised to equal the same row computed with it off.
     * The CPU backend's worker threads compute in the calling thread's floating-point environment (rounding mode,
     * x86 FTZ/DAZ), so the promise holds in any one environment; the error bounds assume the default one (round to
     * nearest, no flush-to-zero or denormals-are-zero). */
    int batch_invariant;
} qmm_matmul_options;

/* What one table row is: name `<backend>.<op>.<family>.<tile>[.<isa>]` (docs/kernels.md), its op,
 * family ("scalar", "gemv", "mma", ...), tile BM×BN×BK and threads per block (1 for CPU rows), the
 * error-bound slack the harness applies, a one-line description, and its batch-invariant order: the name
 * of the one order in which the row reduces every output, whatever M, the other rows of x and its tiling
 * ("oracle": the reference's f32 order, bit for bit; docs/kernels.md "Batch-invariant mode" lists them), or
 * NULL when its order depends on M or on the tiling (such a row refuses qmm_matmul_options.batch_invariant).
 * Two rows with the same order string and op give the same bits for the same call. */
typedef struct qmm_kernel_info {
    const char *name;
    qmm_backend backend;
    qmm_op op;
    const char *family;
    int bm, bn, bk, threads;
    double tolerance_slack;
    const char *description;
    const char *batch_invariant_order;
} qmm_kernel_info;

/* Enqueues out[M, N] = x[M, K]·Ŵᵀ (or x·Ŵ) on the context. x has M·K elements, out M·N elements, both
 * of the weights' scale dtype. Blocking on the reference backend; asynchronous on devices (read the
 * output with qmm_buffer_read). If info is not NULL it receives the kernel that ran.
 * With options->batch_invariant nonzero (batch-invariant mode), row i of out is bit for bit the same
 * whatever M and whatever the other rows of x: the selector (and a tuning table) picks only among rows
 * that declare the call's batch-invariant order (qmm_kernel_info.batch_invariant_order; the rule in
 * qmm_matmul_options and docs/kernels.md "Batch-invariant mode"), which may be slower than its choice
 * without the mode. A forced kernel must declare that order: one that declares none is refused
 * ("... kernel cpu.qmm_t.gemv.r8.avx512 does not declare a batch-invariant order ..."), and so is one
 * whose order is not the call's (naming both orders and the row that set the call's).
 * Errors: QMM_ERR_SHAPE (M = 0, a buffer too small, dtype mismatch — message gives the numbers),
 * QMM_ERR_OVERFLOW, QMM_ERR_NOT_FOUND (a forced kernel name not registered),
 * QMM_ERR_UNSUPPORTED (a forced kernel that does not support this call, with its reason; in
 * batch-invariant mode also a forced kernel without the call's order),
 * QMM_ERR_INVALID_ARGUMENT (a NULL argument, a destroyed handle, an op outside qmm_op, weights or
 * buffers of another context, x and out the same buffer; on CUDA, a knob of the calls outside its rule,
 * such as QMM_CUDA_SPLITS=0, docs/kernels.md §12, before anything is launched). */
qmm_status qmm_matmul(qmm_context *context, const qmm_weights *weights, const qmm_buffer *x, size_t M,
                      qmm_buffer *out, const qmm_matmul_options *options, qmm_kernel_info *info);

/* Options of one gather. Zero-initialised means: the selector's choice, sortedness detected, batch-invariant mode
 * off. */
typedef struct qmm_gather_options {
    const char *kernel; /* NULL: the selector chooses; else a registered gather row (op gather), forced */
    /* MLX's sorted_indices. The runtime always detects whether rhs_indices is non-decreasing (rows of one
     * expert contiguous: the fast path) while it checks the indices; nonzero here is a promise that it is,
     * and a broken promise is an error naming the first position out of order, never a wrong result. */
    int sorted_indices;
    /* Nonzero: batch-invariant mode, as qmm_matmul_options.batch_invariant. The bits of out[i] then depend only
     * on x[lhs_indices[i]] and expert rhs_indices[i]'s weights (and the context's backend and machine): not on
     * B, T, the other pairs, their order, sorted or not, which kernel ran or the thread count. On ref and cpu each
     * pair is reduced in the order of the backend's batch-invariant qmm_t rows (the gather rows run them per expert
     * block, or the oracle per pair), so out[i] is bit for bit what qmm_matmul with the option gives for that x row
     * alone and that expert's weights as plain weights (on ref and cpu; on cuda the bits of that pair gathered
     * alone; tests/runtime/test_batch_invariant.c).
     * Only gather rows that declare a batch-invariant order take such a call, of the call's order: on the CPU
     * cpu.gather.blocks_ordered.* (the ordered GEMV rows at blocks of M <= 16, the tiled rows above: on
     * Qwen3-30B-A3B's experts 1.1-1.7x the default's time with f32 x, 1.6-2.6x with bf16 x; docs/kernels.md §11),
     * or without AVX2 cpu.gather.blocks.portable and the ref rows (order "oracle"); on ref both rows; on CUDA
     * cuda.gather.blocks.auto (order "gather-fixed-per-format": f16/bf16 expert blocks in chunks of <= 16 rows in
     * grouped m16n32 launches of a fixed warp count; f32 and N not a multiple of 16 each block alone on the qmm_t
     * rows the mode picks for it; docs/kernels.md §11). */
    int batch_invariant;
} qmm_gather_options;

/* Enqueues the MoE gather product (MLX gather_qmm, transpose=True; the arithmetic of qmm_ref_gather_qmm):
 *     out[i, :] = x[lhs_indices[i], :] · Ŵ[rhs_indices[i]]ᵀ          i = 0 … B−1
 * weights: E experts of N×K (qmm_weights_create_experts; plain weights are E = 1). x: a buffer of at least
 * T·K elements, the rows tokens are taken from; out: at least B·N elements; both of the weights' scale dtype.
 * lhs_indices (NULL: row i of x, then B ≤ T) and rhs_indices are uint32 host arrays of B entries (they must hold
 * that many: out's size is checked against B before any index is read), read during the call only; every index is
 * checked before any work, so a bad one leaves out untouched. When
 * rhs_indices is non-decreasing the kernels run one product per expert block (each used expert's weights
 * read once for all its rows); otherwise the result is the same, computed in more, smaller blocks.
 * Like qmm_matmul, blocking on host backends and asynchronous on devices (read out with qmm_buffer_read); info
 * (if not NULL) receives the kernel that ran.
 * Lifetimes: the handles must be live (not destroyed by the caller, even while a chain still holds them);
 * the call holds nothing once it returns (a gather is not a chain step).
 * Errors: QMM_ERR_INVALID_ARGUMENT (a NULL context, weights, x, out or rhs_indices; a destroyed handle;
 * objects of another context; x and out the same buffer; an index array not 4-byte aligned; an index out of
 * range, naming the array,
 * position, value and bound; sorted_indices promised but rhs_indices[i] < rhs_indices[i−1]),
 * QMM_ERR_SHAPE (T = 0, B = 0, B > T with lhs_indices NULL, a buffer too small or of another dtype),
 * QMM_ERR_OVERFLOW, QMM_ERR_NOT_FOUND / QMM_ERR_UNSUPPORTED (a forced kernel, as qmm_matmul; in batch-invariant
 * mode also one without the call's order, and any call where no gather row declares an order — none today), and
 * QMM_ERR_UNSUPPORTED when the backend has no gather row ("no kernel of backend B computes gather yet"; every
 * backend has one today: ref, cpu, and cuda.gather.blocks.auto on CUDA); on CUDA, QMM_ERR_INVALID_ARGUMENT for
 * a knob of the calls outside its rule (docs/kernels.md §12), before anything is launched.
 * Source: mlx.core.gather_qmm (mlx/backend/cpu/quantized.cpp, mlx/ops.cpp). */
qmm_status qmm_gather_matmul(qmm_context *context, const qmm_weights *weights, const qmm_buffer *x, size_t T,
                             const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B, qmm_buffer *out,
                             const qmm_gather_options *options, qmm_kernel_info *info);

/* The selector's choice for a call of this shape, without running it (options->batch_invariant and a
 * forced kernel are honoured as qmm_matmul honours them). Same errors as qmm_matmul. */
qmm_status qmm_select(qmm_context *context, const qmm_weights *weights, size_t M,
                      const qmm_matmul_options *options, qmm_kernel_info *info);

/* The gather row qmm_gather_matmul would run for these arguments, without running it and without buffers: T rows
 * of x (of K elements, the weights' dtype), B index pairs as uint32 host arrays of B entries (checked and read as
 * there: a backend's row may accept a call for its expert blocks, which the indices make; with no buffer to bound
 * B here, the caller must pass arrays of B entries), options->kernel, sorted_indices
 * and batch_invariant honoured as there. info receives the row's description. The choice is the selector's
 * (src/select.c; docs/kernels.md §4, the gather rows §10). Errors: those of qmm_gather_matmul but the buffers' (x
 * and out are not asked for), and QMM_ERR_INVALID_ARGUMENT for info NULL (checked first). */
qmm_status qmm_select_gather(qmm_context *context, const qmm_weights *weights, size_t T, const uint32_t *lhs_indices,
                             const uint32_t *rhs_indices, size_t B, const qmm_gather_options *options,
                             qmm_kernel_info *info);

/* The kernel table of the context's backend, in selector order (the reference rows last). */
size_t qmm_kernel_count(const qmm_context *context);
/* Errors: QMM_ERR_INVALID_ARGUMENT when index ≥ qmm_kernel_count, or for a NULL or destroyed context. */
qmm_status qmm_kernel_get(const qmm_context *context, size_t index, qmm_kernel_info *info);
/* Whether row `index` of the context's table can run on this machine at all, whatever the call: 1, or 0 with
 * a one-line reason in why_not (if not NULL; "this CPU lacks AVX-512BW", "the OS does not enable the ZMM
 * register state (XCR0)"), valid until the next qmm call on this thread. A row that is not usable refuses
 * every call with the same reason. Returns -1 with qmm_last_error set for a NULL or destroyed context or
 * an index ≥ qmm_kernel_count. Thread-safe. */
int qmm_kernel_usable(const qmm_context *context, size_t index, const char **why_not);
/* Whether the named kernel supports a call of this shape; when not, why_not (if not NULL) receives a
 * one-line reason ("N=100 is not a multiple of BN=64"), valid until the next qmm call on this thread.
 * Returns 1/0, or -1 with qmm_last_error set when the name is unknown or an argument is invalid (NULL,
 * a destroyed handle, weights of another context, an op outside qmm_op, op = QMM_OP_GATHER — a gather call is
 * made of index arrays: ask qmm_select_gather — or the weights of several experts, which serve gathers only).
 * M = 0 or an M·K/M·N that overflows gives 0 with the reason. */
int qmm_kernel_supports(const qmm_context *context, const char *name, const qmm_weights *weights, size_t M,
                        qmm_op op, const char **why_not);

/* ───────────────────────────── Measured tuning tables ───────────────────────────── */

/* The name of the device the context runs on, as a tuning table records it: the GPU's name on CUDA
 * ("NVIDIA H200"), the host CPU's first "model name" of /proc/cpuinfo on ref and cpu ("unknown CPU"
 * where there is none). Owned by the context, valid while it lives; "" for NULL. */
const char *qmm_context_device(const qmm_context *context);

/* Loads a tuning table — what `qmm tune` measured on one device, a JSON file (format in
 * docs/kernels.md §4) — into the context; the selector (qmm_matmul, qmm_select, qmm_chain_add_matmul)
 * reads it from now on. For a call that matches an entry exactly (op, dtype, bits, group_size, N, K, and
 * m_min ≤ M ≤ m_max) the entry's kernel runs if it accepts the call; otherwise (no entry, or a stale
 * entry whose kernel refuses the call) the table order decides, so a tuning table never makes a valid
 * call fail. A forced kernel (qmm_matmul_options.kernel) still wins over the table. Chain steps keep
 * the kernel chosen when they were added.
 * A file measured on another backend is refused. Entries whose "device" (the file's, or the entry's
 * own) differs from qmm_context_device, and entries naming a kernel this build does not register, are
 * set aside, not errors: qmm_context_tuning_count reports how many. A successful load replaces the
 * context's previous table; a refused file leaves it as it was. The context owns the table (freed with
 * the context). Not thread-safe (like the context).
 * Errors: QMM_ERR_INVALID_ARGUMENT (NULL, a destroyed context); QMM_ERR_IO (cannot open or read path,
 * not a regular file); QMM_ERR_CORRUPT (not JSON, a missing or mistyped field, format not
 * "qmm-tuning", an unknown op or dtype, bits or group_size outside the sets, N/K/m_min/m_max not whole
 * numbers ≥ 1, K (qmm_t) or N (qmm_n) not a multiple of group_size, m_min > m_max, a kernel that computes
 * another op, two entries of one key whose M ranges overlap — the message names the file, the entry
 * as entries[i] and the rule); QMM_ERR_UNSUPPORTED (a table of another backend, a version other than 1,
 * or a libqmm built without cJSON); QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_context_load_tuning(qmm_context *context, const char *path);
/* Drops the context's tuning table: the table order decides again. Errors: QMM_ERR_INVALID_ARGUMENT
 * (NULL, a destroyed context). */
qmm_status qmm_context_clear_tuning(qmm_context *context);
/* Entries of the loaded tuning table the selector reads (0: none loaded); *other_device and
 * *unknown_kernel (either may be NULL) receive how many entries of the file were set aside as measured
 * on another device or naming an unregistered kernel. 0 for NULL. */
size_t qmm_context_tuning_count(const qmm_context *context, size_t *other_device, size_t *unknown_kernel);

/* ───────────────────────────── Chains ───────────────────────────── */

/* A chain records matmuls and runs them as one submission (on CUDA: a captured graph), timing each
 * step on the device. The chain holds its context, and each step holds its weights, x and out (see
 * "Lifetimes"): the caller may destroy them before the chain, which keeps running on them.
 * Errors: QMM_ERR_INVALID_ARGUMENT (a NULL argument, a destroyed context), QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_chain_create(qmm_context *context, qmm_chain **chain);
/* Frees the chain and drops its holds on the context, weights and buffers. NULL ok. */
void qmm_chain_destroy(qmm_chain *chain);
/* Records one matmul; arguments are validated now, with qmm_matmul's errors (weights or buffers the
 * caller destroyed are refused; the chain's own context is used, destroyed handle or not). The kernel
 * is chosen now from options as qmm_matmul chooses it (a forced name, batch_invariant). A CUDA knob of
 * the calls (docs/kernels.md §12) is read, and refused, when the chain is first run (captured), not here;
 * replays do not read it again. */
qmm_status qmm_chain_add_matmul(qmm_chain *chain, const qmm_weights *weights, const qmm_buffer *x, size_t M,
                                qmm_buffer *out, const qmm_matmul_options *options);
size_t qmm_chain_length(const qmm_chain *chain);
/* Runs every step in order and waits for completion. */
qmm_status qmm_chain_run(qmm_chain *chain);
/* Time of the whole last run in microseconds: on CUDA the device time from before the first step to
 * after the last, launch gaps inside the graph included (what `qmm bench` divides by the steps); on
 * host backends the sum of the steps. Errors: QMM_ERR_INVALID_ARGUMENT (NULL, or not run since the last
 * step was added or the step timing changed). */
qmm_status qmm_chain_elapsed(const qmm_chain *chain, double *microseconds);
/* Per-step timing (on by default). On CUDA each step is bracketed by an event recorded inside the graph,
 * which costs device time between steps; with enabled = 0 the graph holds only the kernels and is timed
 * from outside as a whole (what `qmm bench` uses), and qmm_chain_step reports NaN microseconds. Host
 * backends then synchronize once per run instead of once per step. Changing it drops the captured graph.
 * Errors: QMM_ERR_INVALID_ARGUMENT (NULL). */
qmm_status qmm_chain_set_step_timing(qmm_chain *chain, int enabled);
/* Device time of step `step` in the last run, in microseconds; info (optional) gets its kernel.
 * Errors: QMM_ERR_INVALID_ARGUMENT when step ≥ length or the chain has not run since its last step
 * was added. Host backends time each step with CLOCK_MONOTONIC around the kernel and a synchronize. */
qmm_status qmm_chain_step(const qmm_chain *chain, size_t step, double *microseconds, qmm_kernel_info *info);

/* ───────────────────────────── Checkpoints ───────────────────────────── */

#define QMM_MAX_DIMS 8

/* A tensor of a checkpoint: name, dtype, shape (row-major), and its bytes. Views returned by the
 * library point into a mapping owned by the opened file and stay valid until it is closed. */
typedef struct qmm_tensor {
    const char *name;
    qmm_dtype dtype;
    int ndim;
    int64_t shape[QMM_MAX_DIMS];
    const void *data;
    size_t nbytes;
} qmm_tensor;

/* ── safetensors (https://github.com/huggingface/safetensors, format: u64 LE header length N, N bytes
 * of JSON {name: {dtype, shape, data_offsets:[begin,end]}, "__metadata__": {str: str}}, data). */
typedef struct qmm_safetensors qmm_safetensors;

/* Maps the file read-only and validates the header: length ≤ file size − 8 (and ≤ 100 MB), JSON
 * object, known dtypes, at most QMM_MAX_DIMS dims, each an integer in [0, 2^53], offsets inside the
 * data area, end − begin equal to dtype size × product of shape (no overflow of size_t), no
 * overlapping tensors, and, as the reference implementation requires, offsets that tile the data area
 * exactly (in offset order each tensor begins where the previous one ends, the first at 0, the last
 * ends at the end of the file: a gap or trailing bytes are refused naming the tensors around them),
 * names valid UTF-8 and unique. Errors: QMM_ERR_IO (also: not a regular file), QMM_ERR_CORRUPT (the
 * message names the tensor and the rule), QMM_ERR_UNSUPPORTED (an unknown dtype string, more than
 * QMM_MAX_DIMS dims), QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_safetensors_open(const char *path, qmm_safetensors **file);
/* Parses an in-memory image (bytes, size); the caller keeps the bytes alive while it is open.
 * Same validation and errors as qmm_safetensors_open. Used by the fuzzers. */
qmm_status qmm_safetensors_open_memory(const void *bytes, size_t size, qmm_safetensors **file);
void qmm_safetensors_close(qmm_safetensors *file);
size_t qmm_safetensors_count(const qmm_safetensors *file);
/* Tensors in file order of data offset. Errors: QMM_ERR_INVALID_ARGUMENT (index out of range). */
qmm_status qmm_safetensors_get(const qmm_safetensors *file, size_t index, qmm_tensor *tensor);
/* Errors: QMM_ERR_NOT_FOUND naming the tensor. */
qmm_status qmm_safetensors_find(const qmm_safetensors *file, const char *name, qmm_tensor *tensor);
/* The value of __metadata__[key], or NULL. */
const char *qmm_safetensors_metadata(const qmm_safetensors *file, const char *key);

/* Writes count tensors (data copied from each tensor's data/nbytes) and optional metadata pairs
 * (metadata_keys[i] → metadata_values[i]) to path via a temporary file in the same directory and an
 * atomic rename: on any error nothing is left at path or beside it. The file is created with mode
 * 0666 narrowed by the process umask. An existing regular file at path is replaced, and so is a symbolic link
 * (the link itself: its target is not written); a directory, a device, a FIFO or a socket at path is refused
 * (QMM_ERR_IO, naming it and what it is) before anything is written. Names must be unique, non-empty valid UTF-8;
 * nbytes must equal dtype size × shape product. Errors: QMM_ERR_INVALID_ARGUMENT, QMM_ERR_SHAPE, QMM_ERR_IO. */
qmm_status qmm_safetensors_write(const char *path, const qmm_tensor *tensors, size_t count,
                                 const char *const *metadata_keys, const char *const *metadata_values,
                                 size_t metadata_count);

/* ── MLX checkpoint directories (mlx-lm / mlx-community): config.json + model.safetensors or
 * model-0000i-of-0000n.safetensors shards (with or without model.safetensors.index.json).
 * A layer P is quantized iff tensor "P.scales" exists; then "P.weight" is U32 and "P.biases" exists.
 * config.json "quantization" (or "quantization_config"): {"group_size": G, "bits": B, and optional
 * per-layer entries "P": {"group_size", "bits"} or "P": false}. When both keys are present they must
 * agree (same default, same per-layer entries; mlx-lm writes one as a copy of the other): a config
 * where they differ is refused with QMM_ERR_CORRUPT naming the difference, never read by one of them. */
typedef struct qmm_checkpoint qmm_checkpoint;

/* One quantized layer: its path P and its matrix (arrays point into the mapped shards).
 * experts: 1 for a 2-D weight [N, K·bits/32]; for a weight with leading dimensions, e.g. an MoE layer
 * [E, N, K·bits/32] (mlx-lm's switch_mlp), the product of the dimensions before the last two. matrix then
 * stacks them (rows = experts·N), as qmm_weights_create_experts and qmm_ref_gather_qmm take it.
 * qmm_checkpoint_write reads 0 as 1 (zero-initialise a qmm_layer you fill) and writes a layer of
 * experts > 1 as [experts, rows/experts, ...] (rows must be a multiple of experts: QMM_ERR_SHAPE).
 * experts_dim: nonzero when the weight has that leading experts dimension even with experts = 1 (an MoE layer of
 * one expert, [1, N, K·bits/32]): set by qmm_checkpoint_open for a weight of 3 or more dims and by
 * qmm_checkpoint_quantize for a 3-D float weight; qmm_checkpoint_write then writes the layer 3-D too. */
typedef struct qmm_layer {
    const char *name;
    qmm_qmatrix matrix;
    size_t experts;
    int experts_dim;
} qmm_layer;

/* Opens DIR, reads config.json and every shard, and checks each quantized layer: weight U32 with 2 or
 * more dims (the leading dims are folded: rows = their product, e.g. an MoE [E, N, words] weight is
 * E·N rows, and qmm_layer.experts = E), scales/biases one float dtype and one shape [leading dims...,
 * cols/group_size], weight words per row = cols·bits/32, with the layer's bits/group_size from the config (its per-layer entry
 * if present, else the default; a layer with P.scales and no format in the config is refused: its
 * format is never guessed from the shapes). Arrays at addresses misaligned for their dtype (MLX writes
 * unpadded headers) are copied to aligned memory owned by the checkpoint. Errors: QMM_ERR_IO,
 * QMM_ERR_CORRUPT (naming the layer and the disagreement; a layer whose per-layer config entry is a truthy
 * value other than true or an object, which MLX refuses too — a falsy one, like false, leaves it unquantized),
 * QMM_ERR_FORMAT, QMM_ERR_NOT_FOUND (no config.json or no shard; without model.safetensors.index.json, a
 * numbered shard set "model-<i>-of-<n>.safetensors" with one of 1 … n missing), QMM_ERR_UNSUPPORTED (a
 * quantization mode other than "affine", an unknown tensor dtype), QMM_ERR_OVERFLOW, QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_checkpoint_open(const char *dir, qmm_checkpoint **checkpoint);
void qmm_checkpoint_close(qmm_checkpoint *checkpoint);
/* All tensors of all shards. The getters fail with QMM_ERR_INVALID_ARGUMENT (NULL, index out of range)
 * and the finders with QMM_ERR_NOT_FOUND naming the missing name. */
size_t qmm_checkpoint_tensor_count(const qmm_checkpoint *checkpoint);
qmm_status qmm_checkpoint_tensor(const qmm_checkpoint *checkpoint, size_t index, qmm_tensor *tensor);
qmm_status qmm_checkpoint_find_tensor(const qmm_checkpoint *checkpoint, const char *name, qmm_tensor *tensor);
/* Quantized layers in name order. */
size_t qmm_checkpoint_layer_count(const qmm_checkpoint *checkpoint);
qmm_status qmm_checkpoint_layer(const qmm_checkpoint *checkpoint, size_t index, qmm_layer *layer);
qmm_status qmm_checkpoint_find_layer(const qmm_checkpoint *checkpoint, const char *name, qmm_layer *layer);
/* The default bits/group_size of config.json's "quantization" (0/0 when absent or false). */
qmm_status qmm_checkpoint_default_format(const qmm_checkpoint *checkpoint, int *bits, int *group_size);

/* Parses config.json text (size bytes, not necessarily NUL-terminated) and returns its default
 * quantization format; used by the fuzzers and by qmm_checkpoint_open. Errors: QMM_ERR_CORRUPT (not
 * JSON, not an object, a field of the wrong kind, "quantization_config" disagreeing with "quantization", either key given twice at the top level), QMM_ERR_FORMAT (bits or group_size outside the sets),
 * QMM_ERR_UNSUPPORTED (a mode other than "affine", a Hugging Face quant_method), QMM_ERR_OVERFLOW,
 * QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_config_parse(const char *json, size_t size, int *bits, int *group_size);

/* Writes an MLX checkpoint directory: dir/model.safetensors with every tensor and dir/config.json
 * with "quantization" and "quantization_config" = {"group_size": G, "bits": B} plus one override per
 * layer whose format differs (G/B = the most common format among layers; neither key when no layer
 * is quantized: a float checkpoint). extra_config_json, if not NULL, is a JSON object whose members
 * are copied into config.json first (its "quantization" keys are replaced).
 * Each layer is written from its arrays as P.weight U32 [rows, cols·bits/32], P.scales and P.biases
 * [rows, cols/group_size] — or, when its matrix.w, scales and biases are all NULL, it only describes a
 * layer whose three tensors P.weight/P.scales/P.biases are among tensors (any leading dims, written as
 * they are): then only matrix.bits and group_size are read, and the tensors must pass
 * qmm_checkpoint_open's checks at that format. This is how a layer that is already quantized keeps
 * its own format and shape.
 * Refused before anything is created or replaced (QMM_ERR_INVALID_ARGUMENT, naming the tensor or
 * layer): a layer without a name, two layers of one name, a layer named like a quantization key
 * (bits, group_size, mode, quant_method), two tensors of one name (given or made from a layer's
 * arrays), a tensor "X.scales" or "X.biases" that no described layer owns, a described layer whose
 * tensors are missing or disagree with its format; also an invalid format or matrix (qmm_qmatrix_validate).
 * Creates dir (mode 0777 under the umask) if missing; files are created 0666 under the umask and
 * written via temp + rename, so a failure leaves no partial file and a directory it created is
 * removed; an existing model.safetensors is put back if config.json cannot be renamed. A model.safetensors or
 * config.json that exists as a directory, device, FIFO or socket is refused before either file is written (a
 * symbolic link is replaced, as qmm_safetensors_write says). Errors:
 * QMM_ERR_IO, QMM_ERR_INVALID_ARGUMENT, QMM_ERR_FORMAT/SHAPE (validation), QMM_ERR_OVERFLOW,
 * QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_checkpoint_write(const char *dir, const qmm_tensor *tensors, size_t tensor_count,
                                const qmm_layer *layers, size_t layer_count, const char *extra_config_json);

/* What qmm_checkpoint_quantize did with one weight, for a progress report (the library never prints). */
typedef enum qmm_quantize_event {
    QMM_QUANTIZE_QUANTIZED = 0, /* a float weight became layer `name` at the requested format */
    QMM_QUANTIZE_KEPT = 1,      /* layer `name` was already quantized: kept as it is, in its own format */
    QMM_QUANTIZE_LEFT = 2,      /* float weight `name` left unquantized; the message says why (K, group_size) */
} qmm_quantize_event;
/* message: one line without a newline, e.g. "proj [8, 128] f32 -> 4-bit gs32" or "odd.weight [2, 48] f32
 * left unquantized: K=48 is not a multiple of group_size=32". Both strings live only during the call. */
typedef void (*qmm_quantize_note)(void *user, qmm_quantize_event event, const char *name, const char *message);
typedef struct qmm_quantize_summary {
    size_t quantized; /* layers quantized by this call */
    size_t kept;      /* layers already quantized in the input, kept in their own format */
    size_t left;      /* float weights (≥ 2 dims, named *.weight) left unquantized */
    size_t copied;    /* tensors written as they are (including the kept layers' three each) */
} qmm_quantize_summary;

/* Quantizes the float weights of one safetensors file into an MLX checkpoint directory (what
 * `qmm quantize` does). Every f32/f16/bf16 tensor "X.weight" of 2 dims [N, K] with K a multiple of
 * group_size becomes layer X at (bits, group_size) with qmm_quantize and `convention`; one of 3 dims
 * [E, N, K] (an MoE layer's E experts, mlx-lm's switch_mlp) becomes a layer of E experts (qmm_layer.experts,
 * written [E, N, ...], quantized along K as MLX's mx.quantize of the whole array); float *.weight
 * tensors of other ranks, whose K is not a multiple of group_size, or whose layer has the entry false
 * in the input's config.json, are left as they are and reported (QMM_QUANTIZE_LEFT); every other tensor
 * is copied. config.json in the input's directory, when present, is read as qmm_checkpoint_open reads
 * it (its errors are this call's). Layers that are already quantized in the input (P.scales present)
 * keep their own format, from that config, written as a per-layer entry; an input with such a layer and no
 * config.json is refused (QMM_ERR_NOT_FOUND naming the layer): a format is never guessed from shapes.
 * Every other member of that config.json (model_type, hyperparameters, ...) is carried into the new one
 * (qmm_checkpoint_write's extra_config_json); "quantization" and "quantization_config" are rewritten.
 * When no weight can be quantized the call fails and writes nothing: QMM_ERR_SHAPE naming the first
 * weight's K and group_size, or QMM_ERR_NOT_FOUND when there is no float *.weight of 2 or more dims.
 * The output is written by qmm_checkpoint_write (its refusals, atomicity and modes apply). note may be
 * NULL; it is called on the calling thread before anything is written; summary may be NULL.
 * Errors: QMM_ERR_INVALID_ARGUMENT, QMM_ERR_FORMAT (bits, group_size), QMM_ERR_SHAPE, QMM_ERR_NOT_FOUND,
 * those of qmm_safetensors_open, qmm_checkpoint_open and qmm_checkpoint_write, QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_checkpoint_quantize(const char *in_path, const char *out_dir, int bits, int group_size,
                                   qmm_convention convention, qmm_quantize_note note, void *user,
                                   qmm_quantize_summary *summary);

/* ── GGUF v2/v3 import (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md). */
typedef struct qmm_gguf qmm_gguf;

/* GGUF tensor types qmm knows by name (the ggml_type numbering). */
typedef enum qmm_gguf_type {
    QMM_GGUF_F32 = 0,
    QMM_GGUF_F16 = 1,
    QMM_GGUF_Q4_0 = 2,
    QMM_GGUF_Q4_1 = 3,
    QMM_GGUF_Q5_0 = 6,
    QMM_GGUF_Q5_1 = 7,
    QMM_GGUF_Q8_0 = 8,
    QMM_GGUF_Q4_K = 12,
    QMM_GGUF_Q5_K = 13,
    QMM_GGUF_BF16 = 30,
} qmm_gguf_type;

typedef struct qmm_gguf_tensor_info {
    const char *name;
    uint32_t type;         /* ggml_type value (may be one qmm cannot import) */
    const char *type_name; /* "Q4_1", "Q6_K", ... or "type 99" */
    int ndim;
    int64_t shape[QMM_MAX_DIMS]; /* row-major (GGUF's ne[] reversed: shape[ndim-1] = ne[0]) */
    size_t nbytes;
    /* 1 for F32, F16, BF16, and for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K with rows of whole blocks (32 weights,
     * 256 for K-quants); qmm_gguf_import may still refuse a block's non-finite d, m or dmin. */
    int importable;
    /* "" when importable; else why not, e.g. for Q6_K "its sub-blocks of 16 weights have scales of their own, and
     * an MLX group holds 32, 64 or 128" (static text, valid for the process's life). */
    const char *why_not;
} qmm_gguf_tensor_info;

/* Maps and validates a GGUF v2/v3 file: magic, version, counts bounded by file size, strings and
 * arrays inside the file, tensor data inside the file and aligned to general.alignment (default 32).
 * Errors: QMM_ERR_IO, QMM_ERR_CORRUPT, QMM_ERR_UNSUPPORTED (version 1 or > 3), QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_gguf_open(const char *path, qmm_gguf **file);
/* The same on an in-memory image the caller keeps alive (for the fuzzers). */
qmm_status qmm_gguf_open_memory(const void *bytes, size_t size, qmm_gguf **file);
void qmm_gguf_close(qmm_gguf *file);
size_t qmm_gguf_tensor_count(const qmm_gguf *file);
/* Tensor `index` in file order. Errors: QMM_ERR_INVALID_ARGUMENT (NULL, index out of range). */
qmm_status qmm_gguf_tensor_info_get(const qmm_gguf *file, size_t index, qmm_gguf_tensor_info *info);
/* The file-order index of the tensor named name. Errors: QMM_ERR_NOT_FOUND naming it. */
qmm_status qmm_gguf_find(const qmm_gguf *file, const char *name, size_t *index);
/* A string metadata value (e.g. "general.architecture"), or NULL. */
const char *qmm_gguf_metadata_string(const qmm_gguf *file, const char *key);

/* Imports tensor `index` exactly: for every weight, ggml's dequantize_row_* value is round_f32(s·q + b) of
 * the imported code q, scale s and bias b (one rounding of the exact real number, none for Q4_0/Q5_0/Q8_0):
 *   F32/F16/BF16 → *float_tensor of the same dtype and row-major shape (*is_quantized = 0);
 *   Q4_0 → 4-bit gs32, scale d, bias −8d;    Q4_1 → 4-bit gs32, scale d, bias m;
 *   Q5_0 → 5-bit gs32, scale d, bias −16d;   Q5_1 → 5-bit gs32, scale d, bias m;
 *   Q8_0 → 8-bit gs32, scale d, bias −128d, q = int8 XOR 0x80   (scales and biases F16, as MLX's loader,
 *          mlx/io/gguf_quants.cpp, gives them for Q4_0/Q4_1/Q8_0);
 *   Q4_K → 4-bit gs32, Q5_K → 5-bit gs32, each 256-weight super-block's 8 sub-blocks as 8 groups with
 *          scale d·sc and bias −dmin·m in F32 (exact there, not in f16: d·sc has up to 17 significant bits;
 *          MLX 0.32.4's loader refuses Q5_K and dequantizes Q4_K to f16), so x and out of a product are F32;
 *   (→ *matrix, *is_quantized = 1; rows = product of the leading dims, cols = the last).
 * The arrays, and float_tensor->name, are heap copies owned by the caller (valid after qmm_gguf_close):
 * release them with qmm_gguf_import_free.
 * GGUF blocks store elements j and j+16 (K-quants: sub-blocks 2i and 2i+1) in one byte; MLX order is
 * sequential and is restored.
 * Errors: QMM_ERR_UNSUPPORTED naming the type (Q2_K, Q3_K and Q6_K, whose 16-weight sub-blocks have their own
 * scales, IQ types, ...), QMM_ERR_SHAPE (a quantized tensor whose row length is not a multiple of its block:
 * 32, or 256 for K-quants), QMM_ERR_NUMERIC (a block whose d, m or dmin is NaN or ±inf, named by row and block;
 * or −8d, −16d or −128d not finite in f16), QMM_ERR_OUT_OF_MEMORY. */
qmm_status qmm_gguf_import(const qmm_gguf *file, size_t index, int *is_quantized, qmm_qmatrix *matrix,
                           qmm_tensor *float_tensor);
/* Frees what qmm_gguf_import allocated: the matrix's w/scales/biases, the float tensor's data and name
 * (either output may be NULL; fields are set to NULL, so a second call is harmless). */
void qmm_gguf_import_free(qmm_qmatrix *matrix, qmm_tensor *float_tensor);

/* Converts a whole GGUF file (or the tensors whose names start with one of the `count` prefixes, when
 * count > 0) into an MLX checkpoint directory: quantized tensors "X.weight" become layer X
 * (X.weight U32, X.scales, X.biases; a tensor with leading dims, e.g. an MoE layer's experts [E, N, K],
 * becomes a layer of E experts, qmm_layer.experts, weight [E, N, K·bits/32] as MLX's loader shapes it),
 * float tensors are kept as they are; config.json records the formats and the GGUF general.architecture. Every refusal comes before anything is written and
 * leaves out_dir as it was: those of qmm_gguf_import (an unsupported type stops the conversion,
 * naming the tensor) and of qmm_checkpoint_write (e.g. a float tensor named "x.scales", which no
 * layer owns, or a quantized tensor "bits.weight", whose layer name is a config.json key); a null prefix is
 * QMM_ERR_INVALID_ARGUMENT. */
qmm_status qmm_gguf_convert(const char *gguf_path, const char *out_dir, const char *const *prefixes, size_t count);

/* Options of qmm_gguf_convert_with. Zero-initialised: every tensor, and one qmm cannot import is refused. */
typedef struct qmm_gguf_convert_options {
    const char *const *prefixes; /* with prefix_count > 0: only the tensors whose names start with one of these */
    size_t prefix_count;
    /* Nonzero: selected tensors qmm cannot import (qmm_gguf_tensor_info.importable = 0: a type such as Q6_K or the
     * IQ types, or rows that are not whole blocks) are left out of the checkpoint instead of stopping the
     * conversion; a Q4_K_M file (Q4_K tensors with a few Q6_K ones) then converts in one call. Anything else that
     * fails still stops it before anything is written. */
    int skip_unsupported;
} qmm_gguf_convert_options;

/* qmm_gguf_convert with options (NULL: as qmm_gguf_convert(gguf_path, out_dir, NULL, 0)). Same errors; with
 * skip_unsupported, QMM_ERR_NOT_FOUND also when no selected tensor is importable. */
qmm_status qmm_gguf_convert_with(const char *gguf_path, const char *out_dir, const qmm_gguf_convert_options *options);

#ifdef __cplusplus
}
#endif

#endif /* QMM_H */
