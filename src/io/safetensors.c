/*
 * safetensors.c — read (mmap + a fully validated header) and write (temp file + rename) safetensors
 * files, plus the small file helpers the rest of src/io shares (io_internal.h).
 *
 * Format (https://github.com/huggingface/safetensors): u64 little-endian header length N, N bytes of
 * JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str: str}}
 * (padded with spaces), then the data area; offsets are relative to the data area. The header comes
 * from an untrusted file, so every field's type and every size is checked before it is used.
 */
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The reference implementation refuses headers over 100 MB (safetensors MAX_HEADER_SIZE). */
#define SAFETENSORS_MAX_HEADER 100000000ull
/* JSON numbers are doubles in cJSON: integers are exact only up to 2^53. */
#define JSON_MAX_EXACT_INTEGER 9007199254740992.0

/* ───────────────────────────── shared file helpers ───────────────────────────── */

qmm_status qmm_io_map_file(const char *path, qmm_mapping *mapping) {
    mapping->base = NULL;
    mapping->size = 0;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait forever for a writer; the fstat
     * below refuses everything that is not a regular file (where O_NONBLOCK changes nothing). */
    char shown[QMM_IO_PATH_SHOWN]; /* path for messages, printable */
    qmm_printable(path, strlen(path), shown, sizeof shown);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        return qmm_error(err == ENOENT ? QMM_ERR_NOT_FOUND : QMM_ERR_IO, "cannot open \"%s\": %s", shown, strerror(err));
    }
    qmm_status status = QMM_OK;
    struct stat info;
    if (fstat(fd, &info) != 0) {
        status = qmm_error(QMM_ERR_IO, "cannot stat \"%s\": %s", shown, strerror(errno));
        goto cleanup;
    }
    if (!S_ISREG(info.st_mode)) {
        status = qmm_error(QMM_ERR_IO, "\"%s\" is not a regular file", shown);
        goto cleanup;
    }
    if ((uint64_t)info.st_size > SIZE_MAX) {
        status = qmm_error(QMM_ERR_IO, "\"%s\" is too large to map (%lld bytes)", shown, (long long)info.st_size);
        goto cleanup;
    }
    if (info.st_size > 0) {
        void *base = mmap(NULL, (size_t)info.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (base == MAP_FAILED) {
            status = qmm_error(QMM_ERR_IO, "cannot mmap \"%s\" (%lld bytes): %s", shown, (long long)info.st_size,
                               strerror(errno));
            goto cleanup;
        }
        mapping->base = base;
        mapping->size = (size_t)info.st_size;
    }
cleanup:
    close(fd);
    return status;
}

void qmm_io_unmap(qmm_mapping *mapping) {
    if (mapping && mapping->base) munmap(mapping->base, mapping->size);
    if (mapping) {
        mapping->base = NULL;
        mapping->size = 0;
    }
}

qmm_status qmm_io_read_file(const char *path, size_t max_size, char **text, size_t *size) {
    *text = NULL;
    *size = 0;
    qmm_status status = QMM_OK;
    char *buffer = NULL;
    char shown[QMM_IO_PATH_SHOWN]; /* path for messages, printable */
    qmm_printable(path, strlen(path), shown, sizeof shown);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block (qmm_io_map_file) */
    if (fd < 0) {
        int err = errno;
        return qmm_error(err == ENOENT ? QMM_ERR_NOT_FOUND : QMM_ERR_IO, "cannot open \"%s\": %s", shown, strerror(err));
    }
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
        status = qmm_error(QMM_ERR_IO, "\"%s\" is not a readable regular file", shown);
        goto cleanup;
    }
    if ((uint64_t)info.st_size > max_size) {
        status = qmm_error(QMM_ERR_CORRUPT, "\"%s\" is %lld bytes, over the %zu-byte limit for this file", shown,
                           (long long)info.st_size, max_size);
        goto cleanup;
    }
    size_t length = (size_t)info.st_size;
    buffer = malloc(length + 1);
    if (!buffer) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for \"%s\"", length + 1, shown);
        goto cleanup;
    }
    size_t done = 0;
    while (done < length) {
        ssize_t got = read(fd, buffer + done, length - done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            status = qmm_error(QMM_ERR_IO, "cannot read \"%s\": %s", shown, got < 0 ? strerror(errno) : "file shrank");
            goto cleanup;
        }
        done += (size_t)got;
    }
    buffer[length] = '\0';
    *text = buffer;
    *size = length;
    buffer = NULL;
cleanup:
    free(buffer);
    close(fd);
    return status;
}

char *qmm_io_join(const char *dir, const char *name) {
    size_t dir_length = strlen(dir), name_length = strlen(name);
    char *path = malloc(dir_length + name_length + 2);
    if (!path) return NULL;
    memcpy(path, dir, dir_length);
    size_t at = dir_length;
    if (at == 0 || path[at - 1] != '/') path[at++] = '/';
    memcpy(path + at, name, name_length + 1);
    return path;
}

bool qmm_io_utf8_valid(const char *bytes, size_t size) {
    for (size_t i = 0; i < size;) {
        const size_t length = qmm_utf8_char(bytes + i, size - i, NULL);
        if (length == 0 || bytes[i] == '\0') return false;
        i += length;
    }
    return true;
}

