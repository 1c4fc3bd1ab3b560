#!/usr/bin/env bash
# setup.sh [build|test|bench] — installs what `make run` (build) or `make test` (test) needs on a fresh Debian
# machine, and nothing that is already there. Idempotent; safe to run on every make.
#   build: a C compiler, CMake, pkg-config, cJSON (checkpoint I/O), OpenBLAS (a peer of `qmm bench`)
#   test:  + clang with libFuzzer/ASan runtimes, python3-venv, the pinned Python venv (.venv) with MLX
#          for the cross-check, and the real model file (.cache/) the cross-check and fixture use.
#   bench: + the peers of `qmm bench --backend cpu` that `make test` does not need: PyPI ggml-python
#          (pinned in bench/peers/requirements.txt; it builds ggml from source with this CPU's flags, about
#          2 minutes) into .venv, and matplotlib for bench/plot.py.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-build}

need=(gcc libc6-dev make cmake pkg-config libcjson-dev libopenblas-dev) # libc6-dev: only Recommended by gcc
if [ "$what" = test ] || [ "$what" = bench ]; then
  need+=(clang libclang-rt-dev python3 python3-venv unzip) # libclang-rt-dev: the runtimes of the default clang
fi
if [ "$what" = bench ]; then
  need+=(g++) # ggml-python compiles ggml's C++ parts
fi
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] && ! command -v sudo >/dev/null; then
    echo "setup: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "setup: installing ${missing[*]}" >&2
  mkdir -p .cache
  log=.cache/setup-apt.log
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
         $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "setup: apt-get failed (full log: $log)" >&2
    exit 1
  fi
fi

if [ "$what" = test ] || [ "$what" = bench ]; then
  if [ ! -x .venv/bin/python ] || ! cmp -s tests/mlx/requirements.txt .venv/requirements.txt; then
    echo "setup: creating .venv (pinned MLX for the cross-check)" >&2
    rm -rf .venv
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r tests/mlx/requirements.txt >&2
    cp tests/mlx/requirements.txt .venv/requirements.txt
  fi
  scripts/fetch_model.sh >/dev/null
fi

if [ "$what" = bench ]; then
  # Recorded in .venv/bench-requirements.txt once installed, so a second run does nothing.
  if ! cmp -s bench/peers/requirements.txt .venv/bench-requirements.txt; then
    echo "setup: installing the bench peers into .venv (ggml-python builds ggml from source: ~2 minutes)" >&2
    .venv/bin/pip install -q --disable-pip-version-check -r bench/peers/requirements.txt -r bench/requirements.txt >&2
    cp bench/peers/requirements.txt .venv/bench-requirements.txt
  fi
fi
