/*
 * test_cuda.c — the CUDA backend beyond the kernel harness (label "gpu"; `make test-gpu` on a GPU machine):
 * chains captured as graphs and replayed (results, per-step and whole-run device times, re-capture after
 * a step is added), the selector's choices by M, cross-kernel agreement at the selector's switch points,
 * bit-for-bit determinism, the non-finite rule (docs/kernels.md §2) on the fast rows, large f16 x on every row,
 * error paths
 * (among them the gather's), and batch-invariant mode (a row alone and inside M = 2, 37,
 * 512 through the selector, the mma rows refusing it, the same bits as the ref backend's "oracle" rows;
 * tests/runtime/test_batch_invariant.c also walks the CUDA table when it runs on a GPU machine).
 * The harness (tests/kernels) runs every CUDA row on its case grid in every dtype.
 *
 * Without a usable CUDA device it prints "SKIPPED: <reason>" and exits 77, which CTest reports as skipped.
 */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SKIP_CODE 77

/* QMM_TEST_SHARD=i/n (with QMM_TEST_SECTION=gather): the gather section runs only its (case, variant) runs whose
 * number (test_gather) is i mod n, so that compute-sanitizer's racecheck, which did not finish the whole section in
 * 490–530 s on an H100 beside other runs, can run it as n processes side by side (scripts/gpu_test.sh); the n shards
 * together are the whole section, on the same inputs (part_rng). Unset: shard 0 of 1, every run. */
static unsigned shard_index = 0, shard_count = 1;
static bool in_shard(size_t run) { return run % shard_count == shard_index; }

/* A generator of its own for part (a, b) of a section (a case, a run of it): the section's generator's state and the
 * part's numbers mixed through one splitmix64 step, so that a part's inputs do not depend on which other parts ran
 * (QMM_TEST_SHARD) — a shard checks the same products as the whole section with the same QMM_TEST_SEED. */
static check_rng part_rng(check_rng base, uint64_t a, uint64_t b) {
    base.state ^= (a + 1) * 0xD1B54A32D192ED03ull + (b + 1) * 0x8CB92BA72F3D8DD7ull;
    const check_rng part = {check_rng_next(&base)};
    return part;
}

/* One random N×K matrix on the device, x[M, K] and out[M, N] buffers, the f64 oracle. */
typedef struct product {
    check_qmatrix q;
    qmm_weights *weights;
    qmm_buffer *x, *out;
    void *host_x, *host_out;
    double *exact, *abs_dot;
    size_t M, N, K;
    qmm_dtype dtype;
} product;

static bool product_setup(qmm_context *context, check_rng *rng, size_t M, size_t N, size_t K, int bits, int group_size,
                          qmm_dtype dtype, product *p) {
    p->M = M, p->N = N, p->K = K, p->dtype = dtype;
    const size_t size = qmm_dtype_size(dtype);
    if (!check_qmatrix_random(rng, N, K, bits, group_size, dtype, &p->q)) return false;
    p->host_x = malloc(M * K * size);
    p->host_out = malloc(M * N * size);
    p->exact = malloc(M * N * sizeof(double));
    p->abs_dot = malloc(M * N * sizeof(double));
    if (!p->host_x || !p->host_out || !p->exact || !p->abs_dot) return false;
    check_fill_uniform(rng, p->host_x, dtype, M * K, -1.0f, 1.0f);
    CHECK_OK(qmm_weights_create(context, &p->q.m, &p->weights));
    CHECK_OK(qmm_buffer_create(context, dtype, M * K, &p->x));
    CHECK_OK(qmm_buffer_create(context, dtype, M * N, &p->out));
    if (!p->weights || !p->x || !p->out) return false;
    CHECK_OK(qmm_buffer_write(p->x, p->host_x, M * K));
    CHECK_OK(qmm_ref_dense_f64(&p->q.m, p->host_x, M, 1, p->exact, p->abs_dot));
    return true;
}

/* Frees what p holds and zeroes it (freeing it again is harmless). */
static void product_free(product *p) {
    qmm_weights_destroy(p->weights);
    qmm_buffer_destroy(p->x);
    qmm_buffer_destroy(p->out);
    free(p->host_x);
    free(p->host_out);
    free(p->exact);
    free(p->abs_dot);
    check_qmatrix_free(&p->q);
    memset(p, 0, sizeof *p);
}

/* An M×N×K product of random weights (bits, group_size) and x in dtype, x uploaded, the oracle computed. A failed
 * set-up is a failed check ("what: set-up failed") and leaves p empty (product_free on it is harmless). */
static bool product_make(qmm_context *context, check_rng *rng, size_t M, size_t N, size_t K, int bits, int group_size,
                         qmm_dtype dtype, const char *what, product *p) {
    memset(p, 0, sizeof *p);
    if (product_setup(context, rng, M, N, K, bits, group_size, dtype, p)) return true;
    CHECK(false, "%s: set-up failed", what);
    product_free(p);
    return false;
}

/* One case of a section's table: an M×N×K product of weights (bits, group_size) with x in dtype. */
typedef struct {
    size_t M, N, K;
    int bits, group_size;
    qmm_dtype dtype;
} product_case;

/* product_make for a table's case. */
static bool product_make_case(qmm_context *context, check_rng *rng, const product_case *c, const char *what,
                              product *p) {
    return product_make(context, rng, c->M, c->N, c->K, c->bits, c->group_size, c->dtype, what, p);
}

/* Whether the device runs the wgmma tiles (Hopper), asked of a 64×128×256 product (made from rng); *ok false where the
 * probe could not be made (the failure is counted). */
static bool wgmma_device(qmm_context *context, check_rng *rng, const char *label, bool *ok) {
    product probe;
    *ok = product_make(context, rng, 64, 128, 256, 4, 64, QMM_F16, label, &probe);
    if (!*ok) return false;
    const bool hopper =
        qmm_kernel_supports(context, "cuda.qmm_t.wgmma_tile.m64n128", probe.weights, 64, QMM_OP_QMM_T, NULL) == 1;
    product_free(&probe);
    return hopper;
}

/* Reads the output back and checks it against the oracle within the row's bound. */
static void product_check(product *p, const char *label, double slack) {
    CHECK_OK(qmm_buffer_read(p->out, p->host_out, p->M * p->N));
    double worst = 0;
    size_t bad = check_against_oracle(label, p->host_out, p->dtype, p->exact, p->abs_dot, p->M * p->N, p->K, slack, &worst);
    CHECK(bad == 0, "%s: %zu outputs outside the bound (worst %.3g)", label, bad, worst);
}

/* That a buffer still holds the poison (qmm_buffer_poison's bytes, compared with a fresh buffer's): nothing wrote it. */
static void check_still_poisoned(qmm_context *context, const qmm_buffer *out, const char *what) {
    const size_t count = qmm_buffer_count(out), bytes = count * qmm_dtype_size(qmm_buffer_dtype(out));
    unsigned char *got = malloc(bytes), *want = malloc(bytes);
    qmm_buffer *fresh = NULL;
    CHECK_OK(qmm_buffer_create(context, qmm_buffer_dtype(out), count, &fresh));
    if (got && want && fresh) {
        CHECK_OK(qmm_buffer_read(out, got, count));
        CHECK_OK(qmm_buffer_poison(fresh));
        CHECK_OK(qmm_buffer_read(fresh, want, count));
        CHECK(memcmp(got, want, bytes) == 0, "%s: a refused call wrote the output", what);
    } else {
        CHECK(false, "%s: set-up failed", what);
    }
    qmm_buffer_destroy(fresh);
    free(got);
    free(want);
}

/* Every CUDA qmm_t row that takes p's call, forced, outputs poisoned first, against the oracle in p. */
static void check_every_row(qmm_context *context, product *p, const char *what) {
    for (size_t k = 0; k < qmm_kernel_count(context); k++) {
        qmm_kernel_info info;
        CHECK_OK(qmm_kernel_get(context, k, &info));
        if (info.op != QMM_OP_QMM_T || qmm_kernel_supports(context, info.name, p->weights, p->M, info.op, NULL) != 1)
            continue;
        qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = info.name};
        CHECK_OK(qmm_buffer_poison(p->out));
        CHECK_OK(qmm_matmul(context, p->weights, p->x, p->M, p->out, &options, NULL));
        char label[200];
        snprintf(label, sizeof label, "%s, %s", what, info.name);
        product_check(p, label, info.tolerance_slack);
    }
}

/* p's call forced onto `row` three times, outputs poisoned first: each within the bound (slack 2, the tensor-core rows')
 * and the same bits as the first; `what` labels the failures. first: a buffer of p's output size, or NULL (the bits
 * then fail to compare). */
static void check_forced_runs(qmm_context *context, product *p, const char *row, const char *what, void *first) {
    const size_t bytes = p->M * p->N * qmm_dtype_size(p->dtype);
    qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = row};
    char label[240];
    for (int run = 0; run < 3; run++) {
        CHECK_OK(qmm_buffer_poison(p->out));
        CHECK_OK(qmm_matmul(context, p->weights, p->x, p->M, p->out, &options, NULL));
        snprintf(label, sizeof label, "%s %s M=%zu N=%zu K=%zu %s run %d", row, what, p->M, p->N, p->K,
                 qmm_dtype_name(p->dtype), run);
        product_check(p, label, 2.0);
        if (run == 0 && first) memcpy(first, p->host_out, bytes);
        else CHECK(first && memcmp(first, p->host_out, bytes) == 0, "%s: differs from run 0", label);
    }
}

/* p through `row`, forced, with the environment variable `name` set to `value` for the call (a launcher's knob),
 * outputs poisoned first, against the oracle. */
static void check_forced_with_env(qmm_context *context, product *p, const char *row, const char *name,
                                  const char *value, const char *what) {
    const qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = row};
    char label[240];
    setenv(name, value, 1);
    CHECK_OK(qmm_buffer_poison(p->out));
    CHECK_OK(qmm_matmul(context, p->weights, p->x, p->M, p->out, &options, NULL));
    unsetenv(name);
    snprintf(label, sizeof label, "%s %s M=%zu N=%zu K=%zu", row, what, p->M, p->N, p->K);
    product_check(p, label, 2.0);
}

static void test_chain(qmm_context *context, check_rng *rng) {
    product a, b = {0};
    if (!product_make(context, rng, 3, 1000, 2048, 4, 64, QMM_F16, "chain (a)", &a) ||
        !product_make(context, rng, 16, 777, 576, 8, 32, QMM_BF16, "chain (b)", &b)) {
        product_free(&a);
        return;
    }
    qmm_chain *chain = NULL;
    CHECK_OK(qmm_chain_create(context, &chain));
    CHECK_OK(qmm_chain_add_matmul(chain, a.weights, a.x, a.M, a.out, NULL));
    for (int run = 0; run < 3; run++) {
        CHECK_OK(qmm_buffer_poison(a.out));
        CHECK_OK(qmm_chain_run(chain));
        product_check(&a, "chain step 0", 2.0);
    }
    /* Adding a step drops the captured graph: the next run captures both steps. */
    CHECK_OK(qmm_chain_add_matmul(chain, b.weights, b.x, b.M, b.out, NULL));
    CHECK_OK(qmm_buffer_poison(a.out));
    CHECK_OK(qmm_buffer_poison(b.out));
    CHECK_OK(qmm_chain_run(chain));
    product_check(&a, "chain of 2, step 0", 2.0);
    product_check(&b, "chain of 2, step 1", 2.0);
    double step0 = -1, step1 = -1, total = -1;
    qmm_kernel_info info = {0};
    CHECK_OK(qmm_chain_step(chain, 0, &step0, &info));
    CHECK_OK(qmm_chain_step(chain, 1, &step1, NULL));
    CHECK_OK(qmm_chain_elapsed(chain, &total));
    CHECK(step0 > 0 && step1 > 0 && total >= step0 && total >= step1 && total < 1e6,
          "chain times: steps %.3f and %.3f µs, total %.3f µs", step0, step1, total);
    CHECK(info.name && strncmp(info.name, "cuda.", 5) == 0, "step 0 ran %s", info.name ? info.name : "?");
    /* New inputs between runs are seen by the replayed graph (it reads the buffers, not a snapshot). */
    check_fill_uniform(rng, a.host_x, a.dtype, a.M * a.K, -1.0f, 1.0f);
    CHECK_OK(qmm_buffer_write(a.x, a.host_x, a.M * a.K));
    CHECK_OK(qmm_ref_dense_f64(&a.q.m, a.host_x, a.M, 1, a.exact, a.abs_dot));
    CHECK_OK(qmm_chain_run(chain));
    product_check(&a, "replay with new x", 2.0);
    /* Whole-chain timing: no events between steps, the graph timed from outside; steps report NaN. */
    CHECK_OK(qmm_chain_set_step_timing(chain, 0));
    CHECK_OK(qmm_buffer_poison(a.out));
    CHECK_OK(qmm_chain_run(chain));
    product_check(&a, "whole-chain timing", 2.0);
    CHECK_OK(qmm_chain_elapsed(chain, &total));
    CHECK_OK(qmm_chain_step(chain, 0, &step0, NULL));
    CHECK(total > 0 && total < 1e6 && isnan(step0), "whole-chain timing: total %.3f µs, step %.3f", total, step0);
    CHECK_OK(qmm_chain_set_step_timing(chain, 1));
    CHECK_OK(qmm_chain_run(chain));
    CHECK_OK(qmm_chain_step(chain, 1, &step1, NULL));
    CHECK(step1 > 0, "step timing back on: step 1 took %.3f µs", step1);
    qmm_chain_destroy(chain);
    product_free(&a);
    product_free(&b);
}

/* The selector's choice for each M, and every eligible row agreeing with the oracle at the switch points. */
static void test_selector_and_switch_points(qmm_context *context, check_rng *rng) {
    const size_t ms[] = {1, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 200};
    const qmm_dtype dtypes[] = {QMM_F16, QMM_BF16, QMM_F32};
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            product p;
            if (!product_make(context, rng, ms[i], 300, 1536, 4, 64, dtypes[d], "switch points", &p)) continue;
            qmm_kernel_info chosen = {0};
            CHECK_OK(qmm_select(context, p.weights, p.M, NULL, &chosen));
            /* f16/bf16: the GEMV family up to M = 16, a tensor-core row (GEMV or tile) beyond; f32: ffma_gemv up to
             * M = 3, mma_tile_bf16x3 from M = 4 (F32_TILE_MIN_M in cuda_backend.c) */
            const char *family = dtypes[d] == QMM_F32 ? (ms[i] < 4 ? "ffma_gemv" : "mma_tile_bf16x3")
                                 : ms[i] <= 16       ? "mma_gemv"
                                                     : "mma_";
            CHECK(chosen.name && strstr(chosen.name, family) != NULL, "M=%zu %s: the selector chose %s, not a %s row",
                  ms[i], qmm_dtype_name(dtypes[d]), chosen.name ? chosen.name : "?", family);
            char what[64];
            snprintf(what, sizeof what, "switch points M=%zu %s", p.M, qmm_dtype_name(dtypes[d]));
            check_every_row(context, &p, what);
            product_free(&p);
        }
}

/* One selector box case: a random M × N × K product (4-bit, groups of 64, f16), whether the selector takes `row`
 * (want) — and when not, that it takes `instead` (NULL: any other row) —, and the product of the row it takes against
 * the oracle, outputs poisoned first; options NULL or a batch-invariant call. */
static void check_box(qmm_context *context, check_rng *rng, size_t M, size_t N, size_t K, const char *row, bool want,
                      const char *instead, const qmm_matmul_options *options) {
    const char *mode = options && options->batch_invariant ? " (batch-invariant)" : "";
    product p;
    if (!product_make(context, rng, M, N, K, 4, 64, QMM_F16, row, &p)) return;
    qmm_kernel_info chosen = {0};
    CHECK_OK(qmm_select(context, p.weights, p.M, options, &chosen));
    const char *name = chosen.name ? chosen.name : "?";
    const bool took = strcmp(name, row) == 0;
    CHECK(took == want, "%s box%s: M=%zu N=%zu chose %s", row, mode, M, N, name);
    if (!want && instead) /* the row that takes the call outside the box */
        CHECK(strcmp(name, instead) == 0, "%s box%s: M=%zu N=%zu chose %s, want %s", row, mode, M, N, name, instead);
    CHECK_OK(qmm_buffer_poison(p.out));
    CHECK_OK(qmm_matmul(context, p.weights, p.x, p.M, p.out, options, NULL));
    char what[192];
    snprintf(what, sizeof what, "%s box%s M=%zu N=%zu K=%zu (%s)", row, mode, M, N, K, name);
    product_check(&p, what, 2.0);
    product_free(&p);
}

/* The wgmma tiles' switch points (Hopper): m128n128 from M = 65 with 33 tiles of 128 × 128 whose tiles times K reach
 * 32 · 4096,
 * m64n128 from M = 33 where its tiles of 128 × 64 times K reach 128 · 768 (mma_gemv m16n64 first in its box —
 * from M = 33 while its tiles × K stay within 240 · 5120 —, m32n16 up
 * to M = 32, and up to M = 128 for N ≤ 2048), m32n128 at M 17–32 with 40 tiles of 128 rows or more and K ≥ 5120 (before
 * m16n64) — on either side of each threshold the selector's choice, and every row that takes the call against the
 * oracle. Where the device is not Hopper the wgmma rows refuse and none is chosen. Then
 * the boxes of mma_gemv m16n48 (M ≤ 16, N ≥ 4096, tiles × K ≥ 48 · 4096, where its 48-row blocks fill the SMs' last wave
 * ≥ 1.2× as well as 64-row blocks, and not where 32-row blocks fit one wave with K ≥ 8192), m16n64 (M 9–16 with N
 * 4545 … 19200 where m16n48's rule says no, M 17–32 with 72 tiles of 64 rows × 16 rows of x, M 33–64 with 48, and
 * tiles × K ≥ 48 · 4096, from M = 33 ≤ 240 · 5120), the 8-token rows (m8n48 by the same two rules, m8n64_48 where its
 * launcher splits the rows, m8n64, m8n32, m8n16), m16n64_48 (M
 * 9–16 past m16n64's box where its launcher splits the rows) and m16n32 (M ≤ 16 outside the others), which take
 * mma_tile m16n256's (M 17–32, N ≥ 12288) in the default mode, any device with the mma family, on each of their sides. */
