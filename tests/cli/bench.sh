#!/usr/bin/env bash
# qmm bench on the reference backend, a tiny grid (--quick) without peers: the table's shape, the JSON's
# validity and contents, and bad input (every rule answers with its exit code before any work).
SUITE=cli_bench
source "$(dirname "$0")/lib.sh" "$@"

q bench --backend ref --quick --no-peers --json "$WORK/bench.json"
check "quick bench: exit 0" rc_is 0
check "header names the ceilings" out_matches '^# ceilings measured in this run: copy [0-9.]+ GB/s'
check "header names the matrix peak" out_matches 'matrix peak [0-9.]+ GFLOP/s'
check "an f32-only run: no bf16 peak line" [ "$(out_lines_matching 'bf16 peak')" = 0 ]
check "header names the floor" out_has "# floor = max(bytes ÷ copy, 2·M·n·k ÷ peak)"
check "table header" out_matches '^shape +n×k +M +dtype +floor µs +bound +kernel or peer +µs +GB/s +×floor +note'
check "one selected row per cell (2 shapes × 2 M × 1 dtype)" [ "$(out_lines_matching '^quick\.[0-9x]+ +[0-9]+×[0-9]+ +[0-9]+ +f32 +[0-9.]+ +(memory|compute) +\* ref\.qmm_t\.scalar\.r1 +[0-9.]+ +[0-9.]+ +[0-9.]+')" = 4 ]
check "says how long it took" out_matches '^bench took [0-9.]+ s \(4 cells\)'
check "summary header" out_has "summary by M: the selector's kernel over every shape and dtype"
check "summary: a line per M with its cells and ×floor range" [ "$(out_lines_matching '^[13] +2 +[0-9.]+–[0-9.]+ ')" = 2 ]
check "says where the JSON went" out_has "results written to $WORK/bench.json"
check "progress on stderr" err_matches '^bench \[4/4\] quick\.64x1024 M=3 f32: ref\.qmm_t\.scalar\.r1'
check "no progress on stdout" bash -c "! grep -q '^bench \[' <<<\"\$1\"" _ "$OUT"
if command -v python3 >/dev/null; then
  check "JSON is valid and complete" python3 - "$WORK/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["tool"] == "qmm bench" and d["backend"] == "ref" and d["command"].startswith("qmm bench --backend ref")
assert d["date"].endswith("Z") and d["machine"]["cpu"] and d["format"] == {"bits": 4, "group_size": 64}
assert d["ceilings"]["copy_gbps"] > 0 and d["ceilings"]["matrix_peak_gflops"] > 0
assert len(d["cells"]) == 4, len(d["cells"])
for c in d["cells"]:
    assert c["floor_us"] > 0 and c["bytes"] > 0 and c["flops"] == 2 * c["M"] * c["N"] * c["K"]
    assert c["selected"] == "ref.qmm_t.scalar.r1" and c["kernels"][0]["selected"] is True
    assert c["kernels"][0]["us"] > 0 and abs(c["kernels"][0]["x_floor"] - c["kernels"][0]["us"] / c["floor_us"]) < 1e-9
    assert c["peers"] == []
assert d["elapsed_s"] > 0
PY
fi

# --kernel: only that kernel; a name the backend lacks is an error naming it; one that does not support the
# call says why in its row.
q bench --backend ref --quick --no-peers --kernel ref.qmm_t.scalar.r1 --m 1
check "--kernel: exit 0" rc_is 0
check "--kernel: the forced row" out_matches '\* ref\.qmm_t\.scalar\.r1'
expect_library_error bench "not found" "--kernel 'nope' is not a kernel of backend ref" bench --backend ref --quick --kernel nope

# --selector-only: the selector's kernel alone in each cell (the CPU backend has several eligible rows per cell,
# so without it a cell has more than one kernel row); the header and the summary say so; not with --kernel.
q bench --backend cpu --quick --no-peers --json "$WORK/bench-all.json"
check "cpu quick: exit 0" rc_is 0
q bench --backend cpu --quick --no-peers --selector-only --json "$WORK/bench-sel.json"
check "--selector-only: exit 0" rc_is 0
check "--selector-only: header" out_has "# --selector-only: the selector's kernel alone is measured in each cell"
check "--selector-only: not decided" out_matches '^selector vs fastest: not decided .*--selector-only measures one'
if command -v python3 >/dev/null; then
  check "--selector-only: one kernel row per cell, the selector's, where the full run has more" \
    python3 - "$WORK/bench-all.json" "$WORK/bench-sel.json" <<'PY'
import json, sys
full, sel = (json.load(open(p)) for p in sys.argv[1:3])
assert sel["selector_only"] is True and full["selector_only"] is False
assert any(len(c["kernels"]) > 1 for c in full["cells"]), "the full run measured one row per cell: the test proves nothing"
assert len(sel["cells"]) == len(full["cells"])
for c in sel["cells"]:
    assert len(c["kernels"]) == 1 and c["kernels"][0]["selected"] is True and c["kernels"][0]["us"] > 0, c["kernels"]
    assert c["selector_fastest"] is None
PY
fi
expect_usage_error bench "--kernel and --selector-only both choose the kernel rows; give one of them" \
  bench --backend ref --quick --selector-only --kernel ref.qmm_t.scalar.r1

# --batch-invariant: one more row per cell, marked 'bi', its note the mode's cost; in the JSON too. A forced kernel
# the mode refuses gets a row saying why.
q bench --backend ref --quick --no-peers --batch-invariant --json "$WORK/bench-bi.json"
check "--batch-invariant: exit 0" rc_is 0
check "--batch-invariant: header" out_has "# --batch-invariant: 'bi' rows are the selector's choice"
check "--batch-invariant: a bi row per cell" [ "$(out_lines_matching ' bi ref\.qmm_t\.scalar\.r1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +batch-invariant mode \(order "oracle"\): [0-9.]+× the default selector.s time')" = 4 ]
check "--batch-invariant: the selector is still judged on default rows" out_matches '^selector vs fastest: not decided'
if command -v python3 >/dev/null; then
  check "--batch-invariant: JSON" python3 - "$WORK/bench-bi.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["batch_invariant"] is True
for c in d["cells"]:
    bi = [k for k in c["kernels"] if k["batch_invariant"]]
    assert len(bi) == 1 and bi[0]["name"] == "ref.qmm_t.scalar.r1" and bi[0]["us"] > 0, c["kernels"]
    assert [k for k in c["kernels"] if not k["batch_invariant"]][0]["selected"] is True
