"""The caching allocator's blocks for vLLM's weight tensors, against PyTorch's rules and the GPU's figures.

The GPU figures are those bench/gpu/weights_probe.sh recorded on an H200 (vLLM 0.26.0): every parameter's
bytes and the allocator block it sits in, read from torch.cuda.memory_snapshot() after vLLM loaded it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.harness.dummy_models import fixture_config
from stack.planner.allocator import MIB, block_bytes, rounding_bytes
from stack.planner.model_meta import parse_config
from stack.planner.weight_tensors import weight_tensor_sizes
from stack.planner.weights import weights_from_config

GIB = 1024**3
PROBE = Path(__file__).parents[2] / "bench/results/2026-11-23-h200-weights-probe/weights_probe.jsonl"


def probe_rows() -> dict[str, dict]:
    return {row["fixture"]: row for row in map(json.loads, PROBE.read_text().splitlines())}


@pytest.mark.parametrize(("size", "held"), [
    (4096, 4096),                            # small pool: 512-byte steps only
    (1000, 1024),
    (4423680, 4423680),                      # 1-10 MiB (a 32B-AWQ scale): carved from a shared 20 MiB segment
    (int(12.5 * MIB), int(12.5 * MIB)),      # own segment of 14 MiB, 1.5 MiB left: split off
    (int(17.5 * MIB), 18 * MIB),             # 0.5 MiB left is too small to split: held
    (int(24.5 * MIB), 26 * MIB),             # >= 20 MiB: vLLM's max_split_size while loading, never split
    (24 * MIB, 24 * MIB),                    # a 2 MiB multiple holds nothing more
    (1485 * MIB, 1486 * MIB),                # Qwen2.5-32B's embedding
])  # fmt: skip
def test_block_bytes_follow_pytorchs_rules(size: int, held: int) -> None:
    assert block_bytes(size) == held


def test_rounding_sums_what_blocks_hold_beyond_the_tensors() -> None:
    assert rounding_bytes([int(24.5 * MIB), 24 * MIB, 4096]) == int(1.5 * MIB)
    assert rounding_bytes([]) == 0


@pytest.mark.parametrize("fixture", ["Qwen--Qwen2.5-32B-Instruct-AWQ", "Qwen--Qwen2.5-7B-Instruct"])
def test_tensor_list_has_vllms_bytes_exactly(fixture: str) -> None:
    """The planner's per-rank tensor list sums to the bytes vLLM allocated for the same shape on the GPU."""
    shape = parse_config(fixture_config(fixture), fixture)
    measured = probe_rows()[fixture]["tensor_bytes_gib"]
    assert sum(weight_tensor_sizes(shape)) / GIB == pytest.approx(measured, abs=5e-4)


def test_rounding_matches_the_blocks_measured_on_the_gpu() -> None:
    rows = probe_rows()
    qwen7 = parse_config(fixture_config("Qwen--Qwen2.5-7B-Instruct"), "7b")
    assert rounding_bytes(weight_tensor_sizes(qwen7)) / GIB == pytest.approx(
        rows["Qwen--Qwen2.5-7B-Instruct"]["measured_rounding_gib"], abs=5e-4)
    awq = parse_config(fixture_config("Qwen--Qwen2.5-32B-Instruct-AWQ"), "32b-awq")
    # Marlin's medium tensors (scales of 2-4 MiB) share segments in an order not modelled: within 0.01 GiB.
    assert rounding_bytes(weight_tensor_sizes(awq)) / GIB == pytest.approx(
        rows["Qwen--Qwen2.5-32B-Instruct-AWQ"]["measured_rounding_gib"], abs=0.01)


@pytest.mark.parametrize("fixture", ["meta-llama--Llama-3.3-70B-Instruct", "Qwen--Qwen3-30B-A3B",
                                     "deepseek-ai--DeepSeek-V2-Lite-Chat", "google--gemma-2-2b-it",
                                     "Qwen--Qwen2.5-7B-Instruct-GPTQ-Int4"])
def test_tensor_list_agrees_with_the_parameter_count(fixture: str) -> None:
    """Every layout's tensor list (dense, MoE, MLA, alternating, GPTQ) holds the config's parameters."""
    shape = parse_config(fixture_config(fixture), fixture)
    rotary = shape.max_context * (shape.qk_rope_head_dim if shape.is_mla else shape.head_dim) * shape.dtype_bytes
    listed = sum(weight_tensor_sizes(shape)) - rotary
    assert listed == pytest.approx(weights_from_config(shape).total_bytes, rel=0.01)


def test_tensor_parallel_splits_the_tensors() -> None:
    shape = parse_config(fixture_config("meta-llama--Llama-3.3-70B-Instruct"), "70b")
    one, two = sum(weight_tensor_sizes(shape)), sum(weight_tensor_sizes(shape, tp=2))
    assert two == pytest.approx(one / 2, rel=0.01)
