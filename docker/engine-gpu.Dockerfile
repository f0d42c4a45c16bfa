# A vLLM engine for NVIDIA GPUs: the official vLLM image pinned to our version, our patches applied.
#   docker build -f docker/engine-gpu.Dockerfile -t vllm-stack/engine-gpu .   (from the repository root)
# BASE_IMAGE: the vLLM OpenAI-server image of the version patches/ledger.yaml targets for GPUs.
ARG BASE_IMAGE=vllm/vllm-openai:v0.26.0
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    VSTACK_CONFIG_DIR=/etc/vstack/configs \
    VSTACK_CACHE_DIR=/cache \
    VSTACK_STATE_DIR=/cache/state \
    HF_HOME=/cache/huggingface \
    VLLM_CACHE_ROOT=/cache/vllm \
    HOME=/home/vstack

WORKDIR /opt/vstack
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]

# Our dependencies next to the image's vLLM and torch, which stay exactly as shipped (a constraints file
# holds them); read from pyproject.toml alone, so that editing stack/ keeps this layer.
COPY pyproject.toml docker/pyproject_tool.py ./
# hadolint ignore=DL3013
RUN --mount=type=cache,id=vstack-pip,target=/root/.cache/pip \
    python3 -m pip freeze | grep -iE '^(vllm|torch|transformers|triton)==' > /tmp/keep.txt \
    && python3 pyproject_tool.py requirements gateway > /tmp/requirements.txt \
    && python3 -m pip install -c /tmp/keep.txt -r /tmp/requirements.txt "docker>=7,<8" \
    && rm /tmp/keep.txt /tmp/requirements.txt

# The system packages before the code: a code change rebuilds neither them nor the layers above (adr/0038).
# git applies the ledger's diffs below and is removed after.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group vstack \
    && mkdir -p /cache /etc/vstack/configs && chown 10001:10001 /cache

COPY README.md ./
COPY patches ./patches
COPY stack ./stack
RUN python3 pyproject_tool.py force-include-dirs \
    && python3 -m pip install --no-cache-dir --no-deps -e . \
    && vstack patches apply && vstack patches verify \
    && apt-get purge -y git && apt-get autoremove -y

USER 10001:10001
VOLUME ["/cache"]
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --start-period=900s --retries=3 \
    CMD ["python3", "-c", "import sys,urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]
# The base image's entrypoint is `vllm serve`; ours plans from configs/ first (stack/engine/docker_runtime.py).
ENTRYPOINT []
CMD ["python3", "-m", "stack.entrypoints.engine_container", "serve"]
