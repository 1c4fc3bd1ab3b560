/*
 * cuda_internal.h — what the CUDA backend's host code (cuda_backend.c, C) and its kernels (kernels.cu,
 * CUDA C++) share. Not installed. Plain C types only, so both compilers read it.
 */
#ifndef QMM_CUDA_INTERNAL_H
#define QMM_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One product as the launchers see it. dtype: 0 f32, 1 f16, 2 bf16 (qmm_dtype numbering).
 *   x        dtype [M, K]                 (device)
 *   w        uint32 [rows, cols·bits/32]  MLX layout (device)
 *   scales, biases dtype [rows, cols/group_size] (device)
 *   packed   the repacked weights of the mma family, or NULL (docs/kernels.md §9)
 *   sb       (scale, bias) pairs in the tiled layout of qmm_cuda_repack_sb, or NULL
 *   out      dtype [M, N] (device)
 *   stream   cudaStream_t */
typedef struct qmm_cuda_launch {
    int dtype;
    int bits;
    int group_size;
    size_t M, N, K;
    const void *x;
    const uint32_t *w;
    const void *scales;
    const void *biases;
    const uint32_t *packed;
    const void *sb;
    void *out;
    void *stream;
    int warps;           /* warps per block for the mma family (0: the launcher chooses) */
    int gemv_warps_model; /* the mma_gemv launcher's choice of warps: 1 its model, 0 the one-wave rule (gemv_warps) */
    int staged_x;        /* the staged mma_gemv tiles' x (m8n64, m8n48, m8n64_48) through shared memory: 0 the launcher's
                          * rule, 1 on, -1 off */
    int multiprocessors; /* SMs of the device (the launchers size their grids by it; 0: unknown) */
    size_t shared_optin; /* the most dynamic shared memory a block may opt in to on the device (0: unknown) */
    /* mma_tile split-K: splits ≥ 2 needs partials (≥ tiles·splits·BM·BN floats) and counters (≥ tiles,
     * zero); 0 or 1 = no split. */
    int splits;
    float *partials;
    unsigned *counters;
    /* launch with programmatic dependent launch (sm_90 and newer; the kernels that support it say so) */
    int pdl;
    /* wgmma_tile: a workspace of qmm_cuda_wgmma_prepared_bytes() for x prepared once per call (pair order, Σx pieces),
     * the tile then adding b·Σx on the tensor cores; NULL: x permuted in each block and b·Σx by FMA per segment — the
     * mma_tile rows' order (the _fma rows; a batch-invariant call on a default row fails instead) */
    void *wgmma_prepared;
    /* wgmma_tile with splits ≥ 2: the first wgmma_whole_tiles tiles (row tiles fastest) run unsplit in a launch of
     * their own, the rest in `splits` splits of K (the last wave split across the SMs); 0: one launch of every tile
     * in `splits` splits (or none). A value the launch cannot use (the range not inside the tiles) runs one launch
     * of every tile unsplit. */
    int wgmma_whole_tiles;
    /* the 32-token PREP tile's unsplit launch (splits ≤ 1, no last wave): 2 runs two blocks an SM (80 registers a
     * thread, one segment accumulator: the same bits); 0 or 1: one (kernels_wgmma.cu wgmma_occupancy) */
    int wgmma_blocks;
    /* wgmma_tile with 2–8 splits: 1 launch each tile's splits as one thread-block cluster (sm_90, cluster dimension
     * z = splits) that sums them through distributed shared memory, where the device runs those clusters in no more
     * waves than the split launch would take; 2 wherever it can run them at all (the launch fails where it cannot:
     * tests); 0 (or another count): through partials and counters */
    int wgmma_cluster;
    /* wgmma_tile: 1 enqueues nothing — it only asks the device, outside any stream capture, what the launch will need
     * to know inside one (how many clusters it runs at a time: cudaOccupancyMaxActiveClusters is not asked during a
     * capture); a chain step's reserve hook, before the chain's graph is captured */
    int wgmma_prime;
    /* wgmma_tile, PREP, an unsplit launch (splits ≤ 1, or a last wave's whole waves): sum each output as
     * wgmma_virtual_splits splits of K would (batch-invariant calls), one range after another — f16 in registers,
     * bf16 with every range's partial but the last in wgmma_virtual_sums (tiles × (splits − 1) × tokens-per-tile × 128
     * floats); 0, 1 (or bf16 without a buffer): plain. */
    int wgmma_virtual_splits;
    /* with wgmma_virtual_splits and wgmma_virtual_sums, no last wave: that many blocks a tile, each a contiguous run of
     * the ranges, every range's partial in wgmma_virtual_sums (tiles × splits × tokens-per-tile × 128 floats), summed by
     * the tile's last block to arrive (counters); 0 or 1: one block a tile */
    int wgmma_virtual_blocks;
    float *wgmma_virtual_sums;
    /* wgmma_tile with wgmma_prime: where not NULL, how many clusters of the launch's splits the device runs at a time
     * (0: none, or not asked — cluster mode off, or inside a capture before the first answer) */
    int *wgmma_clusters_out;
} qmm_cuda_launch;

