#!/usr/bin/env bash
# info.sh — `qmm info` on the fixture directory, its model.safetensors and activations file, and on a
# small hand-made GGUF (whose importable tensors `qmm convert` then turns into a runnable checkpoint).
SUITE=cli_info
source "$(dirname "$0")/lib.sh"

expect_ok "info DIR" info "$FIXTURE"
check "dir: checkpoint summary" out_matches "MLX checkpoint, [0-9]+ tensors, 7 quantized layers"
check "dir: config default format" out_has "config default: 4-bit gs32"
check "dir: attn_q layer with N, K and format" out_matches "blk\.0\.attn_q +N=576 +K=576 +4-bit gs32 f16"
check "dir: ffn_down K=1536" out_matches "blk\.0\.ffn_down +N=576 +K=1536 +4-bit gs32 f16"
check "dir: 7 layer rows" [ "$(out_lines_matching '4-bit gs32 f16$')" = 7 ]
check "dir: packed weight tensor" out_matches "blk\.0\.attn_q\.weight +u32 +\[576, 72\]"
check "dir: scales tensor" out_matches "blk\.0\.attn_q\.scales +f16 +\[576, 18\]"
check "dir: norm weight" out_matches "blk\.0\.attn_norm\.weight +f32 +\[576\]"

expect_ok "info model.safetensors" info "$FIXTURE/model.safetensors"
check "file: safetensors summary" out_matches "safetensors, [0-9]+ tensors"
check "file: formats from config.json" out_has "formats from config.json"
check "file: ffn_up format" out_matches "blk\.0\.ffn_up +N=1536 +K=576 +4-bit gs32 f16"
check "file: biases tensor" out_matches "blk\.0\.ffn_up\.biases +f16 +\[1536, 18\]"

expect_ok "info activations.safetensors" info "$FIXTURE/activations.safetensors"
check "activations: attn_q [16, 576] f32" out_matches "blk\.0\.attn_q +f32 +\[16, 576\]"
check "activations: ffn_down [16, 1536] f32" out_matches "blk\.0\.ffn_down +f32 +\[16, 1536\]"

# A lone quantized safetensors file (no config.json beside it): bits×group_size from the shapes.
mkdir -p "$WORK/lone"
cp "$FIXTURE/model.safetensors" "$WORK/lone/"
expect_ok "info lone model.safetensors" info "$WORK/lone/model.safetensors"
check "lone: bits×group_size product" out_matches "blk\.0\.attn_q +N=576 +bits×group_size=128"

# a layer whose name is longer than a kilobyte is listed like any other (it was left out, '(none)' said)
long_name=$(printf 'l%.0s' {1..1100})
make_safetensors "$WORK/lone/long.safetensors" "$long_name.weight:U32:8,8" "$long_name.scales:F16:8,2" \
  "$long_name.biases:F16:8,2"
expect_ok "info, a layer name of 1100 bytes" info "$WORK/lone/long.safetensors"
check "long layer name: listed with its bits×group_size" out_matches "^  l+\.\.\. +N=8 +bits×group_size=128"
check "long layer name: no '(none)'" bash -c '! grep -qF "(none)" <<<"$0"' "$OUT"

make_tiny_gguf "$WORK/tiny.gguf"
expect_ok "info tiny.gguf" info "$WORK/tiny.gguf"
check "gguf: summary and architecture" out_has "GGUF, 3 tensors, architecture test"
check "gguf: Q4_1 importable" out_matches "w\.weight +Q4_1 +\[2, 32\] +yes: 4-bit gs32 f16"
check "gguf: F32 importable" out_matches "n\.weight +F32 +\[32\] +yes"
check "gguf: Q6_K not importable, with the reason" out_matches "k\.weight +Q6_K +\[1, 256\] +no: its sub-blocks of 16 weights"
check "gguf: count" out_has "2 of 3 tensors importable"

