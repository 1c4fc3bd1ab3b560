/*
 * internal.h — helpers shared by every part of libqmm (not installed).
 *
 * Errors: every failing path calls qmm_error(status, "fmt", ...), which formats the thread-local
 * message read by qmm_last_error() and returns status, so a check reads
 *     if (K % group_size != 0) return qmm_error(QMM_ERR_SHAPE, "K=%zu is not a multiple of group_size=%d", K, gs);
 * Functions with resources use one `goto cleanup` (DESIGN.md §4).
 */
#ifndef QMM_INTERNAL_H
#define QMM_INTERNAL_H

#include "qmm.h"

#include <signal.h> /* sigset_t (qmm_atomic_block_signals) */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define QMM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define QMM_PRINTF(a, b)
#endif

/* Sets the thread-local message and returns status. */
qmm_status qmm_error(qmm_status status, const char *format, ...) QMM_PRINTF(2, 3);
/* Clears the thread-local message (called by nothing on success paths; tests use it). */
void qmm_error_clear(void);

/* ───────────────────────── untrusted text in messages (status.c) ───────────────────────── */

/* The length (1-4) of the well-formed UTF-8 character at bytes[0, size) and its code point in *code_point (when not
 * NULL), or 0 when no character starts there: a stray continuation byte, an overlong form, a surrogate, a code point
 * past U+10FFFF, or a sequence cut short by size. */
size_t qmm_utf8_char(const char *bytes, size_t size, uint32_t *code_point);
/* The length to keep of text[0, length) so that it does not end inside a UTF-8 character (a cut made by counting bytes:
 * snprintf's, a field's limit): length, or the start of a last character that bytes past length would complete. */
size_t qmm_utf8_cut(const char *text, size_t length);
/* qmm_utf8_char's length when that character is printable, else 0: also for the control characters (C0, DEL, C1),
 * the line and paragraph separators U+2028-9, and the characters a terminal shows as nothing (Unicode's
 * Default_Ignorable_Code_Point: a byte order mark, zero-width spaces and joiners, soft hyphens, variation selectors,
 * and the bidirectional marks, embeddings, overrides and isolates U+061C, U+200E-F, U+202A-E, U+2066-9, which also
 * make a terminal show the text around them otherwise). */
size_t qmm_printable_char(const char *bytes, size_t size);
/* A printable copy of untrusted bytes (a name from a file, a line a script printed) for a message or a terminal:
 * printable UTF-8 characters kept, a backslash doubled, every other byte as \xNN; a copy that does not fit in
 * buffer_size ends in "..." after a whole character. Returns buffer. */
const char *qmm_printable(const char *bytes, size_t size, char *buffer, size_t buffer_size);
#define QMM_PRINTABLE_SIZE 96

/* Overflow-checked size arithmetic: return false on overflow (result unspecified then). */
static inline bool qmm_mul_size(size_t a, size_t b, size_t *result) {
    return !__builtin_mul_overflow(a, b, result);
}
static inline bool qmm_add_size(size_t a, size_t b, size_t *result) {
    return !__builtin_add_overflow(a, b, result);
}

/* Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte. */
static inline bool qmm_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + b_bytes && y < x + a_bytes;
}
/* For a function that writes its output while it reads its input: where the input [in, + in_bytes) overlaps the
 * output [out, + out_bytes), *copy is a heap copy of it for the caller to read instead (and to free), else NULL.
 * QMM_ERR_OUT_OF_MEMORY (naming function and what) when the copy cannot be had. */
qmm_status qmm_copy_if_overlapping(const char *function, const char *what, const void *in, size_t in_bytes,
                                   const void *out, size_t out_bytes, void **copy);

/* QMM_ERR_INVALID_ARGUMENT "<function>: <name> at <p> is not 4-byte aligned" for a uint32 array the library would
 * read or write at a misaligned address (undefined behaviour in C); QMM_OK otherwise (NULL included: checked apart). */
qmm_status qmm_check_u32_aligned(const char *function, const char *name, const void *p);

/* Whether dtype is one of the activation/scale dtypes F32, F16, BF16. */
static inline bool qmm_is_float_dtype(qmm_dtype dtype) {
    return dtype == QMM_F32 || dtype == QMM_F16 || dtype == QMM_BF16;
}

