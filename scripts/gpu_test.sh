#!/usr/bin/env bash
# gpu_test.sh — `make test-gpu`: the GPU tests on a machine with an NVIDIA GPU and nvcc (the lent H200).
# Builds build-gpu with the CUDA backend required, then runs, each with a PASS/FAIL/SKIPPED line:
#   1. the unit, kernel-harness, gpu and cli tests (CTest): every CUDA row against the oracle on its
#      case grid in all dtypes with poisoned outputs, the seed's cases (full oracle at 5120×5120, M = 16
#      and 32), chains, selector switch points, determinism, the non-finite rule, error paths;
#   2. `qmm run --backend cuda` on the embedded fixture;
#   3. compute-sanitizer memcheck and racecheck on test_cuda and on a reduced harness grid (CUDA rows only),
#      one process per test_cuda section and per row, GPU_TEST_JOBS (default: the CPUs, at most 12) at a time —
#      the gather section as GATHER_SHARDS (default 4, at most 64) processes, each a share of its runs —
#      reported SKIPPED with the tool's message where the machine refuses every run.
# Without a usable CUDA device (no GPU or driver) 2 and 3 are reported SKIPPED with the reason and the exit
# status is that of the CTest run (whose GPU tests report themselves skipped).
# Arguments (default: all four): the parts to run after the build — ctest, run, memcheck, racecheck — e.g.
# `scripts/gpu_test.sh racecheck` (or `make test-gpu GPU_TEST_PARTS=racecheck`) where one sitting has a time limit
# (the parts left out are reported SKIPPED).
# GPU_TEST_SHARD=i/n (0 ≤ i < n ≤ 64; default 0/1, the whole): the ctest part runs CTest's tests i+1, i+1+n, … (by
# number: `ctest -I i+1,,n`) and each sanitizer part the runs i, i+n, … of its job list — shards 0 … n−1, one per
# sitting (a machine lent in calls of 10 minutes), cover those parts whole (the run part is one run: whole in every
# shard); their summary lines name the shard, and a shard with nothing of a part to run reports it SKIPPED.
# cJSON: used from .deps/cjson when present (scripts/fetch_cjson.sh, for machines without a registry).
# Logs go to $GPU_LOG_DIR (default build-gpu/logs).
# GPU_TEST_BUILD=0: no configure or build — the sanitizer and run parts use the binaries already in build-gpu
# (qmm, tests/gpu/test_cuda, tests/kernels/test_kernels), e.g. those scripts/pack_gpu_bins.sh built on another
# machine and the GPU machine unpacked (a lent machine then spends no call time building); the ctest part needs
# the CMake tree and is refused with it.
set -uo pipefail
unset QMM_TEST_SHARD # set per run below (the gather section's shards); one from the caller would fail every other section
cd "$(dirname "$0")/.."
parts=" ${*:-ctest run memcheck racecheck} "
for part in $parts; do
  case $part in
  ctest | run | memcheck | racecheck) ;;
  *) echo "gpu_test: unknown part '$part' (the parts: ctest, run, memcheck, racecheck)" >&2; exit 2 ;;
  esac
done
wanted() { [[ $parts == *" $1 "* ]]; }
jobs=${GPU_TEST_JOBS:-$(nproc)} # compute-sanitizer processes at a time
[[ $jobs =~ ^[1-9][0-9]{0,3}$ ]] || { echo "gpu_test: GPU_TEST_JOBS='$jobs' is not a whole number from 1 to 9999" >&2; exit 2; }
[ -n "${GPU_TEST_JOBS:-}" ] || [ "$jobs" -le 12 ] || jobs=12
[[ ${GATHER_SHARDS:-4} =~ ^([1-9]|[1-5][0-9]|6[0-4])$ ]] ||
  { echo "gpu_test: GATHER_SHARDS='${GATHER_SHARDS}' is not a whole number from 1 to 64" >&2; exit 2; }
