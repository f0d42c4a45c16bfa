#!/usr/bin/env bash
# A data-parallel 8B behind the gateway at saturation (issue 54, items 3 and 4; adr/0051). The
# h200x4-llama-3.1-8b-dp4 profile, its command rendered by the repo's own planner for this host
# (bench/gpu/dp_render.py: plan_model, dummy weights of Llama-3.1-8B's shape, max_model_len 4096, prefix caching
# off as in gateway_pace.sh, max_num_seqs 256 per rank), started as `vllm serve` with those args; then the
# gateway (`python -m stack.entrypoints.gateway --upstream ... --workers $GATEWAY_WORKERS`, default 4) in front;
# `vllm bench serve` against the engine directly and through the gateway, alternating (direct, gateway,
# gateway2, direct2) at each concurrency; the gateway's CPU seconds (its workers counted) per 1,000 output tokens.
#
#   bash bench/gpu/data_parallel.sh [CONCURRENCIES] [IN/OUT]     defaults "512", 128/1024 (tokens/s-bound)
#   RANKS=2 ...            data_parallel_size (default: the GPUs nvidia-smi lists, at most 4)
#   GATEWAY_WORKERS=1 ...  the gateway's worker processes (default 4)
#   API_SERVERS=1 ...      engine.api_server_count (default: vLLM's, one API server per rank)
#   BENCH_CLIENTS=2 ...    each run split across 2 `vllm bench serve` processes (bench/gpu/serve_bench.sh): at 512
#                          streams on 2 ranks one client was the limit (2026-11-29: ~1 core, 21-24k tok/s direct,
#                          27-28k through the gateway; bench/results/2026-11-29-h200-x2-data-parallel-client-bound);
#                          with 2 (493 s on x2): ~12k tok/s a client, gateway >= 1.00x direct in every pairing
#                          (bench/results/2026-11-29-h200-x2-data-parallel-two-clients)
#
# Device-tool calls (the site parts are the GPU suite's, bench/gpu/build_site.sh; kind nvidia-h200-x4, or x2 with
# RANKS=2), back to back:
#   run kind=nvidia-h200-x4 carry=[".gpu1"] command="bash bench/gpu/suite.sh --stash"   (the same for .gpu2, .gpu3)
#   run                     carry=[".gpu4"] command="bash bench/gpu/suite.sh --stash && bash bench/gpu/data_parallel.sh 512"
#   run                     command="bash bench/gpu/data_parallel.sh 1024"   (timeout_s 600: the engine starts in ~3 min,
#                           each `bench serve` run of 2 x CONCURRENCY prompts in ~1 min at 50k tokens/s: one
#                           concurrency per call)
# Results under $OUT: data_parallel.log (tee'd: the plan's summary, a row per run as it ends), data_parallel.json
# (the rows: req/s, output tok/s, TTFT p50/p99, TPOT p50, the gateway's CPU s and CPU s per 1,000 tokens), the
# rendered plan (dp-plan.json), the engine's and gateway's log tails. Not runnable on a machine without GPUs.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
concurrencies=${1:-"512"}
shape=${2:-128/1024}
in_len=${shape%/*}; out_len=${shape#*/}
gpus=$(nvidia-smi --list-gpus | wc -l)
ranks=${RANKS:-$(( gpus < 4 ? gpus : 4 ))}
workers=${GATEWAY_WORKERS:-4}
work=${VSTACK_GPU_WORK:-/tmp/vstack-gpu-dp}
results="$out/dp_runs"  # under $OUT: a call cut at its limit still returns the runs it finished
mkdir -p "$work" "$results"
rm -f "$results"/bench-*.json
unpack_site
log="$out/data_parallel.log"
log_device "$log"
eport=18500; gport=18501
engine_opts='{"enable_prefix_caching": false, "max_model_len": 4096, "max_num_seqs": 256'
[ -n "${API_SERVERS:-}" ] && engine_opts+=", \"api_server_count\": $API_SERVERS"
engine_opts+='}'
python3 -m bench.gpu.dp_render "$work" --ranks "$ranks" --port $eport --engine "$engine_opts" > "$out/dp-plan.json" \
  || { echo "the planner refused the profile here (see above)" | tee -a "$log"; exit 1; }
python3 - "$out/dp-plan.json" <<'PY' | tee -a "$log"
import json, sys
p = json.load(open(sys.argv[1]))
print("plan:", p["summary"]); print("vllm serve", " ".join(p["args"]))
print(*(n for n in p["notes"] if n.startswith("data parallel")), sep="\n")
PY
mapfile -t args < <(python3 -c "import json,sys; print(*json.load(open(sys.argv[1]))['args'], sep='\n')" "$out/dp-plan.json")
served=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['served'])" "$out/dp-plan.json")
eval "$(python3 -c "import json,shlex,sys; print(*(f'export {k}={shlex.quote(v)}' for k, v in json.load(open(sys.argv[1]))['env'].items()), sep='\n')" "$out/dp-plan.json")"
python3 -m vllm.entrypoints.cli.main serve "${args[@]}" > "$work/engine.log" 2>&1 &
engine=$!
python3 -m stack.entrypoints.gateway --port $gport --upstream "$served=http://127.0.0.1:$eport@$served" \
  --workers "$workers" > "$work/gateway.log" 2>&1 &
gateway=$!
trap 'kill $engine $gateway 2>/dev/null; wait 2>/dev/null; tail -60 "$work/engine.log" > "$out/engine-tail.log"; tail -30 "$work/gateway.log" > "$out/gateway-tail.log"' EXIT
t0=$SECONDS
until curl -sf "http://127.0.0.1:$eport/health" >/dev/null && curl -sf "http://127.0.0.1:$gport/ready" >/dev/null; do
  kill -0 $engine 2>/dev/null || { tail -40 "$work/engine.log"; exit 1; }
  kill -0 $gateway 2>/dev/null || { tail -30 "$work/gateway.log"; exit 1; }
  [ $(( SECONDS - t0 )) -gt 480 ] && { echo "not ready in 480 s" | tee -a "$log"; exit 1; }
  sleep 2
done
echo "engine ($ranks data-parallel ranks) and gateway ($workers workers) ready in $(( SECONDS - t0 )) s" | tee -a "$log"
grep -m4 -E "api_server_count|GPU KV cache size|Maximum concurrency" "$work/engine.log" | tee -a "$log"
tokenizer=${args[0]}
source "$root/bench/gpu/serve_bench.sh"
bench() { bench_at "$1" "$2" "$3" "$gateway"; }  # TARGET PORT CONCURRENCY
bench warm-direct $eport 16; bench warm-gateway $gport 16
for c in $concurrencies; do bench direct $eport "$c"; bench gateway $gport "$c"; bench gateway2 $gport "$c"; bench direct2 $eport "$c"; done
serve_rows "$out/data_parallel.json" "ranks=$ranks" "gateway_workers=$workers"
