#!/usr/bin/env bash
# gather.sh — `qmm quantize` of a 3-D [E, N, K] weight into a layer of experts, `qmm info` showing it, and
# `qmm gather` (MLX gather_qmm with top-k routing) on it: sorted and unsorted routing, every dtype, each
# gather row forced, batch-invariant mode, a 2-D layer as one expert, the FAIL verdict hook, and its usage and
# library errors.
SUITE=cli_gather
source "$(dirname "$0")/lib.sh"

L=model.layers.0.mlp.switch_mlp.up_proj
make_safetensors "$WORK/moe.safetensors" "$L.weight:F32:8,24,128" "model.layers.0.self_attn.q_proj.weight:BF16:16,128" \
  "model.norm.weight:F32:128"
expect_ok "quantize a 3-D weight" quantize "$WORK/moe.safetensors" "$WORK/moe" --bits 4 --group-size 64
check "quantize reports the experts" err_has "$L [8, 24, 128] f32 -> 8 experts, 4-bit gs64"
expect_ok "info on the expert checkpoint" info "$WORK/moe"
check "info: weight written [E, N, words]" out_matches "$L\.weight +u32 +\[8, 24, 16\]"
check "info: the layer has 8 experts" out_matches "$L +N=24 +K=128 +4-bit gs64 f32, 8 experts"

# qmm_checkpoint_quantize's rules for weights of experts: a 3-D weight whose K is off the group size and a
# 4-D weight are left unquantized, each named with its reason (tests/io/test_round_trip.c covers the rest).
make_safetensors "$WORK/odd.safetensors" "e.weight:F32:2,4,96" "d4.weight:F32:2,2,4,64" "p.weight:F32:4,64"
expect_ok "quantize: odd expert weights left" quantize "$WORK/odd.safetensors" "$WORK/odd" --bits 4 --group-size 64
check "3-D with K off the group size left, with the reason" \
  err_has "e.weight [2, 4, 96] f32 left unquantized: K=96 is not a multiple of group_size=64"
check "4-D left, with the reason" err_has "d4.weight [2, 2, 4, 64] f32 left unquantized: it has 4 dimensions"

for dtype in f32 f16 bf16; do
  for order in "" --unsorted; do
    name="gather --dtype $dtype $order"
    expect_ok "$name" gather "$WORK/moe" --layer $L --tokens 5 --experts-per-token 3 --dtype $dtype $order \
      --seed $((RANDOM + 1))
    check "$name: within bound" out_matches "^verdict +all 360 outputs within bound"
    check "$name: layer line" out_has "$L (8 experts of N=24, K=128)"
    check "$name: ratio line" out_matches "^worst error/bound +[0-9.e+-]+"
    check "$name: time line" out_matches "^time +[0-9.]+ µs"
    check "$name: kernel line" out_matches "^kernel +[a-z]+\.gather\."
    if [ -z "$order" ]; then
      check "$name: routing sorted" out_matches "^routing +T=5 tokens × 3 experts per token = B=15 pairs, seed [0-9]+, sorted by expert"
    else
      check "$name: routing unsorted" out_has "token order (unsorted)"
    fi
  done
done

for kernel in ref.gather.blocks.r1 ref.gather.scalar.r1; do
  # the reference rows read host memory: they are in the ref and cpu tables, not in a CUDA one (auto may be cuda)
  expect_ok "forced $kernel" gather "$WORK/moe" --layer $L -t 4 -k 8 --kernel $kernel --backend ref
  check "forced $kernel reported" out_has "$kernel (forced)"
  check "forced $kernel: every expert used" out_has "8 of 8 experts used"
  check "forced $kernel: within bound" out_has "within bound"
done

# On the CPU backend (when built) the selector takes a CPU gather row; the portable one runs on every CPU.
if grep -q "^backend cpu: [0-9]" <<<"$("$QMM" kernels --backend cpu 2>/dev/null)"; then
  expect_ok "gather --backend cpu" gather "$WORK/moe" --layer $L --backend cpu -t 6 -k 3 --seed 7
  check "gather --backend cpu: a CPU gather row selected" out_matches "^kernel +cpu\.gather\.blocks\."
  check "gather --backend cpu: within bound" out_matches "^verdict +all 432 outputs within bound"
  expect_ok "forced cpu.gather.blocks.portable" gather "$WORK/moe" --layer $L --backend cpu -t 4 -k 8 --unsorted \
    --kernel cpu.gather.blocks.portable
  check "forced cpu.gather.blocks.portable reported" out_has "cpu.gather.blocks.portable (forced)"
  check "forced cpu.gather.blocks.portable: within bound" out_has "within bound"
  expect_ok "gather --threads 1" gather "$WORK/moe" --layer $L --backend cpu -t 6 -k 3 --threads 1
  check "gather --threads 1: reported" out_matches "^threads +1$"
  check "gather --threads 1: within bound" out_has "within bound"
