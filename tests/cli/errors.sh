#!/usr/bin/env bash
# errors.sh — bad command-line input never crashes: unknown commands and flags, missing values, bad
# numbers, dtypes and formats (--bits 7) are usage errors (exit 2); nonexistent or broken files, unknown
# layers and kernels are library errors (exit 1, "qmm CMD: STATUS: message"). Also help and usage.
SUITE=cli_errors
source "$(dirname "$0")/lib.sh"

L=blk.0.attn_q
printf 'not a model at all, just some text bytes\n' >"$WORK/garbage.bin"
printf '\xff\xff\xff\xff\xff\xff\xff\x7f{}' >"$WORK/huge-header.safetensors"
make_safetensors "$WORK/float.safetensors" "a.weight:F32:2,64"

# help and usage
expect_ok "qmm help" help
check "help lists run" out_matches "^  run +"
check "help lists every command" bash -c 'for c in info convert quantize matmul run kernels; do grep -q "^  $c " <<<"$0" || exit 1; done' "$OUT"
expect_ok "qmm --help" --help
for cmd in info convert quantize matmul run kernels; do
  expect_ok "qmm $cmd --help" $cmd --help
  check "$cmd --help prints its usage" out_has "usage: qmm $cmd"
  expect_ok "qmm help $cmd" help $cmd
  check "help $cmd prints its usage" out_has "usage: qmm $cmd"
done
q run --help
check "run usage documents the test hook" out_has "QMM_RUN_INJECT_FAULT"
q
check "no command: exit 2" rc_is 2
check "no command: overview on stderr" err_has "usage: qmm COMMAND"
check "no command: a usage error line first" err_matches "^qmm: usage error: no command given"
expect_usage_error "" "unknown command 'frobnicate'" frobnicate
expect_usage_error help "unknown command 'nope'" help nope
expect_ok "qmm help --help" help --help
check "help --help prints help's usage" out_has "usage: qmm help [COMMAND]"

# unknown flags, missing values, extra arguments
expect_usage_error run "unknown option '--bogus'" run --bogus
expect_usage_error matmul "unknown option '--lay'" matmul "$FIXTURE" --lay $L -m 1
expect_usage_error matmul "unknown option '-m5'" matmul "$FIXTURE" --layer $L -m5
expect_usage_error matmul "--layer needs a value" matmul "$FIXTURE" -m 1 --layer
expect_usage_error matmul "-m needs a value" matmul "$FIXTURE" --layer $L -m
expect_usage_error matmul "--layer NAME is required" matmul "$FIXTURE" -m 1
expect_usage_error matmul "-m M is required" matmul "$FIXTURE" --layer $L
expect_usage_error matmul "expected one checkpoint DIR" matmul --layer $L -m 1
expect_usage_error matmul "-m given twice" matmul "$FIXTURE" --layer $L -m 1 -m 2
# An empty path ('') is a usage error naming the argument as the usage does, for every command that takes one.
expect_usage_error run "DIR is empty ('')" run ''
expect_usage_error info "FILE|DIR is empty ('')" info ''
expect_usage_error convert "IN.gguf is empty ('')" convert '' "$WORK/out-empty"
expect_usage_error convert "OUTDIR is empty ('')" convert "$WORK/x.gguf" ''
expect_usage_error quantize "IN.safetensors is empty ('')" quantize '' "$WORK/out-empty" --bits 4 --group-size 32
expect_usage_error quantize "OUTDIR is empty ('')" quantize "$WORK/x.safetensors" '' --bits 4 --group-size 32
expect_usage_error matmul "DIR is empty ('')" matmul '' --layer $L -m 1
expect_usage_error matmul "--x is empty" matmul "$FIXTURE" --layer $L --x ''
expect_usage_error matmul "--tuning is empty" matmul "$FIXTURE" --layer $L -m 1 --tuning ''
expect_usage_error run "--tuning is empty" run --tuning ''
check "empty paths: nothing written" [ ! -e "$WORK/out-empty" ]
# A tensor name with a NUL byte is refused, escaped, rather than cut ("a" twice).
printf '%b' "$(le64 136)" >"$WORK/nul.safetensors"
printf '%-136s' '{"a\u0000x.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a\u0000y.weight":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}' >>"$WORK/nul.safetensors"
head -c 8 /dev/zero >>"$WORK/nul.safetensors"
expect_library_error info "corrupt file" 'the string at byte 1, "a\\u0000x.weight", holds a NUL byte' info "$WORK/nul.safetensors"
# quantize on a tensor named ".weight": named, with the reason it cannot be a layer.
make_safetensors "$WORK/dotweight.safetensors" ".weight:F32:4,64"
expect_library_error quantize "" '.weight [4, 64] f32 left unquantized: its layer name (before ".weight") is empty' \
  quantize "$WORK/dotweight.safetensors" "$WORK/out-dotweight" --bits 4 --group-size 32
