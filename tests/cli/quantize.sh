#!/usr/bin/env bash
# quantize.sh — `qmm quantize` of a small float safetensors made here with printf (f32, f16 and bf16
# weights, a 1-D tensor and a weight whose K is not a multiple of the group size, both copied), then
# `qmm info`, `qmm run` and `qmm matmul` on the result.
SUITE=cli_quantize
source "$(dirname "$0")/lib.sh"

make_safetensors "$WORK/float.safetensors" \
  "proj.weight:F32:8,128" "half.weight:F16:4,64" "brain.weight:BF16:3,256" "norm.weight:F32:64" \
  "odd.weight:F32:2,48" "proj.bias:F32:8"
expect_ok "info on the made file" info "$WORK/float.safetensors"
check "made file has 6 tensors" out_has "safetensors, 6 tensors"

for spec in "4 32 cpu" "3 64 gpu" "8 32 cpu" "2 64 gpu" "6 32 cpu" "5 64 cpu"; do
  read -r bits gs conv <<<"$spec"
  dir="$WORK/q$bits-$gs"
  expect_ok "quantize --bits $bits --group-size $gs --convention $conv" quantize "$WORK/float.safetensors" "$dir" \
    --bits $bits --group-size $gs --convention $conv
  check "$bits/$gs: 3 quantized layers" out_has "3 quantized layers ($bits-bit gs$gs, $conv convention)"
  expect_ok "info on the quantized dir ($bits/$gs)" info "$dir"
  check "$bits/$gs: proj layer f32" out_matches "proj +N=8 +K=128 +$bits-bit gs$gs f32"
  check "$bits/$gs: half layer f16" out_matches "half +N=4 +K=64 +$bits-bit gs$gs f16"
  check "$bits/$gs: brain layer bf16" out_matches "brain +N=3 +K=256 +$bits-bit gs$gs bf16"
  check "$bits/$gs: 1-D tensor copied" out_matches "norm\.weight +f32 +\[64\]"
  check "$bits/$gs: odd K copied as float" out_matches "odd\.weight +f32 +\[2, 48\]"
  check "$bits/$gs: bias copied" out_matches "proj\.bias +f32 +\[8\]"
  expect_ok "run on the quantized dir ($bits/$gs)" run "$dir"
  check "$bits/$gs: verdict" out_has "3 layers, all within bound"
  check "$bits/$gs: random x rows" [ "$(out_lines_matching ' random x$')" = 3 ]
  expect_ok "matmul on the quantized dir ($bits/$gs)" matmul "$dir" --layer brain -m 2
  check "$bits/$gs: matmul within bound" out_has "within bound"
done

# Tensors at odd file offsets (mlx.core.save_safetensors does not pad its header): the library reads the
# float arrays wherever they are (a misaligned load was undefined behaviour, an abort under UBSan).
ST_HEADER_MOD8=1 make_safetensors "$WORK/odd-offsets.safetensors" "a.weight:F32:2,64" "h.weight:F16:3,32" \
  "b.weight:BF16:2,128"
expect_ok "quantize tensors at odd offsets" quantize "$WORK/odd-offsets.safetensors" "$WORK/q-odd" --bits 4 \
  --group-size 32
check "odd offsets: 3 quantized layers" out_has "3 quantized layers"
expect_ok "run on the quantized odd-offset file" run "$WORK/q-odd"
check "odd offsets: verdict" out_has "3 layers, all within bound"

# Layers already quantized keep their own format (from the config.json beside the input), written as
# per-layer entries: p is 4-bit gs32 (K = 64); its arrays have the shapes of a 2-bit gs64 layer of K = 128,
# which is what the new default would have made of it.
mkdir -p "$WORK/mixed"
make_safetensors "$WORK/mixed/model.safetensors" "p.weight:U32:4,8" "p.scales:F16:4,2" "p.biases:F16:4,2" \
  "extra.weight:F32:4,64" "odd.weight:F32:2,48"
printf '{"quantization": {"group_size": 32, "bits": 4}}' >"$WORK/mixed/config.json"
expect_ok "quantize a file with a quantized layer" quantize "$WORK/mixed/model.safetensors" "$WORK/q-mixed" --bits 2 \
  --group-size 64
check "mixed: counts" out_has "1 quantized layer (2-bit gs64, cpu convention), 1 already quantized layer kept"
check "mixed: the kept layer is named" err_has "p already quantized: kept as 4-bit gs32"
check "mixed: the left weight is named with K and group_size" \
  err_has "odd.weight [2, 48] f32 left unquantized: K=48 is not a multiple of group_size=64"
expect_ok "info on the mixed output" info "$WORK/q-mixed"
check "mixed: p keeps 4-bit gs32" out_matches "^  p +N=4 +K=64 +4-bit gs32 f16"
check "mixed: extra is 2-bit gs64" out_matches "^  extra +N=4 +K=64 +2-bit gs64 f32"
check "mixed: odd copied as float" out_matches "odd\.weight +f32 +\[2, 48\]"
# The other members of the input's config.json (model_type, hyperparameters) are carried through; the
# quantization keys are rewritten for the new layers.
mkdir -p "$WORK/withcfg"
make_safetensors "$WORK/withcfg/model.safetensors" "a.weight:F32:4,64" "norm.weight:F32:64"
printf '{"model_type": "llama", "hidden_size": 64, "rope_scaling": {"type": "linear", "factor": 2.0}, "vocab_size": 5}' \
  >"$WORK/withcfg/config.json"
expect_ok "quantize with a float config.json beside the input" quantize "$WORK/withcfg/model.safetensors" \
  "$WORK/q-withcfg" --bits 4 --group-size 32
if command -v python3 >/dev/null; then
  check "config.json members carried through" python3 - "$WORK/q-withcfg/config.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model_type"] == "llama" and d["hidden_size"] == 64 and d["vocab_size"] == 5, d
assert d["rope_scaling"] == {"type": "linear", "factor": 2.0}, d
assert d["quantization"] == {"group_size": 32, "bits": 4} == d["quantization_config"], d
PY
fi
check "mixed: config.json members carried through, quantization rewritten" \
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["quantization"]["bits"] == 2 and d["quantization"]["p"] == {"group_size": 32, "bits": 4}, d' \
  "$WORK/q-mixed/config.json"
# The same file without a config.json: p's format is unknown, so the command refuses and writes nothing.
mkdir -p "$WORK/lone"
cp "$WORK/mixed/model.safetensors" "$WORK/lone/"
expect_library_error quantize "not found" 'already quantized layer "p"' quantize "$WORK/lone/model.safetensors" \
  "$WORK/q-lone" --bits 2 --group-size 64
check "no config: no output" [ ! -e "$WORK/q-lone" ]
# The fixture: every layer already quantized, nothing left to quantize: refused, nothing written.
expect_library_error quantize "" "nothing was written" quantize "$FIXTURE/model.safetensors" "$WORK/q-fixture" \
  --bits 2 --group-size 64
check "fixture: no output" [ ! -e "$WORK/q-fixture" ]
# Nothing can be quantized at this group size: refused naming K and group_size, nothing written.
make_safetensors "$WORK/only-odd.safetensors" "odd.weight:F32:2,48" "norm.weight:F32:48"
expect_library_error quantize "" "K=48 is not a multiple of group_size=64" quantize "$WORK/only-odd.safetensors" \
  "$WORK/q-none" --bits 4 --group-size 64
check "nothing quantizable: no output" [ ! -e "$WORK/q-none" ]
check "nothing quantizable: weight named on stderr" err_has "odd.weight [2, 48] f32 left unquantized"

finish
