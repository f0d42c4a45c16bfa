#!/usr/bin/env bash
# Builds the Python site the GPU suite runs on, for the lent H100/H200 machines: Python 3.12 with torch
# 2.11.0+cu130 already installed and no package registry. It bakes vLLM 0.26.0 (the newest release built for
# torch 2.11.0) and every package `vstack up` imports there that the image lacks (the gateway: LiteLLM and its
# needs, FastAPI/uvicorn, orjson, pydantic-settings; the engine: compressed-tensors needs loguru), then splits
# the archive into parts that fit one device call each (64 MiB per call, the working tree included).
#
#   bash bench/gpu/build_site.sh            (from anywhere in the repo; about 5 minutes on 2 cores)
#
# Writes .gpu1/ .gpu2/ ... (one part each), ignored through .git/info/exclude. README "GPU suite" says how
# they are carried. The image already has torch, transformers, tokenizers, huggingface_hub, httpx, aiohttp,
# prometheus-client, nvidia-ml-py, psutil, pyyaml, typer, rich, jinja2, click, tiktoken, uvloop, numpy
# (/work/.library/device/KINDS.md lists them): those are not baked.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
work=${GPU_SITE_WORK:-/tmp/vstack-gpu-site}
part_mb=${GPU_SITE_PART_MB:-48}  # 64 MiB a call less the working tree (~8 MB of files, counted by the block: ~11)
rm -rf "$work" && mkdir -p "$work/whl" "$work/site"
plat="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none"
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_26_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 \
         manylinux_2_35_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64 any; do plat="$plat --platform $p"; done
# What `vllm serve` 0.26.0 imports on a CUDA machine and the image lacks (flashinfer is left out: the suite
# sets VLLM_USE_FLASHINFER_SAMPLER=0; apache-tvm-ffi is newer than vLLM's pin because xgrammar 0.2.8 needs it).
engine=(vllm==0.26.0 cachetools blake3 fastapi==0.136.3 starlette==1.10.0 openai==2.30.0 pydantic==2.12.5
  pydantic-core==2.41.5 annotated-types typing-inspection prometheus-fastapi-instrumentator==8.1.0
  lm-format-enforcer==0.11.3 interegular llguidance==1.7.6 outlines_core==0.2.14 diskcache==5.6.3 lark==1.2.2
  xgrammar==0.2.8 partial-json-parser jsonschema jsonschema-specifications referencing rpds-py pyzmq msgspec
  mistral_common==1.11.6 pycountry pydantic-extra-types compressed-tensors==0.17.0 depyf==0.20.0 astor dill
  watchfiles python-json-logger pybase64 cbor2 ijson setproctitle openai-harmony uvicorn==0.35.0 sse-starlette
  distro jiter sniffio nvtx==0.2.15 python-multipart httptools model-hosting-container-standards==0.1.16
  anthropic==0.71.0 docstring-parser jmespath supervisor python-dotenv apache-tvm-ffi==0.1.15.post2 loguru)
# What the project imports (pyproject's dependencies and the gateway extra) that neither vLLM nor the image has.
project=(pydantic-settings==2.16.3 unidiff==0.7.5 orjson==3.11.3 litellm==1.106.2 fastuuid==0.14.0
  importlib-metadata==8.7.0 h2 hpack hyperframe)
for p in "${engine[@]}" "${project[@]}" "$@"; do
  pip download -q --no-deps $plat -d "$work/whl" "$p" 2>&1 | grep -v -E "^WARNING: Location" || true
done
for w in "$work"/whl/*.whl; do
  python3 -c "import sys,zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$work/site"
done
# Not needed on Hopper (FlashAttention 3 runs there) or on Python 3.12: keeps the parts few.
rm -rf "$work"/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$work"/site/vllm/vllm-rs \
      "$work"/site/vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so
ls "$work/whl" > "$work/site/VSTACK_SITE_WHEELS.txt"
tar -C "$work/site" -cf - . | xz -T2 -6 > "$work/site.tar.xz"
(cd "$work" && split -b "${part_mb}M" -d site.tar.xz part.)
rm -rf "$root"/.gpu[0-9]
mkdir -p "$root/.git/info"
i=1
for part in "$work"/part.*; do
  mkdir -p "$root/.gpu$i" && mv "$part" "$root/.gpu$i/"
  grep -qx "/.gpu$i/" "$root/.git/info/exclude" 2>/dev/null || echo "/.gpu$i/" >> "$root/.git/info/exclude"
  i=$((i+1))
done
ls -la "$root"/.gpu[0-9]/
