"""bench/startup_time.py's bookkeeping of repeat starts (--repeats: their order and median) and of the engine's
sleep lines. The starts themselves take minutes each: bench/gpu/startup.sh on the lent GPU, bench/startup_time.py
here."""

from __future__ import annotations

from bench import startup_time as bench


def test_repeat_starts_alternate_which_kind_goes_first_and_report_the_median() -> None:
    plan = bench.start_plan(["vllm_serve", "vstack_up"], repeats=3)
    # first and the first repeat: plain first (as before); then the order alternates
    assert [kind for _, kind in plan] == ["vllm_serve", "vstack_up"] * 2 + ["vllm_serve", "vstack_up",
                                                                             "vstack_up", "vllm_serve"]
    assert [which for which, _ in plan][::2] == ["first", "repeat", "repeat 2", "repeat 3"]
    assert bench.start_plan(["vstack_up"], repeats=1) == [("first", "vstack_up"), ("repeat", "vstack_up")]
    runs = {"first": 100.0, "repeat": 50.0, "repeat 2": 60.0, "repeat 3": 40.0}
    bench.median_of_repeats(runs, bench.start_names(3))
    assert runs["repeat_runs"] == [50.0, 60.0, 40.0] and runs["repeat"] == 50.0 and runs["first"] == 100.0
    assert bench._ratio({"vstack_up": {"repeat": 52.0}, "vllm_serve": {"repeat": 50.0}}, "repeat") == 1.04


def test_the_engines_sleep_and_wake_lines_are_collected_without_the_gateways(tmp_path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "qwen.log").write_text("INFO loading\nINFO vstack sleep: 14.29 GiB copied to host in 12.10 s\n"
                                   "INFO vstack wake: 14.29 GiB in 1.90 s\n")  # fmt: skip
    (logs / "gateway.log").write_text("INFO vstack sleep: said by nobody\n")
    assert bench.sleep_lines(tmp_path) == ["INFO vstack sleep: 14.29 GiB copied to host in 12.10 s",
                                           "INFO vstack wake: 14.29 GiB in 1.90 s"]  # fmt: skip