static void test_wgmma_switch(qmm_context *context, check_rng *rng) {
    static const struct {
        size_t M, N, K;
        const char *want; /* NULL: neither wgmma row */
    } cases[] = {
        {65, 4224, 4096, "cuda.qmm_t.wgmma_tile.m128n128"}, /* 33 tiles × K 4096 (split-K) */
        {65, 4224, 3968, "cuda.qmm_t.wgmma_tile.m64n128"},  /* 33 tiles × K 3968: short of 32 · 4096 */
        {65, 4096, 8192, "cuda.qmm_t.wgmma_tile.m64n128"},  /* 32 tiles, however long K: 64 tiles of 64 tokens */
        {65, 3968, 4096, "cuda.qmm_t.wgmma_tile.m64n128"},  /* 31 tiles of 128 tokens, 62 of 64 */
        {65, 4096, 1536, "cuda.qmm_t.wgmma_tile.m64n128"},  /* 64 tiles of 64 tokens × K 1536 = 128 × 768 */
        {65, 4096, 1472, NULL},                             /* 64 × 1472: below it, mma_tile m64n64 */
        {49, 8192, 2432, "cuda.qmm_t.wgmma_tile.m64n128"},  /* m16n64's 512 tiles × 2432 past its 240 · 5120 */
        {49, 8192, 2368, NULL},                             /* 512 × 2368 within it: mma_gemv m16n64 first */
        {33, 4096, 3072, NULL},                             /* 192 × 3072: mma_gemv m16n64 */
        {32, 12161, 256, NULL}, /* M ≤ 32: an mma_gemv row (m32n16: 382 tiles × K 256 are short of m16n64's floor) */
        {32, 5120, 5120, "cuda.qmm_t.wgmma_tile.m32n128"},  /* M 17–32: 40 tiles of 128 rows, K 5120 */
        {17, 14336, 5120, "cuda.qmm_t.wgmma_tile.m32n128"},
        {32, 4992, 5120, NULL},                             /* 39 tiles: mma_gemv m16n64 */
        {24, 5120, 5056, NULL},                             /* K under 5120: mma_gemv m16n64 */
        {16, 5120, 5120, NULL},                             /* M ≤ 16: mma_gemv m16n48 */
        {128, 2048, 4096, NULL},                            /* N ≤ 2048, M ≤ 128: mma_gemv m32n16 */
        {128, 2048, 8192, NULL}, /* the same, though m128n128's 16 tiles × 8192 reach its work hint: m32n16 first */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        product p;
        if (!product_make(context, rng, cases[i].M, cases[i].N, cases[i].K, 4, 64, QMM_BF16, "wgmma switch", &p)) continue;
        const int hopper = qmm_kernel_supports(context, "cuda.qmm_t.wgmma_tile.m128n128", p.weights, p.M, QMM_OP_QMM_T,
                                               NULL) == 1;
        qmm_kernel_info chosen = {0};
        CHECK_OK(qmm_select(context, p.weights, p.M, NULL, &chosen));
        const char *name = chosen.name ? chosen.name : "?";
        if (hopper && cases[i].want)
            CHECK(strcmp(name, cases[i].want) == 0, "wgmma switch: M=%zu N=%zu chose %s, want %s", cases[i].M, cases[i].N,
                  name, cases[i].want);
        else
            CHECK(strstr(name, "wgmma") == NULL, "wgmma switch: M=%zu N=%zu chose %s", cases[i].M, cases[i].N, name);
        char what[64];
        snprintf(what, sizeof what, "wgmma switch M=%zu N=%zu K=%zu", cases[i].M, cases[i].N, cases[i].K);
        check_every_row(context, &p, what);
        product_free(&p);
    }
#define m16n256 "cuda.qmm_t.mma_tile.m16n256"
#define m16n64 "cuda.qmm_t.mma_gemv.m16n64"
#define m16n32 "cuda.qmm_t.mma_gemv.m16n32"
#define m32n16 "cuda.qmm_t.mma_gemv.m32n16"
#define m8n64 "cuda.qmm_t.mma_gemv.m8n64"
#define m8n64_48 "cuda.qmm_t.mma_gemv.m8n64_48"
#define m8n48 "cuda.qmm_t.mma_gemv.m8n48"
#define m16n48 "cuda.qmm_t.mma_gemv.m16n48"
#define m16n64_48 "cuda.qmm_t.mma_gemv.m16n64_48"
#define m8n16 "cuda.qmm_t.mma_gemv.m8n16"
#define m8n32 "cuda.qmm_t.mma_gemv.m8n32"
    static const struct {
        size_t M, N, K;
        const char *row;
        bool want;           /* the selector takes row */
        const char *instead; /* when not: the row it takes (NULL: not asserted — a wgmma or tile row, by device) */
    } box[] = {/* mma_tile m16n256: its box (M 17–32, N ≥ 12288) taken first by mma_gemv m16n64 (it keeps it for
                * batch-invariant calls: below) */
               {17, 12288, 512, m16n256, false, m16n64}, {32, 27648, 256, m16n256, false, m16n64},
               /* mma_gemv m16n64's box (m16n48 first at M 9–16 where its fill rule holds, below: 4545, 5120 rows):
                * M 9–16 with 72 … 300 blocks of 64 rows (N 4545 … 19200), M 17–32 with 72
                * blocks or more of 64 rows × 16 rows of x (N ≥ 2241: one grid of two chunks), M 33–64 with 48
                * (below), no upper end in N there; and those blocks times K ≥ 48 · 4096 (each K here the smallest
                * multiple of 64 that reaches it, where 256 does not; the floor's own edges last), from M = 33
                * ≤ 240 · 5120 (its edges:
                * 80 blocks × 3 chunks × K 5120, × 4 chunks × K 3840; none at M = 32: 77 blocks × 2 chunks × K 8000
                * past it — 4928 rows, 39 tiles of 128: short of wgmma m32n128's box on Hopper, as are the K < 5120
                * here) */
               {9, 5120, 2496, m16n64, false, m16n48},   {16, 5120, 2496, m16n64, false, m16n48},
               {8, 5120, 256, m16n64, false, m8n48},     {17, 5120, 1280, m16n64, true, NULL},
               {32, 5120, 1280, m16n64, true, NULL},     {33, 5120, 832, m16n64, true, NULL},
               {64, 5120, 640, m16n64, true, NULL},      {65, 5120, 640, m16n64, false, NULL},
               {48, 27648, 256, m16n64, true, NULL},     {64, 27648, 256, m16n64, true, NULL},
               {48, 5120, 5120, m16n64, true, NULL},     {48, 5120, 5184, m16n64, false, NULL},
               {49, 5120, 3840, m16n64, true, NULL},     {49, 5120, 3904, m16n64, false, NULL},
               {32, 4928, 8000, m16n64, true, NULL},     {48, 1536, 2752, m16n64, true, NULL},
               {48, 1472, 2752, m16n64, false, m32n16},
               {16, 4544, 2752, m16n64, false, m16n48},  {16, 4545, 2752, m16n64, false, m16n48},
               {16, 19200, 704, m16n64, true, NULL},     {16, 19201, 704, m16n64, false, m16n64_48},
               {17, 19201, 384, m16n64, true, NULL},     {32, 27648, 256, m16n64, true, NULL},
               {13, 14336, 5120, m16n64, true, NULL},    {20, 12288, 4096, m16n64, true, NULL},
               {20, 14336, 448, m16n64, true, NULL},     {17, 2241, 2752, m16n64, true, NULL},
               {17, 2240, 2752, m16n64, false, m32n16},
               /* the tiles × K floor: 96 tiles × 2048 reach it, × 1984 do not; the 30B-A3B down expert (2048×768) at
                * M = 64, 128 tiles × 768, goes to m32n16 (1.10–1.24× faster there, docs/PERF.md eighteenth session) */
               {48, 2048, 2048, m16n64, true, NULL},     {48, 2048, 1984, m16n64, false, m32n16},
               {64, 2048, 768, m16n64, false, m32n16},
               /* from M = 33 a floor of 48 blocks instead of 72 (prefer_min_tiles_large_m): Qwen3's k_proj/v_proj (1024
                * rows, 16 row tiles) at M = 33 … 64, not at M = 32 (32 tiles: m32n16); 768 rows from M = 49 (48 tiles),
                * the tiles × K floor still applying (48 × 4032 short of it) */
               {33, 1024, 4096, m16n64, true, NULL},     {64, 1024, 5120, m16n64, true, NULL},
               {32, 1024, 4096, m16n64, false, m32n16},  {48, 1024, 4032, m16n64, false, m32n16},
               {48, 768, 8192, m16n64, false, m32n16},   {49, 768, 4096, m16n64, true, NULL},
               {32, 1536, 8192, m16n64, false, m32n16}, /* M ≤ 32 keeps 72: 48 tiles with enough tiles × K */
               /* mma_gemv m16n48: M ≤ 16 (M ≤ 8 go to the 8-token rows first), N ≥ 4096, blocks of 48 rows × K ≥
                * 48 · 4096 and the last wave's fill ≥ 1.2× that of 64-row blocks over 132 SMs (m8n48's rule): it takes
                * m16n64's box at M 9–16 where 64-row blocks leave SMs idle — 4545 (95 blocks against 72), 5120 —, and
                * 4096 rows from K = 2304 (86 × 2304 past the floor; 2240 short of it: m16n32); not 8448 (176 blocks
                * against 132), 6352 (133 against 100: m16n64's box at M 9–16 now starts where this rule stops) or
                * 14336 (299 against 224): m16n64; not past M = 16; nor (short_k_or_many_rows) where blocks of 32 rows
                * fit one wave of 132 SMs (N ≤ 4224) and K ≥ 8192: 4096×12288 and 4224×8192 go to m16n32, 4096×8128
                * and 4225×8192 (133 blocks of 32) stay (on 132 SMs, as every case here that counts blocks per SM) */
               {9, 4096, 12288, m16n48, false, m16n32},  {16, 4224, 8192, m16n48, false, m16n32},
               {16, 4096, 8128, m16n48, true, NULL},     {12, 4225, 8192, m16n48, true, NULL},
               {16, 5120, 2496, m16n48, true, NULL},     {9, 4096, 2304, m16n48, true, NULL},
               {16, 6336, 2048, m16n48, true, NULL},     {16, 6352, 2048, m16n48, false, m16n64},
               {9, 4096, 2240, m16n48, false, m16n32},   {16, 8448, 2048, m16n48, false, m16n64},
               {16, 14336, 2048, m16n48, false, m16n64}, {12, 17408, 1024, m16n48, true, NULL},
               {17, 5120, 2496, m16n48, false, NULL},
               /* mma_gemv m8n48: M ≤ 8, N ≥ 4096, where its blocks of 48 rows fill the last wave over 132 SMs ≥ 1.2×
                * as well as blocks of 64 (prefer_fill): 6336 rows (132 blocks against 99) take it, 6337 (133 against
                * 100) do not; 12672 (264 against 198) do, 12673 (265 against 199) do not; 14336 and 27648 do not;
                * nor, by its own rule (short_k_or_many_rows), N ≤ 4224 (blocks of 32 rows in one wave) with K ≥ 8192:
                * m8n32 there */
               {1, 4096, 8192, m8n48, false, m8n32},     {8, 4224, 12288, m8n48, false, m8n32},
               {4, 4096, 8128, m8n48, true, NULL},       {2, 4225, 8192, m8n48, true, NULL},
               {1, 4096, 256, m8n48, true, NULL},        {8, 4095, 256, m8n48, false, m8n16},
               {8, 5120, 256, m8n48, true, NULL},        {9, 5120, 256, m8n48, false, m16n32},
               {1, 6336, 256, m8n48, true, NULL},        {1, 6337, 256, m8n48, false, m8n64},
               {4, 12672, 256, m8n48, true, NULL},       {4, 12673, 256, m8n48, false, m8n64_48},
               {1, 14336, 256, m8n48, false, m8n64_48},  {8, 27648, 256, m8n48, false, m8n64_48},
               {2, 17408, 512, m8n48, true, NULL},
               /* mma_gemv m8n64_48: m8n64's box where mixed_blocks splits the rows (3·k·SMs ≤ row tiles of 16 ≤
                * (4·k − 1)·SMs, k blocks per SM; prefer = mixed_splits) and m8n48's rule does not hold: 14336 rows (896
                * tiles of 16, k = 2), 27648 (1728, k = 4), 25345 (1585, k = 4), 12673 (above); not 6337 (397, k = 1:
                * above), 8448 (528) or 16896 (1056), nor in m8n64's gap (25344: 396 blocks, m8n32) */
               {1, 14336, 256, m8n64_48, true, NULL},    {8, 27648, 256, m8n64_48, true, NULL},
               {8, 25345, 256, m8n64_48, true, NULL},
               {1, 8448, 256, m8n64_48, false, m8n64},   {1, 16896, 256, m8n64_48, false, m8n64},
               {8, 25344, 256, m8n64_48, false, m8n32},
               /* mma_gemv m8n64: not at 265–396 blocks of 64 rows (prefer_gap_tiles), m8n32 there unless m8n48 fills
                * better (16897 rows: 353 blocks of 48 against 265); where its last wave is part-empty m8n64_48 first */
               {1, 16896, 256, m8n64, true, NULL},       {1, 16897, 256, m8n64, false, m8n48},
               {4, 17408, 512, m8n64, false, m8n48},     {8, 25344, 256, m8n64, false, m8n32},
               {8, 25345, 256, m8n64, false, m8n64_48},  {1, 8448, 256, m8n64, true, NULL},
               /* mma_gemv m16n64_48: M 9–16 past m16n64's box in N (N ≥ 19201) where mixed_blocks splits the rows,
                * blocks × K ≥ 48 · 4096 (m16n64's floor): 27648 rows (1728 tiles of 16, k = 4), 19201 (1201, k = 3);
                * not 25344 (1584) or 24576 (1536, k = 3: past 11 · 132), 27648 at K 448 (short of the floor), M ≤ 8,
                * M = 17 */
               {9, 27648, 512, m16n64_48, true, NULL},   {16, 27648, 512, m16n64_48, true, NULL},
               {16, 19201, 704, m16n64_48, true, NULL},  {16, 25344, 512, m16n64_48, false, m16n32},
               {16, 27648, 448, m16n64_48, false, m16n32}, {8, 27648, 512, m16n64_48, false, m8n64_48},
               {16, 24576, 512, m16n64_48, false, m16n32},
               {17, 27648, 512, m16n64_48, false, m16n64},
               /* mma_gemv m16n32: M ≤ 16 outside m16n48's, m16n64_48's and m16n64's boxes; M 17–32 goes to m16n64 or (N ≤ 2240) m32n16 */
               {16, 1024, 256, m16n32, true, NULL},      {16, 4544, 256, m16n32, true, NULL},
               {9, 4096, 256, m16n32, true, NULL},       {16, 19201, 256, m16n32, true, NULL},
               {17, 2240, 256, m16n32, false, m32n16},   {20, 4096, 1536, m16n32, false, m16n64},
               {33, 4096, 1024, m16n32, false, m16n64}};
#undef m16n256
#undef m16n64
#undef m16n32
#undef m32n16
#undef m8n64
#undef m8n64_48
#undef m8n48
#undef m16n48
#undef m16n64_48
#undef m8n16
#undef m8n32
    for (size_t i = 0; i < sizeof box / sizeof box[0]; i++)
        check_box(context, rng, box[i].M, box[i].N, box[i].K, box[i].row, box[i].want, box[i].instead, NULL);
    /* Batch-invariant calls: the GEMVs declare no order. On Hopper the default wgmma rows set the order (docs/kernels.md
     * §11) and, where their hints pass both over, the one with the fewer rows of x per tile (m64n128) takes the call
     * (not m128n128, which sets the order); on other devices mma_tile m16n256
     * keeps its box there (M 17–32, N ≥ 12288). */
    static const struct {
        size_t M, N;
        bool want;
    } invariant_box[] = {{17, 12288, true}, {32, 12288, true}, {16, 12288, false}, {33, 12288, false}, {32, 12272, false}};
    const qmm_matmul_options invariant = {.op = QMM_OP_QMM_T, .batch_invariant = 1};
    product probe;
    if (!product_make(context, rng, 17, 12288, 256, 4, 64, QMM_F16, "batch-invariant box", &probe)) return;
    const bool hopper =
        qmm_kernel_supports(context, "cuda.qmm_t.wgmma_tile.m128n128", probe.weights, 17, QMM_OP_QMM_T, NULL) == 1;
    product_free(&probe);
    for (size_t i = 0; i < sizeof invariant_box / sizeof invariant_box[0]; i++)
        if (hopper)
            check_box(context, rng, invariant_box[i].M, invariant_box[i].N, 256, "cuda.qmm_t.wgmma_tile.m64n128",
                      true, NULL, &invariant); /* every M here: K = 256 keeps both rows' tiles × K below their hints */
        else
            check_box(context, rng, invariant_box[i].M, invariant_box[i].N, 256, "cuda.qmm_t.mma_tile.m16n256",
                      invariant_box[i].want, NULL, &invariant);
}

/* The mma_tile and wgmma_tile rows with split-K (few tiles, long K: the launcher splits K across blocks and the last
 * split of each tile adds the partials in split order): against the oracle, the same bits on every run (the order
 * of the partial sums must not depend on which block finished last), and QMM_CUDA_SPLITS=1 (one split) within
 * the bound too. The wgmma rows where the device has them (Hopper). */
static void test_tile_split_k(qmm_context *context, check_rng *rng) {
    static const product_case cases[] = {
        {70, 200, 4096, 4, 64, QMM_F16}, {33, 1000, 2048, 8, 128, QMM_BF16}, {130, 77, 8192, 4, 32, QMM_BF16},
        {1, 129, 4096, 8, 32, QMM_F16},   {70, 200, 4096, 4, 64, QMM_F32},  {33, 1000, 2048, 8, 128, QMM_F32},
        {130, 77, 8192, 4, 32, QMM_F32},  {1, 129, 4096, 8, 32, QMM_F32},
    };
    /* the f16/bf16 tiles, and the f32 tile (mma_tile_bf16x3) for the f32 cases */
    static const char *rows[] = {"cuda.qmm_t.mma_tile.m64n64",         "cuda.qmm_t.mma_tile.m64n128",
                                 "cuda.qmm_t.mma_tile.m16n256",        "cuda.qmm_t.mma_tile.m32n256",
                                 "cuda.qmm_t.mma_tile_bf16x3.m32n128", "cuda.qmm_t.wgmma_tile.m128n128",
                                 "cuda.qmm_t.wgmma_tile.m64n128",      "cuda.qmm_t.wgmma_tile_fma.m128n128",
                                 "cuda.qmm_t.wgmma_tile_fma.m64n128"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        product p;
        if (!product_make_case(context, rng, &cases[c], "split-K", &p))
            continue;
        const size_t bytes = p.M * p.N * qmm_dtype_size(p.dtype);
        void *first = malloc(bytes);
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            if ((cases[c].dtype == QMM_F32) != (strstr(rows[r], "bf16x3") != NULL)) continue;
            if (strstr(rows[r], "wgmma") &&
                qmm_kernel_supports(context, rows[r], p.weights, p.M, QMM_OP_QMM_T, NULL) != 1)
                continue; /* not a Hopper device */
            char label[200];
            snprintf(label, sizeof label, "split-K %d-bit gs%d", cases[c].bits, cases[c].group_size);
            check_forced_runs(context, &p, rows[r], label, first);
            check_forced_with_env(context, &p, rows[r], "QMM_CUDA_SPLITS", "1", "one split");
        }
        free(first);
        product_free(&p);
    }
}

/* The 32-token wgmma tile two blocks an SM (wgmma_splits' rule: unsplit, where its tiles are at least 1.4 waves of the
 * SMs; one segment accumulator, 80 registers a thread): the same operations in the same order as the one-block tile
 * unsplit, so the same bits. Each case through m32n128, outputs poisoned first, each run against the oracle:
 * QMM_CUDA_WGMMA32_BLOCKS=2 (every shape unsplit at two blocks); QMM_CUDA_SPLITS=1 (one block, unsplit: the same bits);
 * QMM_CUDA_WGMMA32_BLOCKS=1 (one block, the split model's launch: other bits where it splits K); unset (the rule: the
 * bits of one of those two launches, and the two-block bits where the tiles are at least 1.4 × 144 — the most SMs a
 * Hopper GPU has —: 37632 rows at M = 17 are 294 tiles of 128, two blocks an SM by the rule, where one block a tile on
 * 132 SMs splits its last wave of 30 tiles, other bits). Edges: partial row tiles (N = 129, 300, 24000), token tiles
 * part full (M = 5, 17, 33), K of 5 or 20 groups, every group size, 4 and 8 bits, both dtypes. */