PY
fi
q kernels --backend cpu
if [ "$RC" = 0 ]; then
  # A GEMV row (no batch-invariant order) that this CPU can run: the AVX-512 one, else the AVX2 one.
  KERNELS=$OUT
  GEMV_ROW=
  for row in cpu.qmm_t.gemv.r8.avx512 cpu.qmm_t.gemv.r4.avx2; do
    if printf '%s\n' "$KERNELS" | grep -q "$row .*usable: yes"; then GEMV_ROW=$row; break; fi
  done
  if [ -n "$GEMV_ROW" ]; then
    q bench --backend cpu --quick --no-peers --batch-invariant --kernel "$GEMV_ROW" --m 1
    check "--batch-invariant --kernel without an order: exit 0" rc_is 0
    check "--batch-invariant --kernel without an order: the row says why" out_has "not eligible in batch-invariant mode: forced kernel $GEMV_ROW does not support this call"
  fi
  # A forced kernel this CPU cannot run is refused before the work (every cell would be "not eligible").
  if ! printf '%s\n' "$KERNELS" | grep -q "cpu.qmm_t.gemv.r8.avx512 .*usable: yes"; then
    expect_library_error bench "unsupported" "--kernel 'cpu.qmm_t.gemv.r8.avx512' cannot run on this machine" \
      bench --backend cpu --quick --no-peers --kernel cpu.qmm_t.gemv.r8.avx512 --m 1
  fi
fi
# --json where no file can be created (procfs refuses, even to root): refused before the work.
if [ -d /proc ] && [ -e /proc/version ]; then
  expect_library_error bench "I/O error" "cannot write there (checked before the work)" \
    bench --backend ref --quick --no-peers --json /proc/version
fi
expect_usage_error bench "--batch-invariant given twice" bench --backend ref --quick --batch-invariant --batch-invariant

# --op n: qmm_n (x·Ŵ) cells on the same shapes — the header says so, every row is a qmm_n row, the JSON's op is
# qmm_n; bad values, --gather, a kernel of the other op and a shape whose n is not a multiple of the group refuse.
q bench --backend ref --quick --no-peers --op n --json "$WORK/bench-n.json"
check "--op n: exit 0" rc_is 0
check "--op n: header" out_has "qmm_n out[M, n] = x[M, k]·Ŵ, Ŵ [k, n] quantized along n"
check "--op n: a selected qmm_n row per cell" [ "$(out_lines_matching '^quick\.[0-9x]+ +[0-9]+×[0-9]+ +[0-9]+ +f32 +[0-9.]+ +(memory|compute) +\* ref\.qmm_n\.scalar\.r1 +[0-9.]+')" = 4 ]
check "--op n: no qmm_t row" bash -c "! grep -q 'qmm_t' <<<\"\$1\"" _ "$OUT"
if command -v python3 >/dev/null; then
  check "--op n: JSON op" python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["op"] == "qmm_n", d["op"]; assert all(k["name"].startswith("ref.qmm_n.") for c in d["cells"] for k in c["kernels"])' "$WORK/bench-n.json"
fi
expect_usage_error bench "--op 'x' is not t (qmm_t, x·Ŵᵀ) or n (qmm_n, x·Ŵ)" bench --backend ref --quick --op x
expect_usage_error bench "--bits 7 --group-size 64: bits=7 is not supported (allowed: {2, 3, 4, 5, 6, 8})" bench --backend ref --quick --bits 7
expect_usage_error bench "--op does not apply to --gather" bench --backend ref --quick --op n --gather
expect_usage_error bench "--kernel 'ref.qmm_t.scalar.r1' computes qmm_t; this run measures qmm_n kernels" \
  bench --backend ref --quick --op n --kernel ref.qmm_t.scalar.r1
expect_usage_error bench "--kernel 'ref.qmm_n.scalar.r1' computes qmm_n; this run measures qmm_t kernels (--op n measures qmm_n kernels)" \
  bench --backend ref --quick --kernel ref.qmm_n.scalar.r1
printf 'odd 100 256\n' >"$WORK/odd.txt"
expect_library_error bench "bad shape" "--op n: shape odd has n=100, not a multiple of --group-size 64" \
  bench --backend ref --quick --op n --shapes "$WORK/odd.txt"
# the --quick grid keeps the shapes whose n is a multiple of the group (quick.256x512 at group 128)
q bench --backend ref --quick --no-peers --op n --group-size 128
check "--op n --group-size 128 --quick: exit 0" rc_is 0
check "--op n --group-size 128 --quick: quick.256x512 only" [ "$(out_lines_matching '^quick\.256x512 .*\* ref\.qmm_n\.scalar\.r1')" = 2 ]

# shapes files
printf '# a comment\nmine 128 256   # trailing comment\n\n' >"$WORK/shapes.txt"
q bench --backend ref --no-peers --shapes "$WORK/shapes.txt" --m 2 --dtype bf16 --repeats 1 --quick
check "--shapes FILE: exit 0" rc_is 0
check "--shapes FILE: its shape" out_matches '^mine +128×256 +2 +bf16'
printf 'bad 128\n' >"$WORK/bad.txt"
expect_library_error bench "" "$WORK/bad.txt:1: want \"name N K\"" bench --backend ref --quick --shapes "$WORK/bad.txt"
printf 'odd 128 100\n' >"$WORK/odd.txt"
expect_library_error bench "" "K=100, not a multiple of --group-size 64" bench --backend ref --quick --shapes "$WORK/odd.txt"
expect_library_error bench "not found" "--shapes 'nosuch'" bench --backend ref --quick --shapes nosuch
# Lines of any length: a comment longer than a line buffer is still a comment, and an overlong name or
# number is named as such (once cut into two fields, it read "got 4 fields" or a comment's tail as a shape).
{ printf '# %0600d\nlong 128 256 # %0600d\n' 0 0; } >"$WORK/long.txt"
q bench --backend ref --no-peers --shapes "$WORK/long.txt" --m 1 --dtype bf16 --repeats 1 --quick
check "--shapes with 600-character comments: exit 0" rc_is 0
check "--shapes with 600-character comments: its shape" out_matches '^long +128×256 +1 +bf16'
printf '%0130d 128 256\n' 0 >"$WORK/longname.txt"
expect_library_error bench "corrupt file" "$WORK/longname.txt:1: shape name '00000000000000000000000000000000…' is longer than 63 characters" \
  bench --backend ref --quick --shapes "$WORK/longname.txt"
# A NUL byte is refused, naming the file, the line and the rule: C strings would cut the line there (the text after
# it silently dropped) or, at its start, skip the line.
printf 'ok 64 64\nmine 128 256\0 junk\n' >"$WORK/nul.txt"
expect_library_error bench "corrupt file" "$WORK/nul.txt:2: a NUL byte at column 13; a shapes file is text (\"name N K\" lines)" \
  bench --backend ref --quick --shapes "$WORK/nul.txt"
printf 'ok 64 64\n\0skipped 128 256\n' >"$WORK/nul-first.txt"
expect_library_error bench "corrupt file" "$WORK/nul-first.txt:2: a NUL byte at column 1" \
  bench --backend ref --quick --shapes "$WORK/nul-first.txt"
