#!/usr/bin/env python3
"""qmm bench peer (b): MLX's own mx.quantized_matmul, timed the way `qmm bench` times qmm (bench/peers/README.md).

For each (shape, dtype): random 4-bit (--bits) weights quantized by mx.quantize in `copies` independent copies
(totalling > 2x the cache), x[M, K] random; one run = a product with every copy in turn, each evaluated
(mx.eval) before the next, so a product is timed as a user of MLX would run it one layer at a time (on the GPU:
the products of all copies evaluated by one mx.eval, so they run back to back on MLX's stream with no host
round trip between them, as a model's layers do); time per
product = run time / copies; median of --repeats runs after one warm-up run. Cells whose measurement would take
longer than --limit-s (estimated from the previous M) are skipped and say so. On the CPU shape by shape; on the GPU
M by M over every shape (MLX CUDA compiles a kernel per M tile and dtype, so a deadline then cuts the largest Ms,
not whole shapes).
Also used for MLX on CUDA by mlx_cuda.py (--device gpu)."""
import statistics
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _common import copies_for, emit, import_mlx, parse_args, progress  # noqa: E402


def main(device="cpu", peer="mlx-cpu"):
    a = parse_args(__doc__)
    mx = import_mlx(peer, device)
    dtypes = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
    note_version = f"mlx {mx.__version__} {device}"

    def weights(N, K, dt):
        wq, s, b = mx.quantize(mx.random.normal((N, K)).astype(dt) * 0.02, group_size=a.group_size, bits=a.bits)
        copies = copies_for(a.cache_bytes, wq.nbytes + s.nbytes + b.nbytes, a.quick)
        # Independent copies (new buffers), so each product reads its own weights from memory.
        ws = [(wq + 0, s + 0, b + 0) for _ in range(copies)]
        mx.eval(ws)
        return ws

    def measure(name, dname, K, ws, M, last):
        """One cell; returns (M, seconds per product) for the next M's estimate, or None when skipped."""
        dt, copies = dtypes[dname], len(ws)
        if last is not None:
            estimate = last[1] * max(1.0, M / last[0]) * copies * (a.repeats + 1)
            if estimate > a.limit_s:
                emit(peer=peer, shape=name, M=M, dtype=dname,
                     skipped=f"skipped: would take ~{estimate:.0f} s (> --limit-s {a.limit_s:g})")
                return None
        x = (mx.random.uniform(-1, 1, (M, K))).astype(dt)
        mx.eval(x)

        def product(w, sc, bi):
            return mx.quantized_matmul(x, w, sc, bi, transpose=True, group_size=a.group_size, bits=a.bits)

        if device == "gpu":
            # MLX CUDA compiles a kernel for a new (M tile, dtype, format) at its first use (NVRTC, up
            # to ~30 s): once here, outside every timed run.
            mx.eval(product(*ws[0]))
        samples = []
        for r in range(a.repeats + 1):
            t0 = time.perf_counter()
            if device == "gpu":
                # The products of every copy built lazily and evaluated together: MLX then runs them back
                # to back on its stream (as a model's layers run), so no host round trip per product.
                mx.eval([product(*w) for w in ws])
            else:
                for w in ws:
                    mx.eval(product(*w))
            t = (time.perf_counter() - t0) / copies
            if r > 0:
                samples.append(t)
            elif t * copies * a.repeats > a.limit_s:
                break  # one run is enough to know it is too slow; report the warm-up alone
        if not samples:
            samples = [t]
        us = statistics.median(samples) * 1e6
        emit(peer=peer, shape=name, M=M, dtype=dname, us=us,
             note=f"{note_version}, {copies} copies{', one eval for all' if device == 'gpu' else ''}, "
                  f"median of {len(samples)}")
        progress(f"bench peer {peer} {name} M={M} {dname}: {us:.1f} µs")
        return (M, us * 1e-6)

    if device == "gpu":
        # M by M over every shape: a kernel is compiled per (M tile, dtype), not per shape, so within a deadline
        # (qmm bench --peer-timeout) this order measures every shape at the first Ms (the forty-seventh session's
        # shape-by-shape run gave 17 cells of 330 in 240 s, all of one shape). Every shape's copies are held at once.
        for dname in a.dtype:
            held = [(name, K, weights(N, K, dtypes[dname])) for name, N, K in a.shapes]
            last = {}
            for M in a.m:
                for name, K, ws in held:
                    result = measure(name, dname, K, ws, M, last.get(name))
                    if result is not None:
                        last[name] = result
            del held
        return
    for name, N, K in a.shapes:
        for dname in a.dtype:
            ws = weights(N, K, dtypes[dname])
            last = None  # (M, seconds per product) of the previous M, for the estimate
            for M in a.m:
                result = measure(name, dname, K, ws, M, last)
                if result is not None:
                    last = result
            del ws


if __name__ == "__main__":
    main()
