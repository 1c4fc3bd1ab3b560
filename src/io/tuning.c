/*
 * tuning.c — reads a measured tuning table (what `qmm tune` writes; docs/kernels.md §4, "The tuning
 * table") into the sorted, name-resolved form the selector reads (src/core/kernel.h, src/select.c).
 *
 *   {"format": "qmm-tuning", "version": 1, "backend": "cpu", "device": "AMD EPYC 9B14",
 *    "entries": [{"op": "qmm_t", "dtype": "f32", "bits": 4, "group_size": 64, "N": 4096, "K": 4096,
 *                 "m_min": 1, "m_max": 8, "kernel": "cpu.qmm_t.gemv.r4.avx512", "device": optional}, ...]}
 *
 * Members not named here (qmm tune writes "us", "default_kernel", "command", ...) are read by people, not
 * by the library, and ignored. Every rule broken is QMM_ERR_CORRUPT naming the file, the entry and the rule.
 * Here is the policy, with its reasons:
 *   - another backend: refused (QMM_ERR_UNSUPPORTED). Its kernel names mean nothing here, and loading it
 *     by mistake should be loud.
 *   - another device (the file's "device", or an entry's own): the entry is set aside and counted. A file
 *     may carry tables of several GPUs of one backend; a table measured on another model is not this
 *     device's measurement and is not applied.
 *   - a kernel name this build does not register: set aside and counted (a kernel renamed or removed
 *     since the table was made must not stop a program from starting; the count says it happened).
 *   - a registered kernel of another op than the entry's: refused (an entry that cannot be right).
 *   - entries of one key whose M ranges overlap: refused (the answer would depend on the file's order).
 */
#include "kernel.h"
#include "io_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whole numbers a double represents exactly. */
#define MAX_WHOLE 9007199254740992.0 /* 2^53 */

static qmm_status corrupt_entry(const char *origin, size_t index, const char *rule) {
    return qmm_error(QMM_ERR_CORRUPT, "tuning table '%s': entries[%zu]: %s", origin, index, rule);
}

/* entries[index].name as a whole number in [1, 2^53]. */
static qmm_status entry_size(const cJSON *entry, const char *name, const char *origin, size_t index, size_t *value) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(entry, name);
    char rule[160];
    if (!item) {
        snprintf(rule, sizeof rule, "\"%s\" is missing", name);
        return corrupt_entry(origin, index, rule);
    }
    double number = cJSON_IsNumber(item) ? item->valuedouble : NAN;
    /* below 2^53: a larger integer may be a rounded neighbour (JSON numbers are doubles in cJSON) */
    if (!(number >= 1.0 && number < MAX_WHOLE && floor(number) == number) || number > (double)SIZE_MAX) {
        /* the value as JSON, printable (cJSON keeps U+009B); a number past the double range (1e400) cJSON prints as null */
        const bool huge = cJSON_IsNumber(item) && isinf(number);
        char *printed = huge ? NULL : cJSON_PrintUnformatted(item), shown[64];
        snprintf(rule, sizeof rule, "\"%s\": %s is not a whole number from 1 to 2^53 - 1", name,
                 huge      ? "a number beyond the double range"
                 : printed ? qmm_printable(printed, strlen(printed), shown, sizeof shown)
                           : "?");
        cJSON_free(printed);
        return corrupt_entry(origin, index, rule);
    }
    *value = (size_t)number;
    return QMM_OK;
}

/* entries[index].name as a string (or NULL when optional and absent). */
static qmm_status entry_string(const cJSON *entry, const char *name, int required, const char *origin, size_t index,
                               const char **value) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(entry, name);
    char rule[160];
    *value = NULL;
    if (!item && !required) return QMM_OK;
    if (!item) {
        snprintf(rule, sizeof rule, "\"%s\" is missing", name);
        return corrupt_entry(origin, index, rule);
    }
    if (!cJSON_IsString(item) || !item->valuestring[0]) {
        snprintf(rule, sizeof rule, "\"%s\" must be a non-empty string", name);
        return corrupt_entry(origin, index, rule);
    }
    *value = item->valuestring;
    return QMM_OK;
}

