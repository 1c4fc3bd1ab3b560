#!/usr/bin/env bash
# contract.sh — the CLI's contract with scripts (issue 5, section 4): the exit codes `qmm help` documents
# (0 ok, 1 library or run-time error, 2 usage error, 3 FAIL verdict) and that they stay distinct; OUTDIR of
# convert and quantize checked before any work (a file, a missing parent, a checkpoint without --force,
# stale shards); an option value that looks like a flag ("--layer -h") is a value, not a request for help.
SUITE=cli_contract
source "$(dirname "$0")/lib.sh"

L=blk.0.attn_q
make_safetensors "$WORK/float.safetensors" "a.weight:F32:4,64" "b.weight:F16:2,128"
make_tiny_gguf "$WORK/tiny.gguf"

# ── exit codes: documented, and one per kind
expect_ok "qmm help" help
check "help documents exit status" out_has "exit status:"
for code in 0 1 2 3; do check "help documents exit $code" out_matches "^  $code  [A-Za-z]"; done
expect_ok "0: a product within bound" matmul "$FIXTURE" --layer $L -m 2
expect_library_error matmul "not found" "blk.0.nope" matmul "$FIXTURE" --layer blk.0.nope -m 2
expect_usage_error matmul "-m 'x'" matmul "$FIXTURE" --layer $L -m x
QMM_RUN_INJECT_FAULT=1 q matmul "$FIXTURE" --layer $L -m 2
check "3: matmul FAIL verdict exits 3" rc_is 3
check "3: matmul prints the FAIL verdict" out_matches "^verdict +FAIL: 1 of 1152 outputs outside bound"
check "3: not reported as a library error" bash -c '! grep -qE "^qmm matmul: [a-z /-]+: " <<<"$0"' "$ERR"
QMM_RUN_INJECT_FAULT=1 q run
check "3: run FAIL verdict exits 3" rc_is 3
QMM_RUN_INJECT_FAULT=x expect_usage_error matmul "QMM_RUN_INJECT_FAULT='x'" matmul "$FIXTURE" --layer $L -m 2

# 1: standard output that cannot be written (a full device) loses the results: an I/O error, never a silent 0
if [ -w /dev/full ]; then
  for args in "kernels" "matmul $FIXTURE --layer $L -m 2" "--version"; do
    CMD="qmm $args >/dev/full"
    # shellcheck disable=SC2086 # the arguments split on purpose
    "$QMM" $args >/dev/full 2>"$WORK/full.err"
    RC=$? ERR=$(cat "$WORK/full.err")
    check "stdout on a full device: qmm $args exits 1" rc_is 1
    check "stdout on a full device: qmm $args says so" err_has "I/O error: writing to standard output failed"
  done
else
  echo "$SUITE: the full-device cases SKIPPED: /dev/full is not writable here"
fi

# a bad option value is a usage error, found before any work (the input need not even exist)
expect_usage_error quantize "--bits 7" quantize "$WORK/nonexistent.safetensors" "$WORK/q" --bits 7 --group-size 32
expect_usage_error quantize "--group-size 96" quantize "$WORK/nonexistent.safetensors" "$WORK/q" --bits 4 \
  --group-size 96
check "nothing written" [ ! -e "$WORK/q" ]

# ── OUTDIR, checked before the work: no layer is quantized (no progress line) and nothing is written
printf 'a file\n' >"$WORK/afile"
expect_library_error quantize "I/O error" "OUTDIR '$WORK/afile' exists and is not a directory" \
  quantize "$WORK/float.safetensors" "$WORK/afile" --bits 4 --group-size 32
check "OUTDIR a file: nothing quantized first" bash -c '! grep -q -- "->" <<<"$0"' "$ERR"
check "OUTDIR a file: the file is kept" [ "$(cat "$WORK/afile")" = "a file" ]
expect_library_error quantize "not found" "its parent '$WORK/no/such' does not exist" \
  quantize "$WORK/float.safetensors" "$WORK/no/such/out" --bits 4 --group-size 32
check "missing parent: nothing quantized first" bash -c '! grep -q -- "->" <<<"$0"' "$ERR"
check "missing parent: nothing created" [ ! -e "$WORK/no" ]
expect_library_error quantize "I/O error" "its parent '$WORK/afile' is not a directory" \
  quantize "$WORK/float.safetensors" "$WORK/afile/out" --bits 4 --group-size 32
expect_library_error convert "not found" "its parent '$WORK/no/such' does not exist" \
  convert "$WORK/tiny.gguf" "$WORK/no/such/out" --only w
expect_library_error convert "I/O error" "exists and is not a directory" convert "$WORK/tiny.gguf" "$WORK/afile" --only w
# the same file named with a trailing slash (stat says ENOTDIR), and a symbolic link to nothing (stat says ENOENT):
# refused before the work too, not by mkdir after it
expect_library_error quantize "I/O error" "OUTDIR '$WORK/afile/' exists and is not a directory" \
  quantize "$WORK/float.safetensors" "$WORK/afile/" --bits 4 --group-size 32
