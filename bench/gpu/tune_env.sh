# Sourced by bench/gpu/tune_*.sh on the lent GPU machine: the site built by bench/gpu/build_site.sh unpacked
# once (parts stashed by `bash bench/gpu/suite.sh --stash` calls, or carried with this call), the env the
# suite runs under, $OUT, and the work folder that outlives the checkout's resync between warm calls.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
parts=${VSTACK_GPU_PARTS:-/tmp/vstack-parts}
site=${VSTACK_GPU_SITE:-/tmp/vstack-site}
out=${OUT:-$root/bench/results/out}
work=${VSTACK_GPU_WORK:-/tmp/vstack-gpu-tune}
mkdir -p "$parts" "$out" "$work"
for p in "$root"/.gpu[0-9]/part.*; do [ -e "$p" ] && cp "$p" "$parts/"; done
if [ ! -d "$site/vllm" ]; then
  mkdir -p "$site"
  ls "$parts"/part.* >/dev/null 2>&1 || { echo "no site parts in $parts: carry .gpu1/ .gpu2/ .gpu3/ first (README GPU suite)"; exit 2; }
  cat $(ls "$parts"/part.* | sort) | xz -dc -T16 | tar -C "$site" -xf - || { echo "the site parts do not unpack: are all of them stashed?"; exit 2; }
fi
export PYTHONPATH="$site:$root" VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
  LITELLM_LOCAL_MODEL_COST_MAP=True
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader | tee -a "$out/gpu.txt"

# A tune state carried back from an earlier call whose machine went cold: bench/gpu/state/NAME/tune-state.json
# (an untracked file travels with the working tree). A warm machine still has its own in $work.
seed_state() {  # NAME DIR
  if [ ! -f "$2/tune-state.json" ] && [ -f "$root/bench/gpu/state/$1/tune-state.json" ]; then
    mkdir -p "$2" && cp "$root/bench/gpu/state/$1/tune-state.json" "$2/" && echo "resuming from bench/gpu/state/$1"
  fi
}

# Everything the lead needs back, whatever happened: the tune's files, logs packed.
collect() {  # NAME DIR
  mkdir -p "$out/$1"
  cp "$2"/tune.md "$2"/tune.json "$2"/tune-state.json "$2"/tuned-profile.yaml "$2"/goodput_curves.png "$out/$1/" 2>/dev/null
  tar -C "$2" -cJf "$out/$1/logs.tar.xz" logs bench 2>/dev/null
  ls -la "$out/$1"
}
