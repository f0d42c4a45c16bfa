#!/usr/bin/env bash
# Issue 12: tune time with and without overlapped starts (bench/tune_overlap.py), on the Llama-3.1-8B shape
# (dummy weights) on the lent H100 or H200: 3 candidates (max_num_batched_tokens 8192, 16384, 4096), capacity
# mode (one short vllm bench serve run each), so the engine starts dominate; each side compiles from an
# empty vLLM cache. One side per device call (each ~8 minutes), back to back on the same warm machine:
#   run kind=nvidia-h200 carry=[".gpu1"] timeout_s=120     command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu2"] timeout_s=120                      command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu3"] timeout_s=180                      command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu4"] timeout_s=180                      command: bash bench/gpu/suite.sh --stash >/dev/null && bash -c 'source bench/gpu/site.sh && unpack_site'
#   run timeout_s=600                                      command: bash bench/gpu/tune_overlap.sh off
#   run timeout_s=600                                      command: bash bench/gpu/tune_overlap.sh on
# The last call prints both sides and the ratio ($OUT/tune_overlap.json, $OUT/tune-overlap.log). A machine
# gone cold between the calls loses the first side (its folder is in /tmp): run both again.
# Env: OVERLAP_SET (the grid), TUNE_TARGET (llama-3.1-8b-instruct).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tune_env.sh"
mode=${1:?usage: tune_overlap.sh off|on}
target=${TUNE_TARGET:-llama-3.1-8b-instruct}
overlay=$(python3 -m bench.gpu.tune_setup "$target" "$work/setup-8b") || exit 2
python3 bench/tune_overlap.py --config "$overlay" --target "$target" --modes "$mode" --work "$work/overlap" \
  --set "${OVERLAP_SET:-max_num_batched_tokens=8192,16384,4096}" --timeout 560 2>&1 | tee -a "$out/tune-overlap.log"
code=${PIPESTATUS[0]}
cp "$work/overlap/tune_overlap.json" "$out/" 2>/dev/null
tar -C "$work/overlap" -cJf "$out/tune-overlap-logs.tar.xz" --exclude 'vllm-cache-*' . 2>/dev/null
exit "$code"