check "quantize .weight: nothing written" [ ! -e "$WORK/out-dotweight" ]
expect_usage_error convert "--force given twice" convert "$WORK/x.gguf" "$WORK/out-twice" --force --force
expect_usage_error quantize "--force given twice" quantize "$WORK/x.safetensors" "$WORK/out-twice" --bits 4 \
  --group-size 32 --force --force
expect_usage_error run "unexpected argument 'extra'" run "$FIXTURE" extra
expect_usage_error run "bytes long" run "$FIXTURE$(printf '/%.0s' {1..4100})nonexistent" # never cut to a prefix
expect_usage_error info "expected one FILE or DIR" info
expect_usage_error convert "expected IN.gguf and OUTDIR" convert "$WORK/x.gguf"
expect_usage_error convert "--only needs a value" convert "$WORK/x.gguf" "$WORK/out" --only
expect_usage_error quantize "--bits is required" quantize "$WORK/float.safetensors" "$WORK/q" --group-size 32
expect_usage_error quantize "--group-size is required" quantize "$WORK/float.safetensors" "$WORK/q" --bits 4
# A value given wrongly is named before a missing one is asked for: --bits 7 alone hears about the 7.
expect_usage_error quantize "--bits 7: bits=7 is not supported (allowed: {2, 3, 4, 5, 6, 8})" quantize \
  "$WORK/float.safetensors" "$WORK/q" --bits 7
check "--bits 7 alone: the missing --group-size not said first" bash -c '! grep -q "group-size is required" <<<"$0"' "$ERR"
expect_usage_error quantize "--bits 'four' is not one of 2, 3, 4, 5, 6, 8" quantize "$WORK/float.safetensors" "$WORK/q" --bits four
expect_usage_error quantize "--bits ' 4' is not one of" quantize "$WORK/float.safetensors" "$WORK/q" --bits " 4"
# signs refused, as for every other number; a huge value is named with the set, not called a non-integer
expect_usage_error quantize "--bits '+4' is not one of" quantize "$WORK/float.safetensors" "$WORK/q" --bits +4
expect_usage_error quantize "--group-size '+64' is not one of 32, 64, 128" quantize "$WORK/float.safetensors" "$WORK/q" \
  --bits 4 --group-size +64
expect_usage_error bench "--bits '99999999999' is not one of" bench --backend ref --quick --bits 99999999999
expect_usage_error quantize "--group-size 48: group_size=48 is not supported (allowed:" quantize \
  "$WORK/float.safetensors" "$WORK/q" --group-size 48
expect_usage_error quantize "--bits 7 --group-size 48: bits=7 is not supported" quantize "$WORK/float.safetensors" \
  "$WORK/q" --bits 7 --group-size 48
expect_usage_error quantize "--convention 'fpga' is not cpu or gpu" quantize "$WORK/float.safetensors" "$WORK/q" \
  --convention fpga
check "--convention fpga alone: the missing --bits not said first" bash -c '! grep -q "bits is required" <<<"$0"' "$ERR"

# bad numbers and names
for m in 0 abc -1 1.5 "" 65537 99999999999999999999999; do
  expect_usage_error matmul "-m '$m'" matmul "$FIXTURE" --layer $L -m "$m"
