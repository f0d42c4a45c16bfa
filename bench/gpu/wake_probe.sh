#!/usr/bin/env bash
# Why a sleep-mode wake copies below the bus (bench/gpu/wake_probe.py): vLLM's allocator alone, 8B-shaped
# weights, upstream vs the runtime patch vs plain copies, each step timed; plus the host's NUMA and PCIe layout.
#
#   bash bench/gpu/wake_probe.sh      (after the site parts are stashed, as for suite.sh; ~1 min)
#
# Writes $OUT/wake_probe.log (WAKE_PROBE lines: one JSON per step).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
unpack_site
log="$out/wake_probe.log"
{ lscpu | grep -i -E "numa|model name|^cpu\(s\)"; nvidia-smi topo -m; nvidia-smi -q | grep -i -A3 "link width\|PCIe Generation" | head -20; } \
  2>&1 | tee "$log"
python3 -m bench.gpu.wake_probe "$@" 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
