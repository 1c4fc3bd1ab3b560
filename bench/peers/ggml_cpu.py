#!/usr/bin/env python3
"""qmm bench peer (c): llama.cpp's CPU matmul — ggml's ggml_mul_mat on Q4_0 and Q4_1 weights with f32
activations, through PyPI ggml-python (bench/peers/requirements.txt; `scripts/setup.sh bench` installs it into
.venv, building ggml from source with this CPU's flags). Timed the way `qmm bench` times qmm
(bench/peers/README.md): per (shape, type) the weights in `copies` independent tensors (totalling > 2x the
cache), one graph with a ggml_mul_mat per copy (out_i[M, N] = x[M, K] · W_iᵀ), computed with --threads threads
(the bench's count); time per product = graph time / copies; median of --repeats runs after one warm-up.

What ggml does differently (so the comparison is read right): for Q4_0/Q4_1 it first quantizes x to 8 bits
(Q8_0/Q8_1) and takes integer dot products, so its result is not within qmm's f32 error bound; Q4_0/Q4_1 are
fixed at 4 bits and blocks of 32 (qmm's cell is 4-bit gs64: the same weight bits, more (scale, bias) pairs).
Reported as peers "ggml-q4_0" and "ggml-q4_1"; the dtype column is the activation dtype qmm used (ggml always
takes f32 activations here, so bf16 cells repeat the f32 measurement, said in the note)."""
import ctypes
import statistics
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _common import absent, copies_for, emit, parse_args, progress  # noqa: E402

PEER = "ggml"


def main():
    a = parse_args(__doc__)
    try:
        import ggml
        import numpy as np
    except Exception as e:  # noqa: BLE001
        absent(PEER, f"cannot import ggml (ggml-python; scripts/setup.sh bench installs it): "
                     f"{e.__class__.__name__}: {e}")
    if a.bits != 4:
        absent(PEER, f"ggml's Q4_0/Q4_1 are 4-bit; this run is --bits {a.bits}")
    threads = a.threads or __import__("os").cpu_count() or 1
    isa = "AVX-512" if ggml.ggml_cpu_has_avx512() else "AVX2" if ggml.ggml_cpu_has_avx2() else "no AVX2"
    version = f"ggml-python 0.0.45 ({isa}), {threads} thread{'s' if threads != 1 else ''}"
    types = [("q4_0", ggml.GGML_TYPE_Q4_0), ("q4_1", ggml.GGML_TYPE_Q4_1)]
    rng = np.random.default_rng(7)
    for name, N, K in a.shapes:
        for tname, gtype in types:
            peer = f"{PEER}-{tname}"
            row_bytes = ggml.ggml_row_size(gtype, K)
            per_copy = row_bytes * N
            copies = copies_for(a.cache_bytes, per_copy, a.quick)
            overhead = ggml.ggml_tensor_overhead()
            wctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=copies * (per_copy + overhead) + (1 << 20),
                                                        mem_buffer=None, no_alloc=False))
            if not wctx:
                absent(PEER, f"ggml_init failed for {copies} copies of {per_copy} bytes")
            # Quantize one random matrix with ggml's own quantizer, then copy its bytes into every copy.
            w32 = (rng.standard_normal((N, K), dtype=np.float32) * 0.02).astype(np.float32)
            ws = []
            first = None
            for c in range(copies):
                w = ggml.ggml_new_tensor_2d(wctx, gtype, K, N)
                if first is None:
                    ggml.ggml_quantize_chunk(gtype, w32.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                             ggml.ggml_get_data(w), 0, N, K, None)
                    first = w
                else:
                    ctypes.memmove(ggml.ggml_get_data(w), ggml.ggml_get_data(first), per_copy)
                ws.append(w)
            del w32
            last = None
            measured = {}
            for M in a.m:
                if last is not None:
                    estimate = last[1] * max(1.0, M / last[0]) * copies * (a.repeats + 1)
                    if estimate > a.limit_s:
                        for dname in a.dtype:
                            emit(peer=peer, shape=name, M=M, dtype=dname,
                                 skipped=f"skipped: would take ~{estimate:.0f} s (> --limit-s {a.limit_s:g})")
                        continue
                # x (f32), the outputs, the graph and ggml's work buffer (x quantized to 8 bits) in one context.
                # ggml's work buffer (x converted for each product's dot-product type) is sized by its own plan;
                # 8·M·K bytes cover it with room (4·M·K fell 3 MB short at M = 512, K = 14336 with Q4_1: ggml
                # stopped with "not enough space in the context's memory pool" and a segmentation fault).
                mem = (M * K * 4 + copies * M * N * 4 + 8 * M * K + (copies + 2) * overhead
                       + ggml.ggml_graph_overhead() + (32 << 20))
                ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))
                x = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F32, K, M)
                xs = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(x), ctypes.POINTER(ctypes.c_float)),
                                           shape=(M * K,))
                xs[:] = rng.uniform(-1, 1, M * K).astype(np.float32)
                graph = ggml.ggml_new_graph(ctx)
                for w in ws:
                    ggml.ggml_build_forward_expand(graph, ggml.ggml_mul_mat(ctx, w, x))
                samples = []
                t = 0.0
                for r in range(a.repeats + 1):
                    t0 = time.perf_counter()
                    ggml.ggml_graph_compute_with_ctx(ctx, graph, threads)
                    t = (time.perf_counter() - t0) / copies
                    if r > 0:
                        samples.append(t)
                    elif t * copies * a.repeats > a.limit_s:
                        break  # one run is enough to know it is too slow; report the warm-up alone
                ggml.ggml_free(ctx)
                if not samples:
                    samples = [t]
                us = statistics.median(samples) * 1e6
                last = (M, us * 1e-6)
                measured[M] = us
                for i, dname in enumerate(a.dtype):
                    note = f"{version}, f32 x (quantized to 8 bits inside), {copies} copies, median of {len(samples)}"
                    if dname != "f32":
                        note += f"; ggml takes f32 x: the {dname} cell shows the f32 time"
                    emit(peer=peer, shape=name, M=M, dtype=dname, us=us, note=note)
                progress(f"bench peer {peer} {name} M={M}: {us:.1f} µs")
            ggml.ggml_free(wctx)


if __name__ == "__main__":
    main()