printf 'n %040d 256\n' 128 >"$WORK/longnumber.txt"
expect_ok "--shapes: a 40-digit N with leading zeros is 128" bench --backend ref --no-peers --quick --m 1 --dtype bf16 \
  --repeats 1 --shapes "$WORK/longnumber.txt"

# usage errors, before any work
expect_usage_error bench "--m '0'" bench --backend ref --quick --m 0
expect_usage_error bench "--m '1,,2'" bench --backend ref --quick --m 1,,2
expect_usage_error bench "'f64' is not f32, f16 or bf16" bench --backend ref --quick --dtype f32,f64
expect_usage_error bench "bits" bench --backend ref --quick --bits 7
expect_usage_error bench "--repeats '0'" bench --backend ref --quick --repeats 0
expect_usage_error bench "--m '1,2,1' names 1 twice" bench --backend ref --quick --m 1,2,1
expect_usage_error bench "--dtype 'f32,f32' names f32 twice" bench --backend ref --quick --dtype f32,f32
printf 'same 64 64\nsame 32 64\n' >"$WORK/dup-shapes.txt"
expect_library_error bench "invalid argument" "shape name 'same' is already used" bench --backend ref --quick --shapes "$WORK/dup-shapes.txt"
expect_library_error bench "not found" "'/etc/passwd' is not a directory" bench --backend ref --quick --json /etc/passwd/x.json
expect_usage_error bench "--backend 'gpu'" bench --backend gpu
expect_usage_error bench "unknown option '--frobnicate'" bench --frobnicate
expect_library_error bench "not found" "does not exist" bench --backend ref --quick --json "$WORK/no/such/dir/x.json"
# --json FILE: written through a unique temporary file (O_EXCL) and a rename; an existing FILE.tmp is not
# touched; a target that exists and is not a regular file (a symbolic link, a FIFO, a device: rename would
# replace it) is refused before any work, naming it.
printf 'keep me' >"$WORK/r.json.tmp"
q bench --backend ref --quick --no-peers --m 1 --json "$WORK/r.json"
check "--json beside an existing FILE.tmp: exit 0" rc_is 0
check "--json: FILE.tmp untouched" [ "$(cat "$WORK/r.json.tmp")" = "keep me" ]
check "--json: no temporary file left" [ "$(ls "$WORK" | grep -c '^r\.json\..*tmp-')" = 0 ]
check "--json: mode 0666 under the umask" [ "$(stat -c %a "$WORK/r.json")" = "$(printf '%o' $((0666 & ~$(umask))))" ]
printf 'target' >"$WORK/target.json"
ln -s "$WORK/target.json" "$WORK/link.json"
expect_library_error bench "I/O error" "--json '$WORK/link.json' exists and is a symbolic link, not a regular file" \
  bench --backend ref --quick --no-peers --m 1 --json "$WORK/link.json"
check "--json symlink: refused before any work" bash -c '! grep -q "measuring" <<<"$1"' _ "$ERR"
check "--json symlink: still a symlink" [ -L "$WORK/link.json" ]
check "--json symlink: its target untouched" [ "$(cat "$WORK/target.json")" = target ]
mkfifo "$WORK/fifo.json"
expect_library_error bench "I/O error" "--json '$WORK/fifo.json' exists and is a FIFO, not a regular file" \
  bench --backend ref --quick --no-peers --m 1 --json "$WORK/fifo.json"
check "--json FIFO: still a FIFO" [ -p "$WORK/fifo.json" ]
# --shapes: an empty value or item, or one of 2048 bytes or more, is a usage error before any work; a
# directory is named as one; a shapes file without shapes is refused even among others.
expect_usage_error bench "--shapes is empty" bench --backend ref --quick --no-peers --shapes ''
expect_usage_error bench "--shapes ',': an empty item" bench --backend ref --quick --no-peers --shapes ,
expect_usage_error bench "an empty item" bench --backend ref --quick --no-peers --shapes seed,
expect_usage_error bench "an empty item" bench --backend ref --quick --no-peers --shapes seed,,qwen3
expect_usage_error bench "--shapes 'seed,qwen3,seed': 'seed' is listed twice" bench --backend ref --quick --no-peers \
  --shapes seed,qwen3,seed
expect_usage_error bench "--shapes is 2048 bytes long" bench --backend ref --quick --no-peers --shapes "$(printf 'a%.0s' {1..2048})"
expect_usage_error tune "--shapes is empty" tune --backend ref --quick --shapes '' --out "$WORK/t.json"
expect_library_error bench "I/O error" "--shapes '$WORK' is a directory, not a shapes file" \
  bench --backend ref --quick --no-peers --shapes "$WORK"
check "--shapes DIR: no bench/shapes path made of it" bash -c '! grep -q "bench/shapes/" <<<"$1"' _ "$ERR"
printf 'one 64 128\n' >"$WORK/one.txt"
printf '# only a comment\n' >"$WORK/none.txt"
expect_library_error bench "corrupt file" "shapes file '$WORK/none.txt' has no shapes" \
  bench --backend ref --quick --no-peers --m 1 --shapes "$WORK/one.txt,$WORK/none.txt"
# A switch given twice is a usage error, as any other option given twice.
expect_usage_error bench "--quick given twice" bench --backend ref --quick --quick
expect_usage_error bench "--no-peers given twice" bench --backend ref --quick --no-peers --no-peers
expect_ok "--help" bench --help
check "--help shows the usage" out_has "usage: qmm bench"

# --gather: the MoE gather op on a tiny stack (8 experts, 2 per token, T = 1 and 3): one cell per (shape, T),
# every gather row timed, the header and JSON say what was measured; the options are checked before any work.
q bench --backend ref --gather --quick --no-peers --experts 8 --experts-per-token 2 --json "$WORK/gather.json"
check "--gather: exit 0" rc_is 0
check "--gather: header names the op" out_has "MoE gather out[i, n] = x[lhs[i], k]·Ŵ[rhs[i]]ᵀ over 8 experts of n×k, 2 distinct experts per token"
check "--gather: floor over the experts touched" out_has "bytes = the experts a call touches"
check "--gather: T column" out_matches '^shape +n×k +T +dtype'
check "--gather: one selected row per cell (2 shapes × 2 T)" [ "$(out_lines_matching '^quick\.[0-9x]+ +[0-9]+×[0-9]+ +[13] +f32 +[0-9.]+ +(memory|compute) +\* ref\.gather\.blocks\.r1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +B=(2|6), [0-9.]+ experts touched')" = 4 ]
check "--gather: the other gather row too" out_matches '^ +ref\.gather\.scalar\.r1 +[0-9.]+'
check "--gather: no qmm_t row" bash -c '! grep -q "qmm_t\.scalar" <<<"$1"' _ "$OUT"
check "--gather: progress names T and B" err_matches '^bench \[4/4\] gather quick\.64x1024 T=3 B=6 f32: ref\.gather\.blocks\.r1'
if command -v python3 >/dev/null; then
  check "--gather: JSON" python3 - "$WORK/gather.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["op"] == "gather" and d["gather"] == {"experts": 8, "top_k": 2, "routings": 8}, d.get("gather")
