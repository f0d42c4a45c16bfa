#!/usr/bin/env bash
# Replica routing on the engines' own KV events vs prefix affinity vs round robin (issue 55, item 3a, adr/0050):
# 2 replicas of the Llama-3.1-8B shape (dummy weights) on ONE H200 (gpu-memory-utilization 0.4 each) on a local
# Ray node, behind the gateway; vLLM's `bench serve --dataset-name prefix_repetition` (32 prefixes of 4k tokens,
# Poisson arrivals) at each rate for each strategy; TTFT p50/p90 and output tok/s side by side
# (bench/gpu/kv_routing.py says how).
#
#   bash bench/gpu/kv_routing.sh [RATES] [STRATEGIES]     defaults "4 8 16", "kv_events prefix_affinity round_robin"
#
# Device-tool calls, back to back (the site parts are the GPU suite's, bench/gpu/build_site.sh; Ray's part
# bench/gpu/build_ray_part.sh):
#   run kind=nvidia-h200 carry=[".gpu1"]   command="bash bench/gpu/kv_routing.sh --stash"   (the same for .gpu2, .gpu3, .gpu4)
#   run                  carry=[".gpuray"] command="bash bench/gpu/kv_routing.sh 8"         timeout_s=600
# Each call starts the two engines again (~3 min); 3 strategies x 30 s of arrivals fit one call per rate or two:
# call once per rate ("4", "8", "16", ...) up to saturation (TTFT p90 in seconds). Results under $OUT:
# kv-routing.json (every run: TTFT p50/p90/p99, TPOT, output tok/s, the engines' prefix hit rate, the gateway's
# index per replica), kv_routing.log (the table), vLLM's result files in kv_routing_runs/, the engines' logs.
# First run (2026-11-29, H200, vLLM 0.26.0, rate 8): replica 0 started (38.5 GiB of KV, 315,456 tokens) and replica 1,
# starting beside it on the same GPU, exited during its engine core's start; the cause was above the 60 lines then
# kept (300 now). If it is vLLM's memory profiling seeing the other engine's use change meanwhile, start the
# replicas one after the other. Nothing was measured yet.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
if [ "${1:-}" = "--stash" ]; then ls -la "$parts"; exit 0; fi
rates=${1:-"4 8 16"}
strategies=${2:-"kv_events prefix_affinity round_robin"}
unpack_site
if [ ! -d "$site/ray" ]; then
  [ -e "$parts/part.ray.00" ] || { echo "no Ray part in $parts: carry .gpuray/ (bench/gpu/build_ray_part.sh)"; exit 2; }
  xz -dc -T16 "$parts/part.ray.00" | tar -C "$site" -xf - || { echo "the Ray part does not unpack"; exit 2; }
fi
export RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=0
log="$out/kv_routing.log"
log_device "$log"
timeout 580 python3 -m bench.gpu.kv_routing --out "$out/kv-routing.json" --rates "$rates" --strategies "$strategies" \
  2>&1 | tee -a "$log"
code=${PIPESTATUS[0]}
for f in "$out"/kv_routing_state/logs/*.log; do [ -f "$f" ] && grep -v "Capturing CUDA graphs" "$f" | tail -300 > "$out/$(basename "$f" .log)-tail.log"; done
rm -rf "$out/kv_routing_state"
exit "$code"
