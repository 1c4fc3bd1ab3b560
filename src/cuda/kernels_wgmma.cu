/*
 * kernels_wgmma.cu — the wgmma_tile family: Hopper tensor-core tiles for prefill and large batches, 4- and 8-bit
 * weights with f16/bf16 activations, sm_90a only (docs/kernels.md §9.6).
 *
 * A block computes 128 weight rows × TOKS tokens (128, 64 or 32) with three warpgroups (PTX ISA §9.7.15,
 * "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"), one 64-byte super-block of K per pipeline stage
 * (128 codes at 4 bits, 64 at 8):
 *   - warpgroup 2, the producer: per stage, x arrives by TMA (cp.async.bulk.tensor, 128-byte swizzle, zeros past
 *     M and K), the weight quarters and (scale, bias) pairs by 16-byte cp.async; then each thread permutes one
 *     token's row in place into the k order the decoded weights come in (below), each warp sums x per group
 *     segment on the tensor cores (an all-ones mma.sync: Σx in f32), and the stage is handed over on its
 *     "full" mbarrier.
 *   - warpgroups 0 and 1, the consumers, each own 64 weight rows. Per segment (group ∩ super-block) a warp decodes
 *     its 16 rows' codes exactly into f16/bf16 A fragments in registers (the mma families' decoding,
 *     mma_common.cuh) and the warpgroup issues `wgmma.mma_async` m64nTOKSk16 with A from registers and x from
 *     shared memory into a segment accumulator; then acc = fma(s, Σq·x, fma(b, Σx, acc)) in f32 — the split form
 *     of docs/kernels.md §6, no f16 intermediate. A stage is handed back on its "empty" mbarrier by every
 *     consumer thread.
 * Weights on the wgmma's M side (64 rows per warpgroup), tokens on its N side, so the same A fragments as
 * mma.sync m16n8k16 (each warp of the warpgroup holds 16 rows) and the accumulator layout of m16n8 tiles side by
 * side. The k order: a lane's word of a 32-code block holds codes 8t … 8t+7; the decoding pairs them as
 * (c0, c4), (c1, c5), (c2, c6), (c3, c7) (4-bit) or (c0, c2), (c1, c3), (c4, c6), (c5, c7) (8-bit), which the
 * fragment puts at k = 2t, 2t+8, 16+2t, 24+2t — so x is stored with the same pairs at those k (x_pairs, the
 * GEMV's own pairing), and every product meets its own x.
 *
 * Edges: weight rows past N and blocks past K are zero-filled copies (zero pairs), tokens past M zero rows of x;
 * only outputs inside [M, N] are stored. Each output's f32 accumulator goes through the non-finite rule (§2).
 * Split-K (the SPLIT instantiation, grid.z splits; docs/kernels.md §9.6): each block takes a contiguous range of
 * super-blocks; the last split of a tile to arrive adds the tiles' partials in split order (split_finish), or, where
 * the splits of a tile run as one thread-block cluster, each split adds its slice of the tile over the splits' shared
 * memory in split order (cluster_finish) — the same sums either way.
 * PREP (the default rows, batch-invariant calls on Hopper among them; the _fma rows run without it): wgmma_prepare_x
 * first permutes x and sums it per segment once per call, into a context workspace (x_prepared, and Σx as three tf32 pieces per
 * segment); the producer then copies x_prepared by TMA and the stage's pieces by one bulk copy, and does no
 * permutation or summing, and hands its registers to the consumers (setmaxnreg: 40 for it, 232 for them); the
 * consumers add b·Σx with one wgmma k8 tf32 (exact products) into the accumulators once a stage, and per segment only
 * acc = fma(s, Σq·x, acc). An unsplit PREP launch may compute a split launch's sums itself (virtual splits, below).
 */
#include "cuda_internal.h"
#include "mma_common.cuh"

#include <cuda.h> /* CUtensorMap and its enums (types only: the encoder is fetched from the runtime) */
#include <cudaTypedefs.h>
#include <atomic>
#include <climits>
#include <type_traits>
#include <stdint.h>

/* wgmma exists in sm_90a code only; the sm_80 image gets kernels that trap (supports() refuses there). */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QMM_WGMMA_DEVICE 1
#else
#define QMM_WGMMA_DEVICE 0
#endif

/* (Outside the anonymous namespace: a kernel parameter's type must be one the launch stub can name.)
 * A grouped launch's work (wgmma_tile_kernel's GROUPED, qmm_cuda_wgmma_tile_grouped): for each of the `tiles` token
 * tiles of the prepared x, its product's entry (qmm_cuda_gemv_product in device memory; tile g's is that of the product
 * whose region holds prepared rows g·TOKS …, TOKS = 1 << token_shift: one load finds a tile's product), and x_rows,
 * where x is read through the gather's lhs indices (a product's `x` then its first pair: its row m is x's row
 * x_rows[x + m]), else NULL (its `x` an offset from x in elements). Empty for the other launches. */
struct wgmma_grouped_work {
    const qmm_cuda_gemv_product *tile_products;
    const unsigned *x_rows;
    int tiles, token_shift; /* the token tiles, and log2 of their tokens (the launch's TOKS: 5 or 6) */
};

namespace {

constexpr int WG_ROWS = 128;    /* weight rows per block: two consumer warpgroups of 64 */
constexpr int WG_STAGES = 4;    /* super-blocks in flight (42–44 KiB each at 4 bits, TOKS = 128) */
constexpr int WG_THREADS = 384; /* consumers 0–255, producer 256–383 */
/* Blocks an SM (__launch_bounds__) and the registers setmaxnreg gives the producer and the consumers (PREP): one block
 * of 384 threads at 168 registers, then 40 / 232 (128 × 40 + 256 × 232 ≤ 65536); the 32-token PREP tile's unsplit
 * launch may run two blocks an SM (BLOCKS = 2, c->wgmma_blocks: wgmma_splits' rule) at 80 registers, then 24 / 104 (a
 * block's 384 × 80: 128 × 24 + 256 × 104 ≤ 30720), with one segment accumulator (two would make ptxas serialise the
 * 4-bit group-64 tile's wgmmas at 104 registers, C7512) — the same bits (TWO_PARTS). Measured on an H100 (docs/PERF.md,
 * fifty-second session): 0.81–0.99× the one-block launch's time where the tiles are at least 1.4 waves of single
 * blocks (192–512 tiles), 1.05–1.11× at 136 and 160 tiles (whose one-block launch splits its last wave). */
template <int BLOCKS> struct wgmma_occupancy {
    static_assert(BLOCKS == 1 || BLOCKS == 2, "one or two blocks an SM");
    static constexpr bool PARTS_OK = BLOCKS == 1;
    static constexpr int PRODUCER_REGS = BLOCKS == 2 ? 24 : 40, CONSUMER_REGS = BLOCKS == 2 ? 104 : 232;
    /* setmaxnreg moves registers within a block's own allocation at launch: 384 threads at the most registers
     * __launch_bounds__ leaves each (65536 / (384 · BLOCKS), rounded down to a multiple of 8) */
    static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 384 * ((65536 / (384 * BLOCKS)) / 8 * 8),
                  "setmaxnreg within the block's registers at launch");
};
constexpr int PREP_ROWS = 4;     /* wgmma_prepare_x: rows per thread, sharing its indexing (a divisor of 8: its rows
                                 * are in one group of 8 tokens of x_sums) */
static_assert(8 % PREP_ROWS == 0, "a thread's rows in one group of 8 tokens");

