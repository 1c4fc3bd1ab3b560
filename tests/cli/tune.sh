#!/usr/bin/env bash
# qmm tune on the reference backend, a tiny grid (--quick): the file it writes loads back (through qmm bench, run
# and matmul --tuning), its contents, the summary table, and bad input (usage errors before any work; a bad
# or foreign table refused by --tuning with the library's message).
SUITE=cli_tune
source "$(dirname "$0")/lib.sh" "$@"

q tune --backend ref --quick --out "$WORK/t.json"
check "quick tune: exit 0" rc_is 0
check "summary header" out_matches '^shape +n×k +M +dtype +fastest kernel +µs +order.s pick +µs +gain +tuned pick'
check "one summary row per cell" [ "$(out_lines_matching '^quick\.[0-9x]+ +[0-9]+×[0-9]+ +[13] +f32 +ref\.qmm_t\.scalar\.r1 +[0-9.]+ +ref\.qmm_t\.scalar\.r1 +[0-9.]+ +[0-9.]+× +ref\.qmm_t\.scalar\.r1')" = 4 ]
check "M 1 and 3 grouped: 2 entries for 4 cells" out_has "wrote 2 entries for 4 cells to $WORK/t.json"
check "progress on stderr" err_matches '^tune \[4/4\] quick\.64x1024 M=3 f32: 1 kernel, fastest ref\.qmm_t\.scalar\.r1'
check "no temporary file left" [ "$(ls "$WORK" | grep -c 't\.json\.')" = 0 ]
check "mode 0666 under the umask" [ "$(stat -c %a "$WORK/t.json")" = "$(printf '%o' $((0666 & ~$(umask))))" ]
if command -v python3 >/dev/null; then
  check "the table's contents" python3 - "$WORK/t.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["format"] == "qmm-tuning" and d["version"] == 1 and d["backend"] == "ref" and d["device"], d
assert d["command"].startswith("qmm tune --backend ref") and d["quick"] is True
e = d["entries"]
assert len(e) == 2, e
for x in e:
    assert x["op"] == "qmm_t" and x["dtype"] == "f32" and x["bits"] == 4 and x["group_size"] == 64
    assert (x["m_min"], x["m_max"]) == (1, 3) and x["kernel"] == "ref.qmm_t.scalar.r1" and len(x["us"]) == 2
assert {(x["N"], x["K"]) for x in e} == {(256, 512), (64, 1024)}
PY
fi

# The file loads back into bench, run and matmul.
q bench --backend ref --quick --no-peers --tuning "$WORK/t.json" --m 1
check "bench --tuning: exit 0" rc_is 0
check "bench --tuning: header says the selector read the table" out_has "# the selector read a measured tuning table $WORK/t.json: 2 entries in use"
check "bench --tuning: stderr says it" err_has "bench: tuning table $WORK/t.json: 2 entries in use"
q run --backend ref --tuning "$WORK/t.json"
check "run --tuning: exit 0" rc_is 0
check "run --tuning: says it loaded the table" err_has "qmm run: tuning table $WORK/t.json: 2 entries in use"
q matmul "$FIXTURE" --layer blk.0.attn_q -m 2 --backend ref --tuning "$WORK/t.json"
check "matmul --tuning: exit 0" rc_is 0

# An entry of another device and one naming a kernel this build lacks are set aside and counted.
python3 - "$WORK/t.json" "$WORK/mixed.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
a = dict(d["entries"][0], m_min=4, m_max=8, device="some other CPU")
b = dict(d["entries"][0], m_min=9, m_max=9, kernel="ref.qmm_t.renamed")
d["entries"] += [a, b]
json.dump(d, open(sys.argv[2], "w"))
PY
q run --backend ref --tuning "$WORK/mixed.json"
check "set-aside entries: exit 0" rc_is 0
check "set-aside entries: counted" err_matches "tuning table $WORK/mixed.json: 2 entries in use; 1 set aside: measured on another device than \".+\"; 1 set aside: naming a kernel this build lacks"

# Refusals: --tuning answers with the library's status and message.
printf 'not json' >"$WORK/bad.json"
expect_library_error run "corrupt file" "tuning table '$WORK/bad.json' is not valid JSON" run --backend ref --tuning "$WORK/bad.json"
{ cat "$WORK/t.json"; printf ' junk'; } >"$WORK/trailing.json" # two tables, or a table and junk: not one table
expect_library_error run "corrupt file" "tuning table '$WORK/trailing.json' has data after its JSON value" \
  run --backend ref --tuning "$WORK/trailing.json"
mkfifo "$WORK/t-fifo.json" # opening a FIFO must not wait for a writer
QMM_TIMEOUT=60 expect_library_error run "I/O error" "tuning table '$WORK/t-fifo.json' is not a regular file" \
  run --backend ref --tuning "$WORK/t-fifo.json"
sed 's/"backend": "ref"/"backend": "cuda"/' "$WORK/t.json" >"$WORK/cuda.json"
expect_library_error bench "unsupported" "tuning table '$WORK/cuda.json' was measured on backend \"cuda\"; this context is backend ref" \
  bench --backend ref --quick --no-peers --tuning "$WORK/cuda.json"
sed 's/"bits": 4/"bits": 7/' "$WORK/t.json" >"$WORK/bits7.json"
expect_library_error matmul "corrupt file" "entries[0]: bits=7, group_size=64: bits must be one of 2, 3, 4, 5, 6, 8" \
  matmul "$FIXTURE" --layer blk.0.attn_q -m 2 --backend ref --tuning "$WORK/bits7.json"
