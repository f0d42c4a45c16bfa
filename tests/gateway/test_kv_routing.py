"""Replica routing on the engines' own KV events (gateway.replica_routing: kv_events, adr/0050).

The events are vLLM's own objects (BlockStored, BlockRemoved, AllBlocksCleared in a KVEventBatch), sent by vLLM's
own publisher (ZmqEventPublisher: its encoder, sequence numbers and replay socket) over real ZMQ sockets to the
gateway's subscriber; the index they fill and the choice made from it are read back as the gateway uses them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack.config import load_config
from stack.errors import ConfigError
from stack.gateway.registry import Deployment
from stack.gateway.routing.kv_index import KvIndex
from stack.gateway.routing.replicas import ReplicaChooser, affinity_key, rendezvous
from stack.hardware import detect
from stack.planner.kv_events_args import FLAG, with_endpoints
from stack.planner.model_planner import plan_model
from tests.conftest import load_catalog

kv_events = pytest.importorskip("vllm.distributed.kv_events")
BS = 16
PROMPT = list(range(1000, 1000 + 4 * BS + 5))  # four whole blocks and a partial one


def replica(i: int, folder: Path | None = None, state: str = "ready") -> Deployment:
    labels = {"replica": str(i), "node": "n"}
    if folder is not None:
        labels.update(kv_events=f"ipc://{folder}/r{i}-events", kv_replay=f"ipc://{folder}/r{i}-replay")
    return Deployment(id=f"engine-m-r{i}", model_group="m", kind="local", upstream_model="m", state=state,
                      labels=labels)  # fmt: skip


def stored(tokens: list[int], first: int, parent: int | None = None):
    """One BlockStored of len(tokens)//BS blocks, hashed first, first+1, ... (vLLM's hashes are opaque to us)."""
    n = len(tokens) // BS
    return kv_events.BlockStored(block_hashes=list(range(first, first + n)), parent_block_hash=parent,
                                 token_ids=tokens[: n * BS], block_size=BS, lora_id=None, medium="GPU",
                                 lora_name=None)  # fmt: skip


class Publisher:
    """vLLM's own publisher of one replica, bound where the gateway's labels say."""

    def __init__(self, dep: Deployment) -> None:
        self.pub = kv_events.ZmqEventPublisher(0, endpoint=dep.labels["kv_events"],
                                               replay_endpoint=dep.labels["kv_replay"], topic="kv")  # fmt: skip

    def send(self, *events) -> None:
        self.pub.publish(kv_events.KVEventBatch(ts=time.time(), events=list(events)))

    def close(self) -> None:
        self.pub.shutdown()


@pytest.fixture
def folder(tmp_path_factory) -> Path:
    return Path(os.path.realpath("/tmp")) / tmp_path_factory.mktemp("kv").name  # ipc paths stay short


@pytest.fixture
def pubs(folder: Path) -> Iterator[dict[int, Publisher]]:
    folder.mkdir(exist_ok=True)
    made = {i: Publisher(replica(i, folder)) for i in (0, 1)}
    yield made
    for p in made.values():
        p.close()


async def until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.02)


