"""`vllm bench serve`: the command a scenario becomes, and its result JSON (0.26 and 0.32) in our names."""

from __future__ import annotations

import json

from stack.load.scenario import load_scenario, parse_scenario
from stack.load.vllm_bench import bench_command, metrics_from_bench
from tests.load.conftest import DATA


def test_command_from_the_gpu_scenario(tmp_path) -> None:
    cmd = bench_command(load_scenario("gpu-8b-1024-128"), "py", "http://e", "m", "/tok", tmp_path, "r.json")
    text = " ".join(cmd)
    assert cmd[:6] == ["py", "-m", "stack.entrypoints.run", "stack.vllm.launcher", "bench", "serve"]
    for part in ("--random-input-len 1024", "--random-output-len 128", "--random-range-ratio 0.000",
                 "--num-prompts 320", "--max-concurrency 64", "--ignore-eos", "--metric-percentiles 50,90,95,99"):
        assert part in text
    assert "--request-rate" not in text


def test_rate_and_prefix() -> None:
    s = parse_scenario({"name": "x", "load": {"users": 4, "rate": 2.5, "duration_s": 10},
                        "requests": {"shared_prefix_tokens": 100, "ignore_eos": False,
                                     "prompt_tokens": {"dist": "uniform", "min": 100, "max": 300}}})
    text = " ".join(bench_command(s, "py", "u", "m", "t", DATA, "r"))
    assert "--request-rate 2.5" in text and "--random-prefix-len 100" in text and "--ignore-eos" not in text
    assert "--random-input-len 200" in text and "--random-range-ratio 0.500" in text and "--num-prompts 25" in text


def test_result_json_of_both_versions() -> None:
    for version in ("0.26", "0.32"):
        raw = json.loads((DATA / f"vllm_bench_serve_{version}.json").read_text())
        m = metrics_from_bench(raw)
        assert m["output_tokens_per_s"] == raw["output_throughput"]
        assert m["p95_e2e_ms"] == raw["p95_e2el_ms"] and m["p99_ttft_ms"] == raw["p99_ttft_ms"]
        assert m["error_rate"] == 0 and m["requests"] == raw["num_prompts"]


def test_open_loop_probe_has_no_concurrency_cap(tmp_path) -> None:
    from stack.load.vllm_bench import OpenLoop

    s = load_scenario("gpu-8b-1024-128")
    text = " ".join(bench_command(s, "py", "u", "m", "t", tmp_path, "r", OpenLoop(12.5, 250, 0.5, 8, 3)))
    for part in ("--num-prompts 250", "--request-rate 12.5", "--burstiness 0.5", "--num-warmups 8", "--seed 3"):
        assert part in text
    assert "--max-concurrency" not in text and "--num-prompts 320" not in text
    capacity = " ".join(bench_command(s, "py", "u", "m", "t", tmp_path, "r", OpenLoop(float("inf"), 200)))
    assert "--request-rate inf" in capacity and "--num-warmups" not in capacity
