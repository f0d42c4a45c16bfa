"""The gateway's subscriptions to its replicas' KV events, which fill the index (stack.gateway.routing.kv_index).

One SUB socket per replica whose deployment carries a `kv_events` label (its engine publishes: the Ray host
picked the endpoints, stack.planner.kv_events_args). Batches are decoded with vLLM's own classes
(vllm.distributed.kv_events.KVEventBatch, msgspec): no copy of the wire format lives here. Importing them
imports vLLM (torch: seconds and hundreds of MB), so it happens once, in a thread, when the first replica
publishes; until then the model is routed by prefix affinity.

Every batch has a sequence number. A subscriber that joins late (ZMQ drops what a publisher sent before the
connection) or misses batches asks vLLM's replay socket for them from the first one it lacks; if the replay
cannot give them all (vLLM keeps `buffer_steps` batches), the replica's index is dropped and filled again from
the events that follow: blocks the index does not know are only a missed hit, never a wrong one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stack.gateway.registry import Deployment
from stack.gateway.routing.kv_index import KvIndex

log = logging.getLogger("stack.gateway.routing.kv_events")
TOPIC = b"kv"  # stack.planner.kv_events_args sets it
REPLAY_TIMEOUT_S = 2.0
END_SEQ = -1  # vLLM's replay ends with this sequence number


@dataclass
class VllmEvents:
    """vLLM's event classes and a decoder for its batches."""

    decode: Callable[[bytes], Any]
    stored: type
    removed: type
    cleared: type


def load_vllm_events() -> VllmEvents:
    import msgspec
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    return VllmEvents(msgspec.msgpack.Decoder(type=KVEventBatch).decode, BlockStored, BlockRemoved, AllBlocksCleared)


@dataclass
class Subscription:
    endpoint: str
    replay: str
    task: asyncio.Task | None = None
    state: str = "connecting"  # connecting, live, failed
    last_seq: int | None = None
    batches: int = 0
    replays: int = 0
    drops: int = 0  # times its index was dropped: batches missed and not replayed


