"""bench/startup_time.py's bookkeeping of repeat starts (--repeats) and of the engine's sleep lines; the starts
themselves are replaced here by a clock that answers each kind's seconds (the real run needs minutes per start:
bench/gpu/startup.sh on the lent GPU, bench/startup_time.py here)."""

from __future__ import annotations

import argparse
import json

from bench import startup_time as bench


def test_repeat_starts_alternate_which_kind_goes_first_and_report_the_median(tmp_path, monkeypatch) -> None:
    order: list[str] = []
    seconds = {"vllm_serve": iter([100.0, 50.0, 60.0, 40.0]), "vstack_up": iter([101.0, 70.0, 52.0, 41.0])}

    def plain(*_a, **_k):
        order.append("vllm_serve")
        return next(seconds["vllm_serve"]), "vllm serve m"

    def stack(*_a, **_k):
        order.append("vstack_up")
        return next(seconds["vstack_up"])

    monkeypatch.setattr(bench, "time_plain", plain)
    monkeypatch.setattr(bench, "time_vstack", stack)
    monkeypatch.setattr(bench, "machine_facts", lambda: {})
    monkeypatch.setattr(bench, "compile_outcome", lambda logs: "n/a")
    monkeypatch.setattr(bench, "phases_after", lambda *a, **k: {})
    args = argparse.Namespace(kinds=["vllm_serve", "vstack_up"], plain_patched=True, warm_up=False, repeats=3,
                              profile=None, config=None, timeout=10, eager=False, restarts=False,
                              out=tmp_path / "startup.json")  # fmt: skip
    result = bench.first_and_repeat(args, {}, {})
    # first and the first repeat: plain first (as before); then the order alternates
    assert order == ["vllm_serve", "vstack_up"] * 2 + ["vllm_serve", "vstack_up", "vstack_up", "vllm_serve"]
    assert result["seconds"]["vllm_serve"]["repeat_runs"] == [50.0, 60.0, 40.0]
    assert result["seconds"]["vllm_serve"]["repeat"] == 50.0 and result["seconds"]["vstack_up"]["repeat"] == 52.0
    assert result["vstack_repeat_to_plain_repeat"] == 1.04
    assert json.loads(args.out.read_text())["seconds"]["vstack_up"]["repeat"] == 52.0  # written, not only returned


def test_the_engines_sleep_and_wake_lines_are_collected_without_the_gateways(tmp_path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "qwen.log").write_text("INFO loading\nINFO vstack sleep: 14.29 GiB copied to host in 12.10 s\n"
                                   "INFO vstack wake: 14.29 GiB in 1.90 s\n")  # fmt: skip
    (logs / "gateway.log").write_text("INFO vstack sleep: said by nobody\n")
    assert bench.sleep_lines(tmp_path) == ["INFO vstack sleep: 14.29 GiB copied to host in 12.10 s",
                                           "INFO vstack wake: 14.29 GiB in 1.90 s"]  # fmt: skip