#if QMM_WGMMA_DEVICE /* the device helpers: sm_90a code only */
__device__ __forceinline__ uint32_t smem_address(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* mbarrier (PTX ISA §9.7.13.15), CTA scope. */
__device__ __forceinline__ void mbarrier_init(uint32_t bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
/* Ends the launch with an error (illegal address, sticky like a trap): a `trap` anywhere in the kernel keeps ptxas
 * from giving the consumers the registers that setmaxnreg hands them. Only a defect of this file could get here. */
__device__ __forceinline__ void fail_launch() { *static_cast<volatile unsigned *>(nullptr) = 0u; }
/* Waits for the phase of the given parity to complete. A wait that outlasts any real one (2^28 polls, each of
 * which may suspend) ends the launch (fail_launch) rather than hang the device: the launch fails with a sticky
 * error (the caller gets QMM_ERR_BACKEND, and the context's later calls fail too). Only a defect of this file could
 * get there. */
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
    uint32_t done, polls = 0;
    do {
        if (++polls == (1u << 28)) fail_launch();
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* A shared-memory matrix descriptor (PTX ISA §9.7.15.5.1) for a K-major operand in the 128-byte swizzle: rows of
 * 128 bytes (64 f16/bf16 values of k), 8-row core groups 1024 bytes apart (the stride byte offset); the leading
 * byte offset is unused in this mode. addr: the operand's first row at the k offset wanted (+32 bytes per k16). */
__device__ __forceinline__ uint64_t descriptor_sw128(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

/* The descriptor of the same operand `offset` bytes on (a multiple of 16): the address field holds bits 4–17 of a
 * shared-memory address (< 2^18), so the offset adds to the low word without a carry. */
__device__ __forceinline__ uint64_t descriptor_offset(uint64_t descriptor, uint32_t offset) {
    return (descriptor & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)descriptor + (offset >> 4));
}

/* The same for a K-major operand without swizzle (PTX ISA §9.7.15.5.1, layout type 0): core matrices of 8 rows × 16
 * bytes stored as 128 contiguous bytes, `lbo` bytes from one core matrix to the next along K, `sbo` bytes from one
 * 8-row group to the next. */
__device__ __forceinline__ uint64_t descriptor_interleave(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
/* every wgmma group but the newest complete (PTX ISA, wgmma.wait_group) */
__device__ __forceinline__ void wgmma_wait_one() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
/* The _fma rows' consumers take turns (ping-pong): warpgroup w waits on named barrier 2 + w before it issues a segment's
 * wgmmas and, once it has issued them, arrives on the other's (256 threads each: 128 waiting, 128 arriving), so the two
 * warpgroups' groups reach the tensor cores alternately (FlashAttention-3's and CUTLASS's ping-pong between consumer
 * warpgroups). Measured on the H200 (docs/PERF.md, twenty-third session): the _fma rows 0.95× the time in bf16, 0.99× in
 * f16; the PREP rows ±2 % (not taken there). Barrier 1 is block_barrier's. Unsplit launches only (TURNS): in the
 * split launches, whose consumers write and read the partial tile in shared memory after their last turn,
 * compute-sanitizer's racecheck reported those accesses as hazards across block_barrier (141 in test_cuda's tile_split_k
 * section; none without these turns, none with turns on mbarriers, none in the PREP split launches). Dropping them there
 * cost nothing measurable (the forced _fma rows 0.97–1.02× on the seed shapes); turns on mbarriers ran the _fma rows
 * 1.09–1.15× in f16 and 1.00–1.05× in bf16 (thirty-third session, docs/PERF.md). */
__device__ __forceinline__ void turn_wait(int warpgroup) {
    asm volatile("bar.sync %0, 256;" ::"r"(2 + warpgroup) : "memory");
}
__device__ __forceinline__ void turn_pass(int warpgroup) {
    asm volatile("bar.arrive %0, 256;" ::"r"(3 - warpgroup) : "memory");
}
/* Keeps the compiler from moving reads of an accumulator register above the wait that makes it valid. */
__device__ __forceinline__ void register_fence(float &r) { asm volatile("" : "+f"(r)::"memory"); }

/* Piece `piece` (0, 1, 2) of v = hi + mid + lo, each exact in tf32 (11 significant bits): hi keeps v's top 11 bits,
 * mid the next 11 of what is left (exact in f32: v − hi has at most 13 significant bits), lo the last 2. Their sum is v
 * exactly, except for |v| < 2^-113 (bf16 x only; f16 sums are multiples of 2^-24), where mid or lo is an f32
 * subnormal whose low bits the tensor core drops (or all of it, should it flush subnormal inputs): an absolute error
 * up to about |b|·2^-124, which the bound (docs/kernels.md §6; bf16 output's tiny term 2^-133) covers only while |b|
 * is small — a known gap, docs/kernels.md §9.6. A non-finite v gives a non-finite hi: the output goes through the
 * non-finite rule. */
__device__ __forceinline__ float tf32_piece(float v, int piece) {
    const float hi = __uint_as_float(__float_as_uint(v) & 0xFFFFE000u), rest = v - hi;
    const float mid = __uint_as_float(__float_as_uint(rest) & 0xFFFFE000u);
    return piece == 0 ? hi : piece == 1 ? mid : rest - mid;
}

/* D (m64 × TOKS, f32) {+}= A (m64 × k16 from registers, f16/bf16) · B (k16 × TOKS, K-major in shared memory,
 * 128-byte swizzle). accumulate = 0 overwrites D. One overload per TOKS and dtype. */
/* The accumulator operands: d[0..15] (m64n32), d[0..31] (m64n64) or d[0..63] (m64n128), and their %-lists in the
 * instruction. */
#define QMM_WGMMA_D16 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
    "+f"(d[15])
#define QMM_WGMMA_D32 QMM_WGMMA_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), \
    "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), \
    "+f"(d[31])
#define QMM_WGMMA_D64 QMM_WGMMA_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), \
    "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), \
    "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), \
    "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), \
    "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define QMM_WGMMA_R16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define QMM_WGMMA_R32 QMM_WGMMA_R16 ", " "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define QMM_WGMMA_R64 QMM_WGMMA_R32 ", " "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
/* One overload of wgmma_rs: TOKS tokens (the instruction's N), the accumulator operands D and their list R, the
 * A registers' list A, the descriptor's and the accumulate flag's operands; TY the PTX type of A and B. */
#define QMM_WGMMA_RS(TOKS, D, R, A, DESC, ACC, TY, CTYPE)                                                            \
    __device__ __forceinline__ void wgmma_rs(float(&d)[TOKS / 2], const uint32_t(&a)[4], uint64_t desc, int accumulate, \
                                             CTYPE) {                                                                \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                                \
                     "wgmma.mma_async.sync.aligned.m64n" #TOKS "k16.f32." TY "." TY " {" R "}, {" A "}, " DESC       \
                     ", p, 1, 1, 0;\n}\n"                                                                            \
                     : D                                                                                             \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));                      \
    }
QMM_WGMMA_RS(32, QMM_WGMMA_D16, QMM_WGMMA_R16, "%16, %17, %18, %19", "%20", "%21", "f16", __half)
QMM_WGMMA_RS(32, QMM_WGMMA_D16, QMM_WGMMA_R16, "%16, %17, %18, %19", "%20", "%21", "bf16", __nv_bfloat16)
QMM_WGMMA_RS(64, QMM_WGMMA_D32, QMM_WGMMA_R32, "%32, %33, %34, %35", "%36", "%37", "f16", __half)
QMM_WGMMA_RS(64, QMM_WGMMA_D32, QMM_WGMMA_R32, "%32, %33, %34, %35", "%36", "%37", "bf16", __nv_bfloat16)
QMM_WGMMA_RS(128, QMM_WGMMA_D64, QMM_WGMMA_R64, "%64, %65, %66, %67", "%68", "%69", "f16", __half)
QMM_WGMMA_RS(128, QMM_WGMMA_D64, QMM_WGMMA_R64, "%64, %65, %66, %67", "%68", "%69", "bf16", __nv_bfloat16)
#undef QMM_WGMMA_RS
/* D (m64 × TOKS, f32) += A (m64 × k8 tf32 from registers: per warp the A fragment of mma.sync m16n8k8 tf32) · B (k8 ×
 * TOKS tf32, K-major in shared memory without swizzle). The operands must be exact in tf32 (low 13 bits zero). */
#define QMM_WGMMA_TF32(TOKS, D, R, A, DESC)                                                                           \
    __device__ __forceinline__ void wgmma_tf32(float(&d)[TOKS / 2], const uint32_t(&a)[4], uint64_t desc) {            \
        asm volatile("wgmma.mma_async.sync.aligned.m64n" #TOKS "k8.f32.tf32.tf32 {" R "}, {" A "}, " DESC ", 1, 1, 1;\n" \
                     : D                                                                                             \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));                                       \
    }
QMM_WGMMA_TF32(32, QMM_WGMMA_D16, QMM_WGMMA_R16, "%16, %17, %18, %19", "%20")
QMM_WGMMA_TF32(64, QMM_WGMMA_D32, QMM_WGMMA_R32, "%32, %33, %34, %35", "%36")
QMM_WGMMA_TF32(128, QMM_WGMMA_D64, QMM_WGMMA_R64, "%64, %65, %66, %67", "%68")
#undef QMM_WGMMA_TF32
#undef QMM_WGMMA_D16
#undef QMM_WGMMA_D32
#undef QMM_WGMMA_D64
#undef QMM_WGMMA_R16
#undef QMM_WGMMA_R32
#undef QMM_WGMMA_R64
#endif /* QMM_WGMMA_DEVICE */

/* PREP: x_sums holds the Σx pieces of M rounded up to 128 tokens, so that every tile's are whole (either TOKS). */
template <typename I> __host__ __device__ constexpr I x_sums_tokens(I M) { return (M + 127) / 128 * 128; }
/* PREP: where token m's slot k (3·segment + piece) sits in a super-block's x_sums, in floats: per 8 tokens, per k8
 * chunk, two core matrices (slots 0–3, 4–7) of 8 tokens × 4 f32 — the K-major B operand of wgmma k8 tf32 without
 * swizzle, [m / 8][chunks][k % 8 / 4][m % 8][k % 4] (LBO 128 bytes, SBO chunks · 256). A tile of tokens m0 … (m0 a
 * multiple of 8) is one contiguous run from float m0 · 8 · chunks. */
[[maybe_unused]] __host__ __device__ constexpr int x_sums_at(int m, int k, int chunks) {
    return (m / 8) * 64 * chunks + (k / 8) * 64 + (k % 8 / 4) * 32 + (m % 8) * 4 + k % 4;
}

/* Shared-memory layout of one stage (all offsets multiples of 16; the stage size a multiple of 1024, so each
 * stage's x tile starts 1024-aligned as the swizzle wants). */
template <int BITS, int GS, int TOKS, bool PREP = false> struct wgmma_layout {
    static constexpr int KS = 512 / BITS;                         /* codes per super-block (stage) */
    static constexpr int BPS = KS / 32;                           /* 32-code blocks per stage: 4 or 2 */
    static constexpr int BPG = GS / 32;                           /* blocks per group */
    static constexpr int SEG_BLOCKS = BPG < BPS ? BPG : BPS;      /* blocks per segment (group ∩ stage) */
    static constexpr int SEG = BPS / SEG_BLOCKS;                  /* segments per stage */
    static constexpr int GSB = sb_pairs_per_super_block(BITS, GS); /* pairs per row and stage (= SEG) */
    static constexpr int X_BYTES = TOKS * KS * 2;                 /* [KS/64 columns][TOKS rows][128 bytes] */
    static constexpr int W_BYTES = WG_ROWS * 64;                  /* [128 rows][4 quarters of 16 bytes] */
    static constexpr int SB_BYTES = WG_ROWS * GSB * 4;            /* [8 row tiles][16 rows][GSB] pairs */
    /* Σx: [SEG][TOKS] f32; PREP: each segment's Σx as three tf32 pieces (tf32_piece) at k slot 3·sg + piece of XP_CHUNKS
     * k8 chunks (x_sums_at: the B operand of a wgmma k8 tf32 per chunk); the slots past 3·SEG are zero */
    static constexpr int XP_CHUNKS = (3 * SEG + 7) / 8;
    static constexpr int XP_ROW = XP_CHUNKS * 32; /* bytes of one token's pieces */
    static constexpr int XSUM_BYTES = PREP ? TOKS * XP_ROW : SEG * TOKS * 4;
    static constexpr int W_AT = X_BYTES, SB_AT = W_AT + W_BYTES, XSUM_AT = SB_AT + SB_BYTES;
    static constexpr int STAGE = (XSUM_AT + XSUM_BYTES + 1023) / 1024 * 1024;
    static constexpr int SHARED = WG_STAGES * STAGE + 3 * WG_STAGES * 8 + 1024; /* + barriers + alignment slack */
    static_assert(GSB == SEG, "one (scale, bias) pair per row and segment");
};

#if QMM_WGMMA_DEVICE
/* The A fragments of segment sg of a stage (SB blocks of 32 codes): wq0/wq1 are the lane's 16-byte quarters of
 * rows g and g + 8; per block, k16 steps h = 0, 1 (the pairing of the file comment). */
template <int BITS, typename T, int SB>
__device__ __forceinline__ void decode_segment(const uint4 &wq0, const uint4 &wq1, int sg, uint32_t (&frag)[SB][2][4]) {
#pragma unroll
    for (int jb = 0; jb < SB; jb++) {
        const int j = sg * SB + jb;
        block_a_fragments<BITS, T>(reinterpret_cast<const uint32_t *>(&wq0) + j * (BITS / 4),
                                   reinterpret_cast<const uint32_t *>(&wq1) + j * (BITS / 4), frag[jb]);
    }
}

/* The segment's wgmmas into part (the first overwrites it), committed as one group (after the caller's wgmma_fence and
 * any wgmma of its own for the same group). x_at: the stage's x tile. OFFSET: each descriptor as the first's plus an
 * offset (descriptor_offset: one add per wgmma where ptxas built each in four or five uniform instructions; f16
 * 0.986–0.989× the time, bf16 1.00, docs/PERF.md twenty-second session) — not in the _fma rows, whose consumers,
 * under the 168-register cap, spilled more with it (4-bit gs64 f16: 0 → 80 bytes). */
template <typename T, int TOKS, int SB, bool OFFSET>
__device__ __forceinline__ void issue_segment(float (&part)[TOKS / 2], const uint32_t (&frag)[SB][2][4], uint32_t x_at,
                                              int sg) {
    const uint64_t base = descriptor_sw128(x_at);
#pragma unroll
    for (int jb = 0; jb < SB; jb++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int k0 = 32 * (sg * SB + jb) + 16 * h; /* virtual k within the stage */
            const int offset = (k0 / 64) * (TOKS * 128) + (k0 % 64) * 2;
            const uint64_t desc = OFFSET ? descriptor_offset(base, offset) : descriptor_sw128(x_at + offset);
            wgmma_rs(part, frag[jb][h], desc, jb + h > 0 ? 1 : 0, T());
        }
    wgmma_commit();
}
#endif /* QMM_WGMMA_DEVICE */

/* Split-K's end for the consumers (threads 0–255), from this split's partial tile in shared memory ([TOKS tokens][128
 * rows] f32): the tile to its place in the workspace (16-byte stores), the arrival on the tile's counter and, in the
 * last split to arrive, the sum of the tile's partials in split order (reduce_splits: the non-finite rule, the stores).
 * Not inlined: under the consumers' 168-register cap this code in the kernel body made the main loop spill. */