class KvEvents:
    def __init__(self, index: KvIndex, load: Callable[[], VllmEvents] = load_vllm_events) -> None:
        self.index = index
        self._load = load
        self._vllm: VllmEvents | None = None
        self._loading: asyncio.Task | None = None
        self.subs: dict[str, Subscription] = {}
        self._ctx: Any = None

    # -- which replicas --------------------------------------------------------------------------------------------
    def follow(self, dep_id: str, dep: Deployment | None) -> None:
        """A registry change (from the gateway's loop): subscribe to a ready replica that publishes, resubscribe
        when its endpoint changed (a restarted replica), forget one that is gone or not ready."""
        endpoint = dep.labels.get("kv_events", "") if dep is not None and dep.state == "ready" else ""
        sub = self.subs.get(dep_id)
        if sub is not None and sub.endpoint == endpoint:
            return
        if sub is not None:
            self._stop(dep_id)
        if endpoint and dep is not None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a registry changed outside the gateway's loop (a test's): nothing to listen with
                return
            self.subs[dep_id] = sub = Subscription(endpoint, dep.labels.get("kv_replay", ""))
            sub.task = loop.create_task(self._run(dep_id, sub), name=f"kv events {dep_id}")

    def _stop(self, dep_id: str) -> None:
        sub = self.subs.pop(dep_id, None)
        if sub is not None and sub.task is not None:
            sub.task.cancel()
        self.index.drop(dep_id)

    def live(self, dep_id: str) -> bool:
        sub = self.subs.get(dep_id)
        return sub is not None and sub.state == "live"

    def describe(self, dep_id: str) -> dict[str, Any] | None:
        sub = self.subs.get(dep_id)
        if sub is None:
            return None
        return {"state": sub.state, "batches": sub.batches, "replays": sub.replays, "drops": sub.drops,
                **self.index.describe(dep_id)}  # fmt: skip

    async def close(self) -> None:
        for dep_id in list(self.subs):
            self._stop(dep_id)

    # -- one replica -----------------------------------------------------------------------------------------------
    async def vllm_events(self) -> VllmEvents:
        if self._vllm is None:
            if self._loading is None:
                self._loading = asyncio.get_running_loop().create_task(asyncio.to_thread(self._load))
            self._vllm = await asyncio.shield(self._loading)
        return self._vllm

    def context(self) -> Any:
        if self._ctx is None:
            import zmq.asyncio

            self._ctx = zmq.asyncio.Context()
        return self._ctx

    async def _run(self, dep_id: str, sub: Subscription) -> None:
        import zmq

        try:
            events = await self.vllm_events()
        except Exception as exc:  # no vLLM in the gateway's Python: routed by prefix affinity
            sub.state = "failed"
            log.warning("KV events of %s not read: vLLM's event classes cannot be imported (%s: %s); its model "
                        "is routed by prefix affinity", dep_id, type(exc).__name__, exc)  # fmt: skip
            return
        sock = self.context().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, TOPIC)
        sock.connect(sub.endpoint)
        sub.state = "live"
        try:
            while True:
                _topic, seq_bytes, payload = await sock.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if sub.last_seq is not None and seq <= sub.last_seq:
                    continue  # replayed already
                want = 0 if sub.last_seq is None else sub.last_seq + 1
                if seq != want:
                    await self._catch_up(dep_id, sub, events, want)
                    if sub.last_seq is not None and seq <= sub.last_seq:
                        continue
                self.apply(dep_id, events, events.decode(payload))
                sub.last_seq, sub.batches = seq, sub.batches + 1
        except asyncio.CancelledError:
            raise
        except Exception:
            sub.state = "failed"
            log.exception("KV events of %s: the subscription stopped; its model is routed by prefix affinity", dep_id)
            self.index.drop(dep_id)
        finally:
            sock.close(0)

    async def _catch_up(self, dep_id: str, sub: Subscription, events: VllmEvents, want: int) -> None:
        """Batches `want`.. from vLLM's replay socket; when they are not all there any more, the replica's index
        is dropped first (what follows is still right; blocks stored before are missed hits)."""
        import zmq

        got: list[tuple[int, bytes]] = []
        if sub.replay:
            sock = self.context().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(sub.replay)
            try:
                await sock.send_multipart([b"", want.to_bytes(8, "big")])
                while True:
                    frames = await asyncio.wait_for(sock.recv_multipart(), REPLAY_TIMEOUT_S)
                    seq = int.from_bytes(frames[-2], "big", signed=True)
                    if seq == END_SEQ:
                        break
                    got.append((seq, frames[-1]))
            except TimeoutError:
                log.warning("KV events of %s: the replay socket %s did not answer", dep_id, sub.replay)
            finally:
                sock.close(0)
        sub.replays += 1
        if not got or got[0][0] != want:
            sub.drops += 1
            self.index.drop(dep_id)
            log.info("KV events of %s: batches from %d missed and not replayed; its index starts again", dep_id, want)
        for seq, payload in got:
            if sub.last_seq is None or seq > sub.last_seq:
                self.apply(dep_id, events, events.decode(payload))
                sub.last_seq, sub.batches = seq, sub.batches + 1

    def apply(self, dep_id: str, events: VllmEvents, batch: Any) -> None:
        """One KVEventBatch into the index."""
        for ev in batch.events:
            if getattr(ev, "group_idx", None) not in (None, 0):
                continue  # a hybrid model's other KV groups: the first one names the prefix
            if isinstance(ev, events.stored):
                self.index.stored(dep_id, ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size,
                                  ev.medium, ev.lora_name, ev.extra_keys)  # fmt: skip
            elif isinstance(ev, events.removed):
                self.index.removed(dep_id, ev.block_hashes, ev.medium)
            elif isinstance(ev, events.cleared):
                self.index.cleared(dep_id)
