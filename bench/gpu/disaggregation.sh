#!/usr/bin/env bash
# Prefill/decode disaggregation vs aggregated replicas at the same GPU count (issue 55, item 3b, adr/0052), on
# nvidia-h200-x2: the Llama-3.1-8B shape (dummy weights) on a local Ray node with the machine's 2 GPUs, behind our
# gateway (no proxy process): (disagg) 1 prefill + 1 decode engine, one GPU each, vLLM's NixlConnector between
# them; (agg) 2 aggregated replicas, one GPU each, least_outstanding. Workload: `vllm bench serve --dataset-name
# random`, 8192 tokens in / 256 out, Poisson arrivals at each rate; goodput under the SLO TTFT <= 2000 ms and TPOT
# <= 40 ms per request (bench/gpu/disaggregation.py says why), TTFT p95, ITL p95, output tok/s side by side.
#
#   bash bench/gpu/disaggregation.sh CONFIG [RATES]     CONFIG: disagg or agg; RATES default "2 4 6" (requests/s)
#   KV_BUFFER=cpu ...   NIXL sends from a host buffer (the path bench/disaggregation_cpu.py ran on the CPU)
#   NIXL_PROBE=0 ...    skip the NIXL read probe the disagg config runs first (bench/gpu/nixl_probe.py; ~30 s)
#   UCX_TLS=cuda_copy,cuda_ipc,tcp UCX_MEMTYPE_CACHE=n ...   the transports a production NIXL recipe pins
#                       (ai-dynamo/nixl#1614): the next try if the GPU buffer's reads hang again (exported before
#                       Ray starts here, so the engines' actors inherit them)
#
# Device-tool calls, back to back (the site parts are the GPU suite's, bench/gpu/build_site.sh; Ray's part
# bench/gpu/build_ray_part.sh; NIXL's bench/gpu/build_nixl_part.sh; each call carries at most 64 MiB, so the
# parts are stashed in /tmp/vstack-parts by calls of their own while the machine stays warm):
#   run kind=nvidia-h200-x2 carry=[".gpu1"]   command="bash bench/gpu/suite.sh --stash"   (the same for .gpu2, .gpu3, .gpu4)
#   run                     carry=[".gpuray"] command="bash bench/gpu/suite.sh --stash"
#   run                     carry=[".gpunixl"] command="bash bench/gpu/disaggregation.sh disagg" timeout_s=600
#   run                     command="bash bench/gpu/disaggregation.sh agg" timeout_s=600
# then, here: python3 -m bench.gpu.disaggregation --table FILES_AT_1/disaggregation-disagg.json \
#                                                         FILES_AT_2/disaggregation-agg.json
# Two calls, one per configuration: each starts its two engines (~3 min with dummy weights, CUDA graphs) and runs
# 3 rates x (40 s of arrivals + drain); both in one call would pass the 580 s a call may take. Results under $OUT:
# disaggregation-CONFIG.json (every rate: goodput, TTFT/TPOT/ITL p50/p95/p99, output tok/s, completed),
# disaggregation.log (the table), vLLM's result files in disaggregation_runs/, the engines' log heads and tails.
# First run (2026-11-29, x2, vLLM 0.26.0): the flow ran through both engines but NIXL's reads never completed there
# (bench/results/2026-11-29-h200-x2-disaggregation-nixl); UCX_LOG_LEVEL=info now shows the transports UCX picks.
# The disagg call now starts with bench/gpu/nixl_probe.py (~30-60 s, its own budget taken from the call's 575 s):
# its lines head disaggregation.log, and nixl_probe.log comes back whole.
set -uo pipefail
export UCX_LOG_LEVEL=${UCX_LOG_LEVEL:-info}  # which transports UCX picks, in the engines' logs (its first run: reads never completed)
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
if [ "${1:-}" = "--stash" ]; then ls -la "$parts"; exit 0; fi
config=${1:?"CONFIG: disagg or agg"}
rates=${2:-"2 4 6"}
unpack_site
if [ ! -d "$site/ray" ]; then
  [ -e "$parts/part.ray.00" ] || { echo "no Ray part in $parts: stash .gpuray/ first (bench/gpu/build_ray_part.sh)"; exit 2; }
  xz -dc -T16 "$parts/part.ray.00" | tar -C "$site" -xf - || { echo "the Ray part does not unpack"; exit 2; }
fi
if [ "$config" = "disagg" ] && ! python3 -c "import nixl; from nixl._api import nixl_agent" > "$out/nixl-import.log" 2>&1; then
  echo "NIXL does not import here ($(tail -1 "$out/nixl-import.log")): vLLM's NixlConnector needs it. Build the part"
  echo "with bash bench/gpu/build_nixl_part.sh and carry .gpunixl/ in this call (or stash it in an earlier one)."
  exit 2
fi
rm -f "$out/nixl-import.log"  # a call returns 8 files at most: this one only when it says why
# NIXL between the two GPUs first, in seconds (bench/gpu/nixl_probe.py): the first run spent its call to learn that
# no read completed. Unless KV_BUFFER or UCX_TLS is given, the engines get the first config whose reads completed;
# none completing ends the call here. NIXL_PROBE=0 skips it.
if [ "$config" = "disagg" ] && [ "${NIXL_PROBE:-1}" = 1 ]; then
  timeout 300 python3 -m bench.gpu.nixl_probe > "$out/nixl_probe.log" 2>&1
  grep NIXL_PROBE "$out/nixl_probe.log" | tee -a "$out/disaggregation.log"
  works() { grep "NIXL_PROBE" "$out/nixl_probe.log" | grep "\"config\": \"$1\"" | grep -q '"state": "done"'; }
  if [ -z "${KV_BUFFER:-}${UCX_TLS:-}" ] && ! works cuda; then
    if works cuda+pinned-tls; then
      export UCX_TLS=cuda_copy,cuda_ipc,tcp UCX_MEMTYPE_CACHE=n
      echo "NIXL: GPU reads completed only with UCX_TLS=$UCX_TLS: the engines get it" | tee -a "$out/disaggregation.log"
    elif works cpu; then
      KV_BUFFER=cpu
      echo "NIXL: no GPU-to-GPU read completed, host buffers did: the engines get kv_buffer_device cpu" \
        | tee -a "$out/disaggregation.log"
    else
      echo "NIXL: no read completed in any config (nixl_probe.log): nothing to measure" | tee -a "$out/disaggregation.log"
      exit 3
    fi
  fi
fi
export RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=0
log="$out/disaggregation.log"
log_device "$log"
timeout $(( 575 - SECONDS )) python3 -m bench.gpu.disaggregation --config "$config" --out "$out/disaggregation-$config.json" \
  --rates "$rates" --seconds "${RUN_SECONDS:-40}" --kv-buffer-device "${KV_BUFFER:-}" 2>&1 | tee -a "$log"
code=${PIPESTATUS[0]}
for f in "$out"/disaggregation_state/logs/*.log; do
  [ -f "$f" ] && grep -v "Capturing CUDA graphs" "$f" | tail -300 > "$out/$(basename "$f" .log)-tail.log"
  [ -f "$f" ] && grep -v "Capturing CUDA graphs" "$f" | grep -v "Releasing expired KV blocks" | head -300 > "$out/$(basename "$f" .log)-head.log"
done
rm -rf "$out/disaggregation_state"
exit "$code"