check "OUTDIR a file with a slash: nothing quantized first" bash -c '! grep -q -- "->" <<<"$0"' "$ERR"
expect_library_error convert "I/O error" "OUTDIR '$WORK/afile/' exists and is not a directory" \
  convert "$WORK/tiny.gguf" "$WORK/afile/" --only w
ln -s "$WORK/nowhere" "$WORK/dangling"
expect_library_error quantize "I/O error" "OUTDIR '$WORK/dangling' is a symbolic link to nothing" \
  quantize "$WORK/float.safetensors" "$WORK/dangling" --bits 4 --group-size 32
check "dangling OUTDIR: nothing quantized first" bash -c '! grep -q -- "->" <<<"$0"' "$ERR"
check "dangling OUTDIR: nothing created at its target" [ ! -e "$WORK/nowhere" ]
check "convert: nothing created" [ ! -e "$WORK/no" ]

# a checkpoint already there: refused without --force before quantizing; stale shards refused even with it
expect_ok "quantize into a new dir (trailing slash)" quantize "$WORK/float.safetensors" "$WORK/ckpt/" --bits 4 \
  --group-size 32
expect_library_error quantize "invalid argument" "already holds a checkpoint" \
  quantize "$WORK/float.safetensors" "$WORK/ckpt" --bits 8 --group-size 32
check "existing checkpoint: nothing quantized first" bash -c '! grep -q -- "->" <<<"$0"' "$ERR"
cp "$WORK/ckpt/model.safetensors" "$WORK/ckpt/model-00001-of-00002.safetensors"
before=$(sha256sum "$WORK/ckpt/model.safetensors")
expect_library_error quantize "invalid argument" "holds 'model-00001-of-00002.safetensors'" \
  quantize "$WORK/float.safetensors" "$WORK/ckpt" --bits 8 --group-size 32 --force
check "stale shard: nothing quantized first" bash -c '! grep -q -- "->" <<<"$0"' "$ERR"
check "stale shard: the checkpoint is kept" [ "$(sha256sum "$WORK/ckpt/model.safetensors")" = "$before" ]
expect_library_error convert "invalid argument" "holds 'model-00001-of-00002.safetensors'" \
  convert "$WORK/tiny.gguf" "$WORK/ckpt" --only w --force
rm "$WORK/ckpt/model-00001-of-00002.safetensors"
expect_ok "quantize --force replaces it" quantize "$WORK/float.safetensors" "$WORK/ckpt" --bits 8 --group-size 32 --force
# --force replaces a config.json that is a symbolic link (the link, not its target); one that is a FIFO is refused
# before any work, naming it
printf 'target' >"$WORK/link-target.txt"
mv "$WORK/ckpt/config.json" "$WORK/ckpt-config.json" && ln -s "$WORK/link-target.txt" "$WORK/ckpt/config.json"
expect_ok "quantize --force over a symlinked config.json" quantize "$WORK/float.safetensors" "$WORK/ckpt" --bits 8 \
  --group-size 32 --force
check "symlinked config.json: replaced by a file" bash -c '[ -f "$0" ] && [ ! -L "$0" ]' "$WORK/ckpt/config.json"
check "symlinked config.json: its target untouched" [ "$(cat "$WORK/link-target.txt")" = target ]
rm "$WORK/ckpt/config.json" && mkfifo "$WORK/ckpt/config.json"
expect_library_error quantize "I/O error" "OUTDIR '$WORK/ckpt' holds config.json as a FIFO, which --force does not replace" \
  quantize "$WORK/float.safetensors" "$WORK/ckpt" --bits 8 --group-size 32 --force
check "FIFO config.json: nothing quantized first" bash -c '! grep -q -- "->" <<<"$0"' "$ERR"
rm "$WORK/ckpt/config.json" && mv "$WORK/ckpt-config.json" "$WORK/ckpt/config.json"
expect_ok "convert into an existing empty dir" convert "$WORK/tiny.gguf" "$WORK/afile.d" --only w
if [ "$(id -u)" != 0 ]; then # root may write anywhere
  mkdir "$WORK/locked" && chmod 555 "$WORK/locked"
  expect_library_error quantize "I/O error" "cannot be created in '$WORK/locked'" \
    quantize "$WORK/float.safetensors" "$WORK/locked/out" --bits 4 --group-size 32
  chmod 755 "$WORK/locked"
fi

# ── option values that look like flags are values; --help/-h where a flag may stand is help
q matmul "$FIXTURE" --layer -h -m 1
check "--layer -h: the layer '-h' is looked up" rc_is 1
check "--layer -h: not found names '-h'" err_has 'no quantized layer named "-h"'
check "--layer -h: no usage printed" bash -c '! grep -q "^usage:" <<<"$0"' "$OUT"
q matmul "$FIXTURE" --layer --help -m 1
check "--layer --help: the layer '--help' is looked up" err_has 'no quantized layer named "--help"'
q matmul "$FIXTURE" --layer=-h -m 1
check "--layer=-h: a value" err_has 'no quantized layer named "-h"'
expect_usage_error matmul "--seed '-h'" matmul "$FIXTURE" --layer $L -m 1 --seed -h
expect_usage_error matmul "-m '-h'" matmul "$FIXTURE" --layer $L -m -h
expect_usage_error quantize "--convention '-h'" quantize "$WORK/float.safetensors" "$WORK/q" --bits 4 \
  --group-size 32 --convention -h
