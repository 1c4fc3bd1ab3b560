/*
 * kernel.h — the kernel table and the backend hooks (DESIGN.md §2). Not installed.
 *
 * A backend owns memory hooks and an ordered array of qmm_kernel rows. The context's table is the
 * backend's rows followed by the reference rows (src/ref/kernels.c), so every valid call has an
 * answer. The selector (src/select.c) walks the table in order and returns the first row whose op
 * matches and whose supports() accepts the call; a caller may force a row by name. Adding a kernel
 * is adding a row; adding a backend is adding one qmm_backend_hooks value (src/core/runtime.c).
 */
#ifndef QMM_KERNEL_H
#define QMM_KERNEL_H

#include "internal.h"

/* One product as a kernel sees it. Pointers are backend memory (host pointers on ref/cpu).
 *   x      dtype [M, K]
 *   w      uint32 weights rows × cols·bits/32 (op qmm_t: rows = N, cols = K; qmm_n: rows = K, cols = N)
 *   scales, biases dtype [rows, cols/group_size]
 *   out    dtype [M, N]
 * The runtime has validated everything before a kernel sees the call: M, N, K ≥ 1, the quantized
 * dimension (K for qmm_t, N for qmm_n) a multiple of group_size, M·K, M·N and every byte size fit in
 * size_t, x and out are distinct buffers of at least M·K and M·N elements.
 *
 * op gather (MLX gather_qmm): out[i, :] = x[lhs_indices[i], :]·Ŵ[rhs_indices[i]]ᵀ for i < M, so M = B
 * (the number of index pairs) and out is dtype [B, N]; x is dtype [T, K]; w, scales and biases hold
 * expert_count experts of N rows each, contiguously (rows = expert_count·N, cols = K; expert e starts at
 * row e·N). The index arrays are host memory on every backend (a device backend copies them in run());
 * the runtime has checked every index (lhs_indices[i] < T, or lhs_indices NULL meaning i with B ≤ T;
 * rhs_indices[i] < expert_count), T·K and expert_count·N and set rhs_sorted when rhs_indices is
 * non-decreasing. For the other ops these fields are zero. */
typedef struct qmm_call {
    qmm_op op;
    qmm_dtype dtype;
    int bits;        /* the width of the codes in w: the weights' stored width (qmm_backend_hooks.stored_bits) */
    int format_bits; /* the weights' own width (qmm_weights_describe), the tuning table's key; 0: the same as bits */
    int group_size;
    size_t M, N, K;
    const void *x;
    const uint32_t *w;
    const void *scales;
    const void *biases;
    void *out;
    void *backend_state; /* the backend's per-context state (CPU threads, CUDA stream), may be NULL */
    const void *weights_extra; /* what the backend's weights_prepare hook made (a repacked copy), may be NULL */
    /* op gather only (see above) */
    size_t T;                    /* rows of x */
    size_t expert_count;         /* experts in w, scales, biases */
    const uint32_t *lhs_indices; /* [M] rows of x, or NULL for row i */
    const uint32_t *rhs_indices; /* [M] experts */
    bool rhs_sorted;             /* rhs_indices non-decreasing: one block per expert used */
    /* qmm_matmul_options.batch_invariant (qmm_gather_options.batch_invariant for op gather, and then each expert
     * block's qmm_t call too): only rows whose info.batch_invariant_order is the call's order
     * take it (qmm_kernel_accepts refuses rows that declare none; the selector, src/select.c, the rest). */
    bool batch_invariant;
} qmm_call;

/* info.batch_invariant_order (include/qmm.h, docs/kernels.md "Batch-invariant mode"): a row declares an
 * order only when every output it writes is reduced in that one order whatever M, the other rows of x,
 * its tiling and its threads — and two rows of one op declare the same string only when they give the
 * same bits. The call's order is that of the first row of the table that declares one and accepts the
 * call; a row that declares an order must therefore accept every M ≥ 1 for the calls it accepts, or be
 * followed by rows of the same order that take the other M (tests/runtime/test_batch_invariant.c checks
 * every table for this). NULL: the row refuses batch-invariant calls. */
