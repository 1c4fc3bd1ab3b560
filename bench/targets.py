#!/usr/bin/env python3
"""targets.py — issue 8's speed targets, met or missed, from a `qmm bench --backend cuda --json` file.

Usage: python3 bench/targets.py RUN.json[.xz] ...

Each RUN is a sweep over the seed shapes (and optionally Qwen3's), e.g. `qmm bench --backend cuda --shapes seed,qwen3
--m 1,2,4,8,16,32,64,128,256,512,2048 --dtype f16,bf16 --selector-only --json RUN.json` (with the peers); a run with
--batch-invariant (its 'bi' rows beside the default's) gives the mode's cost. Prints, per file, one line per target:
the cells it applies to, how many meet it, the range and the worst cell (shape, M, dtype, value). Time is the
selector's kernel (the row marked `selected`); the targets (issue 8, "Targets"; H200, f16 and bf16, 4-bit group 64 — the default sweep's format):
  M = 32 and 64 ≤ 1.5× the floor on every seed shape; M = 128 ≤ 1.5×; M = 512 and 2048 ≤ 1.15× and ≤ cuBLAS dense in
  the same dtype; faster than torch int4 and MLX CUDA in every cell, than cuBLAS dense in every cell with M ≤ 256;
  the selector's kernel the fastest or within 5 % in ≥ 90 % of cells (only from a run that measured every kernel, i.e.
  without --selector-only); batch-invariant within 1.3× the default at M ≥ 128 (cells, and the geomean per M).
A target with no cell in the file (a peer absent, a dtype not run) says so rather than passing.
"""
import json
import lzma
import math
import sys

from bench_json import positive, show


class BadInput(Exception):
    pass