static void test_wgmma32_blocks(qmm_context *context, check_rng *rng) {
    static const product_case cases[] = {
        {32, 24000, 512, 4, 64, QMM_F16},  {17, 37632, 1024, 8, 128, QMM_BF16}, {24, 300, 2048, 4, 32, QMM_BF16},
        {33, 1000, 640, 4, 128, QMM_F16},  {5, 129, 160, 8, 32, QMM_F16},       {64, 4000, 1280, 8, 64, QMM_BF16},
        {32, 4096, 4096, 4, 64, QMM_BF16}, {20, 2000, 2560, 4, 128, QMM_F16},
    };
    static const struct {
        const char *name, *value;
    } runs[] = {{"QMM_CUDA_WGMMA32_BLOCKS", "2"}, {"QMM_CUDA_SPLITS", "1"}, {"QMM_CUDA_WGMMA32_BLOCKS", "1"}, {NULL, NULL}};
    enum { RUNS = sizeof runs / sizeof runs[0] };
    static const char *const row = "cuda.qmm_t.wgmma_tile.m32n128";
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        product p;
        if (!product_make_case(context, rng, &cases[c], "wgmma32 blocks", &p)) continue;
        if (qmm_kernel_supports(context, row, p.weights, p.M, QMM_OP_QMM_T, NULL) != 1) { /* not Hopper */
            product_free(&p);
            return;
        }
        const size_t bytes = p.M * p.N * qmm_dtype_size(p.dtype), tiles = (p.N + 127) / 128 * ((p.M + 31) / 32);
        unsigned char *bits[RUNS];
        for (size_t r = 0; r < RUNS; r++) {
            bits[r] = malloc(bytes);
            char label[240];
            snprintf(label, sizeof label, "%s %s=%s M=%zu N=%zu K=%zu %d-bit gs%d %s", row,
                     runs[r].name ? runs[r].name : "(no knob)", runs[r].value ? runs[r].value : "", p.M, p.N, p.K,
                     cases[c].bits, cases[c].group_size, qmm_dtype_name(p.dtype));
            if (runs[r].name) setenv(runs[r].name, runs[r].value, 1);
            const qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = row};
            CHECK_OK(qmm_buffer_poison(p.out));
            CHECK_OK(qmm_matmul(context, p.weights, p.x, p.M, p.out, &options, NULL));
            if (runs[r].name) unsetenv(runs[r].name);
            product_check(&p, label, 2.0);
            if (bits[r]) memcpy(bits[r], p.host_out, bytes);
            if (r == 1) CHECK(bits[0] && bits[1] && memcmp(bits[0], bits[1], bytes) == 0,
                              "%s: not the bits of two blocks an SM", label);
            if (r == 3 && tiles * 5 >= 144 * 7) /* two blocks an SM by the rule on any Hopper GPU */
                CHECK(bits[0] && bits[3] && memcmp(bits[3], bits[0], bytes) == 0,
                      "%s: not the bits of two blocks an SM (%zu tiles)", label, tiles);
            else if (r == 3)
                CHECK(bits[0] && bits[2] && bits[3] &&
                          (memcmp(bits[3], bits[0], bytes) == 0 || memcmp(bits[3], bits[2], bytes) == 0),
                      "%s: the bits of neither launch (two blocks, or one block's split model)", label);
        }
        for (size_t r = 0; r < RUNS; r++) free(bits[r]);
        product_free(&p);
    }
}

/* The wgmma rows' last wave (wgmma_splits): where the tiles fill whole waves of the device's SMs and part of one, the
 * whole waves run unsplit in one launch and the rest split across the SMs in another. N = 17000 rows at M = 100 is
 * 133 tiles of 128 × 128 (one more than the H200's 132 SMs, the last one partial in N), 266 of 128 × 64 and 532 of
 * 128 × 32; K = 2048
 * gives enough super-blocks to split at both bit widths. Against the oracle with poisoned outputs, the same bits
 * on three runs, and with QMM_CUDA_WGMMA_LAST_WAVE=0 (every tile split alike, or none) within the bound too. The
 * 32-token tile's 532 tiles run two blocks an SM, unsplit (wgmma_splits); with QMM_CUDA_WGMMA32_BLOCKS=1 its one-block
 * launch takes the last wave as the other rows do, checked against the oracle too. */
static void test_wgmma_last_wave(qmm_context *context, check_rng *rng) {
    static const struct {
        int bits, group_size;
        qmm_dtype dtype;
    } cases[] = {{4, 64, QMM_F16}, {8, 128, QMM_BF16}};
    static const char *rows[] = {"cuda.qmm_t.wgmma_tile.m128n128", "cuda.qmm_t.wgmma_tile.m64n128",
                                 "cuda.qmm_t.wgmma_tile.m32n128", "cuda.qmm_t.wgmma_tile_fma.m128n128"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        product p;
        if (!product_make(context, rng, 100, 17000, 2048, cases[c].bits, cases[c].group_size, cases[c].dtype,
                          "last wave", &p))
            continue;
        void *first = malloc(p.M * p.N * qmm_dtype_size(p.dtype));
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            if (qmm_kernel_supports(context, rows[r], p.weights, p.M, QMM_OP_QMM_T, NULL) != 1) continue; /* not Hopper */
            char label[200];
            snprintf(label, sizeof label, "last wave %d-bit gs%d", cases[c].bits, cases[c].group_size);
            check_forced_runs(context, &p, rows[r], label, first);
            check_forced_with_env(context, &p, rows[r], "QMM_CUDA_WGMMA_LAST_WAVE", "0", "without the last wave");
            if (strstr(rows[r], ".m32n128"))
                check_forced_with_env(context, &p, rows[r], "QMM_CUDA_WGMMA32_BLOCKS", "1", "one block an SM");
        }
        free(first);
        product_free(&p);
    }
}

/* The wgmma rows' split-K through a thread-block cluster (the splits of a tile sum their partials in each other's
 * shared memory; QMM_CUDA_WGMMA_CLUSTER=require: the call fails where the cluster launch is not taken, so the
 * comparison cannot pass vacuously) and through the workspace (=0): each against the oracle with poisoned outputs,
 * and the same bits (both add the splits' partials in split order) — split counts 2–8 forced (QMM_CUDA_SPLITS, the
 * cluster sizes; split_limits may lower them) and, on 64 super-blocks, 12 (11 splits: past a portable cluster, the
 * workspace either way), PREP and _fma rows, the three token tiles, edges: N not a multiple of 128, K ending inside a
 * super-block, M past one token tile. Hopper only. */
static void test_wgmma_cluster_splits(qmm_context *context, check_rng *rng) {
    static const product_case cases[] = {{128, 4096, 4096, 4, 64, QMM_F16},
                 {200, 1000, 2112, 8, 32, QMM_BF16},
                 {64, 300, 4160, 4, 64, QMM_BF16},
                 {128, 1024, 8192, 4, 64, QMM_F16}};
    static const char *rows[] = {"cuda.qmm_t.wgmma_tile.m128n128", "cuda.qmm_t.wgmma_tile.m64n128",
                                 "cuda.qmm_t.wgmma_tile.m32n128", "cuda.qmm_t.wgmma_tile_fma.m128n128"};
    static const char *splits[] = {"2", "3", "4", "8", "12"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        product p;
        if (!product_make_case(context, rng, &cases[c], "cluster splits", &p))
            continue;
        const size_t bytes = p.M * p.N * qmm_dtype_size(p.dtype);
        void *clustered = malloc(bytes);
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            if (qmm_kernel_supports(context, rows[r], p.weights, p.M, QMM_OP_QMM_T, NULL) != 1) continue; /* not Hopper */
            for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
                const qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = rows[r]};
                char label[240];
                const bool cluster = strcmp(splits[k], "12") != 0; /* 2–8 requested: a cluster (11 splits: none) */
                setenv("QMM_CUDA_SPLITS", splits[k], 1);
                if (cluster) setenv("QMM_CUDA_WGMMA_CLUSTER", "require", 1);
                CHECK_OK(qmm_buffer_poison(p.out));
                CHECK_OK(qmm_matmul(context, p.weights, p.x, p.M, p.out, &options, NULL));
                unsetenv("QMM_CUDA_WGMMA_CLUSTER");
                snprintf(label, sizeof label, "%s %s splits %s M=%zu N=%zu K=%zu %d-bit gs%d %s", rows[r], splits[k],
                         cluster ? "in a cluster" : "(cluster path allowed)", p.M, p.N, p.K, cases[c].bits,
                         cases[c].group_size, qmm_dtype_name(p.dtype));
                product_check(&p, label, 2.0);
                if (clustered) memcpy(clustered, p.host_out, bytes);
                setenv("QMM_CUDA_WGMMA_CLUSTER", "0", 1);
                CHECK_OK(qmm_buffer_poison(p.out));
                CHECK_OK(qmm_matmul(context, p.weights, p.x, p.M, p.out, &options, NULL));
                unsetenv("QMM_CUDA_WGMMA_CLUSTER");
                unsetenv("QMM_CUDA_SPLITS");
                snprintf(label, sizeof label, "%s %s splits through the workspace M=%zu N=%zu K=%zu %d-bit gs%d %s",
                         rows[r], splits[k], p.M, p.N, p.K, cases[c].bits, cases[c].group_size, qmm_dtype_name(p.dtype));
                product_check(&p, label, 2.0);
                CHECK(clustered && memcmp(clustered, p.host_out, bytes) == 0, "%s: not the cluster's bits", label);
            }
        }
        free(clustered);
        product_free(&p);
    }
    /* In a chain: the graph is captured on the first run, where the device cannot be asked how many clusters it
     * runs; the step's reserve hook asks before (wgmma_prime). Under require the capture fails without that answer,
     * so a chain that runs and matches the oracle and the workspace's bits shows the hook did its work — strictly where
     * no earlier call asked the same question (5 splits at group 128: run this section alone, QMM_TEST_SECTION). */
    product p;
    if (!product_make(context, rng, 96, 2000, 4096, 4, 128, QMM_F16, "cluster splits in a chain", &p)) return;
    const size_t bytes = p.M * p.N * qmm_dtype_size(p.dtype);
    void *chained = malloc(bytes);
    static const char *chain_rows[] = {"cuda.qmm_t.wgmma_tile.m128n128", "cuda.qmm_t.wgmma_tile.m64n128",
                                       "cuda.qmm_t.wgmma_tile.m32n128", "cuda.qmm_t.wgmma_tile_fma.m64n128"};
    for (size_t r = 0; r < sizeof chain_rows / sizeof chain_rows[0]; r++) {
        if (qmm_kernel_supports(context, chain_rows[r], p.weights, p.M, QMM_OP_QMM_T, NULL) != 1) continue;
        const qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = chain_rows[r]};
        char label[200];
        snprintf(label, sizeof label, "%s 5 splits in a cluster, in a chain", chain_rows[r]);
        setenv("QMM_CUDA_SPLITS", "5", 1);
        setenv("QMM_CUDA_WGMMA_CLUSTER", "require", 1);
        qmm_chain *chain = NULL;
        CHECK_OK(qmm_chain_create(context, &chain));
        CHECK_OK(qmm_chain_add_matmul(chain, p.weights, p.x, p.M, p.out, &options));
        for (int run = 0; run < 2; run++) { /* the capture, then a replay */
            CHECK_OK(qmm_buffer_poison(p.out));
            CHECK_OK(qmm_chain_run(chain));
            product_check(&p, label, 2.0);
        }
        qmm_chain_destroy(chain);
        if (chained) memcpy(chained, p.host_out, bytes);
        setenv("QMM_CUDA_WGMMA_CLUSTER", "0", 1);
        CHECK_OK(qmm_buffer_poison(p.out));
        CHECK_OK(qmm_matmul(context, p.weights, p.x, p.M, p.out, &options, NULL));
        unsetenv("QMM_CUDA_WGMMA_CLUSTER");
        unsetenv("QMM_CUDA_SPLITS");
        snprintf(label, sizeof label, "%s 5 splits through the workspace", chain_rows[r]);
        product_check(&p, label, 2.0);
        CHECK(chained && memcmp(chained, p.host_out, bytes) == 0, "%s: not the chain's bits", label);
    }
    free(chained);
    product_free(&p);
}

/* A CUDA context whose mma_gemv launches use 8 warps per block (QMM_CUDA_WARPS, read when a context opens), so that
 * rows whose bits differ only by the launcher's choice of warps can be compared bit for bit; NULL (a counted failure)
 * where it cannot be opened. */
static qmm_context *pinned_warps_context(void) {
    setenv("QMM_CUDA_WARPS", "8", 1);
    qmm_context *pinned = NULL;
    CHECK_OK(qmm_context_create(QMM_BACKEND_CUDA, 0, &pinned));
    unsetenv("QMM_CUDA_WARPS");
    return pinned;
}

/* mma_gemv m8n64, m8n48 and m8n64_48 (the staged tiles; m8n64_48 in blocks of both heights where the rows split over
 * the SMs — on 132 SMs 14352, 14350 and 27648 rows: 105 + 159, 105 + 159 and 144 + 384 blocks, 6336 rows 132 blocks of
 * 48; on other SM counts these may split otherwise or not at all, every block then 64 rows) with x through the
 * cp.async pipeline (the launcher's choice at M ≤ 4, and at M ≤ 8 with fewer blocks than SMs) and without: QMM_CUDA_GEMV_STAGED_X = 1 (also where the rule would not:
 * M = 6 with N = 9000), 0, and the rule, each against the oracle with poisoned outputs, three runs the same bits;
 * then, in a context with 8 warps per block pinned, staged, unstaged and m8n32 the same bits. Edges: N not a multiple
 * of 64 or 48 (the staged tiles read up to 3 / 2 zero row tiles past N), K ending inside a super-block, both bit
 * widths and dtypes, groups 32–128, M = 1 (the one-token epilogue) and M > 1. */
static void test_gemv_staged_x(qmm_context *context, check_rng *rng) {
    static const product_case cases[] = {
        {1, 5120, 1024, 4, 64, QMM_F16}, {3, 100, 4160, 4, 64, QMM_BF16}, {4, 1000, 2080, 4, 32, QMM_F16},
        {5, 777, 1152, 8, 128, QMM_BF16}, {8, 300, 2112, 8, 32, QMM_F16}, {2, 9000, 512, 4, 128, QMM_BF16},
        {1, 64, 64, 8, 64, QMM_BF16},     {6, 9000, 1024, 4, 64, QMM_F16}, /* the rule does not stage this one */
        {1, 1000, 1152, 4, 128, QMM_F16}, {1, 4100, 2048, 8, 64, QMM_F16}, /* one token, f16 */
        {1, 14352, 256, 4, 64, QMM_BF16}, {7, 14336, 512, 8, 64, QMM_F16}, {3, 27648, 128, 4, 32, QMM_F16},
        {2, 14350, 320, 4, 64, QMM_F16},  {8, 6336, 256, 4, 128, QMM_BF16}, /* a partial last tile; every block 48 rows */
    };
    static const char *modes[] = {"1", "0", NULL};
    static const char *staged_rows[] = {"cuda.qmm_t.mma_gemv.m8n64", "cuda.qmm_t.mma_gemv.m8n48",
                                        "cuda.qmm_t.mma_gemv.m8n64_48"};
    const size_t row_count = sizeof staged_rows / sizeof staged_rows[0];
    /* staged and unstaged x give the same bits with the warps pinned (a warp's arithmetic is the same; only the warp
     * count could change the final sum) */
    qmm_context *pinned = pinned_warps_context();
    for (size_t c = 0; c < row_count * (sizeof cases / sizeof cases[0]); c++) {
        const char *row = staged_rows[c % row_count];
        const size_t i = c / row_count; /* each case on every row */
        product p;
        if (!product_make_case(context, rng, &cases[i], "staged x", &p))
            continue;
        const size_t bytes = p.M * p.N * qmm_dtype_size(p.dtype);
        void *first = malloc(bytes);
        CHECK(qmm_kernel_supports(context, row, p.weights, p.M, QMM_OP_QMM_T, NULL) == 1, "%s takes M=%zu N=%zu K=%zu",
              row, p.M, p.N, p.K);
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            if (modes[m]) setenv("QMM_CUDA_GEMV_STAGED_X", modes[m], 1);
            else unsetenv("QMM_CUDA_GEMV_STAGED_X");
            char label[200];
            snprintf(label, sizeof label, "staged x %s %d-bit gs%d", modes[m] ? modes[m] : "rule", cases[i].bits,
                     cases[i].group_size);
            check_forced_runs(context, &p, row, label, first);
        }
        unsetenv("QMM_CUDA_GEMV_STAGED_X");
        free(first);
        product_free(&p);
        if (!pinned) continue; /* (its creation failed above) */
        if (!product_make_case(pinned, rng, &cases[i], "staged x (pinned)", &p))
            continue;
        void *staged = malloc(bytes), *unstaged = malloc(bytes);
        char label[200];
        snprintf(label, sizeof label, "%s staged x, 8 warps, %d-bit gs%d", row, cases[i].bits, cases[i].group_size);
        setenv("QMM_CUDA_GEMV_STAGED_X", "1", 1);
        check_forced_runs(pinned, &p, row, label, staged);
        setenv("QMM_CUDA_GEMV_STAGED_X", "0", 1);
        check_forced_runs(pinned, &p, row, label, unstaged);
        unsetenv("QMM_CUDA_GEMV_STAGED_X");
        CHECK(staged && unstaged && memcmp(staged, unstaged, bytes) == 0,
              "%s M=%zu N=%zu K=%zu: staged and unstaged bits differ", label, p.M, p.N, p.K);
        /* m8n32 with the same 8 warps: each output the same arithmetic in the same order, without the staged tiles'
         * hoisted copies over the zero row tiles or its one-token epilogue (M = 1; docs/kernels.md §9.1) — so the same
         * bits. (This check found that f16 sums in units of 1/code_scale did change roundings: twentieth session.) */
        void *rows32 = malloc(bytes);
        check_forced_runs(pinned, &p, "cuda.qmm_t.mma_gemv.m8n32", label, rows32);
        CHECK(staged && rows32 && memcmp(staged, rows32, bytes) == 0,
              "%s M=%zu N=%zu K=%zu: %s and m8n32 bits differ", label, p.M, p.N, p.K, row);
        free(rows32);
        free(staged);
        free(unstaged);
        product_free(&p);
    }
    qmm_context_destroy(pinned);
}

/* mma_gemv m16n64_48 (forced): the 16-token tile in blocks of 64 and 48 rows where the rows split over the SMs
 * (kernels.cu mixed_blocks — on 132 SMs 14352 and 27648 rows: 105 + 159 and 144 + 384 blocks; 6336 rows 132 blocks of
 * 48; 5120 and 8192 rows every block 64 rows, no split), M = 9–16 (and M = 1: one token), against the oracle with
 * poisoned outputs, three runs the same bits; then, in a context with 8 warps per block pinned, the same bits as
 * m16n64 (each output computed as a 64- or 48-row block of the 16-token tile computes it, and the row tiles of a
 * block do not enter an output's arithmetic). Edges: N not a multiple of 64 or 48, K ending inside a super-block, both
 * bit widths and dtypes, groups 32–128; M = 17 is refused (one chunk of 16 rows of x). */
static void test_gemv_mixed16(qmm_context *context, check_rng *rng) {
    static const product_case cases[] = {
        {16, 14352, 256, 4, 64, QMM_BF16}, {9, 27648, 128, 4, 32, QMM_F16}, {12, 6336, 256, 8, 128, QMM_BF16},
        {13, 14350, 320, 4, 64, QMM_F16},  {16, 5120, 1024, 8, 64, QMM_F16}, {1, 27648, 256, 4, 128, QMM_BF16},
        {10, 8192, 4160, 4, 64, QMM_F16},  {16, 300, 2112, 8, 32, QMM_BF16},
    };
    static const char *row = "cuda.qmm_t.mma_gemv.m16n64_48";
    qmm_context *pinned = pinned_warps_context();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        product p;
        if (!product_make_case(context, rng, &cases[i], "mixed 16", &p))
            continue;
        const size_t bytes = p.M * p.N * qmm_dtype_size(p.dtype);
        CHECK(qmm_kernel_supports(context, row, p.weights, p.M, QMM_OP_QMM_T, NULL) == 1, "%s takes M=%zu N=%zu K=%zu",
              row, p.M, p.N, p.K);
        CHECK(qmm_kernel_supports(context, row, p.weights, 17, QMM_OP_QMM_T, NULL) == 0, "%s refuses M=17", row);
        char label[200];
        snprintf(label, sizeof label, "mixed 16 %d-bit gs%d", cases[i].bits, cases[i].group_size);
        void *first = malloc(bytes);
        check_forced_runs(context, &p, row, label, first);
        free(first);
        product_free(&p);
        if (!pinned) continue;
        if (!product_make_case(pinned, rng, &cases[i], "mixed 16 (pinned)", &p))
            continue;
        void *mixed = malloc(bytes), *tall = malloc(bytes);
        snprintf(label, sizeof label, "%s 8 warps, %d-bit gs%d", row, cases[i].bits, cases[i].group_size);
        check_forced_runs(pinned, &p, row, label, mixed);
        check_forced_runs(pinned, &p, "cuda.qmm_t.mma_gemv.m16n64", label, tall);
        CHECK(mixed && tall && memcmp(mixed, tall, bytes) == 0, "%s M=%zu N=%zu K=%zu: m16n64_48 and m16n64 bits differ",
              label, p.M, p.N, p.K);
        free(mixed);
        free(tall);
        product_free(&p);
    }
    qmm_context_destroy(pinned);
}