def test_a_prompt_goes_to_the_replica_whose_engine_said_it_holds_its_prefix_and_forgets_removed_blocks(
    folder, pubs
) -> None:
    async def run() -> None:
        book = ReplicaChooser("kv_events")
        deps = [replica(0, folder), replica(1, folder)]
        for d in deps:
            book.kv.follow(d.id, d)
        await until(lambda: all(book.kv.live(d.id) for d in deps), 60)  # vLLM's classes imported in a thread
        await asyncio.sleep(0.3)  # ZMQ's subscription reaches the publishers
        pubs[1].send(stored(PROMPT, 100))
        pubs[0].send(stored(PROMPT[: 2 * BS], 500))
        await until(lambda: book.kv.index.blocks(deps[1].id) == 4 and book.kv.index.blocks(deps[0].id) == 2)
        assert book.choose(deps, {"prompt": "x"}, PROMPT).id == "engine-m-r1"
        assert book.last_choice["hits"] == {"engine-m-r0": 32, "engine-m-r1": 64}
        # Another prompt sharing two blocks: both hold them; the tie goes to the fewest in flight, then the id.
        other = PROMPT[: 2 * BS] + [7] * 40
        book.choose(deps, None, other)
        assert book.last_choice["hits"] == {"engine-m-r0": 32, "engine-m-r1": 32}
        pubs[1].send(kv_events.BlockRemoved(block_hashes=[102, 103], medium="GPU"))
        await until(lambda: book.kv.index.blocks(deps[1].id) == 2)
        book.choose(deps, None, PROMPT)
        assert book.last_choice["hits"] == {"engine-m-r0": 32, "engine-m-r1": 32}
        pubs[0].send(kv_events.AllBlocksCleared())
        await until(lambda: book.kv.index.blocks(deps[0].id) == 0)
        assert book.choose(deps, None, PROMPT).id == "engine-m-r1"
        assert book.kv.describe(deps[1].id) | {"batches": 2} == {
            "state": "live", "batches": 2, "replays": 0, "drops": 0, "blocks": 2, "block_size": BS, "stored": 4,
            "removed": 2, "skipped": 0, "expected": 2}  # fmt: skip (the 2 blocks it lost: just routed there again)
        await book.kv.close()

    asyncio.run(run())


def test_batches_sent_before_the_gateway_listened_are_replayed_from_vllms_buffer(folder, pubs) -> None:
    async def run() -> None:
        pubs[0].send(stored(PROMPT[: 2 * BS], 10))  # seq 0 and 1: nobody subscribed, ZMQ drops them
        pubs[0].send(stored(PROMPT[2 * BS : 4 * BS], 12, parent=11))
        await asyncio.sleep(0.2)
        book = ReplicaChooser("kv_events")
        dep = replica(0, folder)
        book.kv.follow(dep.id, dep)
        await until(lambda: book.kv.live(dep.id), 60)
        await asyncio.sleep(0.3)
        pubs[0].send(stored([5] * BS, 99))  # seq 2: the gap from 0 is asked of the replay socket
        await until(lambda: book.kv.index.blocks(dep.id) == 5)
        sub = book.kv.subs[dep.id]
        assert (sub.last_seq, sub.replays, sub.drops) == (2, 1, 0)
        assert book.kv.index.matches(PROMPT, [dep.id]) == {dep.id: 64}  # the chain rebuilt across both batches
        await book.kv.close()

    asyncio.run(run())


def test_missed_batches_no_replay_can_give_drop_the_replicas_index_and_it_fills_again(folder, pubs) -> None:
    async def run() -> None:
        book = ReplicaChooser("kv_events")
        dep = replica(0, folder)
        dep.labels["kv_replay"] = ""  # no replay socket to ask
        pubs[0].send(stored(PROMPT, 10))  # missed
        await asyncio.sleep(0.2)
        book.kv.follow(dep.id, dep)
        await until(lambda: book.kv.live(dep.id), 60)
        await asyncio.sleep(0.3)
        pubs[0].send(stored(PROMPT[: 2 * BS], 20))
        await until(lambda: book.kv.subs[dep.id].batches == 1)
        assert book.kv.subs[dep.id].drops == 1
        assert book.kv.index.matches(PROMPT, [dep.id]) == {dep.id: 32}  # what it said since, not before
        await book.kv.close()

    asyncio.run(run())


def test_a_lost_replica_is_unsubscribed_and_forgotten(folder, pubs) -> None:
    async def run() -> None:
        book = ReplicaChooser("kv_events")
        dep = replica(1, folder)
        book.kv.follow(dep.id, dep)
        await until(lambda: book.kv.live(dep.id), 60)
        await asyncio.sleep(0.3)
        pubs[1].send(stored(PROMPT, 100))
        await until(lambda: book.kv.index.blocks(dep.id) == 4)
        book.kv.follow(dep.id, replica(1, folder, state="failed"))  # lost: the registry says failed
        assert dep.id not in book.kv.subs and book.kv.index.blocks(dep.id) == 0 and not book.kv.index.holders
        await book.kv.close()

    asyncio.run(run())


# -- the index and the choice, without sockets ------------------------------------------------------------------
def index_with(blocks: dict[str, int], max_blocks: int = 1000) -> KvIndex:
    index = KvIndex(max_blocks)
    for rep, n in blocks.items():
        index.stored(rep, list(range(n)), None, PROMPT[: n * BS], BS)
    return index


