# Sourced by gateway_pace.sh and data_parallel.sh after they set $log, $results, $out, $served, $tokenizer,
# $in_len and $out_len: vLLM's own `vllm bench serve` against one target (an engine or a gateway) at a time, the
# gateway's CPU seconds per run, and the rows of every run at the end (bench/gpu/serve_rows.py). Beside the gateway's
# CPU each run logs the client's own (bash's `time`: a client at one core measures itself, not the target), the
# engine's API servers' when $engine is set (not EngineCore), and the SSE chunks per request
# (vLLM's server folds tokens into one chunk when its reader falls behind, so a slow reader gets fewer chunks).
# BENCH_PROMPTS=N sets the prompts of every measured run (default: 2 x the concurrency, 16 under 64 streams); a
# warm-up (a target named warm-*) sends one wave at its concurrency, 16 at least, whatever BENCH_PROMPTS says
# (BENCH_PROMPTS=768 once sent 768 at 16 streams: 265 s lost).
# BENCH_CLIENTS=N splits each measured run across N `vllm bench serve` processes at once (concurrency and prompts
# divided, a seed each), merged into one result file (bench/gpu/serve_rows.py --merge): one client process tops out
# near one core at ~25k streamed tok/s (2026-11-29, x2: 62-69 CPU-s a run), so past that it measures itself.
# A run through a gateway also logs the gateway's own share of the first token in that run (to_engine_p50_ms,
# to_engine_p99_ms: its arrival-to-engine-call histogram scraped before and after, bench/gpu/to_engine.py). With
# $engine_metrics set (the engine's /metrics URL) every run also logs the engine's own first token
# (engine_ttft_mean_ms, _p50_ms, _p99_ms: vLLM's histogram from its arrival), direct or not, so a gap between the
# client's TTFT through a gateway and direct splits into the engine's and what passed outside it.

# utime + stime of a process and its children (a gateway's workers), in ticks of 1/100 s
cpu_s() { for p in $1 $(pgrep -P "$1"); do cat "/proc/$p/stat" 2>/dev/null; done | awk '{s += $14 + $15} END {print s / 100}'; }
# the engine's API servers: its own process and, with --api-server-count N, the children vLLM titles
# VLLM::APIServer_<i> (2026-11-29, x2: counting the parent alone read 0.01 s at 24k tok/s); EngineCore not counted
cpu_api() {
  [ "$1" = 0 ] && { echo 0; return; }
  { echo "$1"; pgrep -f '^VLLM::APIServer'; } | sort -u | while read -r p; do cat "/proc/$p/stat" 2>/dev/null; done \
    | awk '{s += $14 + $15} END {print s / 100}'
}

