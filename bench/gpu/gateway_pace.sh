#!/usr/bin/env bash
# Does the gateway keep pace with the GPU? (issue 54, item 4) vLLM's own `vllm bench serve` against one engine
# directly and through the gateway (`python -m stack.entrypoints.gateway --upstream`, its own process), alternating
# target by target at each concurrency, on the Llama-3.1-8B shape (dummy weights) held as the
# a100-80gb-llama-3.1-8b profile runs it (max-num-seqs 256), and the gateway process's CPU seconds per run.
# Prefix caching is off: `bench serve`'s random prompts repeat run after run (one seed), so a later run would hit
# the cache an earlier one filled and look faster (seen: the second run at 256 streams 2.4x the first).
#
#   bash bench/gpu/gateway_pace.sh [CONCURRENCIES] [IN/OUT]     defaults "1 64 256 512", 1024/128
#   GATEWAY_WORKERS=4 bash bench/gpu/gateway_pace.sh 256 128/1024   also a second gateway with 4 worker processes
#     (adr/0049), benched in the same alternation: direct, gateway (1 process), gateway-w4, direct2
#
#   ENGINE_ARGS="--api-server-count 2" GATEWAY_WORKERS=4 BENCH_PROMPTS=768 BENCH_CLIENTS=2 bash bench/gpu/gateway_pace.sh 256 128/1024
#     the engine's own front on two processes: at 256 streams x 1,024 tokens one vLLM API server is 97-99% busy,
#     direct or not (bench/results/2026-11-29-h200-gateway-pace-api-server), so that row measured the engine's
#     front, and its direct runs differed by 10%; BENCH_PROMPTS: 3 waves of 256 instead of 2 (~420 s with the
#     engine's start: its own call; the warm-ups send 16 prompts whatever BENCH_PROMPTS says). Ran 2026-11-29 on x2
#     in 499 s (bench/results/2026-11-29-h200-x2-gateway-pace-two-api-servers): tokens 0.999x / 0.964x (4 workers),
#     TTFT p50 1.10-1.13x, p99 1.18x
#   BENCH_PROMPTS=200 GATEWAY_WORKERS=4 bash bench/gpu/gateway_pace.sh 1 1024/16
#     one stream's TTFT from 200 requests per target (issue 54: <= +1.5 ms; 16 per run gave +-2 ms); 327 s on x2
#     (bench/results/2026-11-29-h200-x2-gateway-pace-one-stream)
#
# Device-tool calls, back to back (the site parts are the GPU suite's, bench/gpu/build_site.sh):
#   run kind=nvidia-h200 carry=[".gpu1"] command="bash bench/gpu/suite.sh --stash"   (the same for .gpu2, .gpu3)
#   run                  carry=[".gpu4"] command="bash bench/gpu/suite.sh --stash && bash bench/gpu/gateway_pace.sh"
# (timeout_s 600: each `bench serve` starts in ~25 s and the engine in ~2 min, so "1 64" fits one call, "256" and
# "512" one call each; the 2026-11-29 run of "1 64 256" was cut during 256). Results under $OUT: gateway_pace.log (tee'd, a row per
# run as it ends), gateway_pace.json (the rows: req/s, output tok/s, TTFT p50/p99, TPOT, the gateway's CPU s),
# the engine's and gateway's log tails; vLLM's own result files stay in $work/results (a call returns few files).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
concurrencies=${1:-"1 64 256 512"}
shape=${2:-1024/128}
in_len=${shape%/*}; out_len=${shape#*/}
work=${VSTACK_GPU_WORK:-/tmp/vstack-gpu-pace}
mkdir -p "$work/results"
rm -f "$work"/results/bench-*.json
unpack_site
log="$out/gateway_pace.log"
log_device "$log"
model=$(dummy_model "$work/models/llama-3.1-8b" meta-llama--Llama-3.1-8B-Instruct)
eport=18400; gport=18401
python3 -m vllm.entrypoints.cli.main serve "$model" --host 127.0.0.1 --port $eport --served-model-name llama8b \
  --load-format dummy --max-num-seqs 256 --max-model-len 4096 --gpu-memory-utilization 0.9 --no-enable-prefix-caching \
  ${ENGINE_ARGS:-} > "$work/engine.log" 2>&1 &
engine=$!
workers=${GATEWAY_WORKERS:-1}
python3 -m stack.entrypoints.gateway --port $gport --upstream "llama8b=http://127.0.0.1:$eport@llama8b" \
  --workers 1 > "$work/gateway.log" 2>&1 &
gateway=$!
gatewayn=$gateway; nport=$gport
if [ "$workers" -gt 1 ]; then
  nport=18402
  python3 -m stack.entrypoints.gateway --port $nport --upstream "llama8b=http://127.0.0.1:$eport@llama8b" \
    --workers "$workers" > "$work/gateway-w$workers.log" 2>&1 &
  gatewayn=$!
fi
trap 'kill $engine $gateway $gatewayn 2>/dev/null; wait 2>/dev/null; tail -40 "$work/engine.log" > "$out/engine-tail.log"; tail -30 "$work/gateway.log" > "$out/gateway-tail.log"; [ "$workers" -gt 1 ] && tail -30 "$work/gateway-w$workers.log" >> "$out/gateway-tail.log"' EXIT
t0=$SECONDS
until curl -sf "http://127.0.0.1:$eport/health" >/dev/null && curl -sf "http://127.0.0.1:$gport/ready" >/dev/null \
    && curl -sf "http://127.0.0.1:$nport/ready" >/dev/null; do
  kill -0 $engine 2>/dev/null || { tail -30 "$work/engine.log"; exit 1; }
  kill -0 $gateway 2>/dev/null || { tail -30 "$work/gateway.log"; exit 1; }
  kill -0 $gatewayn 2>/dev/null || { tail -30 "$work/gateway-w$workers.log"; exit 1; }
  [ $(( SECONDS - t0 )) -gt 400 ] && { echo "not ready in 400 s" | tee -a "$log"; exit 1; }
  sleep 2
done
echo "engine and gateway ready in $(( SECONDS - t0 )) s" | tee -a "$log"
served=llama8b; tokenizer=$model; results="$work/results"; engine_metrics="http://127.0.0.1:$eport/metrics"
source "$root/bench/gpu/serve_bench.sh"
bench() {  # TARGET PORT CONCURRENCY: the gateway on that port counted
  local pid=$gateway; [ "$2" = "$nport" ] && pid=$gatewayn
  bench_at "$1" "$2" "$3" "$pid"
}
# A warm-up through each target, then each concurrency direct and through the gateway, in alternating order. With
# workers, each concurrency of 64 or more starts with one wave at it, direct: on 2026-11-30 the first 256-stream run
# (direct) answered its first tokens 1.8x later than the last (direct2), as the engine itself measured them (vLLM's
# TTFT mean 530 vs 300 ms), after warm-ups of 16 streams only.
bench warm-direct $eport 16; bench warm-gateway $gport 16
if [ "$workers" -gt 1 ]; then
  bench "warm-gateway-w$workers" $nport 16
  for c in $concurrencies; do
    [ "$c" -ge 64 ] && bench "warm-direct" $eport "$c"  # one wave at this concurrency first: see below
    bench direct $eport "$c"; bench gateway $gport "$c"; bench "gateway-w$workers" $nport "$c"; bench direct2 $eport "$c"
  done
else
  for c in $concurrencies; do bench direct $eport "$c"; bench gateway $gport "$c"; bench gateway2 $gport "$c"; bench direct2 $eport "$c"; done
fi
serve_rows "$out/gateway_pace.json"
