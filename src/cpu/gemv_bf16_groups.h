/*
 * gemv_bf16_groups.h — the bf16 dot-product GEMV blocks (gemv_bf16.h) of one (GR rows of x, GNW weight rows, GPARTS
 * parts of x) for each group size and code layout (GBYTES 0: 4-bit rows, 1: byte codes below 64); simd_kernels.h
 * defines GR, GNW and GPARTS, then includes this.
 */
#define GBYTES 0
#define GG 32
#include "gemv_bf16.h"
#define GG 64
#include "gemv_bf16.h"
#define GG 128
#include "gemv_bf16.h"
#undef GBYTES
#define GBYTES 1
#define GG 32
#include "gemv_bf16.h"
#define GG 64
#include "gemv_bf16.h"
#define GG 128
#include "gemv_bf16.h"
#undef GBYTES
#undef GR
#undef GNW
#undef GPARTS
