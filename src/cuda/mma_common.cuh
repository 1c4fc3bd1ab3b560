/*
 * mma_common.cuh — device helpers shared by the CUDA kernel files (kernels.cu, kernels_tile.cu, kernels_wgmma.cu,
 * kernels_n.cu, kernels_ffma.cu): dtype loads and stores, the MLX bit stream, the f64 non-finite rule, the
 * tensor-core pieces of the mma families (exact code decoding into f16/bf16 A fragments, x pairing, mma.sync
 * m16n8k16, (scale, bias) widening) and the split-K helpers.
 * docs/kernels.md §9 describes the repacked layout these helpers read. Not installed.
 */
#ifndef QMM_MMA_COMMON_CUH
#define QMM_MMA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

/* ───────────────────────────── dtype helpers ───────────────────────────── */

__device__ __forceinline__ float load_f32(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float load_f32(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load_f32(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
/* One rounding to the output dtype, to nearest even; overflow gives ±inf, NaN stays NaN. */
__device__ __forceinline__ void store_f32(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f32(__half *p, size_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void store_f32(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* Code j of a packed row (LSB-first bit stream; 3/5/6-bit codes may straddle two words). */
__device__ __forceinline__ uint32_t code_at(const uint32_t *row, size_t j, int bits) {
    const size_t bit = j * (size_t)bits;
    const size_t word = bit >> 5;
    const unsigned shift = (unsigned)(bit & 31);
    uint64_t pair = row[word];
    if (shift + (unsigned)bits > 32) pair |= (uint64_t)row[word + 1] << 32;
    return (uint32_t)(pair >> shift) & ((1u << bits) - 1u);
}

/* The non-finite rule (docs/kernels.md §2) for one output of x·Ŵᵀ: Σ_k (s·q_k + b)·x_k in f64 — ŵ formed in
 * f64 (s·q exact, + b one rounding), f64 products and sum, which cannot overflow for f32 inputs — rounded
 * to f32. w_row, scales_row, biases_row: row n of the MLX-layout arrays; x_row: row m of x. */
template <typename T>
__device__ __noinline__ float direct_output_t(const T *x_row, const uint32_t *w_row, const T *scales_row,
                                              const T *biases_row, int bits, size_t K, int group_size) {
    double sum = 0.0;
    for (size_t k = 0; k < K; k++) {
        const double s = load_f32(scales_row, k / group_size), b = load_f32(biases_row, k / group_size);
        sum += (s * (double)code_at(w_row, k, bits) + b) * (double)load_f32(x_row, k);
    }
    return (float)sum;
}

/* The same for one output of x·Ŵ (Ŵ [K, N] quantized along N): column n, rows k of the arrays. */
template <typename T>
__device__ __noinline__ float direct_output_n(const T *x_row, const uint32_t *w, const T *scales, const T *biases,
                                              int bits, size_t N, size_t K, int group_size, size_t n) {
    const size_t words_per_row = N * (size_t)bits / 32, groups = N / (size_t)group_size, g = n / (size_t)group_size;
    double sum = 0.0;
    for (size_t k = 0; k < K; k++) {
        const double s = load_f32(scales, k * groups + g), b = load_f32(biases, k * groups + g);
        sum += (s * (double)code_at(w + k * words_per_row, n, bits) + b) * (double)load_f32(x_row, k);
    }
    return (float)sum;
}

/* (scale, bias) pairs per row and 64-byte super-block in the tiled layout the mma families read
 * (qmm_cuda_repack_sb, docs/kernels.md §9): the groups a super-block of 512/bits codes touches, at least one
 * (8-bit codes in groups of 128: a group spans two super-blocks, and its pair is stored with each). */
__host__ __device__ constexpr int sb_pairs_per_super_block(int bits, int group_size) {
    return 512 / bits / group_size > 1 ? 512 / bits / group_size : 1;
}
/* Where the pairs of row tile `tile` (16 rows) and super-block sbk start in that layout, in 16-byte units
 * (4 pairs; I: the kernel's offset type): [row tiles][super_blocks][16 rows][gsb] — every run is 4·gsb units. The kernels add the chunk
 * within the run; the host repack (qmm_cuda_repack_sb) multiplies by 4 for pairs. */
template <typename I> __host__ __device__ constexpr I sb_tiled_run(I tile, I super_blocks, I sbk, int gsb) {
    return (tile * super_blocks + sbk) * (I)(4 * gsb);
}

/* The repacked weights' tiled layout (qmm_cuda_repack, docs/kernels.md §9): [row tiles of 16][super-blocks][16 rows]
 * [4 quarters of 16 bytes], so that the 16 rows of a tile have each super-block in one contiguous 1 KB run (DRAM
 * pages are then opened for 1 KB, not for one row's 64 bytes). Where row n's super-block sbk starts, in 16-byte
 * units (I: the kernel's offset type; the host repack multiplies by 4 for words). */
template <typename I> __host__ __device__ constexpr I packed_tile_quad(I tile, I row, I super_blocks, I sbk) {
    return (tile * super_blocks + sbk) * 64 + row * 4; /* row `row` (0–15) of row tile `tile` */
}
template <typename I> __host__ __device__ constexpr I packed_tiled_quad(I n, I super_blocks, I sbk) {
    return packed_tile_quad<I>(n / 16, n % 16, super_blocks, sbk);
}

/* A 16-byte cp.async that keeps the data out of L1 (PTX ISA "cp.async", .cg): src to the shared address dst, or
 * zeros when !ok (src-size 0; src is then not read but must still be a valid address). */
__device__ __forceinline__ void cp_async_16(unsigned dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}

template <typename T> struct mma_traits;
template <> struct mma_traits<__half> {
    static constexpr uint32_t magic = 0x64006400u; /* 1024.0 in both halves */
    static constexpr uint32_t ones = 0x3C003C00u;  /* 1.0 */
    static constexpr float subnormal_scale = 16777216.0f; /* 2^24: a code c as the subnormal c·2^-24 */
};
template <> struct mma_traits<__nv_bfloat16> {
    static constexpr uint32_t magic = 0x43004300u; /* 128.0 */
    static constexpr uint32_t ones = 0x3F803F80u;  /* 1.0 */
};

__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t mask, uint32_t magic) {
    uint32_t r;
    /* (a & mask) | magic in one LOP3: LUT = (0xF0 & 0xCC) | 0xAA = 0xEA */
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(mask), "r"(magic));
    return r;
}

__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, __half) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, __nv_bfloat16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Pairs (2 codes) as exact f16/bf16 integers. */
__device__ __forceinline__ uint32_t sub_magic(uint32_t p, __half) {
    __half2 r = __hsub2(*reinterpret_cast<__half2 *>(&p), __halves2half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400)));
    return *reinterpret_cast<uint32_t *>(&r);
}
__device__ __forceinline__ uint32_t sub_magic(uint32_t p, __nv_bfloat16) {
    __nv_bfloat162 r = __hsub2(*reinterpret_cast<__nv_bfloat162 *>(&p),
                               __halves2bfloat162(__ushort_as_bfloat16(0x4300), __ushort_as_bfloat16(0x4300)));
    return *reinterpret_cast<uint32_t *>(&r);
}
/* (magic + 16·c)/16 − magic/16 = c, exact (one rounding of an exact integer). */
__device__ __forceinline__ uint32_t scale_sub_magic(uint32_t p, __half) {
    __half2 r = __hfma2(*reinterpret_cast<__half2 *>(&p), __float2half2_rn(1.0f / 16.0f), __float2half2_rn(-64.0f));
    return *reinterpret_cast<uint32_t *>(&r);
}

/* Decodes one lane's 8 codes of a block into the A-operand pairs q[0..3] (see the pairing above). */
template <int BITS, typename T> struct decode;
template <> struct decode<4, __half> {
    /* w: the lane's word of the block (codes c0..c7, 4 bits each). f16 has 10 mantissa bits, so the odd
     * codes can stay in place (1024 + 16·c) and be scaled down: two shifts fewer. */
    static __device__ __forceinline__ void run(const uint32_t *w, uint32_t q[4]) {
        const uint32_t magic = mma_traits<__half>::magic, hi = w[0] >> 8;
        q[0] = sub_magic(and_or(w[0], 0x000F000Fu, magic), __half());       /* c0, c4 */
        q[1] = scale_sub_magic(and_or(w[0], 0x00F000F0u, magic), __half()); /* c1, c5 */
        q[2] = sub_magic(and_or(hi, 0x000F000Fu, magic), __half());         /* c2, c6 */
        q[3] = scale_sub_magic(and_or(hi, 0x00F000F0u, magic), __half());   /* c3, c7 */
    }
};
template <> struct decode<4, __nv_bfloat16> {
    /* bf16 has 7 mantissa bits: 16·c would reach the exponent, so every code is shifted down to bits 0–3
     * of its half (128 + c, exact for c < 128). */
    static __device__ __forceinline__ void run(const uint32_t *w, uint32_t q[4]) {
        const uint32_t magic = mma_traits<__nv_bfloat16>::magic;
        q[0] = sub_magic(and_or(w[0], 0x000F000Fu, magic), __nv_bfloat16());       /* c0, c4 */
        q[1] = sub_magic(and_or(w[0] >> 4, 0x000F000Fu, magic), __nv_bfloat16());  /* c1, c5 */
        q[2] = sub_magic(and_or(w[0] >> 8, 0x000F000Fu, magic), __nv_bfloat16());  /* c2, c6 */
        q[3] = sub_magic(and_or(w[0] >> 12, 0x000F000Fu, magic), __nv_bfloat16()); /* c3, c7 */
    }
};
template <> struct decode<8, __half> {
    /* w[0..1]: codes c0..c3 and c4..c7, 8 bits each; 1024 + c < 2048 is exact in f16. */
    static __device__ __forceinline__ void run(const uint32_t *w, uint32_t q[4]) {
        const uint32_t magic = 0x64006400u;
        q[0] = sub_magic(and_or(w[0], 0x00FF00FFu, magic), __half());      /* c0, c2 */
        q[1] = sub_magic(and_or(w[0] >> 8, 0x00FF00FFu, magic), __half()); /* c1, c3 */
        q[2] = sub_magic(and_or(w[1], 0x00FF00FFu, magic), __half());      /* c4, c6 */
        q[3] = sub_magic(and_or(w[1] >> 8, 0x00FF00FFu, magic), __half()); /* c5, c7 */
    }
};
/* The 8-bit code in byte `byte` of a word as an exact f32 integer (2^23 + c − 2^23). */
__device__ __forceinline__ float byte_code(uint32_t word, int byte) {
    return __uint_as_float(0x4B000000u | ((word >> (8 * byte)) & 0xFFu)) - 8388608.0f;
}
template <> struct decode<8, __nv_bfloat16> {
    /* bf16 has 8 significant bits: 128 + c is not exact for c ≥ 128, so go through f32 (byte_code) and pack two
     * exact integers into bf16x2 (exact: c ≤ 255 has at most 8 significant bits). */
    static __device__ __forceinline__ uint32_t pair(uint32_t word, int lo_byte, int hi_byte) {
        __nv_bfloat162 r = __floats2bfloat162_rn(byte_code(word, lo_byte), byte_code(word, hi_byte));
        return *reinterpret_cast<uint32_t *>(&r);
    }
    static __device__ __forceinline__ void run(const uint32_t *w, uint32_t q[4]) {
        q[0] = pair(w[0], 0, 2);
        q[1] = pair(w[0], 1, 3);
        q[2] = pair(w[1], 0, 2);
        q[3] = pair(w[1], 1, 3);
    }
};

/* f16 only: the same pairs as decode<BITS, __half>, each code as an f16 subnormal (exponent field 0, the code's
 * bits in the mantissa) — no magic number to add or subtract. The tensor core multiplies subnormal f16
 * operands exactly (every product is ≥ 2^-48 in magnitude, an f32 normal), so the f32 result is an exact
 * power of two times that of the integer codes, which the caller folds into the scale (code_scale below).
 * 4-bit: every code lands at bits 4–7 of its half, as 16c·2^-24 = c·2^-20 (c1, c5 are there already; c0, c4
 * shift up by 4, c2, c6 down by 4, c3, c7 down by 8): three shifts and four ANDs per word, and x is used as it
 * is (no scaling of x, which could overflow f16). 8-bit: one byte permute per pair, c·2^-24. */
template <int BITS> struct decode_subnormal;
template <> struct decode_subnormal<4> {
    static __device__ __forceinline__ void run(const uint32_t *w, uint32_t q[4]) {
        q[0] = (w[0] << 4) & 0x00F000F0u; /* c0, c4 */
        q[1] = w[0] & 0x00F000F0u;        /* c1, c5 */
        q[2] = (w[0] >> 4) & 0x00F000F0u; /* c2, c6 */
        q[3] = (w[0] >> 8) & 0x00F000F0u; /* c3, c7 */
    }
    static constexpr float code_scale = 1048576.0f; /* 2^20 */
};
template <> struct decode_subnormal<8> {
    static __device__ __forceinline__ void run(const uint32_t *w, uint32_t q[4]) {
        q[0] = __byte_perm(w[0], 0u, 0x4240u); /* c0, c2: bytes 0 and 2, zero above each */
        q[1] = __byte_perm(w[0], 0u, 0x4341u); /* c1, c3 */
        q[2] = __byte_perm(w[1], 0u, 0x4240u); /* c4, c6 */
        q[3] = __byte_perm(w[1], 0u, 0x4341u); /* c5, c7 */
    }
    static constexpr float code_scale = mma_traits<__half>::subnormal_scale; /* 2^24 */
};

/* The decoding the mma kernels use: f16 codes as subnormals (decode_subnormal, no magic-number arithmetic),
 * bf16 codes through the magic number (decode: bf16 subnormals would underflow the f32 products). A segment's
 * Σq·x from the tensor cores times code_scale is the Σq·x of the integer codes, exactly (callers fold
 * code_scale into the scale: s·2^24 is exact in f32 for every f16 scale). */
template <int BITS, typename T> struct mma_decode {
    static __device__ __forceinline__ void run(const uint32_t *w, uint32_t q[4]) { decode<BITS, T>::run(w, q); }
    static constexpr float code_scale = 1.0f;
};
template <int BITS> struct mma_decode<BITS, __half> {
    static __device__ __forceinline__ void run(const uint32_t *w, uint32_t q[4]) { decode_subnormal<BITS>::run(w, q); }
    static constexpr float code_scale = decode_subnormal<BITS>::code_scale;
};

/* The A fragments of one 32-code block from a lane's words of rows g (wg) and g + 8 (wg8), decoded by
 * mma_decode: a[0] for the block's first k16 step, a[1] for its second, each in the register layout of
 * mma.sync m16n8k16 and of wgmma's register A (a0 = row g k{2t,2t+1}, a1 = row g+8 same k, a2 = row g
 * k{2t+8,2t+9}, a3 = row g+8), k in the pairing of decode<> (x_pairs gives the matching B). */
template <int BITS, typename T>
__device__ __forceinline__ void block_a_fragments(const uint32_t *wg, const uint32_t *wg8, uint32_t (&a)[2][4]) {
    uint32_t qa[4], qb[4];
    mma_decode<BITS, T>::run(wg, qa);
    mma_decode<BITS, T>::run(wg8, qb);
    a[0][0] = qa[0], a[0][1] = qb[0], a[0][2] = qa[1], a[0][3] = qb[1];
    a[1][0] = qa[2], a[1][1] = qb[2], a[1][2] = qa[3], a[1][3] = qb[3];
}

/* The lane's 8 x values (one 128-bit load, halves h0..h7) as the B-operand pairs matching decode<>. */
template <int BITS> __device__ __forceinline__ void x_pairs(uint4 v, uint32_t b[4]) {
    if (BITS == 4) { /* (h0,h4) (h1,h5) (h2,h6) (h3,h7) */
        b[0] = __byte_perm(v.x, v.z, 0x5410);
        b[1] = __byte_perm(v.x, v.z, 0x7632);
        b[2] = __byte_perm(v.y, v.w, 0x5410);
        b[3] = __byte_perm(v.y, v.w, 0x7632);
    } else { /* (h0,h2) (h1,h3) (h4,h6) (h5,h7) */
        b[0] = __byte_perm(v.x, v.y, 0x5410);
        b[1] = __byte_perm(v.x, v.y, 0x7632);
        b[2] = __byte_perm(v.z, v.w, 0x5410);
        b[3] = __byte_perm(v.z, v.w, 0x7632);
    }
}

/* Two f32 values a, b as P bf16x2 pairs, parts[0] = rn(·) and each next part the rounding of what the previous ones
 * left: the sum of the parts is a (low halves) and b (high halves) exactly when a and b have at most 8·P significant
 * bits and every part is a normal bf16 (the callers scale first so that they are). */
template <int P> __device__ __forceinline__ void split_bf16_parts(float a, float b, uint32_t (&parts)[P]) {
#pragma unroll
    for (int p = 0; p < P; p++) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        parts[p] = *reinterpret_cast<uint32_t *>(&h);
        if (p + 1 < P) a -= __low2float(h), b -= __high2float(h); /* exact: the bits rn(·) did not keep */
    }
}
/* f32 activations on the bf16 tensor cores (the mma_tile_bf16x3 row, docs/kernels.md §9.7): two f32 values a, b
 * (the low and high halves of a B-operand pair) scaled by 2^24 and cut into three bf16x2 pairs with
 * hi + mid + lo = v·2^24 exactly. Why exact: hi = rn(v') takes the top 8 significant bits, v' − hi is exact in f32
 * and has at most 16 significant bits, mid takes the next 8 and the rest (≤ 8 bits) is lo exactly. Why 2^24: every
 * part is then a normal bf16 (a nonzero f32 has no bit below 2^-149, so v·2^24 has none below 2^-125), and every
 * product with a code (≤ 255) a normal f32 — no subnormal reaches the tensor core, whatever it does with them.
 * Large |v| (from about 2^96, where a part times a code or a sum of them leaves f32's range; v·2^24 itself overflows
 * from 2^104) gives inf or NaN, never a wrong finite value: the output is then non-finite and the kernel's
 * non-finite rule recomputes it in f64 from the original arrays. A code·part product is exact in f32 (8 × 8 bits), so the
 * tensor core sums exact products of the integer codes and v·2^24, which the kernel scales back by 2^-24. */