/* Launchers: enqueue the call's kernels (one, or a few: the wgmma rows' pre-pass and split launches; none with
 * wgmma_prime) on launch->stream and return the cudaError_t of the launch (0 = ok). */
int qmm_cuda_generic_qmm_t(const qmm_cuda_launch *launch);
int qmm_cuda_generic_qmm_n(const qmm_cuda_launch *launch);
/* The mma GEMV family: tokens (rows of x) on the MMA's N side, 8·tokens_tiles of them; 16·row_tiles
 * weight rows per warp. Needs bits 4 or 8, dtype f16 or bf16, packed and sb, sm_80 or newer. */
int qmm_cuda_mma_gemv_qmm_t(const qmm_cuda_launch *launch, int row_tiles, int token_tiles);
/* The 8-token staged tile (token_tiles 1: cuda.qmm_t.mma_gemv.m8n64_48, M ≤ 8) and the 16-token tile (2: m16n64_48,
 * M ≤ 16) in blocks of 64 and 48 rows: as row_tiles 4 above, the first blocks 64 rows and the others 48 so that every
 * SM gets the same number of blocks (kernels.cu mixed_blocks). */
int qmm_cuda_mma_gemv_mixed_qmm_t(const qmm_cuda_launch *launch, int token_tiles);
/* 1 where that launch cuts N rows on `sms` SMs into blocks of both heights (only where the busiest SM then gets fewer
 * rows), 0 where every block is 64 rows (or sms ≤ 0). */
int qmm_cuda_mixed_splits(size_t N, int sms);
/* One product of a grouped mma_gemv launch: its offsets from the launch's base pointers, in elements of each array
 * (x, out, scales and biases: of the dtype; packed: 16-byte words; sb and w: 32-bit words), and its rows of x. */
typedef struct qmm_cuda_gemv_product {
    unsigned long long x, out, packed, sb, w, scales;
    unsigned int M; /* the GEMV: 1 … 8·token_tiles; the tile: any */
    unsigned int x_row; /* the grouped wgmma tile: the product's first row in the prepared x (a multiple of its tokens
                         * per tile); unused elsewhere */
} qmm_cuda_gemv_product;
/* Up to QMM_CUDA_GROUPED_MAX products of a grouped launch travel by value as the kernel's parameter (no upload: the
 * driver copies a launch's parameters when the launch is enqueued, so the caller's array may change as soon as the
 * call returns); 64 × 56 bytes keeps the parameters under the 4 KB every CUDA version accepts. */
#define QMM_CUDA_GROUPED_MAX 64
typedef struct qmm_cuda_grouped_table {
    qmm_cuda_gemv_product products[QMM_CUDA_GROUPED_MAX];
} qmm_cuda_grouped_table;
/* `count` products of one shape (launch->N, K, bits, group_size, dtype) in one launch of the mma GEMV with 32 weight
 * rows per warp and 8·token_tiles (1 or 2) rows of x: m8n32 or m16n32 (the gather's expert blocks, cuda_backend.c).
 * The products: either host_products, 1 … QMM_CUDA_GROUPED_MAX of them, copied into the launch's parameters, or
 * device_products, a device array of 1 … 65535 that must stay unchanged until the kernel has run; the other NULL.
 * launch->x, packed, sb, w, scales, biases, out: the bases; launch->M unused. Same needs as qmm_cuda_mma_gemv_qmm_t. */
