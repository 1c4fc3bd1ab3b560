/*
 * main.c — the qmm command-line tool: the command table, help and dispatch. Each command lives in its
 * own file (info.c, convert.c, quantize.c, matmul.c, gather.c, run.c, kernels.c, bench.c, tune.c); what
 * they share is in common.c, and what bench and tune share to measure kernels in measure.c.
 *
 * Conventions: results go to stdout, progress to stderr. A library failure prints
 * "qmm <cmd>: <status string>: <qmm_last_error()>" and exits 1; bad command-line input prints
 * "qmm <cmd>: usage error: ..." and exits 2; a FAIL verdict exits 3 (common.h, QMM_EXIT_*). Every product is compared element by element with
 * qmm_ref_dense_f64 using the documented bound qmm_error_bound (docs/kernels.md, "Tolerance").
 */
#include "common.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static int cmd_help(const command *c, int argc, char **argv);

static const command commands[] = {
    {"info", "list a .safetensors, .gguf or MLX checkpoint dir: tensors, quantized layers, formats",
     "usage: qmm info FILE|DIR\n"
     "  FILE.safetensors  tensors (name, dtype, shape) and quantized layers (P.scales present); bits and\n"
     "                    group_size come from a config.json beside the file\n"
     "  FILE.gguf         every tensor's GGUF type, shape and whether qmm imports it (and as what)\n"
     "  DIR               an MLX checkpoint: tensors and every quantized layer's bits, group_size and scale dtype\n",
     cmd_info},
    {"convert", "convert a GGUF file into an MLX checkpoint directory",
     "usage: qmm convert IN.gguf OUTDIR [--only PREFIX]... [--skip-unsupported] [--force]\n"
     "  Imports F32/F16/BF16 tensors as they are, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 exactly as 4/5/8-bit gs32 layers\n"
     "  with f16 scales and Q4_K/Q5_K as 4/5-bit gs32 layers with f32 scales (X.weight -> layer X); Q2_K,\n"
     "  Q3_K, Q6_K and the IQ types have no exact MLX form. --only keeps the tensors whose names start with\n"
     "  PREFIX (repeatable). An unsupported tensor type stops the conversion and leaves OUTDIR without new\n"
     "  files, unless --skip-unsupported leaves such tensors out (each named on stderr): a Q4_K_M file's Q6_K\n"
     "  tensors, say. An OUTDIR that already holds a checkpoint is refused unless --force is given; OUTDIR is\n"
     "  checked before any work.\n",
     cmd_convert},
    {"quantize", "quantize the float weights of a safetensors file into an MLX checkpoint",
     "usage: qmm quantize IN.safetensors OUTDIR --bits B --group-size G [--convention cpu|gpu] [--force]\n"
     "  Every 2-D f32/f16/bf16 tensor named *.weight whose last dim is a multiple of G becomes a quantized\n"
     "  layer (weight U32, scales, biases in the weight's dtype); a 3-D one [E, N, K] becomes a layer of E MoE\n"
     "  experts (weight [E, N, K·B/32], for qmm gather); every other tensor is copied, and each float\n"
     "  *.weight left unquantized is named on stderr with the reason. Layers already quantized keep their own\n"
     "  format, read from the config.json beside IN (refused without one). Nothing to quantize: refused.\n"
     "  B: 2, 3, 4, 5, 6 or 8. G: 32, 64 or 128. --convention: MLX's CPU quantizer (default) or its GPU\n"
     "  quantizer (what mlx-community checkpoints were made with), bit for bit. OUTDIR is checked before any\n"
     "  work (an existing checkpoint there is replaced only with --force).\n",
     cmd_quantize},
    {"matmul", "run one layer's product through the runtime and check it against the f64 oracle",
     "usage: qmm matmul DIR --layer NAME -m M [--dtype f32|f16|bf16] [--kernel NAME] [--x FILE.safetensors]\n"
     "                  [--seed S] [--backend auto|cuda|cpu|ref] [--tuning FILE] [--threads N] [--batch-invariant]\n"
     "  out[M, N] = x[M, K] · Ŵᵀ for layer NAME of checkpoint DIR. x is uniform random in [-1, 1) (seed S,\n"
     "  default 42) or read from FILE (the tensor named NAME, else its only tensor; shape [T, K] or [K] (T = 1), first M\n"
     "  rows, all T rows (at most 65536) when -m is omitted). --dtype (also float32, float16, bfloat16) other\n"
     "  than the layer's scale dtype converts scales and biases (rounded once). Prints max |error| and max\n"
     "  relative error (÷ max |exact|) against qmm_ref_dense_f64, the worst error/bound ratio (qmm_error_bound),\n"
     "  the median µs of chain runs, GB/s (weights + scales + biases + x + out bytes / time) and the kernel used.\n"
     "  Exit 3 when an output is outside its bound. M: 1 to 65536. --backend auto: the first of cuda, cpu, ref that\n"
     "  is available.\n"
     "  Inputs must be finite once in the dtype (x, scales, biases: no inf/NaN, x not beyond the dtype's range);\n"
     "  otherwise the command refuses (exit 1) rather than judge the outputs.\n"
     "  --tuning FILE: the selector reads that tuning table (qmm tune); --kernel still wins over it.\n"
     "  --threads N: host threads of the CPU kernels (1 to 8 x the CPUs online; default: the cores this process may use).\n"
     "  --batch-invariant: batch-invariant mode (qmm_matmul_options.batch_invariant: row i's bits do not depend on M or\n"
     "  on the other rows; docs/kernels.md): prints the kernel's order and recomputes up to 64 rows alone (M=1),\n"
     "  comparing them bit for bit with the product (exit 3 when one differs). A --kernel without the order fails.\n"
     "  Test hook: QMM_RUN_INJECT_FAULT=n (n >= 1) corrupts one output element before the comparison.\n",
     cmd_matmul},
    {"gather", "the MoE product of a layer of experts (top-k routing), checked against the f64 oracle",
     "usage: qmm gather DIR --layer NAME [--tokens|-t T] [--experts-per-token|-k K] [--unsorted] [--dtype f32|f16|bf16]\n"
     "                  [--kernel NAME] [--seed S] [--backend auto|cuda|cpu|ref] [--threads N] [--batch-invariant]\n"
     "  MLX gather_qmm on layer NAME of checkpoint DIR, a layer of E experts (weight [E, N, K·bits/32], as\n"
     "  mlx-lm's switch_mlp; `qmm info` shows \"E experts\"; a 2-D layer is one expert). T tokens (default 16,\n"
     "  at most 65536) of random x, uniform in [-1, 1) (seed S, default 42), are each routed to K distinct\n"
     "  experts drawn at random with the same seed (-k, default min(8, E), at most E): B = T·K pairs (token, expert),\n"
     "  sorted by expert (stably, MLX's sorted_indices fast path) or, with --unsorted, in token order.\n"
     "  out[B, N] = x[token]·Ŵ[expert]ᵀ through qmm_gather_matmul; every output is compared with the f64 oracle\n"
     "  (qmm_ref_gather_dense_f64) under qmm_error_bound. Prints max |error|, max relative error, the worst\n"
     "  error/bound ratio, the median µs of repeated products (host clock) and the kernel. --dtype (also float32,\n"
     "  float16, bfloat16) other than the layer's scale dtype converts scales and biases (rounded once). Exit 3\n"
     "  when an output is outside its bound.\n"
     "  --backend auto: the first of cuda, cpu, ref that opens and has a gather kernel (all three have one, each\n"
     "  also one of a batch-invariant order).\n"
     "  --threads N: host threads of the CPU kernels (1 to 8 x the CPUs online; default: the cores this process may use).\n"
     "  --batch-invariant: batch-invariant mode (qmm_gather_options.batch_invariant: a pair's bits depend only on its\n"
     "  token's x row and its expert): prints the kernel's order and recomputes up to 64 pairs alone (B=1), comparing\n"
     "  them bit for bit with the gather (exit 3 when one differs).\n"
     "  Test hook: QMM_RUN_INJECT_FAULT=n (n >= 1) corrupts one output element before the comparison.\n",
     cmd_gather},
    {"run", "the main job: every quantized layer of a real checkpoint, checked against the oracle",
     "usage: qmm run [DIR] [--seed S] [--backend auto|cuda|cpu|ref] [--tuning FILE] [--threads N] [--batch-invariant]\n"
     "  DIR defaults to the embedded fixture data/" FIXTURE_NAME " (7 linear layers of SmolLM2-135M\n"
     "  block 0, see data/NOTICE). For every quantized layer: x = DIR/activations.safetensors[layer name]\n"
     "  ([T, K], rounded to the layer's scale dtype; seeded random x when absent, marked \"random x\"), the\n"
     "  product through the runtime (selector's choice), every output compared with the f64 oracle under\n"
     "  qmm_error_bound. One row per layer: name, M×N×K, format, kernel, max |error|, worst error/bound, µs.\n"
     "  --backend auto (the default): the first of cuda, cpu, ref that is available; a named backend that is\n"
     "  not available is an error (exit 1). --tuning FILE: the selector reads that tuning table (qmm tune).\n"
     "  --threads N: host threads of the CPU kernels (1 to 8 x the CPUs online; default: the cores this process may use; a\n"
     "  backend without host threads refuses N > 1).\n"
     "  --batch-invariant: every product in batch-invariant mode, and up to 64 rows of each recomputed alone (M=1)\n"
     "  and compared bit for bit (a layer whose rows differ FAILs), as qmm matmul --batch-invariant.\n"
     "  Ends with a verdict line; exit 3 when any layer is outside its bound.\n"
     "  Test hook: QMM_RUN_INJECT_FAULT=n (n >= 1) corrupts one output element of each of the first n layers\n"
     "  before the comparison, to prove the verdict can fail.\n",
     cmd_run},
    {"kernels", "list every backend's kernel table in selector order (or why a backend is unavailable)",
     "usage: qmm kernels [--backend auto|cuda|cpu|ref]\n"
     "  For each backend (cuda, cpu, ref): its rows in the order the selector tries them, with op, family,\n"
     "  tile BMxBNxBK, threads per GPU block (\"-\" for host rows, which run on the context's threads), the\n"
     "  harness's tolerance slack, its batch-invariant order (\"-\": none,\n"
     "  the row refuses --batch-invariant; docs/kernels.md \"Batch-invariant mode\"), whether this machine can run it\n"
     "  (\"usable: yes\", or \"usable: no: this CPU lacks AVX-512BW\") and a description, or why the\n"
     "  backend is not available here. Names follow <backend>.<op>.<family>.<tile>[.<isa>] (docs/kernels.md).\n"
     "  --backend: only that backend's table (auto: the first of cuda, cpu, ref that is available); exit 1\n"
     "  when it is not available.\n",
     cmd_kernels},
    {"bench", "time every eligible kernel per (shape, M, dtype) against the measured floor and peers",
     "usage: qmm bench [--backend auto|cuda|cpu|ref] [--shapes FILE|NAME[,...]] [--m 1,2,...] [--dtype f32,bf16,...]\n"
     "                 [--bits B] [--group-size G] [--kernel NAME] [--repeats R] [--json FILE|DIR] [--no-peers] [--quick]\n"
     "                 [--tuning FILE] [--threads N] [--batch-invariant] [--op t|n] [--peer-timeout S]\n"
     "                 [--selector-only]\n"
     "                 [--gather [--experts E] [--experts-per-token K]]\n"
     "  For every shape (n×k, out[M, n] = x[M, k]·Ŵᵀ), M and dtype: the median µs of the selector's kernel and of\n"
     "  every other eligible kernel of the backend (each forced by name), effective GB/s (weights + scales + biases\n"
     "  + x + out bytes ÷ time), the floor = max(bytes ÷ copy bandwidth, 2·M·n·k ÷ matrix peak) with both ceilings\n"
     "  measured in this run (bf16 cells: the bf16 peak, a vdpbf16ps loop where the CPU has one), time ÷ floor,\n"
     "  whether the selector's kernel is the fastest (within 5%), and peers\n"
     "  measured in the same run (cpu/ref: OpenBLAS sgemm on the dequantized weights, MLX CPU through .venv;\n"
     "  cuda: cuBLAS dense f16/bf16, torch int4, MLX CUDA); a peer that cannot run is listed as absent with the\n"
     "  reason. Weights rotate through copies totalling more than twice the last-level cache (CPU: from sysfs;\n"
     "  CUDA: the L2), so small M reads them cold; each (cell, kernel) is one chain with a step per copy, a\n"
     "  warm-up, then R runs (default 7), time = median of chain time ÷ steps (CUDA: one graph, device events).\n"
     "  --shapes: files of \"name N K\" lines, or names of bench/shapes/NAME.txt (seed, qwen3); default seed.\n"
     "  --m: values 1 to 65536, default 1,2,4,8,16,32,64,128,512 (cpu, ref), 1,2,4,8,16 (cuda). --dtype: default\n"
     "  f32,bf16 (cpu, ref), f16,bf16 (cuda). --bits/--group-size: default 4/64. --kernel: measure only that kernel.\n"
     "  --selector-only: measure only the selector's kernel (and the peers) in each cell — a wide sweep in less time.\n"
     "  The slow rows (the scalar reference rows, the CPU's portable row, CUDA's generic kernels) are skipped, and say\n"
     "  so, where their measurement would take more than ~10 s at their estimated rate.\n"
     "  --json: also write every number to FILE (or DIR/bench-BACKEND-DATE-PID.json, e.g. bench/results/).\n"
     "  --quick: a tiny grid with short ceilings, for tests. Progress goes to stderr; the table to stdout.\n"
     "  --tuning FILE: the selector reads that tuning table (qmm tune); the header says so, and 'selector picked\n"
     "  the fastest' then judges the tuned selector.\n"
     "  --threads N: threads for qmm's CPU kernels, the ceilings and the OpenBLAS and ggml peers (1 to 8 x\n"
     "  the CPUs online; default: the cores this process may use).\n"
     "  --gather: the MoE gather op (qmm_gather_matmul, MLX gather_qmm) instead: each shape is one expert's n×k,\n"
     "  stacked E times (--experts, default 128); --m is T, the tokens (default 1,8,32,128), each routed to K\n"
     "  distinct random experts (--experts-per-token, default min(8, E)), B = K·T pairs sorted by expert as MLX's\n"
     "  sorted_indices; bytes = the experts touched + x + out, floor = max(bytes ÷ copy, 2·B·n·k ÷ peak); every\n"
     "  gather row is timed (on the CPU the reference rows are the baseline), on the host clock per call of a stream\n"
     "  of calls, waiting for the last (a row whose one pass over the copies would take more than ~20 s is skipped,\n"
     "  and says so; test hook: QMM_BENCH_GATHER_SKIP_S=seconds); peer: MLX's mx.gather_qmm on the CPU through .venv\n"
     "  (bench/peers/mlx_gather_cpu.py), with --backend cuda on MLX CUDA (mlx_gather_cuda.py, python3 from PATH),\n"
     "  on the same stack, copies and routings; no --tuning. Default shapes: qwen3-30b-a3b-experts\n"
     "  (Qwen3-30B-A3B: 768×2048 gate/up, 2048×768 down).\n"
     "  --batch-invariant: each cell also times batch-invariant mode (qmm_matmul_options.batch_invariant; with\n"
     "  --gather qmm_gather_options.batch_invariant): a row marked 'bi' with the kernel the selector (or --kernel)\n"
     "  takes in that mode and, in its note, its time ÷ the default mode's (the mode's cost); JSON marks it\n"
     "  \"batch_invariant\": true.\n"
     "  --op n: time qmm_n (x·Ŵ, MLX transpose=False) instead: the same n×k problems with Ŵ stored k×n, quantized\n"
     "  along n (n must be a multiple of the group size); peers: OpenBLAS (cpu) and cuBLAS dense (cuda) on the same\n"
     "  product, the peer scripts (x·Ŵᵀ only) listed as absent.\n"
     "  --peer-timeout S: each peer script's deadline in seconds (default 3600, at most 604800; coreutils timeout,\n"
     "  SIGKILL 10 s after): a script stopped there keeps the results it printed (stderr says it was stopped), or\n"
     "  is listed absent with that reason.\n",
     cmd_bench},
    {"tune", "measure every eligible kernel per (shape, M, dtype) here and write a tuning table the selector reads",
     "usage: qmm tune [--backend auto|cuda|cpu|ref] [--shapes FILE|NAME[,...]] [--m 1,2,...] [--dtype f32,bf16,...]\n"
     "                [--bits B] [--group-size G] [--repeats R] [--out FILE] [--quick] [--threads N]\n"
     "  For every shape (n×k, qmm_t out[M, n] = x[M, k]·Ŵᵀ), dtype and M: times every eligible kernel of the backend,\n"
     "  each forced by name, as qmm bench does (weights rotating beyond the cache, chains, median of R runs; no\n"
     "  peers; scalar reference rows whose measurement would take more than ~10 s are not timed). Consecutive M\n"
     "  values with the same winner become one entry [m_min, m_max] (an M between two entries with different\n"
     "  winners is left to the table order); the winner is the fastest kernel, or the order's own pick when it is\n"
     "  within 2% of the fastest. Writes the table (JSON, docs/kernels.md §4) to FILE via a temporary file and a\n"
     "  rename — default qmm-tuning-BACKEND.json in the current directory — loads it back, and prints per cell the\n"
     "  fastest kernel and its µs, the order's pick and its µs, the gain (order ÷ fastest) and the tuned pick.\n"
     "  The table records the backend and this device's name; qmm_context_load_tuning (and --tuning FILE of qmm\n"
     "  bench, run and matmul) refuses another backend's table and sets aside entries of another device.\n"
     "  --shapes: files of \"name N K\" lines, or names of bench/shapes/NAME.txt (seed, qwen3); default seed.\n"
     "  --m: default 1,2,4,8,16,32,64,128,512 (cpu, ref), 1,2,3,4,6,8,12,16 (cuda). --dtype: default f32,bf16\n"
     "  (cpu, ref), f16,bf16 (cuda). --bits/--group-size: default 4/64. --quick: a tiny grid, for tests.\n"
     "  --threads N: host threads of the CPU kernels (1 to 8 x the CPUs online; default: the cores this process may\n"
     "  use) — a table measured with N threads is for runs with N threads.\n",
     cmd_tune},
    {"help", "print this list, or a command's usage", "usage: qmm help [COMMAND]\n", cmd_help},
};
static const size_t command_count = sizeof commands / sizeof commands[0];

