"""Locust users shaped like OpenAI chat clients, driven by a scenario file (loadtests/README.md).

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8000                  # web UI, the smoke scenario
    VSTACK_SCENARIO=chat locust -f loadtests/locustfile.py --headless -u 8 -r 2 -t 60s --host http://127.0.0.1:8000
    locust -f loadtests/locustfile.py --scenario rag --slo 'p95_ttft_ms<800' --headless -t 60s --host ...
    vstack bench load --scenario chat          (runs this file headless and writes the SLO report and plots)

Options (Locust custom arguments, each also read from an environment variable, as Locust's own are):
`--scenario` / VSTACK_SCENARIO: a name in loadtests/scenarios or a path to a YAML file (default smoke);
`--slo` / VSTACK_SLO: clauses checked when the test stops (default the scenario's `slo:`; `none`: no check),
a missed clause makes Locust exit 1. The API key comes from the variable the scenario's `target.api_key_env`
names (VSTACK_API_KEY unless it says otherwise).

Each request is a chat completion (streamed for the scenario's share), with a prompt and max_tokens drawn
from the scenario's distributions and a model drawn from its mix. Besides Locust's own row per request,
custom rows record time to first token (TTFT), mean inter-token latency per request (ITL) and end-to-end
latency (E2E, whose response_length is the output token count); every request also goes to the JSONL file
named by VSTACK_LOADTEST_RECORDS for the exact percentiles of `vstack bench load`'s report.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from locust import HttpUser, LoadTestShape, constant, constant_throughput, events, task
from locust.runners import MasterRunner

# In a source checkout, read scenarios with the stack package of this same checkout (a venv's editable install
# may point at another one). Installed, this file is stack/_loadtests/locustfile.py and the package is found.
_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "stack" / "__init__.py").is_file() and str(_CHECKOUT) not in sys.path:
    sys.path.insert(0, str(_CHECKOUT))

try:
    from stack.config.slo import Clause, ClauseResult, all_met, evaluate, parse_slo
    from stack.errors import StackError
    from stack.load.measured_requests import RecordWriter, RequestRecord, writer_from_env
    from stack.load.prompts import chat_messages, shared_prefix
    from stack.load.scenario import MODELS_ENV, SCENARIO_ENV, Scenario, load_scenario, load_scenario_file
    from stack.load.summary import summarize
except ImportError as exc:  # Locust alone is not enough: the scenario format is the stack's
    raise SystemExit(
        f"{__file__}: needs the vllm-stack package and its dependencies ({exc}). Run Locust from the stack's "
        "environment (`./install.sh --loadtest`, then `.venv/bin/locust -f loadtests/locustfile.py ...`)."
    ) from None

SLO_ENV = "VSTACK_SLO"
log = logging.getLogger("vstack.loadtest")


@dataclass
class _Run:
    """What the chosen scenario decides, filled in when Locust has parsed its options (`init`)."""

    scenario: Scenario | None = None
    prefix: str = ""
    models: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    clauses: list[Clause] = field(default_factory=list)
    writer: RecordWriter | None = None
    records: list[RequestRecord] = field(default_factory=list)  # this test's, kept only to check the SLO
    verdict: list[ClauseResult] | None = None  # None: this test not judged yet


RUN = _Run()


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    # Not in the web UI's form: the scenario decides the user classes' pacing and the shape when Locust starts.
    parser.add_argument(
        "--scenario",
        env_var=SCENARIO_ENV,
        default="smoke",
        include_in_web_ui=False,
        help="a scenario in loadtests/scenarios (smoke, chat, rag, ramp, ...) or a YAML path",
    )
    parser.add_argument(
        "--slo",
        env_var=SLO_ENV,
        default="",
        include_in_web_ui=False,
        help="SLO clauses checked when the test stops, e.g. 'p95_ttft_ms<800,error_rate<0.01' "
        "(default: the scenario's slo:; 'none': no check); a miss makes Locust exit 1",
    )


def _scenario(name: str) -> Scenario:
    return load_scenario_file(Path(name)) if name.endswith((".yaml", ".yml")) else load_scenario(name)


@events.init.add_listener
def _configure(environment: Any, **_kwargs: Any) -> None:
    options = environment.parsed_options
    name = getattr(options, "scenario", None) or os.environ.get(SCENARIO_ENV) or "smoke"
    try:
        scenario = _scenario(name)
        slo = getattr(options, "slo", "") or ""
        clauses = [] if slo.strip().lower() == "none" else parse_slo(slo or scenario.slo)
    except (StackError, ValueError) as exc:  # a bad scenario or SLO: its message and fix, not a traceback
        raise SystemExit(f"{__file__} (--scenario {name} / --slo): {exc}") from None
    RUN.scenario = scenario
    RUN.prefix = shared_prefix(scenario.requests.shared_prefix_tokens)
    # The mix `vstack bench load` decided and checked (stack.load.target: --model, no cloud unless allowed).
    mix: dict[str, float] = json.loads(os.environ.get(MODELS_ENV) or "null") or dict(scenario.models)
    RUN.models, RUN.weights = list(mix), list(mix.values())
    RUN.clauses = clauses
    RUN.writer = writer_from_env()
    if not scenario.load.stages:  # the stages shape only drives scenarios that have stages
        environment.shape_class = None
        if environment.available_shape_classes:
            environment.available_shape_classes.pop(StagesShape.__name__, None)
    log.info(
        "scenario %s (%s); SLO checked at the end: %s",
        scenario.name,
        scenario.source,
        ", ".join(map(str, RUN.clauses)) or "none",
    )


@events.test_start.add_listener
def _start(environment: Any, **_kwargs: Any) -> None:
    RUN.records.clear()
    RUN.verdict = None
    if not RUN.models:  # no model mix in the scenario: send everything to the first model the endpoint lists
        import httpx

        reply = httpx.get(f"{environment.host.rstrip('/')}/v1/models", headers=_auth_headers(), timeout=30)
        reply.raise_for_status()
        RUN.models.append(reply.json()["data"][0]["id"])
        RUN.weights.append(1.0)


@events.test_stop.add_listener
def _stop(environment: Any, **_kwargs: Any) -> None:
    _judge(environment)


# On `quit`, not `quitting`: a SIGTERM'd run (`vstack bench load` stopped early) fires `quitting` before its users
# stop, and the requests still in flight (finishing within --stop-timeout) would write to a closed file.
@events.quit.add_listener
def _close_records(**_kwargs: Any) -> None:
    if RUN.writer:
        RUN.writer.close()


@events.quitting.add_listener
def _exit_code(environment: Any, **_kwargs: Any) -> None:
    if RUN.verdict is None:  # SIGTERM: `quitting` comes before the test stops; judge what finished
        _judge(environment)
    if RUN.verdict and not all_met(RUN.verdict):
        environment.process_exit_code = 1


def _judge(environment: Any) -> None:
    """The SLO against this test's requests, with the figures `vstack bench load`'s report uses."""
    if not RUN.clauses or isinstance(environment.runner, MasterRunner):
        return  # distributed: each worker has only its own requests (`vstack bench load` for one verdict)
    RUN.verdict = evaluate(RUN.clauses, summarize(RUN.records))
    met = all_met(RUN.verdict)
    log.log(
        logging.INFO if met else logging.ERROR,
        "SLO %s over %d requests: %s",
        "met" if met else "NOT MET",
        len(RUN.records),
        "; ".join(r.describe() for r in RUN.verdict),
    )


def _auth_headers() -> dict[str, str]:
    scenario = RUN.scenario
    key = os.environ.get(scenario.target.api_key_env or "", "") if scenario else ""
    return {"Authorization": f"Bearer {key}"} if key else {}


class ChatUser(HttpUser):
    def wait_time(self) -> float:
        load = RUN.scenario.load
        if load.rate:  # open loop: each user keeps its share of the total rate
            return constant_throughput(load.rate / load.peak_users)(self)
        return constant(load.think_time_s)(self)

    def on_start(self) -> None:
        self.rng = random.Random()
        self.client.headers.update(_auth_headers())
        load = RUN.scenario.load
        if load.rate:  # open loop: users start at random phases of their pace, not all at once
            time.sleep(self.rng.uniform(0, load.peak_users / load.rate))

    @task
    def chat(self) -> None:
        req = RUN.scenario.requests
        model = self.rng.choices(RUN.models, RUN.weights)[0]
        stream = self.rng.random() < req.stream
        prompt_tokens = req.prompt_tokens.sample(self.rng)
        body = {
            "model": model,
            "messages": chat_messages(self.rng, prompt_tokens, RUN.prefix),
            "max_tokens": req.output_tokens.sample(self.rng),
            "temperature": req.temperature,
            "stream": stream,
            "ignore_eos": req.ignore_eos,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        record = RequestRecord(start=time.time(), model=model, stream=stream, ok=False, e2e_ms=0.0)
        t0 = time.perf_counter()
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            stream=stream,
            catch_response=True,
            name=f"chat {model}",
            timeout=req.timeout_s,
        ) as resp:
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
        if RUN.writer:
            RUN.writer.write(record)
        if RUN.clauses:
            RUN.records.append(record)
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


def _read_stream(resp: Any, record: RequestRecord, t0: float) -> None:
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


class StagesShape(LoadTestShape):
    """The scenario's stages: users over time. Locust drives a run with a shape class when the locustfile has
    one; `_configure` drops it for a scenario without stages, which then runs with -u, -r and -t."""

    use_common_options = True  # no "-u/-r/-t are ignored" warning before the scenario is known

    def tick(self) -> tuple[int, float] | None:
        load = RUN.scenario.load
        elapsed = self.get_run_time()
        for stage in load.stages:
            if elapsed < stage.duration_s:
                return stage.users, stage.users / load.ramp_s if load.ramp_s else stage.users
            elapsed -= stage.duration_s
        return None
