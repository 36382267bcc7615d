#!/usr/bin/env bash
# Benchmarks side by side with tini, catatonit, dumb-init (not part of the tests). Writes
# bench/results/latest.md. Usage: scripts/bench.sh [--iterations N] [--storm N]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
scripts/setup.sh build
ninja -C build bench/bench bench/storm nesinit/nesinit
NESINIT_BIN=build/nesinit/nesinit NES_STORM_BIN=build/bench/storm build/bench/bench "$@"