/* mma_gemv m16n64 past M = 16 (forced): one grid of ceil(M/16) chunks per row tile, or one launch per chunk
 * (cuda_backend.c, m16n64_one_grid) — each case by the rule (on the H200's 132 SMs 14336 and 14300 rows, 224
 * blocks, take one launch per chunk, the others one grid) and both ways forced (QMM_CUDA_M16N64_ONE_GRID=1/0): 2, 3
 * and 4 chunks, a last chunk of 1–16 rows, N not a multiple of 64, K ending inside a super-block, both bit widths,
 * both dtypes, groups 32–128. Each against the oracle with poisoned outputs, three runs the same bits. */
static void test_m16n64_chunks(qmm_context *context, check_rng *rng) {
    static const product_case cases[] = {
        {17, 14336, 256, 4, 64, QMM_F16}, {32, 14336, 512, 8, 32, QMM_BF16},  {48, 14300, 320, 4, 64, QMM_BF16},
        {64, 12288, 256, 4, 128, QMM_F16}, {40, 12290, 2080, 4, 32, QMM_F16}, {33, 5120, 384, 8, 128, QMM_BF16},
        {20, 8500, 1056, 4, 32, QMM_BF16}, {31, 100, 4160, 4, 64, QMM_F16},
    };
    const char *row = "cuda.qmm_t.mma_gemv.m16n64";
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        product p;
        if (!product_make_case(context, rng, &cases[c], "m16n64 chunks", &p))
            continue;
        void *first = malloc(p.M * p.N * qmm_dtype_size(p.dtype));
        static const char *ways[] = {NULL, "1", "0"};
        for (size_t w = 0; w < 3; w++) {
            if (ways[w]) setenv("QMM_CUDA_M16N64_ONE_GRID", ways[w], 1);
            char label[96];
            snprintf(label, sizeof label, "chunks %s %d-bit gs%d", ways[w] ? (*ways[w] == '1' ? "one grid" : "launches") : "rule",
                     cases[c].bits, cases[c].group_size);
            check_forced_runs(context, &p, row, label, first);
            unsetenv("QMM_CUDA_M16N64_ONE_GRID");
        }
        free(first);
        product_free(&p);
    }
}

/* The same inputs twice give the same bits (no atomics, fixed reduction orders). */
static void test_determinism(qmm_context *context, check_rng *rng) {
    product p;
    if (product_make(context, rng, 7, 4096, 4096, 4, 64, QMM_BF16, "determinism", &p)) {
        const size_t bytes = p.M * p.N * qmm_dtype_size(p.dtype);
        void *first = malloc(bytes);
        CHECK_OK(qmm_matmul(context, p.weights, p.x, p.M, p.out, NULL, NULL));
        CHECK_OK(qmm_buffer_read(p.out, first, p.M * p.N));
        for (int run = 0; run < 5; run++) {
            CHECK_OK(qmm_buffer_poison(p.out));
            CHECK_OK(qmm_matmul(context, p.weights, p.x, p.M, p.out, NULL, NULL));
            CHECK_OK(qmm_buffer_read(p.out, p.host_out, p.M * p.N));
            CHECK(first && memcmp(first, p.host_out, bytes) == 0, "run %d differs from the first", run);
        }
        product_check(&p, "determinism", 2.0);
        free(first);
    }
    product_free(&p);
}

/* docs/kernels.md §2: a group whose split result is not finite is recomputed directly, so an infinite x
 * with a nonzero ŵ gives ±inf (not NaN), and huge x against ŵ = 0 gives 0, on every row. */
static void test_non_finite(qmm_context *context, check_rng *rng) {
    (void)rng; /* fixed inputs: the section table passes every section a generator */
    enum { N = 16, K = 64 };
    const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    for (size_t d = 0; d < 3; d++) {
        const qmm_dtype dtype = dtypes[d];
        uint32_t w[N * K * 4 / 32];
        uint16_t scales16[N * 2], biases16[N * 2];
        float scales32[N * 2], biases32[N * 2];
        /* 4-bit, gs 32: every code 1, s = 1, b = −0.5 → ŵ = 0.5 (rows 0..7); s = 1, b = −1 → ŵ = 0 (rows 8..15). */
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) w[i] = 0x11111111u;
        for (size_t r = 0; r < N; r++)
            for (size_t g = 0; g < 2; g++) {
                const float s = 1.0f, b = r < 8 ? -0.5f : -1.0f;
                scales32[r * 2 + g] = s, biases32[r * 2 + g] = b;
                scales16[r * 2 + g] = dtype == QMM_F16 ? qmm_f32_to_f16(s) : qmm_f32_to_bf16(s);
                biases16[r * 2 + g] = dtype == QMM_F16 ? qmm_f32_to_f16(b) : qmm_f32_to_bf16(b);
            }
        qmm_qmatrix m = {w, dtype == QMM_F32 ? (void *)scales32 : (void *)scales16,
                         dtype == QMM_F32 ? (void *)biases32 : (void *)biases16, dtype, N, K, 4, 32};
        /* x row 0: +inf at k = 0; x row 1: 2e38 (f32) or the dtype's max at k = 0 and 1 (only where it is
         * finite in the dtype: f16's max is 65504, so the huge row is f32/bf16 only). */
        float x32[2 * K] = {0};
        x32[0] = INFINITY;
        x32[K + 0] = x32[K + 1] = 2e38f;
        uint16_t x16[2 * K];
        for (size_t i = 0; i < 2 * K; i++) x16[i] = dtype == QMM_F16 ? qmm_f32_to_f16(x32[i]) : qmm_f32_to_bf16(x32[i]);
        qmm_weights *weights = NULL;
        qmm_buffer *xb = NULL, *ob = NULL;
        CHECK_OK(qmm_weights_create(context, &m, &weights));
        CHECK_OK(qmm_buffer_create(context, dtype, 2 * K, &xb));
        CHECK_OK(qmm_buffer_create(context, dtype, 2 * N, &ob));
        if (!weights || !xb || !ob) goto next;
        CHECK_OK(qmm_buffer_write(xb, dtype == QMM_F32 ? (void *)x32 : (void *)x16, 2 * K));
        for (size_t k = 0; k < qmm_kernel_count(context); k++) {
            qmm_kernel_info info;
            CHECK_OK(qmm_kernel_get(context, k, &info));
            if (info.op != QMM_OP_QMM_T || qmm_kernel_supports(context, info.name, weights, 2, info.op, NULL) != 1)
                continue;
            qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = info.name};
            CHECK_OK(qmm_buffer_poison(ob));
            CHECK_OK(qmm_matmul(context, weights, xb, 2, ob, &options, NULL));
            float out[2 * N];
            if (dtype == QMM_F32) {
                CHECK_OK(qmm_buffer_read(ob, out, 2 * N));
            } else {
                uint16_t out16[2 * N];
                CHECK_OK(qmm_buffer_read(ob, out16, 2 * N));
                for (size_t i = 0; i < 2 * N; i++)
                    out[i] = dtype == QMM_F16 ? qmm_f16_to_f32(out16[i]) : qmm_bf16_to_f32(out16[i]);
            }
            for (size_t n = 0; n < N; n++) {
                /* Row 0 of x (+inf at k = 0): ŵ = 0.5 gives +inf; ŵ = 0 gives NaN (0·inf), as in the oracle. */
                if (n < 8) CHECK(isinf(out[n]) && out[n] > 0, "%s %s: inf·0.5 gave %g", info.name, qmm_dtype_name(dtype), out[n]);
                if (dtype != QMM_F16 && n >= 8)
                    CHECK(out[N + n] == 0.0f, "%s %s: 2e38·0 gave %g, exact 0", info.name, qmm_dtype_name(dtype), out[N + n]);
            }
        }
    next:
        qmm_weights_destroy(weights);
        qmm_buffer_destroy(xb);
        qmm_buffer_destroy(ob);
    }
}

/* Large f16 activations (up to ±65000 at a few k of each row, the rest uniform in [-1, 1)) through every CUDA row
 * that takes the call, with poisoned outputs, against the oracle: the f16 decode keeps x as it is (an earlier
 * version multiplied half of x by 16, which overflowed above 4094 and sent whole rows to the slow f64 rule);
 * the exact outputs stay finite or, beyond f16, become ±inf as in the oracle. Groups of 32 (m8n64 copies its
 * pairs in two rounds), 8-bit groups of 128 (a pair stored with two super-blocks) and K = 1024 (split-K in the
 * tile rows). */
static void test_large_f16_x(qmm_context *context, check_rng *rng) {
    static const struct {
        int bits, group_size;
        size_t K;
    } formats[] = {{4, 32, 1024}, {4, 64, 256}, {8, 64, 256}, {8, 128, 1024}};
    const size_t Ms[] = {1, 5, 16}, N = 96;
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
        for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
            product p;
            const size_t K = formats[f].K;
            const int bits = formats[f].bits;
            if (!product_make(context, rng, Ms[i], N, K, bits, formats[f].group_size, QMM_F16, "large f16 x", &p)) continue;
            uint16_t *x = p.host_x;
            for (size_t m = 0; m < p.M; m++)
                for (size_t j = 0; j < 3; j++) {
                    const size_t k = (m * 37 + j * 91 + 5) % K;
                    const float v = 4095.0f + (float)((m * 7919 + j * 104729) % 60905);
                    x[m * K + k] = qmm_f32_to_f16(j == 1 ? -v : v);
                }
            CHECK_OK(qmm_buffer_write(p.x, p.host_x, p.M * K));
            CHECK_OK(qmm_ref_dense_f64(&p.q.m, p.host_x, p.M, 1, p.exact, p.abs_dot));
            char what[96];
            snprintf(what, sizeof what, "large f16 x, %d-bit gs%d K=%zu, M=%zu", bits, formats[f].group_size, K, p.M);
            check_every_row(context, &p, what);
            product_free(&p);
        }
}

/* A stable sort of B (lhs, rhs) index pairs by expert (rhs), as MLX's sorted_indices wants them: an insertion sort,
 * quadratic — for the tests' small B. */
static void sort_pairs_by_expert(uint32_t *lhs, uint32_t *rhs, size_t B) {
    for (size_t i = 1; i < B; i++)
        for (size_t j = i; j > 0 && rhs[j - 1] > rhs[j]; j--) {
            const uint32_t r = rhs[j], l = lhs[j];
            rhs[j] = rhs[j - 1], lhs[j] = lhs[j - 1];
            rhs[j - 1] = r, lhs[j - 1] = l;
        }
}

/* MoE gather on the GPU (cuda.gather.blocks.auto): every token picks `active` distinct experts of E, the pairs sorted
 * by expert (MLX's sorted_indices) or left in token order, x rows named by lhs_indices (with one expert per token also
 * lhs_indices NULL: x row i for pair i); against the f64 oracle, the selector's row named, nothing written past B·N —
 * each call with the expert blocks of ≤ 16 rows in grouped GEMV launches and the larger blocks in grouped tile launches
 * (the default where the mma_gemv rows take them; QMM_CUDA_GATHER_GROUPED=1 there, so a call that did not group would
 * fail, and it must fail where they do not) — wgmma m32n128/m64n128 on Hopper (required there: QMM_CUDA_GATHER_TILES=wgmma,
 * which must fail elsewhere) and m64n64 (QMM_CUDA_GATHER_TILES=mma) —, with the blocks of 17–256 rows cut into chunks
 * of 16 for the GEMV launches (QMM_CUDA_GATHER_CHUNK_ROWS=256), with no block cut and no tile launches
 * (QMM_CUDA_GATHER_TILES=0, QMM_CUDA_GATHER_CHUNK_ROWS=16: a launch per block of > 16 rows) and with a launch per block
 * (QMM_CUDA_GATHER_GROUPED=0). Formats: the tensor-core rows (4/8-bit f16/bf16; 3- and 6-bit, stored as 4/8-bit codes),
 * 3-bit f32 (the f32 rows) and an 8-bit f16 stack with N = 200 (not a multiple of 16: no repacked slices, the generic
 * row, no grouping). Batch-invariant mode too (B ≤ 5000, sorted and not; grouping required where the format groups):
 * against the oracle, and every pair bit for bit the gather of that one pair alone. */
