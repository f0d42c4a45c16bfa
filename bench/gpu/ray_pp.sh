#!/usr/bin/env bash
# Pipeline parallel 2 across two Ray nodes (one GPU each) through the gateway, on the lent nvidia-h200-x2.
# Run from the repository root. The site parts (bench/gpu/build_site.sh: .gpu1/ .gpu2/ ...) and the Ray part
# (bench/gpu/build_ray_part.sh: .gpuray/) are carried one per device call, back to back (the machine stays
# warm ~30 s between calls), each call stashing its part in /tmp; the last call runs the benchmark:
#
#   (here first: bash bench/gpu/build_site.sh; bash bench/gpu/build_ray_part.sh   -> .gpu1 ... .gpu4 .gpuray)
#   run(kind="nvidia-h200-x2", carry=[".gpu1"],   command="bash bench/gpu/ray_pp.sh --stash", timeout_s=300)
#   run(kind="nvidia-h200-x2", carry=[".gpu2"],   command="bash bench/gpu/ray_pp.sh --stash", timeout_s=300)
#   run(kind="nvidia-h200-x2", carry=[".gpu3"],   command="bash bench/gpu/ray_pp.sh --stash", timeout_s=300)
#   run(kind="nvidia-h200-x2", carry=[".gpuray"], command="bash bench/gpu/ray_pp.sh", timeout_s=600)
#
# Five calls: the site's four parts (48 MiB at most) and Ray's one (29.7 MB). About 10 minutes of device time.
# (README "More than one machine" lists the exact calls.) Results: $OUT/ray-pp-h200x2.json, ray_pp.log and
# the engine's logs.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/site.sh"
if [ "${1:-}" = "--stash" ]; then ls -la "$parts"; exit 0; fi
unpack_site
if [ ! -d "$site/ray" ]; then
  [ -e "$parts/part.ray.00" ] || { echo "no Ray part in $parts: carry .gpuray/ (bench/gpu/build_ray_part.sh)"; exit 2; }
  xz -dc -T16 "$parts/part.ray.00" | tar -C "$site" -xf - || { echo "the Ray part does not unpack"; exit 2; }
fi
export RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=0
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv | tee "$out/ray_pp.log"
python3 -c "import ray, vllm; print('ray', ray.__version__, 'vllm', vllm.__version__)" 2>&1 | tee -a "$out/ray_pp.log"
timeout 560 python3 -m bench.gpu.ray_pp --out "$out/ray-pp-h200x2.json" 2>&1 | tee -a "$out/ray_pp.log"
code=${PIPESTATUS[0]}
tar -C /tmp/ray -cJf "$out/ray-session-logs.tar.xz" session_latest/logs 2>/dev/null
exit "$code"
