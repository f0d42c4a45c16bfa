#!/usr/bin/env bash
# `vstack upgrade check` on the lent GPU at the vLLM pyproject.toml's `gpu` extra pins (issue 56): the site's
# python3 (bench/gpu/site.sh: vLLM 0.26.0 unpacked into /tmp/vstack-site) is both the pinned side and the
# candidate (a Python that already has the version is taken as it is: no venv, no registry). Per profile, under
# the GPU suite's overlay (dummy weights of the real shape; an 80 GB card held to its bytes): the options and
# patch triage, both engines started with the rendered options, the 8 fixed prompts at temperature 0 compared
# exactly (no rate search), every runtime patch's outcome in each engine process, and the gate's verdict.
# bench/gpu/upgrade_check.py does the work; `python -m bench.gpu.upgrade_check plan` prints its commands anywhere.
#
# Build the parts here first (no device time): bash bench/gpu/build_site.sh (writes .gpu1/ ... .gpu4/). Then,
# back to back (the machine stays warm ~30 s after a call; what is stashed in /tmp lives while it is warm):
#
#   run kind=nvidia-h200 carry=[".gpu1"] command="bash bench/gpu/suite.sh --stash"
#   run                  carry=[".gpu2"] command="bash bench/gpu/suite.sh --stash"
#   run                  carry=[".gpu3"] command="bash bench/gpu/suite.sh --stash"
#   run                  carry=[".gpu4"] command="bash bench/gpu/suite.sh --stash"
#   run timeout_s=580    command="bash bench/gpu/upgrade_check.sh"
#   run timeout_s=580    command="bash bench/gpu/upgrade_check.sh"      (the same again: the profiles left)
#
# A call runs the profiles in order (h200-llama-3.3-70b-fp8, a100-80gb-llama-3.1-8b, h100-80gb-qwen2.5-32b-awq;
# or those named) while each one's estimate fits in what is left of ~560 s, and stops a check still running at
# that mark (SIGTERM: its engines are stopped). Expected: ~35 s to unpack and import-check the site, then ~360 s
# for the 70B, ~245 s for the 8B, ~255 s for the 32B AWQ (each: a first start with compiling, a repeat start
# from the compile cache, ~40 s of vLLM imports). So the first call ends after the 70B (~400 s) and the second
# (~510 s) checks the other two; the checks done are kept on the warm machine (resume), and its summary holds
# all three. Repeat the call until summary.md says every profile was checked.
#
# Everything lands in $OUT as it happens: upgrade-check.log (this call), summary.json/.md (the verdict per
# profile, each runtime patch's outcome per side), checks/<profile>/ (the gate's upgrade-check.json/.md, the
# engines' logs, the check's own output check.log). Adopt the last call's $OUT (its summary and checks/ hold every
# profile's, earlier calls' included):
#
#   python -m bench.harness.results adopt OUT/summary.json OUT/summary.md OUT/checks OUT/upgrade-check.log \
#     --name gpu-upgrade-check --device h200 --vllm "vllm 0.26.0" --date YYYY-MM-DDTHH:MM \
#     --command "bash bench/gpu/upgrade_check.sh (site stashed first, as in its header), kind nvidia-h200" \
#     --summary "vstack upgrade check 0.26.0 -> 0.26.0 on an H200: ..."
#   python -m bench.gpu.upgrade_check record bench/results/<date>-h200-gpu-upgrade-check
#                                       (each check's record into patches/ledger.yaml's upgrades:, report path in)
#
# The run folder is not a GPU proof (stack/upgrade/gpu_proof.py counts only *-gpu-suite* runs): the proof of
# 0.26.0 is the suite's own runs; this is the gate's check at the version they proved.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
if [ "${1:-}" = "--stash" ]; then ls -la "$parts"; exit 0; fi
unpack_site
log_device "$out/upgrade-check.log"
work=${VSTACK_GPU_WORK:-/tmp/vstack-upgrade-check}
mkdir -p "$work"
budget=${VSTACK_CHECK_BUDGET:-$(( 560 - SECONDS ))}
python3 -m bench.gpu.upgrade_check run --work "$work" --out "$out" --budget "$budget" "$@" 2>&1 \
  | tee -a "$out/upgrade-check.log"
exit "${PIPESTATUS[0]}"