static void test_gather(qmm_context *context, check_rng *rng) {
    static const struct {
        size_t experts, active, T, N, K;
        int bits, group_size;
        qmm_dtype dtype;
    } cases[] = {
        {16, 4, 5, 96, 256, 4, 64, QMM_BF16}, {16, 4, 40, 200, 512, 8, 32, QMM_F16},
        {8, 2, 3, 33, 128, 3, 32, QMM_F32},   {32, 8, 1, 768, 2048, 4, 64, QMM_BF16},
        /* sorted: blocks of 7–13 rows, so both grouped launches (≤ 8 and 9–16 rows) in one call */
        {16, 4, 40, 256, 256, 4, 32, QMM_F16}, {8, 2, 48, 256, 512, 8, 128, QMM_F16},
        /* blocks of about 20 rows (in the tile launches where forced, else cut into chunks of 16 and the rest — too few
         * tiles for a launch of their own —, or a launch each) beside smaller ones; one expert per token (lhs_indices
         * NULL too) */
        {4, 2, 40, 128, 512, 4, 128, QMM_BF16}, {4, 1, 24, 64, 256, 8, 64, QMM_BF16},
        /* unsorted, every token's two pairs on different experts: more than 65535 blocks of ≤ 2 rows (grid.z per
         * grouped launch is 65535) — grouped and unsorted only (the test's insertion sort is quadratic, and 70001
         * launches, one per block, would take minutes under compute-sanitizer) */
        {2, 2, 70000, 16, 64, 4, 32, QMM_F16},
        /* 200 experts, one per token, about 12 tokens each: sorted, more than QMM_CUDA_GROUPED_MAX blocks of 9–16
         * rows (their table goes up with the call) beside fewer than that of ≤ 8 rows (theirs in the launch's
         * parameter) and some past 16 (in the tile launches where forced, else cut); unsorted, 2400 blocks of one row */
        {200, 1, 2400, 16, 64, 4, 32, QMM_BF16},
        /* exactly QMM_CUDA_GROUPED_MAX blocks in a class (the table in the launch's parameter) and one more (the
         * table uploaded): A = E routes deterministically (shift 0) — sorted, E blocks of T rows read in place;
         * unsorted, T·E blocks of one row (uploaded) */
        {64, 64, 8, 32, 128, 4, 64, QMM_BF16}, {65, 65, 8, 32, 128, 4, 64, QMM_BF16}, /* ≤ 8 rows: 64 / 65 */
        {64, 64, 12, 32, 128, 8, 64, QMM_F16}, {65, 65, 12, 32, 128, 8, 64, QMM_F16}, /* 9–16 rows: 64 / 65 */
        {64, 64, 20, 32, 128, 4, 64, QMM_BF16}, {65, 65, 20, 32, 128, 4, 64, QMM_BF16}, /* the tiles (forced): 64 / 65 */
        /* sorted: both classes uploaded in one call (about 114 blocks of ≤ 8 rows and 140 of 9–16), x gathered, B not
         * a multiple of 4 (4 bytes of index padding before the two tables) */
        {256, 1, 2303, 16, 64, 4, 32, QMM_F16},
        /* about 600 tokens per expert on 1536 rows: the grouped tile launches, 10 tiles of 64 tokens per expert (more
         * than the 256 rows QMM_CUDA_GATHER_CHUNK_ROWS=256 cuts); a launch per block: 120 tiles of 128 × 64, the wgmma
         * m64n128 row on Hopper */
        {2, 1, 1200, 1536, 256, 4, 64, QMM_F16},
        /* N = 14352 (225 blocks of 64 rows, the last of 16): with a launch per block of ≤ 8 rows the selector takes
         * mma_gemv m8n64, whose copies read up to 3 row tiles past an expert's slice unchecked — into the next expert's
         * rows, and for the last expert into the zero tiles that end the repacked arrays (QMM_CUDA_PAD_ROW_TILES); M = 1
         * blocks run its one-token epilogue. Under compute-sanitizer memcheck (make test-gpu), a read past them fails.
         * N = 5104 (107 blocks of 48 rows, the last of 16): m8n48 the same way, up to 2 row tiles past. */
        {3, 1, 6, 14352, 128, 4, 64, QMM_F16}, {3, 1, 6, 5104, 128, 4, 64, QMM_F16},
        /* 3- and 6-bit stacks (stored as 4- and 8-bit codes): grouped like those */
        {16, 4, 40, 96, 256, 3, 32, QMM_BF16}, {8, 2, 20, 64, 512, 6, 64, QMM_F16},
        /* K = 4096 (16–64 super-blocks): the warps per block are not capped by K, so in batch-invariant mode only the
         * fixed count keeps a pair's bits — a one-pair launch (8 blocks) and the whole call's (hundreds of blocks,
         * blocks of 16–20 rows sorted: chunks of 16 and the rest) would get different counts from the model */
        {16, 4, 72, 256, 4096, 4, 64, QMM_BF16}, {16, 4, 72, 256, 4096, 8, 32, QMM_F16},
        /* blocks of about 75 rows (two wgmma tiles of 64 tokens, the second part full) on N = 208 (a part-full tile of
         * 128 rows), K = 320 at 4 bits (2.5 super-blocks); of about 50 rows, 8-bit groups of 128 */
        {4, 2, 150, 208, 320, 4, 32, QMM_BF16}, {6, 3, 100, 144, 384, 8, 128, QMM_F16},
    };
    /* whether the device runs the wgmma tiles (Hopper): the default grouped calls there must take the wgmma tile
     * launches (QMM_CUDA_GATHER_TILES=wgmma, an error where they do not run), elsewhere that knob must be refused */
    bool probed;
    const bool hopper = wgmma_device(context, rng, "gather probe", &probed);
    if (!probed) return;
    /* the runs of a case (below); run (c, variant) is number variant·CASES + c, in shard (that mod n): a variant's runs
     * over the cases fall in different shards (the costly ones — a launch per block, the batch-invariant pairs alone —
     * are variants), and each case and run draws from its own generator (part_rng), whichever others ran */
    enum { VARIANTS = 16, CASES = sizeof cases / sizeof cases[0] };
    const check_rng base = *rng;
    for (size_t c = 0; c < CASES; c++) {
        bool any = false;
        for (size_t v = 0; v < VARIANTS; v++) any = any || in_shard(v * CASES + c);
        if (!any) continue;
        check_rng case_rng = part_rng(base, c, VARIANTS); /* the weights and x */
        const size_t E = cases[c].experts, A = cases[c].active, T = cases[c].T, N = cases[c].N, K = cases[c].K;
        const size_t B = T * A, size = qmm_dtype_size(cases[c].dtype);
        check_qmatrix q = {0};
        if (!check_qmatrix_random(&case_rng, E * N, K, cases[c].bits, cases[c].group_size, cases[c].dtype, &q)) {
            CHECK(false, "gather: out of memory");
            continue;
        }
        uint32_t *lhs = malloc(B * sizeof *lhs), *rhs = malloc(B * sizeof *rhs);
        void *x = malloc(T * K * size), *out = malloc((B * N + 64) * size);
        double *exact = malloc(B * N * sizeof(double)), *abs_dot = malloc(B * N * sizeof(double));
        void *one = malloc(N * size);
        qmm_weights *experts = NULL;
        qmm_buffer *xb = NULL, *ob = NULL, *ob_one = NULL;
        if (!lhs || !rhs || !x || !out || !exact || !abs_dot || !one) {
            CHECK(false, "gather: out of memory");
            goto next;
        }
        check_fill_uniform(&case_rng, x, cases[c].dtype, T * K, -1.0f, 1.0f);
        CHECK_OK(qmm_weights_create_experts(context, &q.m, E, &experts));
        CHECK_OK(qmm_buffer_create(context, cases[c].dtype, T * K, &xb));
        CHECK_OK(qmm_buffer_create(context, cases[c].dtype, B * N + 64, &ob));
        CHECK_OK(qmm_buffer_create(context, cases[c].dtype, N, &ob_one));
        if (!experts || !xb || !ob || !ob_one) goto next;
        CHECK_OK(qmm_buffer_write(xb, x, T * K));
        /* variants 0–5: sorted or not × grouped (the default: blocks of > 16 rows in the grouped tile launches) or a
         * launch per block × lhs_indices NULL; 6–7: the batch-invariant mode, sorted or not; 8–9: grouped with the
         * blocks of 17–256 rows cut into chunks of 16 (QMM_CUDA_GATHER_CHUNK_ROWS=256; larger ones in the tile
         * launches), sorted or not; 10–11: grouped with no block cut and no tile launches (QMM_CUDA_GATHER_TILES=0,
         * QMM_CUDA_GATHER_CHUNK_ROWS=16: a launch per block of > 16 rows); 12–13: every block of > 16 rows in the
         * m64n64 tile launches (QMM_CUDA_GATHER_TILES=mma, QMM_CUDA_GATHER_CHUNK_ROWS=16: none cut, however few),
         * sorted or not. Variants 0–1 on Hopper: every such block in the wgmma tile launches, required
         * (QMM_CUDA_GATHER_TILES=wgmma, QMM_CUDA_GATHER_CHUNK_ROWS=16); elsewhere and in 4–5 the default rule (a
         * tile class of fewer thread blocks than SMs cut into chunks). 14–15, on Hopper only: sorted, the wgmma tile
         * launches required with tiles of 32 and of 64 tokens (QMM_CUDA_GATHER_WGMMA_TOKENS; unset, the blocks' sizes
         * pick). */
        /* whether the format groups: any width (2/3/5/6-bit codes are stored as 4/8-bit ones) */
        const bool groups = (cases[c].dtype == QMM_F16 || cases[c].dtype == QMM_BF16) && N % 16 == 0;
        for (int variant = 0; variant < VARIANTS; variant++) {
            if (!in_shard((size_t)variant * CASES + c)) continue;
            check_rng run_rng = part_rng(base, c, (uint64_t)variant); /* the routing, the pairs checked alone */
            const int tokens = variant == 14 ? 32 : variant == 15 ? 64 : 0; /* QMM_CUDA_GATHER_WGMMA_TOKENS */
            const int invariant = variant == 6 || variant == 7, knobbed = variant >= 8;
            const int sorted = (variant & 1) || tokens, cut = variant == 8 || variant == 9;
            const int untiled = variant == 10 || variant == 11, mma_tiles = variant == 12 || variant == 13;
            const int wgmma_tiles = (variant <= 1 || tokens) && hopper && groups;
            if (tokens && !wgmma_tiles) continue;
            const int grouped = invariant || knobbed || !(variant & 2), lhs_null = variant == 4 || variant == 5;
            if (((sorted || !grouped || invariant || knobbed) && B > 5000) || (lhs_null && A != 1) ||
                (knobbed && !groups))
                continue;
            /* token t takes experts (t·7 + j·(E/A) + random offset) mod E, j < A: distinct */
            for (size_t t = 0; t < T; t++) {
                const size_t shift = (size_t)(check_rng_next(&run_rng) % (E / A));
                for (size_t j = 0; j < A; j++) {
                    lhs[t * A + j] = (uint32_t)t;
                    rhs[t * A + j] = (uint32_t)((t * 7 + j * (E / A) + shift) % E);
                }
            }
            if (sorted) sort_pairs_by_expert(lhs, rhs, B);
            CHECK_OK(qmm_buffer_poison(ob));
            qmm_gather_options options = {.sorted_indices = sorted, .batch_invariant = invariant};
            qmm_kernel_info ran = {0};
            const uint32_t *lhs_used = lhs_null ? NULL : lhs;
            if (grouped && !groups) { /* requiring grouping where it cannot be is an error naming why */
                setenv("QMM_CUDA_GATHER_GROUPED", "1", 1);
                CHECK_STATUS(qmm_gather_matmul(context, experts, xb, T, lhs_used, rhs, B, ob, &options, NULL),
                             QMM_ERR_UNSUPPORTED);
                CHECK(strstr(qmm_last_error(), "QMM_CUDA_GATHER_GROUPED=1, but these expert blocks cannot") != NULL,
                      "gather E=%zu N=%zu %d-bit %s, grouping required: %s", E, N, cases[c].bits,
                      qmm_dtype_name(cases[c].dtype), qmm_last_error());
                unsetenv("QMM_CUDA_GATHER_GROUPED");
            }
            if (!grouped || groups) setenv("QMM_CUDA_GATHER_GROUPED", grouped ? "1" : "0", 1);
            if (variant == 0 && !hopper && groups) { /* the wgmma tiles required where they do not run: an error */
                setenv("QMM_CUDA_GATHER_TILES", "wgmma", 1);
                CHECK_STATUS(qmm_gather_matmul(context, experts, xb, T, lhs_used, rhs, B, ob, &options, NULL),
                             QMM_ERR_UNSUPPORTED);
                CHECK(strstr(qmm_last_error(), "QMM_CUDA_GATHER_TILES=wgmma, but the wgmma tile cannot take") != NULL,
                      "gather E=%zu N=%zu, wgmma tiles required off Hopper: %s", E, N, qmm_last_error());
                unsetenv("QMM_CUDA_GATHER_TILES");
            }
            const char *chunk_rows = cut ? "256" : untiled || mma_tiles || wgmma_tiles ? "16" : NULL;
            if (chunk_rows) setenv("QMM_CUDA_GATHER_CHUNK_ROWS", chunk_rows, 1);
            if (untiled || mma_tiles || wgmma_tiles)
                setenv("QMM_CUDA_GATHER_TILES", untiled ? "0" : mma_tiles ? "mma" : "wgmma", 1);
            if (wgmma_tiles && sorted) setenv("QMM_CUDA_GATHER_WGMMA_BLOCKS", "3", 1); /* items past the stages */
            if (tokens) setenv("QMM_CUDA_GATHER_WGMMA_TOKENS", tokens == 32 ? "32" : "64", 1);
            CHECK_OK(qmm_gather_matmul(context, experts, xb, T, lhs_used, rhs, B, ob, &options, &ran));
            unsetenv("QMM_CUDA_GATHER_GROUPED");
            unsetenv("QMM_CUDA_GATHER_CHUNK_ROWS");
            unsetenv("QMM_CUDA_GATHER_TILES");
            unsetenv("QMM_CUDA_GATHER_WGMMA_BLOCKS");
            unsetenv("QMM_CUDA_GATHER_WGMMA_TOKENS");
            CHECK(ran.name && strcmp(ran.name, "cuda.gather.blocks.auto") == 0, "gather ran %s",
                  ran.name ? ran.name : "?");
            qmm_kernel_info chosen = {0}; /* qmm_select_gather names the row that ran, without buffers */
            CHECK_OK(qmm_select_gather(context, experts, T, lhs_used, rhs, B, &options, &chosen));
            CHECK(chosen.name && ran.name && strcmp(chosen.name, ran.name) == 0, "qmm_select_gather named %s, %s ran",
                  chosen.name ? chosen.name : "?", ran.name ? ran.name : "?");
            CHECK_OK(qmm_buffer_read(ob, out, B * N + 64));
            CHECK_OK(qmm_ref_gather_dense_f64(&q.m, E, x, T, lhs_used, rhs, B, exact, abs_dot));
            char label[200];
            snprintf(label, sizeof label, "gather E=%zu N=%zu K=%zu T=%zu B=%zu %d-bit gs%d %s %s%s%s%s%s%s", E, N, K,
                     T, B, cases[c].bits, cases[c].group_size, qmm_dtype_name(cases[c].dtype),
                     sorted ? "sorted" : "unsorted", grouped ? "" : ", a launch per block",
                     lhs_null ? ", lhs_indices NULL" : "", invariant ? ", batch-invariant" : "",
                     untiled ? ", blocks of > 16 rows a launch each" : cut ? ", blocks of 17-256 rows cut" : "",
                     mma_tiles ? ", m64n64 tiles"
                     : tokens == 32  ? ", wgmma tiles of 32 tokens required, 3 thread blocks"
                     : tokens == 64  ? ", wgmma tiles of 64 tokens required, 3 thread blocks"
                     : wgmma_tiles ? (sorted ? ", wgmma tiles required, 3 thread blocks" : ", wgmma tiles required")
                                   : "");
            double worst = 0;
            size_t bad = check_against_oracle(label, out, cases[c].dtype, exact, abs_dot, B * N, K, 2.0, &worst);
            CHECK(bad == 0, "%s: %zu outputs outside the bound (worst %.3g)", label, bad, worst);
            size_t past = 0;
            for (size_t i = B * N; i < B * N + 64; i++) past += !isnan(qmm_load_f32(out, cases[c].dtype, i));
            CHECK(past == 0, "%s: %zu elements written past B·N", label, past);
            if (!invariant) continue;
            /* the mode's promise: each pair's bits those of the pair alone (its one-pair gather, grouped alike) —
             * every pair up to B = 256, else 256 pairs at a stride (a call each: memcheck runs this section) */
            size_t differ = 0, first = 0, checked = 0;
            const size_t stride = B > 256 ? B / 256 : 1;
            if (groups) setenv("QMM_CUDA_GATHER_GROUPED", "1", 1);
            for (size_t i = (size_t)(check_rng_next(&run_rng) % stride); i < B; i += stride) {
                const qmm_gather_options alone = {.batch_invariant = 1};
                checked++;
                CHECK_OK(qmm_buffer_poison(ob_one));
                CHECK_OK(qmm_gather_matmul(context, experts, xb, T, &lhs[i], &rhs[i], 1, ob_one, &alone, NULL));
                CHECK_OK(qmm_buffer_read(ob_one, one, N));
                if (memcmp(one, (const char *)out + i * N * size, N * size) != 0 && differ++ == 0) first = i;
            }
            unsetenv("QMM_CUDA_GATHER_GROUPED");
            CHECK(differ == 0, "%s: %zu of %zu pairs checked differ from the pair alone (first: pair %zu, token %u, "
                  "expert %u)", label, differ, checked, first, lhs[first], rhs[first]);
        }
    next:
        qmm_weights_destroy(experts);
        qmm_buffer_destroy(xb);
        qmm_buffer_destroy(ob);
        qmm_buffer_destroy(ob_one);
        free(lhs), free(rhs), free(x), free(out), free(exact), free(abs_dot), free(one);
        check_qmatrix_free(&q);
    }
}

/* Gathers queued back to back (docs/kernels.md §10: each call's indices and the tables of classes of more than 64
 * blocks go up in one copy from one of two staging buffers used in turn; a table of ≤ 64 blocks travels in its
 * launch's parameters): every output read only after the last call, each call's index arrays overwritten with
 * out-of-range values as soon as it returns (the library must have copied them). The calls differ in T and in their
 * routing, so the staging buffers grow and are reused with other contents while earlier copies may be pending:
 * random pairs (exactly 2T blocks of one row, x in place: T = 32 is 64 blocks, the table in the parameter, T = 33 is
 * 66, the table uploaded), pairs sorted by expert (blocks of about 12 rows whose x rows are not consecutive: the
 * indices go up, x is gathered, the m16n32 grouped launch — or a launch of its own past 16), and runs (each of two
 * experts takes every token in order: blocks of T consecutive rows of x, in place with lhs_indices given — grouped for
 * T ≤ 16, a launch each above). Each call's output against the f64 oracle, on its own indices. */
static void test_gather_queue(qmm_context *context, check_rng *rng) {
    enum { E = 8, A = 2, N = 64, K = 256, CALLS = 12, T_MAX = 48 };
    enum { RANDOM, SORTED, RUNS };
    static const struct {
        size_t T;
        int routing;
    } calls[CALLS] = {{1, RANDOM},  {3, RANDOM},  {48, SORTED}, {33, RANDOM}, {48, SORTED}, {2, RANDOM},
                      {17, RUNS},   {32, RANDOM}, {1, RANDOM},  {1, RANDOM},  {40, SORTED}, {12, RUNS}};
    const qmm_dtype dtype = QMM_BF16;
    check_qmatrix q = {0};
    if (!check_qmatrix_random(rng, E * N, K, 4, 64, dtype, &q)) {
        CHECK(false, "gather_queue: out of memory");
        return;
    }
    static uint32_t lhs[CALLS][T_MAX * A], rhs[CALLS][T_MAX * A], scratch_lhs[T_MAX * A], scratch_rhs[T_MAX * A];
    static uint16_t x[T_MAX * K], out[T_MAX * A * N];
    static double exact[T_MAX * A * N], abs_dot[T_MAX * A * N];
    check_fill_uniform(rng, x, dtype, T_MAX * K, -1.0f, 1.0f);
    qmm_weights *experts = NULL;
    qmm_buffer *xb = NULL, *ob[CALLS] = {0};
    CHECK_OK(qmm_weights_create_experts(context, &q.m, E, &experts));
    CHECK_OK(qmm_buffer_create(context, dtype, T_MAX * K, &xb));
    bool ready = experts && xb && qmm_buffer_write(xb, x, T_MAX * K) == QMM_OK;
    for (size_t c = 0; c < CALLS && ready; c++) {
        CHECK_OK(qmm_buffer_create(context, dtype, calls[c].T * A * N, &ob[c]));
        ready = ob[c] && qmm_buffer_poison(ob[c]) == QMM_OK;
    }
    for (size_t c = 0; c < CALLS && ready; c++) {
        const size_t T = calls[c].T, B = T * A;
        uint32_t *l = lhs[c], *r = rhs[c];
        if (calls[c].routing == RUNS) { /* pairs [0, T) on expert e0, [T, 2T) on e1, tokens in order */
            const uint32_t e0 = (uint32_t)(check_rng_next(rng) % E), e1 = (e0 + 1 + (uint32_t)(check_rng_next(rng) % (E - 1))) % E;
            for (size_t i = 0; i < B; i++) l[i] = (uint32_t)(i % T), r[i] = i < T ? e0 : e1;
        } else {
            for (size_t t = 0; t < T; t++) /* token t's experts: distinct (even for j = 0, odd for j = 1) */
                for (size_t j = 0; j < A; j++) {
                    l[t * A + j] = (uint32_t)t;
                    r[t * A + j] = (uint32_t)((check_rng_next(rng) % (E / A)) * A + j);
                }
            if (calls[c].routing == SORTED) sort_pairs_by_expert(l, r, B);
        }
        memcpy(scratch_lhs, l, B * sizeof(uint32_t));
        memcpy(scratch_rhs, r, B * sizeof(uint32_t));
        setenv("QMM_CUDA_GATHER_GROUPED", "1", 1);
        CHECK_OK(qmm_gather_matmul(context, experts, xb, T, scratch_lhs, scratch_rhs, B, ob[c], NULL, NULL));
        unsetenv("QMM_CUDA_GATHER_GROUPED");
        memset(scratch_lhs, 0xFF, sizeof scratch_lhs); /* out of range, were they read after the call */
        memset(scratch_rhs, 0xFF, sizeof scratch_rhs);
    }
    for (size_t c = 0; c < CALLS && ready; c++) {
        const size_t T = calls[c].T, B = T * A;
        CHECK_OK(qmm_buffer_read(ob[c], out, B * N));
        CHECK_OK(qmm_ref_gather_dense_f64(&q.m, E, x, T, lhs[c], rhs[c], B, exact, abs_dot));
        static const char *const routings[] = {"random", "sorted", "runs"};
        char label[96];
        snprintf(label, sizeof label, "gather_queue call %zu of %d (T=%zu, B=%zu, %s)", c + 1, CALLS, T, B,
                 routings[calls[c].routing]);
        double worst = 0;
        const size_t bad = check_against_oracle(label, out, dtype, exact, abs_dot, B * N, K, 2.0, &worst);
        CHECK(bad == 0, "%s: %zu outputs outside the bound (worst %.3g)", label, bad, worst);
    }
    for (size_t c = 0; c < CALLS; c++) qmm_buffer_destroy(ob[c]);
    qmm_weights_destroy(experts);
    qmm_buffer_destroy(xb);
    check_qmatrix_free(&q);
}

/* The non-finite rule (docs/kernels.md §2) through the gather: 3 experts of 16×64 (4-bit, gs 32) that differ in
 * their codes (expert e: every code e + 1) and in which rows have ŵ = 0.5 or ŵ = 0 (expert 1 the other half), so the
 * exact fallback of a row whose sum is not finite reads its own expert's codes, scales and biases or gives another
 * sign; token 0 has +inf at k = 0 (ŵ = 0.5: +inf; ŵ = 0: NaN, 0·inf), token 1 (f32 and bf16: f16's max is 65504)
 * 2e38 at k = 0 and 1 (ŵ = 0: exactly 0; their Σx overflows f32, so the tiles' b·Σx is not finite either). Both
 * tokens on experts 1 and 2, alternating: two blocks of 20 rows, grouped (f16, bf16: the GEMV chunks and both tile
 * kinds) and with a launch per block. */
static void test_gather_non_finite(qmm_context *context, check_rng *rng) {
    /* fixed inputs (rng: the Hopper probe's product only); two blocks of 20 pairs, tokens 0, 1, 0, 1, … on experts 1
     * and 2 — a launch per block, the default grouping (the blocks cut into chunks for the GEMV launches: two tiles'
     * worth), every block of > 16 rows in the m64n64 tile launches, and on Hopper in the wgmma ones */
    enum { E = 3, N = 16, K = 64, T = 2, B = 40 };
    uint32_t lhs[B], rhs[B];
    for (size_t i = 0; i < B; i++) lhs[i] = (uint32_t)(i % 2), rhs[i] = i < B / 2 ? 1u : 2u;
    bool probed;
    const bool hopper = wgmma_device(context, rng, "gather non-finite probe", &probed);
    if (!probed) return;
    const qmm_dtype dtypes[] = {QMM_F32, QMM_F16, QMM_BF16};
    for (size_t d = 0; d < 3; d++) {
        const qmm_dtype dtype = dtypes[d];
        static uint32_t w[E * N * K * 4 / 32];
        uint16_t scales16[E * N * 2], biases16[E * N * 2];
        float scales32[E * N * 2], biases32[E * N * 2];
        for (size_t e = 0; e < E; e++)
            for (size_t r = 0; r < N; r++) {
                const uint32_t code = (uint32_t)e + 1;
                for (size_t i = 0; i < K * 4 / 32; i++) w[(e * N + r) * (K * 4 / 32) + i] = code * 0x11111111u;
                const bool half = e == 1 ? r >= 8 : r < 8;
                for (size_t g = 0; g < 2; g++) {
                    const size_t at = (e * N + r) * 2 + g;
                    const float s = 1.0f, b = (half ? 0.5f : 0.0f) - (float)code; /* ŵ = code + b */
                    scales32[at] = s, biases32[at] = b;
                    scales16[at] = dtype == QMM_F16 ? qmm_f32_to_f16(s) : qmm_f32_to_bf16(s);
                    biases16[at] = dtype == QMM_F16 ? qmm_f32_to_f16(b) : qmm_f32_to_bf16(b);
                }
            }
        qmm_qmatrix m = {w, dtype == QMM_F32 ? (void *)scales32 : (void *)scales16,
                         dtype == QMM_F32 ? (void *)biases32 : (void *)biases16, dtype, E * N, K, 4, 32};
        float x32[T * K] = {0};
        x32[0] = INFINITY;
        x32[K + 0] = x32[K + 1] = 2e38f;
        uint16_t x16[T * K];
        for (size_t i = 0; i < T * K; i++) x16[i] = dtype == QMM_F16 ? qmm_f32_to_f16(x32[i]) : qmm_f32_to_bf16(x32[i]);
        qmm_weights *experts = NULL;
        qmm_buffer *xb = NULL, *ob = NULL;
        CHECK_OK(qmm_weights_create_experts(context, &m, E, &experts));
        CHECK_OK(qmm_buffer_create(context, dtype, T * K, &xb));
        CHECK_OK(qmm_buffer_create(context, dtype, B * N, &ob));
        if (experts && xb && ob) {
            CHECK_OK(qmm_buffer_write(xb, dtype == QMM_F32 ? (void *)x32 : (void *)x16, T * K));
            for (int how_run = 0; how_run < 4; how_run++) { /* per block, grouped, m64n64 tiles, wgmma tiles */
                const int grouped = how_run > 0;
                if ((grouped && dtype == QMM_F32) || (how_run == 3 && !hopper)) continue; /* f32: a launch per block */
                setenv("QMM_CUDA_GATHER_GROUPED", grouped ? "1" : "0", 1);
                if (how_run >= 2) {
                    setenv("QMM_CUDA_GATHER_TILES", how_run == 2 ? "mma" : "wgmma", 1);
                    setenv("QMM_CUDA_GATHER_CHUNK_ROWS", "16", 1); /* none cut */
                }
                CHECK_OK(qmm_buffer_poison(ob));
                qmm_gather_options options = {.sorted_indices = 1};
                CHECK_OK(qmm_gather_matmul(context, experts, xb, T, lhs, rhs, B, ob, &options, NULL));
                unsetenv("QMM_CUDA_GATHER_GROUPED");
                unsetenv("QMM_CUDA_GATHER_TILES");
                unsetenv("QMM_CUDA_GATHER_CHUNK_ROWS");
                float out[B * N];
                if (dtype == QMM_F32) {
                    CHECK_OK(qmm_buffer_read(ob, out, B * N));
                } else {
                    uint16_t out16[B * N];
                    CHECK_OK(qmm_buffer_read(ob, out16, B * N));
                    for (size_t i = 0; i < B * N; i++)
                        out[i] = dtype == QMM_F16 ? qmm_f16_to_f32(out16[i]) : qmm_bf16_to_f32(out16[i]);
                }
                for (size_t i = 0; i < B; i++)
                    for (size_t n = 0; n < N; n++) {
                        const bool half = rhs[i] == 1 ? n >= 8 : n < 8;
                        const float v = out[i * N + n];
                        const char *how = how_run == 0   ? "a launch per block"
                                          : how_run == 1 ? "grouped"
                                          : how_run == 2 ? "m64n64 tiles"
                                                         : "wgmma tiles";
                        if (lhs[i] == 0 && half)
                            CHECK(isinf(v) && v > 0, "gather non-finite %s %s: expert %u row %zu, inf·0.5 gave %g",
                                  qmm_dtype_name(dtype), how, rhs[i], n, v);
                        if (lhs[i] == 0 && !half)
                            CHECK(isnan(v), "gather non-finite %s %s: expert %u row %zu, inf·0 gave %g",
                                  qmm_dtype_name(dtype), how, rhs[i], n, v);
                        if (lhs[i] == 1 && !half && dtype != QMM_F16)
                            CHECK(v == 0.0f, "gather non-finite %s %s: expert %u row %zu, 2e38·0 gave %g, exact 0",
                                  qmm_dtype_name(dtype), how, rhs[i], n, v);
                    }
            }
        }
        qmm_weights_destroy(experts);
        qmm_buffer_destroy(xb);
        qmm_buffer_destroy(ob);
    }
}