shard=${GPU_TEST_SHARD:-0/1}
if [[ $shard =~ ^([0-9]{1,2})/([0-9]{1,2})$ ]] && [ "${BASH_REMATCH[2]}" -ge 1 ] && [ "${BASH_REMATCH[2]}" -le 64 ] &&
   [ "${BASH_REMATCH[1]}" -lt "${BASH_REMATCH[2]}" ]; then
  shard_i=$((10#${BASH_REMATCH[1]})) shard_n=$((10#${BASH_REMATCH[2]}))
else
  echo "gpu_test: GPU_TEST_SHARD='$shard' is not i/n with whole numbers 0 ≤ i < n ≤ 64 (e.g. 0/2, then 1/2)" >&2; exit 2
fi
shard_note="" # what each PASS line says of the shard
[ "$shard_n" -gt 1 ] && shard_note="shard $shard_i/$shard_n: "
source scripts/deps_env.sh # cJSON from .deps/cjson when present; the CUDA toolkit on PATH
logs=${GPU_LOG_DIR:-build-gpu/logs}
mkdir -p "$logs"
summary=()
fail=0
step() { # step NAME COMMAND...: runs it, logs it, records PASS/FAIL
  local name=$1; shift
  if "$@" >"$logs/$name.log" 2>&1; then summary+=("PASS     $name"); else summary+=("FAIL     $name (log: $logs/$name.log)"); fail=1; fi
}
build=${GPU_TEST_BUILD:-1}
if [ "$build" = 0 ]; then
  if wanted ctest; then
    echo "gpu_test: GPU_TEST_BUILD=0 runs prebuilt binaries, and the ctest part needs the CMake tree: ask for the other parts (run, memcheck, racecheck)" >&2
    exit 2
  fi
  for binary in build-gpu/qmm build-gpu/tests/gpu/test_cuda build-gpu/tests/kernels/test_kernels; do
    [ -x "$binary" ] || { echo "gpu_test: GPU_TEST_BUILD=0 but $binary is missing or not executable (scripts/pack_gpu_bins.sh packs them)" >&2; exit 2; }
  done
  # prebuilt binaries look for the fixture and other source files in the tree they were built in: name this one
  export QMM_SOURCE_DIR=$PWD
elif [ "$build" != 1 ]; then
  echo "gpu_test: GPU_TEST_BUILD='$build' is not 0 (use the binaries in build-gpu) or 1 (build them, the default)" >&2
  exit 2
elif ! cmake -S . -B build-gpu -DQMM_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$logs/configure.log" 2>&1 ||
   ! cmake --build build-gpu -j "$(nproc)" >"$logs/build.log" 2>&1; then
  tail -n 30 "$logs/configure.log" "$logs/build.log"
  echo "gpu_test: the build failed" >&2
  exit 1
fi
# Without a usable CUDA device (no GPU, no driver) the GPU parts are reported SKIPPED with the reason and the
# script still builds everything and runs the CTest groups (whose GPU tests skip themselves).
no_device=""
if ! ./build-gpu/qmm kernels --backend cuda >"$logs/device.log" 2>&1; then
  no_device=$(grep -o 'no CUDA device[^(]*' "$logs/device.log" | head -n 1 | sed 's/ *$//')
  no_device=${no_device:-"the CUDA backend is not usable here (log: $logs/device.log)"}
fi
if wanted ctest; then
  ctest_shard=()
  [ "$shard_n" -gt 1 ] && ctest_shard=(-I "$((shard_i + 1)),,$shard_n")
  registered=$(ctest --test-dir build-gpu -N 2>/dev/null | sed -n 's/^Total Tests: //p')
  if [ "$shard_n" -gt 1 ] && [ "${registered:-0}" -le "$shard_i" ]; then # CTest ignores an -I past its last test
    summary+=("SKIPPED  ctest: ${shard_note}CTest has ${registered:-no} tests, none numbered $((shard_i + 1)) or more")
  else
    step ctest ctest --test-dir build-gpu -V -j 4 -L 'unit|kernels|gpu|cli' ${ctest_shard[@]+"${ctest_shard[@]}"}
    [ "$shard_n" -gt 1 ] && summary[${#summary[@]} - 1]+=" ($shard_note${ctest_shard[*]})"
  fi
else
  summary+=("SKIPPED  ctest: not asked for")
fi
tools=""
for tool in memcheck racecheck; do
  if wanted $tool; then tools+=" $tool"; else summary+=("SKIPPED  compute-sanitizer $tool: not asked for"); fi
done
if [ -n "$no_device" ]; then
  wanted run && summary+=("SKIPPED  qmm run --backend cuda: $no_device")
  [ -n "$tools" ] && summary+=("SKIPPED  compute-sanitizer: $no_device")
else
  if wanted run; then step qmm_run_cuda ./build-gpu/qmm run --backend cuda; else summary+=("SKIPPED  qmm run --backend cuda: not asked for"); fi
  if [ -z "$tools" ]; then
    :
  elif command -v compute-sanitizer >/dev/null; then
    # One compute-sanitizer process per test_cuda section and per CUDA row of the reduced harness, GPU_TEST_JOBS
    # (default: the CPUs, at most 12) at a time on the one GPU: in one process the racecheck alone took more than 10
    # minutes on the H200; so, both tools took 272 s at 12 (the thirteenth session). The same coverage as one run of each.
    sections=$(./build-gpu/tests/gpu/test_cuda --list)
    rows=$(awk '$1 ~ /^cuda\./ && /usable: yes/ {print $1}' "$logs/device.log")
    if [ -z "$sections" ] || [ -z "$rows" ]; then
      for tool in $tools; do
        summary+=("FAIL     compute-sanitizer $tool: no test_cuda sections or no usable CUDA rows to run (test_cuda --list, qmm kernels --backend cuda)")
      done
      fail=1
    else
      jobs_file="$logs/sanitizer-jobs.txt"
      : >"$jobs_file"
      # The longest runs first, so that none starts last and runs on alone — racecheck's slow ones (the slower tool),
      # then memcheck's, then every other run. Under racecheck on the H200 (thirty-fourth session, 14 jobs, sections
      # listed after the rows) the sections in `slow` and the gather row were the last to finish, 4.5 to more than
      # 8.5 minutes after the start; every other run by 3.5. Started first (thirty-fifth session), the three longest
      # still ran past 8.3 minutes beside the others (about 3 alone): racecheck as a whole takes more than 8.5.
      # The gather section runs as GATHER_SHARDS processes (test_cuda's QMM_TEST_SHARD=i/n, each a share of its
      # (case, variant) runs): whole, it did not finish under racecheck in 490–530 s beside other runs on an H100
      # (forty-seventh session). gemv_staged_x runs m8n64 and m8n48 since then: twice its products.
      slow="batch_invariant wgmma_cluster_splits wgmma_switch tile_split_k wgmma_last_wave selector gather m16n64_chunks
        gemv_staged_x"
      gather_shards=${GATHER_SHARDS:-4}
      for tool in racecheck memcheck; do
        [[ " $tools " == *" $tool "* ]] || continue
        for s in $slow; do
          grep -qx "$s" <<<"$sections" || continue
          if [ "$s" = gather ]; then
            for ((i = 0; i < gather_shards; i++)); do echo "$tool gather_shard $i-of-$gather_shards" >>"$jobs_file"; done
          else
            echo "$tool section $s" >>"$jobs_file"
          fi
        done
        for r in $rows; do [[ $r == cuda.gather.* ]] && echo "$tool row $r" >>"$jobs_file"; done
      done
      for tool in $tools; do
        for s in $sections; do grep -qw -- "$s" <<<"$slow" || echo "$tool section $s" >>"$jobs_file"; done
        for r in $rows; do [[ $r == cuda.gather.* ]] || echo "$tool row $r" >>"$jobs_file"; done
      done
      if [ "$shard_n" -gt 1 ]; then # GPU_TEST_SHARD: the runs i, i + n, … of the list
        mv "$jobs_file" "$jobs_file.all"
        awk -v i="$shard_i" -v n="$shard_n" '(NR - 1) % n == i' "$jobs_file.all" >"$jobs_file"
      fi
      # an earlier run's logs of these runs are not this run's (another shard's stay)
      while read -r t kind name; do rm -f "$logs/sanitizer-$t-$kind-$name.log" "$logs/sanitizer-$t-$kind-$name.log.rc"; done <"$jobs_file"
      sanitize() { # sanitize TOOL row|section|gather_shard NAME: one run, its log and exit status under $logs
        local log="$logs/sanitizer-$1-$2-$3.log"
        if [ "$2" = row ]; then
          QMM_TEST_REDUCED=1 QMM_TEST_BACKEND=cuda QMM_TEST_KERNEL=$3 compute-sanitizer --tool "$1" --error-exitcode 1 \
            ./build-gpu/tests/kernels/test_kernels >"$log" 2>&1
        elif [ "$2" = gather_shard ]; then # NAME = i-of-n
          QMM_TEST_SECTION=gather QMM_TEST_SHARD=${3/-of-//} compute-sanitizer --tool "$1" --error-exitcode 1 \
            ./build-gpu/tests/gpu/test_cuda >"$log" 2>&1
        else
          QMM_TEST_SECTION=$3 compute-sanitizer --tool "$1" --error-exitcode 1 ./build-gpu/tests/gpu/test_cuda >"$log" 2>&1
        fi
        echo $? >"$log.rc"
      }
      export -f sanitize
      export logs
      xargs -r -P "$jobs" -L 1 bash -c 'sanitize "$@"' _ <"$jobs_file"
      xargs_status=$?
      skip_pattern="Device not supported|error 999|Unable to (initialize|open)|not supported on this (device|platform)"
      for tool in $tools; do
        failed=() refused=() runs=0
        while read -r t kind name; do # every job of the list must have left its exit status
          [ "$t" = "$tool" ] || continue
          runs=$((runs + 1))
          log="$logs/sanitizer-$t-$kind-$name.log"
          if [ "$(cat "$log.rc" 2>/dev/null)" = 0 ]; then
            :
          elif [ -f "$log.rc" ] && grep -qE "$skip_pattern" "$log"; then
            refused+=("$(basename "$log" .log)")
          else
            failed+=("$(basename "$log" .log)")
          fi
        done <"$jobs_file"
        count="$runs runs" # what the PASS line says of them
        [ "$shard_n" -gt 1 ] && count="$shard_note$runs of $(grep -c "^$tool " "$jobs_file.all") runs"
        if [ $runs -eq 0 ]; then # GPU_TEST_SHARD: none of this tool's runs in this shard
          summary+=("SKIPPED  compute-sanitizer $tool: $count")
        elif [ ${#refused[@]} -gt 0 ] && [ ${#refused[@]} -eq $runs ]; then # the tool refused this machine: every run
          summary+=("SKIPPED  compute-sanitizer $tool: $(grep -hm1 -E "$skip_pattern" "$logs/${refused[0]}.log" | sed -n 1p)")
        elif [ ${#failed[@]} -gt 0 ] || [ ${#refused[@]} -gt 0 ] || [ $xargs_status -ne 0 ]; then
          what="${failed[*]:-}"
          [ ${#refused[@]} -gt 0 ] && what+=" (refused by the tool, where other runs were not: ${refused[*]})"
          [ $xargs_status -ne 0 ] && what+=" (xargs exited with status $xargs_status)"
          summary+=("FAIL     compute-sanitizer $tool: $shard_note${what# } (logs: $logs/sanitizer-$tool-*.log)"); fail=1
        else
          shards=""
          grep -qx gather <<<"$sections" && [ "$gather_shards" -gt 1 ] && shards=" (gather in $gather_shards shards)"
          summary+=("PASS     compute-sanitizer $tool ($count: $(echo $sections | wc -w) test_cuda sections$shards, $(echo $rows | wc -w) harness rows)")
        fi
      done
    fi
  else
    summary+=("SKIPPED  compute-sanitizer: not on PATH")
  fi
fi
if wanted ctest; then
  # the totals and the CUDA lines first (test_cuda's, the harness's "backend cuda:"), then every row's case count
  found=$(grep -hE "cases ran|backend cuda:|test_cuda:|tests passed" "$logs/ctest.log" | sed -E "s/^[0-9]+: //" | sort -u)
  grep -v "cases ran" <<<"$found" || true
  grep "cases ran" <<<"$found" || true
fi
printf '%s\n' "${summary[@]}"
exit $fail
