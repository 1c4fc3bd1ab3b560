#!/usr/bin/env bash
# run.sh — `qmm run`, the main job, on the embedded SmolLM2 fixture: 7 layers on real activations
# within bound; the verdict can fail (QMM_RUN_INJECT_FAULT); absent activations fall back to random x.
SUITE=cli_run
source "$(dirname "$0")/lib.sh"

layers="blk.0.attn_k blk.0.attn_output blk.0.attn_q blk.0.attn_v blk.0.ffn_down blk.0.ffn_gate blk.0.ffn_up"

# The default DIR is the embedded fixture.
expect_ok "qmm run (default fixture)" run
check "verdict line" out_has "7 layers, all within bound"
check "one row per layer on real x" [ "$(out_lines_matching ' real x$')" = 7 ]
for layer in $layers; do check "row for $layer" out_matches "^$layer "; done
check "attn_q shape M×N×K" out_matches "^blk\.0\.attn_q +16×576×576 +4-bit gs32 f16 "
check "attn_k shape" out_matches "^blk\.0\.attn_k +16×192×576 "
check "ffn_down shape (K=1536)" out_matches "^blk\.0\.ffn_down +16×576×1536 +4-bit gs32 f16 "
check "ffn_gate shape" out_matches "^blk\.0\.ffn_gate +16×1536×576 "
check "a kernel name on every row" [ "$(out_lines_matching '^blk\.0\.[a-z_]+ +[0-9]+×[0-9]+×[0-9]+ +4-bit gs32 f16 +[a-z]+\.qmm_t\.')" = 7 ]
check "no FAIL" bash -c '! grep -q FAIL <<<"$0"' "$OUT"
check "progress on stderr" err_has "qmm run:"

# A loaded machine (pretended): the CPU timings get a warning, unless one thread runs (nothing to hold back).
QMM_TEST_LOAD_AVERAGE=8 q run --backend cpu --threads 2
check "load 8 on 2 threads: still exit 0" rc_is 0
check "load 8 on 2 threads: warned" err_has "qmm run: load average 8.00 with 2 threads — a warning"
check "load 8 on 2 threads: the note under the table" out_has "note: the µs column was measured while other processes"
QMM_TEST_LOAD_AVERAGE=8 q run --backend cpu --threads 1
check "load 8 on 1 thread: no warning" bash -c '! grep -q "a warning" <<<"$0"' "$ERR"
check "load 8 on 1 thread: no note" out_lacks "note: the µs column"
QMM_TEST_LOAD_AVERAGE=0.5 q run --backend cpu --threads 2
check "load 0.5 on 2 threads: no warning" bash -c '! grep -q "a warning" <<<"$0"' "$ERR"
# A core busy elsewhere at a low load average (the minute-long average missed it): the sampled cores warn (pretended;
# the real load average may warn first on a busy test machine — either names its reason).
QMM_TEST_BUSY_CORES=256 q run --backend cpu --threads 2
check "cores busy elsewhere beyond the free ones: warned" \
  err_matches "qmm run: (load average [0-9.]+|256\.0 cores busy with other processes \(sampled over 0\.1 s\)) with 2 threads — a warning"
QMM_TEST_LOAD_AVERAGE=0.5 QMM_TEST_BUSY_CORES=2 q run --backend cpu --threads 2
check "a pretended load decides alone: no warning" bash -c '! grep -q "a warning" <<<"$0"' "$ERR"

# An explicit DIR and an explicit backend give the same verdict.
expect_ok "qmm run DIR --backend ref" run "$FIXTURE" --backend ref
check "verdict (explicit DIR)" out_has "7 layers, all within bound"
check "ref kernel" out_has "ref.qmm_t."

# The verdict can fail: the test hook corrupts one output of the first n layers.
QMM_RUN_INJECT_FAULT=1 q run
check "one injected fault: exit 3 (FAIL verdict)" rc_is 3
check "one injected fault: verdict" out_has "FAIL: 1 of 7 layers outside bound"
check "one injected fault: the row says FAIL" [ "$(out_lines_matching ' FAIL ')" = 1 ]
QMM_RUN_INJECT_FAULT=2 q run "$FIXTURE"
check "two injected faults: exit 3 (FAIL verdict)" rc_is 3
check "two injected faults: verdict" out_has "FAIL: 2 of 7 layers outside bound"
QMM_RUN_INJECT_FAULT=0 q run
check "QMM_RUN_INJECT_FAULT=0 injects nothing" rc_is 0

# Without activations.safetensors every layer runs on seeded random x, and says so.
cp -r "$FIXTURE" "$WORK/noact"
rm "$WORK/noact/activations.safetensors"
expect_ok "qmm run without activations" run "$WORK/noact" --seed 7
check "random x on every row" [ "$(out_lines_matching ' random x$')" = 7 ]
check "verdict (random x)" out_has "7 layers, all within bound"

# --batch-invariant: every layer in the mode, its rows recomputed alone and compared bit for bit.
expect_ok "qmm run --batch-invariant" run --batch-invariant
check "--batch-invariant verdict" out_has "7 layers, all within bound; batch-invariant: every row checked alone (M=1) is bit for bit the same inside the product"
expect_usage_error run "--batch-invariant given twice" run --batch-invariant --batch-invariant

finish