void qmm_io_shape_text(int ndim, const int64_t *shape, char *out, size_t size) {
    size_t at = (size_t)snprintf(out, size, "[");
    for (int d = 0; d < ndim && at < size; d++)
        at += (size_t)snprintf(out + at, size - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (at < size) snprintf(out + at, size - at, "]");
}

/* ───────────────────────────── dtypes ───────────────────────────── */

static const struct {
    const char *name;
    qmm_dtype dtype;
} dtype_strings[] = {
    {"F32", QMM_F32}, {"F16", QMM_F16}, {"BF16", QMM_BF16}, {"F64", QMM_F64}, {"U8", QMM_U8},
    {"I8", QMM_I8},   {"U16", QMM_U16}, {"I16", QMM_I16},   {"U32", QMM_U32}, {"I32", QMM_I32},
    {"U64", QMM_U64}, {"I64", QMM_I64}, {"BOOL", QMM_BOOL},
};
#define DTYPE_STRING_COUNT (sizeof dtype_strings / sizeof dtype_strings[0])

const char *qmm_safetensors_dtype_string(qmm_dtype dtype) {
    for (size_t i = 0; i < DTYPE_STRING_COUNT; i++)
        if (dtype_strings[i].dtype == dtype) return dtype_strings[i].name;
    return NULL;
}

/* ───────────────────────────── reader ───────────────────────────── */

typedef struct st_entry {
    char *name;
    qmm_dtype dtype;
    int ndim;
    int64_t shape[QMM_MAX_DIMS];
    size_t begin, end;
} st_entry;

struct qmm_safetensors {
    qmm_mapping mapping; /* owned when opened from a path */
    const uint8_t *data; /* the data area */
    size_t data_size;
    size_t count;
    st_entry *entries; /* sorted by data offset */
    qmm_io_name *by_name; /* entry names and indices, sorted by name */
    size_t metadata_count;
    char **metadata_keys;         /* sorted; each block is "key\0value" */
    const char **metadata_values; /* point into the key blocks */
};

/* A JSON number that is an integer in [0, 2^53] (exact in a double), or false. */
static bool json_exact_count(const cJSON *item, double *value) {
    if (!cJSON_IsNumber(item)) return false;
    double v = item->valuedouble;
    *value = v;
    return v >= 0.0 && v <= JSON_MAX_EXACT_INTEGER && floor(v) == v;
}

/* An integer up to 2^53 as JSON, all its digits: cJSON prints numbers with 15 significant digits when they
 * compare equal within a relative DBL_EPSILON, so 2^53 would come out as 9.00719925474099e+15. */
static cJSON *exact_integer(uint64_t value) {
    char digits[24];
    snprintf(digits, sizeof digits, "%llu", (unsigned long long)value);
    return cJSON_CreateRaw(digits);
}

size_t qmm_io_find_sorted(const void *context, size_t count, const char *(*name_at)(const void *context, size_t i),
                          const char *name) {
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int order = strcmp(name_at(context, mid), name);
        if (order == 0) return mid;
        if (order < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return QMM_IO_NOT_FOUND;
}

const char *qmm_io_json_kind(const cJSON *item) {
    if (!item) return "missing";
    if (cJSON_IsObject(item)) return "an object";
    if (cJSON_IsArray(item)) return "an array";
    if (cJSON_IsString(item)) return "a string";
    if (cJSON_IsNumber(item)) return "a number";
    if (cJSON_IsBool(item)) return "a boolean";
    if (cJSON_IsNull(item)) return "null";
    return "an invalid value";
}

size_t qmm_io_json_key_copies(const cJSON *object, const char *key) {
    size_t copies = 0;
    const cJSON *member;
    cJSON_ArrayForEach(member, object) {
        if (member->string && strcmp(member->string, key) == 0) copies++;
    }
    return copies;
}

qmm_status qmm_io_json_keys_once(const cJSON *object, const char *const *keys, size_t count, const char *what) {
    for (size_t k = 0; k < count; k++) {
        const size_t copies = qmm_io_json_key_copies(object, keys[k]);
        if (copies > 1)
            return qmm_error(QMM_ERR_CORRUPT, "%s: \"%s\" appears %zu times; it must appear once", what, keys[k], copies);
    }
    return QMM_OK;
}

bool qmm_io_json_find_nul(const char *json, size_t size, size_t *string_start, size_t *string_end) {
    bool in_string = false, nul = false;
    size_t start = 0;
    for (size_t i = 0; i < size; i++) {
        char c = json[i];
        if (!in_string) {
            if (c == '"') {
                in_string = true;
                nul = false;
                start = i;
            }
            continue;
        }
        if (c == '\0') {
            nul = true;
        } else if (c == '\\' && i + 1 < size) {
            if (json[i + 1] == 'u' && i + 5 < size && memcmp(json + i + 2, "0000", 4) == 0) nul = true;
            i++; /* the escaped character (a \uXXXX's digits are plain characters) */
        } else if (c == '"') {
            in_string = false;
            if (nul) {
                *string_start = start;
                *string_end = i + 1;
                return true;
            }
        }
    }
    if (in_string && nul) {
        *string_start = start;
        *string_end = size;
        return true;
    }
    return false;
}

static bool key_in(const char *key, size_t length, const char *const *keys, size_t count) {
    for (size_t k = 0; k < count; k++)
        if (strlen(keys[k]) == length && memcmp(key, keys[k], length) == 0) return true;
    return false;
}

bool qmm_io_json_find_non_integer(const char *json, size_t size, const char *const *keys, size_t key_count,
                                  const char *const *within, size_t within_count, size_t *number_start,
                                  size_t *number_end) {
    enum { DEPTH = 64 };
    bool inside[DEPTH + 1] = {within_count == 0}; /* per object depth: below a `within` key (or everywhere) */
    int depth = 0;
    bool in_string = false, in_array = false, after_key = false, key_wanted = false, within_key = false;
    size_t string_start = 0, string_end = 0;
    for (size_t i = 0; i < size; i++) {
        const char c = json[i];
        if (in_string) {
            if (c == '\\') {
                i++; /* the escaped character */
            } else if (c == '"') {
                in_string = false;
                string_end = i;
            }
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
        if (c == '"') {
            in_string = true;
            string_start = i + 1;
            after_key = false;
            continue;
        }
        if (c == ':') { /* the string just read was a key */
            const char *key = json + string_start;
            const size_t length = string_end - string_start;
            key_wanted = inside[depth < DEPTH ? depth : DEPTH] && key_in(key, length, keys, key_count);
            within_key = key_in(key, length, within, within_count);
            after_key = true;
            continue;
        }
        const bool value_wanted = after_key && key_wanted;
        if (c == '{') {
            const bool below = inside[depth < DEPTH ? depth : DEPTH] || (after_key && within_key);
            depth++;
            if (depth <= DEPTH) inside[depth] = below;
            in_array = false;
        } else if (c == '}') {
            if (depth > 0) depth--;
            in_array = false;
        } else if (c == '[' && value_wanted) {
            in_array = true;
        } else if (c == '[' || c == ']') {
            in_array = false;
        } else if ((in_array || value_wanted) && (c == '-' || (c >= '0' && c <= '9'))) {
            size_t end = i;
            while (end < size && (json[end] == '-' || json[end] == '+' || json[end] == '.' || json[end] == 'e' ||
                                  json[end] == 'E' || (json[end] >= '0' && json[end] <= '9')))
                end++;
            bool integer = c != '-' && !(c == '0' && end - i > 1);
            for (size_t j = i; j < end && integer; j++)
                if (json[j] < '0' || json[j] > '9') integer = false;
            if (!integer) {
                *number_start = i;
                *number_end = end;
                return true;
            }
            i = end - 1;
        }
        after_key = false;
    }
    return false;
}

qmm_status qmm_io_parse_json(const char *what, const char *json, size_t size, cJSON **root) {
    *root = NULL;
    size_t length;
    if (!qmm_add_size(size, 1, &length)) return qmm_error(QMM_ERR_OVERFLOW, "%s: size %zu overflows", what, size);
    char *text = malloc(length);
    if (!text) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, length);
    if (size) memcpy(text, json, size);
    text[size] = '\0';
    const char *end = NULL;
    qmm_status status = QMM_OK;
    cJSON *tree = cJSON_ParseWithLengthOpts(text, size, &end, 0);
    if (!tree) {
        size_t at = end && end >= text && end <= text + size ? (size_t)(end - text) : 0;
        status = qmm_error(QMM_ERR_CORRUPT, "%s is not valid JSON (error near byte %zu of %zu)", what, at, size);
        goto cleanup;
    }
    /* Writers may pad with whitespace (safetensors pads its header with spaces); anything else after
     * the value is corruption. */
    for (const char *p = end; p && p < text + size; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            status =
                qmm_error(QMM_ERR_CORRUPT, "%s has data after its JSON value at byte %zu", what, (size_t)(p - text));
            goto cleanup;
        }
    }
    /* cJSON decodes \u0000 into a NUL byte inside a C string, which cuts "a\u0000x.weight" to "a": two
     * different names would read as one, a name as another. Every name and value qmm hands out is a C string. */
    size_t start, stop;
    if (qmm_io_json_find_nul(json, size, &start, &stop)) {
        char printable[QMM_PRINTABLE_SIZE];
        status = qmm_error(QMM_ERR_CORRUPT,
                           "%s: the string at byte %zu, %s, holds a NUL byte (\\u0000); names and values must not "
                           "contain NUL",
                           what, start, qmm_printable(json + start, stop - start, printable, sizeof printable));
        goto cleanup;
    }
    *root = tree;
    tree = NULL;
cleanup:
    cJSON_Delete(tree);
    free(text);
    return status;
}

int qmm_io_compare_strings(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int compare_names(const void *a, const void *b) {
    const qmm_io_name *x = a, *y = b;
    int order = strcmp(x->name, y->name);
    if (order != 0) return order;
    return x->index < y->index ? -1 : (x->index > y->index ? 1 : 0);
}

qmm_status qmm_io_sort_unique(qmm_io_name *names, size_t count, qmm_status status, const char *what) {
    if (count > 1) qsort(names, count, sizeof(qmm_io_name), compare_names);
    for (size_t i = 1; i < count; i++) {
        if (strcmp(names[i - 1].name, names[i].name) == 0) {
            char printable[QMM_PRINTABLE_SIZE];
            return qmm_error(status, "%s \"%s\" appears twice", what,
                             qmm_printable(names[i].name, strlen(names[i].name), printable, sizeof printable));
        }
    }
    return QMM_OK;
}

/* The order of data spans: by begin, then end, then name (a total order, so sorts are deterministic).
 * Tensor entries are kept in this order too (qmm_safetensors_get returns them by data offset). */
static int compare_ranges(size_t begin_a, size_t end_a, const char *name_a, size_t begin_b, size_t end_b,
                          const char *name_b) {
    if (begin_a != begin_b) return begin_a < begin_b ? -1 : 1;
    if (end_a != end_b) return end_a < end_b ? -1 : 1;
    return strcmp(name_a, name_b);
}

static int compare_spans(const void *a, const void *b) {
    const qmm_io_span *x = a, *y = b;
    return compare_ranges(x->begin, x->end, x->name, y->begin, y->end, y->name);
}

qmm_status qmm_io_check_spans(qmm_io_span *spans, size_t count, const char *what) {
    if (count > 1) qsort(spans, count, sizeof(qmm_io_span), compare_spans);
    /* With spans sorted by begin, one overlaps an earlier one iff it starts before the furthest end
     * seen so far. Empty spans occupy no bytes and overlap nothing. */
    const qmm_io_span *furthest = NULL;
    for (size_t i = 0; i < count; i++) {
        const qmm_io_span *span = &spans[i];
        if (span->begin == span->end) continue;
        if (furthest && span->begin < furthest->end) {
            char first[QMM_PRINTABLE_SIZE], second[QMM_PRINTABLE_SIZE];
            return qmm_error(QMM_ERR_CORRUPT, "%s \"%s\" [%zu, %zu) and \"%s\" [%zu, %zu) overlap in the data area",
                             what, qmm_printable(furthest->name, strlen(furthest->name), first, sizeof first),
                             furthest->begin, furthest->end,
                             qmm_printable(span->name, strlen(span->name), second, sizeof second), span->begin,
                             span->end);
        }
        if (!furthest || span->end > furthest->end) furthest = span;
    }
    return QMM_OK;
}

static int compare_entry_offsets(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    return compare_ranges(x->begin, x->end, x->name, y->begin, y->end, y->name);
}

void qmm_safetensors_close(qmm_safetensors *file) {
    if (!file) return;
    for (size_t i = 0; i < file->count; i++)
        free(file->entries[i].name);
    free(file->entries);
    free(file->by_name);
    for (size_t i = 0; i < file->metadata_count; i++)
        free(file->metadata_keys[i]);
    free(file->metadata_keys);
    free(file->metadata_values);
    qmm_io_unmap(&file->mapping);
    free(file);
}

static qmm_status parse_metadata(qmm_safetensors *file, const cJSON *metadata) {
    if (!cJSON_IsObject(metadata))
        return qmm_error(QMM_ERR_CORRUPT, "safetensors \"__metadata__\" is %s; it must be an object of strings",
                         qmm_io_json_kind(metadata));
    size_t count = (size_t)cJSON_GetArraySize(metadata);
    file->metadata_keys = calloc(count ? count : 1, sizeof(char *));
    file->metadata_values = calloc(count ? count : 1, sizeof(char *));
    if (!file->metadata_keys || !file->metadata_values)
        return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu metadata entries", count);
    char printable[QMM_PRINTABLE_SIZE];
    /* Each key and its value share one block "key\0value", so sorting the keys moves the values. */
    const cJSON *item;
    cJSON_ArrayForEach(item, metadata) {
        const char *key = item->string;
        if (!key || !qmm_io_utf8_valid(key, strlen(key)))
            return qmm_error(QMM_ERR_CORRUPT, "safetensors __metadata__ key \"%s\" is not valid UTF-8",
                             qmm_printable(key ? key : "", key ? strlen(key) : 0, printable, sizeof printable));
        if (!cJSON_IsString(item) || !item->valuestring)
            return qmm_error(QMM_ERR_CORRUPT, "safetensors __metadata__[\"%s\"] is %s; values must be strings",
                             qmm_printable(key, strlen(key), printable, sizeof printable), qmm_io_json_kind(item));
        if (!qmm_io_utf8_valid(item->valuestring, strlen(item->valuestring)))
            return qmm_error(QMM_ERR_CORRUPT, "safetensors __metadata__[\"%s\"] is not valid UTF-8",
                             qmm_printable(key, strlen(key), printable, sizeof printable));
        size_t i = file->metadata_count;
        size_t key_length = strlen(key), value_length = strlen(item->valuestring);
        char *pair = malloc(key_length + value_length + 2);
        if (!pair) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a metadata entry");
        memcpy(pair, key, key_length + 1);
        memcpy(pair + key_length + 1, item->valuestring, value_length + 1);
        file->metadata_keys[i] = pair;
        file->metadata_count++;
    }
    qsort(file->metadata_keys, file->metadata_count, sizeof(char *), qmm_io_compare_strings);
    for (size_t i = 0; i < file->metadata_count; i++) {
        const char *pair = file->metadata_keys[i];
        if (i > 0 && strcmp(file->metadata_keys[i - 1], pair) == 0)
            return qmm_error(QMM_ERR_CORRUPT, "safetensors __metadata__ key \"%s\" appears twice",
                             qmm_printable(pair, strlen(pair), printable, sizeof printable));
        file->metadata_values[i] = pair + strlen(pair) + 1; /* points into the pair block */
    }
    return QMM_OK;
}

static qmm_status parse_tensor(qmm_safetensors *file, const char *name, const cJSON *item, st_entry *entry) {
    char printable[QMM_PRINTABLE_SIZE];
    qmm_printable(name, strlen(name), printable, sizeof printable);
    if (!cJSON_IsObject(item))
        return qmm_error(QMM_ERR_CORRUPT, "safetensors tensor \"%s\" is %s; it must be an object", printable,
                         qmm_io_json_kind(item));
    /* cJSON finds the first copy of a key, Python's json keeps the last and the reference reader (serde) refuses
     * the file: a field given twice is refused here too, so no two readers see different tensors. */
    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    char what[QMM_PRINTABLE_SIZE + 32];
    snprintf(what, sizeof what, "safetensors tensor \"%s\"", printable);
    qmm_status status = qmm_io_json_keys_once(item, fields, sizeof fields / sizeof fields[0], what);
    if (status != QMM_OK) return status;
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype) || !dtype->valuestring)
        return qmm_error(QMM_ERR_CORRUPT, "safetensors tensor \"%s\": \"dtype\" is %s; it must be a string", printable,
                         qmm_io_json_kind(dtype));
    bool known = false;
    for (size_t i = 0; i < DTYPE_STRING_COUNT; i++) {
        if (strcmp(dtype->valuestring, dtype_strings[i].name) == 0) {
            entry->dtype = dtype_strings[i].dtype;
            known = true;
        }
    }
    if (!known) {
        char dtype_printable[QMM_PRINTABLE_SIZE];
        return qmm_error(
            QMM_ERR_UNSUPPORTED,
            "safetensors tensor \"%s\": dtype \"%s\" is not supported (known: F32, F16, BF16, F64, U8, "
            "I8, U16, I16, U32, I32, U64, I64, BOOL)",
            printable,
            qmm_printable(dtype->valuestring, strlen(dtype->valuestring), dtype_printable, sizeof dtype_printable));
    }
    if (!cJSON_IsArray(shape))
        return qmm_error(QMM_ERR_CORRUPT, "safetensors tensor \"%s\": \"shape\" is %s; it must be an array", printable,
                         qmm_io_json_kind(shape));
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > QMM_MAX_DIMS)
        return qmm_error(QMM_ERR_UNSUPPORTED, "safetensors tensor \"%s\" has %d dimensions; qmm handles at most %d",
                         printable, ndim, QMM_MAX_DIMS);
    entry->ndim = ndim;
    size_t elements = 1;
    bool overflow = false, zero = false;
    int d = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, shape) {
        double value;
        if (!json_exact_count(dim, &value)) {
            if (cJSON_IsNumber(dim) && dim->valuedouble < 0)
                return qmm_error(QMM_ERR_CORRUPT, "safetensors tensor \"%s\": shape[%d]=%.17g is negative", printable,
                                 d, dim->valuedouble);
            if (cJSON_IsNumber(dim))
                return qmm_error(QMM_ERR_CORRUPT,
                                 "safetensors tensor \"%s\": shape[%d]=%.17g is not an integer in [0, 2^53]", printable,
                                 d, dim->valuedouble);
            return qmm_error(QMM_ERR_CORRUPT, "safetensors tensor \"%s\": shape[%d] is %s; it must be an integer",
                             printable, d, qmm_io_json_kind(dim));
        }
        entry->shape[d] = (int64_t)value;
        /* 2^53 fits a 64-bit size_t but not a 32-bit one: compare before the cast (as the GGUF reader does). */
        if (value > (double)SIZE_MAX || !qmm_mul_size(elements, (size_t)value, &elements)) overflow = true;
        if (value == 0) zero = true;
        d++;
    }
    if (zero) overflow = false, elements = 0; /* a zero dimension: no elements, however large the others */
    size_t nbytes = 0;
    if (overflow || !qmm_mul_size(elements, qmm_dtype_size(entry->dtype), &nbytes))
        return qmm_error(QMM_ERR_CORRUPT, "safetensors tensor \"%s\": the byte size of its shape overflows size_t",
                         printable);
    if (!cJSON_IsArray(offsets))
        return qmm_error(QMM_ERR_CORRUPT, "safetensors tensor \"%s\": \"data_offsets\" is %s; it must be [begin, end]",
                         printable, qmm_io_json_kind(offsets));
    if (cJSON_GetArraySize(offsets) != 2)
        return qmm_error(QMM_ERR_CORRUPT,
                         "safetensors tensor \"%s\": \"data_offsets\" has %d elements; it must be [begin, end]",
                         printable, cJSON_GetArraySize(offsets));
    double begin, end;
    const cJSON *begin_item = cJSON_GetArrayItem(offsets, 0), *end_item = cJSON_GetArrayItem(offsets, 1);
    if (!json_exact_count(begin_item, &begin) || !json_exact_count(end_item, &end)) {
        if (cJSON_IsNumber(begin_item) && cJSON_IsNumber(end_item))
            return qmm_error(QMM_ERR_CORRUPT,
                             "safetensors tensor \"%s\": data_offsets [%.17g, %.17g] must be integers in [0, 2^53]",
                             printable, begin_item->valuedouble, end_item->valuedouble);
        return qmm_error(QMM_ERR_CORRUPT,
                         "safetensors tensor \"%s\": data_offsets holds %s and %s; they must be integers", printable,
                         qmm_io_json_kind(begin_item), qmm_io_json_kind(end_item));
    }
    if (begin > end)
        return qmm_error(QMM_ERR_CORRUPT, "safetensors tensor \"%s\": data_offsets [%.0f, %.0f] has begin > end",
                         printable, begin, end);
    if (end > (double)file->data_size)
        return qmm_error(QMM_ERR_CORRUPT,
                         "safetensors tensor \"%s\": data_offsets end %.0f is past the data area of %zu bytes "
                         "(file truncated?)",
                         printable, end, file->data_size);
    entry->begin = (size_t)begin;
    entry->end = (size_t)end;
    if (entry->end - entry->begin != nbytes)
        return qmm_error(QMM_ERR_CORRUPT,
                         "safetensors tensor \"%s\": data_offsets span %zu bytes but dtype %s × shape needs %zu",
                         printable, entry->end - entry->begin, dtype->valuestring, nbytes);
    return QMM_OK;
}

