# Sourced by gateway_pace.sh and data_parallel.sh after they set $log, $results, $out, $served, $tokenizer,
# $in_len and $out_len: vLLM's own `vllm bench serve` against one target (an engine or a gateway) at a time, the
# gateway's CPU seconds per run, and the rows of every run at the end (bench/gpu/serve_rows.py).

# utime + stime of a process and its children (a gateway's workers), in ticks of 1/100 s
cpu_s() { for p in $1 $(pgrep -P "$1"); do cat "/proc/$p/stat" 2>/dev/null; done | awk '{s += $14 + $15} END {print s / 100}'; }

summary() {  # one row of vLLM's result file, as soon as the run ends (a call cut later keeps it)
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('  ', *(f'{k}={round(d[k], 2)}' for k in
    ('request_throughput', 'output_throughput', 'median_ttft_ms', 'p99_ttft_ms', 'median_tpot_ms') if k in d))" "$1"
}

bench_at() {  # TARGET PORT CONCURRENCY PID: PID's CPU (with its children's) is counted for the run
  local n=$(( $3 < 64 ? 16 : $3 * 2 ))
  local before; before=$(cpu_s "$4")
  python3 -m vllm.entrypoints.cli.main bench serve --backend openai-chat --endpoint /v1/chat/completions \
    --base-url "http://127.0.0.1:$2" --model "$served" --tokenizer "$tokenizer" --dataset-name random \
    --random-input-len "$in_len" --random-output-len "$out_len" --ignore-eos --num-prompts "$n" \
    --max-concurrency "$3" --request-rate inf --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
    --save-result --result-dir "$results" --result-filename "bench-$1-c$3.json" >> "$out/bench-serve.log" 2>&1
  local rc=$?
  echo "$1 c=$3 n=$n rc=$rc gateway_cpu_s=$(awk -v a="$before" -v b="$(cpu_s "$4")" 'BEGIN{print b - a}')" | tee -a "$log"
  [ "$rc" = 0 ] && summary "$results/bench-$1-c$3.json" | tee -a "$log"
}

serve_rows() {  # OUT_JSON [KEY=VALUE ...]: every run's row, written to OUT_JSON and printed
  python3 -m bench.gpu.serve_rows "$results" "$log" "$@" | tee -a "$log"
}