/* Element i of a float array of dtype (F32/F16/BF16) as f32, and the inverse (RNE). The array may be
 * at any address: float arrays reach the library as views into safetensors files, which put tensors
 * at any byte offset (mlx.core.save_safetensors does not pad its header), so elements are moved with
 * memcpy — a plain load or store wherever the target allows unaligned access. */
static inline float qmm_load_f32(const void *array, qmm_dtype dtype, size_t i) {
    switch (dtype) {
    case QMM_F16:
    case QMM_BF16: {
        uint16_t bits;
        memcpy(&bits, (const unsigned char *)array + i * sizeof bits, sizeof bits);
        return dtype == QMM_F16 ? qmm_f16_to_f32(bits) : qmm_bf16_to_f32(bits);
    }
    default: {
        float value;
        memcpy(&value, (const unsigned char *)array + i * sizeof value, sizeof value);
        return value;
    }
    }
}
static inline void qmm_store_f32(void *array, qmm_dtype dtype, size_t i, float value) {
    switch (dtype) {
    case QMM_F16:
    case QMM_BF16: {
        uint16_t bits = dtype == QMM_F16 ? qmm_f32_to_f16(value) : qmm_f32_to_bf16(value);
        memcpy((unsigned char *)array + i * sizeof bits, &bits, sizeof bits);
        break;
    }
    default: memcpy((unsigned char *)array + i * sizeof value, &value, sizeof value); break;
    }
}

/* Code j of a packed row (LSB-first bit stream of `bits`-bit codes; 3/5/6-bit codes may straddle
 * two words, so two words are read when the code crosses a word boundary). */
static inline uint32_t qmm_code_at(const uint32_t *row, size_t j, int bits) {
    size_t bit = j * (size_t)bits;
    size_t word = bit >> 5;
    unsigned shift = (unsigned)(bit & 31);
    uint64_t pair = row[word];
    if (shift + (unsigned)bits > 32) pair |= (uint64_t)row[word + 1] << 32;
    return (uint32_t)(pair >> shift) & ((1u << bits) - 1u);
}

/* The LSB-first bit stream of one row (or one group): packs count codes (each < 2^bits, count·bits a
 * multiple of 32) into count·bits/32 words, and the inverse. No checks: qmm_pack/qmm_unpack validate. */
void qmm_pack_stream(const uint8_t *codes, size_t count, int bits, uint32_t *out);
void qmm_unpack_stream(const uint32_t *in, size_t count, int bits, uint8_t *codes);

/* The same codes in wider words (a backend's stored_bits, src/core/kernel.h): rows × cols codes of `bits` from w
 * (qmm_packed_words(cols, bits) words a row) into `wide_bits` ≥ bits words (qmm_packed_words(cols, wide_bits) a
 * row) — every code keeps its value. Allocates *wide (free it); QMM_ERR_OUT_OF_MEMORY / QMM_ERR_OVERFLOW. */
qmm_status qmm_widen_codes(const uint32_t *w, size_t rows, size_t cols, int bits, int wide_bits, uint32_t **wide);
/* The width a backend whose kernels decode 4- and 8-bit codes only stores `bits` in: 2/3 → 4, 5/6 → 8. */
static inline int qmm_decoder_bits(int bits) { return bits <= 4 ? 4 : 8; }

/* The non-finite rule's replacement (docs/kernels.md §2), the one implementation (src/ref/oracle.c, built
 * with -ffp-contract=off): output (m, n) of x·Ŵᵀ (transpose = 1) or x·Ŵ (transpose = 0) in the direct form
 * in f64, Σ_k (s·q_k + b)·x_k with each ŵ = s·q + b formed in f64 and the sum in increasing k — bit for bit
 * qmm_ref_dense_f64's value. The caller rounds it to f32 and then narrows as usual. Host arrays:
 * x dtype [M, K]; w, scales, biases as in qmm_qmatrix with rows × cols = N × K (qmm_t) or K × N (qmm_n). */
typedef struct qmm_direct_operands {
    int transpose;
    qmm_dtype dtype;
    int bits, group_size;
    size_t N, K;
    const void *x;
    const uint32_t *w;
    const void *scales, *biases;
} qmm_direct_operands;
double qmm_direct_output_f64(const qmm_direct_operands *operands, size_t m, size_t n);