summary() {  # one row of vLLM's result file, as soon as the run ends (a call cut later keeps it)
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('  ', *(f'{k}={round(d[k], 2)}' for k in
    ('request_throughput', 'output_throughput', 'median_ttft_ms', 'p99_ttft_ms', 'median_tpot_ms') if k in d),
    *([f\"chunks_per_request={sum(len(i) + 1 for i in d['itls']) / len(d['itls']):.1f}\"] if d.get('itls') else []))" "$1"
}

client_run() {  # PORT CONCURRENCY PROMPTS SEED FILE: one `vllm bench serve` process
  python3 -m vllm.entrypoints.cli.main bench serve --backend openai-chat --endpoint /v1/chat/completions \
    --base-url "http://127.0.0.1:$1" --model "$served" --tokenizer "$tokenizer" --dataset-name random \
    --random-input-len "$in_len" --random-output-len "$out_len" --ignore-eos --num-prompts "$3" --seed "$4" \
    --max-concurrency "$2" --request-rate inf --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
    --save-result --save-detailed --result-dir "$results" --result-filename "$5" >> "$out/bench-serve.log" 2>&1
}

clients_run() {  # TARGET PORT CONCURRENCY PROMPTS CLIENTS: the run split across CLIENTS processes, merged
  local k rc=0 parts=()
  for (( k = 0; k < $5; k++ )); do
    client_run "$2" $(( $3 / $5 )) $(( $4 / $5 )) $(( k + 1 )) "bench-$1-c$3.part$k.json" & parts+=("$results/bench-$1-c$3.part$k.json")
  done
  for (( k = 0; k < $5; k++ )); do wait -n || rc=1; done
  [ "$rc" = 0 ] && python3 -m bench.gpu.serve_rows --merge "$results/bench-$1-c$3.json" "${parts[@]}" >> "$out/bench-serve.log" 2>&1 || rc=1
  rm -f "${parts[@]}"
  return $rc
}

bench_at() {  # TARGET PORT CONCURRENCY PID: PID's CPU (with its children's) is counted for the run
  local n=${BENCH_PROMPTS:-$(( $3 < 64 ? 16 : $3 * 2 ))} clients=${BENCH_CLIENTS:-1}
  case $1 in warm*) n=$(( $3 > 16 ? $3 : 16 )); clients=1 ;; esac  # one wave at its concurrency
  local before api_before client_cpu; before=$(cpu_s "$4"); api_before=$(cpu_api "${engine:-0}")
  local prom="" to_engine=""
  case $1 in *direct*) ;; *) prom="${TMPDIR:-/tmp}/vstack-metrics-$1-c$3"; curl -s "http://127.0.0.1:$2/metrics" > "$prom.before" ;; esac
  local eprom="${TMPDIR:-/tmp}/vstack-engine-metrics-$1-c$3" engine_ttft=""
  [ -n "${engine_metrics:-}" ] && curl -s "$engine_metrics" > "$eprom.before"
  local TIMEFORMAT='%U %S'
  if [ "$clients" -gt 1 ]; then
    client_cpu=$( { time clients_run "$1" "$2" "$3" "$n" "$clients"; echo "rc=$?" >&2; } 2>&1 | tr '\n' ' ')
  else
    client_cpu=$( { time client_run "$2" "$3" "$n" 0 "bench-$1-c$3.json"; echo "rc=$?" >&2; } 2>&1 | tr '\n' ' ')
  fi
  local rc; rc=$(sed -n 's/.*rc=\([0-9]*\).*/\1/p' <<< "$client_cpu")
  if [ -n "$prom" ] && curl -s "http://127.0.0.1:$2/metrics" > "$prom.after"; then
    to_engine=" $(python3 -m bench.gpu.to_engine --fields "$prom.before" "$prom.after" 2>/dev/null)"
    rm -f "$prom.before" "$prom.after"  # kept out of $results: a device call returns 8 files at most
  fi
  if [ -n "${engine_metrics:-}" ] && curl -s "$engine_metrics" > "$eprom.after"; then
    engine_ttft=" $(python3 -m bench.gpu.to_engine --engine "$eprom.before" "$eprom.after" 2>/dev/null)"
    rm -f "$eprom.before" "$eprom.after"
  fi
  client_cpu=$(awk '{for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) s += $i} END {print s}' <<< "${client_cpu/rc=$rc/}")
  echo "$1 c=$3 n=$n clients=$clients rc=$rc gateway_cpu_s=$(awk -v a="$before" -v b="$(cpu_s "$4")" 'BEGIN{print b - a}')" \
    "client_cpu_s=$client_cpu engine_api_cpu_s=$(awk -v a="$api_before" -v b="$(cpu_api "${engine:-0}")" 'BEGIN{print b - a}')$to_engine$engine_ttft" \
    | tee -a "$log"
  [ "$rc" = 0 ] && summary "$results/bench-$1-c$3.json" | tee -a "$log"
}

serve_rows() {  # OUT_JSON [KEY=VALUE ...]: every run's row, written to OUT_JSON and printed
  python3 -m bench.gpu.serve_rows "$results" "$log" "$@" | tee -a "$log"
}