/* The reference implementation (safetensors Metadata::validate) requires the tensors, in order of
 * offset, to tile the data area exactly: each begins where the previous one ends, the first at 0, and
 * the last ends at the end of the file. Bytes no tensor owns are refused, naming the tensors around
 * them. Runs after qmm_io_check_spans, on entries sorted by (begin, end, name). */
static qmm_status check_tiling(const qmm_safetensors *file) {
    char first[QMM_PRINTABLE_SIZE], second[QMM_PRINTABLE_SIZE];
    size_t expected = 0;
    const st_entry *previous = NULL;
    for (size_t i = 0; i < file->count; i++) {
        const st_entry *entry = &file->entries[i];
        if (entry->begin != expected) {
            qmm_printable(entry->name, strlen(entry->name), second, sizeof second);
            if (!previous)
                return qmm_error(QMM_ERR_CORRUPT,
                                 "safetensors tensor \"%s\" begins at %zu, leaving bytes [0, %zu) of the data area to no "
                                 "tensor; offsets must tile the data area",
                                 second, entry->begin, entry->begin);
            return qmm_error(QMM_ERR_CORRUPT,
                             "safetensors tensors \"%s\" [%zu, %zu) and \"%s\" [%zu, %zu) are not adjacent: bytes "
                             "[%zu, %zu) belong to no tensor; offsets must tile the data area",
                             qmm_printable(previous->name, strlen(previous->name), first, sizeof first),
                             previous->begin, previous->end, second, entry->begin, entry->end,
                             entry->begin > expected ? expected : entry->begin,
                             entry->begin > expected ? entry->begin : expected);
        }
        expected = entry->end;
        previous = entry;
    }
    if (expected != file->data_size) {
        if (!previous)
            return qmm_error(QMM_ERR_CORRUPT,
                             "safetensors file has no tensor but %zu bytes of data; offsets must tile the data area",
                             file->data_size);
        return qmm_error(QMM_ERR_CORRUPT,
                         "safetensors data area has %zu bytes after the last tensor \"%s\" [%zu, %zu); offsets must "
                         "tile the data area",
                         file->data_size - expected,
                         qmm_printable(previous->name, strlen(previous->name), first, sizeof first), previous->begin,
                         previous->end);
    }
    return QMM_OK;
}

