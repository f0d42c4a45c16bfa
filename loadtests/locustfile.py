"""Locust users shaped like OpenAI chat clients, driven by a scenario file.

    VSTACK_SCENARIO=loadtests/scenarios/chat.yaml locust -f loadtests/locustfile.py --host http://127.0.0.1:8000
    vstack bench load --scenario chat          (runs this headless and writes the SLO report)

Each request is a chat completion (streamed for the scenario's share), with a prompt and max_tokens drawn
from the scenario's distributions and a model drawn from its mix. Besides Locust's own row per request,
custom rows record time to first token (TTFT), mean inter-token latency per request (ITL) and end-to-end
latency (E2E, whose response_length is the output token count); every request also goes to the JSONL file
named by VSTACK_LOADTEST_RECORDS for the exact percentiles of the report.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

from locust import HttpUser, LoadTestShape, constant, constant_throughput, events, task

from stack.load.prompts import chat_messages, shared_prefix
from stack.load.records import RequestRecord, writer_from_env
from stack.load.scenario import MODELS_ENV, SCENARIO_ENV, load_scenario, load_scenario_file

_path = os.environ.get(SCENARIO_ENV, "smoke")
SCENARIO = load_scenario_file(Path(_path)) if _path.endswith((".yaml", ".yml")) else load_scenario(_path)
REQ = SCENARIO.requests
PREFIX = shared_prefix(REQ.shared_prefix_tokens)
WRITER = writer_from_env()
# The mix `vstack bench load` decided and checked (stack.load.target: --model, no cloud unless allowed).
_mix: dict[str, float] = json.loads(os.environ.get(MODELS_ENV) or "null") or dict(SCENARIO.models)
_models: list[str] = list(_mix)
_weights: list[float] = list(_mix.values())


@events.test_start.add_listener
def _pick_default_model(environment, **_kwargs) -> None:
    """No model mix in the scenario: send everything to the first model the endpoint lists."""
    if _models:
        return
    import httpx

    reply = httpx.get(f"{environment.host.rstrip('/')}/v1/models", headers=_auth_headers(), timeout=30)
    reply.raise_for_status()
    _models.append(reply.json()["data"][0]["id"])
    _weights.append(1.0)


# On `quit`, not `quitting`: a SIGTERM'd run (`vstack bench load` stopped early) fires `quitting` before its users
# stop, and the requests still in flight (finishing within --stop-timeout) would write to a closed file.
@events.quit.add_listener
def _close_records(**_kwargs) -> None:
    if WRITER:
        WRITER.close()


def _auth_headers() -> dict[str, str]:
    key = os.environ.get(SCENARIO.target.api_key_env or "", "")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _wait_time():
    load = SCENARIO.load
    if load.rate:  # open loop: each user keeps its share of the total rate
        return constant_throughput(load.rate / load.peak_users)
    return constant(load.think_time_s)


class ChatUser(HttpUser):
    wait_time = _wait_time()

    def on_start(self) -> None:
        self.rng = random.Random()
        self.client.headers.update(_auth_headers())
        if SCENARIO.load.rate:  # open loop: users start at random phases of their pace, not all at once
            time.sleep(self.rng.uniform(0, SCENARIO.load.peak_users / SCENARIO.load.rate))

    @task
    def chat(self) -> None:
        model = self.rng.choices(_models, _weights)[0]
        stream = self.rng.random() < REQ.stream
        prompt_tokens = REQ.prompt_tokens.sample(self.rng)
        body = {
            "model": model, "messages": chat_messages(self.rng, prompt_tokens, PREFIX),
            "max_tokens": REQ.output_tokens.sample(self.rng), "temperature": REQ.temperature,
            "stream": stream, "ignore_eos": REQ.ignore_eos,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        record = RequestRecord(start=time.time(), model=model, stream=stream, ok=False, e2e_ms=0.0)
        t0 = time.perf_counter()
        with self.client.post("/v1/chat/completions", json=body, stream=stream, catch_response=True,
                              name=f"chat {model}", timeout=REQ.timeout_s) as resp:
            record.status = resp.status_code
            try:
                if resp.status_code != 200:
                    record.error = resp.text[:300]
                elif stream:
                    _read_stream(resp, record, t0)
                else:
                    usage = resp.json().get("usage") or {}
                    record.prompt_tokens = usage.get("prompt_tokens", 0)
                    record.output_tokens = usage.get("completion_tokens", 0)
                    record.ok = True
            except Exception as exc:  # a broken stream is a failed request, reported as such
                record.error = f"{type(exc).__name__}: {exc}"[:300]
            record.e2e_ms = (time.perf_counter() - t0) * 1000
            if record.ok:
                resp.success()
            else:
                resp.failure(record.error or f"HTTP {record.status}")
        self._report(record)

    def _report(self, record: RequestRecord) -> None:
        if WRITER:
            WRITER.write(record)
        if not record.ok:
            return
        fire = self.environment.events.request.fire
        common = {"name": record.model, "exception": None, "context": {}}
        fire(request_type="E2E", response_time=record.e2e_ms, response_length=record.output_tokens, **common)
        if record.ttft_ms is not None:
            fire(request_type="TTFT", response_time=record.ttft_ms, response_length=0, **common)
        if record.itl_ms:
            mean_itl = sum(record.itl_ms) / len(record.itl_ms)
            fire(request_type="ITL", response_time=mean_itl, response_length=len(record.itl_ms), **common)


def _read_stream(resp, record: RequestRecord, t0: float) -> None:
    last = None
    chunks = 0
    for line in resp.iter_lines():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        chunk = json.loads(payload)
        if chunk.get("error"):
            raise RuntimeError(str(chunk["error"])[:200])
        delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content"):
            now = time.perf_counter()
            if last is None:
                record.ttft_ms = (now - t0) * 1000
            else:
                record.itl_ms.append((now - last) * 1000)
            last = now
            chunks += 1
        usage = chunk.get("usage")
        if usage:
            record.prompt_tokens = usage.get("prompt_tokens", 0)
            record.output_tokens = usage.get("completion_tokens", 0)
    if last is None:
        raise RuntimeError("the stream ended without content")
    record.output_tokens = record.output_tokens or chunks
    record.ok = True


if SCENARIO.load.stages:

    class StagesShape(LoadTestShape):
        """The scenario's stages: users over time (Locust uses a shape class when the locustfile has one)."""

        def tick(self):
            elapsed = self.get_run_time()
            for stage in SCENARIO.load.stages:
                if elapsed < stage.duration_s:
                    rate = stage.users / SCENARIO.load.ramp_s if SCENARIO.load.ramp_s else stage.users
                    return stage.users, rate
                elapsed -= stage.duration_s
            return None
