#!/usr/bin/env bash
# Issue 12, the ADR-003 workload: `vstack tune` in goodput mode on the Llama-3.3-70B shape (dummy weights),
# SLO p95 TTFT < 800 ms and p50 < 350 ms (loadtests/scenarios/gpu-70b-goodput.yaml), reported as output
# tok/s per GPU at the goodput next to ADR-003's 12,000 tok/s on 8 A100s (1,500 per GPU):
#   fp8  - profile h200-llama-3.3-70b-fp8 on one H200 (fp8 weights and KV cache)
#   tp2  - profile a100x8-llama-3.3-70b at tensor parallel 2 on two H200s (bf16 weights; fp8 a candidate)
#   tp4  - the same profile at tensor parallel 4 on nvidia-h200-x4, each GPU held to the A100's 80 GB (issue 57)
#   tp8  - ADR-003's own setup: tensor parallel 8 on nvidia-h200-x8, held to 8 x A100 80 GB (issue 57)
#   (the tensor parallel is the lent GPUs' count: bench/gpu/profiles.py; the variant names the state folder)
# A 70B candidate took 450-600 s on the H200 (start ~70-170 s, 7 probes of ~50 s at ~3 req/s): a call measures
# at most one; rerun the same call to resume (2026-11-24: 2 candidates in 4 calls, 1,553 s).
#
# Device-tool calls (the site parts stashed first, as for tune_8b.sh, on the same kind):
#   run kind=nvidia-h200 carry=[".gpu1"] timeout_s=120    command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu2"] timeout_s=120                     command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu3"] timeout_s=600                     command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu4"] timeout_s=600                     command: bash bench/gpu/tune_70b.sh fp8
#   run timeout_s=600                                     command: bash bench/gpu/tune_70b.sh fp8   (resumes)
#   run kind=nvidia-h200-x2 carry=[".gpu1"] timeout_s=120 command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu2"] timeout_s=120                     command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu3"] timeout_s=600                     command: bash bench/gpu/suite.sh --stash
#   run carry=[".gpu4"] timeout_s=600                     command: bash bench/gpu/tune_70b.sh tp2
#   run timeout_s=300                                     command: python3 bench/gpu/tune_compare.py /tmp/vstack-gpu-tune 2>&1 | tee $OUT/compare.md
#   Issue 57 on four (eight) GPUs: the same three stash calls with kind=nvidia-h200-x4 (-x8), then
#   run carry=[".gpu4"] timeout_s=600 command: bash bench/gpu/suite.sh --stash && bash bench/gpu/suite.sh --only a100x8
#   run timeout_s=600                 command: bash bench/gpu/tune_70b.sh tp4   (tp8; repeat the call to resume)
# A cold machine between calls: put the last tune-state.json at bench/gpu/state/tune-70b-VARIANT/ to resume.
# Env: TUNE_BUDGET_S (470), TUNE_MAX_CANDIDATES (2).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tune_env.sh"
case "${1:-fp8}" in
  fp8) target=h200-llama-3.3-70b-fp8 ;;
  tp2|tp4|tp8) target=a100x8-llama-3.3-70b ;;
  *) echo "usage: $0 fp8|tp2|tp4|tp8"; exit 2 ;;
esac
name=tune-70b-${1:-fp8}
dir=$work/$name
shift || true
seed_state "$name" "$dir"
overlay=$(python3 -m bench.gpu.tune_setup "$target" "$work/setup-70b-${name#tune-70b-}") || exit 2
started=$(date +%s)
timeout $(( ${TUNE_BUDGET_S:-470} + 60 )) python3 -m stack.entrypoints.cli --config "$overlay" tune "$target" \
  --scenario gpu-70b-goodput --max-candidates "${TUNE_MAX_CANDIDATES:-2}" --time-budget "${TUNE_BUDGET_S:-470}" \
  --out "$dir" "$@" 2>&1 | tee -a "$out/$name.log"
code=${PIPESTATUS[0]}
echo "call wall time: $(( $(date +%s) - started )) s, exit $code" | tee -a "$out/$name.log"
collect "$name" "$dir"
exit "$code"