/* One entry into *out; *use = 0 when it is set aside (another device, an unknown kernel). */
static qmm_status parse_entry(const cJSON *entry, size_t index, const char *origin, const char *file_device,
                              const char *device, const qmm_kernel *const *table, size_t count,
                              qmm_tuning_entry *out, int *use, qmm_tuning_ignored *ignored) {
    char rule[320], shown[QMM_PRINTABLE_SIZE]; /* a string from the file, printable (an escape escaped) */
    const char *op_text, *dtype_text, *kernel, *entry_device;
    size_t bits, group_size;
    qmm_status status;
    *use = 0;
    if (!cJSON_IsObject(entry)) return corrupt_entry(origin, index, "is not an object");
    static const char *const keys[] = {"op", "dtype", "bits", "group_size", "N", "K", "m_min", "m_max", "kernel", "device"};
    char what[QMM_PRINTABLE_SIZE + 64];
    snprintf(what, sizeof what, "tuning table '%s': entries[%zu]", origin, index);
    if ((status = qmm_io_json_keys_once(entry, keys, sizeof keys / sizeof keys[0], what)) != QMM_OK) return status;
    if ((status = entry_string(entry, "op", 1, origin, index, &op_text)) != QMM_OK) return status;
    if (strcmp(op_text, "qmm_t") == 0) out->op = QMM_OP_QMM_T;
    else if (strcmp(op_text, "qmm_n") == 0) out->op = QMM_OP_QMM_N;
    else {
        snprintf(rule, sizeof rule, "op \"%s\" is not qmm_t or qmm_n",
                 qmm_printable(op_text, strlen(op_text), shown, sizeof shown));
        return corrupt_entry(origin, index, rule);
    }
    if ((status = entry_string(entry, "dtype", 1, origin, index, &dtype_text)) != QMM_OK) return status;
    qmm_dtype dtype; /* qmm tune writes the short names; the long ones (float16, ...) are accepted too */
    if (qmm_dtype_parse(dtype_text, &dtype) == QMM_OK && qmm_is_float_dtype(dtype)) out->dtype = dtype;
    else {
        snprintf(rule, sizeof rule, "dtype \"%s\" is not f32, f16 or bf16 (or float32, float16, bfloat16)",
                 qmm_printable(dtype_text, strlen(dtype_text), shown, sizeof shown));
        return corrupt_entry(origin, index, rule);
    }
    if ((status = entry_size(entry, "bits", origin, index, &bits)) != QMM_OK) return status;
    if ((status = entry_size(entry, "group_size", origin, index, &group_size)) != QMM_OK) return status;
    if (bits > 64 || group_size > 1024 || qmm_format_validate((int)bits, (int)group_size) != QMM_OK) {
        snprintf(rule, sizeof rule, "bits=%zu, group_size=%zu: bits must be one of 2, 3, 4, 5, 6, 8 and group_size "
                 "one of 32, 64, 128", bits, group_size);
        return corrupt_entry(origin, index, rule);
    }
    out->bits = (int)bits;
    out->group_size = (int)group_size;
    if ((status = entry_size(entry, "N", origin, index, &out->N)) != QMM_OK) return status;
    if ((status = entry_size(entry, "K", origin, index, &out->K)) != QMM_OK) return status;
    const size_t quantized = out->op == QMM_OP_QMM_T ? out->K : out->N;
    if (quantized % group_size != 0) {
        snprintf(rule, sizeof rule, "%s=%zu is not a multiple of group_size=%zu (the quantized dimension of %s)",
                 out->op == QMM_OP_QMM_T ? "K" : "N", quantized, group_size, op_text);
        return corrupt_entry(origin, index, rule);
    }
    if ((status = entry_size(entry, "m_min", origin, index, &out->m_min)) != QMM_OK) return status;
    if ((status = entry_size(entry, "m_max", origin, index, &out->m_max)) != QMM_OK) return status;
    if (out->m_min > out->m_max) {
        snprintf(rule, sizeof rule, "m_min=%zu is greater than m_max=%zu (the range is [m_min, m_max])", out->m_min,
                 out->m_max);
        return corrupt_entry(origin, index, rule);
    }
    if ((status = entry_string(entry, "kernel", 1, origin, index, &kernel)) != QMM_OK) return status;
    if ((status = entry_string(entry, "device", 0, origin, index, &entry_device)) != QMM_OK) return status;
    if (strcmp(entry_device ? entry_device : file_device, device) != 0) {
        ignored->other_device++;
        return QMM_OK;
    }
    out->row = NULL;
    for (size_t i = 0; i < count && !out->row; i++)
        if (strcmp(table[i]->info.name, kernel) == 0) out->row = table[i];
    if (!out->row) {
        ignored->unknown_kernel++;
        return QMM_OK;
    }
    if (out->row->info.op != out->op) {
        snprintf(rule, sizeof rule, "kernel %.100s computes %s, the entry's op is %s", kernel,
                 qmm_op_name(out->row->info.op), op_text);
        return corrupt_entry(origin, index, rule);
    }
    *use = 1;
    return QMM_OK;
}

static int compare_entries(const void *a, const void *b) { return qmm_tuning_compare(a, b); }

