# lib.sh — sourced by every CLI test script (tests/cli/*.sh): runs the qmm binary, asserts exit codes
# and messages, makes small input files with printf, and prints "SUITE: N passed, N failed" at the end.
#   usage inside a test: SUITE=name; source lib.sh "$@"   (the first argument is the qmm binary)

QMM=${1:?usage: $0 path/to/qmm}
SRC=${QMM_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
FIXTURE=$SRC/data/smollm2-135m-block0
passed=0
failed=0
WORK=$(mktemp -d "${TMPDIR:-/tmp}/qmm-cli-$SUITE.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

if [ "${QMM_IO_ENABLED:-ON}" = OFF ]; then
  echo "$SUITE: SKIPPED: libqmm was built without checkpoint I/O (QMM_WITH_IO=OFF, or cJSON was not found)"
  exit 77
fi

# q ARGS...: runs qmm; stdout in $OUT, stderr in $ERR, exit code in $RC, the command line in $CMD.
# QMM_TIMEOUT=seconds (optional) kills a command that runs longer (exit 124), so a hang fails a check.
q() {
  CMD="qmm $*"
  ${QMM_TIMEOUT:+timeout "$QMM_TIMEOUT"} "$QMM" "$@" >"$WORK/stdout" 2>"$WORK/stderr"
  RC=$?
  OUT=$(cat "$WORK/stdout")
  ERR=$(cat "$WORK/stderr")
}

# check DESCRIPTION TEST-COMMAND...: one assertion about the last q call.
check() {
  local what=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $what" >&2
    echo "  command: $CMD (exit $RC)" >&2
    echo "  stdout: $(head -c 2000 <<<"$OUT")" >&2
    echo "  stderr: $(head -c 2000 <<<"$ERR")" >&2
  fi
}

rc_is() { [ "$RC" = "$1" ]; }
out_has() { grep -qF -- "$1" <<<"$OUT"; }
err_has() { grep -qF -- "$1" <<<"$ERR"; }
err_lacks() { ! grep -qF -- "$1" <<<"$ERR"; }
out_lacks() { ! grep -qF -- "$1" <<<"$OUT"; }
out_matches() { grep -qE -- "$1" <<<"$OUT"; }
err_matches() { grep -qE -- "$1" <<<"$ERR"; }
out_lines_matching() { grep -cE -- "$1" <<<"$OUT"; }

# expect_ok DESCRIPTION ARGS...: the command succeeds.
expect_ok() {
  local what=$1
  shift
  q "$@"
  check "$what: exit 0" rc_is 0
}

# expect_usage_error CMD SUBSTRING ARGS...: exit 2, stderr "qmm CMD: usage error: ..." naming SUBSTRING.
expect_usage_error() {
  local cmd=$1 text=$2
  shift 2
  q "$@"
  check "usage error exit 2" rc_is 2
  check "usage error message format" err_matches "^qmm( $cmd)?: usage error: .+"
  check "usage error names '$text'" err_has "$text"
}

# expect_library_error CMD STATUS SUBSTRING ARGS...: exit 1, stderr "qmm CMD: STATUS: <non-empty message>"
# with SUBSTRING in the message; an empty STATUS accepts any status, an empty SUBSTRING any message.
expect_library_error() {
  local cmd=$1 status=${2:-[A-Za-z/ -]+} text=$3
  shift 3
  q "$@"
  check "library error exit 1" rc_is 1
  check "library error format 'qmm $cmd: $status: message'" err_matches "^qmm $cmd: $status: .+"
  [ -z "$text" ] || check "library error names '$text'" err_has "$text"
}

finish() {
  echo "$SUITE: $passed passed, $failed failed"
  [ "$failed" = 0 ] && [ $((passed + failed)) -gt 0 ]
}

# ── little-endian bytes for hand-made files: each prints a printf %b escape string
le16() { printf '\\x%02x\\x%02x' $(($1 & 255)) $((($1 >> 8) & 255)); }
le32() { le16 $(($1 & 65535)); le16 $((($1 >> 16) & 65535)); }
le64() { le32 $(($1 & 4294967295)); le32 $((($1 >> 32) & 4294967295)); }

# Deterministic pseudo-random bytes (an LCG, so the files are the same on every run).
lcg_state=12345
next_byte() {
  lcg_state=$(((lcg_state * 1103515245 + 12345) & 2147483647))
  byte=$(((lcg_state >> 16) & 255))
}

# random_floats DTYPE COUNT: finite values of magnitude in [0.125, 2), random sign, as escapes.
random_floats() {
  local dtype=$1 count=$2 i s="" h
  local highs=(0x3e 0x3f 0xbe 0xbf)
  for ((i = 0; i < count; i++)); do
    case $dtype in
    F32) next_byte; printf -v h '\\x%02x' $byte; s+=$h; next_byte; printf -v h '\\x%02x' $byte; s+=$h
         next_byte; printf -v h '\\x%02x' $byte; s+=$h; next_byte; printf -v h '\\x%02x' $((highs[byte & 3])); s+=$h ;;
    F16) next_byte; printf -v h '\\x%02x' $byte; s+=$h; next_byte
         printf -v h '\\x%02x' $(((byte & 0x80) | 0x34 | (byte & 0x0b))); s+=$h ;;
    BF16) next_byte; printf -v h '\\x%02x' $byte; s+=$h; next_byte; printf -v h '\\x%02x' $((highs[byte & 3])); s+=$h ;;
    esac
  done
  printf '%s' "$s"
}