__device__ __forceinline__ void split_bf16x3(float a, float b, uint32_t &hi, uint32_t &mid, uint32_t &lo) {
    uint32_t parts[3];
    split_bf16_parts<3>(a * 16777216.0f, b * 16777216.0f, parts); /* 2^24: exact below overflow */
    hi = parts[0], mid = parts[1], lo = parts[2];
}
/* The lane's 8 f32 x values f[0..7] (codes 8t..8t+7 of a block) as three sets of B-operand pairs matching decode<>'s
 * pairing (x_pairs' for 16-bit x): parts[p][0..3] for p = hi, mid, lo. */
template <int BITS> __device__ __forceinline__ void x_pairs_bf16x3(const float (&f)[8], uint32_t (&parts)[3][4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        /* 4-bit: (f0,f4) (f1,f5) (f2,f6) (f3,f7); 8-bit: (f0,f2) (f1,f3) (f4,f6) (f5,f7) */
        const int lo_index = BITS == 4 ? i : (i & 1) + 4 * (i >> 1), hi_index = BITS == 4 ? i + 4 : lo_index + 2;
        split_bf16x3(f[lo_index], f[hi_index], parts[0][i], parts[1][i], parts[2][i]);
    }
}

/* A (scale, bias) pair of the scale dtype, widened exactly to f32. */
__device__ __forceinline__ float2 scale_bias(uint32_t pair, __half) {
    return __half22float2(*reinterpret_cast<const __half2 *>(&pair));
}
__device__ __forceinline__ float2 scale_bias(uint32_t pair, __nv_bfloat16) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&pair));
}