assert len(d["cells"]) == 4
for c in d["cells"]:
    assert c["B"] == 2 * c["T"] and c["M"] == c["T"] and 1 <= c["experts_touched"] <= min(8, c["B"])
    assert c["flops"] == 2 * c["B"] * c["N"] * c["K"] and c["floor_us"] > 0
    names = [k["name"] for k in c["kernels"]]
    assert names == ["ref.gather.blocks.r1", "ref.gather.scalar.r1"], names
    assert all(k["us"] > 0 for k in c["kernels"])
    assert c["peers"] == [], c["peers"]  # --no-peers
assert d["peers_absent"] == [], d["peers_absent"]
PY
fi
check "--gather --no-peers: no peer row" bash -c '! grep -q "peer mlx-gather-cpu" <<<"$1"' _ "$OUT"
# --gather --batch-invariant: a 'bi' row per cell (qmm_gather_options.batch_invariant), its note the mode's cost (on
# CUDA too: its gather row has an order of its own, "gather-fixed-per-format").
q bench --backend ref --gather --quick --no-peers --experts 8 --experts-per-token 2 --batch-invariant --json "$WORK/gather-bi.json"
check "--gather --batch-invariant: exit 0" rc_is 0
check "--gather --batch-invariant: header" out_has "'bi' rows are the selector's choice (or --kernel) with qmm_gather_options.batch_invariant on"
check "--gather --batch-invariant: a bi row per cell" [ "$(out_lines_matching ' bi ref\.gather\.blocks\.r1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +batch-invariant mode \(order "oracle"\): [0-9.]+× the default selector.s time')" = 4 ]
if command -v python3 >/dev/null; then
  check "--gather --batch-invariant: JSON" python3 - "$WORK/gather-bi.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["batch_invariant"] is True and len(d["cells"]) == 4
for c in d["cells"]:
    bi = [k for k in c["kernels"] if k["batch_invariant"]]
    assert [k["name"] for k in bi] == ["ref.gather.blocks.r1"] and bi[0]["us"] > 0, bi
PY
fi
if grep -q "^backend cuda: [0-9]" <<<"$("$QMM" kernels --backend cuda 2>/dev/null)"; then
  q bench --backend cuda --gather --quick --no-peers --experts 8 --experts-per-token 2 --m 1 --dtype f16 --batch-invariant
  check "--gather --batch-invariant --backend cuda: exit 0" rc_is 0
  check "--gather --batch-invariant --backend cuda: a bi row" \
    out_matches ' bi cuda\.gather\.blocks\.auto +[0-9.]+ +[0-9.]+ +[0-9.]+ +batch-invariant mode \(order "gather-fixed-per-format"\): [0-9.]+× the default'
fi
# --gather with peers: MLX's mx.gather_qmm on the CPU (bench/peers/mlx_gather_cpu.py through .venv) gets a row
# under every cell, in the JSON too; without .venv or MLX the header lists it as absent, with the reason.
q bench --backend ref --gather --quick --experts 8 --experts-per-token 2 --m 1 --dtype f32 --json "$WORK/gather-peer.json"
check "--gather with peers: exit 0" rc_is 0
if [ -x "$SRC/.venv/bin/python" ] && "$SRC/.venv/bin/python" -c 'import mlx.core' 2>/dev/null; then
  check "--gather: the MLX gather_qmm peer row under each cell" \
    [ "$(out_lines_matching '^ +peer mlx-gather-cpu +[0-9.]+ +[0-9.]+ +[0-9.]+ +mlx [0-9.]+ cpu gather_qmm')" = 2 ]
  check "--gather: the peer got the stack and the routing" err_has "--experts 8 --experts-per-token 2 --quick"
  if command -v python3 >/dev/null; then
    check "--gather: the peer in the JSON" python3 - "$WORK/gather-peer.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["cells"]) == 2 and d["peers_absent"] == [], d["peers_absent"]
for c in d["cells"]:
    assert [p["name"] for p in c["peers"]] == ["mlx-gather-cpu"], c["peers"]
    p = c["peers"][0]
    assert p["us"] > 0 and abs(p["x_floor"] - p["us"] / c["floor_us"]) < 1e-9 and "gather_qmm" in p["note"]
PY
  fi
else
  check "--gather: the MLX gather_qmm peer absent, with the reason" out_matches '^# peer mlx-gather-cpu: absent: .+'
fi
if grep -q "^backend cpu: [0-9]" <<<"$("$QMM" kernels --backend cpu 2>/dev/null)"; then
  q bench --backend cpu --gather --quick --no-peers --experts 8 --m 1 --dtype bf16
  check "--gather --backend cpu: exit 0" rc_is 0
  check "--gather --backend cpu: a CPU gather row selected" out_matches '^quick\.[0-9x]+ +[0-9]+×[0-9]+ +1 +bf16 +[0-9.]+ +(memory|compute) +\* cpu\.gather\.blocks\.'
  check "--gather --backend cpu: the reference row as the baseline" out_matches '^ +ref\.gather\.blocks\.r1 +[0-9.]+'
  q bench --backend cpu --gather --quick --no-peers --experts 8 --m 1 --dtype f32 --batch-invariant
  check "--gather --batch-invariant --backend cpu: exit 0" rc_is 0
  check "--gather --batch-invariant --backend cpu: an ordered CPU gather row" \
    out_matches ' bi cpu\.gather\.(blocks_ordered\.avx(512|2)|blocks\.portable) +[0-9.]+ .*batch-invariant mode \(order "(split-fma-d32|split-fma-d16|oracle)"\)'
fi
# --gather --backend cuda (on a machine with a usable GPU): the CUDA gather row, timed on the host clock per streamed
# call, says so in the header; elsewhere the backend's absence is a library error.
if grep -q "^backend cuda: [0-9]" <<<"$("$QMM" kernels --backend cuda 2>/dev/null)"; then
  q bench --backend cuda --gather --quick --no-peers --experts 8 --experts-per-token 2 --dtype f16,bf16
  check "--gather --backend cuda: exit 0" rc_is 0
  check "--gather --backend cuda: the CUDA gather row selected in every cell (2 shapes × 2 T × 2 dtypes)" \
    [ "$(out_lines_matching '^quick\.[0-9x]+ +[0-9]+×[0-9]+ +[13] +b?f16 +[0-9.]+ +(memory|compute) +\* cuda\.gather\.blocks\.auto +[0-9.]+ +[0-9.]+ +[0-9.]+ +B=(2|6), ')" = 8 ]
  check "--gather --backend cuda: the timing says what is in the time" \
    out_has "calls stream as a model's layers would: the index uploads, every launch and the GPU's work are in the time"