typedef struct qmm_kernel {
    qmm_kernel_info info;
    /* Returns true when the row handles the call; otherwise writes a one-line reason into
     * why_not[why_not_size] (e.g. "N=100 is not a multiple of BN=64"). Must not fail otherwise.
     * The selector checks the op before calling it, but a row should still refuse a foreign op. */
    bool (*supports)(const qmm_call *call, char *why_not, size_t why_not_size);
    /* Computes the product. Only called after supports() accepted the call. */
    qmm_status (*run)(const qmm_call *call);
    /* Optional (NULL: nothing to do): called when a chain records the call (qmm_chain_add_matmul), never inside a
     * stream capture, so that the row can set up now what its run would otherwise allocate or ask (a captured run may
     * not: the CUDA wgmma rows' workspace for x, which they otherwise go without, and how many thread-block clusters
     * the device runs at a time, without which their split-K takes the workspace). Must not fail. */
    void (*reserve)(const qmm_call *call);
    /* Selector hints (src/select.c), never capabilities: unforced, the selector takes this row only for
     * M ≤ prefer_max_m (0 = no limit), N ≥ prefer_min_n and K ≥ prefer_min_k (a row whose fixed cost per tile needs
     * a long K: the CUDA 32-token wgmma tile at M 17–32), and never when tune_only is set (rows kept for
     * forcing and tuning). When N ≤ prefer_small_n (0 = no such box), the M limit is
     * prefer_max_m_small_n instead: a row that stays the fastest to a larger M while the weights have few
     * rows (the CUDA m32n16 GEMV over the tensor-core tile up to M = 128 for N ≤ 2048). prefer_min_m (0 = no
     * limit): only for M ≥ prefer_min_m. prefer_min_tiles (0 = no limit): only when the call has at least that
     * many tiles of the row's bm × bn, ceil(M/bm)·ceil(N/bn) — a large tile that is the fastest once there are
     * enough of them to spread over the device (the CUDA wgmma tiles); from M = prefer_large_m (0 = never) the floor
     * is prefer_min_tiles_large_m instead (the CUDA m16n64 GEMV: fewer of its blocks are enough once each row tile
     * has three or four chunks of 16 rows of x). prefer_min_tiles_k (0 = no limit): only
     * when those tiles times K reach it — the work a large tile needs to fill the device, split-K included (few
     * tiles with a long K split well, few with a short K do not). prefer_max_tiles_k (0 = no limit): for
     * M ≥ prefer_max_tiles_k_min_m, only while those tiles times K stay within it — a row whose time grows with
     * each tile of M it adds, where a row of one tall tile costs about the same up to its height (the CUDA m16n64
     * GEMV, one pass over the weights per 16 rows of x, against the wgmma tile of 64 tokens from M = 33). prefer_min_tiles_unsplit (0 = no limit): in
     * batch-invariant mode, where no row splits K, only with at least that many tiles. When N ≥ prefer_large_n
     * (0 = no such box), only for M ≥ prefer_min_m_large_n: a row that is the fastest on many weight rows only once
     * M has grown (the CUDA m16n64 GEMV: from M = 17 past 300 blocks of 64 rows on the H200).
     * prefer_gap_tiles_min … prefer_gap_tiles_max (0 = no gap): not when the call's tiles of bm × bn fall in that
     * range — a tile count the device's SMs divide badly for this row where a row of smaller tiles divides it
     * well (the CUDA m8n64 GEMV at 265–396 blocks of 64 rows on the H200's 132 SMs).
     * prefer_fill_sms, prefer_fill_over_bn, prefer_fill_ratio_pct (0 = no such rule): only when the call's tiles of
     * bm × bn fill the last wave over prefer_fill_sms SMs at least prefer_fill_ratio_pct % as well as tiles of
     * bm × prefer_fill_over_bn would — a wave's fill being tiles ÷ (SMs · waves), waves = ceil(tiles ÷ SMs): a row of
     * narrower tiles that costs more per byte than its wider sibling and wins only where the sibling leaves SMs idle
     * (the CUDA m8n48 GEMV against m8n64 on the H200's 132 SMs). prefer (NULL = no such rule): a row's own rule where
     * the numbers above cannot say it, asked after them — false passes the row over (the CUDA m8n64_48 and
     * m16n64_48 GEMVs: only where their launcher would cut some 64-row blocks to 48 rows, a rule of the device's SM
     * count that the kernel itself applies; m8n48 and m16n48: not where 32-row blocks fit one wave of the device's
     * SMs with a long K). Never a capability: a forced or tuned row still runs. Must not fail. */
    size_t prefer_min_m;
    size_t prefer_max_m;
    size_t prefer_min_n;
    size_t prefer_min_k;
    size_t prefer_small_n;
    size_t prefer_max_m_small_n;
    size_t prefer_min_tiles;
    size_t prefer_large_m;
    size_t prefer_min_tiles_large_m;
    size_t prefer_min_tiles_k;
    size_t prefer_max_tiles_k;
    size_t prefer_max_tiles_k_min_m;
    size_t prefer_min_tiles_unsplit;
    size_t prefer_large_n;
    size_t prefer_min_m_large_n;
    size_t prefer_gap_tiles_min;
    size_t prefer_gap_tiles_max;
    size_t prefer_fill_sms;
    size_t prefer_fill_over_bn;
    size_t prefer_fill_ratio_pct;
    bool (*prefer)(const qmm_call *call);
    bool tune_only;
    /* Whether this machine has what the row needs whatever the call (the CPU's instruction sets, the OS
     * saving their registers); when not, a one-line reason ("this CPU lacks AVX-512BW"). NULL: usable
     * wherever its backend opens. supports() still checks it for every call. */
    bool (*usable)(char *why_not, size_t why_not_size);
} qmm_kernel;

