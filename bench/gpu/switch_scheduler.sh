#!/usr/bin/env bash
# The switch schedulers on real engines (issue 31, item 3): two-model Poisson traces (70/30, 50/50) through
# `vstack up` with 8B and 7B shapes (dummy weights) on one GPU, once per policy (fifo, residency, grouped);
# bench/gpu/switch_scheduler.py says how. The stand-in twin that decided the default: bench/switch_scheduler.py.
#
#   bash bench/gpu/run.sh switch_scheduler [RATE] [DURATION_S] [POLICIES]   default 1.5 req/s, 120 s, all three
#
# Device-tool calls for the lead (after merging branch `spill`; site parts as for the suite; each call <= 600 s,
# so one policy per call):
#   run command="bash bench/gpu/run.sh switch_scheduler 1.5 120 fifo"        (timeout_s 600)
#   run command="bash bench/gpu/run.sh switch_scheduler 1.5 120 residency"
#   run command="bash bench/gpu/run.sh switch_scheduler 1.5 120 grouped"
# Results under $OUT: switch_scheduler-<POLICIES>.json (per policy and mix: goodput, attainment, p95 TTFT per model).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
rate=${1:-1.5}
duration=${2:-120}
policies=${3:-fifo,residency,grouped}
unpack_site
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$out/switch_scheduler.log"
python3 -m bench.gpu.switch_scheduler --out "$out/switch_scheduler-${policies//,/-}.json" --rate "$rate" \
  --duration-s "$duration" --policies "$policies" 2>&1 | tee -a "$out/switch_scheduler.log"
exit "${PIPESTATUS[0]}"