template <int BITS, typename T, int GS, int TOKS>
__device__ __noinline__ void split_finish(const float *tile_partial, float *partials, unsigned *counters, const T *x,
                                          const uint32_t *w_orig, const T *scales, const T *biases, T *out, int M,
                                          int N, int K, int n0, int m0) {
    const unsigned tile = blockIdx.x; /* the tile's place in this launch (its counter and partials) */
    float4 *mine = reinterpret_cast<float4 *>(partials + ((size_t)tile * gridDim.z + blockIdx.z) * (TOKS * WG_ROWS));
    block_barrier<256>(); /* every consumer's part of the tile is in shared memory */
    const float4 *from = reinterpret_cast<const float4 *>(tile_partial);
    for (int i = threadIdx.x; i < TOKS * WG_ROWS / 4; i += 256) mine[i] = from[i];
    if (!split_arrived_last<256>(counters, tile)) return;
    reduce_splits<BITS, T, GS, TOKS, WG_ROWS, 256>(
        reinterpret_cast<const float4 *>(partials + (size_t)tile * gridDim.z * (TOKS * WG_ROWS)), gridDim.z, x, w_orig,
        scales, biases, out, M, N, K, n0, m0);
    if (threadIdx.x == 0) counters[tile] = 0; /* ready for the next launch on the stream */
}

/* Split-K's end in a cluster (launch_wgmma with c->wgmma_cluster: the tile's splits are one thread-block cluster, split
 * z its rank z): every split's partial tile stays in its own shared memory ([TOKS tokens][128 rows] f32); after a
 * cluster barrier (release/acquire: the partials visible across the cluster; PTX ISA `barrier.cluster`) the
 * split of rank r sums the r-th slice of the tile's 4-row steps over the splits' shared memory in split order
 * (PTX ISA `mapa` + `ld.shared::cluster` — the same sums 0 + p0 + p1 + … as split_finish's, so the same
 * bits) and stores it (store_split_step: the non-finite rule); a second barrier keeps every block, and so its shared
 * memory, alive until the other splits have read it. Consumers only (threads 0–255): the producer has returned, and an
 * exited thread holds no cluster barrier up (PTX ISA, `exit`). Replaces the workspace's round trip and the last
 * split's serial sum (≈ a quarter of the tile kernel's time at 4096² M = 128 with 4 splits: ncu, twenty-fourth
 * session). Not inlined: its registers stay out of the consumers' main loop. */
#if QMM_WGMMA_DEVICE
template <int BITS, typename T, int GS, int TOKS>
__device__ __noinline__ void cluster_finish(const float *tile_partial, const T *x, const uint32_t *w_orig, const T *scales,
                                            const T *biases, T *out, int M, int N, int K, int n0, int m0) {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
    unsigned splits, rank;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(splits));
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    constexpr int STEPS = TOKS * WG_ROWS / 4, MOST = (STEPS / 2 + 255) / 256; /* a thread's steps at 2 splits */
    const int per = (STEPS + (int)splits - 1) / (int)splits, begin = (int)rank * per, end = min(STEPS, begin + per);
    const uint32_t local = smem_address(tile_partial);
    float4 v[MOST];
#pragma unroll
    for (int r = 0; r < MOST; r++) v[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    /* split by split, the thread's MOST steps' loads issued together, then added: one shared::cluster round trip per
     * split. (Each load's asm had a "memory" clobber and was added before the next issued: MOST × splits round trips
     * one after another.) The loads' asm is volatile without the clobber: it stays between the cluster barriers (both
     * volatile, in order) and the compiler may not drop it; the hardware waits only where the adds use the values. */
    for (unsigned z = 0; z < splits; z++) {
        float4 p[MOST];
#pragma unroll
        for (int r = 0; r < MOST; r++) {
            const int i4 = begin + (int)threadIdx.x + 256 * r;
            p[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i4 >= end) continue;
            uint32_t remote;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local + 16u * (unsigned)i4), "r"(z));
            asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(p[r].x), "=f"(p[r].y), "=f"(p[r].z), "=f"(p[r].w)
                         : "r"(remote));
        }
#pragma unroll
        for (int r = 0; r < MOST; r++) v[r].x += p[r].x, v[r].y += p[r].y, v[r].z += p[r].z, v[r].w += p[r].w;
    }
    /* done reading the other blocks' shared memory: arrive before the stores (a release arrive waits for this thread's
     * earlier memory operations — after the stores it would wait for every one of them), wait before the exit */
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
#pragma unroll
    for (int r = 0; r < MOST; r++) {
        const int i4 = begin + (int)threadIdx.x + 256 * r;
        if (i4 < end) store_split_step<BITS, T, GS, WG_ROWS>(v[r], i4, x, w_orig, scales, biases, out, M, N, K, n0, m0);
    }
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
#endif /* QMM_WGMMA_DEVICE */

/* Virtual splits in slots (wgmma_tile_kernel, virtual_per, bf16; f16 sums them in registers, VIRTUAL): each range's
 * partial p_r goes to its own slot of `partials`,
 * [tile][range][q][consumer thread] float4s (coalesced; the thread's own, so program order makes its stores visible to
 * its loads), and acc restarts from 0 — stores only, nothing waited for between ranges. Stores and loads cached in L2
 * only (st/ld.global.cg; evict-first .cs took 1.00–1.05× the mode's time, thirty-first session — docs/PERF.md). After
 * the last range, acc = 0 + p0 + p1 + … + acc: one round-to-nearest f32 add at a time in range order, as the split
 * launch's `v.x += p.x` from 0 (cluster_finish, reduce_splits). */