/* The reference rows (always last in every table): ref.qmm_t.scalar.r1, ref.qmm_n.scalar.r1. They
 * read and write the call's pointers directly, so they need host-addressable memory: a backend
 * whose memory is not (CUDA without managed memory) must stage through the host before it can
 * append them — that is the CUDA issue's job (see host_memory below). */
extern const qmm_kernel qmm_ref_kernels[];
extern const size_t qmm_ref_kernel_count;

/* Gather by expert blocks — how a backend builds its gather rows from its qmm_t rows (src/core/gather.c).
 * An expert block is a maximal run i0 ≤ i < i1 of consecutive pairs with the same expert e = rhs_indices[i].
 * qmm_gather_run_blocks computes each block as one qmm_t call of M = i1 − i0 rows on qmm_t_row: w, scales
 * and biases offset to expert e (weights_extra NULL: a repacked stack is the backend's to offset), out
 * offset to row i0, and x the block's rows x[lhs_indices[i]] — used in place when they are consecutive
 * rows of x (lhs_indices NULL, or i0, i0+1, ...), else copied into host scratch. With rhs_sorted there is one
 * block per expert used, so each expert's weights are read once for all its rows (MLX's sorted_indices
 * fast path); unsorted indices give the same outputs through more, smaller blocks. Host memory only. A block's
 * call carries the gather's batch_invariant, so the qmm_t rows it reaches (qmm_kernel_accepts, the selector) are
 * those of the mode; a gather row that declares an order must reach only qmm_t rows of one order.
 * A gather row is then three lines (src/ref/kernels.c, ref.gather.blocks.r1, is the model):
 *     supports: return qmm_gather_blocks_supported(call, &my_qmm_t_row, why_not, why_not_size);
 *     run:      return qmm_gather_run_blocks(call, &my_qmm_t_row);
 * qmm_gather_blocks_supported asks qmm_t_row (qmm_kernel_accepts) about every block's call and passes on
 * the first refusal, prefixed with the block. */
bool qmm_gather_blocks_supported(const qmm_call *gather, const qmm_kernel *qmm_t_row, char *why_not,
                                 size_t why_not_size);
qmm_status qmm_gather_run_blocks(const qmm_call *gather, const qmm_kernel *qmm_t_row);

/* The pieces of qmm_gather_run_blocks, for a gather row that schedules the blocks itself (the CPU rows run
 * them on parallel threads, src/cpu/backend.c; the CUDA row groups them into launches, src/cuda/cuda_backend.c). qmm_gather_block_end: the end i1 of the block that starts at
 * i0. qmm_gather_block_call: block [i0, i1)'s qmm_t call (weights, out and backend_state as above), with x in
 * place when the block's rows are consecutive rows of x, else NULL: then the caller copies them with
 * qmm_gather_block_rows into host memory of (i1 − i0)·K elements and points x there. Never fail. A gather call of
 * qmm_select_gather (supports() only) has x and out NULL: its blocks' calls then have them NULL too. */
