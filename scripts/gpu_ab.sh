#!/usr/bin/env bash
# gpu_ab.sh — an A/B measurement of a change with `qmm bench`, on a machine without git (the lent GPU machine gets a
# copy of the working tree, no .git): the tree as it is is B; A is the same tree with PATCH reversed (`git apply -R`,
# which needs no repository). Both are built side by side (Release, the qmm target only), then `qmm bench ARGS...`
# runs A, B, A, B, ... (ROUNDS times each, alternating, so that drift of the machine falls on both), and the best time
# of each cell's selected row (and of every row both runs measured) is compared: per cell B ÷ A, and the geometric
# mean per M (or T, with --gather). docs/PERF.md's "A/B" entries were measured this way.
#
#   scripts/gpu_ab.sh [-r ROUNDS] [-o DIR] PATCH -- BENCH ARGS...
#   scripts/gpu_ab.sh [-r ROUNDS] [-o DIR] -p BINS -- BENCH ARGS...
#   e.g. git diff main > change.patch   (here, where git is)
#        scripts/gpu_ab.sh change.patch -- --backend cuda --no-peers --shapes seed --m 1,8,16 --dtype bf16
#
# PATCH: the change as `git diff` prints it, relative to A (its paths inside the tree). -p: no builds here — BINS is
# the tarball of scripts/pack_ab_bins.sh (A's and B's qmm, built on another machine from this tree and PATCH), unpacked
# into DIR; both sides then read bench/shapes/ of this tree (QMM_SOURCE_DIR: B's, where PATCH mode gives A its own
# copy — it matters only for a patch to bench/shapes/). -r: rounds (default 2).
# -o: where the builds, their logs, each run's JSON and table, and the comparison go (default build-ab/; A's source
# is a temporary copy, removed at the end). The bench's
# --json is added here; give every other argument as for `qmm bench` (with --no-peers: A's copy has no .venv, so the
# CPU peers would run in B's rounds only). Needs cmake, python3 and a C compiler (and the
# CUDA toolkit for --backend cuda); cJSON as for the build (.deps/cjson is used when present, README "GPU"). CMAKE_FLAGS
# (environment) goes to both configures, as with make (e.g. -DQMM_WITH_CUDA=OFF for a CPU-only A/B). With -p: python3,
# tar and xz only (and cJSON for the binaries).
# Exit status: 0; 1 with the failing step named; 2 for a usage error.
set -euo pipefail
tree=$(cd "$(dirname "$0")/.." && pwd)
rounds=2
out=$tree/build-ab
bins=
usage="usage: scripts/gpu_ab.sh [-r ROUNDS] [-o DIR] PATCH -- BENCH ARGS...  or  [-r ROUNDS] [-o DIR] -p BINS -- BENCH ARGS..."
while getopts "r:o:p:" option; do
  case $option in
  r) rounds=$OPTARG ;;
  o) out=$OPTARG ;;
  p) bins=$OPTARG ;;
  *) echo "$usage" >&2; exit 2 ;;
  esac
done
ended=${*:OPTIND-1:1} # getopts takes a "--" right after the options (-p BINS --) and stops at PATCH (PATCH --)
shift $((OPTIND - 1))
[[ $rounds =~ ^[1-9][0-9]?$ ]] || { echo "gpu_ab: -r '$rounds' is not a whole number from 1 to 99" >&2; exit 2; }
if [ -n "$bins" ]; then
  [ "$ended" = "--" ] && [ $OPTIND -gt 1 ] || { echo "$usage" >&2; exit 2; }
  [ -f "$bins" ] || { echo "gpu_ab: -p '$bins' is not a file" >&2; exit 2; }
  bins=$(cd "$(dirname "$bins")" && pwd)/$(basename "$bins")
