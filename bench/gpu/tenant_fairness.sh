#!/usr/bin/env bash
# A quiet tenant beside a noisy one flooding a real 8B engine on a lent GPU (issue 52, item 4; adr/0043):
# bench/tenant_fairness.py's five phases (alone, fifo, vllm-priority, fair, fair-reserve) against one vLLM
# serving the Llama-3.1-8B shape (dummy weights) with --scheduling-policy priority, the gateway in-process.
#
#   bash bench/gpu/tenant_fairness.sh [PHASE_S] [NOISY_RPS]      defaults 45 s a phase, 60 requests/s
#
# The engine runs --max-num-seqs 32 requests of 256 tokens: ~10-15 requests/s on an H200, so 60/s is 4-6x what
# it can serve (the client keeps at most 512 of the noisy tenant's open). A request without a priority is first
# come first served in vLLM's priority policy, so the fifo and fair phases run on the same engine as the
# vllm-priority one (which hands the quiet key's class over as `priority`). Device-tool calls, back to back:
#   run kind=nvidia-h200 carry=[".gpu1"] command="bash bench/gpu/suite.sh --stash"   (the same for .gpu2, .gpu3)
#   run                  carry=[".gpu4"] command="bash bench/gpu/suite.sh --stash && bash bench/gpu/tenant_fairness.sh"
# (timeout_s 600). Results come back under $OUT: tenant_fairness_gpu.json, tenant_fairness_gpu.log (tee'd as it
# runs), the engine's log. Then: python -m bench.harness.results adopt ... (docs/development/benchmarks.md).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
phase_s=${1:-45}
noisy_rps=${2:-60}
work=${VSTACK_GPU_WORK:-/tmp/vstack-gpu-tenants}
mkdir -p "$work"
unpack_site
log="$out/tenant_fairness_gpu.log"
log_device "$log"
model=$(dummy_model "$work/models/llama-3.1-8b" meta-llama--Llama-3.1-8B-Instruct)
port=18300
python3 -m vllm.entrypoints.cli.main serve "$model" --host 127.0.0.1 --port $port --served-model-name shared \
  --load-format dummy --max-num-seqs 32 --max-model-len 4096 --scheduling-policy priority \
  --gpu-memory-utilization 0.85 > "$out/engine.log" 2>&1 &
engine=$!
trap 'kill $engine 2>/dev/null; wait $engine 2>/dev/null' EXIT
t0=$SECONDS
until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
  kill -0 $engine 2>/dev/null || { echo "the engine exited:"; tail -30 "$out/engine.log"; exit 1; } | tee -a "$log"
  [ $(( SECONDS - t0 )) -gt 400 ] && { echo "the engine did not answer in 400 s" | tee -a "$log"; exit 1; }
  sleep 2
done
echo "engine ready in $(( SECONDS - t0 )) s" | tee -a "$log"
python3 bench/tenant_fairness.py --engine-url "http://127.0.0.1:$port" --slots 32 --tokens 256 \
  --quiet-rps 1 --noisy-rps "$noisy_rps" --noisy-outstanding 512 --slo-ms 500 --phase-s "$phase_s" --no-limit \
  --out "$out/tenant_fairness_gpu.json" 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
