"""Every run under bench/results/ is a folder <date>-<device>-<name>[-tag] with a manifest.json valid against
the schema (bench.harness.manifest) that lists the raw results beside it; the results writer makes such folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.harness import manifest, results
from bench.harness.manifest import RESULTS, Figure, ManifestError

FOLDERS = sorted(p for p in RESULTS.iterdir() if p.is_dir())


def test_no_loose_results() -> None:
    loose = [p.name for p in RESULTS.iterdir() if not p.is_dir()]
    assert not loose, f"{loose}: every result lives in a run folder with a manifest (bench.harness.results.record)"


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_manifest_is_valid(folder: Path) -> None:
    run = manifest.load(folder)
    assert run.figures or run.name in {"weights-probe"}, f"{folder.name}: no figures"


def test_the_writer_makes_a_valid_folder_and_never_overwrites(tmp_path: Path) -> None:
    figures = [Figure(name="added p50", value=5.2, unit="ms", meaning="what the gateway adds; lower is better")]
    first = results.record("gateway-overhead", "one line", figures, raw={"latency": []}, root=tmp_path,
                           device="cpu", command="python bench/gateway_overhead.py --rounds 1")
    second = results.record("gateway-overhead", "again", figures, raw={"latency": []}, root=tmp_path, device="cpu",
                            command="python bench/gateway_overhead.py --rounds 1")
    assert first != second and second.name.startswith(first.name + "-")
    for folder in (first, second):
        run = manifest.load(folder)
        assert run.files == ["gateway-overhead.json"] and run.versions["vllm"] and run.commit
        assert json.loads((folder / "gateway-overhead.json").read_text()) == {"latency": []}


def test_a_manifest_that_lists_a_missing_file_or_sits_in_the_wrong_folder_fails(tmp_path: Path) -> None:
    good = RESULTS / "2026-11-23-cpu-gateway-overhead"
    data = json.loads((good / "manifest.json").read_text())
    wrong = tmp_path / "2026-11-23-h200-gateway-overhead"
    wrong.mkdir()
    (wrong / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="should be named 2026-11-23-cpu-gateway-overhead"):
        manifest.load(wrong)
    right = tmp_path / "2026-11-23-cpu-gateway-overhead"
    right.mkdir()
    (right / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="not in the folder"):
        manifest.load(right)


def test_adopt_puts_fetched_gpu_results_in_a_run_folder(tmp_path: Path) -> None:
    fetched = tmp_path / "out" / "gpu-h200-2026-11-26.json"
    fetched.parent.mkdir()
    fetched.write_text('{"rows": []}')
    figures = tmp_path / "figures.json"
    figures.write_text(json.dumps([{"name": "rows OK", "value": 5, "unit": "", "meaning": "rows every check passed"}]))
    root = tmp_path / "results"
    assert results.main(["adopt", str(fetched), "--name", "gpu-suite", "--device", "h200", "--vllm", "vllm 0.26.0",
                         "--command", "bash bench/gpu/run.sh suite", "--summary", "every row OK",
                         "--date", "2026-11-26T10:05", "--figures", str(figures), "--root", str(root)]) == 0
    [folder] = root.iterdir()
    assert folder.name == "2026-11-26-h200-gpu-suite"
    run = manifest.load(folder)
    assert (run.time_utc, run.versions["vllm"], run.files) == ("10:05", "vllm 0.26.0", ["gpu-h200-2026-11-26.json"])


def test_a_bad_run_leaves_no_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one line"):
        results.record("gateway-overhead", "two\nlines", [], raw={}, root=tmp_path, device="cpu", command="x")
    assert list(tmp_path.iterdir()) == []
