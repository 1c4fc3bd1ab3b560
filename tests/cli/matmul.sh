#!/usr/bin/env bash
# matmul.sh — `qmm matmul` on fixture layers at M=1 and M=5 in f32, f16 and bf16 (scales converted when
# the dtype differs from the checkpoint's f16), a forced kernel, and x from the activations file or from
# files whose tensors sit at odd offsets.
SUITE=cli_matmul
source "$(dirname "$0")/lib.sh"

for layer in blk.0.attn_q blk.0.ffn_down; do
  for m in 1 5; do
    for dtype in f32 f16 bf16; do
      name="matmul $layer -m $m --dtype $dtype"
      expect_ok "$name" matmul "$FIXTURE" --layer $layer -m $m --dtype $dtype --seed $((RANDOM + 1))
      check "$name: within bound" out_matches "^verdict +all [0-9]+ outputs within bound"
      check "$name: error line" out_matches "^max \|error\| +[0-9.e+-]+"
      check "$name: rel error line" out_matches "^max rel error +[0-9.e+-]+"
      check "$name: ratio line" out_matches "^worst error/bound +[0-9.e+-]+"
      check "$name: time line" out_matches "^time +[0-9.]+ µs"
      check "$name: bandwidth line" out_matches "^bandwidth +[0-9.]+ GB/s"
      check "$name: kernel line" out_matches "^kernel +[a-z]+\.qmm_t\."
      check "$name: x line says M=$m" out_matches "^x +random .*M=$m, $dtype"
      if [ $dtype = f16 ]; then
        check "$name: no conversion note" bash -c '! grep -q "^note" <<<"$0"' "$OUT"
      else
        check "$name: conversion note" out_has "scales/biases converted f16 -> $dtype"
        if [ $dtype = f32 ]; then want="(exact: f32 holds every f16 and bf16 value)"; else want="(rounded once, to nearest even)"; fi
        check "$name: the conversion says whether it rounds" out_has "$want"
      fi
    done
  done
done
check "ffn_down K" out_has "(N=576, K=1536)"

# The reference kernel forced by name.
expect_ok "forced kernel" matmul "$FIXTURE" --layer blk.0.attn_v -m 3 --kernel ref.qmm_t.scalar.r1 --backend ref
check "forced kernel reported" out_has "ref.qmm_t.scalar.r1 (forced)"
check "forced kernel: within bound" out_has "within bound"

# --batch-invariant: the kernel's order and every row recomputed alone, bit for bit; a forced kernel without
# an order is refused naming it; the switch twice is a usage error.
for backend in ref cpu; do
  q kernels --backend $backend
  [ "$RC" = 0 ] || continue
  expect_ok "--batch-invariant ($backend)" matmul "$FIXTURE" --layer blk.0.attn_q -m 37 --dtype bf16 --backend $backend --batch-invariant
  check "--batch-invariant ($backend): order line" out_matches '^batch-invariant +order "[a-z0-9-]+"; 37 of 37 rows checked alone \(M=1\) are bit for bit the same inside M=37$'
  check "--batch-invariant ($backend): within bound" out_matches "^verdict +all [0-9]+ outputs within bound"
done
q kernels --backend cpu
if [ "$RC" = 0 ]; then
  expect_library_error matmul "unsupported" "kernel cpu.qmm_t.gemv.r8.avx512 does not declare a batch-invariant order" \
    matmul "$FIXTURE" --layer blk.0.attn_q -m 2 --backend cpu --kernel cpu.qmm_t.gemv.r8.avx512 --batch-invariant
fi
expect_usage_error matmul "--batch-invariant given twice" matmul "$FIXTURE" --layer blk.0.attn_q -m 2 --batch-invariant --batch-invariant

# x from the activations file: all 16 rows, or the first M.
expect_ok "--x all rows" matmul "$FIXTURE" --layer blk.0.ffn_down --x "$FIXTURE/activations.safetensors"
check "--x: M=16" out_matches "^x +.*activations\.safetensors, M=16"
expect_ok "--x -m 4" matmul "$FIXTURE" --layer blk.0.attn_q -m 4 --x "$FIXTURE/activations.safetensors"
check "--x -m 4: M=4" out_matches "^x +.*M=4"
expect_library_error matmul "bad shape" "T=16" matmul "$FIXTURE" --layer blk.0.attn_q -m 17 \
  --x "$FIXTURE/activations.safetensors"

# x at an odd file offset (an unpadded header, as mlx.core.save_safetensors writes): read wherever it is.
for dtype in F32 F16 BF16; do
  ST_HEADER_MOD8=1 make_safetensors "$WORK/x-odd-$dtype.safetensors" "blk.0.attn_q:$dtype:3,576"
  expect_ok "--x at an odd offset ($dtype)" matmul "$FIXTURE" --layer blk.0.attn_q --x "$WORK/x-odd-$dtype.safetensors"
  check "--x at an odd offset ($dtype): within bound" out_matches "^verdict +all 1728 outputs within bound"
done

# Outputs whose exact value is finite but beyond the output dtype's range are right as ±inf (correct rounding
# overflows; qmm_output_check): not "outside bound". f16: x = 30000 everywhere (max 65504); f32: an exact
# value of about -3.46e38 (max 3.40e38).
# one_row_x PATH DTYPE BYTES...: a safetensors file with the tensor blk.0.attn_k [1, 576] made of the given
# element escapes, the last one repeated to fill the row.
one_row_x() {
  local path=$1 dtype=$2 size=2 data="" i
  shift 2
  [ "$dtype" = F32 ] && size=4
  local header="{\"blk.0.attn_k\":{\"dtype\":\"$dtype\",\"shape\":[1,576],\"data_offsets\":[0,$((576 * size))]}}"
  while [ $((${#header} % 8)) != 0 ]; do header+=" "; done
  local elements=("$@")
  for ((i = 0; i < 576; i++)); do
    if [ $i -lt ${#elements[@]} ]; then data+=${elements[$i]}; else data+=${elements[${#elements[@]} - 1]}; fi
  done
  { printf '%b' "$(le64 ${#header})"; printf '%s' "$header"; printf '%b' "$data"; } >"$path"
}
one_row_x "$WORK/x-30000.safetensors" F16 '\x53\x77'
for backend in ref cpu; do
  expect_ok "f16 outputs beyond 65504 ($backend)" matmul "$FIXTURE" --layer blk.0.attn_k --x "$WORK/x-30000.safetensors" \
    --backend $backend
  check "f16 overflow ($backend): within bound" out_has "all 192 outputs within bound"
  check "f16 overflow ($backend): ±inf outputs named" out_matches "^note +[0-9]+ outputs are ±inf, as correct rounding to f16"
done
# (ref only: the CPU rows' per-group f32 fallback overflows on this x where the exact value is finite.)
one_row_x "$WORK/x-3e38.safetensors" F32 '\xe6\xb1\x61\x7f' '\xe6\xb1\x61\x7f' '\xe6\xb1\x61\xff' '\x00\x00\x00\x00'
for backend in ref; do
  expect_ok "f32 outputs beyond 3.4e38 ($backend)" matmul "$FIXTURE" --layer blk.0.attn_k --x "$WORK/x-3e38.safetensors" \
    --dtype f32 --backend $backend
  check "f32 overflow ($backend): within bound" out_has "all 192 outputs within bound"
  check "f32 overflow ($backend): ±inf outputs named" out_matches "^note +[0-9]+ outputs are ±inf, as correct rounding to f32"
done

finish