def load(path):
    """The bench JSON at path (xz-compressed where it ends in .xz), its cells checked field by field; BadInput names the
    file, the cell and the field that is wrong."""
    opener = lzma.open if path.endswith(".xz") else open
    try:
        with opener(path, "rt") as f:
            run = json.load(f)
    except (OSError, lzma.LZMAError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read {path}: {e}")
    except (ValueError, RecursionError) as e:  # json.JSONDecodeError is a ValueError; so is an over-long integer
        raise BadInput(f"{path} is not JSON this script reads: {str(e)[:200]}")
    if not isinstance(run, dict) or not isinstance(run.get("cells"), list):
        raise BadInput(f"{path} has no 'cells' list: not a qmm bench --json file")
    for i, c in enumerate(run["cells"]):
        check_cell(path, i, c)
    return run


def check_cell(path, i, c):
    def bad(what):
        raise BadInput(f"{path}: cell {i}: {what}: not a qmm bench --json file")

    if not isinstance(c, dict):
        bad("not an object")
    missing = [k for k in ("shape", "M", "dtype", "floor_us", "kernels") if k not in c]
    if missing:
        bad(f"lacks {', '.join(missing)}")
    if not isinstance(c["shape"], str) or not isinstance(c["dtype"], str):
        bad("shape and dtype must be strings")
    if not isinstance(c["M"], int) or isinstance(c["M"], bool) or c["M"] < 1:
        bad(f"M={show(c['M'])} is not a whole number ≥ 1")
    if not positive(c["floor_us"]):
        bad(f"floor_us={show(c['floor_us'])} is not a finite number > 0")
    if c.get("selector_fastest") is not None and not isinstance(c["selector_fastest"], bool):
        bad(f"selector_fastest={show(c['selector_fastest'])} is not true, false or null")
    for key in ("kernels", "peers"):
        rows = c.get(key, [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            bad(f"{key} must be a list of objects")
        for r in rows:
            if not isinstance(r.get("name"), str):
                bad(f"a {key[:-1]} without a name string")
            if r.get("us") is not None and not positive(r["us"]):
                bad(f"{r['name']}: us={show(r['us'])} is not null or a finite number > 0")
            for flag in ("selected", "batch_invariant"):
                if r.get(flag) is not None and not isinstance(r[flag], bool):
                    bad(f"{r['name']}: {flag}={show(r[flag])} is not true or false")


def selected_us(cell):
    for k in cell["kernels"]:
        if k.get("selected"):
            return k.get("us")  # None: a row that failed or was skipped
    return None


def invariant_us(cell):
    """The batch-invariant row's time (qmm bench --batch-invariant), or None."""
    for k in cell["kernels"]:
        if k.get("batch_invariant") and k.get("us") is not None:
            return k["us"]
    return None


def peer_us(cell, prefix):
    for p in cell.get("peers", []):
        if p["name"].startswith(prefix) and p.get("us") is not None:
            return p["us"]
    return None


def where(cell):
    return f"{cell['shape']} M={cell['M']} {cell['dtype']}"


def report(name, rows, ok, why_none=""):
    """rows: (cell, value) pairs; ok(value) -> bool. Prints met/total and the worst cell (largest value); without
    cells, that and why_none (e.g. the run's reason for an absent peer)."""
    rows = [(c, v) for c, v in rows if v is not None]
    if not rows:
        print(f"{name}: no cells in this file" + (f" ({why_none})" if why_none else ""))
        return
    met = sum(1 for _, v in rows if ok(v))
    worst = max(rows, key=lambda r: r[1])
    lo = min(v for _, v in rows)
    verdict = "met" if met == len(rows) else "missed"
    print(f"{name}: {verdict}, {met}/{len(rows)} cells; range {lo:.2f}–{worst[1]:.2f} (worst {where(worst[0])})")


def targets(path):
    run = load(path)
    if run.get("backend") != "cuda":
        raise BadInput(f"{path} is a '{run.get('backend')}' run; the targets are the CUDA backend's")
    cells = [c for c in run["cells"] if c["dtype"] in ("f16", "bf16") and selected_us(c) is not None]
    seed = [c for c in cells if c["shape"].startswith("seed.")]
    machine, fmt = run.get("machine", {}), run.get("format", {})
    print(f"# {machine.get('gpu', machine) if isinstance(machine, dict) else machine}; {path}; {len(cells)} f16/bf16 cells"
          f" ({len(seed)} seed)")
    if not isinstance(fmt, dict) or (fmt.get("bits"), fmt.get("group_size")) != (4, 64):
        print(f"# note: the targets are stated for 4-bit group 64; this run's format is {fmt}")

    def ratio(c):
        return selected_us(c) / c["floor_us"]

    report("M = 32 and 64, seed: ≤ 1.5× floor", [(c, ratio(c)) for c in seed if c["M"] in (32, 64)], lambda v: v <= 1.5)
    report("M = 128, seed: ≤ 1.5× floor", [(c, ratio(c)) for c in seed if c["M"] == 128], lambda v: v <= 1.5)
    report("M = 512 and 2048, seed: ≤ 1.15× floor", [(c, ratio(c)) for c in seed if c["M"] in (512, 2048)],
           lambda v: v <= 1.15)

    def vs(c, prefix):  # qmm's time ÷ the peer's: < 1 is faster
        p = peer_us(c, prefix)
        return selected_us(c) / p if p else None

    def absent(prefix):
        """Why a peer has no cells: the run's own line for it (peers_absent), or --no-peers."""
        lines = run.get("peers_absent")
        for line in lines if isinstance(lines, list) else []:
            if isinstance(line, str) and line.startswith(prefix):
                return line
        return "the run was --no-peers" if "--no-peers" in str(run.get("command", "")).split() else ""

    report("M = 512 and 2048: ≤ cuBLAS dense (time ÷ cuBLAS)",
           [(c, vs(c, "cublas")) for c in cells if c["M"] in (512, 2048)], lambda v: v <= 1.0, absent("cublas"))
    report("M ≤ 256: faster than cuBLAS dense (time ÷ cuBLAS)",
           [(c, vs(c, "cublas")) for c in cells if c["M"] <= 256], lambda v: v < 1.0, absent("cublas"))
    report("every cell: faster than torch int4 (time ÷ torch)", [(c, vs(c, "torch-int4")) for c in cells],
           lambda v: v < 1.0, absent("torch-int4"))
    report("every cell: faster than MLX CUDA (time ÷ MLX)", [(c, vs(c, "mlx")) for c in cells], lambda v: v < 1.0,
           absent("mlx"))
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
    rows = [(c, invariant_us(c) / selected_us(c)) for c in cells if c["M"] >= 128 and invariant_us(c) is not None]
    if not run.get("batch_invariant"):
        print("batch-invariant ÷ default at M ≥ 128: ≤ 1.3: not measured by this run (no --batch-invariant)")
        return
    report("batch-invariant ÷ default at M ≥ 128: ≤ 1.3 (cells)", rows, lambda v: v <= 1.3)
    if rows:
        print("  (the verdict is per cell; the geomeans below give the mode's typical cost)")
    for m in sorted({c["M"] for c, _ in rows}):
        for dtype in ("f16", "bf16"):
            vals = [v for c, v in rows if c["M"] == m and c["dtype"] == dtype]
            if vals:
                print(f"  M = {m} {dtype}: geomean {math.exp(sum(map(math.log, vals)) / len(vals)):.2f} over {len(vals)} cells")


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stdout if len(argv) >= 2 else sys.stderr)  # asked for, or a usage error
        return 0 if len(argv) >= 2 else 2
    for path in argv[1:]:
        targets(path)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except BadInput as e:
        print(f"targets.py: {e}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:  # the reader went away (| head): no traceback
        sys.stderr.close()
        sys.exit(1)
