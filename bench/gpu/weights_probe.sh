#!/usr/bin/env bash
# Where vLLM's weight memory goes, tensor by tensor, against the planner (bench/gpu/weights_probe.py), for the
# shapes of the RTX 4090 rows (held to the card's kernels: Machete off, Marlin as on Ada) and an H200 row.
#
#   bash bench/gpu/weights_probe.sh            (after the site parts are stashed, as for suite.sh; ~4 min)
#
# Writes $OUT/weights_probe.log and $OUT/weights_probe.jsonl (one line per shape).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
unpack_site
log="$out/weights_probe.log"
: > "$out/weights_probe.jsonl"
probe() {
  python3 -m bench.gpu.weights_probe "$@" 2>&1 | tee -a "$log" | grep '^WEIGHTS_PROBE ' | cut -c15- \
    | tee -a "$out/weights_probe.jsonl"
}
VLLM_DISABLED_KERNELS=MacheteLinearKernel probe Qwen--Qwen2.5-32B-Instruct-AWQ --set max_model_len=4096
probe Qwen--Qwen2.5-7B-Instruct --set max_model_len=4096
probe meta-llama--Llama-3.1-8B-Instruct --set quantization=fp8
