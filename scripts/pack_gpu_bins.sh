#!/usr/bin/env bash
# pack_gpu_bins.sh — builds the binaries of `make test-gpu`'s run and sanitizer parts here (a machine with nvcc and
# no GPU is enough: CI's kind) and packs them for a GPU machine that should not spend its time building (the lent
# H200: every call starts on a bare machine, and the build takes 2–2.5 of the call's 10 minutes).
#   scripts/pack_gpu_bins.sh [OUTPUT]      (default OUTPUT: .deps/gpu-bins.tar.xz, git-ignored)
# Builds build-gpu-pack as scripts/gpu_test.sh builds build-gpu (RelWithDebInfo, CUDA required; cJSON from
# .deps/cjson when present), without OpenBLAS (qmm bench's CPU peer, a library the GPU machine may lack) — the qmm,
# test_cuda and test_kernels targets only — and writes OUTPUT with them as build-gpu/qmm,
# build-gpu/tests/gpu/test_cuda and build-gpu/tests/kernels/test_kernels, host debug info stripped, xz -9 (about 12 MB
# for the three: they share one CUDA fatbin). On the
# GPU machine, from the tree's root (the same commit), with OUTPUT and .deps/cjson carried along:
#   tar -xf .deps/gpu-bins.tar.xz && GPU_TEST_BUILD=0 scripts/gpu_test.sh memcheck racecheck
# The binaries load the CUDA runtime and cuBLAS (libcudart.so, libcublas.so of this toolkit's major version) and
# libgomp from the GPU machine, and cJSON through .deps/cjson (scripts/deps_env.sh). Exit status: 0, or 1 with the
# failing step named.
set -euo pipefail
cd "$(dirname "$0")/.."
output=${1:-.deps/gpu-bins.tar.xz}
source scripts/deps_env.sh
command -v nvcc >/dev/null || { echo "pack_gpu_bins: nvcc is not on PATH (the CUDA toolkit is needed to build the CUDA backend)" >&2; exit 1; }
build=build-gpu-pack
mkdir -p $build/logs "$(dirname "$output")"
if ! cmake -S . -B $build -DQMM_WITH_CUDA=ON -DQMM_WITH_OPENBLAS_PEER=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
     >$build/logs/configure.log 2>&1 ||
   ! cmake --build $build -j "$(nproc)" --target qmm_cli test_cuda test_kernels >$build/logs/build.log 2>&1; then
  tail -n 30 $build/logs/configure.log $build/logs/build.log
  echo "pack_gpu_bins: the build failed (logs: $build/logs/)" >&2
  exit 1
fi
# The host debug info stripped (the device code's line info stays in the fatbin) and one xz stream with a 64 MiB
# dictionary: the three binaries hold the same CUDA fatbin, which -9 then stores once (40 MB -> 12 MB, session 48).
stage=$build/pack-stage
rm -rf "$stage" && mkdir -p "$stage/build-gpu/tests/gpu" "$stage/build-gpu/tests/kernels"
for f in qmm tests/gpu/test_cuda tests/kernels/test_kernels; do strip --strip-debug -o "$stage/build-gpu/$f" "$build/$f"; done
tar -cf - -C "$stage" build-gpu | xz -9 >"$output"
rm -rf "$stage"
echo "pack_gpu_bins: wrote $output ($(du -h "$output" | cut -f1)) from $(git rev-parse --short HEAD 2>/dev/null || echo 'this tree')$(git diff --quiet HEAD 2>/dev/null || echo ', with uncommitted changes')"
