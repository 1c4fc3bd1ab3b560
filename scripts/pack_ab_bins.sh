#!/usr/bin/env bash
# pack_ab_bins.sh — builds here (a machine with nvcc; no GPU needed) the two `qmm` binaries of an A/B measurement and
# packs them for scripts/gpu_ab.sh -p on a GPU machine that should not spend its time building (the lent H200: each
# call starts on a bare machine, and gpu_ab's two builds take 2–3 of a call's 10 minutes).
#   scripts/pack_ab_bins.sh [--tests] PATCH [OUTPUT]      (default OUTPUT: .deps/ab-bins.tar.xz, git-ignored)
# B is the working tree as it is, A the same tree with PATCH (a `git diff` relative to A) reversed; both Release, the
# qmm target (as gpu_ab.sh builds them), with CUDA required and without OpenBLAS (qmm bench's CPU peer, which the GPU
# machine may lack; A/B runs use --no-peers). PATCH and OUTPUT are taken from where the script is started. CMAKE_FLAGS (environment) is added to both configures, as with gpu_ab.sh (e.g.
# -DQMM_WITH_CUDA=OFF for a CPU-only A/B, which needs no nvcc). The builds stay in build-ab-pack/{a,b}, A's source in
# build-ab-pack/a-src, refreshed file by file: a second PATCH on the same tree rebuilds only what it touches. --tests
# also builds B's test_kernels and test_cuda (the harness and the GPU tests of the patched tree). OUTPUT holds
# build-a/qmm and build-b/qmm (and build-b/tests/kernels/test_kernels, build-b/tests/gpu/test_cuda), xz-compressed
# (about 8 MB each).
# On the GPU machine, from the tree's root (the same commit, B's working tree), with OUTPUT and .deps/cjson carried:
#   scripts/gpu_ab.sh -p .deps/ab-bins.tar.xz -- --backend cuda --no-peers --shapes seed --m 1,16 --dtype bf16
# The binaries load the CUDA runtime and cuBLAS (of this toolkit's major version) and libgomp from the GPU machine, and
# cJSON through .deps/cjson (scripts/deps_env.sh). Exit status: 0; 1 with the failing step named; 2 for a usage error.
set -euo pipefail
usage="usage: scripts/pack_ab_bins.sh [--tests] PATCH [OUTPUT]"
tests=0
[ "${1:-}" = --tests ] && { tests=1; shift; }
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "$usage" >&2; exit 2; }
for arg in "$@"; do [[ -n $arg && $arg != -* ]] || { echo "pack_ab_bins: '$arg' is not a file name ($usage)" >&2; exit 2; }; done
[ -f "$1" ] || { echo "pack_ab_bins: PATCH '$1' is not a file" >&2; exit 2; }
# PATCH and OUTPUT are taken from where the script was started
patch=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
output=${2:-$(dirname "$0")/../.deps/ab-bins.tar.xz}
mkdir -p "$(dirname "$output")" 2>/dev/null && [ -d "$(dirname "$output")" ] && [ -w "$(dirname "$output")" ] &&
  [ ! -d "$output" ] || { echo "pack_ab_bins: OUTPUT '$output' cannot be written (a folder, or in a folder that cannot be made or written)" >&2; exit 2; }
output=$(cd "$(dirname "$output")" && pwd)/$(basename "$output")
cd "$(dirname "$0")/.."
source scripts/deps_env.sh
[[ " ${CMAKE_FLAGS:-} " == *" -DQMM_WITH_CUDA=OFF "* ]] || command -v nvcc >/dev/null ||
  { echo "pack_ab_bins: nvcc is not on PATH (the CUDA toolkit is needed to build the CUDA backend)" >&2; exit 1; }
pack=build-ab-pack
mkdir -p $pack/logs
# CMake keeps a -D setting in its cache: with other CMAKE_FLAGS than last time, both builds start afresh
if [ "$(cat $pack/cmake-flags 2>/dev/null || echo none)" != "${CMAKE_FLAGS:-}" ]; then
  rm -rf $pack/a $pack/b
  printf '%s\n' "${CMAKE_FLAGS:-}" >$pack/cmake-flags
fi

# A's source: the tree (no build folders, .deps, .git, .venv) with PATCH reversed, staged in a fresh folder and then
# copied into a-src only where a file's bytes differ (a new modification time there, so the build redoes just those)
stage=$(mktemp -d "${TMPDIR:-/tmp}/qmm-ab-pack.XXXXXX")
trap 'rm -rf "$stage"' EXIT
source scripts/ab_tree.sh
ab_reversed_tree pack_ab_bins "$stage" "$patch" || exit 1
python3 - "$stage" "$pack/a-src" <<'PY'
import filecmp, os, shutil, sys
stage, dest = sys.argv[1], sys.argv[2]
wanted = set()
for root, dirs, files in os.walk(stage):
    for name in files:
        rel = os.path.relpath(os.path.join(root, name), stage)
        wanted.add(rel)
        target = os.path.join(dest, rel)
        if not os.path.isfile(target) or not filecmp.cmp(os.path.join(stage, rel), target, shallow=False):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(os.path.join(stage, rel), target)  # no copied times: newer than any object built from it
            shutil.copymode(os.path.join(stage, rel), target)
for root, dirs, files in os.walk(dest):
    for name in files:
        rel = os.path.relpath(os.path.join(root, name), dest)
        if rel not in wanted:
            os.remove(os.path.join(dest, rel))
PY

build() { # build NAME SOURCE TARGETS...
  local name=$1 source=$2
  shift 2
  rm -f "$pack/logs/$name-configure.log" "$pack/logs/$name-build.log" # an earlier run's
  if ! cmake -S "$source" -B "$pack/$name" -DQMM_WITH_CUDA=ON -DQMM_WITH_OPENBLAS_PEER=OFF -DCMAKE_BUILD_TYPE=Release \
       ${CMAKE_FLAGS:-} >"$pack/logs/$name-configure.log" 2>&1 ||
     ! cmake --build "$pack/$name" -j "$(nproc)" --target "$@" >"$pack/logs/$name-build.log" 2>&1; then
    tail -n 30 "$pack/logs/$name-configure.log" "$pack/logs/$name-build.log" 2>/dev/null
    echo "pack_ab_bins: building $name failed (logs: $pack/logs/)" >&2
    exit 1
  fi
}
build a "$pack/a-src" qmm_cli
if [ $tests = 1 ]; then build b . qmm_cli test_kernels test_cuda; else build b . qmm_cli; fi
files=("$pack/a/qmm" "$pack/b/qmm")
[ $tests = 1 ] && files+=("$pack/b/tests/kernels/test_kernels" "$pack/b/tests/gpu/test_cuda")
tar -cJf "$output" --transform "s,^$pack/\([ab]\)/,build-\1/," "${files[@]}" ||
  { rm -f "$output"; echo "pack_ab_bins: writing $output failed" >&2; exit 1; }
echo "pack_ab_bins: wrote $output ($(du -h "$output" | cut -f1)): B = the working tree ($(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ', with uncommitted changes')), A = B less $(basename "$patch")"
