/*
 * fuzz_safetensors.c — libFuzzer target: qmm_safetensors_open_memory on arbitrary bytes, then a walk
 * over every tensor (each byte read, find() agreeing with get(), sizes consistent with the shape).
 * A broken invariant aborts, which libFuzzer reports like a crash.
 */
#include "fuzz_message.h"
#include "qmm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qmm_safetensors *file = NULL;
    qmm_status status = qmm_safetensors_open_memory(data, size, &file);
    if (status != QMM_OK) {
        if (file != NULL) abort(); /* failures: no handle, always a printable message */
        fuzz_check_message();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < qmm_safetensors_count(file); i++) {
        qmm_tensor t, found;
        if (qmm_safetensors_get(file, i, &t) != QMM_OK) abort();
        if (qmm_safetensors_find(file, t.name, &found) != QMM_OK || found.data != t.data || found.nbytes != t.nbytes)
            abort();
        size_t bytes = qmm_dtype_size(t.dtype);
        for (int d = 0; d < t.ndim; d++)
            bytes *= (size_t)t.shape[d]; /* validated: cannot overflow */
        if (bytes != t.nbytes) abort();
        const uint8_t *p = t.data;
        if (p < data || p + t.nbytes > data + size) abort();
        for (size_t b = 0; b < t.nbytes; b++)
            sink ^= p[b];
    }
    (void)qmm_safetensors_metadata(file, "format");
    qmm_tensor other;
    (void)qmm_safetensors_find(file, "model.layers.0.weight", &other);
    qmm_safetensors_close(file);
    (void)sink;
    return 0;
}