size_t qmm_gather_block_end(const qmm_call *gather, size_t i0);
/* Whether block [i0, i1)'s rows of x are consecutive rows of x (lhs_indices NULL, or lhs_indices[i] = lhs_indices[i0] +
 * i − i0): qmm_gather_block_call then points x at them in place. */
bool qmm_gather_block_in_place(const qmm_call *gather, size_t i0, size_t i1);
qmm_call qmm_gather_block_call(const qmm_call *gather, size_t i0, size_t i1);
void qmm_gather_block_rows(const qmm_call *gather, size_t i0, size_t i1, void *rows);

/* What a backend plugs into the runtime. Every hook returns a status with qmm_error() set on failure.
 * `state` is what open() returned (NULL allowed). Memory hooks move bytes; the runtime has checked
 * every size for overflow first. */
typedef struct qmm_backend_hooks {
    qmm_backend backend;
    bool host_memory; /* allocations are plain host memory (ref, cpu): the ref rows can run on them */
    const qmm_kernel *kernels; /* the backend's own rows in selector order (the ref rows come after) */
    size_t kernel_count;
    qmm_status (*open)(int device, void **state);
    void (*close)(void *state);
    qmm_status (*alloc)(void *state, size_t bytes, void **memory);
    void (*release)(void *state, void *memory);
    qmm_status (*upload)(void *state, void *device_dst, const void *host_src, size_t bytes);
    qmm_status (*download)(void *state, void *host_dst, const void *device_src, size_t bytes);
    /* Waits for all queued work (a no-op on blocking host backends). */
    qmm_status (*synchronize)(void *state);
    /* Optional (NULL on host backends). weights_prepare runs once at qmm_weights_create, after the upload,
     * with the caller's host matrix: it may build a repacked copy the backend's kernels read best, returned
     * in *extra (NULL allowed) and passed to kernels as qmm_call.weights_extra; weights_release frees it. */
    qmm_status (*weights_prepare)(void *state, const qmm_qmatrix *host_matrix, void **extra);
    void (*weights_release)(void *state, void *extra);
    /* Optional (NULL: every width as given): writes into *stored the code width (≥ bits) the backend stores a matrix
     * of `bits` in (the CUDA backend: 2/3-bit codes as 4-bit, 5/6-bit as 8-bit, so its fast rows, which decode 4
     * and 8 bits, take every format). qmm_weights_create then re-packs the codes into words of that width on the
     * host (qmm_widen_codes: the same codes, scales and biases, so the same ŵ), uploads those and gives
     * weights_prepare the re-packed matrix; every call on the weights carries the stored width in qmm_call.bits,
     * while qmm_weights_describe keeps the caller's. The device memory is that of the wider codes. */
    qmm_status (*stored_bits)(void *state, int bits, int *stored);
    /* Optional: runs a chain's `count` steps as one submission. launch(argument, i) enqueues step i.
     * *graph is the backend's cached submission for this chain (NULL the first time; the runtime drops
     * it with chain_release when steps change). Writes each step's device time into microseconds[count]
     * (NULL: no per-step events in the submission) and the whole run's into *total_microseconds. */
    qmm_status (*chain_run)(void *state, void **graph, size_t count, qmm_status (*launch)(void *argument, size_t i),
                            void *argument, double *microseconds, double *total_microseconds);
    void (*chain_release)(void *state, void *graph);
    /* Host threads the backend's kernels use, read and set through the backend's state (the kernels
     * see it as call->backend_state). NULL on backends whose kernels run on one host thread (ref) or
     * on a device. set_threads(state, 0) restores the default (the cores the process may use). */
    int (*get_threads)(void *state);
    void (*set_threads)(void *state, int threads);
    /* Optional: the device's name as the vendor gives it ("NVIDIA H200"), written into name[size]. NULL on
     * host backends: the runtime names the host CPU (/proc/cpuinfo "model name"). A tuning table records
     * this name and is applied only where it matches (src/select.c). */
    qmm_status (*device_name)(void *state, char *name, size_t size);
} qmm_backend_hooks;

/* Whether row handles call: the op must match (checked here, once for every caller), for a
 * batch-invariant call the row must declare an order, then the row's supports(). On false, why_not
 * receives the reason. (Whether the row's order is the call's is the selector's question: it needs the
 * table, see qmm_batch_invariant_row.) */
