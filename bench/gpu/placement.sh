#!/usr/bin/env bash
# Two models on a host of two GPUs (adr/0056): `manager.gpu_placement: spread` (each engine pinned to its own
# GPU, both resident) against `first` (both from GPU 0, taking turns), one `vstack up` each, the 8B and 7B shapes
# with dummy weights; bench/gpu/placement.py says what each request records and what passes.
#
#   bash bench/gpu/placement.sh [SIDES]       default spread,first (~5 min: 4 eager engine starts)
#
# Device-tool calls (site parts as for the suite, bench/gpu/build_site.sh), kind nvidia-h200-x2:
#   run kind=nvidia-h200-x2 carry=[".gpu1"] command="bash bench/gpu/suite.sh --stash"   (the same for .gpu2-.gpu4)
#   run                     command="bash bench/gpu/placement.sh"                       timeout_s=600
# Results under $OUT: placement.json (per side: the plan's GPU lines, each request's first token, the models'
# states and each GPU's used memory; the verdict), placement.log, the engines' log tails.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
if [ "${1:-}" = "--stash" ]; then ls -la "$parts"; exit 0; fi
unpack_site
log="$out/placement.log"
log_device "$log"
timeout 570 python3 -m bench.gpu.placement --out "$out/placement.json" --sides "${1:-spread,first}" 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