static qmm_status parse_header(qmm_safetensors *file, const uint8_t *bytes, size_t size) {
    qmm_status status = QMM_OK;
    cJSON *root = NULL;
    qmm_io_span *spans = NULL;
    char printable[QMM_PRINTABLE_SIZE];

    if (size < 8)
        return qmm_error(QMM_ERR_CORRUPT, "safetensors file is %zu bytes, shorter than its 8-byte header length", size);
    uint64_t header_length = qmm_le64(bytes);
    if (header_length > size - 8)
        return qmm_error(QMM_ERR_CORRUPT,
                         "safetensors header length %llu is past the end of the file (%zu bytes after the length): "
                         "not a safetensors file, or a truncated one",
                         (unsigned long long)header_length, size - 8);
    if (header_length > SAFETENSORS_MAX_HEADER)
        return qmm_error(QMM_ERR_CORRUPT, "safetensors header length %llu exceeds the 100 MB limit",
                         (unsigned long long)header_length);
    size_t length = (size_t)header_length;
    file->data = bytes + 8 + length;
    file->data_size = size - 8 - length;

    /* The header is not NUL-terminated in the file; the parser works on a terminated private copy. */
    if ((status = qmm_io_parse_json("safetensors header", (const char *)bytes + 8, length, &root)) != QMM_OK)
        goto cleanup;
    if (!cJSON_IsObject(root)) {
        status = qmm_error(QMM_ERR_CORRUPT, "safetensors header is %s; it must be a JSON object", qmm_io_json_kind(root));
        goto cleanup;
    }

    size_t members = (size_t)cJSON_GetArraySize(root);
    file->entries = calloc(members ? members : 1, sizeof(st_entry));
    file->by_name = calloc(members ? members : 1, sizeof(qmm_io_name));
    if (!file->entries || !file->by_name) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate %zu tensor entries", members);
        goto cleanup;
    }
    bool have_metadata = false;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        const char *name = item->string ? item->string : "";
        size_t name_length = strlen(name);
        if (strcmp(name, "__metadata__") == 0) {
            if (have_metadata) {
                status = qmm_error(QMM_ERR_CORRUPT, "safetensors header has \"__metadata__\" twice");
                goto cleanup;
            }
            have_metadata = true;
            if (cJSON_IsNull(item)) continue; /* mlx.core.save_safetensors writes null when there is none */
            status = parse_metadata(file, item);
            if (status != QMM_OK) goto cleanup;
            continue;
        }
        if (!qmm_io_utf8_valid(name, name_length)) {
            status = qmm_error(QMM_ERR_CORRUPT, "safetensors tensor name \"%s\" is not valid UTF-8",
                               qmm_printable(name, name_length, printable, sizeof printable));
            goto cleanup;
        }
        st_entry *entry = &file->entries[file->count];
        status = parse_tensor(file, name, item, entry);
        if (status != QMM_OK) goto cleanup;
        entry->name = strdup(name);
        if (!entry->name) {
            status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot copy a tensor name");
            goto cleanup;
        }
        file->count++;
    }

    qsort(file->entries, file->count, sizeof(st_entry), compare_entry_offsets);
    spans = malloc((file->count ? file->count : 1) * sizeof(qmm_io_span));
    if (!spans) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the spans of %zu tensors", file->count);
        goto cleanup;
    }
    for (size_t i = 0; i < file->count; i++) {
        const st_entry *entry = &file->entries[i];
        spans[i] = (qmm_io_span){entry->begin, entry->end, entry->name};
        file->by_name[i] = (qmm_io_name){entry->name, i};
    }
    if ((status = qmm_io_check_spans(spans, file->count, "safetensors tensors")) != QMM_OK) goto cleanup;
    if ((status = check_tiling(file)) != QMM_OK) goto cleanup;
    if ((status = qmm_io_sort_unique(file->by_name, file->count, QMM_ERR_CORRUPT, "safetensors tensor name")) != QMM_OK)
        goto cleanup;
    /* Last, where every value has passed (2.5, -2, 1e300 are refused above, naming their field): a whole number of
     * shape or data_offsets written with a fraction, an exponent, a sign or a leading zero */
    static const char *const counts[] = {"shape", "data_offsets"};
    size_t number_start, number_end;
    if (qmm_io_json_find_non_integer((const char *)bytes + 8, length, counts, 2, NULL, 0, &number_start, &number_end))
        status = qmm_error(QMM_ERR_CORRUPT,
                           "safetensors header: the number %s at byte %zu is not written as an unsigned integer; "
                           "shape and data_offsets must hold digits only, without a leading zero",
                           qmm_printable((const char *)bytes + 8 + number_start, number_end - number_start, printable,
                                         sizeof printable),
                           number_start);
