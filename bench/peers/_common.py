"""Shared by the peer scripts of `qmm bench` (bench/peers/README.md): the command line the bench passes, the
JSON lines it reads back, and the rotation rule (copies of the weights totalling more than twice the cache)."""
import argparse
import json
import math
import sys


def parse_args(description, add_arguments=None):
    """The common command line; add_arguments(parser), when given, adds a script's own options first."""
    p = argparse.ArgumentParser(description=description)
    if add_arguments:
        add_arguments(p)
    p.add_argument("--shapes", required=True, help="name:N:K,... (out[M, N] = x[M, K] @ W[N, K].T)")
    p.add_argument("--m", required=True, help="1,2,4,...")
    p.add_argument("--dtype", required=True, help="f32,f16,bf16")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--cache-bytes", type=int, default=0, help="copies of the weights total > 2x this")
    p.add_argument("--limit-s", type=float, default=20.0, help="skip a cell whose measurement would take longer")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="threads for peers that take a count (0: the cores)")
    a = p.parse_args()
    try:
        a.shapes = [(n, int(N), int(K)) for n, N, K in (s.split(":") for s in a.shapes.split(","))]
        a.m = [int(v) for v in a.m.split(",")]
    except ValueError:
        p.error("--shapes wants name:N:K,... and --m 1,2,... (whole numbers)")
    a.dtype = a.dtype.split(",")
    if any(N < 1 or K < 1 for _, N, K in a.shapes) or any(m < 1 for m in a.m):
        p.error("N, K and M must be at least 1")
    if any(d not in ("f32", "f16", "bf16") for d in a.dtype):
        p.error(f"--dtype {','.join(a.dtype)}: each must be f32, f16 or bf16")
    if a.bits not in (2, 3, 4, 5, 6, 8) or a.group_size not in (32, 64, 128) or any(K % a.group_size for _, _, K in a.shapes):
        p.error("--bits must be 2-6 or 8, --group-size 32/64/128, and every K a multiple of it")
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    return a


def emit(**fields):
    """One JSON line on stdout (the bench reads these; everything else goes to stderr)."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def absent(peer, reason):
    emit(peer=peer, absent=reason)
    sys.exit(0)


def copies_for(cache_bytes, bytes_per_copy, quick=False):
    if quick or cache_bytes <= 0:
        return 2
    return int(min(512, max(2, math.ceil(2 * cache_bytes / bytes_per_copy))))


def progress(text):
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def import_mlx(peer, device="cpu"):
    """mlx.core with `device` (cpu or gpu) as the default device and one tiny product evaluated on it; the peer
    is reported absent (and the script exits) when mlx cannot be imported or cannot run there."""
    try:
        import mlx.core as mx
    except Exception as e:  # noqa: BLE001
        absent(peer, f"cannot import mlx.core ({e.__class__.__name__}: {e})")
    try:
        if device == "gpu" and not mx.is_available(mx.gpu):
            absent(peer, "mlx has no GPU device here (mlx-cuda not installed, or no GPU)")
        mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
        mx.eval(mx.ones((2,)) + 1)
    except Exception as e:  # noqa: BLE001
        absent(peer, f"mlx cannot run on {device}: {e}")
    return mx