def test_the_index_is_bounded_per_replica_and_forgets_its_oldest_blocks_first() -> None:
    index = KvIndex(max_blocks=3)
    index.stored("a", [1, 2, 3, 4], None, PROMPT[: 4 * BS], BS)
    assert index.blocks("a") == 3 and len(index.holders) == 3
    assert index.matches(PROMPT, ["a"]) == {"a": 0}  # its first block went first: no prefix reaches the rest
    index.stored("a", [9], 4, [1] * BS, BS)  # its parent (4) is known: indexed, block 2 forgotten
    assert index.describe("a") == {"blocks": 3, "block_size": BS, "stored": 5, "removed": 0, "skipped": 0,
                                   "expected": 0}  # fmt: skip
    index.stored("a", [10], 77, [1] * BS, BS)  # a parent never seen: not indexed
    assert index.describe("a")["skipped"] == 1


def test_blocks_whose_hash_holds_more_than_tokens_are_not_indexed() -> None:
    index = KvIndex()
    index.stored("a", [1, 2], None, PROMPT[: 2 * BS], BS, extra_keys=[None, ("mm-hash", 0)])
    assert index.blocks("a") == 1 and index.describe("a")["skipped"] == 1


def test_the_longest_prefix_wins_until_its_queued_prefill_outweighs_it() -> None:
    book = ReplicaChooser("kv_events", load_weight=1.0)
    deps = [replica(0), replica(1)]
    book.kv.index = index_with({"engine-m-r0": 1, "engine-m-r1": 4})
    book.kv.index.expect_s = 0  # the load term alone: a choice adds no expected blocks
    book.kv.live = lambda _dep: True  # type: ignore[method-assign]
    assert book.choose(deps, None, PROMPT).id == "engine-m-r1"
    assert book.last_choice["costs"] == {"engine-m-r0": len(PROMPT) - 16, "engine-m-r1": len(PROMPT) - 64}
    book.begin("engine-m-r1")  # that request is on r1: its 5 uncached tokens queued there
    for _ in range(10):  # ten more requests of 48 uncached tokens each on r1
        book._chosen["engine-m-r1"] = 48
        book.begin("engine-m-r1")
    assert book.choose(deps, None, PROMPT).id == "engine-m-r0"  # 53 + 485 > 53 + 0 + (64 - 16)
    for _ in range(11):  # requests past their first token no longer wait for the prefill: they decode
        book.end("engine-m-r1", queued=False)
    assert book.choose(deps, None, PROMPT).id == "engine-m-r0"  # ended after their first token: no change
    for _ in range(11):
        book.prefilled("engine-m-r1")  # their first tokens came: the queue is empty
    assert book.choose(deps, None, PROMPT).id == "engine-m-r1"
    book.load_weight = 0.0
    for _ in range(20):
        book._chosen["engine-m-r1"] = 48
        book.begin("engine-m-r1")
    assert book.choose(deps, None, PROMPT).id == "engine-m-r1"  # weight 0: the longest prefix alone


def test_a_prompt_just_routed_is_expected_on_its_replica_until_its_events_come_or_the_wait_passes() -> None:
    # The H200 run of 2026-11-29 (bench/results/2026-11-29-h200-x2-kv-routing): without this, a prefix's second
    # request, sent while the first was still prefilling, saw no holder and was prefilled on the other replica too.
    now = [100.0]
    book = ReplicaChooser("kv_events")  # load_weight 0.5: a queue counts half the tokens a cache saves
    book.kv.index = KvIndex(expect_s=5.0, clock=lambda: now[0])
    book.kv.index.stored("engine-m-r0", [1], None, [9] * BS, BS)  # both replicas' events are live, nothing shared
    book.kv.index.stored("engine-m-r1", [2], None, [8] * BS, BS)
    book.kv.live = lambda _dep: True  # type: ignore[method-assign]
    deps = [replica(0), replica(1)]
    first = book.choose(deps, None, PROMPT)
    book.begin(first.id)  # its prefill is queued there: 69 tokens
    other = next(d for d in deps if d.id != first.id)
    assert book.choose(deps, None, PROMPT).id == first.id  # expected there: 5 + 0.5 x 69 queued < 69 elsewhere
    assert book.last_choice["hits"] == {first.id: 64, other.id: 0}
    assert book.kv.index.describe(first.id)["expected"] == 4
    book.kv.index.stored(first.id, [11, 12], None, PROMPT[: 2 * BS], BS)  # its events confirm two blocks
    assert book.kv.index.describe(first.id)["expected"] == 2
    book.kv.index.removed(first.id, [12])  # and evict one: neither held nor expected any more
    assert book.kv.index.matches(PROMPT, [first.id]) == {first.id: 16}
    book.choose(deps, None, PROMPT)
    now[0] += 5.1  # events never confirmed the rest: after expect_s it is not counted
    assert book.kv.index.matches(PROMPT, [d.id for d in deps]) == {first.id: 16, other.id: 0}


