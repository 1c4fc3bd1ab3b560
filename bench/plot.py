#!/usr/bin/env python3
"""Draws `qmm bench --json` results: time / floor against M (T for a gather run), one panel per shape, one line style
per dtype. 1.0 is the physical floor.

    .venv/bin/python bench/plot.py bench/results/bench-cpu-....json [-o out.png]
    .venv/bin/python bench/plot.py bench/results/bench-cuda-....json.xz   (the stored results are xz-compressed)
    .venv/bin/python bench/plot.py --selected-only RESULTS   (the selector's kernel and the peers: no forced rows)

Lines: "qmm selector" (thick) is the selector's kernel, whichever one it took at each M; in a --batch-invariant run
"qmm selector (batch-invariant)" (thick) is the mode's row of each cell. Thin lines: each kernel forced by name (not
drawn for --selected-only, nor for a --selector-only run, where they would trace the selector's line) and each peer.
A line breaks where its kernel was not measured. A kernel has the same colour in every panel; one legend for the
figure, beside the panels.

Needs matplotlib (pip install -r bench/requirements.txt). A file that is not a `qmm bench --json` result is refused
with a line naming the cell and the value."""
import argparse
import json
import lzma
import math
import sys

from bench_json import positive, show

STYLES = {"f32": "-", "f16": "--", "bf16": ":"}
SELECTOR, SELECTOR_BI = "qmm selector", "qmm selector (batch-invariant)"


def check(d, bad):
    """Refuses (through bad(message)) a file the drawing would misread; returns the cells."""
    if not isinstance(d, dict) or not isinstance(d.get("cells"), list):
        bad('not a `qmm bench --json` result (no "cells" list; a `qmm tune` table?)')
    if not d["cells"]:
        bad("has no cells")
    for i, c in enumerate(d["cells"]):
        if not isinstance(c, dict):
            bad(f"cell {i} is not an object")
        where = f"cell {i} ({show(c.get('shape'))}, M={show(c.get('M'))}, {show(c.get('dtype'))})"
        for key in ("shape", "dtype"):
            if not isinstance(c.get(key), str) or not c[key]:
                bad(f"{where}: {show(key)} is {show(c.get(key))}, not a name")
        for key in ("M", "N", "K"):
            if not positive(c.get(key)):
                bad(f"{where}: {show(key)} is {show(c.get(key))}, not a number > 0")
        for key in ("kernels", "peers"):
            rows = c.get(key)
            if not isinstance(rows, list):
                bad(f"{where}: {show(key)} is {show(rows)}, not a list")
            for j, r in enumerate(rows):
                if not isinstance(r, dict) or not isinstance(r.get("name"), str) or not r["name"]:
                    bad(f"{where}: {key} row {j} has no name")
                if "x_floor" not in r or not (r["x_floor"] is None or positive(r["x_floor"])):
                    bad(f"{where}: {r['name']}: x_floor is {show(r.get('x_floor', 'missing'))}, not a number > 0 or null")
                for flag in ("selected", "batch_invariant"):
                    if not isinstance(r.get(flag, False), bool):
                        bad(f"{where}: {r['name']}: {show(flag)} is {show(r[flag])}, not true or false")
        for flag, what in (("selected", "selected"), ("batch_invariant", "batch-invariant")):
            if sum(r.get(flag) is True for r in c["kernels"]) > 1:
                bad(f"{where}: more than one kernel row marked {what}")
    return d["cells"]


