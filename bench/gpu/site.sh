# Sourced by every script that runs on the lent GPU machine (suite.sh, switch_time.sh, tune_env.sh, ray_pp.sh):
# the repository root, $parts/$site/$out, the parts carried with this call kept in $parts for later calls
# (.gpuN/ the site built by bench/gpu/build_site.sh, .gpuray/ Ray's part, .gpunixl/ NIXL's part
# (bench/gpu/build_nixl_part.sh), .gpuwN/ the real weights), `unpack_site`, and the env they
# all run vLLM under. A machine stays warm ~30 s after a call; what is in /tmp outlives the checkout's resync.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
parts=${VSTACK_GPU_PARTS:-/tmp/vstack-parts}
site=${VSTACK_GPU_SITE:-/tmp/vstack-site}
out=${OUT:-$root/bench/out}  # not in bench/results: a run folder there needs its manifest
mkdir -p "$parts" "$out"
for p in "$root"/.gpu[0-9]/part.* "$root"/.gpuray/part.* "$root"/.gpunixl/part.* "$root"/.gpuw[0-9]/part.*; do
  [ -e "$p" ] && cp "$p" "$parts/"
done

# The site's own parts are part.NN: Ray's (part.ray.NN) are unpacked by ray_pp.sh, never into this stream.
unpack_site() {
  [ -d "$site/vllm" ] && { register_patches; unpack_nixl; return 0; }
  ls "$parts"/part.[0-9]* >/dev/null 2>&1 \
    || { echo "no site parts in $parts: carry every .gpuN/ that build_site.sh wrote first (README GPU suite)"; exit 2; }
  # Unpacked beside it and moved in whole: a call cut short (a part missing) leaves no half site behind that
  # the next call would take for a whole one.
  rm -rf "$site.partial" && mkdir -p "$site.partial"
  cat $(ls "$parts"/part.[0-9]* | sort) | xz -dc -T16 | tar -C "$site.partial" -xf - \
    || { rm -rf "$site.partial"; echo "the site parts do not unpack: are all of them stashed?"; exit 2; }
  rm -rf "$site" && mv "$site.partial" "$site"
  register_patches
  install_site
  unpack_nixl
}

# NIXL (vLLM's NixlConnector; bench/gpu/build_nixl_part.sh), into the site when its part was carried or stashed:
# `import nixl` then finds it as pip would have installed it. Without the part, nothing changes.
unpack_nixl() {
  [ -d "$site/nixl_cu13" ] && return 0
  [ -e "$parts/part.nixl.00" ] || return 0
  xz -dc -T16 "$parts/part.nixl.00" | tar -C "$site" -xf - || { echo "the NIXL part does not unpack"; exit 2; }
  echo "NIXL unpacked into the site ($(ls -d "$site"/nixl_cu13-*.dist-info 2>/dev/null | xargs -n1 basename))" \
    | tee -a "$out/site-install.txt"
}

# What `pip install` does after unpacking: byte-compile (the parts carry no .pyc; without this the first vLLM
# process on a fresh machine compiles its imports, ~35 s of the first engine's start on the H200), then an
# import check that names a broken site before any engine does. Both timed in $out/site-install.txt.
install_site() {
  local t0=$SECONDS
  python3 -m compileall -q -j 0 "$site" >/dev/null 2>&1
  echo "byte-compiled the site in $(( SECONDS - t0 )) s" | tee -a "$out/site-install.txt"
  t0=$SECONDS
  if ! python3 -c "import vllm, vllm.entrypoints.openai.api_server" > "$out/site-import.log" 2>&1; then
    echo "the site does not import vLLM ($(tail -1 "$out/site-import.log")): rebuild it with bench/gpu/build_site.sh"
    rm -rf "$site"  # the next call unpacks again instead of running on a broken site
    exit 2
  fi
  echo "import check (vllm and its API server) in $(( SECONDS - t0 )) s" | tee -a "$out/site-install.txt"
}

# The project runs from the checkout (PYTHONPATH), not installed, so vLLM would not find its
# `vllm.general_plugins` entry point (the ledger's runtime patches): declared here from pyproject.toml, as
# `pip install` would. VSTACK_RUNTIME_PATCHES=0 still turns them off per process.
register_patches() {
  local info="$site/vllm_stack_checkout-0.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: vllm-stack-checkout\nVersion: 0\n' > "$info/METADATA"
  python3 - "$root/pyproject.toml" > "$info/entry_points.txt" <<'PY'
import sys, tomllib
eps = tomllib.load(open(sys.argv[1], "rb"))["project"]["entry-points"]["vllm.general_plugins"]
print("[vllm.general_plugins]", *(f"{k} = {v}" for k, v in eps.items()), sep="\n")
PY
}

# The first lines of a run's log (FILE): the GPU, its driver, and the vLLM the run uses.
log_device() {
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$1"
  python3 -c "import vllm; print('vllm', vllm.__version__)" | tee -a "$1"
}

# A model folder of a real model's shape for `--load-format dummy` (bench.harness.dummy_models): FOLDER FIXTURE
# (a stack/planner/known_configs name, e.g. meta-llama--Llama-3.1-8B-Instruct); prints the folder.
dummy_model() {
  python3 -c "import sys; from pathlib import Path; from bench.harness.dummy_models import fixture_config, write_model
print(write_model(Path(sys.argv[1]), fixture_config(sys.argv[2])))" "$1" "$2"
}

export PYTHONPATH="$site:$root" VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
  LITELLM_LOCAL_MODEL_COST_MAP=True
