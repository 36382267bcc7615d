#!/usr/bin/env bash
# README command 1: the main job. Sets up what is missing, builds, and runs the most real
# demonstration that exists. (Until the microVM runner lands: build, and show the static init.)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
scripts/setup.sh build
ninja -C build
tests/check-init-binary.sh build/nesinit/nesinit