/* Split-K of the tile kernels (kernels_tile.cu, kernels_n.cu, kernels_wgmma.cu). split_count: the launch's splits of
 * `units` along K (super-blocks or stages) — at most the `requested` (≥ 1), none empty; *per_split units each.
 * split_arrived_last: called by every thread of a block (or threads 0 … THREADS − 1) after it wrote its partial tile;
 * true in the last split of `tile` to arrive (a per-tile counter), which then sees the other splits' partials, adds
 * them in split order and resets the counter. */
static inline int split_count(int units, int requested, int *per_split) {
    int splits = requested > 0 ? requested : 1;
    if (splits > units) splits = units > 0 ? units : 1;
    *per_split = (units + splits - 1) / splits;
    return *per_split > 0 ? (units + *per_split - 1) / *per_split : 1; /* no empty split */
}
template <int THREADS = 0> __device__ __forceinline__ void block_barrier() {
    if constexpr (THREADS == 0)
        __syncthreads();
    else /* threads 0 … THREADS − 1 only (the wgmma tile's consumers; its producer has returned): named barrier 1 */
        asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
}
template <int THREADS = 0> __device__ __forceinline__ bool split_arrived_last(unsigned *counters, unsigned tile) {
    __threadfence();
    block_barrier<THREADS>();
    __shared__ unsigned arrived;
    if (threadIdx.x == 0) arrived = atomicAdd(&counters[tile], 1u);
    block_barrier<THREADS>();
    if (arrived != gridDim.z - 1) return false;
    __threadfence(); /* the other splits' partials are visible */
    return true;
}

