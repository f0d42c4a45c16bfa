#!/usr/bin/env bash
# Pinning a first sleep's host buffers, torch's way vs the sleep patch's (issue 37; bench/gpu/pinned_probe.py):
# the weight allocations of a Qwen2.5-7B and a Llama-3.1-8B shape, allocated and copied into, each way twice.
# Needs only the machine's torch (no site): it can ride on the first site stash call.
#
#   bash bench/gpu/run.sh pinned_probe        ~1-2 min on an H100
#   run carry=[".gpu1"] command="bash bench/gpu/run.sh pinned_probe"   (stashes .gpu1 as site.sh does)
# Results under $OUT: pinned_probe.json.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
grep -E 'MemTotal|MemAvailable|Hugepagesize' /proc/meminfo; cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null
uname -r
python3 -m bench.gpu.pinned_probe --out "$out/pinned_probe.json"
