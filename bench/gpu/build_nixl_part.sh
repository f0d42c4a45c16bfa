#!/usr/bin/env bash
# NIXL for the lent GPU machines (vLLM's NixlConnector, prefill/decode disaggregation, adr/0052), as one extra part
# next to the site bench/gpu/build_site.sh builds (Python 3.12, torch 2.11.0+cu130, no registry there, 64 MiB per
# device call). NIXL ships as `nixl` (a small meta package: `import nixl` picks nixl_cu13 or nixl_cu12 by the CUDA
# torch was built for; cu13 there) and `nixl-cu13` (the bindings, UCX, and plugins). Baked from both wheels at one
# version, without what a CUDA NixlConnector run never imports or loads:
#   - nixl_ep / nixl_ep_cu13: NIXL's expert-parallel torch extensions (~94 MB of .so for three torch versions);
#   - the storage plugins (AZURE_BLOB, OBJ = S3, GDS/GDS_MT = GPUDirect Storage, GUSLI, INFINIA), GPUNETIO (DOCA),
#     LIBFABRIC (EFA), the DOCA telemetry exporter, UCX's perftest libraries: vLLM's connector registers the
#     UCX backend only (kv_connector_extra_config `backends`, default ["UCX"]);
#   - the bundled libraries that only those plugins need (read from each kept library's NEEDED entries, so nothing
#     a kept one links is dropped; libnuma is kept whatever they say: UCX may load it at run time).
#
#   bash bench/gpu/build_nixl_part.sh        (from anywhere in the repo; under a minute; NIXL_VERSION=1.5.1)
#
# Writes .gpunixl/part.nixl.00 (~13 MB; ignored through .git/info/exclude). bench/gpu/site.sh copies it into the
# machine's parts folder and unpacks it into the site (`unpack_nixl`); bench/gpu/disaggregation.sh uses it.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
version=${NIXL_VERSION:-1.5.1}
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=/work/main/.venv/bin/python
[ -x "$python" ] || python=python3
work=${GPU_NIXL_WORK:-/tmp/vstack-gpu-nixl}
rm -rf "$work" && mkdir -p "$work/whl" "$work/site"
"$python" -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64 \
  -d "$work/whl" "nixl==$version" "nixl-cu13==$version" 2>&1 | grep -v -E "^WARNING: Location" || true
ls "$work"/whl/nixl_cu13-*.whl "$work"/whl/nixl-*.whl >/dev/null \
  || { echo "nixl and nixl-cu13 $version were not downloaded (pip download above)" >&2; exit 1; }
# Unzipped with each file's mode (the UCX and NIXL tools keep their executable bit).
"$python" - "$work/site" "$work"/whl/*.whl <<'PY'
import os, sys, zipfile
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            path = z.extract(info, sys.argv[1])
            if info.external_attr >> 16:
                os.chmod(path, (info.external_attr >> 16) & 0o7777)
PY
cd "$work/site"
rm -rf nixl_ep nixl_ep_cu13 nixl_cu13.libs/ucx/libucx_perftest*
for dir in .nixl_cu13.mesonpy.libs/plugins nixl_cu13.libs/nixl; do
  for p in AZURE_BLOB OBJ GDS GDS_MT GPUNETIO GUSLI INFINIA LIBFABRIC; do rm -f "$dir/libplugin_$p.so"; done
  rm -f "$dir/libtelemetry_exporter_doca.so"
done
if command -v readelf >/dev/null; then
  "$python" - <<'PY'
import glob, os, re, subprocess
libs = {os.path.basename(f): f for f in glob.glob("nixl_cu13.libs/*") if os.path.isfile(f)}
roots = [f for f in glob.glob("**/*.so*", recursive=True) if os.path.dirname(f) != "nixl_cu13.libs"]
roots += glob.glob(".nixl_cu13.mesonpy.libs/**/*.so*", recursive=True)
needed, todo = set(), list(roots)
while todo:
    out = subprocess.run(["readelf", "-d", todo.pop()], capture_output=True, text=True).stdout
    for name in re.findall(r"Shared library: \[(.+?)\]", out):
        if name in libs and name not in needed:
            needed.add(name)
            todo.append(libs[name])
gone = sorted(n for n in libs if n not in needed and not n.startswith("libnuma"))
print(f"dropped {len(gone)} libraries only the dropped plugins need "
      f"({sum(os.path.getsize(libs[n]) for n in gone) / 2**20:.1f} MiB): {', '.join(gone)}")
for name in gone:
    os.remove(libs[name])
PY
else
  echo "no readelf here: the bundled libraries are all kept (the part is larger, not broken)"
fi
cd "$work"
tar -C "$work/site" -cf - . | xz -T2 -6 > "$work/nixl.tar.xz"
size=$(stat -c %s "$work/nixl.tar.xz")
[ "$size" -lt $((60 * 1024 * 1024)) ] || { echo "nixl part is $size bytes: over one call's 60 MiB" >&2; exit 1; }
exclude=$(git -C "$root" rev-parse --path-format=absolute --git-path info/exclude)  # a worktree's .git is a file
rm -rf "$root/.gpunixl" && mkdir -p "$root/.gpunixl" "$(dirname "$exclude")"
cp "$work/nixl.tar.xz" "$root/.gpunixl/part.nixl.00"
grep -qx "/.gpunixl/" "$exclude" 2>/dev/null || echo "/.gpunixl/" >> "$exclude"
ls -la "$root/.gpunixl/"