fi
for bad in 0 -1 5000 two ""; do
  expect_usage_error gather "--threads '$bad' is not a whole number from 1 to " gather "$WORK/moe" --layer $L --threads "$bad"
done

# --batch-invariant: the kernel's order and up to 64 pairs recomputed alone (B=1), bit for bit, sorted and in token
# order; a forced gather row without an order is refused naming it; the switch twice is a usage error.
for backend in ref cpu; do
  q kernels --backend $backend
  [ "$RC" = 0 ] || continue
  for order in "" --unsorted; do
    name="gather --batch-invariant ($backend $order)"
    expect_ok "$name" gather "$WORK/moe" --layer $L --backend $backend -t 30 -k 3 --dtype bf16 $order --batch-invariant
    check "$name: order line" out_matches '^batch-invariant +order "[a-z0-9-]+"; 64 of 64 pairs checked alone \(B=1\) are bit for bit the same inside B=90$'
    check "$name: within bound" out_matches "^verdict +all 2160 outputs within bound"
  done
  [ $backend = cpu ] && check "gather --batch-invariant (cpu): an ordered CPU gather row" \
    out_matches "^kernel +cpu\.gather\.(blocks_ordered\.avx|blocks\.portable)"
done
q kernels --backend cpu
if [ "$RC" = 0 ]; then
  expect_library_error gather "unsupported" "kernel cpu.gather.blocks.avx512 does not declare a batch-invariant order" \
    gather "$WORK/moe" --layer $L --backend cpu -t 2 --kernel cpu.gather.blocks.avx512 --batch-invariant
fi
expect_usage_error gather "--batch-invariant given twice" gather "$WORK/moe" --layer $L --batch-invariant --batch-invariant

# matmul and run take an expert layer as one stacked matrix, and say so
expect_ok "matmul on an expert layer" matmul "$WORK/moe" --layer $L -m 3 --backend ref
check "matmul on an expert layer: the stacked product is named" out_matches "^note +the layer holds 8 experts of 24 rows: multiplied here as one stacked matrix of 192 rows"
check "matmul on an expert layer: within bound" out_has "within bound"
expect_ok "run on an expert checkpoint" run "$WORK/moe" --backend ref
check "run on an expert checkpoint: the stacked product is named" err_has "$L (8 experts, multiplied as one stacked matrix of 192 rows"

expect_ok "a 2-D layer is one expert" gather "$WORK/moe" --layer model.layers.0.self_attn.q_proj -k 1 -t 3
check "one expert" out_has "(1 expert of N=16, K=128)"
check "one expert per token" out_has "T=3 tokens × 1 expert per token = B=3 pairs"
check "one expert used" out_has "1 of 1 expert used"
check "one expert: within bound" out_matches "^verdict +all 48 outputs within bound"
expect_ok "a 2-D layer without -k: the default 8 capped at its one expert" gather "$WORK/moe" \
  --layer model.layers.0.self_attn.q_proj -t 3
check "default -k on one expert" out_has "(1 expert of N=16, K=128)"

QMM_RUN_INJECT_FAULT=1 q gather "$WORK/moe" --layer $L -t 2 -k 2
check "FAIL verdict exits 3" rc_is 3
check "FAIL verdict printed" out_matches "^verdict +FAIL: 1 of 96 outputs outside bound"

expect_usage_error gather "--experts-per-token 9 exceeds the 8 experts" gather "$WORK/moe" --layer $L -k 9
expect_usage_error gather "--experts-per-token '0'" gather "$WORK/moe" --layer $L -k 0
expect_usage_error gather "--tokens 'x'" gather "$WORK/moe" --layer $L -t x
expect_usage_error gather "--layer NAME is required" gather "$WORK/moe"
expect_usage_error gather "--unsorted takes no value" gather "$WORK/moe" --layer $L --unsorted=1
expect_library_error gather "not found" "no quantized layer named \"nope\"" gather "$WORK/moe" --layer nope
expect_library_error gather "" "ref.qmm_t.scalar.r1 computes qmm_t, the call is gather" gather "$WORK/moe" --layer $L \
  --kernel ref.qmm_t.scalar.r1 --backend ref
expect_ok "--help" gather --help
check "--help prints usage" out_has "usage: qmm gather"

finish
