#!/usr/bin/env bash
# Ray for the lent GPU machines, as one extra part next to the site bench/gpu/build_site.sh builds (Python 3.12,
# no registry there, 64 MiB per device call). The image already has Ray's own dependencies (click, filelock,
# msgpack, protobuf, pyyaml, requests, grpcio, aiohttp; /work/.library/device/KINDS.md), so only the wheel is
# baked, without what `ray start` and vLLM's Ray executor never import: the Java jars, RLlib, Data, Tune, Train,
# Serve and Ray's LLM library (201 MiB unpacked -> ~150 MiB; xz: one part).
#
#   bash bench/gpu/build_ray_part.sh        (from anywhere in the repo; about 3 minutes on 2 cores)
#
# Writes .gpuray/part.ray.00 (ignored through .git/info/exclude). bench/gpu/ray_pp.sh unpacks it into the site.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
work=${GPU_RAY_WORK:-/tmp/vstack-gpu-ray}
rm -rf "$work" && mkdir -p "$work/whl" "$work/site"
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$work/whl" "ray==2.60.0" 2>&1 \
  | grep -v -E "^WARNING: Location" || true
# Unzipped with each file's mode: the raylet and GCS binaries must stay executable.
python3 - "$work"/whl/ray-*.whl "$work/site" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        if info.external_attr >> 16:
            os.chmod(path, (info.external_attr >> 16) & 0o7777)
PY
rm -rf "$work"/site/ray/{jars,rllib,data,tune,train,serve,llm}
tar -C "$work/site" -cf - . | xz -T2 -6 > "$work/ray.tar.xz"
size=$(stat -c %s "$work/ray.tar.xz")
[ "$size" -lt $((60 * 1024 * 1024)) ] || { echo "ray part is $size bytes: over one call's 60 MiB" >&2; exit 1; }
exclude=$(git rev-parse --path-format=absolute --git-path info/exclude)  # a worktree's .git is a file
rm -rf "$root/.gpuray" && mkdir -p "$root/.gpuray" "$(dirname "$exclude")"
cp "$work/ray.tar.xz" "$root/.gpuray/part.ray.00"
grep -qx "/.gpuray/" "$exclude" 2>/dev/null || echo "/.gpuray/" >> "$exclude"
ls -la "$root/.gpuray/"