else
  expect_library_error bench "[a-z ]+" "--backend cuda" bench --backend cuda --gather --quick --no-peers
fi
# A gather row whose one pass over the weight copies would take more than ~20 s is skipped with a note, not run for
# minutes. T = 65536 tokens on a tiny stack: 512 copies of calls of 0.03–0.1 s here; the test hook puts the
# threshold at 0.2 s, far below any machine's pass, so the answer does not depend on the machine's speed.
printf 'tiny 64 64\n' >"$WORK/tiny.txt"
QMM_BENCH_GATHER_SKIP_S=0.2 q bench --gather --backend ref --experts 2 --experts-per-token 1 --shapes "$WORK/tiny.txt" \
  --m 65536 --dtype f32 --no-peers
check "--gather, a very slow row: exit 0" rc_is 0
check "--gather, a very slow row: skipped with the estimate" \
  out_matches '^tiny +64×64 +65536 +f32 .* \* ref\.gather\.blocks\.r1 +— .*skipped: one pass of [0-9]+ calls would take ~[0-9]+ s'
# A shape whose arrays would not fit in the host memory available is refused before any measurement, naming the shape,
# both sizes and the way out — not left to be killed by the system (1048576² 4-bit: ~512 GiB of codes alone).
if grep -q '^MemAvailable:' /proc/meminfo 2>/dev/null; then
  printf 'huge 1048576 1048576\n' >"$WORK/huge.txt"
  expect_library_error bench "out of memory" "shape huge (1048576×1048576) would hold ~" \
    bench --backend ref --quick --shapes "$WORK/huge.txt" --m 1 --dtype f32 --no-peers
  check "a shape beyond the host memory: the available size named" err_matches "GiB available \(MemAvailable in /proc/meminfo\)"
  expect_library_error bench "out of memory" "shape huge (1048576×1048576 per expert) would hold ~" \
    bench --gather --backend ref --quick --shapes "$WORK/huge.txt" --experts 2 --experts-per-token 1 --m 1 --dtype f32 --no-peers
fi
# Text from outside reaches the terminal escaped: a shapes file's bad name or number (a control character as \xNN), and
# a peer script's line that is not JSON (passed on to stderr); a script's text in the table keeps printable UTF-8, '?'
# for the rest (a C1 control included). The peer's python is a stand-in: QMM_SOURCE_DIR points at a folder whose
# .venv/bin/python prints the lines whatever script it is given.
ESC=$'\x1b'
printf 'bad\x1bname 64 64\n' >"$WORK/esc-name.txt"
expect_library_error bench "corrupt file" "$WORK/esc-name.txt:1: shape name 'bad\\x1bname' must be" \
  bench --backend ref --quick --shapes "$WORK/esc-name.txt"
check "a shapes file's name: no raw control character" bash -c '! grep -q "$1" <<<"$0"' "$ERR" "$ESC"
printf 'n 6\x1b4 64\n' >"$WORK/esc-number.txt"
expect_library_error bench "corrupt file" "$WORK/esc-number.txt:1: N='6\\x1b4' and K='64' must be whole numbers" \
  bench --backend ref --quick --shapes "$WORK/esc-number.txt"
check "a shapes file's number: no raw control character" bash -c '! grep -q "$1" <<<"$0"' "$ERR" "$ESC"
# the success line names the JSON path escaped, as the error lines do
q bench --backend ref --quick --no-peers --m 1 --json "$WORK/q${ESC}z.json"
check "--json path with a control character: exit 0" rc_is 0
check "--json path with a control character: the written line escaped" out_has "results written to $WORK/q\\x1bz.json"
check "--json path with a control character: no raw control character" bash -c '! grep -q "$1" <<<"$0"' "$OUT" "$ESC"
# an argument that is not UTF-8 (a path's byte 0xff): the JSON still parses, the command line shows it as \xff
printf 'a 64 64\n' >"$WORK/s"$'\xff'".txt"
q bench --backend ref --quick --no-peers --m 1 --shapes "$WORK/s"$'\xff'".txt" --json "$WORK/bench-ff.json"
check "a non-UTF-8 argument: exit 0" rc_is 0
if command -v python3 >/dev/null; then
  check "a non-UTF-8 argument: the JSON is valid UTF-8 and names it escaped" python3 - "$WORK/bench-ff.json" <<'PY'
import json, sys
d = json.loads(open(sys.argv[1], "rb").read().decode("utf-8"))
assert "s\\xff.txt" in d["command"], d["command"]
PY
fi
# a byte order mark (an editor's) is shown escaped: 'seed' alone would read as a valid name
printf '\xef\xbb\xbfseed 64 64\n' >"$WORK/bom.txt"
expect_library_error bench "corrupt file" "$WORK/bom.txt:1: shape name '\\xef\\xbb\\xbfseed' must be" \
  bench --backend ref --quick --shapes "$WORK/bom.txt"
# a field longer than the 32 bytes shown is cut before a character, not inside it (é's first byte read as \xc3)
printf 'n 9999999999999999999999999999999\xc3\xa9 64\n' >"$WORK/long-number.txt"
expect_library_error bench "corrupt file" "$WORK/long-number.txt:1: N='9999999999999999999999999999999…' and K='64'" \
  bench --backend ref --quick --shapes "$WORK/long-number.txt"
mkdir -p "$WORK/fake-src/.venv/bin"
cat >"$WORK/fake-src/.venv/bin/python" <<'SH'
#!/bin/sh
printf 'chatter \033[31mred\033[0m \302\233csi \346\250\241\n'
printf '{"peer": "c1", "shape": "tiny", "M": 1, "dtype": "f32", "us": 9.0, "note": "c1 \\u009b here"}\n'
SH
chmod +x "$WORK/fake-src/.venv/bin/python"
QMM_SOURCE_DIR="$WORK/fake-src" q bench --backend ref --quick --shapes "$WORK/tiny.txt" --m 1 --dtype f32 --repeats 1 \
  --kernel ref.qmm_t.scalar.r1
