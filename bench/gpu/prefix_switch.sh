#!/usr/bin/env bash
# A long shared prefix across a model switch (issue 31, item 1): the first request of model A after a switch to
# B and back, with `manager.keep_prefix_cache` true (vLLM's KV offloading CPU tier + the runtime patch
# keep-prefix-cache-across-sleep) and false (today's switch), the switch times beside it; 8B and 7B shapes,
# dummy weights, one GPU (bench/gpu/prefix_switch.py says the steps).
#
#   bash bench/gpu/run.sh prefix_switch [PREFIX_TOKENS] [CYCLES]     default 8192 tokens, 3 cycles: ~8 min
#   bash bench/gpu/run.sh prefix_switch 8192 3 --cuda-graphs --sides keep   then `... --sides off` in the next call:
#                                                                    engines with CUDA graphs, one side per call (each
#                                                                    compiles and captures at its first start); then
#                                                                    python3 -m bench.gpu.prefix_switch --merge K.json O.json --out F.json
#   bash bench/gpu/run.sh prefix_switch 32768 2 --cuda-graphs --sides keep --engine block_size=64   (then --sides off,
#                                                                    same options): the stack gives engines with the tier
#                                                                    64-token blocks (adr/0027), so both sides get them
#                                                                    here; 6.28x on an H200 (2026-11-27)
#   bash bench/gpu/run.sh prefix_switch 32768 2                      a 32k session (A's tier sized to hold it, B within
#                                                                    its 32k checkpoint): on an H100 the 8k one is bounded
#                                                                    at 2.3x by the no-switch floor (2026-11-27)
#
# Device-tool call for the lead (after merging branch `spill`; the site parts as for the suite, carried once):
#   run carry=[".gpu1"] command="bash bench/gpu/suite.sh --stash"   (and .gpu2, .gpu3, .gpu4, as README "GPU suite")
#   run command="bash bench/gpu/run.sh prefix_switch 8192 3"          (timeout_s 600)
# Results come back under $OUT: prefix_switch.json (every cycle, the summary: TTFT gain >= 5x, switch <= 1.1x),
# prefix_switch.log, the engines' logs (their `vstack runtime patches` line says whether the patch ran).
# Then: python -m bench.harness.results adopt $OUT/prefix_switch.json --name prefix-switch --device h100 ...
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
tokens=${1:-8192}
cycles=${2:-3}
shift $(($# < 2 ? $# : 2))
name=prefix_switch$(printf '%s' "$*" | tr -c 'a-z0-9' '-' | sed 's/--*/-/g; s/-$//')
unpack_site
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$out/prefix_switch.log"
free -g | tee -a "$out/prefix_switch.log"
python3 -m bench.gpu.prefix_switch --out "$out/$name.json" --prefix-tokens "$tokens" --cycles "$cycles" "$@" \
  2>&1 | tee -a "$out/prefix_switch.log"
exit "${PIPESTATUS[0]}"
