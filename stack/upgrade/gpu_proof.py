"""A GPU pin needs a GPU proof (issue 56, adr/0046): the versions of vLLM the GPU suite ran on a real GPU.

A proof is a run of the GPU suite (bench/gpu/suite.sh) committed under `bench/results/<run>/`, its manifest naming
a GPU device and the vLLM it ran on (`versions.vllm`: "vllm 0.26.0"). `vstack upgrade pin` refuses a GPU pin that
no such run proves, `--force` included, and the test suite checks that the pinned GPU version is the newest one
proven: a GPU user installs the vLLM whose figures the README shows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

# The GPU suite's runs: their folder names say so (bench/harness/results: <date>-<device>-gpu-suite[-...]).
SUITE_RUN = re.compile(r"^\d{4}-\d{2}-\d{2}-(?P<device>[a-z0-9]+(?:-x\d+)?)-gpu-suite(?:-[a-z0-9-]+)?$")
GPU_DEVICE = re.compile(r"^(h100|h200|a100|l40s|l4|rtx\d+|b200|gh200)", re.I)
VLLM_VERSION = re.compile(r"^vllm (?P<version>\d+\.\d+\.\d+)$")


@dataclass(frozen=True)
class Proof:
    version: str
    run: str  # bench/results/<run>
    device: str


def proofs(results: Path) -> list[Proof]:
    """Every GPU suite run under `results` with the vLLM version it ran on, oldest first."""
    found = []
    for manifest in sorted(results.glob("*/manifest.json")):
        m = SUITE_RUN.match(manifest.parent.name)
        if m is None:
            continue
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue  # a broken manifest proves nothing (tests/bench checks every manifest's shape)
        device = str(data.get("device", m["device"]))
        version = VLLM_VERSION.match(str((data.get("versions") or {}).get("vllm", "")))
        if GPU_DEVICE.match(device) and version:
            found.append(Proof(version["version"], manifest.parent.name, device))
    return found


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def newest(results: Path) -> Proof | None:
    """The proof of the newest vLLM the GPU suite ran on (the latest run of it)."""
    found = proofs(results)
    return max(found, key=lambda p: (_key(p.version), p.run)) if found else None


def of_version(results: Path, version: str) -> list[Proof]:
    return [p for p in proofs(results) if p.version == version]
