#!/usr/bin/env bash
# First and repeat start on the GPU (issue 14, item 4): `vstack up PROFILE` to its first token on an empty
# compile cache, then again with the cache it left, next to plain `vllm serve` (the command `vstack config
# render` prints) first and repeat, each kind on its own cache, in one run (bench/startup_time.py).
#
#   RESTARTS=0 bash bench/gpu/startup.sh [PROFILE]   first and repeat, default rtx4090-qwen2.5-7b (held to 24 GiB):
#                                                    ~8.5 min on an H100 with the warm-up (one call)
#   WARM_UP=0 RESTARTS=0 REPEATS=2 bash bench/gpu/startup.sh   on a machine already warm (a run before it read the
#                                                    CUDA libraries): first, then two repeat starts of each
#                                                    kind in alternating order, the median (~8 min on an H100)
#   WARM_UP=0 KINDS=vstack_up RESTARTS=1 bash bench/gpu/startup.sh   the stack alone: first, repeat and the
#                                                    restarts (~6 min; the kept-asleep restart adds seconds)
#
# An unmeasured plain start (eager) goes first (WARM_UP=0 leaves it out): on a fresh machine the first process to
# start vLLM reads torch's CUDA libraries from a cold disk, which must not be charged to one kind; then the kinds
# alternate (plain first, stack first, plain repeat, stack repeat). Each start's engine log lands in
# $OUT/startup-logs/ (what vLLM did with its compile cache), the JSON after every start.
#
# With the restarts (issue 37): on the stack the repeat start left, `vstack reload` unchanged, `vstack down
# --keep-engines && vstack up` (the engine re-attached), `vstack down && vstack up` (the engine kept asleep by
# `down` and woken by `up`, adr/0030; goal: <= 10 s) and `vstack reload` after its command changed (an env var
# vLLM ignores), each to its first token; and each start's phases (seconds after the command began). `down --all
# && up` is the repeat start (every engine stopped, the compile cache warm).
#
# Device-tool call (after the site parts are stashed, as for bench/gpu/suite.sh):
#   run command="bash bench/gpu/startup.sh" timeout_s=600
# Results under $OUT: startup_gpu_<profile>.json and startup_gpu.log (tee'd as it runs).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
profile=${1:-rtx4090-qwen2.5-7b}
work=${VSTACK_GPU_WORK:-/tmp/vstack-gpu-startup}
rm -rf "$work" && mkdir -p "$work"
unpack_site
overlay=$(python3 -m bench.gpu.startup_prep "$profile" "$work") || exit 2
python3 bench/startup_time.py --first-and-repeat $([ "${WARM_UP:-1}" = 0 ] || echo --warm-up) $([ "${RESTARTS:-1}" = 0 ] || echo --restarts) \
  --repeats "${REPEATS:-1}" \
  ${KINDS:+--kinds "$KINDS"} \
  --profile "$profile" --config "$overlay" \
  --out "$out/startup_gpu_$profile.json" 2>&1 | tee "$out/startup_gpu.log"
exit "${PIPESTATUS[0]}"