done
expect_usage_error matmul "--dtype 'f64'" matmul "$FIXTURE" --layer $L -m 1 --dtype f64
expect_usage_error matmul "--dtype 'int4'" matmul "$FIXTURE" --layer $L -m 1 --dtype int4
# an argument's control bytes come back escaped, not as typed (an ESC would reach the terminal)
expect_usage_error matmul "--dtype 'f\\x1b[2J'" matmul "$FIXTURE" --layer $L -m 1 --dtype $'f\e[2J'
check "usage error: no raw ESC on stderr" err_lacks $'\e'
# ... however long the message: the rule at its end is still there (a path may be PATH_MAX bytes)
long=$(printf 'd%.0s' {1..1200})
expect_usage_error info "$long' (at most 1 positional argument)" info "$WORK" "$long"
expect_usage_error "" "unknown command 'x\x1b[2J'" $'x\e[2J'
check "unknown command: no raw ESC on stderr" err_lacks $'\e'
# a library error quoting a path from the command line: escaped the same way
expect_library_error info "" "cannot open '$WORK/no\x1b[2J'" info "$WORK/no"$'\e[2J'
check "library error: no raw ESC on stderr" err_lacks $'\e'
QMM_CPU_MAX_ISA=$'\e[2J' q kernels
check "kernels: the unknown QMM_CPU_MAX_ISA value escaped" out_has "QMM_CPU_MAX_ISA='\x1b[2J'"
check "kernels: no raw ESC on stdout" out_lacks $'\e'
expect_usage_error matmul "--seed 'x'" matmul "$FIXTURE" --layer $L -m 1 --seed x
expect_usage_error matmul "--backend 'tpu'" matmul "$FIXTURE" --layer $L -m 1 --backend tpu
expect_usage_error run "--backend 'tpu'" run --backend tpu
expect_usage_error quantize "--bits 'four'" quantize "$WORK/float.safetensors" "$WORK/q" --bits four --group-size 32
expect_usage_error quantize "--convention 'fpga'" quantize "$WORK/float.safetensors" "$WORK/q" --bits 4 \
  --group-size 32 --convention fpga
QMM_RUN_INJECT_FAULT=abc expect_usage_error run "QMM_RUN_INJECT_FAULT='abc'" run

# formats outside the rule: usage errors (exit 2) naming the value and the allowed ones, before any work
expect_usage_error quantize "--bits 7 --group-size 32: bits=7 is not supported (allowed:" quantize \
  "$WORK/float.safetensors" "$WORK/q" --bits 7 --group-size 32
expect_usage_error quantize "group_size=48 is not supported (allowed:" quantize "$WORK/float.safetensors" "$WORK/q" \
  --bits 4 --group-size 48
expect_usage_error quantize "bits=0" quantize "$WORK/float.safetensors" "$WORK/q" --bits 0 --group-size 32
expect_usage_error quantize "--bits '-4' is not one of" quantize "$WORK/nonexistent.safetensors" "$WORK/q" --bits -4 --group-size 32
check "nothing written on a format error" [ ! -e "$WORK/q" ]

# nonexistent and broken paths
expect_library_error info "I/O error" "$WORK/nonexistent" info "$WORK/nonexistent"
expect_library_error run "" "" run "$WORK/nonexistent"
expect_library_error matmul "" "" matmul "$WORK/nonexistent" --layer $L -m 1
expect_library_error convert "" "" convert "$WORK/nonexistent.gguf" "$WORK/out"
check "convert of a nonexistent file writes nothing" [ ! -e "$WORK/out/model.safetensors" ]
expect_library_error quantize "" "" quantize "$WORK/nonexistent.safetensors" "$WORK/q" --bits 4 --group-size 32
expect_library_error info "" "" info "$WORK/garbage.bin"
expect_library_error info "" "" info "$WORK/huge-header.safetensors"
printf 'junk' >"$WORK/broken.gguf" # a .gguf name without the magic: reported as a GGUF file
expect_library_error info "corrupt file" "bad GGUF magic" info "$WORK/broken.gguf"
expect_library_error convert "" "" convert "$WORK/garbage.bin" "$WORK/out2"
expect_library_error convert "" "" convert "$FIXTURE/model.safetensors" "$WORK/out3"
expect_library_error run "" "" run "$WORK"  # a directory that is not a checkpoint
expect_library_error matmul "" "" matmul "$FIXTURE" --layer $L -m 1 --x "$WORK/garbage.bin"

