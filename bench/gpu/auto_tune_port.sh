#!/usr/bin/env bash
# vLLM's own tuner, side by side with `vstack tune` (issue 12). The site has the vllm package but not the
# repository's benchmarks/auto_tune/auto_tune.sh, so this is a port of its search loop, calling
# `vllm bench serve` the same way (vllm-project/vllm benchmarks/auto_tune/auto_tune.sh, read 2026-11-23):
#   1. gpu_memory_utilization from 0.98 down by 0.01 (to 0.90) until a server starts with the grid's last
#      max_num_seqs x max_num_batched_tokens;
#   2. for each max_num_seqs x max_num_batched_tokens: start `vllm serve MODEL --enable-prefix-caching
#      --load-format dummy --max-model-len ... --gpu-memory-utilization U` (VLLM_SERVER_DEV_MODE=1), run
#      `vllm bench serve --dataset-name random --ignore-eos --request-rate inf --num-prompts 1000 --goodput ...`;
#      when the latency limit is missed, lower the request rate from int(throughput)+1 by 1 (100 prompts a run,
#      POST /reset_prefix_cache and sleep 5 s before each) until it holds;
#   3. the best = the highest request throughput among the combinations that met the limit.
# Deviations, all said in the result file: the latency check is the issue's SLO (P95 TTFT <= 800 ms through
# --metric-percentiles 95 and --goodput ttft:800) instead of its P99 E2EL; servers are stopped by their own
# process group, not `pkill -if vllm`; a smaller grid by default (GRID_SEQS / GRID_TOKENS) to fit the
# device time; no final profiling run; combinations already in the result file are skipped (resume across
# calls, like ours), and a combination is not started when TIME_BUDGET_S would run out during it.
#
#   bash bench/gpu/auto_tune_port.sh 8b | 70b-fp8 | 70b-tp2        (after tune_8b.sh / tune_70b.sh's calls)
# Env: GRID_SEQS, GRID_TOKENS, LATENCY_METRIC/LATENCY_PCT/MAX_LATENCY_ALLOWED_MS, INPUT_LEN, OUTPUT_LEN,
# MAX_MODEL_LEN, TIME_BUDGET_S (520), PROMPTS_INF (1000) / PROMPTS_STEP (100) as auto_tune.sh.
#   device tool: run timeout_s=600 command: bash bench/gpu/auto_tune_port.sh 8b   (rerun to resume)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tune_env.sh"
case "${1:-8b}" in
  8b) target=llama-3.1-8b-instruct; setup=setup-8b; tp=1; extra=() ;;
  70b-fp8) target=h200-llama-3.3-70b-fp8; setup=setup-70b-fp8; tp=1; extra=(--quantization fp8 --kv-cache-dtype fp8) ;;
  70b-tp2) target=a100x8-llama-3.3-70b; setup=setup-70b-tp2; tp=2; extra=() ;;
  cpu) target=cpu-smollm2; setup=setup-cpu; tp=1; extra=(--enforce-eager) ;;  # the script's own check, CPU build
  *) echo "usage: $0 8b|70b-fp8|70b-tp2|cpu"; exit 2 ;;
esac
name=auto-tune-${1:-8b}
log_folder=$work/$name
mkdir -p "$log_folder"
result=$log_folder/result.txt
overlay=$(python3 -m bench.gpu.tune_setup "$target" "$work/$setup") || exit 2
model=$(python3 -c "import sys,yaml; m=yaml.safe_load(open(sys.argv[1]))['models']; print(next(iter(m.values()))['source']['path'])" "$overlay")
INPUT_LEN=${INPUT_LEN:-1024}
OUTPUT_LEN=${OUTPUT_LEN:-128}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-32768}
MIN_CACHE_HIT_PCT=${MIN_CACHE_HIT_PCT:-0}
LATENCY_METRIC=${LATENCY_METRIC:-ttft}      # auto_tune.sh: e2el
LATENCY_PCT=${LATENCY_PCT:-95}               # auto_tune.sh: 99
MAX_LATENCY_ALLOWED_MS=${MAX_LATENCY_ALLOWED_MS:-800}
GRID_SEQS=${GRID_SEQS:-"128 256"}            # auto_tune.sh: "128 256"
GRID_TOKENS=${GRID_TOKENS:-"2048 8192"}      # auto_tune.sh: "512 1024 2048 4096"
TIME_BUDGET_S=${TIME_BUDGET_S:-520}
PORT=${PORT:-8004}
vllm=(python3 -m vllm.entrypoints.cli.main)
label=$(echo "$LATENCY_METRIC" | tr a-z A-Z)
started=$(date +%s)
server_pid=""
echo "port of vllm benchmarks/auto_tune/auto_tune.sh; model $model ($target, dummy weights, TP $tp); limit P$LATENCY_PCT $label <= $MAX_LATENCY_ALLOWED_MS ms; grid seqs [$GRID_SEQS] x tokens [$GRID_TOKENS]" | tee -a "$result"

stop_server() {
  if [ -n "$server_pid" ]; then kill -TERM -- "-$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=""; fi
  sleep 2
}
finish() {
  stop_server
  python3 - "$result" <<'PY' | tee -a "$result"
import re, sys
rows = [dict(re.findall(r"(\w+): ([^,]+)", line)) for line in open(sys.argv[1]) if "request_rate:" in line]
best = max(rows, key=lambda r: float(r["throughput"]), default=None)
print("best (highest throughput meeting the limit): " + (", ".join(f"{k}: {v.strip()}" for k, v in best.items()) if best else "none"))
PY
  echo "elapsed this call: $(( $(date +%s) - started )) s" | tee -a "$result"
  mkdir -p "$out/$name" && cp "$result" "$out/$name/" && tar -C "$log_folder" -cJf "$out/$name/logs.tar.xz" . 2>/dev/null
}
trap finish EXIT