bool qmm_kernel_accepts(const qmm_kernel *row, const qmm_call *call, char *why_not, size_t why_not_size);

/* One entry of a measured tuning table: for calls of exactly this op, dtype, bits, group_size, N and K
 * with m_min ≤ M ≤ m_max, row (a row of the context's table, resolved by name at load time) was the
 * fastest eligible kernel when `qmm tune` measured it on this device. */
typedef struct qmm_tuning_entry {
    qmm_op op;
    qmm_dtype dtype;
    int bits;
    int group_size;
    size_t N, K;
    size_t m_min, m_max;
    const qmm_kernel *row;
} qmm_tuning_entry;

/* A tuning table as the selector reads it: entries sorted by (op, dtype, bits, group_size, N, K,
 * m_min), M ranges of entries with the same key disjoint (the loader refuses overlaps), so a call
 * matches at most one entry, found by binary search. */
typedef struct qmm_tuning_table {
    qmm_tuning_entry *entries;
    size_t count;
} qmm_tuning_table;

/* What a load set aside (counts of entries in the file that the selector will not read). */
typedef struct qmm_tuning_ignored {
    size_t other_device;   /* measured on a device with another name */
    size_t unknown_kernel; /* naming a kernel this build's table lacks (e.g. renamed since the table was made) */
} qmm_tuning_ignored;

/* Parses a tuning table file's text (src/io/tuning.c, docs/kernels.md §4 "The tuning table"): refuses a
 * file of another backend (QMM_ERR_UNSUPPORTED) and any entry that breaks a rule (QMM_ERR_CORRUPT naming
 * `origin`, the entry and the rule); sets aside entries of another device or naming an unregistered
 * kernel (counted in *ignored); resolves kernel names against table[count]; sorts. On success *tuning
 * owns a malloc'd array (free with qmm_tuning_free). Without cJSON: QMM_ERR_UNSUPPORTED. */
qmm_status qmm_tuning_parse(const char *json, size_t size, const char *origin, qmm_backend backend,
                            const char *device, const qmm_kernel *const *table, size_t count,
                            qmm_tuning_table *tuning, qmm_tuning_ignored *ignored);
void qmm_tuning_free(qmm_tuning_table *tuning);

/* The order of entries: by op, dtype, bits, group_size, N, K, then m_min (qsort-style result). */
int qmm_tuning_compare(const qmm_tuning_entry *a, const qmm_tuning_entry *b);
/* The entry of tuning that matches call, or NULL (src/select.c). */
const qmm_tuning_entry *qmm_tuning_find(const qmm_tuning_table *tuning, const qmm_call *call);

/* The qmm_call a qmm_matmul of M rows on weights would make, everything but the x and out buffers validated (their
 * pointers NULL); `function` names the caller in messages. The runtime's, and the tests' view of what a call carries
 * (e.g. the stored and the format width). Errors: those of qmm_matmul before it looks at the buffers. */
qmm_status qmm_prepare_call(const char *function, const qmm_context *context, const qmm_weights *weights, size_t M,
                            const qmm_matmul_options *options, qmm_call *call);

/* The row that sets a batch-invariant call's order: the first row of table[count] (in order, hints and
 * tune_only aside) that declares an order and accepts the call. Errors: QMM_ERR_UNSUPPORTED when none does. */
qmm_status qmm_batch_invariant_row(const qmm_kernel *const *table, size_t count, const qmm_call *call,
                                   const qmm_kernel **row);

/* The selector: the first row of table[count] that accepts call (or the row named `forced`).
 * Errors: QMM_ERR_NOT_FOUND (forced name unknown), QMM_ERR_UNSUPPORTED (forced row refuses, with its
 * reason, or no row accepts the call — impossible while the reference rows are last). */
qmm_status qmm_select_kernel(const qmm_kernel *const *table, size_t count, const qmm_call *call,
                             const char *forced, const qmm_kernel **chosen);
/* The same with a measured tuning table (NULL or empty: none) consulted between the forced name and the
 * table order: the matching entry's row, when it accepts the call, wins; else the order decides. */
qmm_status qmm_select_kernel_tuned(const qmm_kernel *const *table, size_t count, const qmm_tuning_table *tuning,
                                   const qmm_call *call, const char *forced, const qmm_kernel **chosen);

#endif /* QMM_KERNEL_H */