qmm_status qmm_tuning_parse(const char *json, size_t size, const char *origin, qmm_backend backend,
                            const char *device, const qmm_kernel *const *table, size_t count,
                            qmm_tuning_table *tuning, qmm_tuning_ignored *ignored) {
    if (!json || !origin || !device || !table || !tuning || !ignored)
        return qmm_error(QMM_ERR_INVALID_ARGUMENT, "qmm_tuning_parse: null argument");
    memset(tuning, 0, sizeof *tuning);
    memset(ignored, 0, sizeof *ignored);
    qmm_status status = QMM_OK;
    qmm_tuning_entry *entries = NULL;
    cJSON *root = NULL;
    char what[QMM_PRINTABLE_SIZE + 32];
    snprintf(what, sizeof what, "tuning table '%s'", origin);
    /* the shared reader: not JSON, data after the value (two tables one after the other would load the first
     * silently), a string holding a NUL byte (cJSON would cut a kernel or shape name there) — all QMM_ERR_CORRUPT */
    if ((status = qmm_io_parse_json(what, json, size, &root)) != QMM_OK) goto cleanup;
    if (!cJSON_IsObject(root)) {
        status = qmm_error(QMM_ERR_CORRUPT, "tuning table '%s': the top level must be a JSON object", origin);
        goto cleanup;
    }
    static const char *const top_keys[] = {"format", "version", "backend", "device", "entries"};
    if ((status = qmm_io_json_keys_once(root, top_keys, sizeof top_keys / sizeof top_keys[0], what)) != QMM_OK)
        goto cleanup;
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(format) || strcmp(format->valuestring, "qmm-tuning") != 0) {
        status = qmm_error(QMM_ERR_CORRUPT, "tuning table '%s': \"format\" must be \"qmm-tuning\" (what qmm tune writes)",
                           origin);
        goto cleanup;
    }
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (!cJSON_IsNumber(version)) {
        status = qmm_error(QMM_ERR_CORRUPT, "tuning table '%s': \"version\" must be a number", origin);
        goto cleanup;
    }
    if (version->valuedouble != 1.0) {
        /* %.17g: every double that is not 1 prints as something other than 1 (%g's 6 digits gave "1" for 1.0000001) */
        status = qmm_error(QMM_ERR_UNSUPPORTED, "tuning table '%s' has version %.17g; this libqmm reads version 1",
                           origin, version->valuedouble);
        goto cleanup;
    }
    const cJSON *file_backend = cJSON_GetObjectItemCaseSensitive(root, "backend");
    const cJSON *file_device = cJSON_GetObjectItemCaseSensitive(root, "device");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "entries");
    if (!cJSON_IsString(file_backend) || !file_backend->valuestring[0] || !cJSON_IsString(file_device) ||
        !file_device->valuestring[0] || !cJSON_IsArray(list)) {
        status = qmm_error(QMM_ERR_CORRUPT, "tuning table '%s': wants \"backend\" and \"device\" (non-empty strings) and "
                           "\"entries\" (an array)", origin);
        goto cleanup;
    }
    if (strcmp(file_backend->valuestring, qmm_backend_name(backend)) != 0) {
        char shown[QMM_PRINTABLE_SIZE]; /* from the file, printable */
        status = qmm_error(QMM_ERR_UNSUPPORTED, "tuning table '%s' was measured on backend \"%s\"; this context is "
                           "backend %s (a table applies only to the backend it was measured on)", origin,
                           qmm_printable(file_backend->valuestring, strlen(file_backend->valuestring), shown,
                                         sizeof shown),
                           qmm_backend_name(backend));
        goto cleanup;
    }
    const size_t total = (size_t)cJSON_GetArraySize(list);
    entries = calloc(total ? total : 1, sizeof *entries);
    if (!entries) {
        status = qmm_error(QMM_ERR_OUT_OF_MEMORY, "no memory for the %zu entries of tuning table '%s'", total, origin);
        goto cleanup;
    }
    size_t used = 0, index = 0;
    const cJSON *entry;
    cJSON_ArrayForEach(entry, list) {
        int use = 0;
        status = parse_entry(entry, index, origin, file_device->valuestring, device, table, count, &entries[used], &use,
                             ignored);
        if (status != QMM_OK) goto cleanup;
        used += (size_t)use;
        index++;
    }
    /* Sorted by key and m_min, an overlap is always between neighbours. Entries are reported by key, since
     * sorting lost their file positions. */
    qsort(entries, used, sizeof *entries, compare_entries);
    for (size_t i = 1; i < used; i++) {
        const qmm_tuning_entry *a = &entries[i - 1], *b = &entries[i];
        const int same_key = a->op == b->op && a->dtype == b->dtype && a->bits == b->bits &&
                             a->group_size == b->group_size && a->N == b->N && a->K == b->K;
        if (same_key && a->m_max >= b->m_min) {
            status = qmm_error(QMM_ERR_CORRUPT, "tuning table '%s': two entries for %s %s %d-bit gs%d N=%zu K=%zu overlap: "
                               "M [%zu, %zu] (%s) and [%zu, %zu] (%s); the M ranges of one shape must be disjoint",
                               origin, qmm_op_name(a->op), qmm_dtype_name(a->dtype), a->bits, a->group_size, a->N, a->K,
                               a->m_min, a->m_max, a->row->info.name, b->m_min, b->m_max, b->row->info.name);
            goto cleanup;
        }
    }
    tuning->entries = entries;
    tuning->count = used;
    entries = NULL;

cleanup:
    free(entries);
    cJSON_Delete(root);
    if (status != QMM_OK) memset(ignored, 0, sizeof *ignored);
    return status;
}