expect_library_error matmul "" "-h" matmul "$FIXTURE" --layer $L -m 1 --x -h
expect_ok "-h after a value is help" matmul "$FIXTURE" --layer $L -h
check "matmul -h prints usage" out_has "usage: qmm matmul"
expect_ok "--help wins over an unknown option" matmul "$FIXTURE" --bogus --help
check "matmul --help prints usage" out_has "usage: qmm matmul"
expect_ok "-h after a switch is help" convert "$WORK/tiny.gguf" "$WORK/out" --force -h
check "convert -h prints usage" out_has "usage: qmm convert"
check "convert -h wrote nothing" [ ! -e "$WORK/out" ]
expect_ok "kernels -h" kernels -h
check "kernels -h prints usage" out_has "usage: qmm kernels"

# ── --backend: a named backend that is absent is a clear error (exit 1); auto falls back in the order
# cuda, cpu, ref (the order qmm kernels lists them), so it always finds one
expect_ok "qmm kernels" kernels
listing=$OUT
first=$(sed -nE 's/^backend ([a-z]+): [0-9]+ kernels.*/\1/p' <<<"$listing" | head -n 1)
check "some backend is available" [ -n "$first" ]
for backend in cuda cpu; do
  if grep -q "^backend $backend: not available" <<<"$listing"; then
    expect_library_error matmul "unsupported" "--backend $backend: " matmul "$FIXTURE" --layer $L -m 1 \
      --backend $backend
    check "--backend $backend: says what to do" err_has "--backend auto takes the first of them"
    check "--backend $backend: no verdict" bash -c '! grep -q "^verdict" <<<"$0"' "$OUT"
    expect_library_error run "unsupported" "--backend $backend" run --backend $backend
    expect_library_error kernels "unsupported" "--backend $backend" kernels --backend $backend
  else
    expect_ok "matmul --backend $backend (available here)" matmul "$FIXTURE" --layer $L -m 1 --backend $backend
    check "matmul on $backend" out_matches "^backend +$backend$"
  fi
done
expect_ok "matmul --backend auto" matmul "$FIXTURE" --layer $L -m 1 --backend auto
check "auto picks the first available backend ($first)" out_matches "^backend +$first$"
expect_ok "matmul without --backend" matmul "$FIXTURE" --layer $L -m 1
check "the default is auto ($first)" out_matches "^backend +$first$"
expect_ok "run --backend auto" run --backend auto
check "run: auto picks $first" err_has "backend $first,"
expect_ok "kernels --backend auto" kernels --backend auto
check "kernels --backend auto: one table, $first's" [ "$(out_lines_matching '^backend ')" = 1 ] && out_has "backend $first:"
expect_ok "kernels --backend ref" kernels --backend ref
check "kernels --backend ref: ref's table" out_matches "^backend ref: [0-9]+ kernels" && [ "$(out_lines_matching '^backend ')" = 1 ]
expect_usage_error kernels "--backend 'tpu'" kernels --backend tpu

# ── --threads N (run, matmul, bench): a whole number from 1 to 1024, checked before any work
for bad in 0 -1 5000 two 1.5 ""; do
  expect_usage_error run "--threads '$bad' is not a whole number from 1 to " run --threads "$bad"
  expect_usage_error matmul "--threads '$bad' is not a whole number from 1 to " matmul "$FIXTURE" --layer $L -m 1 --threads "$bad"
  expect_usage_error bench "--threads '$bad' is not a whole number from 1 to " bench --backend ref --quick --threads "$bad"
done
expect_ok "matmul --threads 1" matmul "$FIXTURE" --layer $L -m 2 --threads 1
check "matmul --threads 1: reported" out_matches "^threads +1$"
expect_library_error run "unsupported" "--threads 2: " run --backend ref --threads 2
if grep -q "^backend cpu: [0-9]" <<<"$listing"; then
  expect_ok "run --backend cpu --threads 1" run --backend cpu --threads 1
  check "run --threads 1: one thread" err_has "backend cpu, 1 thread,"
  check "run --threads 1: within bound" out_has "7 layers, all within bound"
  expect_ok "run --backend cpu --threads 3 (more than the cores is allowed)" run --backend cpu --threads 3
  check "run --threads 3: three threads" err_has "backend cpu, 3 threads,"
  expect_ok "bench --backend cpu --threads 1" bench --backend cpu --quick --no-peers --threads 1 --m 1
  check "bench --threads 1: the machine line says 1 thread" out_matches "1 thread[^s]"
fi

finish
