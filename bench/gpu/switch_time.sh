#!/usr/bin/env bash
# Sleeping switches on one GPU: vstack (tiers, overlapped wake) vs raw vLLM sleep + wake vs the bus limit from a
# pinned torch copy, measured in the same run on the same engines (bench/switch_time.py --gpu, issue 14).
#
#   bash bench/gpu/switch_time.sh pair  [REPEAT]   8B <-> 3B shapes, REPEAT times each way (default 3), then
#                                                  once with the 3B at level 2 (weights reloaded): ~4 min
#   bash bench/gpu/switch_time.sh round [REPEAT]   4 models of 3B-8B shapes asked in turn (default 2): ~7 min
#
# Device-tool calls for the lead (from /work/main after merging branch `switch`; the site parts are the GPU
# suite's, built by `bash bench/gpu/build_site.sh`; back to back, a machine stays warm ~30 s after a call):
#   run kind=nvidia-h100-x1 carry=[".gpu1"] command="bash bench/gpu/suite.sh --stash"
#   run                     carry=[".gpu2"] command="bash bench/gpu/suite.sh --stash"
#   run                     carry=[".gpu3"] command="bash bench/gpu/suite.sh --stash && bash bench/gpu/switch_time.sh pair"
#   run                                     command="bash bench/gpu/switch_time.sh round"
# (timeout_s 600 each.) The parts unpack once into /tmp/vstack-site (as suite.sh does). Results come back under
# $OUT: switch_time_gpu_<scenario>.json (every switch, its phases, the summary), switch_time_<scenario>.log
# (tee'd as it runs, so a run stopped at its limit still returns what it printed), the engines' logs.
# On an H200 (kind nvidia-h200) the same calls work; compare timings only within one device kind.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
scenario=${1:-pair}
repeat=${2:-$([ "$scenario" = round ] && echo 2 || echo 3)}
parts=${VSTACK_GPU_PARTS:-/tmp/vstack-parts}
site=${VSTACK_GPU_SITE:-/tmp/vstack-site}
out=${OUT:-$root/bench/results/out}
work=${VSTACK_GPU_WORK:-/tmp/vstack-gpu-switch}/$scenario
mkdir -p "$parts" "$out" "$work"
for p in "$root"/.gpu[0-9]/part.*; do [ -e "$p" ] && cp "$p" "$parts/"; done
if [ ! -d "$site/vllm" ]; then
  mkdir -p "$site"
  ls "$parts"/part.* >/dev/null 2>&1 || { echo "no site parts in $parts: carry .gpu1/ .gpu2/ ... first (header)"; exit 2; }
  cat $(ls "$parts"/part.* | sort) | xz -dc -T16 | tar -C "$site" -xf - || { echo "the site parts do not unpack"; exit 2; }
fi
export PYTHONPATH="$site:$root" VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
  VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 LITELLM_LOCAL_MODEL_COST_MAP=True
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$out/switch_time_$scenario.log"
free -g | tee -a "$out/switch_time_$scenario.log"
python3 bench/switch_time.py --gpu --scenario "$scenario" --repeat "$repeat" --logs "$work" \
  --out "$out/switch_time_gpu_$scenario.json" 2>&1 | tee -a "$out/switch_time_$scenario.log"
code=${PIPESTATUS[0]}
tar -C "$work" -cJf "$out/switch-engine-logs-$scenario.tar.xz" logs 2>/dev/null
exit "$code"