start_server() {  # gpu_memory_utilization max_num_seqs max_num_batched_tokens log
  stop_server
  VLLM_SERVER_DEV_MODE=1 setsid "${vllm[@]}" serve "$model" --port "$PORT" --host 127.0.0.1 \
    --gpu-memory-utilization "$1" --max-num-seqs "$2" --max-num-batched-tokens "$3" --tensor-parallel-size "$tp" \
    --enable-prefix-caching --load-format dummy --max-model-len "$MAX_MODEL_LEN" "${extra[@]}" > "$4" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 60); do  # auto_tune.sh: 60 x 10 s
    kill -0 "$server_pid" 2>/dev/null || return 1
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = "200" ] && return 0
    sleep 10
  done
  return 1
}

bench() {  # rate prompts log
  local prefix_len=$(( INPUT_LEN * MIN_CACHE_HIT_PCT / 100 ))
  "${vllm[@]}" bench serve --backend vllm --model "$model" --base-url "http://127.0.0.1:$PORT" \
    --dataset-name random --random-input-len $(( INPUT_LEN - prefix_len )) --random-output-len "$OUTPUT_LEN" \
    --ignore-eos --disable-tqdm --request-rate "$1" --percentile-metrics ttft,tpot,itl,e2el \
    --metric-percentiles "$LATENCY_PCT" --goodput "$LATENCY_METRIC:$MAX_LATENCY_ALLOWED_MS" \
    --num-prompts "$2" --random-prefix-len "$prefix_len" &> "$3"
  throughput=$(grep "Request throughput (req/s):" "$3" | sed 's/[^0-9.]//g')
  latency=$(grep "P$LATENCY_PCT $label (ms):" "$3" | awk '{print $NF}')
  goodput=$(grep "Request goodput (req/s):" "$3" | sed 's/[^0-9.]//g')
  out_tps=$(grep "Output token throughput (tok/s):" "$3" | sed 's/[^0-9.]//g')
}

read -r -a seqs <<< "$GRID_SEQS"
read -r -a tokens <<< "$GRID_TOKENS"
gmu_file=$log_folder/gpu_memory_utilization
if [ -f "$gmu_file" ]; then
  gmu=$(cat "$gmu_file")
else
  gmu=0.98
  until start_server "$gmu" "${seqs[-1]}" "${tokens[-1]}" "$log_folder/vllm_log_gmu_$gmu.txt"; do
    gmu=$(python3 -c "print(round($gmu - 0.01, 2))")
    python3 -c "import sys; sys.exit(0 if $gmu >= 0.9 else 1)" || { echo "no gpu_memory_utilization >= 0.9 serves"; exit 1; }
  done
  echo "$gmu" > "$gmu_file"
  echo "gpu_memory_utilization: $gmu, seconds: $(( $(date +%s) - started ))" | tee -a "$result"
fi
per_combo=180
for s in "${seqs[@]}"; do
  for t in "${tokens[@]}"; do
    grep -q "^max_num_seqs: $s, max_num_batched_tokens: $t[, ]" "$result" && { echo "done earlier: $s x $t"; continue; }
    if (( $(date +%s) - started + per_combo > TIME_BUDGET_S )); then
      echo "time budget: stopping before $s x $t; rerun to resume" | tee -a "$result"; exit 0
    fi
    t0=$(date +%s)
    start_server "$gmu" "$s" "$t" "$log_folder/vllm_log_${s}_${t}.txt" || { echo "max_num_seqs: $s, max_num_batched_tokens: $t server failed to start" | tee -a "$result"; continue; }
    meet=0
    bench inf "${PROMPTS_INF:-1000}" "$log_folder/bm_log_${s}_${t}_requestrate_inf.txt"
    if python3 -c "import sys; sys.exit(0 if float('${latency:-inf}') <= $MAX_LATENCY_ALLOWED_MS else 1)"; then
      meet=1; rate=inf
    else
      rate=$(( ${throughput%.*} + 1 ))
      while (( rate > 0 )); do
        curl -s -X POST "http://127.0.0.1:$PORT/reset_prefix_cache" > /dev/null
        sleep 5
        bench "$rate" "${PROMPTS_STEP:-100}" "$log_folder/bm_log_${s}_${t}_requestrate_${rate}.txt"
        if python3 -c "import sys; sys.exit(0 if float('${latency:-inf}') <= $MAX_LATENCY_ALLOWED_MS else 1)"; then meet=1; break; fi
        rate=$(( rate - 1 ))
      done
    fi
    took=$(( $(date +%s) - t0 )); per_combo=$(( took > per_combo ? took : per_combo ))
    if (( meet )); then
      echo "max_num_seqs: $s, max_num_batched_tokens: $t, request_rate: $rate, p${LATENCY_PCT}_${LATENCY_METRIC}: $latency, throughput: $throughput, goodput: $goodput, output_tok_s: $out_tps, seconds: $took" | tee -a "$result"
    else
      echo "max_num_seqs: $s, max_num_batched_tokens: $t does not meet latency requirement $MAX_LATENCY_ALLOWED_MS, seconds: $took" | tee -a "$result"
    fi
    stop_server
  done
done
echo "finished every combination" | tee -a "$result"