check "a peer's non-JSON line: exit 0" rc_is 0
check "a peer's non-JSON line: passed on escaped" err_has '  peer: chatter \x1b[31mred\x1b[0m \xc2\x9bcsi 模'
check "a peer's non-JSON line: no raw control character" bash -c '! grep -q "$1" <<<"$0"' "$ERR" "$ESC"
check "a peer's C1 control in the table: '?'" out_matches 'peer c1 +9\.0 .* c1 \? here'
# A peer's line holding a NUL byte is not read as JSON up to the NUL but passed on whole, escaped; a line over 64 KiB
# with a NUL early in it is dropped as too long, not split into a cut line and lines of its tail (here the tail's
# first 64 KiB end just before a result line, which was taken).
mkdir -p "$WORK/fake-nul/.venv/bin"
cat >"$WORK/fake-nul/.venv/bin/python" <<'SH'
#!/bin/sh
printf 'before\000{"peer": "hidden", "shape": "tiny", "M": 1, "dtype": "f32", "us": 9.0}\n'
printf '{"a": 1}\000'; head -c 65526 /dev/zero | tr '\000' x
printf '{"peer": "tail", "shape": "tiny", "M": 1, "dtype": "f32", "us": 9.0}\n'
SH
chmod +x "$WORK/fake-nul/.venv/bin/python"
QMM_SOURCE_DIR="$WORK/fake-nul" q bench --backend ref --quick --shapes "$WORK/tiny.txt" --m 1 --dtype f32 --repeats 1 \
  --kernel ref.qmm_t.scalar.r1
check "a peer's line with a NUL: exit 0" rc_is 0
check "a peer's line with a NUL: passed on whole, escaped" \
  err_has '  peer: before\x00{"peer": "hidden", "shape": "tiny", "M": 1, "dtype": "f32", "us": 9.0}'
check "a peer's long line with a NUL: dropped as too long" err_has '  peer: 1 line longer than 64 KiB dropped'
check "a peer's lines with a NUL: no result taken from them" bash -c '! grep -qE "peer (hidden|tail) " <<<"$0"' "$OUT"
# Shape lists too long for a peer script's command line (8 KiB) leave the peers absent instead of cut short.
for i in $(seq 100 239); do printf 's%s%d 32 64\n' "$(printf 'x%.0s' $(seq 58))" "$i"; done >"$WORK/many.txt"
q bench --backend ref --quick --shapes "$WORK/many.txt" --m 1 --dtype f32 --kernel ref.qmm_t.scalar.r1
check "140 long shape names: exit 0" rc_is 0
check "140 long shape names: the peer absent, with the reason" \
  out_matches "^# peer mlx-cpu: absent: the shapes or M list is too long for the script's command line"
# A peer script's lines are checked: a time that is not finite, from 0.001 to 1e9 µs leaves the cell's peer skipped
# with the value and the rule; a line whose M is not a whole number from 1 to 65536 is dropped, and a second line for a
# cell, both said on stderr; text is kept to printable UTF-8 (test hook: QMM_BENCH_PEERS_DIR, a folder of scripts with
# the peers' names). The CPU peers run with the project's .venv python.
if [ -x "$SRC/.venv/bin/python" ]; then
  mkdir -p "$WORK/peers"
  cat >"$WORK/peers/mlx_cpu.py" <<'PY'
import json
for line in ({"peer": "mlx-cpu", "shape": "tiny", "M": 1, "dtype": "f32", "us": -3.0, "note": "fake"},
             {"peer": "mlx-cpu", "shape": "tiny", "M": 2, "dtype": "f32", "us": 1e999, "note": "fake"},
             {"peer": "mlx-cpu", "shape": "tiny", "M": -1, "dtype": "f32", "us": 5.0, "note": "fake"},
             {"peer": "mlx-cpu", "shape": "tiny", "M": 1.5, "dtype": "f32", "us": 5.0, "note": "fake"},
             {"peer": "mlx-cpu", "shape": "tiny", "M": 1.0000001, "dtype": "f32", "us": 5.0, "note": "fake"},
             {"peer": "mlx-cpu", "shape": "tiny", "M": 1, "dtype": "f32", "us": 7.0, "note": "a second line"},
             {"peer": "odd", "shape": "tiny", "M": 1, "dtype": "f32", "us": 9.0, "note": "line\nbreak \u001b[31m"},
             {"peer": "mlx-cpu", "shape": "nowhere", "M": 1, "dtype": "f32", "us": 9.0, "note": "no such cell"}):
    print(json.dumps(line).replace("Infinity", "1e999"), flush=True)
PY
  printf 'import json
print(json.dumps({"peer": "ggml", "absent": "a test stand-in"}))
' >"$WORK/peers/ggml_cpu.py"
  QMM_BENCH_PEERS_DIR="$WORK/peers" q bench --backend ref --quick --shapes "$WORK/tiny.txt" --m 1,2 --dtype f32 --repeats 1 \
    --kernel ref.qmm_t.scalar.r1 --json "$WORK/peers.json"
  check "a peer's bad lines: exit 0" rc_is 0
  check "a peer's negative time: skipped, naming the value and the rule" \
    out_matches 'peer mlx-cpu +— .*skipped: the script reported us=-3 \(a time must be finite, from 0\.001 to 1e9 µs\)'
  check "a peer's infinite time: skipped" out_matches 'peer mlx-cpu +— .*skipped: the script reported us=inf'
  check "a peer's M=-1: dropped, said on stderr" err_has "peer mlx-cpu: a line with M=-1 is ignored (M must be a whole number from 1 to 65536)"
  check "a peer's M=1.5: dropped, said on stderr" err_has "peer mlx-cpu: a line with M=1.5 is ignored"
  check "a peer's M=1.0000001: dropped, named with every digit" \
    err_has "peer mlx-cpu: a line with M=1.0000001000000001 is ignored (M must be a whole number from 1 to 65536)"
  check "a peer's second line for a cell: dropped, said on stderr" err_has "peer mlx-cpu: a second line for tiny M=1 f32 is ignored"
  check "a peer's line naming no cell: said on stderr" err_has "peer mlx-cpu: 1 line named no cell of this run (shape, M, dtype): ignored"
  check "a peer's control characters: printed as '?'" out_matches 'peer odd +9\.0 .* line\?break \?\[31m'
  check "a peer's bad time: null in the JSON" python3 - "$WORK/peers.json" <<'PY'
import json, sys
cells = json.load(open(sys.argv[1]))["cells"]
peers = [p for c in cells for p in c["peers"] if p["name"] == "mlx-cpu"]
assert len(peers) == 2 and all(p["us"] is None and "must be finite" in p["note"] for p in peers), peers
PY
  # a script's output is read with bounds: a line past 64 KiB is dropped, and results past four per cell (+ 64)
  mkdir -p "$WORK/peers-flood"
  cat >"$WORK/peers-flood/mlx_cpu.py" <<'PY'
import json
print("x" * 70000, flush=True)
for i in range(100):
    print(json.dumps({"peer": "mlx-cpu", "shape": "tiny", "M": 1, "dtype": "f32", "us": 3.0 + i, "note": "flood"}))
