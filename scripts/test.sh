#!/usr/bin/env bash
# README command 2: every test. Sets up whatever is missing (scripts/setup.sh without --main:
# everything, also what README command 1 left out, and `build/` switched to -Dcontainerd=true),
# builds `build/`, runs the whole meson test suite, then builds `build-asan/` (host library, CLI
# and tests under ASan+UBSan) and runs the suites marked `asan` there, then the fuzz harnesses for
# a bounded time (scripts/fuzz.sh --ci). Ends with one line "N passed, N failed" over all three.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
scripts/setup.sh build
# build-asan at -O0: ASan+UBSan at -O3 compiled 5x slower than the release build (115 s against
# 24 s for tests/host/loop_test.cpp); at -O0 it is no slower, and the suite runs in minutes.
scripts/configure.sh build-asan -Dsanitize_native=true -Doptimization=0 >/dev/null
conf=$(meson configure build-asan 2>/dev/null)
grep -qE "^ *sanitize_native +true" <<<"$conf" && grep -qE "^ *optimization +0 " <<<"$conf" ||
  meson configure build-asan -Dsanitize_native=true -Doptimization=0 >/dev/null

ninja -C build
# build-asan builds only what suite `asan` runs: its tests, what they depend on, and the init
# they start ($NESINIT_BIN), not the benches, probes and VM-only parts.
asan_targets=$(meson introspect build-asan --tests --targets | python3 -c '
import json, os, sys
d = json.load(sys.stdin); top = os.path.realpath(sys.argv[1])
files = {t["id"]: t["filename"] for t in d["targets"]}
out = set(next(t["filename"] for t in d["targets"] if t["name"] == "nesinit"))
for t in d["tests"]:
    if not any(s.split(":")[-1] == "asan" for s in t["suite"]): continue
    out.update(p for p in t["cmd"][:1] if p.startswith(top + "/"))
    for i in t["depends"]: out.update(files.get(i, []))
print(" ".join(sorted(os.path.relpath(p, top) for p in out)))
' build-asan)
# shellcheck disable=SC2086  # one word per target
ninja -C build-asan $asan_targets

status=0
meson test -C build --print-errorlogs --num-processes 2 --timeout-multiplier 3 || status=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
meson test -C build-asan --no-rebuild --suite asan --print-errorlogs --num-processes 2 --timeout-multiplier 4 || status=1
# libFuzzer harnesses (decoders, LineReader, both Sessions with their invariants): 200 s of fuzzing
# in all, split evenly; any crash fails the run. One result per harness in build-fuzz/results.jsonl.
rm -f build-fuzz/results.jsonl
mkdir -p build-fuzz
scripts/fuzz.sh --ci 200 || {
  status=1
  [[ -s build-fuzz/results.jsonl ]] || echo '{"name":"fuzz-build","result":"FAIL"}' > build-fuzz/results.jsonl
}

# One plain closing line over both runs.
python3 - build/meson-logs/testlog.json build-asan/meson-logs/testlog.json build-fuzz/results.jsonl <<'PY'
import json, sys
ok = bad = skip = 0
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for l in lines:
        r = json.loads(l).get("result")
        if r in ("OK", "EXPECTEDFAIL"): ok += 1
        elif r == "SKIP": skip += 1
        else: bad += 1
print(f"{ok} passed, {bad} failed, {skip} skipped")
PY
exit $status