/* One step of a split tile's sum: `v` = the four rows row … row + 3 of token tok (step i4 of [BM tokens][BN rows] in
 * 4-row steps) of the tile at row n0, token m0 — stored with the non-finite rule applied (a sum that is not finite is
 * recomputed directly from the original weights), rows past N and tokens past M skipped. */
template <int BITS, typename T, int GS, int BN>
__device__ __forceinline__ void store_split_step(float4 v, int i4, const T *__restrict__ x, const uint32_t *__restrict__ w_orig,
                                                 const T *__restrict__ scales, const T *__restrict__ biases, T *__restrict__ out,
                                                 int M, int N, int K, int n0, int m0) {
    const int groups = K / GS;
    const int tok = 4 * i4 / BN, row = 4 * i4 % BN, m = m0 + tok;
    if (m >= M) return;
    const float sums[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const int n = n0 + row + c;
        if (n >= N) break;
        float value = sums[c];
        if (!isfinite(value))
            value = direct_output_t(x + (size_t)m * K, w_orig + (size_t)n * (K / 32 * BITS), scales + (size_t)n * groups,
                                    biases + (size_t)n * groups, BITS, (size_t)K, GS);
        store_f32(out, (size_t)m * N + n, value);
    }
}

/* The last split's sum of a tile's partials ([split][BM tokens][BN rows] f32 from `all`, the tile's first split; the
 * tile starts at row n0, token m0; threads 0 … THREADS − 1 take part), stored with the non-finite rule applied:
 * four neighbouring rows of one token per step (128-bit loads), RUN steps of a thread at a time with every load of
 * two splits of the run issued together before their adds — one L2 round trip per two splits of a run, where a step
 * at a time waited one per step (BM·BN / 4 / THREADS of them, 16 for a 128×128 tile of 256 threads; the virtual
 * splits' sum, virtual_split_sum, was 1.23× slower for the same reason): the wgmma cells whose splits go through
 * the workspace 0.87–0.95× the time at M = 64–256 (thirty-second session; the twenty-fourth session's runs of 4
 * steps had measured 1.19× at 4096² M = 128, not understood). Same sums in the same order (0 + p0 + p1 + …). Not
 * inlined: its registers stay out of the main loop's allocation (the kernel runs under a 168-register cap). */