PY
  cp "$WORK/peers/ggml_cpu.py" "$WORK/peers-flood/" # the absent stand-in above
  QMM_BENCH_PEERS_DIR="$WORK/peers-flood" q bench --backend ref --quick --shapes "$WORK/tiny.txt" --m 1 --dtype f32 \
    --repeats 1 --kernel ref.qmm_t.scalar.r1
  check "a flooding peer: exit 0" rc_is 0
  check "a flooding peer: its first result kept" out_matches 'peer mlx-cpu +3\.0 .*flood'
  check "a flooding peer: the long line dropped, said on stderr" err_has "peer: 1 line longer than 64 KiB dropped"
  check "a flooding peer: results past the cap dropped, said on stderr" \
    err_has "peer: 32 result lines past the first 68 dropped (more than the run's cells allow)"
  # --peer-timeout: a script that hangs is stopped at the deadline; what it printed before is kept, one that printed
  # nothing is absent, saying why (coreutils timeout; SIGKILL 10 s after SIGTERM for a script that ignores it)
  if command -v timeout >/dev/null; then
    mkdir -p "$WORK/peers-hang"
    cat >"$WORK/peers-hang/mlx_cpu.py" <<'PY'
import json, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the follow-up SIGKILL must stop it
print(json.dumps({"peer": "mlx-cpu", "shape": "tiny", "M": 1, "dtype": "f32", "us": 4.0, "note": "before the hang"}),
      flush=True)
time.sleep(600)
PY
    printf 'import time
time.sleep(600)
' >"$WORK/peers-hang/ggml_cpu.py"
    started=$SECONDS
    QMM_BENCH_PEERS_DIR="$WORK/peers-hang" q bench --backend ref --quick --shapes "$WORK/tiny.txt" --m 1 --dtype f32 \
      --repeats 1 --kernel ref.qmm_t.scalar.r1 --peer-timeout 1
    check "--peer-timeout: exit 0" rc_is 0
    check "--peer-timeout: the bench did not wait for the hung scripts" [ $((SECONDS - started)) -lt 120 ]
    check "--peer-timeout: a result before the deadline kept" out_matches 'peer mlx-cpu +4\.0 .*before the hang'
    check "--peer-timeout: the deadline said for it" \
      err_has "peer: the script ended (stopped by the deadline of 1 s, --peer-timeout) after 1 results, which are kept"
    check "--peer-timeout: a script with nothing before the deadline is absent, saying why" \
      out_has "the peer script failed (stopped by the deadline of 1 s, --peer-timeout; its stderr is above)"
  fi
fi
expect_usage_error bench "--peer-timeout '0' is not a whole number of seconds in [1, 604800]" bench --backend ref --quick --peer-timeout 0
expect_usage_error bench "--peer-timeout 'x' is not a whole number" bench --backend ref --quick --peer-timeout x
expect_usage_error bench "--peer-timeout does not apply with --no-peers" bench --backend ref --quick --no-peers --peer-timeout 5
expect_usage_error bench "--peer-timeout does not apply with --op n" bench --backend ref --quick --op n --peer-timeout 5
expect_usage_error bench "--tuning does not apply to --gather" bench --backend ref --quick --gather --tuning "$WORK/none.json"
expect_usage_error bench "--experts applies to --gather only" bench --backend ref --quick --experts 8
expect_usage_error bench "--experts-per-token applies to --gather only" bench --backend ref --quick --experts-per-token 2
expect_usage_error bench "--experts '0' is not a whole number" bench --backend ref --quick --gather --experts 0
expect_usage_error bench "--experts-per-token 9 is more than --experts 8" bench --backend ref --quick --gather --experts 8 --experts-per-token 9
q bench --backend ref --gather --quick --no-peers --experts 4 # no -k: the default 8 capped at the 4 experts
check "--gather --experts 4 without -k: exit 0" rc_is 0
check "--gather --experts 4 without -k: 4 per token" out_has "over 4 experts of n×k, 4 distinct experts per token"
expect_usage_error bench "--kernel 'ref.qmm_t.scalar.r1' computes qmm_t; qmm bench --gather measures gather kernels only" \
  bench --backend ref --quick --gather --kernel ref.qmm_t.scalar.r1
expect_usage_error bench "--kernel 'ref.gather.scalar.r1' computes gather; this run measures qmm_t kernels (--gather measures gather kernels)" \
  bench --backend ref --quick --kernel ref.gather.scalar.r1

# The ggml peer script: without ggml-python (scripts/setup.sh bench installs it into .venv) it answers one
# "absent" line with the reason, which the bench prints in its header; other --bits are refused the same way.
if command -v python3 >/dev/null && ! python3 -c 'import ggml' 2>/dev/null; then
  peer_out=$(python3 "$SRC/bench/peers/ggml_cpu.py" --shapes t:64:128 --m 1 --dtype f32 --quick --threads 1)
  check "ggml peer without ggml-python: absent, with the reason" \
    grep -qF '{"peer": "ggml", "absent": "cannot import ggml (ggml-python; scripts/setup.sh bench installs it)' <<<"$peer_out"
fi
# The MLX gather peer script without MLX: one "absent" line with the reason.
if command -v python3 >/dev/null && ! python3 -c 'import mlx.core' 2>/dev/null; then
  peer_out=$(python3 "$SRC/bench/peers/mlx_gather_cpu.py" --shapes t:64:128 --m 1 --dtype f32 --quick --experts 4 --experts-per-token 2)
  check "MLX gather peer without MLX: absent, with the reason" \
    grep -qF '{"peer": "mlx-gather-cpu", "absent": "cannot import mlx.core (' <<<"$peer_out"
fi

# bench/targets.py (issue 8's targets read off a CUDA run): a synthetic run whose verdicts are known, a ref run refused,
# a file that is not a bench JSON refused with a message.
if command -v python3 >/dev/null; then
  python3 - "$WORK/targets.json" <<'PY'
import json, sys
def cell(shape, M, dtype, floor, us, peers=(), bi=None):
    k = [{"name": "cuda.k", "selected": True, "batch_invariant": False, "us": us}]
    if bi is not None:
        k.append({"name": "cuda.k", "selected": False, "batch_invariant": True, "us": bi})
    return {"shape": shape, "M": M, "dtype": dtype, "floor_us": floor, "kernels": k,
            "peers": [{"name": n, "us": u} for n, u in peers]}
cells = [cell("seed.a", 32, "f16", 10.0, 14.0), cell("seed.a", 64, "bf16", 10.0, 16.0),      # 1.4 met, 1.6 missed
         cell("seed.a", 128, "f16", 10.0, 12.0, bi=15.0),                                    # 1.2 met; bi 1.25
         cell("seed.a", 512, "f16", 10.0, 11.0, [("cublas dense f16", 12.0)], bi=15.0),     # 1.1 met, ≤ cuBLAS; bi 1.36
         cell("qwen3.b", 2048, "bf16", 10.0, 30.0, [("cublas dense bf16", 20.0), ("torch-int4", 60.0)]),
         cell("seed.a", 1, "f32", 1.0, 99.0)]                                                # f32: not judged