template <int TOKS>
__device__ __forceinline__ float4 *virtual_split_slot(float *partials, int tile, int stride, int range) {
    return reinterpret_cast<float4 *>(partials) + ((size_t)tile * stride + range) * (TOKS / 8) * 256 + threadIdx.x;
}
template <int TOKS>
__device__ __forceinline__ void virtual_split_store(float4 *slot, float (&acc)[TOKS / 2]) {
#pragma unroll
    for (int q = 0; q < TOKS / 8; q++) {
        __stcg(slot + q * 256, make_float4(acc[4 * q + 0], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
        acc[4 * q + 0] = acc[4 * q + 1] = acc[4 * q + 2] = acc[4 * q + 3] = 0.0f;
    }
}
/* acc = 0 + p0 + … + p(n − 1) + acc (last = true: acc is the last range's partial) or 0 + p0 + … + p(n − 1) (false:
 * every partial in its slot, the blocks of virtual ranges below); `stride` slots a tile. */
template <int TOKS>
__device__ __forceinline__ void virtual_split_sum(float *partials, int tile, int stride, int n, bool last,
                                                  float (&acc)[TOKS / 2]) {
    float sum[TOKS / 2]; /* the ranges' sums; part[] is dead by now, its registers take these */
#pragma unroll
    for (int e = 0; e < TOKS / 2; e++) sum[e] = 0.0f;
    for (int r = 0; r < n; r++) {
        /* a range's TOKS / 8 loads issued together, then added: one memory latency a range (a load and its add per
         * float4 in turn waited out each latency alone, TOKS / 8 a tile: the 1.23× of the thirtieth session) */
        const float4 *slot = virtual_split_slot<TOKS>(partials, tile, stride, r);
        float4 p[TOKS / 8];
#pragma unroll
        for (int q = 0; q < TOKS / 8; q++) p[q] = __ldcg(slot + q * 256);
#pragma unroll
        for (int q = 0; q < TOKS / 8; q++) {
            sum[4 * q + 0] = __fadd_rn(sum[4 * q + 0], p[q].x), sum[4 * q + 1] = __fadd_rn(sum[4 * q + 1], p[q].y);
            sum[4 * q + 2] = __fadd_rn(sum[4 * q + 2], p[q].z), sum[4 * q + 3] = __fadd_rn(sum[4 * q + 3], p[q].w);
        }
    }
#pragma unroll
    for (int e = 0; e < TOKS / 2; e++) acc[e] = last ? __fadd_rn(sum[e], acc[e]) : sum[e];
}

template <int BITS, typename T, int GS, int TOKS, bool SPLIT, bool PREP, int VIRT = 0, bool GROUPED = false, int BLOCKS = 1>
__global__ void __launch_bounds__(WG_THREADS, BLOCKS)
    wgmma_tile_kernel(const __grid_constant__ CUtensorMap x_map, const T *__restrict__ x, const uint4 *__restrict__ packed,
                      const uint32_t *__restrict__ sb, const uint32_t *__restrict__ w_orig, const T *__restrict__ scales,
                      const T *__restrict__ biases, T *__restrict__ out, float *__restrict__ partials,
                      unsigned *__restrict__ counters, const float *__restrict__ x_sums, int M, int N, int K,
                      int sb_per_split, int tile_begin, const wgmma_grouped_work group) {
#if QMM_WGMMA_DEVICE
    using L = wgmma_layout<BITS, GS, TOKS, PREP>;
    /* GROUPED (the gather's expert blocks, launch_wgmma_grouped: PREP, unsplit), persistent: the work items are the
     * prepared x's token tiles by the row tiles, item w = g · tiles_n + row tile (so the blocks' shares differ by one
     * item at most, and the blocks running together share token tiles), token tile g of the product group.tile_products[g]
     * (its entry: offsets from the bases, its M, its region of the prepared x from row x_row, a multiple of TOKS); block b
     * takes items b, b + grid.x, … in turn — its producer runs on into the next tile's stages while its consumers finish
     * the last one's. x_map and x_sums hold the prepared rows, and the M given is their count (x_sums has it rounded up
     * to 128 rows). The twenty-third session's form numbered the items over every product's share of the largest
     * product's tiles, skipping those past its M (blocks' shares up to 1.33× the even one at T = 1024–2048); a walk
     * over the table to number only the items that exist cost a table load per product passed (T = 512 1.14×). */
    static_assert(!GROUPED || (PREP && !SPLIT && VIRT == 0), "grouped launches: unsplit PREP tiles");
    static_assert(BLOCKS == 1 || (TOKS == 32 && PREP && !SPLIT && VIRT == 0 && !GROUPED),
                  "two blocks an SM: the 32-token tile's unsplit dense launch");
    const int m_pad = x_sums_tokens(M); /* PREP: the tokens of x_sums' rows */
    extern __shared__ uint8_t shared_raw[];
    /* 1024-aligned for the swizzle (offset from the array itself, so the compiler keeps shared-space accesses) */
    uint8_t *shared = shared_raw + ((1024u - (smem_address(shared_raw) & 1023u)) & 1023u);
    /* mbarriers: full[s] at 8s (the stage is ready for the consumers), empty[s] at 8(S + s) (they are done with
     * it), x_full[s] at 8(2S + s) (its x tile has arrived) */
    const uint32_t bars = smem_address(shared + WG_STAGES * L::STAGE);
    /* the block's tile: tile_begin + blockIdx.x of the tiles in row-tile-fastest order (a launch may take a range of
     * them: launch_wgmma's last wave); GROUPED: its current work item's (next_tile) */
    const int tiles_n = (N + WG_ROWS - 1) / WG_ROWS, tile = tile_begin + (int)blockIdx.x;
    int n0 = (tile % tiles_n) * WG_ROWS, m0 = (tile / tiles_n) * TOKS, x_row = 0;
    const uint4 *packed_t = packed; /* the current product's weights */
    const uint32_t *sb_t = sb;
    const qmm_cuda_gemv_product *entry = nullptr; /* GROUPED: the current product */
    int work = (int)blockIdx.x;
    /* GROUPED: work item `work` made current; false: there is none (the block is done) */
    auto next_tile = [&]() -> bool {
        if (work >= group.tiles * tiles_n) return false; /* (no overflow: launch_wgmma_grouped) */
        const int g = work / tiles_n;
        const qmm_cuda_gemv_product *e = group.tile_products + g;
        entry = e, M = (int)e->M, x_row = (int)e->x_row, n0 = (work - g * tiles_n) * WG_ROWS, m0 = g * TOKS - x_row;
        packed_t = packed + e->packed, sb_t = sb + e->sb;
        return true;
    };
    if constexpr (GROUPED) {
        if (!next_tile()) return; /* no work for this block (before any barrier) */
    }
    const int blocks_k = K / 32, super_blocks = (blocks_k + L::BPS - 1) / L::BPS;
    const int groups = K / GS;
    /* SPLIT (split-K, grid.z splits): this block's contiguous range of super-blocks, `count` of them from sb_begin. A
     * separate instantiation: the split epilogue's code in the one kernel made the consumers' main loop spill under
     * their 168-register cap. */
    /* Blocks of virtual ranges (PREP, unsplit, slots, sb_per_split = −per < 0 and grid.z = blocks > 1; batch-invariant
     * calls): the R ranges of `per` super-blocks in grid.z contiguous runs of ⌈R / grid.z⌉, one block each; every
     * range's partial to its slot ([tile][R]), and the last block of the tile to arrive sums 0 + p0 + … + p(R − 1) —
     * the split launch's sums with fewer, longer blocks. */
    const int ranges_all = sb_per_split < 0 ? (super_blocks - sb_per_split - 1) / -sb_per_split : 1;
    constexpr bool VIRTUAL = VIRT == 1, SLOTS = VIRT == 2; /* virtual splits' partials in registers, in slots */
    const bool blocks_of_ranges = SLOTS && sb_per_split < 0 && gridDim.z > 1;
    const int ranges_per_block = blocks_of_ranges ? (ranges_all + (int)gridDim.z - 1) / (int)gridDim.z : 0;
    const int range0 = blocks_of_ranges ? (int)blockIdx.z * ranges_per_block : 0; /* the block's first range */
    const int sb_begin = SPLIT ? (int)blockIdx.z * sb_per_split : blocks_of_ranges ? range0 * -sb_per_split : 0;
    const int count = SPLIT ? max(0, min(super_blocks, sb_begin + sb_per_split) - sb_begin)
                      : blocks_of_ranges ? max(0, min(super_blocks, sb_begin + ranges_per_block * -sb_per_split) - sb_begin)
                                         : super_blocks;
    /* Virtual splits (PREP, unsplit launches, sb_per_split = −per < 0; launch_wgmma for batch-invariant calls): the
     * block computes the sums a split-K launch of `per` super-blocks per split would — each range's partial from 0,
     * the partials added in range order, 0 + p0 + p1 + … — one range after another: the same bits as the split launch
     * without its extra blocks; instantiations of their own (VIRT), so the default launch's code carries none of this.
     * VIRTUAL (f16): at each range's end its partial is added to a running sum in registers
     * (`run`, from 0) and acc restarts from 0; after the last range acc = run + acc — one round-to-nearest f32 add at a
     * time in range order, as the split launch's `v.x += p.x` from 0 (cluster_finish, reduce_splits); `run` takes
     * TOKS / 2 more registers through the main loop (within the consumers' 232). SLOTS (bf16, and blocks of ranges):
     * each range's partial but the last is kept in `partials` (virtual_split_store / _sum): with `run` the bf16
     * consumers sat at 229 registers and took 1.05–1.08× the slots' time, where f16 took 0.80–0.91× (thirty-first
     * session, docs/PERF.md). */
    const int virtual_per = VIRT != 0 && sb_per_split < 0 ? -sb_per_split : 0;
    const int virtual_ranges = virtual_per > 0 ? (count + virtual_per - 1) / virtual_per : 1; /* this block's */
    const int slot_stride = blocks_of_ranges ? ranges_all : virtual_ranges - 1; /* slots a tile */
    static_assert(VIRT == 0 || (PREP && !SPLIT), "virtual splits: unsplit PREP launches only");
    if (threadIdx.x == 0) {
        for (int s = 0; s < WG_STAGES; s++) {
            mbarrier_init(bars + 8 * s, PREP ? 129 : 128);      /* the 128 producer threads (PREP: + the bytes' arrive) */
            mbarrier_init(bars + 8 * (WG_STAGES + s), 256);    /* the 256 consumer threads */
            mbarrier_init(bars + 8 * (2 * WG_STAGES + s), 1);  /* the TMA issuer's expect_tx */
        }
        /* the initialised barriers, visible to the other threads and to the async proxy (TMA's complete_tx) */
        asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    const int warpgroup = threadIdx.x >> 7;

    if (warpgroup == 2) {
        /* PREP: the producer only issues copies; its registers go to the consumers (PTX ISA §9.7.17.1, setmaxnreg):
         * wgmma_occupancy's counts (one block an SM: 128 × 40 + 256 × 232 ≤ 65536) */
        if (PREP) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(wgmma_occupancy<BLOCKS>::PRODUCER_REGS));
        /* ───── producer ───── */
        const int p = threadIdx.x - 256;
        const int row_tiles = (N + 15) / 16;
        /* Per stage: the x tile of TOKS rows by KS values arrives by TMA (cp.async.bulk.tensor, PTX ISA §9.7.9.25) in
         * the 128-byte swizzle: value k of token tok at byte (k / 64)·TOKS·128 + tok·128 + (((k % 64) / 8) ^ (tok & 7))·16
         * + (k % 8)·2 — rows past M and values past K zero. Weight quarters and pairs come by cp.async, with the
         * addresses that do not change from stage to stage worked out once:
         *  - weight quarters: rows p/4 + 32c (c < 4), quarter p & 3 — 4 lanes per row, each warp two 1 KB runs of the
         *    tiled layout (packed_tiled_quad);
         *  - pairs: thread p < 32·GSB copies chunk p % (4·GSB) of row tile p / (4·GSB). */
        const uint4 *w_src[4];
        bool w_ok[4], sb_ok;
        const uint4 *sb_src;
        const int sb_tile = p / (4 * L::GSB);
        auto sources = [&]() { /* the current tile's (GROUPED: again for each) */
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int n = n0 + p / 4 + 32 * c;
                w_ok[c] = n < N;
                w_src[c] = packed_t + (w_ok[c] ? packed_tiled_quad<size_t>(n, super_blocks, 0) + (unsigned)(p & 3) : 0);
            }
            const int tile0 = n0 / 16;
            sb_ok = p < 32 * L::GSB && tile0 + sb_tile < row_tiles;
            sb_src = reinterpret_cast<const uint4 *>(sb_t) +
                     (sb_ok ? sb_tiled_run<size_t>(tile0 + sb_tile, super_blocks, 0, L::GSB) + p % (4 * L::GSB) : 0);
        };
        sources();
        /* All copies of the tile's i-th super-block (sb_begin + i of the row) into the block's stage use g (g = i but in
         * a persistent launch's later tiles), after the consumers have handed its buffer back; always commits a group. */
        auto issue = [&](int g, int i) {
            if (i < count) {
                const int s = g % WG_STAGES;
                if (g >= WG_STAGES) mbarrier_wait(bars + 8 * (WG_STAGES + s), ((g / WG_STAGES) - 1) & 1);
                const uint32_t stage = smem_address(shared + s * L::STAGE);
                /* PREP: every copy of the stage completes on `full` itself (TMA and bulk bytes by complete_tx, each
                 * thread's cp.async by the arrive below), so the producer never waits for its own copies */
                const uint32_t full = bars + 8 * s;
                if (p == 0) {
                    const uint32_t x_full = PREP ? full : bars + 8 * (2 * WG_STAGES + s);
                    /* PREP: the 129th arrival on `full`, with the bytes the TMA and the bulk copy will complete (before
                     * them, so the phase cannot end early); the 128 threads' cp.async arrivals are the others */
                    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(x_full),
                                 "r"(L::X_BYTES + (PREP ? L::XSUM_BYTES : 0))
                                 : "memory");
                    if (PREP) /* the tokens' Σx pieces of this super-block (x_sums: [super-blocks][M_pad][XP_ROW bytes]) */
                        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                                         stage + L::XSUM_AT),
                                     "l"(x_sums + ((size_t)(sb_begin + i) * m_pad + x_row + m0) * (L::XP_ROW / 4)),
                                     "r"(L::XSUM_BYTES), "r"(x_full)
                                     : "memory");
#pragma unroll
                    for (int column = 0; column < L::KS / 64; column++)
                        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
                                         stage + column * (TOKS * 128)),
                                     "l"(&x_map), "r"((sb_begin + i) * L::KS + 64 * column), "r"(x_row + m0), "r"(x_full)
                                     : "memory");
                }
#pragma unroll
                for (int c = 0; c < 4; c++)
                    cp_async_16(stage + L::W_AT + (p + 128 * c) * 16, w_src[c] + (w_ok[c] ? 64 * (sb_begin + i) : 0),
                                w_ok[c]);
                if (p < 32 * L::GSB)
                    cp_async_16(stage + L::SB_AT + p * 16, sb_src + (sb_ok ? 4 * L::GSB * (sb_begin + i) : 0), sb_ok);
                if (PREP) /* this thread's arrival on `full` once its copies above have landed (PTX ISA §9.7.9.23.3) */
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(full) : "memory");
            }
            asm volatile("cp.async.commit_group;");
        };
        if constexpr (PREP) { /* only issue: each stage as soon as its buffer is handed back (WG_STAGES in flight) */
            int uses = 0; /* stage uses issued (GROUPED: over the block's tiles) */
            for (;;) {
                for (int i = 0; i < count; i++) issue(uses + i, i);
                uses += count;
                if constexpr (!GROUPED) break;
                work += (int)gridDim.x;
                if (!next_tile()) break;
                sources();
            }
            asm volatile("cp.async.wait_all;");
            /* no thread leaves with a copy in flight: the last stages handed back means their TMA and bulk bytes landed */
            for (int i = uses > WG_STAGES ? uses - WG_STAGES : 0; i < uses; i++)
                mbarrier_wait(bars + 8 * (WG_STAGES + i % WG_STAGES), (i / WG_STAGES) & 1);
            return;
        }
        constexpr int AHEAD = WG_STAGES - 1; /* stages whose copies are issued before the first is prepared */