template <int BITS, typename T, int GS, int BM, int BN, int THREADS>
__device__ __noinline__ void reduce_splits(const float4 *__restrict__ all, unsigned splits, const T *__restrict__ x,
                                           const uint32_t *__restrict__ w_orig, const T *__restrict__ scales,
                                           const T *__restrict__ biases, T *__restrict__ out, int M, int N, int K,
                                           int n0, int m0) {
    static_assert(BN % 4 == 0, "four rows per step");
    constexpr int STEPS = BM * BN / 4, RUN = 4;
    for (int base = threadIdx.x; base < STEPS; base += RUN * THREADS) {
        float4 v[RUN];
#pragma unroll
        for (int r = 0; r < RUN; r++) v[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 2
        for (unsigned z = 0; z < splits; z++) {
            float4 p[RUN];
#pragma unroll
            for (int r = 0; r < RUN; r++) {
                const int i4 = base + r * THREADS;
                p[r] = i4 < STEPS ? __ldcg(all + (size_t)z * STEPS + i4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int r = 0; r < RUN; r++) v[r].x += p[r].x, v[r].y += p[r].y, v[r].z += p[r].z, v[r].w += p[r].w;
        }
#pragma unroll
        for (int r = 0; r < RUN; r++)
            if (base + r * THREADS < STEPS)
                store_split_step<BITS, T, GS, BN>(v[r], base + r * THREADS, x, w_orig, scales, biases, out, M, N, K, n0,
                                                  m0);
    }
}

/* Programmatic dependent launch (PTX ISA "griddepcontrol", sm_90; CUDA programming guide, "Programmatic
 * Dependent Launch"). A kernel launched with launch_kernel(..., pdl = true) may start while the kernel before
 * it on the stream is still running: it first lets its own successor be scheduled (pdl_launch_dependents),
 * issues what depends only on the weights (their first pipeline stages), and waits in pdl_wait for the
 * previous kernel to finish and its writes to be visible before it reads x, writes out or touches a
 * workspace. Without the launch attribute, or before sm_90, both are no-ops. */
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* The configuration of a launch_kernel_ex launch: kernel<<<grid, block, shared, stream>>>, with the
 * programmatic-stream-serialization attribute when pdl (the kernel must call pdl_wait before it depends on earlier
 * work) and the blocks in thread-block clusters of (1, 1, cluster_z) when cluster_z ≥ 2 (sm_90; grid.z a multiple of
 * it). `attributes`: room for two, alive as long as the configuration. */
static inline void launch_config(cudaLaunchConfig_t *config, cudaLaunchAttribute *attributes, dim3 grid, dim3 block,
                                 size_t shared, void *stream, bool pdl, int cluster_z) {
    *config = cudaLaunchConfig_t{};
    config->gridDim = grid;
    config->blockDim = block;
    config->dynamicSmemBytes = shared;
    config->stream = (cudaStream_t)stream;
    config->attrs = attributes;
    config->numAttrs = 0;
    if (pdl) {
        cudaLaunchAttribute *a = &attributes[config->numAttrs++];
        a->id = cudaLaunchAttributeProgrammaticStreamSerialization;
        a->val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_z >= 2) {
        cudaLaunchAttribute *a = &attributes[config->numAttrs++];
        a->id = cudaLaunchAttributeClusterDimension;
        a->val.clusterDim.x = 1;
        a->val.clusterDim.y = 1;
        a->val.clusterDim.z = (unsigned)cluster_z;
    }
}

/* Launches kernel<<<grid, block, shared, stream>>>(args...) as launch_config sets it up. Returns the cudaError_t
 * of the launch. */
template <typename... Params, typename... Args>
static int launch_kernel_ex(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, void *stream, bool pdl,
                            int cluster_z, Args... args) {
    cudaLaunchConfig_t config;
    cudaLaunchAttribute attributes[2];
    launch_config(&config, attributes, grid, block, shared, stream, pdl, cluster_z);
    cudaGetLastError(); /* an earlier failure, already reported, must not be blamed on this launch */
    const cudaError_t error = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
    return (int)(error != cudaSuccess ? error : cudaGetLastError());
}

/* Launches kernel<<<grid, block, shared, stream>>>(args...), with the programmatic-stream-serialization
 * attribute when pdl (the kernel must call pdl_wait before it depends on earlier work). Returns the
 * cudaError_t of the launch. */
template <typename... Params, typename... Args>
static int launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, void *stream, bool pdl,
                         Args... args) {
    return launch_kernel_ex(kernel, grid, block, shared, stream, pdl, 0, args...);
}

/* The opt-in to more than 48 KB of dynamic shared memory for `kernel`, once per kernel instantiation and
 * device (the attribute is per device; `done` is the instantiation's own bit per device, up to 64, above
 * which it is set every launch). Returns the cudaError_t. */
template <typename Kernel> static int shared_memory_opt_in(Kernel kernel, size_t bytes, unsigned long long *done) {
    int device = 0;
    cudaError_t error = cudaGetDevice(&device);
    if (error != cudaSuccess) return (int)error;
    if (device < 64 && (*done >> device & 1ull)) return 0;
    error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (error != cudaSuccess) return (int)error;
    if (device < 64) *done |= 1ull << device;
    return 0;
}

/* Where a grouped launch's products are (the mma_gemv and mma_tile grouped kernels): in its parameter
 * (qmm_cuda_grouped_table, ≤ QMM_CUDA_GROUPED_MAX: read in place from the constant bank, and the offsets stay there as
 * operands — on sm_90a 70–104 registers instead of 82–124 for the m8n32 instantiations) or in a device array
 * (grouped_device_table, the upload of a larger class). */
struct grouped_device_table {
    const qmm_cuda_gemv_product *entries;
};
__device__ __forceinline__ const qmm_cuda_gemv_product &grouped_entry(const qmm_cuda_grouped_table &table, unsigned z) {
    return table.products[z];
}
__device__ __forceinline__ qmm_cuda_gemv_product grouped_entry(const grouped_device_table &table, unsigned z) {
    return table.entries[z];
}
/* A launch's parameter table of `count` (≤ QMM_CUDA_GROUPED_MAX) host products, the entries past them zero (defined
 * bytes for the driver's copy of the parameters). */
static inline qmm_cuda_grouped_table grouped_parameter_table(const qmm_cuda_gemv_product *host_products, int count) {
    qmm_cuda_grouped_table table;
    memcpy(table.products, host_products, (size_t)count * sizeof *host_products);
    memset(table.products + count, 0, (size_t)(QMM_CUDA_GROUPED_MAX - count) * sizeof *table.products);
    return table;
}

#endif /* QMM_MMA_COMMON_CUH */
