"""One model's replicas on a Ray cluster, driven by the model manager as one Runtime.

Each replica is an EngineHost actor (stack.engine.ray_host) on the node the cluster planner chose
(stack.planner.cluster), its resources reserved by a placement group pinned to that node: all of a
replica's resources or none. A pipeline-parallel replica (model larger than one node) reserves only its
API server's CPU on its first node; vLLM's Ray executor (`distributed_executor_backend: ray`) reserves
the workers' GPUs on every node in one placement group of its own.

A watch thread asks every replica's /health and its actor: a replica that stops answering, or whose
actor or node is gone, is `lost` (listeners hear it at once: the gateway stops routing to it) and, with
`manager.ray.restore`, placed again where the cluster has room. When the head is gone the replicas keep
serving (their HTTP never goes through Ray); `control_plane` says `down` and nothing is restored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from stack.config.sections.manager import RayRuntimeConfig
from stack.engine import ray_cluster
from stack.engine.process import EngineSpec
from stack.engine_env import ENGINE_KEY_ENV
from stack.errors import EngineError
from stack.planner.cluster import Demand, ReplicaPlace, place
from stack.planner.disaggregation_args import for_phase

log = logging.getLogger("stack.engine.ray")
LOST_AFTER = 3  # failed health checks in a row


@dataclass
class Replica:
    index: int
    place: ReplicaPlace
    state: str = "stopped"  # starting, ready, lost, stopped
    detail: str = ""
    url: str = ""
    pid: int | None = None
    node_id: str = ""
    actor: object = None
    pg: object = None
    fails: int = 0
    since: float = field(default_factory=time.time)
    kv_events: str = ""  # where its engine's KV events are subscribed to (gateway.replica_routing: kv_events)
    kv_replay: str = ""
    phase: str = ""  # prefill or decode: a disaggregated model's engine (adr/0052); "" serves whole requests
    side_channel: str = ""  # its NIXL side channel, host:port

    def public(self) -> dict:
        return {"replica": self.index, "state": self.state, "detail": self.detail, "url": self.url,
                "node": self.node_id[:8] or (self.place.nodes[0][:8] if self.place.nodes else ""),
                "nodes": [n[:8] for n in self.place.nodes], "pid": self.pid,
                "tensor_parallel": self.place.tensor_parallel, "pipeline_parallel": self.place.pipeline_parallel,
                "placed_because": self.place.reason, "for_s": round(time.time() - self.since, 1),
                "kv_events": self.kv_events, "kv_replay": self.kv_replay, "phase": self.phase,
                "side_channel": self.side_channel}  # fmt: skip


@dataclass
class RaySetSpec:
    name: str
    engine: EngineSpec
    replicas: list[Replica]

    @property
    def base_url(self) -> str:
        """The first ready replica (the manager's single address); the gateway routes among all of them."""
        ready = [r.url for r in self.replicas if r.state == "ready"]
        return ready[0] if ready else ""

    @property
    def log_path(self) -> Path:
        return self.engine.log_path

    @property
    def api_key(self) -> str | None:
        return self.engine.api_key


Listener = Callable[[list[dict]], None]


class RayReplicaSet:
    runtime_kind = "ray"
    owns_process = True

    def __init__(self, engine: EngineSpec, places: list[ReplicaPlace], demand: Demand, cfg: RayRuntimeConfig,
                 gpu: bool = False, phases: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.phases = phases  # by replica index: a disaggregated model's prefill and decode engines
        self.spec = RaySetSpec(engine.name, engine, [self._replica(p) for p in places])
        self.demand = demand
        self.cfg = cfg
        self.gpu = gpu
        self.control_plane = "up"
        self.restored = 0
        self._listeners: list[Listener] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        self._gave_up = False
        self._restoring: set[int] = set()

    def _replica(self, p: ReplicaPlace) -> Replica:
        return Replica(p.index, p, phase=self.phases[p.index] if p.index < len(self.phases) else "")

    # -- events -------------------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> None:
        """`listener(replicas)` after every replica change, from the watch thread: hop to your loop."""
        self._listeners.append(listener)

    def replicas(self) -> list[dict]:
        with self._lock:
            return [r.public() for r in self.spec.replicas]

    def _changed(self) -> None:
        snapshot = self.replicas()
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:  # a listener's bug must not stop the watch; logged
                log.exception("replica listener failed")

    def _move(self, r: Replica, state: str, detail: str = "") -> None:
        with self._lock:
            r.state, r.detail, r.since = state, detail, time.time()
        log.info("%s replica %d: %s %s", self.spec.name, r.index, state, detail)
        self._changed()

    # -- Runtime ------------------------------------------------------------------------------------
    def start(self) -> int:
        """Launch every replica where planned; a set made for a restart (no places) is placed on the
        cluster as it is now, or refused (EngineError) if it no longer fits."""
        ray_cluster.connect(self.cfg)
        if not self.spec.replicas:
            nodes = ray_cluster.nodes()
            got = place([self.demand], nodes)
            if got.refused:
                raise EngineError(f"engine {self.spec.name!r}: the cluster cannot hold it now: "
                                  + "; ".join(got.refused), hint="add nodes or free resources (ray status)")
            self.spec.replicas = [self._replica(p) for p in got.places]
        self._stop.clear()
        self._gave_up = False
        for r in self.spec.replicas:
            self._launch(r)
        return 0

    def wait_ready(self, timeout: float) -> float:
        """Every replica answers /health (all or nothing at start: a partial set is stopped)."""
        started = time.monotonic()
        with httpx.Client(timeout=2.0) as http:
            pending = [r for r in self.spec.replicas if r.state == "starting"]
            while pending:
                elapsed = time.monotonic() - started
                for r in list(pending):
                    code = self._exit_code(r)
                    if code is not None:
                        tail = self._logs(r)
                        self.stop(5)
                        raise EngineError(f"engine {self.spec.name!r} replica {r.index} on node {r.node_id[:8]} "
                                          f"exited with code {code} while starting", log_tail=tail,
                                          hint=f"read its log on that node: {self.spec.log_path}")  # fmt: skip
                    if _healthy(http, r.url):
                        self._move(r, "ready", f"node {r.node_id[:8]}, pid {r.pid}, ready in {elapsed:.1f} s")
                        pending.remove(r)
                if elapsed > timeout:
                    tail = self._logs(pending[0])
                    self.stop(5)
                    raise EngineError(f"engine {self.spec.name!r}: {len(pending)} replica(s) not ready after "
                                      f"{timeout:.0f} s; stopped them", log_tail=tail,
                                      hint="raise startup_timeout_s, or read the replicas' logs on their nodes")
                time.sleep(0.5)
        self._watch = threading.Thread(target=self._watch_loop, name=f"ray watch {self.spec.name}", daemon=True)
        self._watch.start()
        return time.monotonic() - started

    def stop(self, grace: float = 20) -> list[int]:
        self._stop.set()
        left: list[int] = []
        for r in self.spec.replicas:
            left += self._end(r, grace)
            if r.state != "stopped":
                self._move(r, "stopped", "stopped")
        return left

    def exit_code(self) -> int | None:
        """1 once no replica serves and none can be restored (the manager then restarts or fails it)."""
        return 1 if self._gave_up else None

    def sleep(self, level: int = 1, timeout: float = 120) -> None:
        raise EngineError(f"engine {self.spec.name!r}: replicas on Ray are stopped, not put to sleep")

    def wake_up(self, tags: list[str] | None = None, timeout: float = 120) -> None:
        raise EngineError(f"engine {self.spec.name!r}: replicas on Ray do not sleep")

    def is_sleeping(self) -> bool:
        return False

    def logs(self, lines: int = 40) -> str:
        return "\n".join(f"[replica {r.index}] {self._logs(r, lines)}" for r in self.spec.replicas if r.actor)

    def describe(self) -> dict:
        """For /admin/models: every replica (node, state, address) and whether Ray's head answers."""
        return {"replicas": self.replicas(), "control_plane": self.control_plane, "restored": self.restored,
                "wanted": len(self.spec.replicas)}  # fmt: skip

    # -- one replica ---------------------------------------------------------------------------------
    def _launch(self, r: Replica) -> None:
        ray = ray_cluster.import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        from stack.engine.ray_host import EngineHost

        p = r.place
        self._move(r, "starting", f"placing on node {p.nodes[0][:8]}: {p.reason}")
        argv, env = for_phase(list(self.spec.engine.argv), r.phase), dict(self.spec.engine.env)
        if self.spec.engine.api_key:  # every replica answers the set's one key (the gateway's)
            env[ENGINE_KEY_ENV] = self.spec.engine.api_key
        cpus = self.demand.cpus
        drop: tuple[str, ...] = self.spec.engine.drop_env
        if p.pipeline_parallel > 1:
            drop = (*drop, "CUDA_VISIBLE_DEVICES")
            # vLLM's Ray executor places the workers (its own placement group, all or nothing); the actor
            # holds the API server's CPU on the first stage's node.
            argv += ["--distributed-executor-backend", "ray", "--pipeline-parallel-size", str(p.pipeline_parallel),
                     "--tensor-parallel-size", str(p.tensor_parallel)]  # fmt: skip
            env["RAY_ADDRESS"] = ray_cluster.gcs_address()
            options = {"num_cpus": cpus, "scheduling_strategy": NodeAffinitySchedulingStrategy(p.nodes[0], soft=False)}
        else:
            bundle = {"CPU": cpus, **({"GPU": float(p.tensor_parallel)} if self.gpu else {})}
            r.pg = placement_group([bundle], strategy="STRICT_PACK", name=f"vstack-{self.spec.name}-{r.index}",
                                   bundle_label_selector=[{"ray.io/node-id": p.nodes[0]}])  # fmt: skip
            if not r.pg.wait(self.cfg.placement_timeout_s):
                self._end(r, 0)
                raise EngineError(f"engine {self.spec.name!r} replica {r.index}: node {p.nodes[0][:8]} did not "
                                  f"grant {bundle} within {self.cfg.placement_timeout_s:.0f} s",
                                  hint="the cluster changed since planning (ray status); start again")  # fmt: skip
            options = {"num_cpus": cpus, "num_gpus": float(p.tensor_parallel) if self.gpu else 0,
                       "scheduling_strategy": PlacementGroupSchedulingStrategy(r.pg, placement_group_bundle_index=0)}
        r.actor = ray.remote(EngineHost).options(max_restarts=0, **options).remote()
        log_path = str(self.spec.log_path.with_name(f"{self.spec.log_path.stem}-r{r.index}.log"))
        try:
            got = ray.get(r.actor.start.remote(argv, env, log_path, self.cfg.engine_host, drop),
                          timeout=self.cfg.placement_timeout_s)  # fmt: skip
        except Exception as exc:  # Ray's errors (actor died, timeout): the replica did not start
            self._end(r, 0)
            raise EngineError(f"engine {self.spec.name!r} replica {r.index}: its actor did not start "
                              f"({type(exc).__name__}: {exc})") from exc
        r.url, r.pid, r.node_id, r.fails = f"http://{got['host']}:{got['port']}", got["pid"], got["node_id"], 0
        r.kv_events, r.kv_replay = got.get("kv_events", ""), got.get("kv_replay", "")
        r.side_channel = got.get("side_channel", "")
        self._move(r, "starting", f"node {r.node_id[:8]}, pid {r.pid}")

    def _exit_code(self, r: Replica) -> int | None:
        ray = ray_cluster.import_ray()
        try:
            return ray.get(r.actor.exit_code.remote(), timeout=5)  # type: ignore[union-attr]
        except Exception as exc:  # the actor (its node) is gone: the engine died with it (PDEATHSIG)
            if _timed_out(exc):
                return None
            return -1

    def _logs(self, r: Replica, lines: int = 40) -> str:
        ray = ray_cluster.import_ray()
        try:
            return str(ray.get(r.actor.logs.remote(lines), timeout=5))  # type: ignore[union-attr]
        except Exception:  # its node is gone; its log went with it
            return "(log unavailable: the replica's node is gone)"

    def _end(self, r: Replica, grace: float) -> list[int]:
        """Stop the engine, the actor and the placement group; whatever of them is gone already is skipped."""
        ray = ray_cluster.import_ray()
        from ray.util.placement_group import remove_placement_group

        left: list[int] = []
        # Whatever is gone already (a lost node's actor, a lost head's placement groups) is skipped.
        if r.actor is not None:
            with contextlib.suppress(Exception):
                left = ray.get(r.actor.stop.remote(grace), timeout=grace + 10)  # type: ignore[union-attr]
            with contextlib.suppress(Exception):
                ray.kill(r.actor)
            r.actor = None
        if r.pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(r.pg)
            r.pg = None
        return left

    # -- watching and restoring ------------------------------------------------------------------------
    def _watch_loop(self) -> None:
        with httpx.Client(timeout=2.0) as http:
            while not self._stop.wait(self.cfg.health_interval_s):
                self._check_head()
                for r in list(self.spec.replicas):
                    if r.state == "ready":
                        self._check(http, r)
                    elif (r.state == "lost" and self.cfg.restore and self.control_plane == "up"
                          and r.index not in self._restoring):
                        self._restoring.add(r.index)  # its own thread: the others stay watched meanwhile
                        threading.Thread(target=self._restore, args=(r,), daemon=True,
                                         name=f"ray restore {self.spec.name}-{r.index}").start()
                if not any(r.state in ("ready", "starting") for r in self.spec.replicas) and not self.cfg.restore:
                    self._gave_up = True

    def _check_head(self) -> None:
        state = "up" if ray_cluster.head_reachable() else "down"
        if state != self.control_plane:
            log.warning("%s: Ray control plane %s", self.spec.name, state)
            self.control_plane = state
            self._changed()

    def _check(self, http: httpx.Client, r: Replica) -> None:
        if _healthy(http, r.url):
            r.fails = 0
            return
        r.fails += 1
        gone = self.control_plane == "up" and self._exit_code(r) is not None
        if gone or r.fails >= LOST_AFTER:
            self._move(r, "lost", "its engine, actor or node is gone" if gone else f"{r.fails} health checks failed")
            self._end(r, 2)

    def _restore(self, r: Replica) -> None:
        try:
            self._restore_once(r)
        finally:
            self._restoring.discard(r.index)

    def _restore_once(self, r: Replica) -> None:
        held: dict[str, int] = {}
        for other in self.spec.replicas:
            if other.state in ("ready", "starting") and other.node_id:
                held[other.node_id] = held.get(other.node_id, 0) + 1
        nodes = ray_cluster.nodes()
        spot = place([dataclasses.replace(self.demand, replicas=1)], nodes, held, first_index=r.index)
        if spot.refused:
            if r.detail != "waiting for room":
                self._move(r, "lost", "waiting for room")
            time.sleep(2)
            return
        r.place = spot.places[0]
        try:
            self._launch(r)
            with httpx.Client(timeout=2.0) as http:
                deadline = time.monotonic() + 900
                while not self._stop.is_set() and time.monotonic() < deadline:
                    if self._exit_code(r) is not None:
                        raise EngineError(f"replica {r.index} exited while restoring")
                    if _healthy(http, r.url):
                        self.restored += 1
                        self._move(r, "ready", f"restored on node {r.node_id[:8]}, pid {r.pid}")
                        return
                    time.sleep(0.5)
            raise EngineError(f"replica {r.index} not ready in time")
        except EngineError as exc:
            self._end(r, 2)
            self._move(r, "lost", f"restore failed: {exc.message}")


def _healthy(http: httpx.Client, url: str) -> bool:
    if not url:
        return False
    try:
        return http.get(f"{url}/health").status_code == 200
    except httpx.HTTPError:
        return False


def _timed_out(exc: Exception) -> bool:
    return type(exc).__name__ in ("GetTimeoutError", "TimeoutError")
