#!/usr/bin/env python3
"""targets.py — issue 8's speed targets, met or missed, from a `qmm bench --backend cuda --json` file.

Usage: python3 bench/targets.py RUN.json[.xz] [--batch-invariant BI.json[.xz]]

RUN is a sweep over the seed shapes (and optionally Qwen3's) with the peers, e.g. `qmm bench --backend cuda --shapes
seed,qwen3 --m 1,2,4,8,16,32,64,128,256,512,2048 --dtype f16,bf16 --selector-only --json RUN.json`. BI, where given,
is the same sweep with --batch-invariant (M ≥ 128 is what the target reads). Prints one line per target: the cells it
applies to, how many meet it, and the worst cell (shape, M, dtype, value). Time is the selector's kernel (the row marked
`selected`); the targets (issue 8, "Targets"; H200, f16 and bf16, 4-bit group 64 — the default sweep's format):
  M = 32 and 64 ≤ 1.5× the floor on every seed shape; M = 128 ≤ 1.5×; M = 512 and 2048 ≤ 1.15× and ≤ cuBLAS dense in
  the same dtype; faster than torch int4 and MLX CUDA in every cell, than cuBLAS dense in every cell with M ≤ 256;
  the selector's kernel the fastest or within 5 % in ≥ 90 % of cells (only from a run that measured every kernel, i.e.
  without --selector-only); batch-invariant within 1.3× the default at M ≥ 128 (geomean and cells).
A target with no cell in the file (a peer absent, a dtype not run) says so rather than passing.
"""
import json
import lzma
import math
import sys


def load(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def selected_us(cell):
    for k in cell["kernels"]:
        if k.get("selected"):
            return k["us"]
    return None


def peer_us(cell, prefix):
    for p in cell.get("peers", []):
        if p["name"].startswith(prefix) and p.get("us"):
            return p["us"]
    return None


def where(cell):
    return f"{cell['shape']} M={cell['M']} {cell['dtype']}"


def report(name, rows, ok):
    """rows: (cell, value) pairs; ok(value) -> bool. Prints met/total and the worst cell (largest value)."""
    rows = [(c, v) for c, v in rows if v is not None]
    if not rows:
        print(f"{name}: no cells in this file")
        return
    met = sum(1 for _, v in rows if ok(v))
    worst = max(rows, key=lambda r: r[1])
    lo = min(v for _, v in rows)
    verdict = "met" if met == len(rows) else "missed"
    print(f"{name}: {verdict}, {met}/{len(rows)} cells; range {lo:.2f}–{worst[1]:.2f} (worst {where(worst[0])})")


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    run = load(argv[1])
    bi = None
    if len(argv) == 4 and argv[2] == "--batch-invariant":
        bi = load(argv[3])
    elif len(argv) != 2:
        print("targets.py: expected RUN.json[.xz] [--batch-invariant BI.json[.xz]]", file=sys.stderr)
        return 2
    if run.get("backend") != "cuda":
        print(f"targets.py: {argv[1]} is a '{run.get('backend')}' run; the targets are the CUDA backend's", file=sys.stderr)
        return 2
    cells = [c for c in run["cells"] if c["dtype"] in ("f16", "bf16") and selected_us(c) is not None]
    seed = [c for c in cells if c["shape"].startswith("seed.")]
    machine = run.get("machine", {})
    print(f"# {machine.get('gpu', machine) if isinstance(machine, dict) else machine}; {argv[1]}; {len(cells)} f16/bf16 cells"
          f" ({len(seed)} seed)")

    def ratio(c):
        return selected_us(c) / c["floor_us"]

    report("M = 32 and 64, seed: ≤ 1.5× floor", [(c, ratio(c)) for c in seed if c["M"] in (32, 64)], lambda v: v <= 1.5)
    report("M = 128, seed: ≤ 1.5× floor", [(c, ratio(c)) for c in seed if c["M"] == 128], lambda v: v <= 1.5)
    report("M = 512 and 2048, seed: ≤ 1.15× floor", [(c, ratio(c)) for c in seed if c["M"] in (512, 2048)],
           lambda v: v <= 1.15)

    def vs(c, prefix):  # qmm's time ÷ the peer's: < 1 is faster
        p = peer_us(c, prefix)
        return selected_us(c) / p if p else None

    report("M = 512 and 2048: ≤ cuBLAS dense (time ÷ cuBLAS)",
           [(c, vs(c, "cublas")) for c in cells if c["M"] in (512, 2048)], lambda v: v <= 1.0)
    report("M ≤ 256: faster than cuBLAS dense (time ÷ cuBLAS)",
           [(c, vs(c, "cublas")) for c in cells if c["M"] <= 256], lambda v: v < 1.0)
    report("every cell: faster than torch int4 (time ÷ torch)", [(c, vs(c, "torch-int4")) for c in cells],
           lambda v: v < 1.0)
    report("every cell: faster than MLX CUDA (time ÷ MLX)", [(c, vs(c, "mlx")) for c in cells], lambda v: v < 1.0)
    if run.get("selector_only"):
        print("selector within 5 % of the fastest in ≥ 90 % of cells: not measured by this run (--selector-only)")
    else:
        judged = [c for c in cells if c.get("selector_fastest") is not None]
        if judged:
            fast = sum(1 for c in judged if c["selector_fastest"])
            share = fast / len(judged)
            print(f"selector within 5 % of the fastest in ≥ 90 % of cells: {'met' if share >= 0.9 else 'missed'},"
                  f" {fast}/{len(judged)} ({100 * share:.0f} %)")
        else:
            print("selector within 5 % of the fastest in ≥ 90 % of cells: no cell with more than one kernel measured")
    if bi is not None:
        default = {(c["shape"], c["M"], c["dtype"]): selected_us(c) for c in cells}
        rows = []
        for c in bi["cells"]:
            key = (c["shape"], c["M"], c["dtype"])
            if c["M"] >= 128 and key in default and selected_us(c) is not None:
                rows.append((c, selected_us(c) / default[key]))
        report("batch-invariant ÷ default at M ≥ 128: ≤ 1.3 (cells)", rows, lambda v: v <= 1.3)
        for m in sorted({c["M"] for c, _ in rows}):
            vals = [v for c, v in rows if c["M"] == m]
            print(f"  M = {m}: geomean {math.exp(sum(map(math.log, vals)) / len(vals)):.2f} over {len(vals)} cells")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