/* The checks every gather entry point shares (src/core/gather.c), in this order, before any work:
 * expert_count ≥ 1 dividing rows (then *N = rows / expert_count), T ≥ 1, B ≥ 1, rhs_indices not NULL,
 * T·K and B·N elements of dtype addressable, lhs_indices NULL only with B ≤ T, every lhs_indices[i] < T
 * and rhs_indices[i] < expert_count (the message names the array, the position, the value and the bound).
 * *sorted receives whether rhs_indices is non-decreasing. function prefixes every message. */
qmm_status qmm_gather_validate(const char *function, size_t rows, size_t K, qmm_dtype dtype, size_t expert_count,
                               size_t T, const uint32_t *lhs_indices, const uint32_t *rhs_indices, size_t B,
                               size_t *N, bool *sorted);

/* ───────────────────────── atomic file writes (atomic_file.c) ───────────────────────── */

/* An output file written under a temporary name beside its destination and renamed into place. */
typedef struct qmm_atomic_file {
    int fd;
    char *temp_path;
    const char *path;
    int slot; /* its entry for qmm_atomic_remove_all, or -1 */
} qmm_atomic_file;
/* A qmm_atomic_file before qmm_atomic_begin (qmm_atomic_abort on it does nothing). */
#define QMM_ATOMIC_FILE_NONE {.fd = -1, .temp_path = NULL, .path = NULL, .slot = -1}

/* What a directory entry of this st_mode is, for a message: "a directory", "a symbolic link", "a character
 * device", "a block device", "a FIFO", "a socket", else "not a regular file". */
const char *qmm_file_kind(unsigned mode);
/* Creates "path.qmm-tmp-XXXXXX" beside path with O_CREAT|O_EXCL, mode 0666 under the umask (a fresh name:
 * an existing file is never opened). Errors: QMM_ERR_IO, also where path exists as a directory, a device, a FIFO or
 * a socket, which the rename would replace (a regular file or a symbolic link is replaced: the link itself). */
qmm_status qmm_atomic_begin(qmm_atomic_file *file, const char *path);
qmm_status qmm_atomic_write(qmm_atomic_file *file, const void *bytes, size_t size);
/* Flushes to disk and closes the temporary file (still under its temporary name). */
qmm_status qmm_atomic_finish(qmm_atomic_file *file);
/* Renames the finished temporary file onto path; on failure the temporary file is removed. */
qmm_status qmm_atomic_rename(qmm_atomic_file *file);
/* Closes and removes the temporary file if it still exists; frees the state. Safe to call twice. */
void qmm_atomic_abort(qmm_atomic_file *file);
/* Removes every temporary file begun and not yet renamed or aborted, and the directory a writer noted it created
 * (qmm_atomic_note_created_dir) if it is empty then — for a CLI's SIGINT/SIGTERM handler: async-signal-safe (unlink,
 * rmdir and lock-free atomics only). Up to 8 files at a time; paths of PATH_MAX bytes or more are not tracked. */
void qmm_atomic_remove_all(void);
/* A directory the caller has just created for the files it will write (one at a time): removed by
 * qmm_atomic_remove_all once empty; returns a note for qmm_atomic_forget (-1: not tracked). */
int qmm_atomic_note_created_dir(const char *dir);
/* The noted directory is finished with: no longer removed on a signal (-1: nothing). */
void qmm_atomic_forget(int note);
/* The signals the CLI's cleanup handler catches (tools/qmm/main.c) and qmm_atomic_block_signals holds back. */
#define QMM_CLEANUP_SIGNALS SIGINT, SIGTERM, SIGHUP, SIGQUIT
/* Holds back, in the calling thread, the signals the CLI's cleanup handler catches (QMM_CLEANUP_SIGNALS) until
 * qmm_atomic_restore_signals(old): a section that must not be cut by qmm_atomic_remove_all — a file's
 * creation and its registration, a checkpoint's renames and their undoing — runs whole, and a signal that comes
 * meanwhile is delivered after it. */
void qmm_atomic_block_signals(sigset_t *old);
void qmm_atomic_restore_signals(const sigset_t *old);

#endif /* QMM_INTERNAL_H */
