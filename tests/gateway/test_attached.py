"""Attached engines (stack.engine.attached) and `python -m stack.entrypoints.gateway --manage`'s upstream parsing: the
runtime of the static compose profiles. Sleep and wake against a real engine run in
tests/docker/test_compose_static.py; here, the real vLLM of the e2e tests and a port nobody listens on."""

from __future__ import annotations

import pytest

from bench.harness.waiting import free_port
from stack.engine.attached import AttachedEngine, AttachedSpec
from stack.entrypoints.gateway import parse_upstream
from stack.errors import EngineError


def test_upstreams_parse_and_bad_ones_say_the_form() -> None:
    assert parse_upstream("m=http://engine:8000/v1/@served") == ("m", "http://engine:8000", "served")
    assert parse_upstream("m=http://engine:8000") == ("m", "http://engine:8000", "m")
    for bad in ("http://engine:8000", "m=engine:8000", "=http://x"):
        with pytest.raises(SystemExit, match=r"expected MODEL=http://HOST:PORT\[@SERVED_NAME\]"):
            parse_upstream(bad)


def test_an_engine_nobody_runs_is_never_started_only_reported() -> None:
    engine = AttachedEngine(AttachedSpec("m", f"http://127.0.0.1:{free_port()}"))
    assert engine.start() == 0 and engine.stop() == [] and engine.exit_code() is None
    assert engine.supports_sleep() is False
    with pytest.raises(EngineError) as err:
        engine.wait_ready(1.0)
    assert engine.spec.base_url in err.value.message and "docker compose" in err.value.hint


def test_a_running_vllm_is_ready_and_says_it_cannot_sleep_without_dev_mode(vllm_engine) -> None:
    engine = AttachedEngine(AttachedSpec("smollm2", vllm_engine.url))
    assert engine.wait_ready(30) < 30
    assert engine.supports_sleep() is False  # /is_sleeping exists only with VLLM_SERVER_DEV_MODE=1
    with pytest.raises(EngineError, match="POST /sleep answered 404"):
        engine.sleep()