# convert: an unsupported tensor stops the conversion (and names it, with a pointer to --skip-unsupported); --only
# skips it, and so does --skip-unsupported (naming it on stderr).
expect_library_error convert unsupported "k.weight" convert "$WORK/tiny.gguf" "$WORK/tinyall"
check "convert: the refusal points at --skip-unsupported" err_has "--skip-unsupported converts the rest"
check "convert: the refused OUTDIR not created" [ ! -e "$WORK/tinyall" ]
# a file version qmm does not read: no pointer to --skip-unsupported (it would refuse the same)
{ printf 'GGUF'; printf '\x04\x00\x00\x00'; tail -c +9 "$WORK/tiny.gguf"; } >"$WORK/v4.gguf"
expect_library_error convert unsupported "GGUF version 4 is not supported" convert "$WORK/v4.gguf" "$WORK/v4out"
check "convert: no --skip-unsupported hint for a file version" err_lacks "--skip-unsupported"
expect_ok "convert --skip-unsupported" convert "$WORK/tiny.gguf" "$WORK/tinyskip" --skip-unsupported
check "convert --skip-unsupported: k.weight named" err_has "left out k.weight (Q6_K: its sub-blocks of 16 weights"
check "convert --skip-unsupported: count" err_has "1 tensor left out (--skip-unsupported)"
check "convert --skip-unsupported: the rest" out_matches "4 tensors, 1 quantized layer$"
expect_library_error convert "not found" "no selected tensor can be imported" \
  convert "$WORK/tiny.gguf" "$WORK/tinynone" --skip-unsupported --only k.
expect_ok "convert --only" convert "$WORK/tiny.gguf" "$WORK/tiny" --only w. --only n.
check "convert: summary" out_matches "1 quantized layer$"
expect_ok "run on the converted GGUF" run "$WORK/tiny"
check "converted: 1 layer within bound" out_has "1 layer, within bound"
QMM_RUN_INJECT_FAULT=1 q run "$WORK/tiny"
check "converted, one injected fault: the verdict in the singular" out_has "FAIL: 1 of 1 layer outside bound"
check "converted: random x" out_matches "^w +16×2×32 +4-bit gs32 f16 .* random x$"

# K-quants and Q5_x (tests/fuzz/corpus/gguf/kquants.gguf, written by llama.cpp's gguf-py): listed with their
# MLX form, converted, and run within the bound with f32 x for the f32-scaled K-quant layers.
KQ=$SRC/tests/fuzz/corpus/gguf/kquants.gguf
expect_ok "info kquants.gguf" info "$KQ"
check "gguf: Q4_K as 4-bit gs32 f32" out_matches "q4_k\.weight +Q4_K +\[2, 256\] +yes: 4-bit gs32 f32$"
check "gguf: Q5_K as 5-bit gs32 f32" out_matches "q5_k\.weight +Q5_K +\[1, 512\] +yes: 5-bit gs32 f32$"
check "gguf: Q5_0 as 5-bit gs32 f16" out_matches "q5_0\.weight +Q5_0 +\[2, 64\] +yes: 5-bit gs32 f16 \(bias -16d\)$"
check "gguf: Q5_1 as 5-bit gs32 f16" out_matches "q5_1\.weight +Q5_1 +\[1, 96\] +yes: 5-bit gs32 f16$"
check "gguf: all 4 importable" out_has "4 of 4 tensors importable"
expect_ok "convert kquants.gguf" convert "$KQ" "$WORK/kq"
check "convert: 4 layers" out_matches "4 quantized layers$"
expect_ok "run on the converted K-quants" run "$WORK/kq"
check "K-quants: 4 layers within bound" out_has "4 layers, all within bound"
check "K-quants: Q4_K layer f32" out_matches "^blk\.0\.q4_k +16×2×256 +4-bit gs32 f32 "