json.dump({"backend": "cuda", "machine": {"gpu": "test"}, "format": {"bits": 4, "group_size": 64},
           "selector_only": True, "batch_invariant": True, "cells": cells,
           "peers_absent": ["mlx-cuda: absent: cannot import mlx.core (test)"]}, open(sys.argv[1], "w"))
PY
  targets_out=$(python3 "$SRC/bench/targets.py" "$WORK/targets.json" 2>&1)
  RC=$? OUT=$targets_out CMD="python3 bench/targets.py targets.json"
  check "targets: f32 cells not judged" out_has "5 f16/bf16 cells (4 seed)"
  check "targets: M = 32/64 one of two" out_has "M = 32 and 64, seed: ≤ 1.5× floor: missed, 1/2 cells; range 1.40–1.60 (worst seed.a M=64 bf16)"
  check "targets: M = 128 met" out_has "M = 128, seed: ≤ 1.5× floor: met, 1/1 cells; range 1.20–1.20"
  check "targets: M = 512/2048 seed only" out_has "M = 512 and 2048, seed: ≤ 1.15× floor: met, 1/1 cells"
  check "targets: against cuBLAS, every shape" out_has "M = 512 and 2048: ≤ cuBLAS dense (time ÷ cuBLAS): missed, 1/2 cells; range 0.92–1.50 (worst qwen3.b M=2048 bf16)"
  check "targets: an absent peer says so, with the run's reason" \
    out_has "every cell: faster than MLX CUDA (time ÷ MLX): no cells in this file (mlx-cuda: absent: cannot import mlx.core (test))"
  check "targets: torch int4" out_has "every cell: faster than torch int4 (time ÷ torch): met, 1/1 cells; range 0.50–0.50"
  check "targets: --selector-only has no selector share" out_has "not measured by this run (--selector-only)"
  check "targets: the mode's cost" out_has "batch-invariant ÷ default at M ≥ 128: ≤ 1.3 (cells): missed, 1/2 cells; range 1.25–1.36"
  targets_out=$(python3 "$SRC/bench/targets.py" "$WORK/bench.json" 2>&1)
  RC=$? OUT=$targets_out CMD="python3 bench/targets.py bench.json (a ref run)"
  check "targets: a ref run refused, exit 2" rc_is 2
  check "targets: the refusal names the backend" out_has "is a 'ref' run; the targets are the CUDA backend's"
  printf '{"cells": [{"shape": "x"}]}' >"$WORK/not-bench.json"
  targets_out=$(python3 "$SRC/bench/targets.py" "$WORK/not-bench.json" 2>&1)
  RC=$? OUT=$targets_out CMD="python3 bench/targets.py not-bench.json"
  check "targets: a cell without its fields refused, exit 2" rc_is 2
  check "targets: the message names the cell and the fields" out_has "cell 0: lacks M, dtype, floor_us, kernels"
  printf '{"cells": [{"shape": "s", "M": 32, "dtype": "f16", "floor_us": 1, "kernels": [{"name": "k", "selected": true, "us": -1}]}]}' \
    >"$WORK/not-bench.json"
  targets_out=$(python3 "$SRC/bench/targets.py" "$WORK/not-bench.json" 2>&1)
  RC=$? OUT=$targets_out CMD="python3 bench/targets.py not-bench.json (a negative time)"
  check "targets: a negative time refused, exit 2" rc_is 2
  check "targets: the message names the row and the value" out_has "cell 0: k: us=-1 is not null or a finite number > 0"
  printf '{"cells": [{"shape": "s", "M": 32, "dtype": "f16", "floor_us": 1%0400d, "kernels": []}]}' 0 >"$WORK/not-bench.json"
  targets_out=$(python3 "$SRC/bench/targets.py" "$WORK/not-bench.json" 2>&1)
  RC=$? OUT=$targets_out CMD="python3 bench/targets.py not-bench.json (an integer with no float: 10^400)"
  check "targets: an integer too large for a float refused, exit 2" rc_is 2
  check "targets: the value cut short in the message" out_has "cell 0: floor_us=1000000000000000000000000000000000000... is not a finite number > 0"
fi

# bench/plot.py: a file that is not a bench result refused with one line naming the cell and the value (checked before
# matplotlib is imported, so also without it) and nothing written; where matplotlib is importable, this file's runs drawn.
if command -v python3 >/dev/null; then
  plot() { CMD="python3 bench/plot.py $*"; OUT=$(python3 "$SRC/bench/plot.py" "$@" 2>&1); RC=$?; }
  plot_cell() { printf '{"cells": [{"shape": "s", "M": %s, "N": 8, "K": 64, "dtype": "f16", "kernels": [%s], "peers": []}]}' \
    "$1" "$2" >"$WORK/plot-bad.json"; plot "$WORK/plot-bad.json" -o "$WORK/plot-bad.png"; }
  plot_cell '"1"' ''
  check "plot: a string M refused, exit 1" rc_is 1
  check "plot: the message names the cell and the value" out_has "plot-bad.json: cell 0 ('s', M='1', 'f16'): 'M' is '1', not a number > 0"
  check "plot: one line, no traceback" test "$(wc -l <<<"$OUT")" = 1
  check "plot: nothing written" test ! -e "$WORK/plot-bad.png"
  plot_cell 1 '{"name": "k", "selected": "false", "x_floor": 2}'
  check "plot: a string flag refused" out_has "k: 'selected' is 'false', not true or false"
  plot_cell 1 '{"name": "k", "x_floor": NaN}'
  check "plot: a NaN time refused" out_has "k: x_floor is nan, not a number > 0 or null"
  plot_cell 1 '{"name": "a", "selected": true, "x_floor": 2}, {"name": "b", "selected": true, "x_floor": 3}'
  check "plot: two selected rows refused" out_has "more than one kernel row marked selected"
  plot "$WORK/bench.json" -o "$WORK/plot.txt"
  check "plot: the output must be a PNG" out_has "-o $WORK/plot.txt: the output is a PNG (a name ending in .png)"
  PLOT_PY=
  for py in "$SRC/.venv/bin/python" python3; do
    if "$py" -c 'import matplotlib' 2>/dev/null; then PLOT_PY=$py; break; fi
  done
  if [ -n "$PLOT_PY" ]; then
    for f in bench bench-bi; do
      for opt in "" --selected-only; do
        CMD="$PLOT_PY bench/plot.py $opt $f.json"
        OUT=$("$PLOT_PY" "$SRC/bench/plot.py" $opt "$WORK/$f.json" -o "$WORK/$f$opt.png" 2>&1)
        RC=$?
        check "plot: $f.json $opt drawn, exit 0" rc_is 0
        check "plot: $f.json $opt is a PNG" test "$(head -c 4 "$WORK/$f$opt.png" | od -An -tx1 | tr -d ' ')" = 89504e47
      done
    done
  else
    echo "$SUITE: plot.py's drawing not checked: no python with matplotlib (scripts/setup.sh bench installs it)"
  fi
fi
finish
