#!/usr/bin/env bash
# `vstack tune` for the 8B case on the lent GPU machine; see ../shared/gpu/README.md for the carried parts.
# Runs from the repository root there; writes tune8b.tgz, tune.md, tune.json and the profile to $OUT.
set -uo pipefail
[ -d /tmp/site/vllm ] || { mkdir -p /tmp/site && cat /tmp/chunks/part.* | xz -dc -T16 | tar -C /tmp/site -xf -; }
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
[ -f /tmp/models/llama8b/config.json ] || python3 "${MAKE_MODEL:-.tunegpu/make_model.py}" /tmp/models/llama8b llama8b
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
out=${TUNE_OUT:-/tmp/tune8b}
timeout "${TUNE_LIMIT_S:-510}" python3 -m stack.entrypoints.bench --config loadtests/gpu/llama8b-dummy.yaml tune llama8b-dummy \
  --scenario gpu-8b-1024-128 --grid loadtests/gpu/grid-8b.yaml --out "$out" --stop-on-error "$@"
status=$?
cat "$out/tune.md" 2>/dev/null
tar czf "$OUT/tune8b.tgz" -C "$(dirname "$out")" "$(basename "$out")"
cp "$out"/tune.md "$out"/tune.json "$out"/tuned-profile.yaml "$OUT/" 2>/dev/null
exit $status
