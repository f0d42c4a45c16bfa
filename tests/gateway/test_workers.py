"""A gateway with two worker processes (gateway.workers: 2; adr/0049) in front of two stand-in engines, the
model manager sleeping and waking them: what one process changes, every worker's requests see.

One gateway for the module (`python -m stack.entrypoints.gateway --workers 2 --manage`, the owner and its two
workers in their own processes). A client is pinned to a worker by its keep-alive connection: connections are
opened until each worker answered one (`x-vstack-worker`), and each test sends through both."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.waiting import free_port, wait_http
from stack.config.sections.gateway import resolve_workers
from tests.gateway.conftest import ROOT, Mock, start_mock, stop

TEAM, OPS = "sk-team-workers-test", "sk-ops-workers-test"
CONFIG = """\
gateway:
  tenants:
    - {name: team, env: WT_TEAM_KEY, limits: {rpm: 3}}
    - {name: ops, env: WT_OPS_KEY, role: admin}
"""


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mock, Mock]]:
    tmp = tmp_path_factory.mktemp("workers-engines")
    a, b = start_mock(tmp, "a", "--chunks", "4"), start_mock(tmp, "b", "--chunks", "4")
    yield a, b
    stop(a.proc)
    stop(b.proc)


@pytest.fixture(scope="module")
def gateway(engines: tuple[Mock, Mock], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("workers-gateway")
    (tmp / "config.yaml").write_text(CONFIG + f"state_dir: {tmp / 'state'}\n")
    port, log = free_port(), tmp / "gateway.log"
    argv = [sys.executable, "-m", "stack.entrypoints.gateway", "--manage", "--workers", "2", "--port", str(port),
            "--config", str(tmp / "config.yaml"), "--upstream", f"a={engines[0].url}",
            "--upstream", f"b={engines[1].url}"]  # fmt: skip
    env = {"WT_TEAM_KEY": TEAM, "WT_OPS_KEY": OPS, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 60, proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
        assert proc.returncode == 0, log.read_text()[-3000:]  # SIGTERM drained the workers and the owner


@pytest.fixture(scope="module")
def pinned(gateway: str) -> Iterator[dict[str, httpx.Client]]:
    """worker number -> a client whose one keep-alive connection that worker accepted."""
    found: dict[str, httpx.Client] = {}
    deadline = time.monotonic() + 30
    while len(found) < 2 and time.monotonic() < deadline:
        client = httpx.Client(base_url=gateway, limits=httpx.Limits(max_connections=1), timeout=30)
        worker = client.get("/health").headers.get("x-vstack-worker")
        if worker is None or worker in found:
            client.close()
            time.sleep(0.05)  # the other worker may still be starting
            continue
        found[worker] = client
    assert sorted(found) == ["1", "2"], f"workers seen: {sorted(found)}"
    yield found
    for client in found.values():
        client.close()


def chat(client: httpx.Client, model: str, key: str = TEAM) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}
    return client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def admin(client: httpx.Client, method: str, path: str, **kw: object) -> httpx.Response:
    return client.request(method, path, headers={"Authorization": f"Bearer {OPS}"}, **kw)  # type: ignore[arg-type]


def model_state(client: httpx.Client, model: str) -> str:
    models = admin(client, "GET", "/admin/models").json()["models"]
    return next(m["state"] for m in models if m["model"] == model)


def test_a_switch_through_one_worker_is_seen_on_every_worker(pinned: dict[str, httpx.Client],
                                                             engines: tuple[Mock, Mock]) -> None:  # fmt: skip
    one, two = pinned["1"], pinned["2"]
    assert admin(one, "POST", "/admin/models/a/sleep").status_code == 200
    assert model_state(two, "a") == "sleeping"  # worker 2 sees what worker 1 asked the owner to do
    assert httpx.get(f"{engines[0].url}/is_sleeping").json() == {"is_sleeping": True}
    answer = chat(two, "a", key=OPS)  # a request on worker 2 wakes it
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-vstack-worker"] == "2" and "data: [DONE]" in answer.text
    assert model_state(one, "a") == "ready"
    assert httpx.get(f"{engines[0].url}/is_sleeping").json() == {"is_sleeping": False}


def test_a_keys_rpm_holds_across_workers(pinned: dict[str, httpx.Client]) -> None:
    one, two = pinned["1"], pinned["2"]
    statuses = [chat(c, "b").status_code for c in (one, two, one)]
    assert statuses == [200, 200, 200]
    for client in (two, one):  # the 4th and 5th within the minute: refused whichever worker takes them
        refused = chat(client, "b")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["message"] == "key 'team' is at its limit of 3 requests per minute"


def test_a_runtime_change_through_one_worker_is_seen_on_every_worker(pinned: dict[str, httpx.Client],
                                                                     engines: tuple[Mock, Mock]) -> None:  # fmt: skip
    one, two = pinned["1"], pinned["2"]
    added = admin(one, "POST", "/admin/deployments",
                  json={"id": "extra-1", "model_group": "extra", "kind": "local", "api_base": engines[1].url,
                        "upstream_model": "extra"})  # fmt: skip
    assert added.status_code == 201, added.text
    for client in (two, one):
        answer = chat(client, "extra", key=OPS)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-vstack-deployment"] == "extra-1"
    assert admin(two, "DELETE", "/admin/deployments/extra-1").status_code == 200
    assert chat(one, "extra", key=OPS).status_code == 404


def requests_served(client: httpx.Client, model: str) -> float:
    text = admin(client, "GET", "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vstack_gateway_requests_total{") and f'model="{model}"' in line
               and 'status="200"' in line)  # fmt: skip


def test_metrics_count_the_requests_of_every_worker(pinned: dict[str, httpx.Client]) -> None:
    one, two = pinned["1"], pinned["2"]
    before = requests_served(two, "a")
    for client in (one, two, two):
        assert chat(client, "a", key=OPS).status_code == 200
    assert requests_served(one, "a") == before + 3  # one /metrics, whichever worker serves it


def test_the_time_from_a_workers_receipt_to_its_engine_call_is_counted_by_the_owner(
    pinned: dict[str, httpx.Client],
) -> None:
    """vstack_gateway_time_to_engine_call_seconds with workers: the worker's arrival and call times (one clock on
    the host) reach the owner, which counts every request once, whichever worker served it (adr/0049)."""
    name = "vstack_gateway_time_to_engine_call_seconds"

    def seen() -> tuple[float, float]:
        got = {s.name: s.value for f in text_string_to_metric_families(admin(pinned["1"], "GET", "/metrics").text)
               for s in f.samples if s.name in (f"{name}_count", f"{name}_sum") and s.labels["model"] == "a"}
        return got.get(f"{name}_count", 0.0), got.get(f"{name}_sum", 0.0)

    count, total = seen()
    waited = 0.0
    for client in (pinned["1"], pinned["2"], pinned["2"]):
        t0 = time.perf_counter()
        assert chat(client, "a", key=OPS).status_code == 200
        waited += time.perf_counter() - t0
    after, spent = seen()
    assert after == count + 3
    assert 0 < spent - total < waited


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (4, 1), (8, 2), (16, 4), (64, 8), (256, 8)])
def test_auto_workers_is_one_per_four_cores_up_to_eight(cores: int, workers: int) -> None:
    assert resolve_workers("auto", cores) == workers
    assert resolve_workers(3, cores) == 3


def test_a_stream_a_worker_relays_starts_with_the_owners_headers_and_hides_the_usage_it_added(
        pinned: dict[str, httpx.Client]) -> None:  # fmt: skip
    """The worker starts a stream's answer at the engine's first chunk with the headers the owner's dispatcher
    gives it (sent with its `open`, one round trip sooner than its `answer`): the same as one process answers."""
    for client in pinned.values():
        answer = chat(client, "b", key=OPS)
        assert answer.status_code == 200, answer.text
        h = answer.headers
        assert h["content-type"].startswith("text/event-stream") and h["cache-control"] == "no-cache"
        assert h["x-accel-buffering"] == "no" and h["x-vstack-deployment"] and h["x-vstack-worker"] in ("1", "2")
        assert len(answer.headers.get_list("content-type")) == 1
        events = [line for line in answer.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 5  # the stand-in's 4 chunks, then [DONE]
        assert '"usage"' not in answer.text  # the gateway asked for usage to count it; the client did not