static void print_overview(FILE *out) {
    fprintf(out, "qmm %d.%d.%d — weight-only quantized matmul in the MLX affine format\n\nusage: qmm COMMAND [ARGS]\n\n",
            QMM_VERSION_MAJOR, QMM_VERSION_MINOR, QMM_VERSION_PATCH);
    for (size_t i = 0; i < command_count; i++) fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'qmm COMMAND --help' prints a command's usage.\n\n"
                 "exit status:\n"
                 "  0  success (qmm matmul, qmm gather, qmm run: every output within its error bound)\n"
                 "  1  library or run-time error: a missing or broken file, an unusable OUTDIR, a layer or kernel\n"
                 "     the checkpoint or backend does not have, a backend that is not available, standard output\n"
                 "     that cannot be written\n"
                 "  2  usage error: unknown command or option, missing or malformed value, a value outside its\n"
                 "     rule (--bits 7); reported before any work is done\n"
                 "  3  FAIL verdict: qmm matmul, qmm gather or qmm run ran, and some outputs are outside the error bound\n");
}

static const command *find_command(const char *name) {
    for (size_t i = 0; i < command_count; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

static int cmd_help(const command *c, int argc, char **argv) {
    const char *positional[1];
    size_t npositional;
    const int rc = parse_args(c, argc, argv, NULL, 0, positional, 1, &npositional); /* --help: help's own usage */
    if (rc) return rc;
    if (npositional == 0) {
        print_overview(stdout);
        return 0;
    }
    const command *target = find_command(positional[0]);
    if (!target) return usage_error(c, "unknown command '%s'", positional[0]);
    fputs(target->usage, stdout);
    return 0;
}

/* What a command printed must have reached standard output: a write that failed (a full disk, a closed file) is an
 * I/O error, exit 1 where the command would have exited 0 — the results and the verdict were lost. */
static int stdout_checked(const char *name, int rc) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    fprintf(stderr, "qmm%s%s: I/O error: writing to standard output failed: %s\n", name ? " " : "", name ? name : "",
            errno ? strerror(errno) : "a write error");
    return rc == QMM_EXIT_OK ? QMM_EXIT_ERROR : rc;
}

/* A signal that ends qmm (Ctrl-C, kill, a closed terminal) first removes what a writer has half done — its temporary
 * files and an OUTDIR it created (qmm_atomic_remove_all: async-signal-safe) — then ends the process by the same
 * signal, as if there were no handler (SA_RESETHAND). A signal the caller ignores stays ignored. */
static void remove_unfinished_outputs(int sig) {
    qmm_atomic_remove_all();
    raise(sig);
}

static void clean_up_on_signals(void) {
    static const int signals[] = {QMM_CLEANUP_SIGNALS};
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++) {
        struct sigaction action, old;
        if (sigaction(signals[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN) continue;
        memset(&action, 0, sizeof action);
        action.sa_handler = remove_unfinished_outputs;
        action.sa_flags = SA_RESETHAND;
        sigemptyset(&action.sa_mask);
        sigaction(signals[i], &action, NULL);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) { /* a usage error like any other (its line first), then the commands */
        fprintf(stderr, "qmm: usage error: no command given\n\n");
        print_overview(stderr);
        return QMM_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        print_overview(stdout);
        return stdout_checked(NULL, QMM_EXIT_OK);
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("qmm %d.%d.%d\n", QMM_VERSION_MAJOR, QMM_VERSION_MINOR, QMM_VERSION_PATCH);
        return stdout_checked(NULL, QMM_EXIT_OK);
    }
    const command *c = find_command(argv[1]);
    if (!c) {
        fprint_safe(stderr, "qmm: usage error: unknown command '%s'", argv[1]);
        fprintf(stderr, "\nTry 'qmm help'.\n");
        return QMM_EXIT_USAGE;
    }
    clean_up_on_signals();
    int rc = c->run(c, argc - 2, argv + 2);
    return stdout_checked(c->name, rc == QMM_HELP_SHOWN ? QMM_EXIT_OK : rc);
}
