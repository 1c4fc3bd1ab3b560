#!/usr/bin/env python3
"""Draws `qmm bench --json` results: time / floor against M, one panel per shape, one line per kernel (the
selector's choice drawn thick) and per peer, one line style per dtype. 1.0 is the physical floor.

    .venv/bin/python bench/plot.py bench/results/bench-cpu-....json [-o out.png]
    .venv/bin/python bench/plot.py bench/results/bench-cuda-....json.xz   (the stored results are xz-compressed)
    .venv/bin/python bench/plot.py --selected-only RESULTS   (the selector's kernel and the peers: no forced rows)

A panel of more than 6 lines gets its legend beside it, not over the curves.

Needs matplotlib (pip install -r bench/requirements.txt)."""
import argparse
import json
import lzma
import math
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="a JSON file written by qmm bench --json (or that file xz-compressed: NAME.json.xz)")
    p.add_argument("-o", "--output", help="PNG to write (default: the JSON's name with .png)")
    p.add_argument("--selected-only", action="store_true",
                   help="draw only the selector's kernel and the peers (not every kernel forced by name)")
    a = p.parse_args()
    try:
        with (lzma.open(a.results, "rt") if a.results.endswith(".xz") else open(a.results)) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        sys.exit(f"plot.py: {a.results} is not JSON ({e}): give the file qmm bench --json wrote (the .txt files are the printed tables)")
    except (OSError, ValueError, EOFError, lzma.LZMAError) as e:
        sys.exit(f"plot.py: cannot read {a.results}: {e}")
    if not isinstance(d, dict) or not isinstance(d.get("cells"), list):
        sys.exit(f"plot.py: {a.results} is not a `qmm bench --json` result (no \"cells\" list; a `qmm tune` table?)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py: matplotlib is missing: pip install -r bench/requirements.txt (into .venv)")
    shapes = []
    for c in d["cells"]:
        if c["shape"] not in shapes:
            shapes.append(c["shape"])
    if not shapes:
        sys.exit(f"plot.py: {a.results} has no cells")
    cols = min(3, len(shapes))
    rows = math.ceil(len(shapes) / cols)
    # Lines per panel: a panel of more than 6 gets its legend beside it (wider panels), not over its curves.
    def lines(shape):
        n = set()
        for c in d["cells"]:
            if c["shape"] == shape:
                for k in c["kernels"]:
                    n.add(("qmm selector" if k.get("selected") else k["name"], c["dtype"]))
                    if not a.selected_only:
                        n.add((k["name"], c["dtype"]))
                n |= {("peer " + pr["name"], c["dtype"]) for pr in c["peers"]}
        return len(n)
    outside = max(lines(s) for s in shapes) > 6
    fig, axes = plt.subplots(rows, cols, figsize=((8.5 if outside else 5.5) * cols, 4 * rows), squeeze=False)
    styles = {"f32": "-", "f16": "--", "bf16": ":"}
    for i, shape in enumerate(shapes):
        ax = axes[i // cols][i % cols]
        cells = [c for c in d["cells"] if c["shape"] == shape]
        if lines(shape) > 10:  # the default cycle has 10 colours: past it two lines would share one
            ax.set_prop_cycle(color=plt.cm.tab20.colors)
        series = {}  # (label, dtype, selector?) -> [(M, x_floor)]
        for c in cells:
            for k in c["kernels"]:
                if k["x_floor"] is None:
                    continue
                if k.get("selected"):  # one thick line per dtype across M, whichever kernel the selector took
                    series.setdefault(("qmm selector", c["dtype"], True), []).append((c["M"], k["x_floor"]))
                if not a.selected_only:  # every kernel as its own thin line, the selector's cells included
                    series.setdefault((k["name"], c["dtype"], False), []).append((c["M"], k["x_floor"]))
            for pr in c["peers"]:
                if pr["x_floor"] is not None:
                    series.setdefault(("peer " + pr["name"], c["dtype"], False), []).append((c["M"], pr["x_floor"]))
        for (label, dtype, selected), points in sorted(series.items(), key=lambda e: (not e[0][2], e[0][0], e[0][1])):
            points.sort()
            ax.plot([m for m, _ in points], [v for _, v in points], styles.get(dtype, "-"), marker="o", markersize=3,
                    linewidth=2.5 if selected else 1.0, label=f"{label} {dtype}", zorder=3 if selected else 2)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        n, k = cells[0]["N"], cells[0]["K"]
        ax.set_title(f"{shape} ({n}×{k})", fontsize=9)
        ax.set_xlabel("M")
        ax.set_ylabel("time ÷ floor")
        if outside:
            ax.legend(fontsize=5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        else:
            ax.legend(fontsize=6)
    for j in range(len(shapes), rows * cols):
        axes[j // cols][j % cols].axis("off")
    m = d.get("machine", {})
    fig.suptitle(f"qmm bench {d['backend']} on {m.get('gpu') or m.get('cpu')}, {d['date']}: "
                 f"copy {d['ceilings']['copy_gbps']:.1f} GB/s, peak {d['ceilings']['matrix_peak_gflops']:.0f} GFLOP/s",
                 fontsize=10)
    fig.tight_layout()
    stem = a.results[:-3] if a.results.endswith(".xz") else a.results
    out = a.output or (stem[:-5] if stem.endswith(".json") else stem) + ".png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