#pragma unroll
        for (int d = 0; d < AHEAD; d++) issue(d, d);
        const uint32_t ones = mma_traits<T>::ones, ones4[4] = {ones, ones, ones, ones};
        for (int i = 0; i < count; i++) {
            const int s = i % WG_STAGES;
            /* this thread's copies of stage i have landed (stages i + 1 … i + AHEAD − 1 may still be in flight) */
            asm volatile("cp.async.wait_group %0;" ::"n"(AHEAD - 1));
            mbarrier_wait(bars + 8 * (2 * WG_STAGES + s), (i / WG_STAGES) & 1); /* and the stage's x tile */
            uint8_t *stage = shared + s * L::STAGE;
            if (!PREP && p < TOKS) {
                /* Thread p permutes token p's row in place: the four 16-byte pieces of a 32-code block become the
                 * four of the decoded weights' k order (x_pairs: piece c's a-th pair goes to word 4a + c). */
                uint8_t *row = stage + p * 128;
                const int x7 = p & 7;
#pragma unroll
                for (int blk = 0; blk < L::BPS; blk++) {
                    uint8_t *column = row + (blk / 2) * (TOKS * 128);
                    uint4 v[4];
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        v[c] = *reinterpret_cast<const uint4 *>(column + ((((blk & 1) * 4 + c) ^ x7) * 16));
                    uint32_t b[4][4];
#pragma unroll
                    for (int c = 0; c < 4; c++) x_pairs<BITS>(v[c], b[c]);
#pragma unroll
                    for (int a = 0; a < 4; a++)
                        *reinterpret_cast<uint4 *>(column + ((((blk & 1) * 4 + a) ^ x7) * 16)) =
                            make_uint4(b[0][a], b[1][a], b[2][a], b[3][a]);
                }
                __syncwarp();
                /* Σx per segment on the tensor cores (an all-ones A, x as B — exact products, f32 sums): warp pw
                 * takes its 32 tokens, 4 groups of 8, one ldmatrix.x4 (the block's four pieces of 8 tokens) and two
                 * MMAs per group and block; lanes 0–3 (row 0 of C) write tokens 2t, 2t + 1 of each group. */
                const int pw = p >> 5, lane = p & 31;
                float c[4][4];
#pragma unroll
                for (int blk = 0; blk < L::BPS; blk++) {
                    if (blk % L::SEG_BLOCKS == 0) {
#pragma unroll
                        for (int tg = 0; tg < 4; tg++)
#pragma unroll
                            for (int e = 0; e < 4; e++) c[tg][e] = 0.0f;
                    }
#pragma unroll
                    for (int tg = 0; tg < 4; tg++) {
                        const int tok = 32 * pw + 8 * tg + (lane & 7), piece = (blk & 1) * 4 + (lane >> 3);
                        const uint32_t at = smem_address(stage + (blk / 2) * (TOKS * 128) + tok * 128 + ((piece ^ (lane & 7)) * 16));
                        uint32_t r[4];
                        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                                     : "r"(at));
                        mma_16816(c[tg], ones4, r[0], r[1], T());
                        mma_16816(c[tg], ones4, r[2], r[3], T());
                    }
                    if ((blk + 1) % L::SEG_BLOCKS == 0 && lane < 4) {
                        float *xsum = reinterpret_cast<float *>(stage + L::XSUM_AT) + (blk / L::SEG_BLOCKS) * TOKS + 32 * pw + 2 * lane;
#pragma unroll
                        for (int tg = 0; tg < 4; tg++) *reinterpret_cast<float2 *>(xsum + 8 * tg) = make_float2(c[tg][0], c[tg][1]);
                    }
                }
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the stores, visible to wgmma's reads */
            mbarrier_arrive(bars + 8 * s);
            /* then the copies AHEAD stages on, into the buffer the consumers finish with now: the preparation of
             * stage i + 1 runs while they compute stage i */
            issue(i + AHEAD, i + AHEAD);
        }
        asm volatile("cp.async.wait_all;");
        return;
    }

    /* ───── consumers ───── */
    if (PREP) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(wgmma_occupancy<BLOCKS>::CONSUMER_REGS));
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    const int row_w = 64 * warpgroup + 16 * warp; /* the warp's first row in the block */
    float acc[TOKS / 2], part[TOKS / 2], run[VIRTUAL ? TOKS / 2 : 1]; /* run: VIRTUAL's ranges' sum so far */
    /* TWO_PARTS (the prepared 64- and 32-token tiles, segments of a stage ≥ 2): two segment accumulators, so that segment
     * sg + 1 is decoded and its wgmmas issued before segment sg's wait and FMAs (wgmma.wait_group 1), and those FMAs
     * run while sg + 1's wgmmas do. The same operations on acc in the same order (b·Σx, then each segment in turn):
     * the same bits. Not at 128 tokens: two parts and acc would be 192 registers before any fragment (docs/PERF.md,
     * twenty-second session); the twenty-first session's microbenchmark: 178 → 116 cycles a wgmma with decode-like
     * work between. */
    constexpr bool TWO_PARTS = PREP && TOKS <= 64 && L::SEG >= 2 && wgmma_occupancy<BLOCKS>::PARTS_OK;
    /* (PREP: no turns) */
    float part2[TWO_PARTS ? TOKS / 2 : 1];
    int uses = 0; /* stage uses before this tile (GROUPED: the block's earlier tiles') */
    for (;;) { /* a tile (GROUPED: each of the block's in turn) */
#pragma unroll
    for (int e = 0; e < TOKS / 2; e++) acc[e] = 0.0f;
#pragma unroll
    for (int e = 0; e < (VIRTUAL ? TOKS / 2 : 1); e++) run[e] = 0.0f;
    int range_left = virtual_per; /* VIRTUAL: super-blocks left in this range */
    constexpr bool TURNS = !PREP && !SPLIT; /* the consumers take turns (turn_wait) */
    if (TURNS && warpgroup == 1) turn_pass(1); /* warpgroup 0 issues first */
#pragma unroll 1
    for (int i = 0; i < count; i++) {
        const int s = (uses + i) % WG_STAGES;
        mbarrier_wait(bars + 8 * s, ((uses + i) / WG_STAGES) & 1);
        const uint8_t *stage = shared + s * L::STAGE;
        const uint4 *ws = reinterpret_cast<const uint4 *>(stage + L::W_AT);
        const uint4 wq0 = ws[(row_w + g) * 4 + t], wq1 = ws[(row_w + g + 8) * 4 + t];
        const uint32_t *pairs = reinterpret_cast<const uint32_t *>(stage + L::SB_AT) + (row_w + g) * L::GSB;
        const float *xsum = reinterpret_cast<const float *>(stage + L::XSUM_AT);
        const uint32_t x_at = smem_address(stage);
        /* PREP: the stage's b·Σx on the tensor cores, a wgmma group of its own that runs while segment 0 is decoded:
         * acc += B · P over k slots 3·sg + piece, A = each row's b of segment k / 3 (exact in tf32), P = the Σx pieces
         * (exact products, f32 sums), one wgmma k8 tf32 per chunk of 8 slots */
        constexpr int BIAS_CHUNKS = PREP ? L::XP_CHUNKS : 1; /* (1 without PREP: an unused array) */
        uint32_t bias_a[BIAS_CHUNKS][4];
        if (PREP) {
            float b0[L::SEG], b1[L::SEG];
#pragma unroll
            for (int q = 0; q < L::SEG; q++) {
                b0[q] = scale_bias(pairs[q], T()).y;
                b1[q] = scale_bias(pairs[8 * L::GSB + q], T()).y;
            }
#pragma unroll
            for (int kc = 0; kc < BIAS_CHUNKS; kc++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int seg = (8 * kc + t + 4 * half) / 3;
                    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
                    for (int q = 0; q < L::SEG; q++)
                        if (seg == q) v0 = b0[q], v1 = b1[q];
                    bias_a[kc][2 * half] = __float_as_uint(v0);     /* row g, slot 8·kc + t + 4·half */
                    bias_a[kc][2 * half + 1] = __float_as_uint(v1); /* row g + 8 */
                }
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < BIAS_CHUNKS; kc++)
                wgmma_tf32(acc, bias_a[kc], descriptor_interleave(x_at + L::XSUM_AT + 256 * kc, 128, 256 * L::XP_CHUNKS));
            wgmma_commit();
        }
        /* PREP (b·Σx in acc already): acc = fma(s, Σq·x, acc) for segment sg's part p, rows g and g + 8, tokens
         * 8j + 2t and 8j + 2t + 1 */
        auto finish = [&](const float (&p)[TOKS / 2], int sg) {
            const float s0 = scale_bias(pairs[sg], T()).x * mma_decode<BITS, T>::code_scale;
            const float s1 = scale_bias(pairs[8 * L::GSB + sg], T()).x * mma_decode<BITS, T>::code_scale;
#pragma unroll
            for (int j = 0; j < TOKS / 8; j++) {
                acc[4 * j + 0] = __fmaf_rn(s0, p[4 * j + 0], acc[4 * j + 0]);
                acc[4 * j + 1] = __fmaf_rn(s0, p[4 * j + 1], acc[4 * j + 1]);
                acc[4 * j + 2] = __fmaf_rn(s1, p[4 * j + 2], acc[4 * j + 2]);
                acc[4 * j + 3] = __fmaf_rn(s1, p[4 * j + 3], acc[4 * j + 3]);
            }
        };
        if constexpr (TWO_PARTS) {
            /* segment sg into part (sg even) or part2 (odd) from frags[sg % 2]; its FMAs after sg + 1's issue */
            uint32_t frags[2][L::SEG_BLOCKS][2][4];
            decode_segment<BITS, T, L::SEG_BLOCKS>(wq0, wq1, 0, frags[0]);
            wgmma_wait_all(); /* b·Σx (above) done: acc is no accumulator in flight from here */
#pragma unroll
            for (int e = 0; e < TOKS / 2; e++) register_fence(acc[e]);
            wgmma_fence();
            issue_segment<T, TOKS, L::SEG_BLOCKS, PREP>(part, frags[0], x_at, 0);
#pragma unroll
            for (int sg = 1; sg < L::SEG; sg++) {
                decode_segment<BITS, T, L::SEG_BLOCKS>(wq0, wq1, sg, frags[sg % 2]); /* while sg − 1's wgmmas run */
                wgmma_fence();
                if (sg % 2) issue_segment<T, TOKS, L::SEG_BLOCKS, PREP>(part2, frags[1], x_at, sg);
                else issue_segment<T, TOKS, L::SEG_BLOCKS, PREP>(part, frags[0], x_at, sg);
                wgmma_wait_one(); /* segment sg − 1 done, sg in flight */
                if (sg % 2) {
#pragma unroll
                    for (int e = 0; e < TOKS / 2; e++) register_fence(part[e]);
                    finish(part, sg - 1);
                } else {
#pragma unroll
                    for (int e = 0; e < TOKS / 2; e++) register_fence(part2[e]);
                    finish(part2, sg - 1);
                }
            }
            wgmma_wait_all();
            if ((L::SEG - 1) % 2) {
#pragma unroll
                for (int e = 0; e < TOKS / 2; e++) register_fence(part2[e]);
                finish(part2, L::SEG - 1);
            } else {
#pragma unroll
                for (int e = 0; e < TOKS / 2; e++) register_fence(part[e]);
                finish(part, L::SEG - 1);
            }
        } else
#pragma unroll
        for (int sg = 0; sg < L::SEG; sg++) {
            uint32_t a[L::SEG_BLOCKS][2][4];
            decode_segment<BITS, T, L::SEG_BLOCKS>(wq0, wq1, sg, a);
            if (PREP && sg == 0) { /* b·Σx (above) done: acc is no accumulator in flight while part is */
                wgmma_wait_all();
#pragma unroll
                for (int e = 0; e < TOKS / 2; e++) register_fence(acc[e]);
            }
            if (TURNS) turn_wait(warpgroup);
            wgmma_fence();
            issue_segment<T, TOKS, L::SEG_BLOCKS, PREP>(part, a, x_at, sg);
            if (TURNS) turn_pass(warpgroup);
            wgmma_wait_all();
#pragma unroll
            for (int e = 0; e < TOKS / 2; e++) register_fence(part[e]);
            if (PREP) {
                finish(part, sg);
                continue;
            }
            /* acc = fma(s, Σq·x, fma(b, Σx, acc)) for rows g and g + 8, tokens 8j + 2t and 8j + 2t + 1 */
            const float2 sb0 = scale_bias(pairs[sg], T()), sb1 = scale_bias(pairs[8 * L::GSB + sg], T());
            const float s0 = sb0.x * mma_decode<BITS, T>::code_scale, s1 = sb1.x * mma_decode<BITS, T>::code_scale;
#pragma unroll
            for (int j = 0; j < TOKS / 8; j++) {
                const float2 xs = *reinterpret_cast<const float2 *>(xsum + sg * TOKS + 8 * j + 2 * t);
                acc[4 * j + 0] = __fmaf_rn(s0, part[4 * j + 0], __fmaf_rn(sb0.y, xs.x, acc[4 * j + 0]));
                acc[4 * j + 1] = __fmaf_rn(s0, part[4 * j + 1], __fmaf_rn(sb0.y, xs.y, acc[4 * j + 1]));
                acc[4 * j + 2] = __fmaf_rn(s1, part[4 * j + 2], __fmaf_rn(sb1.y, xs.x, acc[4 * j + 2]));
                acc[4 * j + 3] = __fmaf_rn(s1, part[4 * j + 3], __fmaf_rn(sb1.y, xs.y, acc[4 * j + 3]));
            }
        }
        mbarrier_arrive(bars + 8 * (WG_STAGES + s)); /* every thread: an arrive releases its own reads only */
        if constexpr (VIRTUAL) {
            if (--range_left == 0 && i + 1 < count) { /* a range ends: run += p, acc = 0 */
#pragma unroll
                for (int e = 0; e < TOKS / 2; e++) run[e] = __fadd_rn(run[e], acc[e]), acc[e] = 0.0f;
                range_left = virtual_per;
            }
        } else if constexpr (SLOTS) {
            if (virtual_per > 0 && (i + 1) % virtual_per == 0 && i + 1 < count) /* a range ends: its partial kept, acc = 0 */
                virtual_split_store<TOKS>(
                    virtual_split_slot<TOKS>(partials, tile, slot_stride, range0 + (i + 1) / virtual_per - 1), acc);
        }
    }
    if constexpr (VIRTUAL) {
        if (virtual_ranges > 1) { /* acc = 0 + p0 + p1 + … + acc */
#pragma unroll
            for (int e = 0; e < TOKS / 2; e++) acc[e] = __fadd_rn(run[e], acc[e]);
        }
    } else if constexpr (SLOTS) {
        if (blocks_of_ranges) { /* the last range's partial to its slot too; the tile's last block to arrive sums them */
            if (count > 0)
                virtual_split_store<TOKS>(
                    virtual_split_slot<TOKS>(partials, tile, slot_stride, range0 + virtual_ranges - 1), acc);
            if (!split_arrived_last<256>(counters, (unsigned)blockIdx.x)) return;
            virtual_split_sum<TOKS>(partials, tile, slot_stride, ranges_all, false, acc); /* acc = 0 + p0 + … */
            if (threadIdx.x == 0) counters[blockIdx.x] = 0; /* ready for the next launch on the stream */
        } else if (virtual_ranges > 1) {
            virtual_split_sum<TOKS>(partials, tile, slot_stride, virtual_ranges - 1, true, acc); /* 0 + p0 + … + acc */
        }
    }
    if (TURNS && warpgroup == 0) turn_wait(0); /* warpgroup 1's last pass (every barrier phase completes before the exit) */

    if constexpr (SPLIT) {
        /* split-K: the partial tile into shared memory — the stages' buffers, once both consumer warpgroups are past
         * their last stage (the producer issues no more) — then split_finish */
        static_assert(TOKS * WG_ROWS * 4 <= WG_STAGES * L::STAGE, "the partial tile fits in the stages' buffers");
        block_barrier<256>();
        float *tile_partial = reinterpret_cast<float *>(shared);
#pragma unroll
        for (int j = 0; j < TOKS / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                tile_partial[(8 * j + 2 * t + (e & 1)) * WG_ROWS + row_w + g + 8 * (e >> 1)] = acc[4 * j + e];
        unsigned cluster_ctas;
        asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(cluster_ctas));
        if (cluster_ctas > 1 && cluster_ctas == gridDim.z) /* the splits are one cluster: launch_wgmma's cluster launch */
            cluster_finish<BITS, T, GS, TOKS>(tile_partial, x, w_orig, scales, biases, out, M, N, K, n0, m0);
        else
            split_finish<BITS, T, GS, TOKS>(tile_partial, partials, counters, x, w_orig, scales, biases, out, M, N, K,
                                            n0, m0);
    } else {
        /* the outputs and, for the non-finite rule, x and the MLX-layout weights (GROUPED: the current product's; its
         * x rows through group.x_rows where given) */
        const T *x_t = x, *scales_t = scales, *biases_t = biases;
        const uint32_t *w_t = w_orig;
        T *out_t = out;
        if constexpr (GROUPED) {
            if (!group.x_rows) x_t += entry->x;
            w_t += entry->w, scales_t += entry->scales, biases_t += entry->scales, out_t += entry->out;
        }
        /* Stores: rows n0 + row_w + g (+8), tokens m0 + 8j + 2t (+1). */
#pragma unroll
        for (int j = 0; j < TOKS / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int m = m0 + 8 * j + 2 * t + (e & 1), n = n0 + row_w + g + 8 * (e >> 1);
                if (m < M && n < N) {
                    float value = acc[4 * j + e];
                    if (!isfinite(value))
                        value = direct_output_t(GROUPED && group.x_rows ? x + (size_t)group.x_rows[entry->x + m] * K
                                                                        : x_t + (size_t)m * K,
                                                w_t + (size_t)n * (K / 32 * BITS),
                                                scales_t + (size_t)n * groups, biases_t + (size_t)n * groups, BITS,
                                                (size_t)K, GS);
                    store_f32(out_t, (size_t)m * N + n, value);
                }
            }
    }
    if constexpr (!GROUPED) break;
    uses += count;
    work += (int)gridDim.x;
    if (!next_tile()) break;
    } /* the tiles */
