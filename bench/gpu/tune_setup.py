"""Dummy-weight model folder and config overlay for `vstack tune` on the lent GPU (bench/gpu/tune_*.sh).

    python3 -m bench.gpu.tune_setup TARGET WORK [KEY=VALUE ...]    prints the overlay's path

TARGET is a profile (h200-llama-3.3-70b-fp8, a100x8-llama-3.3-70b) or a model served on the hardware
profile this GPU matches (llama-3.1-8b-instruct). The overlay is the suite's own (bench/gpu/profiles.py
`prepare`: `load_format: dummy`, the model's real config.json, a profile for another card held to it, an
8-GPU profile at tensor parallel = the GPUs here); KEY=VALUE adds engine options (YAML values).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    from bench.gpu.device import detect
    from bench.gpu.profiles import prepare
    from stack.config import load_config

    target, work = argv[0], Path(argv[1])
    engine = {}
    for item in argv[2:]:
        key, _, value = item.partition("=")
        engine[key] = yaml.safe_load(value)
    work.mkdir(parents=True, exist_ok=True)
    run = prepare(load_config(), target, detect(), work, engine=engine or None)
    if run.held_to:
        print(f"held to: {run.held_to}", file=sys.stderr)
    print(run.overlay)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