# the kernel listing: every backend, its rows in selector order, the reference rows last
expect_ok "qmm kernels" kernels
check "kernels: the ref backend's four rows" out_matches "^backend ref: 4 kernels"
check "kernels: ref.qmm_t row with its tile" out_matches "^  ref\.qmm_t\.scalar\.r1 +qmm_t +scalar +tile 1x1x1"
check "kernels: ref.qmm_n row" out_matches "^  ref\.qmm_n\.scalar\.r1 +qmm_n"
check "kernels: ref.gather.blocks row" out_matches "^  ref\.gather\.blocks\.r1 +gather +blocks"
check "kernels: ref.gather.scalar row, last" bash -c 'grep -E "^  [a-z]" <<<"$0" | tail -n 1 | grep -qE "^  ref\.gather\.scalar\.r1 +gather"' "$OUT"
check "kernels: an absent backend says why" out_matches "^backend cuda: (not available \(.+\)|[0-9]+ kernels)"
check "kernels: every row says whether it is usable here" \
  [ "$(out_lines_matching '^  [a-z]+\.')" = "$(out_lines_matching '^  [a-z]+\..* usable: (yes|no: .+) ')" ]
check "kernels: the reference rows are usable" out_matches "^  ref\.qmm_t\.scalar\.r1 .* usable: yes "
# The CPU rows name the instruction set they lack; QMM_CPU_MAX_ISA caps the ISA, so the "no" answers can be
# seen on any x86 CPU (on a CPU without AVX-512 they are there without the cap; with QMM_CPU_MAX_ISA already set in
# the environment, the cap is their reason).
if grep -q "^backend cpu: [0-9]" <<<"$OUT"; then
  if grep -qE "^  cpu\.qmm_t\.gemv\.r8\.avx512 .* usable: yes " <<<"$OUT"; then
    if grep -qE "^  cpu\.qmm_t\.gemv_bf16\.r8\.avx512bf16 .* usable: yes " <<<"$OUT"; then
      QMM_CPU_MAX_ISA=avx512 q kernels --backend cpu
      check "kernels, BF16 capped: the bf16 rows say why not" \
        out_matches "^  cpu\.qmm_t\.gemm_bf16\.m32n12\.avx512bf16 .* usable: no: AVX512_BF16 is disabled by QMM_CPU_MAX_ISA=avx512 "
      check "kernels, BF16 capped: the other AVX-512 rows stay usable" out_matches "^  cpu\.qmm_t\.gemv\.r8\.avx512 .* usable: yes "
    fi
    QMM_CPU_MAX_ISA=avx2 q kernels --backend cpu
    check "kernels, AVX-512 capped: exit 0" rc_is 0
    check "kernels, AVX-512 capped: the AVX-512 rows say why not" \
      out_matches "^  cpu\.qmm_t\.gemv\.r8\.avx512 .* usable: no: AVX-512 is disabled by QMM_CPU_MAX_ISA=avx2 "
    check "kernels, AVX-512 capped: the AVX2 rows stay usable" out_matches "^  cpu\.qmm_t\.gemv\.r4\.avx2 .* usable: yes "
    QMM_CPU_MAX_ISA=avx2 q run --backend cpu
    check "run with AVX-512 capped: the AVX2 GEMV row runs the fixture" out_matches " cpu\.qmm_t\.gemv\.r4\.avx2 "
    check "run with AVX-512 capped: within bound" out_has "7 layers, all within bound"
    QMM_CPU_MAX_ISA=AVX2 q kernels --backend cpu # either case
    check "kernels, AVX-512 capped as AVX2: the AVX-512 rows say why not" \
      out_matches "^  cpu\.qmm_t\.gemv\.r8\.avx512 .* usable: no: AVX-512 is disabled by QMM_CPU_MAX_ISA=avx2 "
    check "kernels, AVX-512 capped as AVX2: no 'caps nothing' note" bash -c '! grep -q "caps nothing" <<<"$1"' _ "$OUT"
    QMM_CPU_MAX_ISA=avx-2 q kernels --backend cpu
    check "kernels, QMM_CPU_MAX_ISA=avx-2: the note says it caps nothing" \
      out_has "note: QMM_CPU_MAX_ISA='avx-2' is none of 'avx512', 'avx2', 'portable' (in either case), so it caps nothing"
  else
    check "kernels without AVX-512: the AVX-512 rows say what is missing" \
      out_matches "^  cpu\.qmm_t\.gemv\.r8\.avx512 .* usable: no: (this CPU lacks|the OS does not enable|this CPU is not x86|AVX-512 is disabled by QMM_CPU_MAX_ISA|AVX2 is disabled by QMM_CPU_MAX_ISA)"
  fi
  if grep -qE "^  cpu\.qmm_t\.gemv\.r4\.avx2 .* usable: yes " <<<"$OUT"; then
    QMM_CPU_MAX_ISA=portable q kernels --backend cpu
    check "kernels, capped to portable: the AVX2 rows say why not" \
      out_matches "^  cpu\.qmm_t\.gemm\.m16n6\.avx2 .* usable: no: AVX2 is disabled by QMM_CPU_MAX_ISA=portable "
    check "kernels, capped to portable: the portable row is usable" out_matches "^  cpu\.qmm_t\.scalar\.r1 .* usable: yes "
    check "kernels, capped to portable: an AVX-512 row names AVX-512 and the cap" \
      out_matches "^  cpu\.qmm_t\.gemv\.r8\.avx512 .* usable: no: AVX-512 is disabled by QMM_CPU_MAX_ISA=portable "
    check "kernels, capped to portable: a BF16 row names AVX512_BF16 and the cap" \
      out_matches "^  cpu\.qmm_t\.gemm_bf16\.m32n12\.avx512bf16 .* usable: no: AVX512_BF16 is disabled by QMM_CPU_MAX_ISA=portable "
  fi