#elif defined(__CUDA_ARCH__)
    __trap(); /* device code without sm_90a features (supports() should have refused): fail, never return silently */
#endif
}

/* x prepared once per call for the PREP tiles (every block of a column of tiles used to permute the same x tile and sum
 * it again): each thread takes one 128-bit piece of x (8 values; four lanes a 32-value block, 4 · SEG_BLOCKS lanes a
 * segment = group ∩ super-block; thread index ((q · super-blocks + super-block) · BPS + block) · 4 + piece, so a warp's
 * loads and stores are contiguous) in each of PREP_ROWS rows PREP_ROWS · q … — each block in the k order of the decoded weights (x_pairs, as the producer
 * permutes a stage in place: word a of output piece a' is pair a' of input piece a, a 4 × 4 transpose over the
 * block's four lanes by shuffles), into x_prepared [M, K]; the segment's Σx in f32 (each lane's 8 values in order,
 * then a shuffle tree over the segment's lanes), as three tf32 pieces at its slots of x_sums [super-blocks][m_pad ·
 * XP_ROW bytes] (x_sums_at) (zeros past K, past M and in the unused slots). m_pad: M rounded up to 128, so that every
 * tile's pieces are whole. One thread per segment (the twentieth session's form) left 8 warps an SM at M = 512,
 * K = 4096 and took 8.5 µs, a fifth of the call (ncu, twenty-fourth session). */