static void test_errors(qmm_context *context, check_rng *rng) {
    qmm_context *other = NULL;
    CHECK_STATUS(qmm_context_create(QMM_BACKEND_CUDA, 1000, &other), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(qmm_last_error(), "device=1000") != NULL, "message names the device: %s", qmm_last_error());
    product p;
    if (product_make(context, rng, 2, 64, 128, 4, 64, QMM_F32, "errors: forced f32", &p)) {
        qmm_matmul_options forced = {.op = QMM_OP_QMM_T, .kernel = "cuda.qmm_t.mma_gemv.m8n16"};
        CHECK_STATUS(qmm_matmul(context, p.weights, p.x, p.M, p.out, &forced, NULL), QMM_ERR_UNSUPPORTED);
        CHECK(strstr(qmm_last_error(), "dtype f32") != NULL, "forced f32 on mma: %s", qmm_last_error());
        qmm_matmul_options ref = {.op = QMM_OP_QMM_T, .kernel = "ref.qmm_t.scalar.r1"};
        CHECK_STATUS(qmm_matmul(context, p.weights, p.x, p.M, p.out, &ref, NULL), QMM_ERR_NOT_FOUND);
    }
    product_free(&p);
    /* The reference gather rows are not in a CUDA table (host memory): forcing one is NOT_FOUND. */
    if (product_make(context, rng, 2, 64, 128, 4, 64, QMM_F16, "errors: forced gather", &p)) {
        qmm_weights *experts = NULL;
        const uint32_t rhs[2] = {0, 1};
        CHECK_OK(qmm_weights_create_experts(context, &p.q.m, 2, &experts));
        qmm_gather_options forced = {.kernel = "ref.gather.blocks.r1"};
        CHECK_STATUS(qmm_gather_matmul(context, experts, p.x, p.M, NULL, rhs, 2, p.out, &forced, NULL),
                     QMM_ERR_NOT_FOUND);
        qmm_weights_destroy(experts);
    }
    product_free(&p);
    if (product_make(context, rng, 65, 64, 128, 4, 64, QMM_F16, "errors: M = 65", &p)) { /* the 16-token tiles take M ≤ 64 in chunks */
        qmm_matmul_options forced = {.op = QMM_OP_QMM_T, .kernel = "cuda.qmm_t.mma_gemv.m16n32"};
        CHECK_STATUS(qmm_matmul(context, p.weights, p.x, p.M, p.out, &forced, NULL), QMM_ERR_UNSUPPORTED);
        CHECK(strstr(qmm_last_error(), "M=65 exceeds this row's 64 rows of x") != NULL, "forced M=65 on a 16-row tile: %s",
              qmm_last_error());
    }
    product_free(&p);
    /* The backend's knobs (environment variables, cuda_backend.c): a value outside a knob's rule is an error naming the
     * knob, the value and the rule — at context creation for the context's knobs, at the call for the calls' (the
     * output untouched: nothing launched) — and an empty value is the same as none. */
    {
        static const struct {
            const char *name, *value, *rule;
        } bad_context[] = {{"QMM_CUDA_WARPS", "0", "1–16"}, {"QMM_CUDA_WARPS", "8x", "1–16"},
                           {"QMM_CUDA_PDL", "off", "0, 1"}, {"QMM_CUDA_GEMV_WARPS_MODEL", "2", "0, 1"}};
        for (size_t i = 0; i < sizeof bad_context / sizeof bad_context[0]; i++) {
            qmm_context *knobbed = NULL;
            setenv(bad_context[i].name, bad_context[i].value, 1);
            CHECK_STATUS(qmm_context_create(QMM_BACKEND_CUDA, 0, &knobbed), QMM_ERR_INVALID_ARGUMENT);
            char want[96];
            snprintf(want, sizeof want, "%s=%s is not", bad_context[i].name, bad_context[i].value);
            CHECK(strstr(qmm_last_error(), want) && strstr(qmm_last_error(), bad_context[i].rule) && knobbed == NULL,
                  "%s=%s at context creation: %s", bad_context[i].name, bad_context[i].value, qmm_last_error());
            unsetenv(bad_context[i].name);
            qmm_context_destroy(knobbed);
        }
        setenv("QMM_CUDA_WARPS", "", 1); /* empty: the launcher's rule */
        CHECK_OK(qmm_context_create(QMM_BACKEND_CUDA, 0, &other));
        unsetenv("QMM_CUDA_WARPS");
        qmm_context_destroy(other);
        other = NULL;
    }
    if (product_make(context, rng, 40, 512, 1024, 4, 64, QMM_BF16, "errors: knobs", &p)) {
        static const struct {
            const char *name, *value, *rule, *row; /* row: forced (NULL: the selector's) */
        } bad_call[] = {{"QMM_CUDA_SPLITS", "0", "1–16", NULL},
                        {"QMM_CUDA_SPLITS", "17", "1–16", "cuda.qmm_t.mma_tile.m64n64"},
                        {"QMM_CUDA_SPLITS", "two", "1–16", "cuda.qmm_t.generic.m8n256"},
                        {"QMM_CUDA_GEMV_STAGED_X", "yes", "0, 1", "cuda.qmm_t.mma_gemv.m8n64"},
                        {"QMM_CUDA_M16N64_ONE_GRID", "-1", "0, 1", "cuda.qmm_t.mma_gemv.m16n64"},
                        {"QMM_CUDA_WGMMA_CLUSTER", "always", "0, 1, require", NULL},
                        {"QMM_CUDA_WGMMA_LAST_WAVE", "off", "0, 1", NULL},
                        {"QMM_CUDA_WGMMA32_BLOCKS", "3", "1, 2", NULL},
                        {"QMM_CUDA_INVARIANT_SLOTS", "none", "0, 1", NULL},
                        {"QMM_CUDA_INVARIANT_PATH", "sideways", "split, virtual, last, blocks", NULL},
                        {"QMM_CUDA_GATHER_GROUPED", "2", "0, 1", "cuda.qmm_t.mma_gemv.m16n32"},
                        {"QMM_CUDA_GATHER_CHUNK_ROWS", "15", "16–1073741824", NULL},
                        {"QMM_CUDA_GATHER_TILES", "2", "0, 1, mma, wgmma", NULL},
                        {"QMM_CUDA_GATHER_WGMMA_BLOCKS", "0", "1–65535", NULL},
                        {"QMM_CUDA_GATHER_WGMMA_TOKENS", "128", "32, 64", NULL}};
        CHECK_OK(qmm_buffer_poison(p.out)); /* once: every refusal below must leave it so */
        for (size_t i = 0; i < sizeof bad_call / sizeof bad_call[0]; i++) {
            const size_t M = bad_call[i].row && strstr(bad_call[i].row, ".m8n") ? 8 : p.M; /* m8n64 takes M ≤ 8 */
            qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = bad_call[i].row};
            setenv(bad_call[i].name, bad_call[i].value, 1);
            CHECK_STATUS(qmm_matmul(context, p.weights, p.x, M, p.out, &options, NULL), QMM_ERR_INVALID_ARGUMENT);
            char want[96];
            snprintf(want, sizeof want, "%s=%s is not", bad_call[i].name, bad_call[i].value);
            CHECK(strstr(qmm_last_error(), want) && strstr(qmm_last_error(), bad_call[i].rule), "%s=%s (%s): %s",
                  bad_call[i].name, bad_call[i].value, bad_call[i].row ? bad_call[i].row : "the selector's row",
                  qmm_last_error());
            unsetenv(bad_call[i].name);
        }
        /* every kind of row checks before it launches: the wgmma rows (Hopper), batch-invariant mode, the other tiles,
         * qmm_n (x [M, 512] through these 512 × 1024 weights, out [M, 1024]: within p's buffers) */
        static const struct {
            const char *row;
            qmm_op op;
            size_t M;
            int batch_invariant;
        } kinds[] = {{"cuda.qmm_t.wgmma_tile.m64n128", QMM_OP_QMM_T, 40, 0},
                     {"cuda.qmm_t.wgmma_tile_fma.m128n128", QMM_OP_QMM_T, 40, 0},
                     {NULL, QMM_OP_QMM_T, 40, 1},
                     {"cuda.qmm_t.mma_tile.m16n256", QMM_OP_QMM_T, 16, 0},
                     {"cuda.qmm_t.mma_gemv.m32n16", QMM_OP_QMM_T, 40, 0},
                     {"cuda.qmm_n.mma_tile_n.m8n128", QMM_OP_QMM_N, 16, 0},
                     {"cuda.qmm_n.generic.m8n256", QMM_OP_QMM_N, 16, 0}};
        setenv("QMM_CUDA_SPLITS", "0", 1);
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            if (kinds[i].row &&
                qmm_kernel_supports(context, kinds[i].row, p.weights, kinds[i].M, kinds[i].op, NULL) != 1)
                continue; /* the wgmma rows off Hopper */
            const qmm_matmul_options options = {.op = kinds[i].op, .kernel = kinds[i].row,
                                                .batch_invariant = kinds[i].batch_invariant};
            CHECK_STATUS(qmm_matmul(context, p.weights, p.x, kinds[i].M, p.out, &options, NULL), QMM_ERR_INVALID_ARGUMENT);
            CHECK(strstr(qmm_last_error(), "QMM_CUDA_SPLITS=0 is not a whole number in 1–16") != NULL, "%s%s: %s",
                  kinds[i].row ? kinds[i].row : "the selector's row", kinds[i].batch_invariant ? " (batch-invariant)" : "",
                  qmm_last_error());
        }
        /* the gather's knob, at a gather call */
        qmm_weights *experts = NULL;
        const uint32_t rhs[2] = {0, 1};
        CHECK_OK(qmm_weights_create_experts(context, &p.q.m, 2, &experts));
        CHECK_STATUS(qmm_gather_matmul(context, experts, p.x, 2, NULL, rhs, 2, p.out, NULL, NULL),
                     QMM_ERR_INVALID_ARGUMENT); /* QMM_CUDA_SPLITS=0 still set */
        unsetenv("QMM_CUDA_SPLITS");
        setenv("QMM_CUDA_GATHER_GROUPED", "yes", 1);
        CHECK_STATUS(qmm_gather_matmul(context, experts, p.x, 2, NULL, rhs, 2, p.out, NULL, NULL),
                     QMM_ERR_INVALID_ARGUMENT);
        CHECK(strstr(qmm_last_error(), "QMM_CUDA_GATHER_GROUPED=yes is not one of 0, 1") != NULL, "gather knob: %s",
              qmm_last_error());
        unsetenv("QMM_CUDA_GATHER_GROUPED");
        setenv("QMM_CUDA_GATHER_CHUNK_ROWS", "8", 1);
        CHECK_STATUS(qmm_gather_matmul(context, experts, p.x, 2, NULL, rhs, 2, p.out, NULL, NULL),
                     QMM_ERR_INVALID_ARGUMENT);
        CHECK(strstr(qmm_last_error(), "QMM_CUDA_GATHER_CHUNK_ROWS=8 is not a whole number in 16–1073741824") != NULL,
              "gather knob: %s", qmm_last_error());
        unsetenv("QMM_CUDA_GATHER_CHUNK_ROWS");
        qmm_weights_destroy(experts);
        check_still_poisoned(context, p.out, "errors: knobs (bf16)");
        /* an empty value is no value: the call runs, and matches the oracle */
        setenv("QMM_CUDA_SPLITS", "", 1);
        CHECK_OK(qmm_buffer_poison(p.out));
        CHECK_OK(qmm_matmul(context, p.weights, p.x, p.M, p.out, NULL, NULL));
        unsetenv("QMM_CUDA_SPLITS");
        product_check(&p, "errors: knobs, QMM_CUDA_SPLITS empty", 2.0);
    }
    product_free(&p);
    if (product_make(context, rng, 8, 64, 128, 4, 64, QMM_F32, "errors: knobs (f32)", &p)) { /* the f32 rows */
        static const struct {
            const char *row;
            size_t M;
        } f32_rows[] = {{"cuda.qmm_t.ffma_gemv.m8n16", 2}, {"cuda.qmm_t.mma_tile_bf16x3.m32n128", 8},
                        {"cuda.qmm_t.generic.m8n256", 2}};
        CHECK_OK(qmm_buffer_poison(p.out));
        setenv("QMM_CUDA_WGMMA_LAST_WAVE", "no", 1);
        size_t ran = 0;
        for (size_t i = 0; i < sizeof f32_rows / sizeof f32_rows[0]; i++) {
            if (qmm_kernel_supports(context, f32_rows[i].row, p.weights, f32_rows[i].M, QMM_OP_QMM_T, NULL) != 1) continue;
            ran++;
            const qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = f32_rows[i].row};
            CHECK_STATUS(qmm_matmul(context, p.weights, p.x, f32_rows[i].M, p.out, &options, NULL),
                         QMM_ERR_INVALID_ARGUMENT);
            CHECK(strstr(qmm_last_error(), "QMM_CUDA_WGMMA_LAST_WAVE=no is not one of 0, 1") != NULL, "%s: %s",
                  f32_rows[i].row, qmm_last_error());
        }
        unsetenv("QMM_CUDA_WGMMA_LAST_WAVE");
        CHECK(ran == sizeof f32_rows / sizeof f32_rows[0], "errors: knobs (f32): %zu of the 3 f32 rows took the call", ran);
        check_still_poisoned(context, p.out, "errors: knobs (f32)");
    }
    product_free(&p);
    /* m16n64's grid.y holds 65535 row tiles of 64: N = 4194241 is refused with the rule, and the selector goes on to
     * another row at M = 20 (in its box otherwise). Weights only (K = 32: 64 MiB of codes), no product. */
    check_qmatrix big;
    if (check_qmatrix_random(rng, (size_t)65535 * 64 + 1, 32, 4, 32, QMM_F16, &big)) {
        qmm_weights *weights = NULL;
        CHECK_OK(qmm_weights_create(context, &big.m, &weights));
        const char *why = NULL;
        CHECK(qmm_kernel_supports(context, "cuda.qmm_t.mma_gemv.m16n64", weights, 20, QMM_OP_QMM_T, &why) == 0,
              "m16n64 at N = 4194241");
        CHECK(why && strstr(why, "N=4194241 exceeds this row's 4194240 rows of weights") != NULL, "m16n64 at N = 4194241: %s",
              why ? why : "(no reason)");
        qmm_kernel_info chosen = {0};
        CHECK_OK(qmm_select(context, weights, 20, NULL, &chosen));
        CHECK(chosen.name && strcmp(chosen.name, "cuda.qmm_t.mma_gemv.m16n64") != 0, "N = 4194241 M = 20: chose %s",
              chosen.name ? chosen.name : "?");
        qmm_weights_destroy(weights);
    } else {
        CHECK(false, "N = 4194241: set-up failed");
    }
    check_qmatrix_free(&big);
}

/* x·Ŵ (qmm_n) on the tensor cores: the selector takes mma_tile_n (m8n128 up to M = 16, m32n64 beyond) for f16/bf16
 * 4/8-bit, against the oracle with outputs poisoned (K = 7 and 333: x rows not 16-byte aligned, element-wise
 * copies; K past a stage of 64; N over several blocks and a partial last block of either tile; split-K as the
 * launcher picks it, twice with the same bits, and 3 splits forced where K has ≥ 12 stages; x with +inf and huge
 * values, through split-K, where the non-finite rule finishes the outputs in the last split; tiny bf16 x, ~1e-37),
 * and in batch-invariant mode (one split) a row alone (m8n128) and inside M = 17–130 (m32n64) give the same bits. */
