#!/usr/bin/env bash
# bench/switch_time.py on the lent GPU machine (../shared/gpu/README.md): vLLM 0.26.0 site carried in parts,
# dummy-weight Llama-3.1-8B (A) and Llama-3.2-3B (B) shapes. Run from the repository root there:
#   bash bench/gpu_switch_time.sh   (.gpu1-3 parts copied to /tmp/chunks; .gpux carried: wheels + make_model.py)
set -euo pipefail
[ -d /tmp/site/vllm ] || { mkdir -p /tmp/site && cat /tmp/chunks/part.* | xz -dc -T16 | tar -C /tmp/site -xf -; }
mkdir -p /tmp/extra && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/extra .gpux/*.whl 2>&1 | tail -1 || true
export PYTHONPATH=/tmp/site:/tmp/extra:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 .gpux/make_model.py /tmp/m8 llama8b
python3 .gpux/make_model.py /tmp/m3 llama3b
out=${OUT:-/tmp/out}
python3 bench/switch_time.py --gpu --through manager --model-a /tmp/m8 --model-b /tmp/m3 --repeat 2 \
  --launcher "python3 -m vllm.entrypoints.cli.main" --logs "$out/logs" \
  --env VLLM_USE_FLASHINFER_SAMPLER=0 --env HF_HUB_OFFLINE=1 \
  --engine-args "--load-format dummy --enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.8" \
  --out "$out/switch_time_gpu.json"