def test_without_live_events_or_token_ids_it_routes_by_prefix_affinity() -> None:
    book = ReplicaChooser("kv_events")
    deps = [replica(0), replica(1)]
    body = {"messages": [{"role": "user", "content": "a question about ferries"}]}
    expected = rendezvous(affinity_key(body, 512), [d.id for d in deps])
    assert book.choose(deps, body, PROMPT).id == expected  # no subscription live
    assert book.last_choice == {"by": "prefix_affinity"}
    book.kv.live = lambda _dep: True  # type: ignore[method-assign]
    assert book.choose(deps, body, None).id == expected  # a prompt without token ids
    assert book.last_choice == {"by": "prefix_affinity"}


def test_a_models_own_routing_overrides_the_gateway_wide_one() -> None:
    book = ReplicaChooser("round_robin")
    book.configure("m", "kv_events")
    assert book.routing_of("m") == "kv_events" and book.routing_of("other") == "round_robin"
    cfg = load_config(text=json.dumps({"gateway": {"replica_routing_models": {"smollm2-135m-instruct": "kv_events"}}}))
    assert cfg.gateway.replica_routing_of("x", "smollm2-135m-instruct") == "kv_events"
    assert cfg.gateway.replica_routing_of("x") == "least_outstanding"
    with pytest.raises(Exception, match="replica_routing_models"):
        load_config(text=json.dumps({"gateway": {"replica_routing_models": {"m": "kv-events"}}}))


# -- the engine's arguments ---------------------------------------------------------------------------------------
def kv_plan(engine: dict | None = None, runtime: str = "ray"):
    cfg = load_config(text=json.dumps({
        "gateway": {"replica_routing_models": {"smollm2-135m-instruct": "kv_events"}},
        "manager": {"runtime": runtime}, "engine": engine or {}}))  # fmt: skip
    return plan_model(cfg, "smollm2-135m-instruct", detect(), load_catalog("0.32"), for_launch=False)


def test_a_ray_model_routed_on_kv_events_publishes_them_and_vllms_parser_accepts_each_replicas_command() -> None:
    plan = kv_plan()
    args = list(plan.args)
    assert json.loads(args[args.index(FLAG) + 1]) == {"enable_kv_cache_events": True, "publisher": "zmq",
                                                      "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
                                                      "topic": "kv"}  # fmt: skip
    assert "--enable-prefix-caching" in args
    assert FLAG not in kv_plan(runtime="local").args  # one engine: nothing to choose among
    replica_args = with_endpoints(args, "ipc:///tmp/vstack-kv-x/events", "ipc:///tmp/vstack-kv-x/replay")
    # The installed vLLM's own serve parser and its own KVEventsConfig, in a child (vLLM's CLI imported there).
    probe = """
import json, sys
from stack.vllm.introspect import check
from vllm.config.kv_events import KVEventsConfig
argv = sys.argv[1:]
made = KVEventsConfig(**json.loads(argv[argv.index("--kv-events-config") + 1]))
print(json.dumps({"parsed": check(["some/model", *argv]), "endpoint": made.endpoint, "replay": made.replay_endpoint}))
"""
    out = subprocess.run([sys.executable, "-c", probe, *replica_args], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "parsed": {"ok": True},
        "endpoint": "ipc:///tmp/vstack-kv-x/events",
        "replay": "ipc:///tmp/vstack-kv-x/replay",
    }