int qmm_cuda_mma_gemv_grouped(const qmm_cuda_launch *launch, const qmm_cuda_gemv_product *host_products,
                              const qmm_cuda_gemv_product *device_products, int count, int token_tiles);
/* The mma_tile family (kernels_tile.cu): tile 0 = m64n64 (4 warps), 1 = m64n128 (8 warps), 2 = m16n256 (8 warps),
 * 3 = m32n256 (8 warps), f16/bf16; tile 4 = m32n128 (4 warps), f32 only (bf16x3: docs/kernels.md §9.7); any M.
 * Otherwise the same needs as mma_gemv (packed and sb of the weights' dtype).
 * qmm_cuda_mma_tile_shape gives the tile's BN (weight rows), BM (tokens), threads per block, the blocks per SM
 * its register cap is set for and its dynamic shared memory per block at `bits` (bytes). */
int qmm_cuda_mma_tile_qmm_t(const qmm_cuda_launch *launch, int tile);
/* `count` products of one shape in one launch of tile 0 (m64n64, f16/bf16, 4/8-bit; no split-K), the products as for
 * qmm_cuda_mma_gemv_grouped (their M any size ≥ 1); launch->M: the largest product's M (grid.y covers its tiles). The
 * gather's tile class where the grouped wgmma tiles do not take it (cuda_backend.c). */
int qmm_cuda_mma_tile_grouped(const qmm_cuda_launch *launch, const qmm_cuda_gemv_product *host_products,
                              const qmm_cuda_gemv_product *device_products, int count);
void qmm_cuda_mma_tile_shape(int tile, int bits, int *bn, int *bm, int *threads, int *resident, size_t *shared);

/* The wgmma_tile family (kernels_wgmma.cu, sm_90a): 128 weight rows × `tokens` (64 or 128) rows of x per block,
 * wgmma with the decoded weights in registers; any M (≤ 65535 tiles), any N, any K multiple of the group. Same
 * needs as mma_gemv, and a Hopper (compute capability 9.0) device. */
int qmm_cuda_wgmma_tile_qmm_t(const qmm_cuda_launch *launch, int tokens);
/* Products of one shape in one launch of the wgmma tile of `tokens` (32 or 64) tokens (PREP, unsplit; the
 * gather's larger expert blocks, cuda_backend.c), after a pre-pass that prepares every product's x. The products are
 * as for qmm_cuda_mma_gemv_grouped, each with x_row, its first row in the prepared x — a multiple of the tokens, the
 * products' regions (M rounded up to the tokens) tiling prepared_rows (a multiple of the tokens, ≤
 * QMM_CUDA_WGMMA_GROUPED_ROWS_MAX) rows; tile_products a device array (unchanged until the kernels have run) of
 * prepared_rows / tokens entries, each token tile's product's entry (a product of 3 tiles
 * thrice); x_rows NULL (each product's x an offset from launch->x in elements) or a device array of x's row for each
 * pair (the gather's lhs indices; each product's x then its first pair: its row m is x's row x_rows[x + m]).
 * launch->wgmma_prepared a workspace of qmm_cuda_wgmma_prepared_bytes(bits, group_size, prepared_rows, K); launch->x,
 * packed, sb, w, scales, biases, out the bases (launch->M unused). Same needs as qmm_cuda_wgmma_tile_qmm_t. */
#define QMM_CUDA_WGMMA_GROUPED_TOKENS 64 /* the largest (cuda_backend.c's gather_wgmma_tokens picks 32 or 64) */
/* the most prepared rows a grouped launch takes (2^30: the rows, their tiles' coordinates and x_sums' rows rounded up
 * to 128 stay ints) */
#define QMM_CUDA_WGMMA_GROUPED_ROWS_MAX (1u << 30)
int qmm_cuda_wgmma_tile_grouped(const qmm_cuda_launch *launch, const qmm_cuda_gemv_product *tile_products,
                                size_t prepared_rows, const unsigned *x_rows, int tokens);
/* The bytes of launch->wgmma_prepared for an [M, K] x of that format (kernels_wgmma.cu). */
size_t qmm_cuda_wgmma_prepared_bytes(int bits, int group_size, size_t M, size_t K);