cleanup:
    free(spans);
    cJSON_Delete(root);
    return status;
}

qmm_status qmm_safetensors_open_memory(const void *bytes, size_t size, qmm_safetensors **file) {
    if (!file) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_safetensors_open_memory: file is NULL");
    *file = NULL;
    if (!bytes && size > 0) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_safetensors_open_memory: bytes is NULL");
    qmm_safetensors *result = calloc(1, sizeof *result);
    if (!result) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a safetensors handle");
    qmm_status status = parse_header(result, bytes, size);
    if (status != QMM_OK) {
        qmm_safetensors_close(result);
        return status;
    }
    *file = result;
    return QMM_OK;
}

qmm_status qmm_safetensors_open(const char *path, qmm_safetensors **file) {
    if (!file) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_safetensors_open: file is NULL");
    *file = NULL;
    if (!path) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_safetensors_open: path is NULL");
    qmm_safetensors *result = calloc(1, sizeof *result);
    if (!result) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a safetensors handle");
    qmm_status status = qmm_io_map_file(path, &result->mapping);
    if (status == QMM_ERR_NOT_FOUND) status = QMM_ERR_IO; /* the contract: a missing file is an I/O error */
    if (status == QMM_OK) {
        status = parse_header(result, result->mapping.base, result->mapping.size);
        /* Prefix the file so a checkpoint with many shards says which one is bad (qmm_error formats
         * into a local buffer first, so the last error may be one of its arguments). */
        char shown[QMM_IO_PATH_SHOWN]; /* printable: a shard's name comes from the index or the listing */
        if (status != QMM_OK) qmm_error(status, "%s: %s", qmm_printable(path, strlen(path), shown, sizeof shown),
                                        qmm_last_error());
    }
    if (status != QMM_OK) {
        qmm_safetensors_close(result);
        return status;
    }
    *file = result;
    return QMM_OK;
}