fi
expect_usage_error kernels "unexpected argument 'x'" kernels x

# Names come from files: every command prints them escaped (a control character as \xNN, a backslash doubled, invalid
# UTF-8 escaped too), never raw to the terminal, and keeps printable UTF-8 as it is. JSON escapes put the control
# characters into the names: ESC (an ANSI colour), a C1 control (CSI, U+009B) and 模型 in UTF-8.
ESC=$'\x1b'
mkdir -p "$WORK/names"
printf '{"quantization": {"group_size": 32, "bits": 4}}' >"$WORK/names/config.json"
make_safetensors "$WORK/names/model.safetensors" 'e\u001b[31m.weight:U32:8,8' 'e\u001b[31m.scales:F16:8,2' \
  'e\u001b[31m.biases:F16:8,2' 'c1\u009b.weight:F32:2,4' '\u6a21\u578b.weight:F32:2,4' 'back\\slash:F32:1'
no_raw_escape() { ! grep -q "$ESC" <<<"$OUT$ERR" && ! grep -q $'\xc2\x9b' <<<"$OUT$ERR"; }
expect_ok "info, names with control characters" info "$WORK/names"
check "info: a tensor name with ESC escaped" out_matches '^  e\\x1b\[31m\.weight +u32 +\[8, 8\]'
check "info: a layer name with ESC escaped" out_matches '^  e\\x1b\[31m +N=8 +K=64 +4-bit gs32 f16'
check "info: a C1 control escaped" out_matches '^  c1\\xc2\\x9b\.weight +f32'
check "info: printable UTF-8 kept" out_matches '^  模型\.weight +f32'
check "info: a backslash doubled" out_matches '^  back\\\\slash +f32'
check "info: no raw control character" no_raw_escape
expect_ok "info FILE, names with control characters" info "$WORK/names/model.safetensors"
check "info FILE: the layer name escaped" out_matches '^  e\\x1b\[31m +N=8'
check "info FILE: no raw control character" no_raw_escape
expect_ok "matmul, a layer name with ESC" matmul "$WORK/names" --layer "e${ESC}[31m" -m 2
check "matmul: the layer line escaped" out_has 'layer              e\x1b[31m (N=8, K=64)'
check "matmul: the progress line escaped" err_has 'qmm matmul: e\x1b[31m on backend'
check "matmul: no raw control character" no_raw_escape
expect_ok "gather, a layer name with ESC" gather "$WORK/names" --layer "e${ESC}[31m" -t 2 -k 1
check "gather: the layer line escaped" out_has 'layer              e\x1b[31m (1 expert of N=8, K=64)'
check "gather: no raw control character" no_raw_escape
expect_usage_error gather 'exceeds the 1 expert of layer '"'"'e\x1b[31m'"'" gather "$WORK/names" --layer "e${ESC}[31m" -k 2
check "gather usage error: no raw control character" no_raw_escape
expect_ok "run, a layer name with ESC" run "$WORK/names"
check "run: the table row escaped" out_matches '^e\\x1b\[31m +16×8×64 '
check "run: no raw control character" no_raw_escape
make_safetensors "$WORK/names-x.safetensors" 'x\u001b:F32:2,32'
expect_library_error matmul "bad shape" "activation tensor 'x\\x1b' has shape [2, 32], want [T, K=64]" \
  matmul "$WORK/names" --layer "e${ESC}[31m" --x "$WORK/names-x.safetensors"
