#!/usr/bin/env bash
# Sleeping switches on one GPU: vstack (tiers, overlapped wake) vs raw vLLM sleep + wake vs the bus limit from a
# pinned torch copy, measured in the same run on the same engines (bench/switch_time.py --gpu, issue 14).
#
#   bash bench/gpu/switch_time.sh pair  [REPEAT]        8B <-> 3B shapes, REPEAT times each way (default 3): ours
#                                                       (patched engines), then raw vLLM's own engines: ~6 min
#   bash bench/gpu/switch_time.sh round [REPEAT] SIDES  4 models of 3B-8B shapes asked in turn (default 2); SIDES
#                                                       ours or raw, one per call (each side starts 4 engines)
#   bash bench/gpu/switch_time.sh trio 2 handoff-kept   the pair and a 7B at 0.9 in turn: the 7B does not fit
#                                                       beside the 8B's kept weights, so each of its starts and
#                                                       wakes has them released (adr/0058's Evict.RELEASE; the
#                                                       pair and the round never need it): ~4 min (H200,
#                                                       2026-11-30: 228 s)
#   bash bench/gpu/switch_time.sh pair 5 handoff,raw    the stack's default switch (the memory handoff,
#                                                       manager.sleep_handoff) next to raw vLLM: ~4.5 min
#   bash bench/gpu/switch_time.sh round 3 handoff       the same for 4 models (raw: round 3 raw, another call)
#   bash bench/gpu/switch_time.sh pair 3 handoff,handoff-overlap,raw
#                                                       the handoff sequential and overlapped (adr/0035),
#                                                       round by round on the same engines, then raw: ~6 min
#
#   bash bench/gpu/switch_time.sh pair 5 handoff-overlap,handoff-warm,raw
#                                                       issue 58: the switch without the warm hand-over, then raw
#                                                       vLLM, then the default switch: engines warmed after their
#                                                       start (manager.warm_handoff, adr/0053): 5.5-7.5 min on an
#                                                       H200 (2026-11-29: 327 s and 441 s)
#
#   bash bench/gpu/switch_time.sh pair 3 raw; VSTACK_SWITCH_SETTLE_S=1 bash bench/gpu/switch_time.sh pair 3 raw
#                                                       issue 58's next probe (~2.5 min each): every switch also
#                                                       sends its request again at once (`first token after the
#                                                       switch ... the same request again` in the summary); with
#                                                       the settle, raw vLLM's first request waits 1 s after the
#                                                       wake: if its extra ~0.05 s goes, it is work the wake leaves
#                                                       running, else work the first forward does itself
#
#   VSTACK_SWITCH_CUDA_GRAPHS=1 bash bench/gpu/switch_time.sh pair 4 handoff-warm   then `... pair 4 raw` in the
#                                                       next call: the engines with CUDA graphs, as the GPU profiles
#                                                       serve (the eager first forward costs 0.06-0.10 s of every
#                                                       switch, raw vLLM's too: the 2026-11-29 probe); one side per
#                                                       call (compiling makes each start longer); then
#                                                       `python3 -m bench.harness.switch_summary A.json B.json`
#   VSTACK_SWITCH_CUDA_GRAPHS=1 bash bench/gpu/switch_time.sh pair 4 handoff-warm,handoff-spare
#                                                       the default switch and the same with the last switch's
#                                                       leftover kept for the next weights wake (manager.
#                                                       handoff_spare, adr/0057), alternating round by round on
#                                                       one pair of warmed engines: ~4 min on the lent x2
#   VSTACK_SWITCH_CUDA_GRAPHS=1 bash bench/gpu/switch_time.sh pair 4 handoff-warm,handoff-kept
#                                                       the switch that copies weights (the default until
#                                                       2026-11-30), then on the same engines each sleep keeping
#                                                       its weights mapped (manager.sleep_keeps_weights, adr/0058)
#   VSTACK_SWITCH_CUDA_GRAPHS=1 bash bench/gpu/switch_time.sh pair 4 handoff-kept,raw
#                                                       the stack's default switch since 2026-11-30 (each sleep
#                                                       keeps its weights mapped where they fit: manager.
#                                                       sleep_keeps_weights, adr/0058) on engines that keep from
#                                                       their start on, so its first switch is a user's; raw vLLM
#                                                       first, in the same call
#
# Issue 58's device calls (kind nvidia-h200, timeout_s 600 each):
#   run kind=nvidia-h200 carry=[".gpu1"] command="bash bench/gpu/suite.sh --stash"
#   run                  carry=[".gpu2"] command="bash bench/gpu/suite.sh --stash"
#   run                  carry=[".gpu3"] command="bash bench/gpu/suite.sh --stash"
#   run                  carry=[".gpu4"] command="bash bench/gpu/suite.sh --stash"
#   run                  command="bash bench/gpu/switch_time.sh pair 5 handoff-overlap,handoff-warm,raw"
# The result JSON is rewritten after each side, so a run stopped at its limit still returns the sides done
# (handoff-warm runs last). It ends with the summary table (docs/guides/switching.md says what each column means;
# `python3 -m bench.harness.switch_summary FILE.json` prints it again).
#
# Device-tool calls for the lead (from /work/main after merging branch `switch`; the site parts are the GPU
# suite's, built by `bash bench/gpu/build_site.sh`; back to back, a machine stays warm ~30 s after a call):
#   run kind=nvidia-h100-x1 carry=[".gpu1"] command="bash bench/gpu/suite.sh --stash"
#   run                     carry=[".gpu2"] command="bash bench/gpu/suite.sh --stash"
#   run                     carry=[".gpu3"] command="bash bench/gpu/suite.sh --stash"
#   run                     carry=[".gpu4"] command="bash bench/gpu/suite.sh --stash && bash bench/gpu/switch_time.sh pair"
#   run                                     command="bash bench/gpu/switch_time.sh round 2 ours"
#   run                                     command="bash bench/gpu/switch_time.sh round 2 raw"
# (timeout_s 600 each.) The parts unpack once into /tmp/vstack-site (as suite.sh does). Results come back under
# $OUT: switch_time_gpu_<scenario>.json (every switch, its phases, the summary), switch_time_<scenario>.log
# (tee'd as it runs, so a run stopped at its limit still returns what it printed), the engines' logs.
# On an H200 (kind nvidia-h200) the same calls work; compare timings only within one device kind.
# The summary's `_first_switch_after_start` gives each side's first switch after its engines started beside its
# steady median (issue 37: <= 1.2x); starts wait for the engine's `vstack stage:` line (host buffers staged).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
scenario=${1:-pair}
repeat=${2:-$([ "$scenario" = round ] && echo 2 || echo 3)}
sides=${3:-ours,raw}
work=${VSTACK_GPU_WORK:-/tmp/vstack-gpu-switch}/$scenario
mkdir -p "$work"
unpack_site
# The GPU's uuid: two runs on two lent machines (issue 58: a newcomer's rerun) are told apart by it.
nvidia-smi --query-gpu=name,uuid,memory.total,memory.used,driver_version --format=csv | tee "$out/switch_time_$scenario.log"
free -g | tee -a "$out/switch_time_$scenario.log"
tag=$scenario$([ "$sides" = ours,raw ] || echo "-${sides//,/-}")$([ "${VSTACK_SWITCH_CUDA_GRAPHS:-0}" = 1 ] && echo -graphs)
python3 bench/switch_time.py --gpu --scenario "$scenario" --repeat "$repeat" --sides "$sides" --logs "$work" \
  --out "$out/switch_time_gpu_$tag.json" 2>&1 | tee -a "$out/switch_time_$scenario.log"
code=${PIPESTATUS[0]}
tar -C "$work" -cJf "$out/switch-engine-logs-$tag.tar.xz" logs 2>/dev/null
exit "$code"