size_t qmm_safetensors_count(const qmm_safetensors *file) { return file ? file->count : 0; }

static void fill_tensor(const qmm_safetensors *file, const st_entry *entry, qmm_tensor *tensor) {
    memset(tensor, 0, sizeof *tensor);
    tensor->name = entry->name;
    tensor->dtype = entry->dtype;
    tensor->ndim = entry->ndim;
    for (int d = 0; d < entry->ndim; d++)
        tensor->shape[d] = entry->shape[d];
    tensor->data = file->data + entry->begin;
    tensor->nbytes = entry->end - entry->begin;
}

qmm_status qmm_safetensors_get(const qmm_safetensors *file, size_t index, qmm_tensor *tensor) {
    if (!file || !tensor) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_safetensors_get: null argument");
    if (index >= file->count)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "tensor index %zu is out of range (the file has %zu tensors)", index,
                         file->count);
    fill_tensor(file, &file->entries[index], tensor);
    return QMM_OK;
}

static const char *entry_name_by_name(const void *context, size_t i) {
    const qmm_safetensors *file = context;
    return file->by_name[i].name;
}

static const char *metadata_key_at(const void *context, size_t i) {
    return ((const qmm_safetensors *)context)->metadata_keys[i];
}

qmm_status qmm_safetensors_find(const qmm_safetensors *file, const char *name, qmm_tensor *tensor) {
    if (!file || !name || !tensor) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_safetensors_find: null argument");
    size_t position = qmm_io_find_sorted(file, file->count, entry_name_by_name, name);
    if (position != QMM_IO_NOT_FOUND) {
        fill_tensor(file, &file->entries[file->by_name[position].index], tensor);
        return QMM_OK;
    }
    char printable[QMM_PRINTABLE_SIZE];
    return qmm_error(QMM_ERR_NOT_FOUND, "no tensor named \"%s\" in the safetensors file",
                     qmm_printable(name, strlen(name), printable, sizeof printable));
}