def test_kv_events_with_prefix_caching_off_is_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        kv_plan({"enable_prefix_caching": False})
    assert "enable_prefix_caching" in err.value.message and "least_outstanding" in (err.value.hint or "")


def test_the_plan_says_how_a_ray_models_replicas_are_routed() -> None:
    from stack.planner.cluster import GIB, Demand, NodeRes, check, place
    from stack.planner.stack_planner import runs_on

    plan = kv_plan()
    free = [NodeRes(f"node{i}" + "x" * 30, f"10.0.0.{i}", 8, 0, 64 * GIB) for i in range(2)]
    placement = check(place([Demand(plan.served_name, 2, devices=0, cpus=1, memory=GIB)], free), free)
    cfg = load_config(text=json.dumps({"gateway": {"replica_routing_models": {plan.served_name: "kv_events"}}}))
    where = runs_on(cfg, plan, None, placement)
    assert where.replica_routing == "kv_events" and where.detail.endswith("; replica routing: kv_events")
    assert runs_on(load_config(), plan, None, placement).replica_routing == "least_outstanding"


def test_a_model_without_a_tokenizer_is_said_once_and_its_prompts_have_no_ids(caplog) -> None:
    from stack.gateway.routing.prompt_tokens import PromptTokens

    def missing(path: str):
        raise OSError(f"no tokenizer.json in {path}")

    async def run() -> list:
        tokens = PromptTokens(load=missing)
        tokens.configure("m", "/models/m")
        body = {"messages": [{"role": "user", "content": "hi"}]}
        return [await tokens.of("m", body), await tokens.of("m", body), await tokens.of("other", body)]

    assert asyncio.run(run()) == [None, None, None]
    said = [r.getMessage() for r in caplog.records if "no tokenizer" in r.getMessage()]
    assert len(said) == 1 and "routed by prefix affinity" in said[0] and "/models/m" in said[0]


def test_past_the_balance_threshold_the_least_busy_replica_takes_a_prompt_only_the_other_holds() -> None:
    # One prompt every request shares (an app's system prompt): without the rule every request stays on the
    # replica that cached it first, however many it already runs (bench/kv_routing_sim.py --prefixes 1).
    book = ReplicaChooser("kv_events", balance_threshold=2)
    deps = [replica(0), replica(1)]
    book.kv.index = index_with({"engine-m-r0": 4, "engine-m-r1": 0})  # r1's events live, none of this prompt
    book.kv.live = lambda _dep: True  # type: ignore[method-assign]
    for _ in range(2):  # two in flight on r0, none on r1: within the threshold, the cache decides
        assert book.choose(deps, None, PROMPT).id == "engine-m-r0"
        book.begin("engine-m-r0")
        book.prefilled("engine-m-r0")
    assert book.choose(deps, None, PROMPT).id == "engine-m-r0"
    book.begin("engine-m-r0")  # three in flight: a spread of 3 > 2
    chosen = book.choose(deps, None, PROMPT)
    assert chosen.id == "engine-m-r1" and book.last_choice["by"] == "balance"
    assert book.last_choice["spread"] == 3 and book.last_choice["hits"] == {"engine-m-r0": 64, "engine-m-r1": 0}
    assert book.begin("engine-m-r1")  # its uncached prompt (all of it) is queued on r1 ...
    assert list(book.queued["engine-m-r1"]) == [len(PROMPT)]
    assert book.kv.index.matches(PROMPT, ["engine-m-r1"])["engine-m-r1"] == 64  # ... and expected there now
    book.end("engine-m-r0")
    book.end("engine-m-r0")  # 1 in flight on each: both hold the prompt, so the shorter queue wins (r0's is empty)
    assert book.choose(deps, None, PROMPT).id == "engine-m-r0" and book.last_choice["by"] == "kv_events"
    book.balance_threshold = None
    for _ in range(10):
        book.begin("engine-m-r0")
    book.kv.index = index_with({"engine-m-r0": 4})  # only r0 holds it again
    assert book.choose(deps, None, PROMPT).id == "engine-m-r0"  # no rule: the cache alone, 11 in flight or not
    assert book.choices["m"] == {"kv_events": 5, "balance": 1}  # what /admin/models and the console show