# FIFOs: opening one for reading waits for a writer, so every reader must refuse it without opening it
# for a blocking read (QMM_TIMEOUT turns a regression into a failed check instead of a hung test)
mkfifo "$WORK/fifo" "$WORK/fifo.gguf"
mkdir -p "$WORK/fifo-config" "$WORK/fifo-shard"
cp "$FIXTURE/model.safetensors" "$WORK/fifo-config/"
mkfifo "$WORK/fifo-config/config.json"
cp "$FIXTURE/config.json" "$WORK/fifo-shard/"
mkfifo "$WORK/fifo-shard/model.safetensors"
QMM_TIMEOUT=60 expect_library_error info "I/O error" "neither a regular file nor a directory" info "$WORK/fifo"
QMM_TIMEOUT=60 expect_library_error convert "I/O error" "not a regular file" convert "$WORK/fifo.gguf" "$WORK/out4"
QMM_TIMEOUT=60 expect_library_error quantize "I/O error" "not a regular file" quantize "$WORK/fifo" "$WORK/q" --bits 4 \
  --group-size 32
QMM_TIMEOUT=60 expect_library_error matmul "I/O error" "not a regular file" matmul "$FIXTURE" --layer $L -m 1 \
  --x "$WORK/fifo"
QMM_TIMEOUT=60 expect_library_error run "I/O error" "config.json" run "$WORK/fifo-config"
QMM_TIMEOUT=60 expect_library_error run "I/O error" "model.safetensors" run "$WORK/fifo-shard"
check "nothing written from a FIFO" [ ! -e "$WORK/q" ] && [ ! -e "$WORK/out4" ]
expect_library_error info "I/O error" "neither a regular file nor a directory" info /dev/null