const char *qmm_safetensors_metadata(const qmm_safetensors *file, const char *key) {
    if (!file || !key) return NULL;
    size_t position = qmm_io_find_sorted(file, file->metadata_count, metadata_key_at, key);
    return position == QMM_IO_NOT_FOUND ? NULL : file->metadata_values[position];
}

/* ───────────────────────────── writer ───────────────────────────── */

/* A tensor's place in the data area: larger elements first (stable by caller order), so every offset
 * is a multiple of its element size, since all sizes are powers of two and the data area starts
 * 8-aligned (the header is padded). */
typedef struct write_slot {
    size_t element_size, index;
} write_slot;
static int compare_write_order(const void *a, const void *b) {
    const write_slot *x = a, *y = b;
    if (x->element_size != y->element_size) return x->element_size > y->element_size ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index ? 1 : 0);
}

static qmm_status validate_write(const qmm_tensor *tensors, size_t count, const char *const *metadata_keys,
                                 const char *const *metadata_values, size_t metadata_count) {
    char printable[QMM_PRINTABLE_SIZE];
    if (count > 0 && !tensors) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_safetensors_write: tensors is NULL");
    if (metadata_count > 0 && (!metadata_keys || !metadata_values))
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_safetensors_write: metadata arrays are NULL");
    for (size_t i = 0; i < count; i++) {
        const qmm_tensor *t = &tensors[i];
        if (!t->name || !t->name[0]) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "tensor %zu has no name", i);
        qmm_printable(t->name, strlen(t->name), printable, sizeof printable);
        if (!qmm_io_utf8_valid(t->name, strlen(t->name)))
            return qmm_error(QMM_ERR_INVALID_ARGUMENT, "tensor name \"%s\" is not valid UTF-8", printable);
        if (strcmp(t->name, "__metadata__") == 0)
            return qmm_error(QMM_ERR_INVALID_ARGUMENT, "tensor name \"__metadata__\" is reserved by safetensors");
        if (!qmm_safetensors_dtype_string(t->dtype))
            return qmm_error(QMM_ERR_INVALID_ARGUMENT, "tensor \"%s\" has unknown dtype %d", printable, (int)t->dtype);
        if (t->ndim < 0 || t->ndim > QMM_MAX_DIMS)
            return qmm_error(QMM_ERR_SHAPE, "tensor \"%s\" has ndim=%d; it must be in [0, %d]", printable, t->ndim,
                             QMM_MAX_DIMS);
        size_t bytes = qmm_dtype_size(t->dtype);
        bool overflow = false, zero = false;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || (double)t->shape[d] > JSON_MAX_EXACT_INTEGER)
                return qmm_error(QMM_ERR_SHAPE, "tensor \"%s\": shape[%d]=%lld is outside [0, 2^53]", printable, d,
                                 (long long)t->shape[d]);
            if (!qmm_mul_size(bytes, (size_t)t->shape[d], &bytes)) overflow = true;
            if (t->shape[d] == 0) zero = true;
        }
        if (zero) bytes = 0; /* a zero dimension: no bytes, however large the others */
        else if (overflow)
            return qmm_error(QMM_ERR_SHAPE, "tensor \"%s\": the byte size of its shape overflows size_t", printable);
        if (bytes != t->nbytes)
            return qmm_error(QMM_ERR_SHAPE, "tensor \"%s\": nbytes=%zu but dtype %s × shape needs %zu bytes", printable,
                             t->nbytes, qmm_dtype_name(t->dtype), bytes);
        if (bytes > 0 && !t->data) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "tensor \"%s\" has no data", printable);
    }
    for (size_t i = 0; i < metadata_count; i++) {
        if (!metadata_keys[i] || !metadata_values[i])
            return qmm_error(QMM_ERR_INVALID_ARGUMENT, "metadata entry %zu has a NULL key or value", i);
        if (!qmm_io_utf8_valid(metadata_keys[i], strlen(metadata_keys[i])) ||
            !qmm_io_utf8_valid(metadata_values[i], strlen(metadata_values[i])))
            return qmm_error(QMM_ERR_INVALID_ARGUMENT, "metadata entry \"%s\" is not valid UTF-8",
                             qmm_printable(metadata_keys[i], strlen(metadata_keys[i]), printable, sizeof printable));
    }
    return QMM_OK;
}