static void test_qmm_n(qmm_context *context, check_rng *rng) {
    enum { PLAIN, SPECIAL, TINY }; /* x uniform in [-1, 1); with +inf and huge values in rows 0 and 1; times 1e-37 */
    static const struct {
        size_t M, K, N;
        int bits, group_size;
        qmm_dtype dtype;
        int x;
    } cases[] = {
        {1, 4096, 4096, 4, 64, QMM_F16, PLAIN},   {37, 333, 1024, 4, 32, QMM_BF16, PLAIN},
        {130, 1000, 576, 8, 32, QMM_BF16, PLAIN}, {5, 7, 128, 8, 128, QMM_F16, PLAIN},
        {64, 256, 4128, 4, 32, QMM_BF16, PLAIN},  {33, 2048, 768, 8, 64, QMM_F16, PLAIN},
        {9, 1024, 4160, 4, 64, QMM_F16, SPECIAL}, {17, 1024, 4128, 8, 32, QMM_BF16, SPECIAL},
        {3, 1024, 640, 4, 128, QMM_BF16, TINY},   {20, 768, 1024, 8, 64, QMM_BF16, TINY},
        /* 2/3/5/6-bit codes, stored as 4/8-bit (test_stored_bits): the same rows */
        {1, 1024, 640, 3, 64, QMM_F16, PLAIN},    {40, 1000, 576, 3, 32, QMM_BF16, PLAIN},
        {5, 256, 1024, 2, 128, QMM_F16, PLAIN},   {20, 768, 640, 6, 64, QMM_BF16, PLAIN},
        {1, 512, 1280, 5, 32, QMM_F16, PLAIN},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const size_t M = cases[c].M, K = cases[c].K, N = cases[c].N, size = qmm_dtype_size(cases[c].dtype);
        check_qmatrix q = {0};
        qmm_weights *weights = NULL;
        qmm_buffer *xb = NULL, *ob = NULL, *x1 = NULL, *o1 = NULL;
        void *x = malloc(M * K * size), *out = malloc(M * N * size), *alone = malloc(N * size);
        double *exact = malloc(M * N * sizeof *exact), *abs_dot = malloc(M * N * sizeof *abs_dot);
        if (!check_qmatrix_random(rng, K, N, cases[c].bits, cases[c].group_size, cases[c].dtype, &q) || !x || !out ||
            !alone || !exact || !abs_dot) {
            CHECK(false, "qmm_n: set-up failed");
            goto next;
        }
        check_fill_uniform(rng, x, cases[c].dtype, M * K, -1.0f, 1.0f);
        for (size_t i = 0; i < M * K; i++) {
            const float v = qmm_load_f32(x, cases[c].dtype, i);
            if (cases[c].x == TINY) qmm_store_f32(x, cases[c].dtype, i, v * 1e-37f);
            if (cases[c].x == SPECIAL && i == 3) qmm_store_f32(x, cases[c].dtype, i, INFINITY); /* row 0 */
            if (cases[c].x == SPECIAL && i >= K && i < K + 8) /* row 1: f16's largest, bf16's 1e30 */
                qmm_store_f32(x, cases[c].dtype, i, (i % 2 ? -1.0f : 1.0f) * (cases[c].dtype == QMM_F16 ? 65504.0f : 1e30f));
        }
        CHECK_OK(qmm_ref_dense_f64(&q.m, x, M, 0, exact, abs_dot));
        CHECK_OK(qmm_weights_create(context, &q.m, &weights));
        CHECK_OK(qmm_buffer_create(context, cases[c].dtype, M * K, &xb));
        CHECK_OK(qmm_buffer_create(context, cases[c].dtype, M * N, &ob));
        CHECK_OK(qmm_buffer_create(context, cases[c].dtype, K, &x1));
        CHECK_OK(qmm_buffer_create(context, cases[c].dtype, N, &o1));
        if (!weights || !xb || !ob || !x1 || !o1) goto next;
        CHECK_OK(qmm_buffer_write(xb, x, M * K));
        for (int invariant = 0; invariant < 2; invariant++) {
            qmm_matmul_options options = {.op = QMM_OP_QMM_N, .batch_invariant = invariant};
            qmm_kernel_info info = {0};
            char label[200];
            snprintf(label, sizeof label, "qmm_n M=%zu K=%zu N=%zu %d-bit gs%d %s%s%s", M, K, N, cases[c].bits,
                     cases[c].group_size, qmm_dtype_name(cases[c].dtype),
                     cases[c].x == SPECIAL ? " inf/huge x" : cases[c].x == TINY ? " tiny x" : "",
                     invariant ? " batch-invariant" : "");
            CHECK_OK(qmm_buffer_poison(ob));
            CHECK_OK(qmm_matmul(context, weights, xb, M, ob, &options, &info));
            const char *want = M <= 16 ? "cuda.qmm_n.mma_tile_n.m8n128" : "cuda.qmm_n.mma_tile_n.m32n64";
            if (cases[c].x == PLAIN && !invariant) CHECK(qmm_kernel_supports(context, want, weights, M, QMM_OP_QMM_N, NULL) == 1,
                                                         "%s: %s refuses", label, want);
            CHECK(info.name && strcmp(info.name, want) == 0, "%s ran %s, not %s", label, info.name ? info.name : "?",
                  want);
            CHECK_OK(qmm_buffer_read(ob, out, M * N));
            double worst = 0;
            size_t bad = check_against_oracle(label, out, cases[c].dtype, exact, abs_dot, M * N, K, 2.0, &worst);
            CHECK(bad == 0, "%s: %zu outputs outside the bound (worst %.3g)", label, bad, worst);
            if (!invariant) {
                /* split-K where the tiles are few: the same bits on a second run (the partials are added in split
                 * order), and with 3 splits forced against the oracle */
                void *again = malloc(M * N * size);
                CHECK_OK(qmm_buffer_poison(ob));
                CHECK_OK(qmm_matmul(context, weights, xb, M, ob, &options, NULL));
                if (again) CHECK_OK(qmm_buffer_read(ob, again, M * N));
                CHECK(again && memcmp(again, out, M * N * size) == 0, "%s: a second run differs", label);
                free(again);
                setenv("QMM_CUDA_SPLITS", "3", 1);
                CHECK_OK(qmm_buffer_poison(ob));
                CHECK_OK(qmm_matmul(context, weights, xb, M, ob, &options, NULL));
                unsetenv("QMM_CUDA_SPLITS");
                CHECK_OK(qmm_buffer_read(ob, out, M * N));
                bad = check_against_oracle(label, out, cases[c].dtype, exact, abs_dot, M * N, K, 2.0, &worst);
                CHECK(bad == 0, "%s, 3 splits: %zu outputs outside the bound (worst %.3g)", label, bad, worst);
                continue;
            }
            /* the last row and row 0 alone, the same bits as inside M */
            const size_t rows[] = {0, M - 1};
            for (size_t r = 0; r < 2; r++) {
                CHECK_OK(qmm_buffer_write(x1, (const char *)x + rows[r] * K * size, K));
                CHECK_OK(qmm_buffer_poison(o1));
                CHECK_OK(qmm_matmul(context, weights, x1, 1, o1, &options, NULL));
                CHECK_OK(qmm_buffer_read(o1, alone, N));
                /* NaN outputs (inf·0 in the non-finite rows) compare as bits too: the same rule gives the same NaN */
                CHECK(memcmp(alone, (const char *)out + rows[r] * N * size, N * size) == 0,
                      "%s: row %zu alone differs from the row inside M=%zu", label, rows[r], M);
            }
        }
    next:
        qmm_weights_destroy(weights);
        qmm_buffer_destroy(xb);
        qmm_buffer_destroy(ob);
        qmm_buffer_destroy(x1);
        qmm_buffer_destroy(o1);
        check_qmatrix_free(&q);
        free(x), free(out), free(alone), free(exact), free(abs_dot);
    }
}

/* The wgmma _fma rows declare the mma_tile rows' batch-invariant order: with one split (QMM_CUDA_SPLITS=1, as in
 * that order's mode on devices without wgmma — on Hopper the default wgmma rows set the mode's order), the same bits
 * as mma_tile.m64n64 for every output, at both bit widths, every group size, f16 and bf16, with M spanning several
 * tiles of tokens and N and K not multiples of the tiles; and within the bound. Hopper only. */
static void test_wgmma_tile_order(qmm_context *context, check_rng *rng) {
    static const struct {
        int bits, group_size;
        qmm_dtype dtype;
    } cases[] = {{4, 64, QMM_F16}, {4, 32, QMM_BF16}, {4, 128, QMM_F16}, {8, 32, QMM_F16}, {8, 64, QMM_BF16},
                 {8, 128, QMM_BF16}};
    static const char *rows[] = {"cuda.qmm_t.wgmma_tile_fma.m128n128", "cuda.qmm_t.wgmma_tile_fma.m64n128"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        product p;
        if (!product_make(context, rng, 200, 300, 1152, cases[c].bits, cases[c].group_size, cases[c].dtype, "wgmma order", &p))
            continue;
        const size_t bytes = p.M * p.N * qmm_dtype_size(p.dtype);
        void *ref = malloc(bytes);
        qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = "cuda.qmm_t.mma_tile.m64n64"};
        setenv("QMM_CUDA_SPLITS", "1", 1);
        CHECK_OK(qmm_buffer_poison(p.out));
        CHECK_OK(qmm_matmul(context, p.weights, p.x, p.M, p.out, &options, NULL));
        CHECK_OK(qmm_buffer_read(p.out, p.host_out, p.M * p.N));
        if (ref) memcpy(ref, p.host_out, bytes);
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            if (qmm_kernel_supports(context, rows[r], p.weights, p.M, QMM_OP_QMM_T, NULL) != 1) continue;
            options.kernel = rows[r];
            CHECK_OK(qmm_buffer_poison(p.out));
            CHECK_OK(qmm_matmul(context, p.weights, p.x, p.M, p.out, &options, NULL));
            char label[200];
            snprintf(label, sizeof label, "%s one split %d-bit gs%d %s", rows[r], cases[c].bits,
                     cases[c].group_size, qmm_dtype_name(p.dtype));
            product_check(&p, label, 2.0);
            CHECK(ref && memcmp(ref, p.host_out, bytes) == 0, "%s: not the bits of mma_tile.m64n64", label);
        }
        unsetenv("QMM_CUDA_SPLITS");
        free(ref);
        product_free(&p);
    }
}

/* The default wgmma rows prepare x once per call in a context workspace, grown outside stream captures (a chain's step
 * reserves it when recorded); a buffer it outgrows is kept until the context closes, since a captured graph may hold
 * it. In a fresh context: a chain recorded and run (captured with the workspace), a larger call that grows it, the
 * chain replayed (under memcheck: no read of freed memory), a chain recorded after the growth — each output against
 * the oracle, outputs poisoned first. Hopper only. */
static void test_wgmma_prepared(qmm_context *unused, check_rng *rng) {
    (void)unused;
    static const char *rows[] = {"cuda.qmm_t.wgmma_tile.m128n128", "cuda.qmm_t.wgmma_tile.m64n128"};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        qmm_context *context = NULL;
        CHECK_OK(qmm_context_create(QMM_BACKEND_CUDA, 0, &context));
        if (!context) return;
        product small, large = {0};
        if (!product_make(context, rng, 200, 300, 1152, 4, 64, QMM_F16, "wgmma prepared (small)", &small)) {
            qmm_context_destroy(context);
            return;
        }
        if (qmm_kernel_supports(context, rows[r], small.weights, small.M, QMM_OP_QMM_T, NULL) != 1) {
            product_free(&small); /* not a Hopper device */
            qmm_context_destroy(context);
            return;
        }
        if (!product_make(context, rng, 333, 520, 2048, 8, 32, QMM_BF16, "wgmma prepared (large)", &large)) {
            product_free(&small);
            qmm_context_destroy(context);
            return;
        }
        const qmm_matmul_options options = {.op = QMM_OP_QMM_T, .kernel = rows[r]};
        char label[200];
        qmm_chain *first = NULL, *after = NULL;
        CHECK_OK(qmm_chain_create(context, &first));
        CHECK_OK(qmm_chain_add_matmul(first, small.weights, small.x, small.M, small.out, &options)); /* reserves */
        CHECK_OK(qmm_buffer_poison(small.out));
        CHECK_OK(qmm_chain_run(first)); /* captured with the workspace's pointers */
        snprintf(label, sizeof label, "%s chain captured with the first workspace", rows[r]);
        product_check(&small, label, 2.0);
        CHECK_OK(qmm_buffer_poison(large.out));
        CHECK_OK(qmm_matmul(context, large.weights, large.x, large.M, large.out, &options, NULL)); /* grows it */
        snprintf(label, sizeof label, "%s call that grows the workspace", rows[r]);
        product_check(&large, label, 2.0);
        CHECK_OK(qmm_buffer_poison(small.out));
        CHECK_OK(qmm_chain_run(first)); /* the graph still reads the first buffer */
        snprintf(label, sizeof label, "%s chain replayed after the workspace grew", rows[r]);
        product_check(&small, label, 2.0);
        CHECK_OK(qmm_chain_create(context, &after));
        CHECK_OK(qmm_chain_add_matmul(after, large.weights, large.x, large.M, large.out, &options));
        CHECK_OK(qmm_chain_add_matmul(after, small.weights, small.x, small.M, small.out, &options));
        CHECK_OK(qmm_buffer_poison(small.out));
        CHECK_OK(qmm_buffer_poison(large.out));
        CHECK_OK(qmm_chain_run(after));
        snprintf(label, sizeof label, "%s chain recorded after the growth, step 0", rows[r]);
        product_check(&large, label, 2.0);
        snprintf(label, sizeof label, "%s chain recorded after the growth, step 1", rows[r]);
        product_check(&small, label, 2.0);
        qmm_chain_destroy(first);
        qmm_chain_destroy(after);
        product_free(&small);
        product_free(&large);
        qmm_context_destroy(context);
    }
}

/* The batch-invariant order a row of the context's table declares (NULL: none, or no such row). */
static const char *row_order(qmm_context *context, const char *name) {
    for (size_t i = 0; i < qmm_kernel_count(context); i++) {
        qmm_kernel_info info;
        if (qmm_kernel_get(context, i, &info) == QMM_OK && strcmp(info.name, name) == 0) return info.batch_invariant_order;
    }
    return NULL;
}

/* Whether `status` is batch-invariant mode's refusal of a forced QMM_CUDA_INVARIANT_PATH `path` that this call cannot
 * take, with the numbers in its message bearing the rule out — "(M=…: T tiles of … tokens on S SMs, P splits): why":
 * `last` refused for T ≤ S (one wave) or T a multiple of S (no partial wave), `blocks` for P < 3. Which of them holds
 * depends on the device's SM count and so the split count (a 78-SM part gives 2 splits at N = 1000, K = 2048, the
 * H200's 132 give 4), so a test accepts the refusal exactly where the numbers say the way cannot run. (`last` also
 * needs room for its rest's splits; the test's products always have it, so that refusal is not accepted.) */
static bool forced_path_refused(qmm_status status, const char *path) {
    if (status != QMM_ERR_UNSUPPORTED) return false;
    const char *message = qmm_last_error(), *numbers = strstr(message, "(M=");
    char want[80];
    snprintf(want, sizeof want, "QMM_CUDA_INVARIANT_PATH=%s cannot run", path);
    size_t m, tiles, sms;
    int tokens, splits;
    if (!strstr(message, want) || !numbers ||
        sscanf(numbers, "(M=%zu: %zu tiles of %d tokens on %zu SMs, %d splits)", &m, &tiles, &tokens, &sms, &splits) != 5 ||
        sms == 0)
        return false;
    if (strcmp(path, "last") == 0)
        return (tiles <= sms && strstr(message, "fit in one wave")) ||
               (tiles > sms && tiles % sms == 0 && strstr(message, "fill whole waves"));
    return strcmp(path, "blocks") == 0 && splits < 3 && strstr(message, "need 3 splits or more");
}

/* Batch-invariant mode on the public API: f16 4-bit gs64, N = 1000, K = 2048 — the mode's rows are, on Hopper, the
 * default wgmma rows (order "wgmma-prep-fixed-splits": K in the same 4 splits at every M on 132 SMs — split blocks at
 * M ≤ 512, virtual splits at 2048 by the model), elsewhere the
 * tile rows (order "tc-segment-fma", one split: mma_tile); the mma_gemv rows declare no order. A row alone and inside
 * M = 2, 37, 512, 1024, 2048, through the selector and through each row of the order forced (a tile row of the other order
 * refused), on Hopper also with the splits through the split-K workspace in chunks of M instead of clusters
 * (QMM_CUDA_WGMMA_CLUSTER=0) and with each way of running the splits forced (QMM_CUDA_INVARIANT_PATH: split blocks,
 * virtual splits, the whole waves virtual and the rest split, blocks of virtual ranges): the same bits. */
