#!/usr/bin/env bash
# The GPU suite on the lent machine (README "GPU suite"). Run from the repository root:
#
#   bash bench/gpu/suite.sh --stash                 a carry call: keep this call's part (.gpuN/) in /tmp
#   bash bench/gpu/suite.sh [--only NAME ...] [--kind profile|layout|switch|tools ...]
#   bash bench/gpu/suite.sh --real stash|rows|spec|tune|eager   the real-weight rows (bench/gpu/realweights.sh)
#
# Unpacks the site built by bench/gpu/build_site.sh once (parts stashed by earlier calls, or .gpuN/ folders
# carried with this one), runs bench/gpu/suite.py through the project's own code, then the assertions in
# tests/gpu against the results it wrote. Logs, results and the engines' logs land in $OUT when it is set.
set -uo pipefail
# The real-weight rows and the eager rows (issue 33): bench/gpu/realweights.sh, its call sequence at its top.
if [ "${1:-}" = "--real" ]; then shift; exec bash "$(dirname "${BASH_SOURCE[0]}")/realweights.sh" "$@"; fi
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
if [ "${1:-}" = "--stash" ]; then ls -la "$parts"; exit 0; fi
unpack_site
work=${VSTACK_GPU_WORK:-/tmp/vstack-gpu-suite}
# Results outlive the checkout's resync between calls on a warm machine: rows of earlier calls are kept.
export VSTACK_GPU_RESULTS_DIR=${VSTACK_GPU_RESULTS_DIR:-$work/results}
mkdir -p "$work" "$VSTACK_GPU_RESULTS_DIR"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$out/suite.log"
python3 -m bench.gpu.suite run --work "$work" "$@" 2>&1 | tee -a "$out/suite.log"
code=${PIPESTATUS[0]}
results=$(ls -t "$VSTACK_GPU_RESULTS_DIR"/gpu-*.json 2>/dev/null | head -1)
VSTACK_GPU_RESULTS="$results" python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -o addopts="" 2>&1 \
  | tee "$out/pytest.log" | tail -25
tar -C "$work" -cJf "$out/engine-logs.tar.xz" logs 2>/dev/null
[ -n "$results" ] && cp "$results" "$out/"
exit "$code"