def series_of(cells, forced):
    """{(label, dtype): {M: time ÷ floor}} of one shape's cells: the selector (and the batch-invariant mode's row),
    each kernel when forced is true, each peer."""
    series = {}
    for c in cells:
        for k in c["kernels"]:
            if k["x_floor"] is None:
                continue
            bi = k.get("batch_invariant") is True
            if k.get("selected") is True or bi:
                series.setdefault((SELECTOR_BI if bi else SELECTOR, c["dtype"]), {})[c["M"]] = k["x_floor"]
            if forced and not bi:
                series.setdefault((k["name"], c["dtype"]), {})[c["M"]] = k["x_floor"]
        for p in c["peers"]:
            if p["x_floor"] is not None:
                series.setdefault(("peer " + p["name"], c["dtype"]), {})[c["M"]] = p["x_floor"]
    return series


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="a JSON file written by qmm bench --json (or that file xz-compressed: NAME.json.xz)")
    p.add_argument("-o", "--output", help="PNG to write (default: the JSON's name with .png)")
    p.add_argument("--selected-only", action="store_true",
                   help="draw only the selector's kernel (and a --batch-invariant run's mode) and the peers")
    a = p.parse_args()

    def bad(message):
        sys.exit(f"plot.py: {a.results}: {message}")

    try:
        with (lzma.open(a.results, "rt") if a.results.endswith(".xz") else open(a.results)) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        bad(f"not JSON ({e}): give the file qmm bench --json wrote (the .txt files are the printed tables)")
    except RecursionError:
        bad("not JSON this script can read (nested too deeply)")
    except (OSError, ValueError, EOFError, lzma.LZMAError) as e:
        sys.exit(f"plot.py: cannot read {a.results}: {e}")
    cells = check(d, bad)
    stem = a.results[:-3] if a.results.endswith(".xz") else a.results
    out = a.output or (stem[:-5] if stem.endswith(".json") else stem) + ".png"
    if not out.lower().endswith(".png"):
        sys.exit(f"plot.py: -o {out}: the output is a PNG (a name ending in .png)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py: matplotlib is missing: pip install -r bench/requirements.txt (into .venv)")

    shapes = list(dict.fromkeys(c["shape"] for c in cells))
    forced = not a.selected_only and d.get("selector_only") is not True
    panels = {s: series_of([c for c in cells if c["shape"] == s], forced) for s in shapes}
    labels = sorted({label for s in panels.values() for label, _ in s}, key=lambda n: (not n.startswith("qmm "), n))
    if not labels:
        bad("no row has a time to draw" + (" (no selected rows: a --kernel run? drop --selected-only)"
                                           if a.selected_only else ""))
    # one colour per line label across panels: the selector black (its batch-invariant mode red), the peers Dark2's
    # colours, the kernels tab20's (past 20 kernels the markers change)
    peers = [n for n in labels if n.startswith("peer ")]
    kernels = [n for n in labels if not n.startswith(("peer ", "qmm "))]
    colour = {SELECTOR: "black", SELECTOR_BI: "tab:red"}
    colour.update({n: plt.cm.Dark2.colors[i % 8] for i, n in enumerate(peers)})
    colour.update({n: plt.cm.tab20.colors[i % 20] for i, n in enumerate(kernels)})
    marker = {n: "osD^v"[(i // 20) % 5] for i, n in enumerate(kernels)}
    marker.update({n: "o" if n.startswith("qmm ") else "s" for n in labels if n not in marker})
    cols = min(3, len(shapes))
    rows = math.ceil(len(shapes) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False, layout="constrained")
    x_name = "T (tokens)" if d.get("op") == "gather" else "M"
    handles = {}
    for i, shape in enumerate(shapes):
        ax = axes[i // cols][i % cols]
        ms_of = {}
        for c in cells:
            if c["shape"] == shape:
                ms_of.setdefault(c["dtype"], set()).add(c["M"])
        for (label, dtype), points in sorted(panels[shape].items(), key=lambda e: (labels.index(e[0][0]), e[0][1])):
            ms = sorted(ms_of[dtype])
            thick = label.startswith("qmm ")
            (line,) = ax.plot(ms, [points.get(m, math.nan) for m in ms], STYLES.get(dtype, "-."), color=colour[label],
                              marker=marker[label], markersize=3, linewidth=2.5 if thick else 1.0,
                              zorder=3 if thick else 2)
            name = label if label.endswith(" " + dtype) else f"{label} {dtype}"  # "peer cublas dense f16": once
            handles.setdefault(name, line)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        first = next(c for c in cells if c["shape"] == shape)
        ax.set_title(f"{shape} ({first['N']}×{first['K']})", fontsize=9)
        ax.set_xlabel(x_name)
        ax.set_ylabel("time ÷ floor")
    for j in range(len(shapes), rows * cols):
        axes[j // cols][j % cols].axis("off")
    if cols < 3:  # beside one or two panels the legend would sit under the figure's title: below them instead
        fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", fontsize=6,
                   ncol=min(3 * cols, len(handles)))
    else:
        fig.legend(list(handles.values()), list(handles.keys()), loc="outside right upper", fontsize=6,
                   ncol=max(1, math.ceil(len(handles) / (18 * rows + 6))))
    m = d.get("machine") if isinstance(d.get("machine"), dict) else {}
    ceil = d.get("ceilings") if isinstance(d.get("ceilings"), dict) else {}
    title = f"qmm bench {d.get('backend', '?')}" + (f", {d['date']}" if isinstance(d.get("date"), str) else "")
    fmt = d.get("format") if isinstance(d.get("format"), dict) else {}
    if positive(fmt.get("bits")) and positive(fmt.get("group_size")):
        title += f", {fmt['bits']}-bit group {fmt['group_size']}"
    title += ", --selector-only" if d.get("selector_only") is True else ""
    title += ", a batch-invariant run" if d.get("batch_invariant") is True else ""
    absent = [line.split(":")[0] for line in d["peers_absent"] if isinstance(line, str)] \
        if isinstance(d.get("peers_absent"), list) else []
    title += f" (peers absent: {', '.join(absent)})" if absent else ""
    if positive(ceil.get("copy_gbps")) and positive(ceil.get("matrix_peak_gflops")):
        title += f"\ncopy {ceil['copy_gbps']:.1f} GB/s, peak {ceil['matrix_peak_gflops']:.0f} GFLOP/s"
    machine = m.get("gpu") or m.get("cpu")
    fig.suptitle(title + (f"\n{machine}" if isinstance(machine, str) else ""), fontsize=10)
    try:
        fig.savefig(out, dpi=110)
    except (OSError, ValueError) as e:
        sys.exit(f"plot.py: cannot write {out}: {e}")
    print(out)


if __name__ == "__main__":
    main()