# make_safetensors PATH "name:DTYPE:d0,d1" ...: a safetensors file of random finite float tensors (or
# random U32 words, as packed codes are). The header
# is padded with spaces to a multiple of 8 bytes; ST_HEADER_MOD8=r pads it to 8k + r instead, so that with
# r odd every tensor sits at an odd file offset (as in files written by mlx.core.save_safetensors).
make_safetensors() {
  local path=$1
  shift
  local header="{" data="" offset=0 spec name dtype shape count size first=1
  for spec in "$@"; do
    IFS=: read -r name dtype shape <<<"$spec"
    count=1
    for d in ${shape//,/ }; do count=$((count * d)); done
    case $dtype in F32 | U32) size=4 ;; *) size=2 ;; esac
    [ $first = 1 ] || header+=","
    first=0
    header+="\"$name\":{\"dtype\":\"$dtype\",\"shape\":[$shape],\"data_offsets\":[$offset,$((offset + count * size))]}"
    offset=$((offset + count * size))
    data+=$(random_floats "${dtype/U32/F32}" "$count") # U32: random bytes, e.g. packed codes
  done
  header+="}"
  while [ $((${#header} % 8)) != "${ST_HEADER_MOD8:-0}" ]; do header+=" "; done
  printf '%b' "$(le64 ${#header})" >"$path"
  printf '%s' "$header" >>"$path"
  printf '%b' "$data" >>"$path"
}

# make_tiny_gguf PATH: a GGUF v3 file with general.architecture = "test" and three tensors:
#   w.weight Q4_1 [2, 32] (importable), n.weight F32 [32] (importable), k.weight Q6_K [1, 256] (not).
make_tiny_gguf() {
  local path=$1 gstr
  gstr() { printf '%b%s' "$(le64 ${#1})" "$1"; }
  {
    printf 'GGUF'; printf '%b' "$(le32 3)$(le64 3)$(le64 1)"
    gstr general.architecture; printf '%b' "$(le32 8)"; gstr test
    gstr w.weight; printf '%b' "$(le32 2)$(le64 32)$(le64 2)$(le32 3)$(le64 0)"
    gstr n.weight; printf '%b' "$(le32 1)$(le64 32)$(le32 0)$(le64 64)"
    gstr k.weight; printf '%b' "$(le32 2)$(le64 256)$(le64 1)$(le32 14)$(le64 192)"
  } >"$path"
  local size i
  size=$(wc -c <"$path")
  while [ $((size % 32)) != 0 ]; do printf '\0' >>"$path"; size=$((size + 1)); done
  # Q4_1 blocks: d = 0.0999 (f16 0x2e66), m = -1 (f16 0xbc00), 16 bytes of codes; then padding to 64.
  for row in 0 1; do
    printf '%b' "$(le16 0x2e66)$(le16 0xbc00)" >>"$path"
    for ((i = 0; i < 16; i++)); do next_byte; printf '%b' "$(printf '\\x%02x' $byte)" >>"$path"; done
  done
  head -c 24 /dev/zero >>"$path"
  for ((i = 0; i < 32; i++)); do printf '\x00\x00\x80\x3f' >>"$path"; done # n.weight = 1.0
  head -c 210 /dev/zero >>"$path"                                          # one Q6_K block
}