static void test_batch_invariant(qmm_context *context, check_rng *rng) {
    enum { N = 1000, K = 2048, ROWS = 2048 };
    static const size_t ms[] = {1, 2, 37, 512, 1024, 2048};
    static const struct {
        const char *row;     /* NULL: the selector's choice */
        const char *cluster; /* QMM_CUDA_WGMMA_CLUSTER for the calls (Hopper only) */
        const char *path;    /* QMM_CUDA_INVARIANT_PATH for the calls (Hopper only) */
    } runs[] = {{NULL, NULL, NULL},
                {"cuda.qmm_t.mma_tile.m64n64", NULL, NULL},
                {"cuda.qmm_t.mma_tile.m64n128", NULL, NULL},
                {"cuda.qmm_t.mma_tile.m16n256", NULL, NULL},
                {"cuda.qmm_t.mma_tile.m32n256", NULL, NULL},
                {"cuda.qmm_t.wgmma_tile_fma.m128n128", NULL, NULL},
                {"cuda.qmm_t.wgmma_tile_fma.m64n128", NULL, NULL},
                {"cuda.qmm_t.wgmma_tile.m128n128", NULL, NULL},
                {"cuda.qmm_t.wgmma_tile.m64n128", NULL, NULL},
                {NULL, "0", NULL},
                {"cuda.qmm_t.wgmma_tile.m128n128", "0", NULL},
                {"cuda.qmm_t.wgmma_tile.m64n128", "0", NULL},
                {"cuda.qmm_t.wgmma_tile.m128n128", NULL, "split"},
                {"cuda.qmm_t.wgmma_tile.m128n128", NULL, "virtual"},
                {"cuda.qmm_t.wgmma_tile.m64n128", NULL, "virtual"},
                {"cuda.qmm_t.wgmma_tile.m64n128", NULL, "last"}, /* 256 tiles at M = 2048: 132 virtual, 124 split */
                {"cuda.qmm_t.wgmma_tile.m64n128", "0", "last"},
                {"cuda.qmm_t.wgmma_tile.m128n128", NULL, "blocks"}, /* 2 blocks a tile, 2 ranges each */
                {"cuda.qmm_t.wgmma_tile.m64n128", NULL, "blocks"},
                {"cuda.qmm_t.wgmma_tile.m128n128", "0", "split"}}; /* M = 2048: the workspace in chunks of M */
    product p;
    if (!product_make(context, rng, ROWS, N, K, 4, 64, QMM_F16, "batch-invariant", &p)) return;
    const bool hopper =
        qmm_kernel_supports(context, "cuda.qmm_t.wgmma_tile.m128n128", p.weights, 1, QMM_OP_QMM_T, NULL) == 1;
    const char *want_order = hopper ? "wgmma-prep-fixed-splits" : "tc-segment-fma";
    uint16_t *alone = malloc((size_t)ROWS * N * sizeof *alone), *got = malloc((size_t)ROWS * N * sizeof *got);
    qmm_buffer *x_row = NULL, *out_row = NULL;
    CHECK_OK(qmm_buffer_create(context, QMM_F16, K, &x_row));
    CHECK_OK(qmm_buffer_create(context, QMM_F16, N, &out_row));
    qmm_matmul_options options = {.op = QMM_OP_QMM_T, .batch_invariant = 1};
    qmm_kernel_info info;
    if (!alone || !got || !x_row || !out_row) goto cleanup;
    /* Sampled rows alone. */
    static const size_t rows[] = {0, 1, 7, 8, 36, 63, 64, 255, 511, 2047};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        CHECK_OK(qmm_buffer_write(x_row, (const uint16_t *)p.host_x + rows[r] * K, K));
        CHECK_OK(qmm_buffer_poison(out_row));
        CHECK_OK(qmm_matmul(context, p.weights, x_row, 1, out_row, &options, &info));
        CHECK(info.batch_invariant_order && strcmp(info.batch_invariant_order, want_order) == 0,
              "batch-invariant M=1 ran %s, want order %s", info.name, want_order);
        CHECK_OK(qmm_buffer_read(out_row, alone + rows[r] * N, N));
    }
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        const char *row = runs[k].row;
        if ((runs[k].cluster || runs[k].path) && !hopper) continue;
        if (row && qmm_kernel_supports(context, row, p.weights, 1, QMM_OP_QMM_T, NULL) != 1) continue; /* not Hopper */
        qmm_matmul_options forced = options;
        forced.kernel = row;
        const char *order = row ? row_order(context, row) : want_order;
        if (!order || strcmp(order, want_order) != 0) { /* a row of the other order: refused, saying so */
            CHECK_STATUS(qmm_matmul(context, p.weights, p.x, 1, p.out, &forced, NULL), QMM_ERR_UNSUPPORTED);
            CHECK(strstr(qmm_last_error(), "but this call's order is") != NULL, "forced %s in batch-invariant mode: %s",
                  row, qmm_last_error());
            continue;
        }
        if (runs[k].cluster) setenv("QMM_CUDA_WGMMA_CLUSTER", runs[k].cluster, 1);
        if (runs[k].path) setenv("QMM_CUDA_INVARIANT_PATH", runs[k].path, 1);
        char how[64];
        snprintf(how, sizeof how, "%s%s%s", runs[k].cluster ? ", no clusters" : "", runs[k].path ? ", path " : "",
                 runs[k].path ? runs[k].path : "");
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            CHECK_OK(qmm_buffer_poison(p.out));
            /* a forced way the call cannot take is an error naming the knob (on the H200: `last` at M ≤ 1024, 128
             * tiles of 64 tokens or fewer, one wave; at 2048, 256 tiles, it runs; `blocks` runs at 4 splits) */
            const qmm_status status = qmm_matmul(context, p.weights, p.x, ms[i], p.out, &forced, &info);
            if (runs[k].path && forced_path_refused(status, runs[k].path)) continue;
            CHECK(status == QMM_OK, "batch-invariant M=%zu (%s%s): status %d (%s)", ms[i], row ? row : "selector", how,
                  (int)status, qmm_last_error());
            if (status != QMM_OK) continue;
            CHECK_OK(qmm_buffer_read(p.out, got, ms[i] * N));
            for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
                if (rows[r] < ms[i])
                    CHECK(memcmp(got + rows[r] * N, alone + rows[r] * N, N * sizeof *got) == 0,
                          "batch-invariant: row %zu inside M=%zu (%s%s) differs from the row alone", rows[r], ms[i],
                          info.name, how);
            if (ms[i] == 2048) { /* every row against the oracle */
                char what[160];
                snprintf(what, sizeof what, "batch-invariant M=2048 (%s%s) against the oracle", info.name, how);
                product_check(&p, what, 2.0);
            }
        }
        if (runs[k].cluster) unsetenv("QMM_CUDA_WGMMA_CLUSTER");
        if (runs[k].path) unsetenv("QMM_CUDA_INVARIANT_PATH");
    }
    if (hopper) { /* a forced way that is not one: an error naming the value and the ways */
        qmm_matmul_options forced = options;
        forced.kernel = "cuda.qmm_t.wgmma_tile.m64n128";
        setenv("QMM_CUDA_INVARIANT_PATH", "sideways", 1);
        CHECK_STATUS(qmm_matmul(context, p.weights, p.x, 512, p.out, &forced, NULL), QMM_ERR_INVALID_ARGUMENT);
        CHECK(strstr(qmm_last_error(), "QMM_CUDA_INVARIANT_PATH=sideways") && strstr(qmm_last_error(), "blocks"),
              "an unknown forced path: %s", qmm_last_error());
        unsetenv("QMM_CUDA_INVARIANT_PATH");
    }
    /* Hopper, bf16 and f16 (bf16's virtual splits keep their partials in workspace slots, f16's a running sum in
     * registers with a countdown to each range's end), K = 2112: 17 super-blocks in 4 splits of 5, 5, 5 and 2 on the
     * H200 (3 of 6, 6, 5 on 96–127 SMs; 2 of 9, 8 on 78–95) — uneven ranges. Every way of running them gives the
     * selector's bits at M = 2048 — virtual splits also where their slots cannot be had (QMM_CUDA_INVARIANT_SLOTS=0:
     * for bf16 split blocks run instead of an out-of-memory error; f16 needs none) — and sampled rows alone the same. */
    for (int d = 0; hopper && d < 2; d++) {
        enum { K_UNEVEN = 2112 };
        static const char *const paths[] = {"split", "virtual", "last", "blocks", "virtual"}; /* the last without slots */
        const qmm_dtype dtype = d == 0 ? QMM_BF16 : QMM_F16;
        const char *dname = d == 0 ? "bf16" : "f16";
        char what[120];
        snprintf(what, sizeof what, "batch-invariant %s, uneven splits", dname);
        product u;
        uint16_t *first = malloc((size_t)ROWS * N * sizeof *first), *row_alone = malloc(N * sizeof *row_alone);
        qmm_buffer *x_uneven = NULL, *out_uneven = NULL;
        if (first && row_alone && product_make(context, rng, ROWS, N, K_UNEVEN, 4, 64, dtype, what, &u)) {
            CHECK_OK(qmm_buffer_poison(u.out));
            CHECK_OK(qmm_matmul(context, u.weights, u.x, ROWS, u.out, &options, &info));
            CHECK_OK(qmm_buffer_read(u.out, first, (size_t)ROWS * N));
            snprintf(what, sizeof what, "batch-invariant %s K=2112 M=2048 against the oracle", dname);
            product_check(&u, what, 2.0);
            for (size_t w = 0; w < sizeof paths / sizeof paths[0]; w++) {
                qmm_matmul_options forced = options;
                forced.kernel = "cuda.qmm_t.wgmma_tile.m64n128";
                const bool no_slots = w == 4;
                setenv("QMM_CUDA_INVARIANT_PATH", paths[w], 1);
                if (no_slots) setenv("QMM_CUDA_INVARIANT_SLOTS", "0", 1);
                CHECK_OK(qmm_buffer_poison(u.out));
                const qmm_status status = qmm_matmul(context, u.weights, u.x, ROWS, u.out, &forced, &info);
                const bool refused = forced_path_refused(status, paths[w]); /* `blocks` at 2 splits (78–95 SMs) */
                unsetenv("QMM_CUDA_INVARIANT_PATH");
                unsetenv("QMM_CUDA_INVARIANT_SLOTS");
                if (refused) continue;
                CHECK(status == QMM_OK, "batch-invariant %s K=2112 M=2048: path %s: status %d (%s)", dname, paths[w],
                      (int)status, qmm_last_error());
                if (status != QMM_OK) continue;
                CHECK_OK(qmm_buffer_read(u.out, got, (size_t)ROWS * N));
                CHECK(memcmp(got, first, (size_t)ROWS * N * sizeof *got) == 0,
                      "batch-invariant %s K=2112 M=2048: path %s%s (%s) differs from the selector's bits", dname,
                      paths[w], no_slots ? " without slots" : "", info.name);
            }
            CHECK_OK(qmm_buffer_create(context, dtype, K_UNEVEN, &x_uneven));
            CHECK_OK(qmm_buffer_create(context, dtype, N, &out_uneven));
            for (size_t r = 0; x_uneven && out_uneven && r < sizeof rows / sizeof rows[0]; r++) {
                CHECK_OK(qmm_buffer_write(x_uneven, (const uint16_t *)u.host_x + rows[r] * K_UNEVEN, K_UNEVEN));
                CHECK_OK(qmm_buffer_poison(out_uneven));
                CHECK_OK(qmm_matmul(context, u.weights, x_uneven, 1, out_uneven, &options, &info));
                CHECK_OK(qmm_buffer_read(out_uneven, row_alone, N));
                CHECK(memcmp(row_alone, first + rows[r] * N, N * sizeof *row_alone) == 0,
                      "batch-invariant %s K=2112: row %zu alone (%s) differs from the row inside M=2048", dname,
                      rows[r], info.name);
            }
            qmm_buffer_destroy(x_uneven);
            qmm_buffer_destroy(out_uneven);
            product_free(&u);
        }
        free(first);
        free(row_alone);
    }
    /* The mma_gemv rows declare no order. */
    {
        qmm_matmul_options forced = {.op = QMM_OP_QMM_T, .kernel = "cuda.qmm_t.mma_gemv.m8n16", .batch_invariant = 1};
        CHECK_STATUS(qmm_matmul(context, p.weights, p.x, 1, p.out, &forced, NULL), QMM_ERR_UNSUPPORTED);
        CHECK(strstr(qmm_last_error(), "kernel cuda.qmm_t.mma_gemv.m8n16 does not declare a batch-invariant order") != NULL,
              "forced mma row in batch-invariant mode: %s", qmm_last_error());
    }
    /* f32 takes mma_tile_bf16x3 ("tc-bf16x3-segment-fma") at every M, M = 1 included (ffma_gemv declares no order):
     * sampled rows alone, then inside M = 2, 37 and 512, identical bits, and M = 512 against the oracle. */
    product_free(&p);
    if (!product_make(context, rng, 512, N, K, 4, 64, QMM_F32, "batch-invariant (f32)", &p)) goto cleanup;
    {
        static const size_t rows32[] = {0, 1, 7, 31, 32, 36, 255, 511}, ms32[] = {2, 37, 512};
        float *alone32 = malloc(512 * (size_t)N * sizeof *alone32), *got32 = malloc(512 * (size_t)N * sizeof *got32);
        qmm_buffer *x32 = NULL, *out32 = NULL;
        CHECK_OK(qmm_buffer_create(context, QMM_F32, K, &x32));
        CHECK_OK(qmm_buffer_create(context, QMM_F32, N, &out32));
        CHECK(alone32 && got32 && x32 && out32, "batch-invariant f32: set-up failed");
        for (size_t r = 0; alone32 && got32 && x32 && out32 && r < sizeof rows32 / sizeof rows32[0]; r++) {
            CHECK_OK(qmm_buffer_write(x32, (const float *)p.host_x + rows32[r] * K, K));
            CHECK_OK(qmm_buffer_poison(out32));
            CHECK_OK(qmm_matmul(context, p.weights, x32, 1, out32, &options, &info));
            CHECK(info.batch_invariant_order && strcmp(info.batch_invariant_order, "tc-bf16x3-segment-fma") == 0,
                  "batch-invariant f32 M=1 ran %s", info.name);
            CHECK_OK(qmm_buffer_read(out32, alone32 + rows32[r] * N, N));
        }
        for (size_t i = 0; alone32 && got32 && x32 && out32 && i < sizeof ms32 / sizeof ms32[0]; i++) {
            CHECK_OK(qmm_buffer_poison(p.out));
            CHECK_OK(qmm_matmul(context, p.weights, p.x, ms32[i], p.out, &options, &info));
            CHECK_OK(qmm_buffer_read(p.out, got32, ms32[i] * N));
            for (size_t r = 0; r < sizeof rows32 / sizeof rows32[0]; r++)
                if (rows32[r] < ms32[i])
                    CHECK(memcmp(got32 + rows32[r] * N, alone32 + rows32[r] * N, N * sizeof *got32) == 0,
                          "batch-invariant f32: row %zu inside M=%zu (%s) differs from the row alone", rows32[r], ms32[i],
                          info.name);
        }
        product_check(&p, "batch-invariant f32 M=512 against the oracle", 2.0);
        /* ffma_gemv declares no order; the generic row's "oracle" is not the order of f32 calls any more */
        qmm_matmul_options forced = options;
        forced.kernel = "cuda.qmm_t.ffma_gemv.m8n16";
        CHECK_STATUS(qmm_matmul(context, p.weights, p.x, 1, p.out, &forced, NULL), QMM_ERR_UNSUPPORTED);
        forced.kernel = "cuda.qmm_t.generic.m8n256";
        CHECK_STATUS(qmm_matmul(context, p.weights, p.x, 1, p.out, &forced, NULL), QMM_ERR_UNSUPPORTED);
        free(alone32);
        free(got32);
        qmm_buffer_destroy(x32);
        qmm_buffer_destroy(out32);
    }
    /* Outside batch-invariant mode the generic row still computes the oracle's f32 order: the ref backend's rows
     * give the same bits. */
    {
        qmm_context *ref = NULL;
        qmm_weights *ref_weights = NULL;
        qmm_buffer *ref_x = NULL, *ref_out = NULL;
        const size_t M = 37;
        float *ref_bits = malloc(M * N * sizeof(float)), *cuda_bits = malloc(M * N * sizeof(float));
        CHECK_OK(qmm_context_create(QMM_BACKEND_REF, 0, &ref));
        if (ref && ref_bits && cuda_bits) {
            qmm_matmul_options generic = {.op = QMM_OP_QMM_T, .kernel = "cuda.qmm_t.generic.m8n256"};
            CHECK_OK(qmm_weights_create(ref, &p.q.m, &ref_weights));
            CHECK_OK(qmm_buffer_create(ref, QMM_F32, M * K, &ref_x));
            CHECK_OK(qmm_buffer_create(ref, QMM_F32, M * N, &ref_out));
            CHECK_OK(qmm_buffer_write(ref_x, p.host_x, M * K));
            CHECK_OK(qmm_matmul(ref, ref_weights, ref_x, M, ref_out, &options, NULL));
            CHECK_OK(qmm_buffer_read(ref_out, ref_bits, M * N));
            CHECK_OK(qmm_buffer_poison(p.out));
            CHECK_OK(qmm_matmul(context, p.weights, p.x, M, p.out, &generic, &info));
            CHECK_OK(qmm_buffer_read(p.out, cuda_bits, M * N));
            CHECK(memcmp(ref_bits, cuda_bits, M * N * sizeof(float)) == 0,
                  "cuda's generic row and ref's batch-invariant (\"oracle\") rows differ");
        }
        free(ref_bits);
        free(cuda_bits);
        qmm_buffer_destroy(ref_x);
        qmm_buffer_destroy(ref_out);
        qmm_weights_destroy(ref_weights);
        qmm_context_destroy(ref);
    }
cleanup:
    qmm_buffer_destroy(x_row);
    qmm_buffer_destroy(out_row);
    free(alone);
    free(got);
    product_free(&p);
}

/* Codes stored wider (the backend's stored_bits hook: 2/3-bit as 4-bit, 5/6-bit as 8-bit): every width reaches the
 * 4/8-bit rows. For 2, 3, 5 and 6 bits, a group size each, f16/bf16/f32, qmm_t at M = 1, 16, 40 and 300 (GEMV,
 * tile and wgmma sizes; N = 200, ragged): the selector's row is not the generic one, its output within the oracle's
 * bound (outputs poisoned), every row that takes the call too (M = 1 and 40); qmm_weights_describe keeps the
 * caller's width. QMM_CUDA_STORED_BITS=0 keeps the width (the generic row, within the bound); another value is an
 * error naming it. qmm_n's cases of these widths are in test_qmm_n, the gather's in test_gather. */
static void test_stored_bits(qmm_context *context, check_rng *rng) {
    static const int widths[] = {2, 3, 5, 6};
    static const int group_sizes[] = {32, 64, 128};
    static const qmm_dtype dtypes[] = {QMM_F16, QMM_BF16, QMM_F32};
    static const size_t ms[] = {1, 16, 40, 300};
    for (size_t b = 0; b < 4; b++)
        for (size_t d = 0; d < 3; d++) {
            const int bits = widths[b], group_size = group_sizes[(b + d) % 3];
            const qmm_dtype dtype = dtypes[d];
            for (size_t mi = 0; mi < 4; mi++) {
                const size_t M = ms[mi], N = 200, K = 512;
                char what[160];
                snprintf(what, sizeof what, "stored bits: %d-bit gs%d %s M=%zu N=%zu K=%zu", bits, group_size,
                         qmm_dtype_name(dtype), M, N, K);
                product p;
                if (!product_make(context, rng, M, N, K, bits, group_size, dtype, what, &p)) continue;
                qmm_qmatrix described;
                CHECK_OK(qmm_weights_describe(p.weights, &described));
                CHECK(described.bits == bits, "%s: qmm_weights_describe says %d-bit", what, described.bits);
                qmm_kernel_info info = {0};
                CHECK_OK(qmm_buffer_poison(p.out));
                CHECK_OK(qmm_matmul(context, p.weights, p.x, M, p.out, NULL, &info));
                CHECK(info.name && !strstr(info.name, ".generic."), "%s: the selector took %s", what,
                      info.name ? info.name : "nothing");
                char label[240];
                snprintf(label, sizeof label, "%s, %s", what, info.name ? info.name : "?");
                product_check(&p, label, info.tolerance_slack);
                if (M == 1 || M == 40) check_every_row(context, &p, what);
                product_free(&p);
            }
        }
    /* the knob: 0 keeps the width (the generic row takes the calls), a bad value is refused */
    check_qmatrix q;
    if (!check_qmatrix_random(rng, 200, 512, 3, 64, QMM_F16, &q)) {
        CHECK(false, "stored bits knob: set-up failed");
        return;
    }
    qmm_weights *weights = NULL;
    setenv("QMM_CUDA_STORED_BITS", "2", 1);
    CHECK_STATUS(qmm_weights_create(context, &q.m, &weights), QMM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(qmm_last_error(), "QMM_CUDA_STORED_BITS=2 is not one of 0, 1") != NULL, "stored bits knob: %s",
          qmm_last_error());
    setenv("QMM_CUDA_STORED_BITS", "0", 1);
    CHECK_OK(qmm_weights_create(context, &q.m, &weights));
    unsetenv("QMM_CUDA_STORED_BITS");
    qmm_kernel_info info = {0};
    if (weights) CHECK_OK(qmm_select(context, weights, 1, NULL, &info));
    CHECK(info.name && strstr(info.name, ".generic."), "stored bits knob 0: 3-bit weights select %s",
          info.name ? info.name : "nothing");
    qmm_weights_destroy(weights);
    check_qmatrix_free(&q);
}

/* The sections, in the order a whole run takes them. Each draws its inputs from its own generator (salt 700 + its
 * index), so with the same QMM_TEST_SEED a section run alone (QMM_TEST_SECTION) checks the same products as inside the
 * whole run (without it each process takes its seed from the clock and prints it on a failure). */
typedef struct section {
    const char *name;
    void (*run)(qmm_context *, check_rng *);
} section;
static const section sections[] = {
    {"chain", test_chain},
    {"selector", test_selector_and_switch_points},
    {"determinism", test_determinism},
    {"tile_split_k", test_tile_split_k},
    {"gemv_staged_x", test_gemv_staged_x},
    {"gemv_mixed16", test_gemv_mixed16},
    {"m16n64_chunks", test_m16n64_chunks},
    {"wgmma_switch", test_wgmma_switch},
    {"gather", test_gather},
    {"gather_non_finite", test_gather_non_finite},
    {"gather_queue", test_gather_queue},
    {"non_finite", test_non_finite},
    {"large_f16_x", test_large_f16_x},
    {"errors", test_errors},
    {"batch_invariant", test_batch_invariant},
    {"wgmma_tile_order", test_wgmma_tile_order},
    {"wgmma_prepared", test_wgmma_prepared},
    {"wgmma_last_wave", test_wgmma_last_wave},
    {"wgmma_cluster_splits", test_wgmma_cluster_splits},
    {"qmm_n", test_qmm_n},
    {"stored_bits", test_stored_bits},
    {"wgmma32_blocks", test_wgmma32_blocks},
};
#define SECTION_COUNT (sizeof sections / sizeof sections[0])

/* `test_cuda` runs every section; `test_cuda --list` prints their names (scripts/gpu_test.sh runs them under
 * compute-sanitizer in parallel); QMM_TEST_SECTION=name runs that one only (an unknown name fails, naming the list). */
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < SECTION_COUNT; i++) printf("%s\n", sections[i].name);
        return 0;
    }
    const char *only = getenv("QMM_TEST_SECTION");
    if (only && *only) {
        bool known = false;
        for (size_t i = 0; i < SECTION_COUNT; i++) known = known || strcmp(only, sections[i].name) == 0;
        if (!known) {
            printf("test_cuda: QMM_TEST_SECTION=%s names no section (test_cuda --list prints them)\n", only);
            return 1;
        }
    }
    const char *shard = getenv("QMM_TEST_SHARD");
    if (shard && *shard) {
        const size_t a = strspn(shard, "0123456789"), b = a && shard[a] == '/' ? strspn(shard + a + 1, "0123456789") : 0;
        const bool form = a >= 1 && a <= 2 && shard[a] == '/' && b >= 1 && b <= 2 && shard[a + 1 + b] == '\0';
        const unsigned i = form ? (unsigned)atoi(shard) : 0, n = form ? (unsigned)atoi(shard + a + 1) : 0;
        if (!form || n < 1 || n > 64 || i >= n || !only || strcmp(only, "gather") != 0) {
            printf("test_cuda: QMM_TEST_SHARD=%s must be i/n with 0 <= i < n <= 64, and only with QMM_TEST_SECTION=gather "
                   "(the one section cut into shards)\n", shard);
            return 1;
        }
        shard_index = i, shard_count = n;
        printf("test_cuda: the gather section's shard %u of %u (runs numbered %u mod %u)\n", i, n, i, n);
    }
    qmm_context *context = NULL;
    if (qmm_context_create(QMM_BACKEND_CUDA, 0, &context) != QMM_OK) {
        printf("test_cuda: SKIPPED: %s\n", qmm_last_error());
        return SKIP_CODE;
    }
    for (size_t i = 0; i < SECTION_COUNT; i++) {
        if (only && *only && strcmp(only, sections[i].name) != 0) continue;
        check_rng rng = check_rng_make(700 + i);
        sections[i].run(context, &rng);
    }
    qmm_context_destroy(context);
    return check_finish("test_cuda");
}