template <int BITS, typename T, int GS>
__global__ void __launch_bounds__(256) wgmma_prepare_x(const T *__restrict__ x, T *__restrict__ x_prepared,
                                                       float *__restrict__ x_sums, int M, int K,
                                                       const wgmma_grouped_work group) {
#if QMM_WGMMA_DEVICE
    using L = wgmma_layout<BITS, GS, 128, true>; /* SEG, SEG_BLOCKS and the slots do not depend on TOKS */
    constexpr int LANES = 4 * L::SEG_BLOCKS; /* a segment's lanes: 4, 8 or 16, aligned within the warp */
    const int blocks_k = K / 32, super_blocks = (blocks_k + L::BPS - 1) / L::BPS;
    const int m_pad = x_sums_tokens(M);
    /* launch_wgmma starts m_pad / PREP_ROWS · super_blocks · BPS · 4 threads (a multiple of 256: m_pad of 128), a thread
     * for rows PREP_ROWS · q … + PREP_ROWS − 1 of one piece, so every warp is whole for the shuffles. Grouped
     * (group.tile_products: launch_wgmma_grouped; M the prepared rows, a multiple of the tokens; M / PREP_ROWS ·
     * super_blocks · BPS · 4 threads, a multiple of 32, in blocks of 256: a last block's surplus warps return at once):
     * prepared row m is row m − x_row of the product group.tile_products[m >> token_shift] (the grouped tile's tokens,
     * 32 or 64; one for a thread's rows), x's row x_rows[e.x + m − x_row] (or e.x / K + m − x_row without x_rows) up to
     * its M, zeros after (its last tile's). */
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int piece = (int)(index & 3), j = (int)(index / 4 % L::BPS);
    const size_t quad_sb = index / (4 * L::BPS);
    int quad, sbk; /* the thread's rows' quad and super-block sbk: quad_sb's quotient and remainder by super_blocks, in
                    * 32 bits where they fit (a 64-bit division is a long routine) */
    if (quad_sb >> 32 == 0) {
        const unsigned q = (unsigned)quad_sb / (unsigned)super_blocks;
        quad = (int)q, sbk = (int)((unsigned)quad_sb - q * (unsigned)super_blocks);
    } else {
        quad = (int)(quad_sb / super_blocks), sbk = (int)(quad_sb % super_blocks);
    }
    if (quad >= (group.tile_products ? M : m_pad) / PREP_ROWS) return; /* (whole warps) */
    const int sg = j / L::SEG_BLOCKS, blk = sbk * L::BPS + j, m0 = quad * PREP_ROWS;
    /* the rows' pieces first, loads together (x's row for prepared row m; zeros past M, past K and past a product's M) */
    uint4 v[PREP_ROWS];
    const qmm_cuda_gemv_product *e = group.tile_products ? group.tile_products + (m0 >> group.token_shift) : nullptr;
#pragma unroll
    for (int r = 0; r < PREP_ROWS; r++) {
        const int m = m0 + r;
        v[r] = make_uint4(0u, 0u, 0u, 0u);
        if (blk >= blocks_k) continue;
        if (e) {
            const int local = m - (int)e->x_row;
            if (local >= (int)e->M) continue; /* (the indices end with the last product's M) */
            const T *x_m = group.x_rows ? x + (size_t)group.x_rows[e->x + (unsigned)local] * K : x + e->x + (size_t)local * K;
            v[r] = reinterpret_cast<const uint4 *>(x_m + (size_t)blk * 32)[piece];
        } else if (m < M) {
            v[r] = reinterpret_cast<const uint4 *>(x + (size_t)m * K + (size_t)blk * 32)[piece];
        }
    }
    /* every lane of a segment holds its sum after the shuffle tree: lanes 0–2 of the segment store its pieces 0–2, lane
     * 3 of the last segment the zeros of the unused slots; the rows' group of 8 tokens through the pointer (x_sums_at's
     * int arithmetic would overflow past 2^27 rows), then x_sums_at within it */
    const int lane = (int)(index % LANES);
    const bool sums_lane = lane < 3 || (lane == 3 && sg == L::SEG - 1);
    float *tile = x_sums + ((size_t)sbk * m_pad + (size_t)(m0 / 8 * 8)) * (L::XP_ROW / 4);
#pragma unroll
    for (int r = 0; r < PREP_ROWS; r++) {
        const int m = m0 + r;
        float sum = 0.0f;
        const T *h = reinterpret_cast<const T *>(&v[r]);
#pragma unroll
        for (int i = 0; i < 8; i++) sum += (float)h[i];
        uint32_t b[4];
        x_pairs<BITS>(v[r], b);
        /* the 4 × 4 transpose over the block's four lanes (word w of lane `piece` becomes word `piece` of lane w) in two
         * butterfly steps, on bit 0 then bit 1 of the lane and word indices: in step d (1, 2) a lane keeps its words
         * whose bit d is its own and swaps the other two with lane piece ^ d, the partner's words whose bit d is this
         * lane's — after both, word w of lane q is word q of lane w. Branch-free (four rounds of indexed shuffles with
         * dynamic word choices compiled to branches: with them the pre-pass ran 290 instructions a warp, 47 M at
         * T = 2048 on Qwen3-30B-A3B's gate_up, forty-fourth session). */
#pragma unroll
        for (int d = 1; d <= 2; d <<= 1) {
            const bool high = piece & d; /* this lane's bit d: it keeps the words with bit d set */
            const int lo0 = 0, lo1 = d == 1 ? 2 : 1; /* the words with bit d clear */
            const int hi0 = lo0 + d, hi1 = lo1 + d;  /* and set */
            const uint32_t send0 = high ? b[lo0] : b[hi0], send1 = high ? b[lo1] : b[hi1];
            const uint32_t got0 = __shfl_xor_sync(0xffffffffu, send0, d), got1 = __shfl_xor_sync(0xffffffffu, send1, d);
            b[lo0] = high ? got0 : b[lo0], b[lo1] = high ? got1 : b[lo1];
            b[hi0] = high ? b[hi0] : got0, b[hi1] = high ? b[hi1] : got1;
        }
        if (blk < blocks_k && m < M) /* grouped: the zeros of the last tile's rows past its product's M too */
            reinterpret_cast<uint4 *>(x_prepared + (size_t)m * K + (size_t)blk * 32)[piece] = make_uint4(b[0], b[1], b[2], b[3]);
#pragma unroll
        for (int d = 1; d < LANES; d <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
        if (!sums_lane) continue;
        if (lane < 3) {
            tile[x_sums_at(m % 8, 3 * sg + lane, L::XP_CHUNKS)] = tf32_piece(sum, lane);
        } else {
            for (int k = 3 * L::SEG; k < 8 * L::XP_CHUNKS; k++) tile[x_sums_at(m % 8, k, L::XP_CHUNKS)] = 0.0f;
        }
    }
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

/* The bytes of the PREP tiles' workspace (x_prepared, then x_sums at a 256-byte boundary) for an [M, K] x. */
template <int BITS, int GS> static size_t prepared_bytes(size_t M, size_t K, size_t *sums_at) {
    using L = wgmma_layout<BITS, GS, 128, true>;
    const size_t super_blocks = (K / 32 + L::BPS - 1) / L::BPS;
    *sums_at = (M * K * 2 + 255) / 256 * 256;
    return *sums_at + super_blocks * x_sums_tokens(M) * L::XP_ROW;
}
static size_t prepared_bytes_of(int bits, int group_size, size_t M, size_t K, size_t *sums_at) {
    if (bits == 4) return group_size == 32 ? prepared_bytes<4, 32>(M, K, sums_at)
                          : group_size == 64 ? prepared_bytes<4, 64>(M, K, sums_at) : prepared_bytes<4, 128>(M, K, sums_at);
    return group_size == 32 ? prepared_bytes<8, 32>(M, K, sums_at)
           : group_size == 64 ? prepared_bytes<8, 64>(M, K, sums_at) : prepared_bytes<8, 128>(M, K, sums_at);
}

/* The TMA descriptor of x [M, K] (f16/bf16): boxes of `tokens` rows by 64 values, 128-byte swizzle, zeros outside
 * (CUDA driver API cuTensorMapEncodeTiled, fetched once through the runtime so that nothing links libcuda).
 * Returns a cudaError_t: cudaErrorInvalidValue when the driver refuses the map (e.g. x not 16-byte aligned). */
static int x_tensor_map(CUtensorMap *map, const qmm_cuda_launch *c, const void *x, int tokens) {
    static std::atomic<PFN_cuTensorMapEncodeTiled_v12000> cached{nullptr}; /* the same value from any thread */
    PFN_cuTensorMapEncodeTiled_v12000 encode = cached.load(std::memory_order_acquire);
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        void *function = nullptr;
#if CUDART_VERSION >= 12050
        const cudaError_t error = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                                   cudaEnableDefault, &found);
#else
        const cudaError_t error = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found);
#endif
        if (error != cudaSuccess) return (int)error;
        if (found != cudaDriverEntryPointSuccess || !function) return (int)cudaErrorNotSupported;
        encode = (PFN_cuTensorMapEncodeTiled_v12000)function;
        cached.store(encode, std::memory_order_release);
    }
    const cuuint64_t dims[2] = {(cuuint64_t)c->K, (cuuint64_t)c->M};
    const cuuint64_t strides[1] = {(cuuint64_t)c->K * 2}; /* bytes between rows */
    const cuuint32_t box[2] = {64, (cuuint32_t)tokens}, element_strides[2] = {1, 1};
    const CUresult result = encode(map, c->dtype == 1 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                                   const_cast<void *>(x), dims, strides, box, element_strides,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return result == CUDA_SUCCESS ? 0 : (int)cudaErrorInvalidValue;
}

/* The split-K cluster launch (cluster_finish): grid (tiles, 1, splits) in clusters of (1, 1, splits), at most
 * WG_CLUSTER_MAX = 8 blocks (the portable cluster size, CUDA programming guide "Thread Block Clusters"). */
constexpr int WG_CLUSTER_MAX = 8;
/* How many such clusters the device runs at a time (cudaOccupancyMaxActiveClusters: one block of this shared memory
 * per SM, `splits` SMs of one GPC — the GPCs' sizes leave some SMs out), asked once per instantiation, split count and
 * device (`answers`: per device, the count + 1, 0 = not asked yet; atomic, since contexts may run on several threads;
 * devices 0–7, others ask every time); 0 where it cannot be had — an error (not cached: it may be an earlier
 * launch's), or inside a stream capture before the first answer (a call that is not known to be capture-safe is not
 * made there; a chain step's reserve hook asks before the capture, wgmma_prime). */
template <typename Kernel>
static int cluster_capacity(Kernel kernel, dim3 grid, size_t shared, int splits, void *stream,
                            std::atomic<int> (*answers)[8]) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return cudaGetLastError(), 0;
    std::atomic<int> *answer = device >= 0 && device < 8 ? &(*answers)[device] : nullptr;
    const int known = answer ? answer->load(std::memory_order_relaxed) : 0;
    if (known > 0) return known - 1;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
        return cudaGetLastError(), 0;
    cudaLaunchConfig_t config;
    cudaLaunchAttribute attributes[2];
    launch_config(&config, attributes, grid, dim3(WG_THREADS), shared, nullptr, false, splits);
    int count = 0;
    if (cudaOccupancyMaxActiveClusters(&count, kernel, &config) != cudaSuccess)
        return cudaGetLastError(), 0; /* not the call's failure: it runs through the workspace */
    if (count < 0) count = 0;
    if (answer) answer->store(count + 1, std::memory_order_relaxed);
    return count;
}
/* PREP (c->wgmma_prepared, the default rows, batch-invariant calls on Hopper among them): x prepared by
 * wgmma_prepare_x, then the tile with b·Σx on the tensor cores; otherwise (the _fma rows, or no workspace) x permuted
 * in each block and b·Σx by FMA. */