# x holding NaN (or a value that overflows the layer's f16 when rounded): a numeric error naming the
# output and the input, not a "FAIL ... outside bound" verdict that blames the kernel for bad input
nan_header='{"x":{"dtype":"F32","shape":[2,576],"data_offsets":[0,4608]}}'
while [ $((${#nan_header} % 8)) != 0 ]; do nan_header+=" "; done
{
  printf '%b' "$(le64 ${#nan_header})"; printf '%s' "$nan_header"
  for ((i = 0; i < 576; i++)); do printf '\x00\x00\x80\x3f'; done # row 0: 1.0
  printf '\x00\x00\xc0\x7f'                                      # row 1, column 0: NaN
  for ((i = 1; i < 576; i++)); do printf '\x00\x00\x80\x3f'; done
} >"$WORK/nan-x.safetensors"
expect_library_error matmul "non-finite value" "row 1, column 0 is nan" matmul "$FIXTURE" --layer $L \
  --x "$WORK/nan-x.safetensors"
check "no verdict for a NaN x" bash -c '! grep -q "^verdict" <<<"$0"' "$OUT"
check "the message names the input: x[1, 0]" err_has "x[1, 0] is nan"

# x with more rows than -m allows (65536): all T rows are not taken past the cap (a sparse file of zeros)
tall_header='{"x":{"dtype":"F32","shape":[65537,576],"data_offsets":[0,150997248]}}'
while [ $((${#tall_header} % 8)) != 0 ]; do tall_header+=" "; done
{ printf '%b' "$(le64 ${#tall_header})"; printf '%s' "$tall_header"; } >"$WORK/tall-x.safetensors"
truncate -s $((8 + ${#tall_header} + 150997248)) "$WORK/tall-x.safetensors"
expect_library_error matmul "bad shape" "T=65537 rows" matmul "$FIXTURE" --layer $L --x "$WORK/tall-x.safetensors"
expect_ok "the first rows of a tall x" matmul "$FIXTURE" --layer $L -m 2 --x "$WORK/tall-x.safetensors"
rm -f "$WORK/tall-x.safetensors"

# Products that would not fit in the host memory are refused before anything of their size is allocated, naming the
# layer, the shape and both sizes — not left to be killed by the system. A layer of 2^24 rows × K=32 (2-bit) in a
# sparse file: -m 65536 would hold ~24 TiB (the output, as f32 and the f64 oracle's two arrays), more than any machine.
if grep -q '^MemAvailable:' /proc/meminfo 2>/dev/null; then
  mkdir -p "$WORK/huge"
  printf '{"quantization": {"group_size": 32, "bits": 2}}' >"$WORK/huge/config.json"
  huge_header='{"big.weight":{"dtype":"U32","shape":[16777216,2],"data_offsets":[0,134217728]},"big.scales":{"dtype":"F16","shape":[16777216,1],"data_offsets":[134217728,167772160]},"big.biases":{"dtype":"F16","shape":[16777216,1],"data_offsets":[167772160,201326592]}}'
  while [ $((${#huge_header} % 8)) != 0 ]; do huge_header+=" "; done
  { printf '%b' "$(le64 ${#huge_header})"; printf '%s' "$huge_header"; } >"$WORK/huge/model.safetensors"
  truncate -s $((8 + ${#huge_header} + 201326592)) "$WORK/huge/model.safetensors"
  for backend in ref cpu; do
    q kernels --backend $backend
    [ "$RC" = 0 ] || continue
    expect_library_error matmul "out of memory" "layer 'big' (N=16777216, K=32) at M=65536 in f16 would hold ~" \
      matmul "$WORK/huge" --layer big -m 65536 --backend $backend
    check "matmul beyond the host memory ($backend): both sizes named" \
      err_matches "would hold ~[0-9]+\.[0-9] GiB of host memory at once \(x, the output, its f64 oracle, the weights and the backend's buffers\), more than the [0-9]+\.[0-9] GiB available \(MemAvailable in /proc/meminfo\): use a smaller -m"
    check "matmul beyond the host memory ($backend): ~24 TiB" err_matches "would hold ~2[45][0-9]{3}\.[0-9] GiB"
    expect_library_error matmul "out of memory" "layer 'big' (N=16777216, K=32) at M=65536 in f32 would hold ~" \
      matmul "$WORK/huge" --layer big -m 65536 --dtype f32 --backend $backend
    expect_library_error gather "out of memory" \
      "layer 'big' (1 expert of N=16777216, K=32) at T=65536, B=65536 in f16 would hold ~" \
      gather "$WORK/huge" --layer big -t 65536 -k 1 --backend $backend
    check "gather beyond the host memory ($backend): the available size named" \
      err_matches "GiB available \(MemAvailable in /proc/meminfo\): use fewer --tokens or --experts-per-token"
  done
  # qmm run: every layer is checked before the first runs; activations of 65536 tokens (a sparse file of zeros).
  x_header='{"big":{"dtype":"F16","shape":[65536,32],"data_offsets":[0,4194304]}}'
  while [ $((${#x_header} % 8)) != 0 ]; do x_header+=" "; done
  { printf '%b' "$(le64 ${#x_header})"; printf '%s' "$x_header"; } >"$WORK/huge/activations.safetensors"
  truncate -s $((8 + ${#x_header} + 4194304)) "$WORK/huge/activations.safetensors"
  expect_library_error run "out of memory" "layer 'big' (N=16777216, K=32) at M=65536 in f16 would hold ~" \
    run "$WORK/huge" --backend ref
  check "run beyond the host memory: refused before the table" bash -c '! grep -q "^layer" <<<"$0"' "$OUT"
  rm -rf "$WORK/huge"
fi
# Every command's check, on a machine with less than a GiB available (QMM_TEST_MEM_AVAILABLE pretends MemAvailable):
# both sizes named in MiB ("~0.0 GiB, more than the 0.0 GiB available" named neither), nothing measured or written.
mib_rule='would hold ~[0-9]+\.[0-9] MiB of host memory at once \(.+\), more than the 1\.0 MiB available \(MemAvailable'
QMM_TEST_MEM_AVAILABLE=1048576 q matmul "$FIXTURE" --layer blk.0.ffn_up -m 1000 --backend ref
check "matmul on 1 MiB: refused" rc_is 1
check "matmul on 1 MiB: both sizes in MiB" err_matches "^qmm matmul: out of memory: layer 'blk\.0\.ffn_up' .*$mib_rule"
QMM_TEST_MEM_AVAILABLE=1048576 q gather "$FIXTURE" --layer blk.0.ffn_up -t 1000 -k 1 --backend ref
check "gather on 1 MiB: both sizes in MiB" err_matches "^qmm gather: out of memory: .*$mib_rule"
QMM_TEST_MEM_AVAILABLE=1048576 q run --backend ref
check "run on 1 MiB: both sizes in MiB" err_matches "^qmm run: out of memory: .*$mib_rule"
check "run on 1 MiB: refused before the table" bash -c '! grep -q "^layer" <<<"$0"' "$OUT"
printf 'wide 1048576 64\n' >"$WORK/wide.txt"
QMM_TEST_MEM_AVAILABLE=1048576 q tune --backend ref --quick --shapes "$WORK/wide.txt" --m 1 --out "$WORK/wide.json"
check "tune on 1 MiB: both sizes in MiB" err_matches "^qmm tune: out of memory: shape wide .*$mib_rule"
check "tune on 1 MiB: no table written" [ ! -e "$WORK/wide.json" ]
QMM_TEST_MEM_AVAILABLE=1048576 q bench --backend ref --quick --shapes "$WORK/wide.txt" --m 1 --no-peers
check "bench on 1 MiB: both sizes in MiB" err_matches "^qmm bench: out of memory: shape wide .*$mib_rule"
check "bench on 1 MiB: refused before the ceilings are measured" bash -c '! grep -q "measuring the ceilings" <<<"$0"' "$ERR"
# and a product that fits is run: 1 GiB holds the fixture's largest layer at -m 1000 (tens of MiB)
QMM_TEST_MEM_AVAILABLE=1073741824 q matmul "$FIXTURE" --layer blk.0.ffn_up -m 1000 --backend ref
check "matmul that fits in 1 GiB: run" rc_is 0
# A gather's f64 oracle holds one expert's block of rows at a time (at most T, a token's experts being distinct), not
# all B: 8 experts of 64×64, T=4096 × 8 per token hold ~54 MiB (the outputs and their oracle), run in 60 MiB — counted
# for B rows the oracle's scratch made it ~90 MiB, refused.
mkdir -p "$WORK/experts"
printf '{"quantization": {"group_size": 32, "bits": 4}}' >"$WORK/experts/config.json"
make_safetensors "$WORK/experts/model.safetensors" 'e.weight:U32:8,64,8' 'e.scales:F16:8,64,2' 'e.biases:F16:8,64,2'
QMM_TEST_MEM_AVAILABLE=62914560 q gather "$WORK/experts" --layer e -t 4096 -k 8 --backend ref
check "gather of 8 experts × 8 per token in 60 MiB: run" rc_is 0
QMM_TEST_MEM_AVAILABLE=52428800 q gather "$WORK/experts" --layer e -t 4096 -k 8 --backend ref
check "gather of 8 experts × 8 per token in 50 MiB: refused" err_matches "would hold ~5[0-9]\.[0-9] MiB .* more than the 50\.0 MiB"
# and the oracle's own rows are counted (32 rows of x and |x| in f64: 66·K·8 bytes, ~0.8 MB at K=1536 for one token)
QMM_TEST_MEM_AVAILABLE=1000000 q gather "$FIXTURE" --layer blk.0.ffn_down -t 1 -k 1 --backend ref
check "gather of one token at K=1536 in 1 MB: refused, the oracle's rows counted" \
  err_matches "would hold ~1[0-9]{3}\.[0-9] KiB .* more than the 976\.6 KiB available"

# an OUTDIR that already holds a checkpoint is replaced only with --force
mkdir -p "$WORK/existing"
cp "$FIXTURE/config.json" "$FIXTURE/model.safetensors" "$WORK/existing/"
before=$(sha256sum "$WORK/existing/model.safetensors")
expect_library_error quantize "invalid argument" "already holds a checkpoint (config.json); pass --force" \
  quantize "$WORK/float.safetensors" "$WORK/existing" --bits 4 --group-size 32
expect_library_error convert "invalid argument" "already holds a checkpoint" convert "$WORK/x.gguf" "$WORK/existing"
check "a refused OUTDIR keeps its checkpoint" [ "$(sha256sum "$WORK/existing/model.safetensors")" = "$before" ]
expect_usage_error quantize "--force takes no value" quantize "$WORK/float.safetensors" "$WORK/existing" --force=yes \
  --bits 4 --group-size 32
expect_ok "quantize --force replaces it" quantize "$WORK/float.safetensors" "$WORK/existing" --bits 4 --group-size 32 --force
check "the replaced checkpoint differs" [ "$(sha256sum "$WORK/existing/model.safetensors")" != "$before" ]

# names the checkpoint does not have
expect_library_error matmul "not found" "blk.0.nope" matmul "$FIXTURE" --layer blk.0.nope -m 1
expect_library_error matmul "not found" "no.such.kernel" matmul "$FIXTURE" --layer $L -m 1 --kernel no.such.kernel
expect_library_error matmul "" "" matmul "$FIXTURE" --layer $L -m 1 --kernel ref.qmm_n.scalar.r1
make_safetensors "$WORK/wrongk.safetensors" "x:F32:3,100"
expect_library_error matmul "bad shape" "K=576" matmul "$FIXTURE" --layer $L --x "$WORK/wrongk.safetensors"
# --x without a tensor named like the layer: the message says how many tensors the file has (none is not "more than one").
make_safetensors "$WORK/empty-x.safetensors"
expect_library_error matmul "not found" "'$WORK/empty-x.safetensors' holds no tensors (want x [M, K=576]: a tensor named '$L', or the file's only tensor)" \
  matmul "$FIXTURE" --layer $L --x "$WORK/empty-x.safetensors"
make_safetensors "$WORK/two-x.safetensors" "a:F32:1,576" "b:F32:1,576"
expect_library_error matmul "not found" "'$WORK/two-x.safetensors' has no tensor named '$L' and 2 tensors (want x [M, K=576]: a tensor named '$L', or the file's only tensor)" \
  matmul "$FIXTURE" --layer $L --x "$WORK/two-x.safetensors"

# A layer whose scales or biases disagree with its weight: both shapes named, and the rule.
mkdir -p "$WORK/bad-scales"
printf '{"quantization": {"group_size": 32, "bits": 4}}' >"$WORK/bad-scales/config.json"
make_safetensors "$WORK/bad-scales/model.safetensors" "p.weight:U32:8,8" "p.scales:F16:7,2" "p.biases:F16:8,2"
expect_library_error info "corrupt file" 'layer "p": scales [7, 2] and biases [8, 2] must both be [8, 2], [N, K/group_size] for weight [8, 8] (N=8, K=64: 8 words of 4-bit codes per row, so 2 groups of group_size=32)' \
  info "$WORK/bad-scales"
make_safetensors "$WORK/bad-scales/model.safetensors" "p.weight:U32:2,8,8" "p.scales:F16:2,8,4" "p.biases:F16:2,8,4"
expect_library_error info "corrupt file" 'layer "p": scales [2, 8, 4] and biases [2, 8, 4] must both be [2, 8, 2], [E, N, K/group_size] for weight [2, 8, 8]' \
  info "$WORK/bad-scales"

# A CUDA knob outside its rule (docs/kernels.md §12), where a CUDA device is usable: --backend auto stops at the error
# (it does not fall back to the CPU), --backend cuda names the knob without the "backends available here" hint.
if "$QMM" kernels --backend cuda >/dev/null 2>&1; then
  QMM_CUDA_WARPS=99 expect_library_error matmul "invalid argument" "--backend auto: cuda: QMM_CUDA_WARPS=99 is not a whole number in 1–16" \
    matmul "$FIXTURE" --layer $L -m 2
  QMM_CUDA_WARPS=99 expect_library_error matmul "invalid argument" "--backend cuda: QMM_CUDA_WARPS=99 is not a whole number in 1–16" \
    matmul "$FIXTURE" --layer $L -m 2 --backend cuda
  check "a knob's error carries no 'backends available' hint" bash -c '! grep -q "lists the backends" <<<"$1"' _ "$ERR"
  QMM_CUDA_GATHER_GROUPED=yes expect_library_error gather "invalid argument" "QMM_CUDA_GATHER_GROUPED=yes is not one of 0, 1" \
    gather "$FIXTURE" --layer blk.0.ffn_up -k 1
  QMM_CUDA_PDL=off expect_library_error gather "invalid argument" "--backend auto: cuda: QMM_CUDA_PDL=off is not one of 0, 1" \
    gather "$FIXTURE" --layer blk.0.ffn_up -k 1
  QMM_CUDA_SPLITS=two expect_library_error matmul "invalid argument" "QMM_CUDA_SPLITS=two is not a whole number in 1–16" \
    matmul "$FIXTURE" --layer $L -m 64 --backend cuda
else
  echo "$SUITE: the CUDA knob cases SKIPPED: no usable CUDA device (qmm kernels --backend cuda)"
fi
finish
