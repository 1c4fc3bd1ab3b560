#!/usr/bin/env python3
"""qmm bench --gather peer: MLX's own mx.gather_qmm on the CPU, timed the way `qmm bench --gather` times
qmm_gather_matmul (bench/peers/README.md).

For each (shape n:k, dtype): E (--experts) experts of n×k stacked [E, n, k], random, quantized by mx.quantize
(--bits, --group-size), in `copies` independent copies of the whole stack (totalling > 2x the cache; 2 with
--quick). Per T (--m): x [T, 1, k] random and the bench's own 8 routings, regenerated here bit for bit (the
same seeded splitmix64 as make_routing() in tools/qmm/bench.c, seed 42 + 1000·T + r): each token picks
--experts-per-token distinct experts, the B pairs sorted by expert with tokens ascending inside each expert.
A call is mx.gather_qmm(x, w, scales, biases, lhs_indices=tokens, rhs_indices=experts, transpose=True,
sorted_indices=True), out [B, 1, n], evaluated (mx.eval) before the next; one pass = max(copies, 8) calls, call
i on copy i mod copies with routing i mod 8 (as the bench); time per call = pass time / calls; median of
--repeats passes after one warm-up pass. As the bench's time_gather(): a probe call first, and when it says
that would take more than 5 s, one pass of `copies` calls only (the note says so). Cells whose one pass would
take longer than --limit-s (estimated from the previous T) are skipped and say so. JSON lines carry "M" = T.
Also used for MLX on CUDA by mlx_gather_cuda.py (device gpu), timed as the bench times the CUDA gather: a pass is
8 x max(copies, 8) calls built lazily and evaluated by one mx.eval (they run back to back on MLX's stream, as
qmm_gather_matmul's calls stream on qmm's; the pass ends when the last is done), and a first call per (shape,
dtype, T) before the probe compiles MLX's kernels (NVRTC), outside every timed pass."""
import statistics
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _common import absent, copies_for, emit, import_mlx, parse_args, progress  # noqa: E402

ROUTINGS = 8  # GATHER_ROUTINGS in tools/qmm/bench.c
SEED = 42  # DEFAULT_SEED in tools/qmm/common.h
BUDGET_S = 5.0  # GATHER_BUDGET_S in tools/qmm/bench.c
MASK = (1 << 64) - 1


def add_gather_arguments(p):
    p.add_argument("--experts", type=int, default=128, help="experts in the stack (E)")
    p.add_argument("--experts-per-token", type=int, default=8, help="distinct experts per token (top-k)")


def routing(seed, T, top_k, experts):
    """make_routing() of tools/qmm/bench.c: (tokens, experts) of the B = T·top_k pairs, sorted by expert, tokens
    ascending inside each expert, and the number of distinct experts."""
    state = seed

    def random():
        nonlocal state
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    expert_of = []
    for _ in range(T):
        taken = set()
        for _ in range(top_k):  # distinct experts: the next free one after a taken pick
            e = random() % experts
            while e in taken:
                e = (e + 1) % experts
            taken.add(e)
            expert_of.append(e)
    order = sorted(range(len(expert_of)), key=lambda i: expert_of[i])  # stable: tokens stay ascending
    return [i // top_k for i in order], [expert_of[i] for i in order], len(set(expert_of))


def main(device="cpu", peer="mlx-gather-cpu"):
    a = parse_args(__doc__, add_gather_arguments)
    E, top_k = a.experts, a.experts_per_token
    if not 1 <= top_k <= E:
        absent(peer, f"--experts-per-token {top_k} must be in [1, --experts {E}]")
    mx = import_mlx(peer, device)
    if not hasattr(mx, "gather_qmm"):
        absent(peer, f"mlx {mx.__version__} has no mx.gather_qmm")
    dtypes = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
    note_version = f"mlx {mx.__version__} {device} gather_qmm (sorted_indices)"
    for name, N, K in a.shapes:
        for dname in a.dtype:
            dt = dtypes[dname]
            wq, s, b = mx.quantize(mx.random.normal((E, N, K)).astype(dt) * 0.02, group_size=a.group_size,
                                   bits=a.bits)
            per_copy = wq.nbytes + s.nbytes + b.nbytes
            copies = copies_for(a.cache_bytes, per_copy, a.quick)
            # Independent copies (new buffers), so each call reads its own experts from memory.
            ws = [(wq + 0, s + 0, b + 0) for _ in range(copies)]
            del wq, s, b
            mx.eval(ws)
            last = None  # (T, seconds per call) of the previous T, for the estimate
            for T in a.m:
                if last is not None:
                    estimate = last[1] * max(1.0, T / last[0]) * copies
                    if estimate > a.limit_s:
                        emit(peer=peer, shape=name, M=T, dtype=dname,
                             skipped=f"skipped: would take ~{estimate:.0f} s (> --limit-s {a.limit_s:g})")
                        continue
                routes = []
                for r in range(ROUTINGS):
                    lhs, rhs, _ = routing(SEED + 1000 * T + r, T, top_k, E)
                    routes.append((mx.array(lhs, dtype=mx.uint32), mx.array(rhs, dtype=mx.uint32)))
                x = mx.random.uniform(-1, 1, (T, 1, K)).astype(dt)
                mx.eval(x, routes)

                def call(i):
                    w, sc, bi = ws[i % copies]
                    lhs, rhs = routes[i % ROUTINGS]
                    return mx.gather_qmm(x, w, sc, bi, lhs_indices=lhs, rhs_indices=rhs, transpose=True,
                                         group_size=a.group_size, bits=a.bits, sorted_indices=True)

                steps, repeats, warm_up = max(copies, ROUTINGS) * (8 if device == "gpu" else 1), a.repeats, 1
                if device == "gpu":
                    mx.eval(call(0))  # MLX CUDA compiles its kernels at their first use (up to ~30 s): not in the probe
                t0 = time.perf_counter()
                mx.eval(call(0))
                probe = time.perf_counter() - t0
                how = f"median of {repeats} passes of {steps} calls"
                if probe * steps * (repeats + 1) > BUDGET_S:
                    steps, repeats, warm_up = copies, 1, 0
                    how = f"one pass of {steps} calls (a call took {probe:.2f} s)"
                samples = []
                for r in range(-warm_up, repeats):
                    t0 = time.perf_counter()
                    if device == "gpu":
                        mx.eval([call(i) for i in range(steps)])
                    else:
                        for i in range(steps):
                            mx.eval(call(i))
                    if r >= 0:
                        samples.append((time.perf_counter() - t0) / steps)
                us = statistics.median(samples) * 1e6
                last = (T, us * 1e-6)
                emit(peer=peer, shape=name, M=T, dtype=dname, us=us,
                     note=f"{note_version}, {copies} copies x {ROUTINGS} routings (the bench's), {how}")
                progress(f"bench peer {peer} {name} T={T} {dname}: {us:.1f} µs")
            del ws


if __name__ == "__main__":
    main()
