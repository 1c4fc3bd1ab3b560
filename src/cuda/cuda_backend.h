/*
 * cuda_backend.h — the CUDA backend's entry point for the runtime (src/core/runtime.c). Not installed.
 * Built only when CMake finds nvcc (QMM_HAVE_CUDA).
 */
#ifndef QMM_CUDA_BACKEND_H
#define QMM_CUDA_BACKEND_H

#include "kernel.h"

/* The CUDA backend's hooks and kernel table (src/cuda/cuda_backend.c). */
const qmm_backend_hooks *qmm_cuda_backend_hooks(void);

#endif /* QMM_CUDA_BACKEND_H */
