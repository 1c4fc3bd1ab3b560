/* io_disabled.c — stands in for src/io/ when libqmm is built without cJSON (QMM_WITH_IO=OFF, or AUTO
 * with cJSON absent, e.g. on the lent GPU machine): every checkpoint function says so. */
#include "kernel.h"

#include <string.h>

#define QMM_NO_IO() qmm_error(QMM_ERR_UNSUPPORTED, "libqmm was built without checkpoint I/O (configured with QMM_WITH_IO=OFF, or cJSON was not found)")

qmm_status qmm_safetensors_open(const char *path, qmm_safetensors **file) { (void)path; if (file) *file = NULL; return QMM_NO_IO(); }
qmm_status qmm_safetensors_open_memory(const void *bytes, size_t size, qmm_safetensors **file) { (void)bytes; (void)size; if (file) *file = NULL; return QMM_NO_IO(); }
void qmm_safetensors_close(qmm_safetensors *file) { (void)file; }
size_t qmm_safetensors_count(const qmm_safetensors *file) { (void)file; return 0; }
qmm_status qmm_safetensors_get(const qmm_safetensors *file, size_t index, qmm_tensor *tensor) { (void)file; (void)index; (void)tensor; return QMM_NO_IO(); }
qmm_status qmm_safetensors_find(const qmm_safetensors *file, const char *name, qmm_tensor *tensor) { (void)file; (void)name; (void)tensor; return QMM_NO_IO(); }
const char *qmm_safetensors_metadata(const qmm_safetensors *file, const char *key) { (void)file; (void)key; return NULL; }
qmm_status qmm_safetensors_write(const char *path, const qmm_tensor *tensors, size_t count, const char *const *metadata_keys, const char *const *metadata_values, size_t metadata_count) { (void)path; (void)tensors; (void)count; (void)metadata_keys; (void)metadata_values; (void)metadata_count; return QMM_NO_IO(); }
qmm_status qmm_checkpoint_open(const char *dir, qmm_checkpoint **checkpoint) { (void)dir; if (checkpoint) *checkpoint = NULL; return QMM_NO_IO(); }
void qmm_checkpoint_close(qmm_checkpoint *checkpoint) { (void)checkpoint; }
size_t qmm_checkpoint_tensor_count(const qmm_checkpoint *checkpoint) { (void)checkpoint; return 0; }
qmm_status qmm_checkpoint_tensor(const qmm_checkpoint *checkpoint, size_t index, qmm_tensor *tensor) { (void)checkpoint; (void)index; (void)tensor; return QMM_NO_IO(); }
qmm_status qmm_checkpoint_find_tensor(const qmm_checkpoint *checkpoint, const char *name, qmm_tensor *tensor) { (void)checkpoint; (void)name; (void)tensor; return QMM_NO_IO(); }
size_t qmm_checkpoint_layer_count(const qmm_checkpoint *checkpoint) { (void)checkpoint; return 0; }
qmm_status qmm_checkpoint_layer(const qmm_checkpoint *checkpoint, size_t index, qmm_layer *layer) { (void)checkpoint; (void)index; (void)layer; return QMM_NO_IO(); }
qmm_status qmm_checkpoint_find_layer(const qmm_checkpoint *checkpoint, const char *name, qmm_layer *layer) { (void)checkpoint; (void)name; (void)layer; return QMM_NO_IO(); }
qmm_status qmm_checkpoint_default_format(const qmm_checkpoint *checkpoint, int *bits, int *group_size) { (void)checkpoint; (void)bits; (void)group_size; return QMM_NO_IO(); }
qmm_status qmm_config_parse(const char *json, size_t size, int *bits, int *group_size) { (void)json; (void)size; (void)bits; (void)group_size; return QMM_NO_IO(); }
qmm_status qmm_checkpoint_write(const char *dir, const qmm_tensor *tensors, size_t tensor_count, const qmm_layer *layers, size_t layer_count, const char *extra_config_json) { (void)dir; (void)tensors; (void)tensor_count; (void)layers; (void)layer_count; (void)extra_config_json; return QMM_NO_IO(); }
qmm_status qmm_checkpoint_quantize(const char *in_path, const char *out_dir, int bits, int group_size, qmm_convention convention, qmm_quantize_note note, void *user, qmm_quantize_summary *summary) { (void)in_path; (void)out_dir; (void)bits; (void)group_size; (void)convention; (void)note; (void)user; if (summary) memset(summary, 0, sizeof *summary); return QMM_NO_IO(); }
qmm_status qmm_gguf_open(const char *path, qmm_gguf **file) { (void)path; if (file) *file = NULL; return QMM_NO_IO(); }
qmm_status qmm_gguf_open_memory(const void *bytes, size_t size, qmm_gguf **file) { (void)bytes; (void)size; if (file) *file = NULL; return QMM_NO_IO(); }
void qmm_gguf_close(qmm_gguf *file) { (void)file; }
size_t qmm_gguf_tensor_count(const qmm_gguf *file) { (void)file; return 0; }
qmm_status qmm_gguf_tensor_info_get(const qmm_gguf *file, size_t index, qmm_gguf_tensor_info *info) { (void)file; (void)index; (void)info; return QMM_NO_IO(); }
qmm_status qmm_gguf_find(const qmm_gguf *file, const char *name, size_t *index) { (void)file; (void)name; (void)index; return QMM_NO_IO(); }
const char *qmm_gguf_metadata_string(const qmm_gguf *file, const char *key) { (void)file; (void)key; return NULL; }
qmm_status qmm_gguf_import(const qmm_gguf *file, size_t index, int *is_quantized, qmm_qmatrix *matrix, qmm_tensor *float_tensor) { (void)file; (void)index; (void)is_quantized; (void)matrix; (void)float_tensor; return QMM_NO_IO(); }
void qmm_gguf_import_free(qmm_qmatrix *matrix, qmm_tensor *float_tensor) { (void)matrix; (void)float_tensor; }
qmm_status qmm_gguf_convert(const char *gguf_path, const char *out_dir, const char *const *prefixes, size_t count) { (void)gguf_path; (void)out_dir; (void)prefixes; (void)count; return QMM_NO_IO(); }
qmm_status qmm_tuning_parse(const char *json, size_t size, const char *origin, qmm_backend backend, const char *device, const qmm_kernel *const *table, size_t count, qmm_tuning_table *tuning, qmm_tuning_ignored *ignored) {
    (void)json; (void)size; (void)backend; (void)device; (void)table; (void)count;
    if (tuning) memset(tuning, 0, sizeof *tuning);
    if (ignored) memset(ignored, 0, sizeof *ignored);
    return qmm_error(QMM_ERR_UNSUPPORTED, "cannot load tuning table '%s': libqmm was built without cJSON, which reads it", origin ? origin : "?");
}
