# The gateway: the one public port (OpenAI-compatible API, admin API, /metrics). No vLLM, no torch.
#   docker build -f docker/gateway.Dockerfile -t vllm-stack/gateway .        (from the repository root)
# BASE_IMAGE: any Debian-like image with python3 >= 3.11 and its venv module.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    VSTACK_CONFIG_DIR=/etc/vstack/configs \
    HOME=/home/vstack

WORKDIR /opt/vstack
SHELL ["/bin/sh", "-eu", "-c"]

# Dependencies first, read from pyproject.toml alone, so that editing stack/ rebuilds only the last layers.
# pip's download cache is shared with the engine images' builds.
COPY pyproject.toml docker/pyproject_tool.py ./
# hadolint ignore=DL3013
RUN --mount=type=cache,id=vstack-pip,target=/root/.cache/pip \
    python3 -m venv /opt/venv \
    && python3 pyproject_tool.py requirements gateway > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "docker>=7,<8" \
    && rm /tmp/requirements.txt

COPY README.md ./
COPY stack ./stack
RUN python3 pyproject_tool.py force-include-dirs \
    && pip install --no-cache-dir --no-deps -e . \
    && useradd --create-home --uid 10001 --user-group vstack

USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys,urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]
# Configuration comes from a mounted configs/ (VSTACK_CONFIG_DIR) and the environment, never the image.
CMD ["python", "-m", "stack.entrypoints.gateway", "--host", "0.0.0.0", "--port", "8000", "--config", "/etc/vstack/configs/stack.yaml"]