check "matmul --x: no raw control character" no_raw_escape
# a path with ESC on info's first line: escaped as in the error lines
make_safetensors "$WORK/e${ESC}x.safetensors" 'a:F32:2,2'
expect_ok "info, a path with ESC" info "$WORK/e${ESC}x.safetensors"
check "info: the path escaped" out_has "$WORK/e\x1bx.safetensors: safetensors, 1 tensors"
check "info: no raw control character" no_raw_escape
# x of an integer dtype: an unsupported format (not a bad shape); a 1-D x [K] is one row (T = 1)
make_safetensors "$WORK/names-x-u32.safetensors" 'x:U32:2,64'
expect_library_error matmul "unsupported format" "activation tensor 'x' has dtype u32, want f32, f16 or bf16" \
  matmul "$WORK/names" --layer "e${ESC}[31m" --x "$WORK/names-x-u32.safetensors"
make_safetensors "$WORK/names-x-1d.safetensors" 'x:F32:64'
expect_ok "matmul --x of shape [K]" matmul "$WORK/names" --layer "e${ESC}[31m" --x "$WORK/names-x-1d.safetensors"
# A layer's entry in config.json's quantization is named escaped too, also where one of its keys is given twice.
printf '{"quantization": {"group_size": 32, "bits": 4, "e\\u001b[31m": {"bits": 4, "bits": 8}}}' >"$WORK/names/config.json"
expect_library_error info "corrupt file" 'config.json quantization["e\x1b[31m"]: "bits" appears 2 times' info "$WORK/names"
check "config.json, a key given twice in a layer's entry: no raw control character" no_raw_escape
printf '{"quantization": {"group_size": 32, "bits": 4, "e\\u001b[31m": {"bits": 7}}}' >"$WORK/names/config.json"
expect_library_error info "unsupported format" 'config.json quantization["e\x1b[31m"].bits=7 is not one of' \
  info "$WORK/names"
check "config.json, a layer's entry with bits=7: no raw control character" no_raw_escape
# A shard's name comes from model.safetensors.index.json or from the directory's listing: named printable too.
mkdir -p "$WORK/shards"
printf '{"quantization": {"group_size": 32, "bits": 4}}' >"$WORK/shards/config.json"
printf '{"weight_map": {"w.weight": "model-\\u001b[2J.safetensors"}}' >"$WORK/shards/model.safetensors.index.json"
expect_library_error info "not found" \
  'shards/model-\x1b[2J.safetensors" (named by model.safetensors.index.json) does not exist' info "$WORK/shards"
check "a shard named by the index that does not exist: no raw control character" no_raw_escape
rm "$WORK/shards/model.safetensors.index.json"
printf 'garbage!' >"$WORK/shards/model-${ESC}[2J.safetensors"
expect_library_error info "corrupt file" 'shards/model-\x1b[2J.safetensors: safetensors header length' info "$WORK/shards"
check "a broken shard found by listing: no raw control character" no_raw_escape

finish