sed 's/"m_min": 1/"m_min": 5/' "$WORK/t.json" >"$WORK/range.json"
expect_library_error run "corrupt file" "entries[0]: m_min=5 is greater than m_max=3 (the range is [m_min, m_max])" \
  run --backend ref --tuning "$WORK/range.json"
expect_library_error run "I/O error" "cannot open tuning table '$WORK/none.json'" run --backend ref --tuning "$WORK/none.json"

# usage errors and --out checks, before any work
expect_usage_error tune "--m '0'" tune --backend ref --quick --m 0
expect_usage_error tune "'f64' is not f32, f16 or bf16" tune --backend ref --quick --dtype f64
expect_usage_error tune "bits" tune --backend ref --quick --bits 7
expect_usage_error tune "--repeats" tune --backend ref --quick --repeats 0
expect_usage_error tune "unknown option" tune --backend ref --quick --peers
expect_library_error tune "not found" "--out '$WORK/no/t.json': '$WORK/no' does not exist" tune --backend ref --quick --out "$WORK/no/t.json"
expect_library_error tune "I/O error" "--out '$WORK' is a directory" tune --backend ref --quick --out "$WORK"
# the "wrote" line names an --out path with a control character escaped
q tune --backend ref --quick --out "$WORK/t"$'\x1b'".json"
check "--out with ESC: exit 0" rc_is 0
check "--out with ESC: the wrote line escaped" out_matches "^wrote [0-9]+ entr(y|ies) for [0-9]+ cells to $WORK/t\\\\x1b\\.json\$"
check "--out with ESC: no raw control character" bash -c '! grep -q "$1" <<<"$0"' "$OUT" $'\x1b'
check "refused --out: nothing written" [ ! -e "$WORK/no" ]
ln -s "$WORK/t.json" "$WORK/t-link.json"
expect_library_error tune "I/O error" "--out '$WORK/t-link.json' exists and is a symbolic link, not a regular file" \
  tune --backend ref --quick --out "$WORK/t-link.json"
check "refused --out symlink: still a symlink" [ -L "$WORK/t-link.json" ]
mkfifo "$WORK/t-fifo.json"
expect_library_error tune "I/O error" "--out '$WORK/t-fifo.json' exists and is a FIFO" tune --backend ref --quick --out "$WORK/t-fifo.json"
check "refused --out FIFO: still a FIFO" [ -p "$WORK/t-fifo.json" ]

# The default path: qmm-tuning-BACKEND.json in the current directory.
(cd "$WORK" && "$QMM" tune --backend ref --quick --m 1 >/dev/null 2>&1)
check "default --out: qmm-tuning-ref.json" [ -s "$WORK/qmm-tuning-ref.json" ]
# Shapes of one n×k (q_proj and o_proj of most models): one entry per (dtype, n×k, M) range, so the table
# loads (it held overlapping entries, refused by its own loader, and tune said exit 0). A dtype or M given
# twice is a usage error.
printf 'q 64 256\no 64 256\n' >"$WORK/same-nk.txt"
expect_usage_error tune "--dtype 'bf16,bf16' names bf16 twice" tune --backend ref --quick --m 1 --dtype bf16,bf16
q tune --backend ref --quick --m 1 --dtype bf16 --shapes "$WORK/same-nk.txt" --out "$WORK/same-nk.json"
check "same n×k: exit 0" rc_is 0
check "same n×k: the repeat is named" err_has "shape o (64×256) has the n×k of shape q: measured once, as q"
check "same n×k: one entry" out_has "wrote 1 entry for 1 cells"
check "same n×k: the table loaded back" bash -c '! grep -q "not loaded back" <<<"$1"' _ "$OUT"
q matmul "$FIXTURE" --layer blk.0.attn_q -m 1 --backend ref --tuning "$WORK/same-nk.json"
check "same n×k: the table loads in matmul" rc_is 0
# --threads: the CPU kernels' threads while measuring (the loaded-machine warning names it); bad values refused.
q tune --backend cpu --quick --m 1 --dtype f32 --threads 1 --out "$WORK/one-thread.json"
check "--threads 1: exit 0" rc_is 0
check "--threads 1: a table" out_matches '^wrote [0-9]+ entr(y|ies) for [0-9]+ cells'
check "--threads 1: the table's machine names 1 thread" grep -q '"machine": ".*, 1 thread"' "$WORK/one-thread.json"
expect_usage_error tune "--threads '0' is not a whole number from 1 to" tune --backend cpu --quick --threads 0
# A shape whose arrays would not fit in the host memory is refused before any measurement, naming the shape and both
# sizes (2^30 × 2^20 at 4 bits: ~512 TiB of codes alone, more than any machine; nothing of it is allocated).
if grep -q '^MemAvailable:' /proc/meminfo 2>/dev/null; then
  printf 'huge 1073741824 1048576\n' >"$WORK/huge.txt"
  expect_library_error tune "out of memory" "shape huge (1073741824×1048576) would hold ~" \
    tune --backend ref --quick --m 1 --dtype f32 --shapes "$WORK/huge.txt" --out "$WORK/huge.json"
  check "tune beyond the host memory: both sizes named" \
    err_matches "would hold ~[0-9]+\.[0-9] GiB of host memory at once \(the weights and their copies, x and out at the largest M\), more than the [0-9]+\.[0-9] GiB available \(MemAvailable in /proc/meminfo\): tune it on a larger machine or a smaller shape"
  check "tune beyond the host memory: no table written" [ ! -e "$WORK/huge.json" ]
fi
q help tune
check "help tune" out_has "usage: qmm tune"
check "help tune: --threads" out_has "--threads N"
finish
