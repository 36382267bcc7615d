#!/usr/bin/env bash
# libFuzzer harnesses (fuzz/*_fuzz.cpp) built with Debian's clang 14 under
# -fsanitize=fuzzer,address,undefined in build-fuzz/ (outside the sources, rebuilt only when a
# source or header changed), then run one after another.
#   scripts/fuzz.sh [SECONDS]     run each harness SECONDS (default 300)
#   scripts/fuzz.sh --ci TOTAL    the CI budget: TOTAL seconds (default 200) split across harnesses
# The committed seeds in fuzz/corpus/NAME are read, never written: new inputs go to
# build-fuzz/corpus/NAME. Writes build-fuzz/results.jsonl (one {"name","result",...} per harness,
# the shape scripts/test.sh counts) and prints execs, exec/s and coverage per harness. Exits 1 if
# any harness crashed, leaked, timed out on an input, or failed to build.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
mode=long
per=${1:-300}
if [[ "${1:-}" == "--ci" ]]; then
  mode=ci
  total=${2:-200}
fi
CXX=${FUZZ_CXX:-clang++-14}
command -v "$CXX" >/dev/null || CXX=clang++
out=build-fuzz
mkdir -p "$out/obj" "$out/corpus"

# Everything the harnesses link: protocol/, the host Session and what it needs, the init Session
# and its stdio core,
# the shim's ttrpc framing, the monitor's control-socket codec.
lib_srcs=(protocol/*.cpp host/lib/session.cpp host/lib/escape.cpp host/lib/record.cpp host/lib/state_dir.cpp nesinit/session.cpp nesinit/log.cpp
          nesinit/stdio.cpp
          host/shim/ttrpc_frame.cpp host/monitor/control.cpp)
harnesses=()
for f in fuzz/*_fuzz.cpp; do harnesses+=("$(basename "$f" .cpp)"); done

flags=(-std=c++20 -O1 -g -I. -DNES_NATIVE=1 -fno-omit-frame-pointer -fsanitize=address,undefined
       -fno-sanitize-recover=all)
# Rebuild everything when any source, header or this script changed (cheap: a few TUs).
stamp=$( { cat "$0"; cat base/* protocol/* host/lib/*.hpp host/lib/session.cpp host/lib/escape.cpp host/lib/record.cpp host/lib/state_dir.cpp \
           nesinit/session.* nesinit/log.* nesinit/stdio.* host/shim/ttrpc_frame.* host/monitor/control.* fuzz/*.cpp fuzz/*.hpp; \
           echo "$CXX"; } | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$out/stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "fuzz: building ${#harnesses[@]} harnesses in $out/ with $CXX"
  rm -f "$out/stamp" "$out"/obj/*.o
  # One compiler per core; any failure fails the build (each job is waited for by pid).
  pids=()
  run_job() {
    "$@" & pids+=($!)
    if (( ${#pids[@]} >= $(nproc) )); then drain; fi
  }
  drain() {
    local p
    for p in "${pids[@]}"; do wait "$p"; done
    pids=()
  }
  objs=()
  for s in "${lib_srcs[@]}"; do
    o="$out/obj/$(echo "$s" | tr / _).o"
    run_job "$CXX" "${flags[@]}" -fsanitize=fuzzer-no-link -c "$s" -o "$o"
    objs+=("$o")
  done
  drain
  for h in "${harnesses[@]}"; do
    run_job "$CXX" "${flags[@]}" -fsanitize=fuzzer "fuzz/$h.cpp" "${objs[@]}" -lsimdjson -lfmt -o "$out/$h"
  done
  drain
  echo "$stamp" > "$out/stamp"
fi

if [[ $mode == ci ]]; then per=$(( total / ${#harnesses[@]} )); fi
(( per >= 1 )) || per=1
: > "$out/results.jsonl"
status=0
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
printf '%-20s %12s %10s %8s %8s  %s\n' harness execs exec/s cov ft result
for h in "${harnesses[@]}"; do
  name=${h%_fuzz}
  seeds="fuzz/corpus/$name"
  work="$out/corpus/$name"
  mkdir -p "$work" "$out/artifacts"
  log="$out/$name.log"
  dirs=("$work")
  [[ -d $seeds ]] && dirs+=("$seeds")
  rc=0
  "$out/$h" -max_total_time="$per" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$name-" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -Eo 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  result=OK
  if (( rc != 0 )); then
    result=FAIL
    status=1
    grep -E 'ERROR|invariant violated|SUMMARY|Test unit written' "$log" | head -5 || true
  fi
  printf '%-20s %12s %10s %8s %8s  %s\n' "$name" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$result"
  printf '{"name":"fuzz-%s","result":"%s","seconds":%s,"execs":%s,"exec_per_s":%s,"cov":%s,"ft":%s}\n' \
    "$name" "$result" "$per" "${execs:-0}" "${rate:-0}" "${cov:-0}" "${ft:-0}" >> "$out/results.jsonl"
done
exit $status