template <int BITS, typename T, int GS, int TOKS> static int launch_wgmma(const qmm_cuda_launch *c) {
    using L = wgmma_layout<BITS, GS, TOKS>;
    if (TOKS == 32 && !c->wgmma_prepared) return (int)cudaErrorInvalidValue; /* its caller runs 64 tokens instead */
    const int tiles = (int)(((c->N + WG_ROWS - 1) / WG_ROWS) * ((c->M + TOKS - 1) / TOKS));
    /* the last wave (wgmma_splits): tiles [0, whole) unsplit, then [whole, tiles) in `splits` splits of K — the splits
     * sized for those tiles' workspace, so where the range does not hold, none */
    const bool last_wave = c->wgmma_whole_tiles > 0, whole_ok = last_wave && c->wgmma_whole_tiles < tiles;
    const int super_blocks = (int)((c->K / 32 + L::BPS - 1) / L::BPS);
    int per_split;
    const int splits = split_count(super_blocks, last_wave && !whole_ok ? 1 : c->splits, &per_split);
    const int whole = splits > 1 && whole_ok ? c->wgmma_whole_tiles : 0;
    const bool prep = c->wgmma_prepared != NULL;
    /* virtual splits (wgmma_tile_kernel's virtual_per): an unsplit PREP launch — the whole launch, or the whole waves'
     * one where there is a last wave — that sums as `wgmma_virtual_splits` splits would: f16 in registers (VIRTUAL),
     * bf16 with its ranges' partials in c->wgmma_virtual_sums ([tiles][ranges − 1][TOKS × 128] floats; blocks of
     * ranges, any dtype: [tiles][ranges][…]) */
    constexpr bool in_registers = std::is_same<T, __half>::value;
    int virtual_per = 0;
    /* blocks of virtual ranges (wgmma_tile_kernel's blocks_of_ranges): c->wgmma_virtual_blocks a tile, the slots and
     * the split-K counters, any dtype */
    const int range_blocks =
        prep && c->wgmma_virtual_blocks > 1 && c->wgmma_virtual_sums && c->counters && !c->wgmma_whole_tiles
            ? c->wgmma_virtual_blocks
            : 0;
    if (TOKS != 32 && prep && c->wgmma_virtual_splits > 1 && (in_registers || c->wgmma_virtual_sums)) {
        split_count(super_blocks, c->wgmma_virtual_splits, &virtual_per);
        if (virtual_per >= super_blocks) virtual_per = 0; /* one range: nothing to add */
    }
    const size_t shared = prep ? (size_t)wgmma_layout<BITS, GS, TOKS, true>::SHARED : (size_t)L::SHARED;
    /* the virtual ranges' partials in slots: bf16, and blocks of ranges (every dtype) */
    const bool in_slots = virtual_per && (!in_registers || range_blocks);
    static unsigned long long opted_in[7] = {0, 0, 0, 0, 0, 0, 0};
    auto kernel_of = [&](bool split, int *variant) {
        *variant = prep && !split && virtual_per ? (in_slots ? 5 : 4) : (prep ? 2 : 0) + (split ? 1 : 0);
        if constexpr (TOKS == 32) { /* PREP only (launch_wgmma refuses the rest): the 32-token row runs the 64-token
                                     * _fma kernels where x cannot be prepared, and takes no batch-invariant call; its
                                     * unsplit launch two blocks an SM where c->wgmma_blocks says (variant 6) */
            if (*variant == 2 && splits == 1 && c->wgmma_blocks == 2) *variant = 6;
            return *variant == 2   ? wgmma_tile_kernel<BITS, T, GS, TOKS, false, true>
                   : *variant == 6 ? wgmma_tile_kernel<BITS, T, GS, TOKS, false, true, 0, false, 2>
                                   : wgmma_tile_kernel<BITS, T, GS, TOKS, true, true>;
        } else {
            return *variant == 0   ? wgmma_tile_kernel<BITS, T, GS, TOKS, false, false>
                   : *variant == 1 ? wgmma_tile_kernel<BITS, T, GS, TOKS, true, false>
                   : *variant == 2 ? wgmma_tile_kernel<BITS, T, GS, TOKS, false, true>
                   : *variant == 3 ? wgmma_tile_kernel<BITS, T, GS, TOKS, true, true>
                   : *variant == 4 ? wgmma_tile_kernel<BITS, T, GS, TOKS, false, true, in_registers ? 1 : 2>
                                   : wgmma_tile_kernel<BITS, T, GS, TOKS, false, true, 2>;
        }
    };
    int variant, whole_variant;
    auto kernel = kernel_of(splits > 1, &variant), whole_kernel = kernel_of(false, &whole_variant);
    int opt_in = shared_memory_opt_in(kernel, shared, &opted_in[variant]);
    if (!opt_in && whole) opt_in = shared_memory_opt_in(whole_kernel, shared, &opted_in[whole_variant]);
    if (opt_in) return opt_in;
    const int grid_z = splits == 1 && virtual_per && range_blocks ? range_blocks : splits; /* blocks of ranges, or splits */
    const dim3 grid((unsigned)(tiles - whole), 1, (unsigned)grid_z);
    static std::atomic<int> cluster_answers[7][WG_CLUSTER_MAX + 1][8];
    const bool cluster_size = splits >= 2 && splits <= WG_CLUSTER_MAX;
    if (c->wgmma_prime) { /* the answer the launch below will look up, asked now (outside a capture) */
        int clusters = 0;
        if (c->wgmma_cluster && cluster_size)
            clusters = cluster_capacity(kernel, grid, shared, splits, c->stream, &cluster_answers[variant][splits]);
        if (c->wgmma_clusters_out) *c->wgmma_clusters_out = clusters;
        return 0;
    }
    const void *x = c->x;
    const float *x_sums = nullptr;
    if (prep) {
        size_t sums_at;
        prepared_bytes<BITS, GS>(c->M, c->K, &sums_at);
        T *x_prepared = static_cast<T *>(c->wgmma_prepared);
        float *sums = reinterpret_cast<float *>(static_cast<char *>(c->wgmma_prepared) + sums_at);
        const size_t threads = x_sums_tokens(c->M) / PREP_ROWS * ((c->K / 32 + L::BPS - 1) / L::BPS * L::BPS * 4); /* × 256 */
        const int status = launch_kernel(wgmma_prepare_x<BITS, T, GS>, dim3((unsigned)((threads + 255) / 256)), dim3(256),
                                         0, c->stream, false, (const T *)c->x, x_prepared, sums, (int)c->M, (int)c->K,
                                         wgmma_grouped_work{});
        if (status) return status;
        x = x_prepared;
        x_sums = sums;
    }
    CUtensorMap x_map;
    const int map = x_tensor_map(&x_map, c, x, TOKS);
    if (map) return map;
    if (whole) { /* the whole waves first, one block per tile */
        const int status = launch_kernel(whole_kernel, dim3((unsigned)whole), dim3(WG_THREADS), shared, c->stream, false,
                                         x_map, (const T *)c->x, (const uint4 *)c->packed, (const uint32_t *)c->sb, c->w,
                                         (const T *)c->scales, (const T *)c->biases, (T *)c->out,
                                         in_slots ? c->wgmma_virtual_sums : c->partials, c->counters, x_sums,
                                         (int)c->M, (int)c->N, (int)c->K, virtual_per ? -virtual_per : per_split, 0,
                                         wgmma_grouped_work{});
        if (status) return status;
    }
    /* the splits as clusters: where the device runs them in no more waves than the workspace launch would take on all
     * SMs (wgmma_splits' model; c->wgmma_cluster 2 — tests — takes any cluster it can run, and fails otherwise) */
    int cluster_z = 0;
    if (c->wgmma_cluster && cluster_size) {
        const int clusters = cluster_capacity(kernel, grid, shared, splits, c->stream, &cluster_answers[variant][splits]);
        const long long sms = c->multiprocessors > 0 ? c->multiprocessors : 1, tiles_here = (long long)grid.x;
        const bool waves_ok = clusters > 0 && (tiles_here + clusters - 1) / clusters <= (tiles_here * splits + sms - 1) / sms;
        if (c->wgmma_cluster == 2 && clusters <= 0) return (int)cudaErrorNotSupported;
        if (waves_ok || c->wgmma_cluster == 2) cluster_z = splits;
    }
    return launch_kernel_ex(kernel, grid, dim3(WG_THREADS), shared, c->stream, false, cluster_z, x_map, (const T *)c->x,
                            (const uint4 *)c->packed, (const uint32_t *)c->sb, c->w, (const T *)c->scales,
                            (const T *)c->biases, (T *)c->out,
                            splits == 1 && in_slots ? c->wgmma_virtual_sums : c->partials, c->counters, x_sums,
                            (int)c->M, (int)c->N, (int)c->K, splits == 1 && virtual_per ? -virtual_per : per_split, whole,
                            wgmma_grouped_work{});
}

/* The grouped launch (qmm_cuda_wgmma_tile_grouped): x prepared for every product by wgmma_prepare_x's grouped form (a
 * thread per 128-bit piece of the prepared rows: each product's rows to its region of x_prepared and x_sums from row
 * x_row, read through work.x_rows where given, zeros to the end of its last tile), then one persistent launch of the
 * PREP tile over the work items (the prepared x's token tiles by the row tiles). */
template <int BITS, typename T, int GS, int TOKS>
static int launch_wgmma_grouped(const qmm_cuda_launch *c, const wgmma_grouped_work &work_of, size_t prepared_rows) {
    using P = wgmma_layout<BITS, GS, TOKS, true>;
    static_assert(TOKS == 32 || TOKS == 64, "wgmma_prepare_x's grouped form finds a row's product by log2 TOKS");
    auto kernel = wgmma_tile_kernel<BITS, T, GS, TOKS, false, true, 0, true>;
    static unsigned long long opted_in = 0;
    int status = shared_memory_opt_in(kernel, (size_t)P::SHARED, &opted_in);
    if (status) return status;
    size_t sums_at;
    prepared_bytes<BITS, GS>(prepared_rows, c->K, &sums_at);
    T *x_prepared = static_cast<T *>(c->wgmma_prepared);
    float *sums = reinterpret_cast<float *>(static_cast<char *>(c->wgmma_prepared) + sums_at);
    /* persistent: a block per SM (one fits: 384 threads at 168 registers; c->multiprocessors, which
     * QMM_CUDA_GATHER_WGMMA_BLOCKS may set), or one per work item where fewer; the kernel
     * numbers its work items in an int and steps them by the grid (checked before anything is enqueued) */
    const long long work = (long long)((c->N + WG_ROWS - 1) / WG_ROWS) * (long long)(prepared_rows / TOKS);
    const long long blocks = c->multiprocessors > 0 && c->multiprocessors < work ? c->multiprocessors : work;
    if (work > (long long)INT_MAX - blocks) return (int)cudaErrorInvalidValue;
    const size_t threads = prepared_rows / PREP_ROWS * ((c->K / 32 + P::BPS - 1) / P::BPS * P::BPS * 4); /* × 64 */
    if ((threads + 255) / 256 > (size_t)INT_MAX) return (int)cudaErrorInvalidValue;
    status = launch_kernel(wgmma_prepare_x<BITS, T, GS>, dim3((unsigned)((threads + 255) / 256)), dim3(256), 0, c->stream, false,
                           (const T *)c->x, x_prepared, sums, (int)prepared_rows, (int)c->K, work_of);
    if (status) return status;
    qmm_cuda_launch mapped = *c;
    mapped.M = prepared_rows;
    CUtensorMap x_map;
    status = x_tensor_map(&x_map, &mapped, x_prepared, TOKS);
    if (status) return status;
    return launch_kernel(kernel, dim3((unsigned)blocks), dim3(WG_THREADS), (size_t)P::SHARED, c->stream, false, x_map,
                         (const T *)c->x, (const uint4 *)c->packed, (const uint32_t *)c->sb, c->w, (const T *)c->scales,
                         (const T *)c->biases, (T *)c->out, nullptr, nullptr, (const float *)sums, (int)prepared_rows,
                         (int)c->N, (int)c->K, 0, 0, work_of);
}

template <int BITS, typename T, int TOKS>
static int wgmma_grouped_tokens(const qmm_cuda_launch *c, const wgmma_grouped_work &work, size_t rows) {
    switch (c->group_size) {
    case 32: return launch_wgmma_grouped<BITS, T, 32, TOKS>(c, work, rows);
    case 64: return launch_wgmma_grouped<BITS, T, 64, TOKS>(c, work, rows);
    default: return launch_wgmma_grouped<BITS, T, 128, TOKS>(c, work, rows);
    }
}
template <int BITS, typename T>
static int wgmma_grouped_group(const qmm_cuda_launch *c, const wgmma_grouped_work &work, size_t rows) {
    return work.token_shift == 5 ? wgmma_grouped_tokens<BITS, T, 32>(c, work, rows)
                                 : wgmma_grouped_tokens<BITS, T, 64>(c, work, rows);
}

template <int BITS, typename T, int TOKS> static int wgmma_group(const qmm_cuda_launch *c) {
    switch (c->group_size) {
    case 32: return launch_wgmma<BITS, T, 32, TOKS>(c);
    case 64: return launch_wgmma<BITS, T, 64, TOKS>(c);
    default: return launch_wgmma<BITS, T, 128, TOKS>(c);
    }
}

template <int TOKS> static int wgmma_dispatch(const qmm_cuda_launch *c) {
    if (c->bits == 4) return c->dtype == 1 ? wgmma_group<4, __half, TOKS>(c) : wgmma_group<4, __nv_bfloat16, TOKS>(c);
    return c->dtype == 1 ? wgmma_group<8, __half, TOKS>(c) : wgmma_group<8, __nv_bfloat16, TOKS>(c);
}

} /* namespace */

extern "C" size_t qmm_cuda_wgmma_prepared_bytes(int bits, int group_size, size_t M, size_t K) {
    size_t sums_at;
    return prepared_bytes_of(bits, group_size, M, K, &sums_at);
}

extern "C" int qmm_cuda_wgmma_tile_grouped(const qmm_cuda_launch *c, const qmm_cuda_gemv_product *tile_products,
                                          size_t prepared_rows, const unsigned *x_rows, int tokens) {
    if (!tile_products || !c->wgmma_prepared || c->dtype == 0 || (tokens != 32 && tokens != 64) || prepared_rows < 1 ||
        prepared_rows % (size_t)tokens || prepared_rows > QMM_CUDA_WGMMA_GROUPED_ROWS_MAX ||
        (c->bits != 4 && c->bits != 8))
        return (int)cudaErrorInvalidValue;
    const wgmma_grouped_work work{tile_products, x_rows, (int)(prepared_rows / (size_t)tokens),
                                  tokens == 32 ? 5 : 6};
    if (c->bits == 4)
        return c->dtype == 1 ? wgmma_grouped_group<4, __half>(c, work, prepared_rows)
                             : wgmma_grouped_group<4, __nv_bfloat16>(c, work, prepared_rows);
    return c->dtype == 1 ? wgmma_grouped_group<8, __half>(c, work, prepared_rows)
                         : wgmma_grouped_group<8, __nv_bfloat16>(c, work, prepared_rows);
}

extern "C" int qmm_cuda_wgmma_tile_qmm_t(const qmm_cuda_launch *c, int tokens) {
    return tokens == 32 ? wgmma_dispatch<32>(c) : tokens == 64 ? wgmma_dispatch<64>(c) : wgmma_dispatch<128>(c);
}
