/*
 * io_internal.h — helpers shared by the checkpoint readers and writers in src/io/ (not installed).
 *
 * Defined in safetensors.c: read-only file mappings, whole-file reads, UTF-8 validation, shapes as text
 * for error messages, JSON parsing, the duplicate-name and overlapping-span
 * checks of the readers, and atomic file writes (temporary file in the same directory + rename, so a
 * failure never leaves a partial file at the destination, DESIGN.md §4).
 */
#ifndef QMM_IO_INTERNAL_H
#define QMM_IO_INTERNAL_H

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A whole file mapped read-only (base is NULL for an empty file). */
typedef struct qmm_mapping {
    void *base;
    size_t size;
} qmm_mapping;

/* Maps path read-only. Errors: QMM_ERR_IO naming the path and the system error
 * (QMM_ERR_NOT_FOUND when the file does not exist). */
qmm_status qmm_io_map_file(const char *path, qmm_mapping *mapping);
void qmm_io_unmap(qmm_mapping *mapping);

/* Reads a whole (small) file into a NUL-terminated heap buffer. Files larger than max_size are
 * refused with QMM_ERR_CORRUPT. Errors: QMM_ERR_NOT_FOUND (no such file), QMM_ERR_IO. */
qmm_status qmm_io_read_file(const char *path, size_t max_size, char **text, size_t *size);

/* "dir/name" in a heap buffer, or NULL when out of memory. */
char *qmm_io_join(const char *dir, const char *name);

/* Whether bytes[0, size) is well-formed UTF-8 (no overlongs, no surrogates, ≤ U+10FFFF). Embedded NUL
 * bytes are rejected too: every name qmm hands out is a C string. */
bool qmm_io_utf8_valid(const char *bytes, size_t size);

/* Printable copies of untrusted names for messages (qmm_printable): internal.h (src/core/status.c). A path in a message
 * is printable too, in QMM_IO_PATH_SHOWN bytes: a shard's name in it comes from model.safetensors.index.json or from
 * the directory's listing. */
#define QMM_IO_PATH_SHOWN 512

/* "[d0, d1, ...]" into out[size] (cut to fit), for messages about shapes. */
void qmm_io_shape_text(int ndim, const int64_t *shape, char *out, size_t size);
#define QMM_IO_SHAPE_TEXT_SIZE 192

/* Atomic file writes (qmm_atomic_file): internal.h (src/core/atomic_file.c). */

/* Binary search of name among count items sorted by strcmp of their names; name_at(context, i) is
 * the name of item i. Returns the position, or QMM_IO_NOT_FOUND. */
#define QMM_IO_NOT_FOUND ((size_t)-1)
size_t qmm_io_find_sorted(const void *context, size_t count, const char *(*name_at)(const void *context, size_t i),
                          const char *name);

/* qsort comparator for an array of C strings (char *), by strcmp. */
int qmm_io_compare_strings(const void *a, const void *b);

/* A name and the position of its item, for sorting items by name without a qsort context. */
typedef struct qmm_io_name {
    const char *name;
    size_t index;
} qmm_io_name;

/* Sorts names by strcmp (equal names by index) and refuses the first name that appears twice:
 * returns status with the message "<what> \"name\" appears twice". The sorted array can then serve
 * qmm_io_find_sorted. */
qmm_status qmm_io_sort_unique(qmm_io_name *names, size_t count, qmm_status status, const char *what);

/* The bytes [begin, end) of the data area that a named item occupies. */
typedef struct qmm_io_span {
    size_t begin, end;
    const char *name;
} qmm_io_span;

/* Sorts spans by (begin, end, name) and refuses the first two that share a byte (empty spans occupy
 * nothing): QMM_ERR_CORRUPT "<what> \"a\" [b, e) and \"c\" [b, e) overlap in the data area". */
qmm_status qmm_io_check_spans(qmm_io_span *spans, size_t count, const char *what);

/* "an object", "a string", "missing", ... for messages about a JSON value of the wrong kind. */
struct cJSON;
const char *qmm_io_json_kind(const struct cJSON *item);
/* How many members of the object are named key (cJSON finds only the first of several, Python's json keeps the last). */
size_t qmm_io_json_key_copies(const struct cJSON *object, const char *key);
/* QMM_ERR_CORRUPT "<what>: "<key>" appears n times; it must appear once" when one of keys[0..count) names more than
 * one member of the object (cJSON reads the first copy, Python's json the last, serde refuses the file). */
