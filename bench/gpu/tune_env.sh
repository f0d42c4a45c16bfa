# Sourced by bench/gpu/tune_*.sh on the lent GPU machine: the site built by bench/gpu/build_site.sh unpacked
# once (parts stashed by `bash bench/gpu/suite.sh --stash` calls, or carried with this call), the env the
# suite runs under, $OUT, and the work folder that outlives the checkout's resync between warm calls.
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
work=${VSTACK_GPU_WORK:-/tmp/vstack-gpu-tune}
mkdir -p "$work"
unpack_site
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
