/*
 * fuzz_gguf.c — libFuzzer target: qmm_gguf_open_memory on arbitrary bytes, the info of every tensor,
 * find() by each name, and the import of every importable tensor of at most 1 MiB (a quantized import
 * must validate as a qmm_qmatrix and stay inside the input). A broken invariant aborts.
 */
#include "fuzz_message.h"
#include "qmm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qmm_gguf *file = NULL;
    qmm_status status = qmm_gguf_open_memory(data, size, &file);
    if (status != QMM_OK) {
        if (file != NULL) abort();
        fuzz_check_message();
        return 0;
    }
    (void)qmm_gguf_metadata_string(file, "general.architecture");
    volatile uint32_t sink = 0;
    for (size_t i = 0; i < qmm_gguf_tensor_count(file); i++) {
        qmm_gguf_tensor_info info;
        if (qmm_gguf_tensor_info_get(file, i, &info) != QMM_OK) abort();
        size_t index;
        if (qmm_gguf_find(file, info.name, &index) != QMM_OK || index != i) abort();
        if (!info.importable || info.nbytes > ((size_t)1 << 20) || info.nbytes > size) continue;
        int quantized = -1;
        qmm_qmatrix matrix;
        qmm_tensor tensor;
        status = qmm_gguf_import(file, i, &quantized, &matrix, &tensor);
        if (status == QMM_OK && quantized == 1) {
            if (qmm_qmatrix_validate(&matrix) != QMM_OK) abort();
            size_t words = matrix.rows * (matrix.cols * (size_t)matrix.bits / 32);
            for (size_t w = 0; w < words; w++)
                sink ^= matrix.w[w];
        } else if (status == QMM_OK) {
            if (quantized != 0 || tensor.nbytes != info.nbytes) abort();
            for (size_t b = 0; b < tensor.nbytes; b++)
                sink ^= ((const uint8_t *)tensor.data)[b];
        } else {
            fuzz_check_message();
        }
        qmm_gguf_import_free(&matrix, &tensor);
    }
    qmm_gguf_close(file);
    (void)sink;
    return 0;
}