qmm_status qmm_io_json_keys_once(const struct cJSON *object, const char *const *keys, size_t count, const char *what);

/* Whether a JSON string in json[0, size) holds a NUL byte, raw or escaped as \u0000 (cJSON would cut it there);
 * *string_start and *string_end receive the first such string's bytes, quotes included. */
bool qmm_io_json_find_nul(const char *json, size_t size, size_t *string_start, size_t *string_end);

/* The first number in json[0, size) that is the value of one of keys[0..key_count) — or an element of an array that
 * is — and is not written as an unsigned integer: a sign, a fraction, an exponent or a leading zero ("6.4e1", "4.0",
 * "-0", "08"); with within_count > 0 only such keys inside an object that is the value (at any depth) of one of
 * within[0..within_count). *number_start and *number_end receive its bytes. The readers qmm's files are read by take
 * these fields as integers and refuse such numbers — the safetensors reference (Rust usize through serde_json) its
 * shape and data_offsets, MLX its quantization's bits and group_size (nanobind int arguments) — while cJSON keeps
 * only a value (6.4e1 is 64), so the text is read. Numbers of other keys are left alone. */
bool qmm_io_json_find_non_integer(const char *json, size_t size, const char *const *keys, size_t key_count,
                                  const char *const *within, size_t within_count, size_t *number_start,
                                  size_t *number_end);

/* Parses size bytes of JSON (not necessarily NUL-terminated; a terminated private copy is parsed, so
 * no parser path reads past them) into *root; only whitespace may follow the value. Messages start
 * with what. Errors: QMM_ERR_CORRUPT ("is not valid JSON", "has data after its JSON value", a string holding a
 * NUL byte),
 * QMM_ERR_OVERFLOW, QMM_ERR_OUT_OF_MEMORY. The caller frees *root with cJSON_Delete. */
qmm_status qmm_io_parse_json(const char *what, const char *json, size_t size, struct cJSON **root);

/* The safetensors dtype string of a qmm dtype ("F32", "BF16", "U32", ...). */
const char *qmm_safetensors_dtype_string(qmm_dtype dtype);

/* Validates tensors/metadata as qmm_safetensors_write does and streams the whole file into an
 * already begun atomic file (the caller finishes and renames it). */
qmm_status qmm_safetensors_write_to(qmm_atomic_file *file, const qmm_tensor *tensors, size_t count,
                                    const char *const *metadata_keys, const char *const *metadata_values,
                                    size_t metadata_count);

/* Opens one safetensors file as a one-shard checkpoint (checkpoint.c). config.json in the file's
 * directory, when there is one, is parsed as qmm_checkpoint_open does (its errors are the call's), and
 * every quantized layer (a tensor P.scales) takes its format from it and is checked as that function
 * checks them. A file with a quantized layer and no config.json is refused (QMM_ERR_NOT_FOUND naming
 * the layer and the missing config.json): a format is never guessed from shapes; a float file needs
 * none. Close with qmm_checkpoint_close. Errors: those of qmm_safetensors_open and qmm_checkpoint_open. */
qmm_status qmm_io_checkpoint_of_file(const char *path, qmm_checkpoint **checkpoint);
/* The text of the config.json that qmm_io_checkpoint_of_file read beside the file (NUL-terminated, already
 * parsed as a config), or NULL when there was none. */
const char *qmm_io_checkpoint_config_text(const qmm_checkpoint *checkpoint);
/* Whether the checkpoint's config.json has the per-layer entry "name": false (not quantized). */
bool qmm_io_layer_marked_false(const qmm_checkpoint *checkpoint, const char *name);

/* Test hook (checkpoint.c): when n > 0, the n-th aligned copy of a misaligned layer array made by this
 * thread from now on fails as if malloc had returned NULL (the counter counts down to 0 = off). */
extern _Thread_local size_t qmm_io_fail_aligned_copy;

/* Load/store little-endian integers from untrusted, possibly unaligned bytes. */
static inline uint16_t qmm_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t qmm_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t qmm_le64(const uint8_t *p) { return (uint64_t)qmm_le32(p) | ((uint64_t)qmm_le32(p + 4) << 32); }

#endif /* QMM_IO_INTERNAL_H */
