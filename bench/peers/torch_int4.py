#!/usr/bin/env python3
"""qmm bench peer (CUDA): PyTorch's int4 weight-only matmul, torch._weight_int4pack_mm, timed the way `qmm bench`
times qmm on CUDA (bench/peers/README.md): random int4 weights packed by torch._convert_weight_to_int4pack in
`copies` independent copies (totalling > 2x the L2, --cache-bytes), random x[M, K]; the products over all copies
captured once as a CUDA graph; one warm-up replay, then --repeats replays timed with CUDA events; time per
product = replay time / copies; the median is reported. --bits must be 4 (the kernel is int4 only).
Absent (with the reason) when torch, CUDA or the op is missing."""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import absent, copies_for, emit, parse_args, progress  # noqa: E402

PEER = "torch-int4"


def pack(torch, N, K, inner_k_tiles, device):
    """Random int4 codes packed for _weight_int4pack_mm (the uint8 [N, K/2] input of torch >= 2.5, else the
    int32 [N, K] input of older releases)."""
    codes = torch.randint(0, 16, (N, K), dtype=torch.int32, device=device)
    try:
        u8 = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8)
        return torch._convert_weight_to_int4pack(u8, inner_k_tiles)
    except (RuntimeError, TypeError):
        return torch._convert_weight_to_int4pack(codes, inner_k_tiles)


def main():
    a = parse_args(__doc__)
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        absent(PEER, f"cannot import torch ({e.__class__.__name__}: {e})")
    if not torch.cuda.is_available():
        absent(PEER, f"torch {torch.__version__} sees no CUDA device")
    if not hasattr(torch, "_weight_int4pack_mm") or not hasattr(torch, "_convert_weight_to_int4pack"):
        absent(PEER, f"torch {torch.__version__} has no _weight_int4pack_mm")
    if a.bits != 4:
        absent(PEER, f"--bits {a.bits}: torch._weight_int4pack_mm is int4 only")
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
    note = f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}"
    for name, N, K in a.shapes:
        for dname in a.dtype:
            dt = dtypes[dname]
            per_copy = N * K // 2 + 2 * (K // a.group_size) * N * 2
            copies = copies_for(a.cache_bytes, per_copy, a.quick)
            done = set()
            try:
                ws = None
                for tiles in (8, 4, 2):
                    try:
                        ws = [pack(torch, N, K, tiles, dev) for _ in range(copies)]
                        break
                    except RuntimeError as e:
                        why = str(e).splitlines()[0]
                if ws is None:
                    raise RuntimeError(f"cannot pack {N}x{K}: {why}")
                sz = [(torch.rand(K // a.group_size, N, 2, device=dev) * 0.01).to(dt) for _ in range(copies)]
                for M in a.m:
                    x = (torch.rand(M, K, device=dev) * 2 - 1).to(dt)
                    stream = torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        for _ in range(2):  # outside the capture: first-call setup
                            torch._weight_int4pack_mm(x, ws[0], a.group_size, sz[0])
                    torch.cuda.current_stream().wait_stream(stream)
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        for i in range(copies):
                            out = torch._weight_int4pack_mm(x, ws[i], a.group_size, sz[i])
                    del out
                    graph.replay()
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    samples = []
                    for _ in range(a.repeats):
                        start.record()
                        graph.replay()
                        end.record()
                        end.synchronize()
                        samples.append(start.elapsed_time(end) * 1000.0 / copies)
                    us = statistics.median(samples)
                    emit(peer=PEER, shape=name, M=M, dtype=dname, us=us,
                         note=f"{note}, {copies} copies, one CUDA graph, events, median of {len(samples)}")
                    progress(f"bench peer {PEER} {name} M={M} {dname}: {us:.1f} µs")
                    done.add(M)
                    del graph
            except Exception as e:  # noqa: BLE001 — one cell's failure is that cell's note, not the run's end
                why = str(e).splitlines()[0] if str(e) else e.__class__.__name__
                if "kBFloat16" in why:  # torch's own words are cut off in the table: say what it means first
                    why = (f"torch {torch.__version__}'s _weight_int4pack_mm takes bf16 activations only "
                           f"({why.split('  ')[0].strip()})")
                for M in a.m:
                    if M not in done:
                        emit(peer=PEER, shape=name, M=M, dtype=dname, skipped=f"skipped: {why[:150]}")
            ws = sz = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