/* Streams the file for arguments that validate_write accepted. */
static qmm_status write_validated(qmm_atomic_file *out, const qmm_tensor *tensors, size_t count,
                                  const char *const *metadata_keys, const char *const *metadata_values,
                                  size_t metadata_count) {
    qmm_status status = QMM_OK;
    write_slot *order = NULL;
    qmm_io_name *names = NULL;
    cJSON *root = NULL;
    char *json = NULL;
    uint8_t *header = NULL;

    size_t name_slots = count > metadata_count ? count : metadata_count;
    order = malloc((count ? count : 1) * sizeof(write_slot));
    names = malloc((name_slots ? name_slots : 1) * sizeof(qmm_io_name));
    if (!order || !names) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate the write order of %zu tensors", count);
        goto cleanup;
    }
    for (size_t i = 0; i < count; i++)
        names[i] = (qmm_io_name){tensors[i].name, i};
    if ((status = qmm_io_sort_unique(names, count, QMM_ERR_INVALID_ARGUMENT, "tensor name")) != QMM_OK) goto cleanup;
    for (size_t i = 0; i < metadata_count; i++)
        names[i] = (qmm_io_name){metadata_keys[i], i};
    if ((status = qmm_io_sort_unique(names, metadata_count, QMM_ERR_INVALID_ARGUMENT, "metadata key")) != QMM_OK)
        goto cleanup;

    for (size_t i = 0; i < count; i++)
        order[i] = (write_slot){qmm_dtype_size(tensors[i].dtype), i};
    qsort(order, count, sizeof(write_slot), compare_write_order);

    root = cJSON_CreateObject();
    if (!root) goto out_of_memory;
    if (metadata_count > 0) {
        cJSON *metadata = cJSON_AddObjectToObject(root, "__metadata__");
        if (!metadata) goto out_of_memory;
        for (size_t i = 0; i < metadata_count; i++)
            if (!cJSON_AddStringToObject(metadata, metadata_keys[i], metadata_values[i])) goto out_of_memory;
    }
    size_t offset = 0;
    for (size_t k = 0; k < count; k++) {
        const qmm_tensor *t = &tensors[order[k].index];
        size_t end;
        if (!qmm_add_size(offset, t->nbytes, &end) || (double)end > JSON_MAX_EXACT_INTEGER) {
            status = qmm_error(QMM_ERR_INVALID_ARGUMENT, "the tensors' total size exceeds 2^53 bytes");
            goto cleanup;
        }
        cJSON *entry = cJSON_AddObjectToObject(root, t->name);
        if (!entry || !cJSON_AddStringToObject(entry, "dtype", qmm_safetensors_dtype_string(t->dtype)))
            goto out_of_memory;
        cJSON *shape = cJSON_AddArrayToObject(entry, "shape");
        if (!shape) goto out_of_memory;
        for (int d = 0; d < t->ndim; d++) {
            cJSON *dim = exact_integer((uint64_t)t->shape[d]);
            if (!dim || !cJSON_AddItemToArray(shape, dim)) {
                cJSON_Delete(dim);
                goto out_of_memory;
            }
        }
        cJSON *offsets = cJSON_AddArrayToObject(entry, "data_offsets");
        if (!offsets) goto out_of_memory;
        const size_t span[2] = {offset, end};
        for (int i = 0; i < 2; i++) {
            cJSON *at = exact_integer((uint64_t)span[i]);
            if (!at || !cJSON_AddItemToArray(offsets, at)) {
                cJSON_Delete(at);
                goto out_of_memory;
            }
        }
        offset = end;
    }
    json = cJSON_PrintUnformatted(root);
    if (!json) goto out_of_memory;
    size_t json_length = strlen(json);
    /* Pad with spaces to a multiple of 8 so the data area is 8-byte aligned in a mapping. */
    size_t padded = (json_length + 7) & ~(size_t)7;
    header = malloc(8 + padded);
    if (!header) goto out_of_memory;
    for (int b = 0; b < 8; b++)
        header[b] = (uint8_t)((uint64_t)padded >> (8 * b));
    memcpy(header + 8, json, json_length);
    memset(header + 8 + json_length, ' ', padded - json_length);
    if ((status = qmm_atomic_write(out, header, 8 + padded)) != QMM_OK) goto cleanup;
    for (size_t k = 0; k < count; k++) {
        const qmm_tensor *t = &tensors[order[k].index];
        if (t->nbytes && (status = qmm_atomic_write(out, t->data, t->nbytes)) != QMM_OK) goto cleanup;
    }
    goto cleanup;
out_of_memory:
    status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot build the safetensors header");
cleanup:
    free(header);
    cJSON_free(json);
    cJSON_Delete(root);
    free(names);
    free(order);
    return status;
}

qmm_status qmm_safetensors_write_to(qmm_atomic_file *out, const qmm_tensor *tensors, size_t count,
                                    const char *const *metadata_keys, const char *const *metadata_values,
                                    size_t metadata_count) {
    qmm_status status = validate_write(tensors, count, metadata_keys, metadata_values, metadata_count);
    if (status != QMM_OK) return status;
    return write_validated(out, tensors, count, metadata_keys, metadata_values, metadata_count);
}

qmm_status qmm_safetensors_write(const char *path, const qmm_tensor *tensors, size_t count,
                                 const char *const *metadata_keys, const char *const *metadata_values,
                                 size_t metadata_count) {
    if (!path || !path[0]) return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_safetensors_write: path is empty");
    /* Validate before creating anything, so bad arguments leave the directory untouched. */
    qmm_status status = validate_write(tensors, count, metadata_keys, metadata_values, metadata_count);
    if (status != QMM_OK) return status;
    qmm_atomic_file out;
    if ((status = qmm_atomic_begin(&out, path)) != QMM_OK) return status;
    status = write_validated(&out, tensors, count, metadata_keys, metadata_values, metadata_count);
    if (status == QMM_OK) status = qmm_atomic_finish(&out);
    if (status == QMM_OK) status = qmm_atomic_rename(&out);
    qmm_atomic_abort(&out);
    return status;
}
