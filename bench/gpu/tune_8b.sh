#!/usr/bin/env bash
# Issue 12: `vstack tune` in goodput mode on the Llama-3.1-8B shape (dummy weights), SLO p95 TTFT < 800 ms,
# on the lent H100 or H200; resumable across calls (tune-state.json), each call stopping cleanly within
# its --time-budget. vLLM's own auto_tune (ported: bench/gpu/auto_tune_port.sh) runs on the same machine
# in a later call, same model, same SLO; bench/gpu/tune_compare.py puts both side by side.
#
# Device-tool calls, back to back (a machine stays warm ~30 s after a call; the site parts are stashed in
# /tmp by the first three, the third unpacking them; `bash bench/gpu/build_site.sh` here first if .gpu1-3/
# are missing). As run on 2026-11-24 19:32 (README "What `vstack tune` found"; 6 candidates, 932 s, 2 calls):
#   run kind=nvidia-h200 carry=[".gpu1"] timeout_s=120     command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu2"] timeout_s=120                      command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu3"] timeout_s=180                      command: bash bench/gpu/suite.sh --stash
unpacks, byte-compiles, import check: ~1 min)
#   run carry=[".gpu4"] timeout_s=180                      command: bash bench/gpu/suite.sh --stash >/dev/null && bash -c 'source bench/gpu/site.sh && unpack_site'   (unpacks, byte-compiles, import check: ~1 min)
#   run timeout_s=600                                      command: bash bench/gpu/tune_8b.sh --restart
#   run timeout_s=600                                      command: bash bench/gpu/tune_8b.sh      (resumes; again until complete)
# vLLM's auto_tune next (a machine goes back after 30 minutes held: on a fresh one, stash the parts again):
#   run timeout_s=600                                      command: bash bench/gpu/auto_tune_port.sh 8b   (resumes; 3 calls for 2x2)
# then, here, on the fetched folders: python3 bench/gpu/tune_compare.py FOLDER (tune-8b/ and auto-tune-8b/ in it)
# If a call finds a cold machine: carry the four parts again, and put the last call's tune-state.json at
# bench/gpu/state/tune-8b/tune-state.json (untracked: it travels with the tree) to resume there.
# Everything lands in $OUT/tune-8b/ (tune.md, tune.json, goodput_curves.png, tune-state.json, logs) and
# $OUT/tune-8b.log. Env: TUNE_BUDGET_S (540: a call's 600 s less the site's unpacking and the collection),
# TUNE_MAX_CANDIDATES (6), TUNE_TARGET, TUNE_SLO, TUNE_SCENARIO
# (checked on the CPU build with TUNE_TARGET=cpu-smollm2 and a tiny scenario, VSTACK_GPU_SITE=the venv's).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tune_env.sh"
name=tune-8b
dir=$work/$name
target=${TUNE_TARGET:-llama-3.1-8b-instruct}
seed_state "$name" "$dir"
overlay=$(python3 -m bench.gpu.tune_setup "$target" "$work/setup-8b") || exit 2
started=$(date +%s)
timeout $(( ${TUNE_BUDGET_S:-540} + 45 )) python3 -m stack.entrypoints.cli --config "$overlay" tune "$target" \
  --scenario "${TUNE_SCENARIO:-gpu-8b-goodput}" --slo "${TUNE_SLO:-p95_ttft_ms<800}" --max-candidates "${TUNE_MAX_CANDIDATES:-6}" \
  --time-budget "${TUNE_BUDGET_S:-540}" --out "$dir" "$@" 2>&1 | tee -a "$out/$name.log"
code=${PIPESTATUS[0]}
echo "call wall time: $(( $(date +%s) - started )) s, exit $code" | tee -a "$out/$name.log"
collect "$name" "$dir"
exit "$code"