else
  [ $# -ge 2 ] && [ "$2" = "--" ] || { echo "$usage" >&2; exit 2; }
  [ -f "$1" ] || { echo "gpu_ab: PATCH '$1' is not a file" >&2; exit 2; }
  patch=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") # PATCH, -p and -o are taken from where the script was started
  shift 2
fi
mkdir -p "$out" 2>/dev/null && [ -w "$out" ] || { echo "gpu_ab: -o '$out' is not a folder that can be written" >&2; exit 2; }
out=$(cd "$out" && pwd)
cd "$tree"
rm -f "$out"/[ab]-*.json "$out"/[ab]-*.txt "$out"/[ab]-*.err "$out/compare.txt" # an earlier run's

source scripts/deps_env.sh # cJSON from .deps/cjson when present; the CUDA toolkit on PATH

if [ -n "$bins" ]; then
  rm -rf "$out/build-a" "$out/build-b"
  tar -xf "$bins" -C "$out" ||
    { echo "gpu_ab: -p '$bins' could not be unpacked into $out" >&2; exit 1; }
  for side in a b; do
    [ -x "$out/build-$side/qmm" ] || { echo "gpu_ab: -p '$bins' holds no build-$side/qmm (scripts/pack_ab_bins.sh writes both)" >&2; exit 1; }
  done
  export QMM_SOURCE_DIR=$tree # the packed binaries were built elsewhere: bench/shapes/ of this tree
else

# A: a copy of the tree with the patch reversed, outside any git repository (scripts/ab_tree.sh)
a_tree=$(mktemp -d "${TMPDIR:-/tmp}/qmm-ab-a.XXXXXX")
pids=() # builds still running: on an early exit they are stopped, with every process under them
kill_tree() { local child; for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done; kill "$1" 2>/dev/null || true; }
trap 'for pid in "${pids[@]}"; do kill_tree "$pid"; done; rm -rf "$a_tree"' EXIT
source scripts/ab_tree.sh
ab_reversed_tree gpu_ab "$a_tree" "$patch" "${out#"$tree"/}" || exit 1 # an -o inside the tree is not copied into A
jobs=$(( ($(nproc) + 1) / 2 ))
build() { # build NAME SOURCE: the qmm target in $out/build-NAME (A's source is a new folder each run: a fresh build)
  [ "$1" = b ] || rm -rf "$out/build-$1"
  rm -f "$out/$1-configure.log" "$out/$1-build.log"
  cmake -S "$2" -B "$out/build-$1" -DCMAKE_BUILD_TYPE=Release ${CMAKE_FLAGS:-} >"$out/$1-configure.log" 2>&1 &&
    cmake --build "$out/build-$1" -j "$jobs" --target qmm_cli >"$out/$1-build.log" 2>&1
}
build a "$a_tree" & a_pid=$!
pids+=("$a_pid")
build b "$PWD" & b_pid=$!
pids+=("$b_pid")
wait $a_pid || { tail -n 20 "$out/a-build.log" "$out/a-configure.log" 2>/dev/null; echo "gpu_ab: building A failed" >&2; exit 1; }
wait $b_pid || { tail -n 20 "$out/b-build.log" "$out/b-configure.log" 2>/dev/null; echo "gpu_ab: building B failed" >&2; exit 1; }
fi

for round in $(seq "$rounds"); do
  for side in a b; do
    echo "gpu_ab: round $round, $side: qmm bench $*" >&2
    "$out/build-$side/qmm" bench "$@" --json "$out/$side-$round.json" >"$out/$side-$round.txt" 2>"$out/$side-$round.err" ||
      { tail -n 20 "$out/$side-$round.err"; echo "gpu_ab: qmm bench ($side, round $round) failed" >&2; exit 1; }
  done
done

pids=()
python3 - "$out" "$rounds" <<'PY' | tee "$out/compare.txt"
import json, math, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def best(side):  # (shape, M, dtype) -> {"selected": (name, µs), row name: µs}, the best of this run's rounds
    cells = {}
    for path in [f"{out}/{side}-{r}.json" for r in range(1, rounds + 1)]:
        for cell in json.load(open(path))["cells"]:
            entry = cells.setdefault((cell["shape"], cell["M"], cell["dtype"]), {})
            for row in cell["kernels"]:
                if row["us"] is None:
                    continue
                entry[row["name"]] = min(entry.get(row["name"], math.inf), row["us"])
                if row.get("selected"):
                    old = entry.get(" selected")
                    if old is None or row["us"] < old[1]:
                        entry[" selected"] = (row["name"], row["us"])
    return cells
a, b = best("a"), best("b")
print(f"B ÷ A, best of {rounds} runs each, alternating; the selected row of each cell (A's name → B's if it changed)")
by_m, by_row = {}, {}
for key in sorted(a, key=lambda k: (k[1], k[0], k[2])):
    if key not in b:
        continue
    for row, us in a[key].items():  # every row both measured, whether or not the selector took it
        if row != " selected" and row in b[key]:
            by_row.setdefault(row, []).append(b[key][row] / us)
    if " selected" not in a[key] or " selected" not in b[key]:
        continue  # e.g. a --kernel row the selector does not take in this cell
    (name_a, us_a), (name_b, us_b) = a[key][" selected"], b[key][" selected"]
    ratio = us_b / us_a
    by_m.setdefault(key[1], []).append(ratio)
    change = "" if name_a == name_b else f" → {name_b}"
    print(f"  {key[0]:<32} M={key[1]:<5} {key[2]:<5} {us_a:9.2f} → {us_b:9.2f} µs  {ratio:6.3f}  {name_a}{change}")
geomean = lambda values: math.exp(sum(map(math.log, values)) / len(values))
print("geometric mean of B ÷ A, selected row, per M:")
for m, values in sorted(by_m.items()):
    print(f"  M={m:<5} {geomean(values):.3f} ({min(values):.3f}–{max(values):.3f}, {len(values)} cells)")
print("geometric mean of B ÷ A per row (every cell both measured it in):")
for row, values in sorted(by_row.items()):
    print(f"  {row:<44} {geomean(values):.3f} ({min(values):.3f}–{max(values):.3f}, {len(values)} cells)")
PY