/* The mma_tile_n rows (kernels_n.cu): x·Ŵ (qmm_n) on the tensor cores, reading w, scales and biases in the MLX layout
 * ([K, N·bits/32], [K, N/group_size]; no repacked arrays); tile 0 = m32n64, 1 = m8n128. bits 4 or 8, dtype f16 or
 * bf16, any M ≤ 65535·bm, N a multiple of the group, any K (M, N, K < 2^31).
 * qmm_cuda_mma_tile_n_shape gives a tile's block: bn columns of out, bm rows of x, bk rows k per pipeline stage. */
int qmm_cuda_mma_tile_qmm_n(const qmm_cuda_launch *launch, int tile);
void qmm_cuda_mma_tile_n_shape(int tile, int *bn, int *bm, int *bk);

/* The ffma_gemv family (kernels_ffma.cu): f32 x, scales, biases and out; 4- or 8-bit codes read in the MLX
 * layout (w); any M (chunks of 8 rows of x along grid.y, M ≤ 65535·8), any N, any K multiple of the group. */
int qmm_cuda_ffma_gemv_qmm_t(const qmm_cuda_launch *launch);

/* gather: dst[i, :] = src[indices[i], :] for i < rows (device pointers; row_bytes a multiple of 16, rows < 2^31). */
int qmm_cuda_gather_rows(const void *src, const uint32_t *indices, void *dst, size_t rows, size_t row_bytes, void *stream);

/* The repacked layout of the mma family (docs/kernels.md §9): words per row and the repack itself,
 * host side. packed_words(K, bits) = ceil(K / S)·16 with S = 512/bits codes per 64-byte super-block. */
size_t qmm_cuda_packed_words_per_row(size_t K, int bits);
/* Repacks w [N, K·bits/32] (MLX layout) into out: ceil(N/16) row tiles of [super-blocks][16 rows][16 words]
 * (packed_tiled_quad; ceil(N/16)·16·packed_words_per_row words, rows past N and the tail of K zero). */
void qmm_cuda_repack(const uint32_t *w, size_t N, size_t K, int bits, uint32_t *out);
/* The (scale, bias) pairs in the tiled layout the mma families read (docs/kernels.md §9, "sb_tiled"):
 * [ceil(N/16) row tiles][super-blocks][16 rows][G] pairs, G = max(1, 512/bits/group_size) pairs per row and
 * super-block, zero past N and past K: a warp's pairs for one super-block and 16 rows are one run of 16·G pairs.
 * scale_bytes 2 (f16/bf16): a pair is one uint32, scale in the low half, bias in the high; scale_bytes 4 (f32):
 * two uint32, the scale's bits then the bias's. scales, biases: [N, K/group_size] of that dtype, at any byte
 * offset. qmm_cuda_sb_words gives out's length in uint32. */
size_t qmm_cuda_sb_words(size_t N, size_t K, int bits, int group_size, int scale_bytes);
/* Zero row tiles the device copies of both arrays carry past their last tile (docs/kernels.md §9.1, "Copies
 * without row checks"): an mma_gemv block of RT ≤ 4 row tiles reads tiles up to RT·ceil(N/(16·RT)) − 1 ≤ ceil(N/16) + 2 of
 * a product — of a gather's expert slice too, whose rows end where the next expert's (or the padding) begin — so its
 * copies need no check of the row against N. */
#define QMM_CUDA_PAD_ROW_TILES 3
void qmm_cuda_repack_sb(const void *scales, const void *biases, size_t N, size_t K, int bits, int group_size,
                        int scale_bytes, uint32_t *out);

/* The context's split-K workspace (cuda_backend.c): f32 partials (16 MiB) and one arrival counter per tile. */
#define QMM_TILE_PARTIAL_FLOATS ((size_t)4 << 20)
#define QMM_TILE_COUNTERS ((size_t)16384)

/* Batch-invariant mode on the default wgmma rows (docs/kernels.md §11): how many splits K is cut into for an N×K
 * matrix of `bits`-bit codes on a device of `multiprocessors` SMs — 1 … 8, never depending on M, so a row's sums are
 * the same inside any batch. Host arithmetic only (IEEE multiplies and divides, no libm): the same count on any host
 * for the same device. The count is part of the mode's bits: a change to it changes the mode's outputs. */
int qmm_cuda_wgmma_invariant_splits(size_t N, size_t K, int bits, int multiprocessors);

#ifdef __cplusplus
}
#endif

#endif /* QMM_CUDA_INTERNAL_H */
