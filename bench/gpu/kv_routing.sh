#!/usr/bin/env bash
# Replica routing on the engines' own KV events vs prefix affinity vs round robin (issue 55, item 3a, adr/0050):
# 2 replicas of the Llama-3.1-8B shape (dummy weights) on a local Ray node, one GPU each on nvidia-h200-x2 (both on
# the one GPU of nvidia-h200), each holding 0.3 of its GPU so that the prefixes outgrow one replica's KV cache;
# vLLM's `bench serve --dataset-name prefix_repetition` (64 prefixes of 4k tokens, Poisson arrivals, 40 s each) at
# each rate for each strategy; TTFT p50/p90 and output tok/s side by side (bench/gpu/kv_routing.py says how).
#
#   bash bench/gpu/kv_routing.sh [RATES] [STRATEGIES]     defaults "24 32", "kv_events prefix_affinity round_robin"
#   (kv_events@1: kv_events with gateway.kv_events_load_weight 1, the weight before 2026-11-29)
#   HOT_SHARE=0.5 bash bench/gpu/kv_routing.sh "40 48"
#     the mixed workload: half the arrivals on one prompt of their own (an app's system prompt), half on the 64
#     prefixes (many sessions), two Poisson clients pooled into one result. Round robin loses where the 64 prefixes
#     outgrow a replica's cache (10.5x at 32/s, 2026-11-29), the hash where one prompt piles onto one replica (81x
#     at 48/s with one prefix); on this mix `bench/kv_routing_sim.py --hot-share 0.5` puts kv_events' p90 at 48/s
#     2.6x under the hash and 5.0x under round robin (97 / 255 / 482 ms; bench/results/2026-11-29-cpu-kv-routing-
#     sim-1958). The model has no decode slowdown, so it understates the hash's pile-up: with one prefix it said
#     63 ms where the H200s measured 6.5 s.
#   PREFIXES=1 bash bench/gpu/kv_routing.sh "32 48"
#     one prompt shared by every request (an app's system prompt, 4k tokens) instead of 64: the hash keys on the
#     prompt's first 512 characters, so it sends every request to one replica; kv_events' balance rule
#     (gateway.kv_events_balance_threshold, adr/0050) spreads them (bench/kv_routing_sim.py --prefixes 1: p90 at
#     48/s 22 vs 63 ms for the hash). The 64-prefix workload at "32 40": 2026-11-29's second run (24, 32) had
#     round robin saturated only at 32 (28.3 of 32 req/s), so the tokens/s goal (1.3x) needs a rate past it.
#   (rates 24 and 32: the 2026-11-29 run at 24 had round robin's p90 at 445 ms, the model of it in
#   bench/kv_routing_sim.py puts the strategies apart from 24 up, most at 32; 16 and below all answer alike)
#
# Device-tool calls, back to back (the site parts are the GPU suite's, bench/gpu/build_site.sh; Ray's part
# bench/gpu/build_ray_part.sh):
#   run kind=nvidia-h200-x2 carry=[".gpu1"]   command="bash bench/gpu/kv_routing.sh --stash"   (the same for .gpu2, .gpu3, .gpu4)
#   run                     carry=[".gpuray"] command="bash bench/gpu/kv_routing.sh"          timeout_s=600
# The engines start in each call (~2 min); 2 rates x 3 strategies x ~50 s fit one call. Results under $OUT:
# kv-routing.json (every run: TTFT p50/p90/p99, TPOT, output tok/s, the engines' prefix hit rate, the gateway's
# index per replica), kv_routing.log (the table), vLLM's result files in kv_routing_runs/, the engines' logs.
# First run (2026-11-29, one H200, vLLM 0.26.0, 0.4 each): replica 1, starting beside replica 0 on the same GPU,
# exited during its engine core's start (nothing measured); x2 gives each its own GPU.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
if [ "${1:-}" = "--stash" ]; then ls -la "$parts"; exit 0; fi
rates=${1:-"24 32"}
strategies=${2:-"kv_events prefix_affinity round_robin"}
unpack_site
if [ ! -d "$site/ray" ]; then
  [ -e "$parts/part.ray.00" ] || { echo "no Ray part in $parts: carry .gpuray/ (bench/gpu/build_ray_part.sh)"; exit 2; }
  xz -dc -T16 "$parts/part.ray.00" | tar -C "$site" -xf - || { echo "the Ray part does not unpack"; exit 2; }
fi
export RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=0
log="$out/kv_routing.log"
log_device "$log"
timeout 580 python3 -m bench.gpu.kv_routing --out "$out/kv-routing.json" --rates "$rates" --strategies "$strategies" --seconds "${RUN_SECONDS:-30}" \
  --prefixes "${PREFIXES:-64}" --hot-share "${HOT_SHARE:-0}" \
  2>&1 | tee -a "$log"
code=${PIPESTATUS[0]}
for f in "$out"/kv_routing_state/logs/*.log; do [ -f "$f" ] && grep -v "Capturing CUDA graphs" "$f" | tail -300 > "$out/$(basename "$f" .log)-tail.log"; done
rm -rf "$out/kv_routing_state"
exit "$code"
