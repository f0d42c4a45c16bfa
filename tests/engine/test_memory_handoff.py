"""The GPU memory handoff broker (stack.vllm.plugins.handoff) with real Unix sockets and real descriptors:
memfd files stand in for exported CUDA allocations (the broker never looks inside a descriptor); the CUDA side
runs only on the lent GPU (bench/gpu/handoff_probe.py, bench/gpu/switch_time.sh)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from stack.vllm.plugins import handoff as mh

MIB = 1024**2


@pytest.fixture
def broker() -> Iterator[mh.HandoffBroker]:
    b = mh.HandoffBroker().start()  # in the system temp folder, as the stack: a tmp_path can be too long for AF_UNIX
    try:
        yield b
    finally:
        b.stop()


def test_a_folder_too_long_for_a_unix_socket_is_refused_before_anything_is_made(tmp_path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    with pytest.raises(ValueError, match=r"past the 107 a Unix socket allows; fix: give a shorter folder"):
        mh.HandoffBroker(deep)
    assert list(deep.iterdir()) == []  # no half-made socket folder left behind


def piece(tag: str) -> int:
    fd = os.memfd_create(f"piece-{tag}")
    os.write(fd, tag.encode())
    return fd


def tag_of(fd: int) -> str:
    return os.pread(fd, 64, 0).decode()


def close(fds) -> None:
    for fd in fds:
        os.close(fd)


def test_cover_maps_any_aligned_size_exactly_with_few_pieces() -> None:
    assert mh.cover(2 * MIB) == [2 * MIB]
    assert mh.cover(1002 * MIB) == [512 * MIB] + [32 * MIB] * 15 + [2 * MIB] * 5
    size = 80 * 1024 * MIB + 34 * MIB  # a KV cache: mostly 512 MiB pieces
    assert sum(mh.cover(size)) == size and len(mh.cover(size)) == 160 + 1 + 1
    assert mh.cover(3 * MIB) is None and mh.cover(0) is None  # not on the VMM granularity: not handed over


def test_pieces_are_kept_only_inside_a_window_and_dropped_when_it_closes(broker) -> None:
    sizes = [512 * MIB, 32 * MIB, 32 * MIB]
    mine = [piece(f"a{i}") for i in range(3)]
    assert mh.put_pieces(broker.path, "gpu-0", zip(sizes, mine, strict=True)) is False  # no window: freed as a release
    assert broker.held_bytes() == 0
    broker.open_window("gpu-0")
    assert mh.put_pieces(broker.path, "gpu-0", zip(sizes, mine, strict=True)) is True
    close(mine)  # the engine closes its own descriptors; the broker's keep the memory alive
    assert broker.held_bytes("gpu-0") == 576 * MIB
    got = mh.take_pieces(broker.path, "gpu-0", {32 * MIB: 1, 2 * MIB: 4})
    assert [s for s, _ in got] == [32 * MIB] and tag_of(got[0][1]) in ("a1", "a2")  # the same memory, handed on
    close(fd for _, fd in got)
    assert broker.held_bytes() == 544 * MIB
    assert broker.close_window() == 544 * MIB and broker.held_bytes() == 0
    assert mh.take_pieces(broker.path, "gpu-0", {512 * MIB: 1}) == []


def test_a_device_gets_only_its_own_pieces_and_many_pass_in_batches(broker) -> None:
    broker.open_window()
    mine = [piece(f"p{i}") for i in range(450)]  # more than one message carries
    assert mh.put_pieces(broker.path, "gpu-0", [(2 * MIB, fd) for fd in mine])
    close(mine)
    assert mh.take_pieces(broker.path, "gpu-1", {2 * MIB: 10}) == []
    got = mh.take_pieces(broker.path, "gpu-0", {2 * MIB: 1000})
    assert len(got) == 450 and sorted(tag_of(fd) for _, fd in got) == sorted(f"p{i}" for i in range(450))
    close(fd for _, fd in got)
    assert broker.held_bytes() == 0


def test_another_user_is_refused(broker, monkeypatch) -> None:
    broker.open_window()
    monkeypatch.setattr(mh.os, "getuid", lambda: os.geteuid() + 1)  # the broker now sees a stranger
    mine = [piece("x")]
    assert mh.put_pieces(broker.path, "gpu-0", [(2 * MIB, mine[0])]) is False
    close(mine)
    assert broker.held_bytes() == 0 and broker.stats["refused_peers"] == 1


def test_no_broker_means_release_and_fresh_memory(tmp_path) -> None:
    mine = [piece("y")]
    assert mh.put_pieces(str(tmp_path / "none.sock"), "gpu-0", [(2 * MIB, mine[0])]) is False
    assert mh.take_pieces(str(tmp_path / "none.sock"), "gpu-0", {2 * MIB: 1}) == []
    close(mine)


def test_the_socket_is_ours_alone(broker) -> None:
    assert os.stat(os.path.dirname(broker.path)).st_mode & 0o777 == 0o700
    broker.stop()
    assert not os.path.exists(broker.path)


def test_the_plan_decides_the_handoff_and_the_gateway_opens_it_only_there(tmp_path, monkeypatch) -> None:
    from stack.assemble.planning import Launch
    from stack.assemble.runtimes import handoff_broker
    from stack.config import load_config
    from stack.engine.launch import engine_spec
    from stack.hardware import detect
    from stack.planner.model_planner import plan_model
    from stack.planner.plans import StackPlan, VllmBuild
    from stack.planner.stack_planner import decide_handoff
    from tests.conftest import load_catalog

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the gateway unpinned: engines count from GPU 0
    catalog = load_catalog("0.32")
    base = plan_model(load_config(), "smollm2-135m-instruct", detect(), catalog, for_launch=False)

    def plan(sleep: bool = True, tp: int = 1):
        return base.model_copy(update={"profile": f"m-tp{tp}-{sleep}", "served_name": f"m-tp{tp}-{sleep}",
                                       "can_sleep": sleep, "engine": {**base.engine, "tensor_parallel_size": tp}})

    def three(tp: int = 1) -> list:
        return [plan(), plan(tp=tp), plan(sleep=False)]

    def handed(cfg, plans) -> list[bool]:
        return [p.handoff for p in decide_handoff(cfg, plans, catalog)[0]]

    assert handed(load_config(text='{"manager": {"sleep_handoff": false}}'), three()) == [False] * 3
    docker = load_config(text='{"manager": {"sleep_handoff": true, "runtime": "docker"}}')
    assert handed(docker, three()) == [False] * 3  # a container cannot reach the gateway's socket
    auto = load_config()
    assert auto.manager.sleep_handoff == "auto"  # on by default where it was measured
    plans, note = decide_handoff(auto, three(tp=2), catalog)  # an engine on two GPUs: not measured, off under auto
    assert [p.handoff for p in plans] == [False] * 3 and note and note.startswith("sleep handoff off")
    pin = lambda p, gpu: p.model_copy(update={"env": {**p.env, "CUDA_VISIBLE_DEVICES": gpu}})  # noqa: E731
    pinned = [pin(p, gpu) for p, gpu in zip(three(), "012", strict=True)]
    forced = load_config(text='{"manager": {"sleep_handoff": true}}')
    plans, note = decide_handoff(forced, pinned, catalog)  # one GPU's memory pieces cannot back another's engine
    assert [p.handoff for p in plans] == [False] * 3 and "pinned to different GPUs" in (note or "")
    # One GPU named differently: pinned to "0", unpinned (the first GPU), " 0,1" for an engine of one GPU.
    same = [pin(three()[0], "0"), three()[1], pin(three()[2], " 0,1")]
    plans, note = decide_handoff(forced, same, catalog)
    assert [p.handoff for p in plans] == [True, True, False] and note and "between 2 engines" in note
    plans, note = decide_handoff(forced, [pin(three()[0], "1"), three()[1]], catalog)  # GPU 1 and the first GPU
    assert not any(p.handoff for p in plans) and "'0', '1'" in (note or "")
    for cfg, given in ((auto, three()), (load_config(text='{"manager": {"sleep_handoff": true}}'), three(tp=2))):
        plans, note = decide_handoff(cfg, given, catalog)
        assert [p.handoff for p in plans] == [True, True, False] and note and "between 2 engines" in note
        assert plans[0].fingerprint != given[0].fingerprint  # the socket changes the engine's environment
        stack = StackPlan(config=cfg, hardware=detect(), vllm=VllmBuild(distribution="vllm", version="0.32.0"),
                          models=tuple(plans))  # fmt: skip
        broker = handoff_broker(Launch(stack))
        try:
            assert broker is not None
            envs = [engine_spec(p, tmp_path / "e.log", handoff_socket=broker.path).env for p in plans]
            assert [e.get(mh.SOCKET_ENV) for e in envs] == [broker.path, broker.path, None]  # a non-sleeper: none
        finally:
            broker.stop()
    unhanded = StackPlan(config=auto, hardware=detect(), vllm=VllmBuild(distribution="vllm", version="0.32.0"),
                         models=tuple(three()))  # fmt: skip
    assert handoff_broker(Launch(unhanded)) is None


def test_the_broker_may_hold_an_engines_worth_of_descriptors() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert mh.allow_many_descriptors(4096) == min(4096, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= min(4096, hard) > 1100
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_gateways_shutdown_stops_the_engines_then_closes_the_broker() -> None:
    """The gateway awaits each shutdown hook with its state (stack.gateway.app): the broker's own stop() takes
    none and returns nothing, so it is wrapped. Found on a real H200: every shutdown of a two-model gateway failed
    with a TypeError there, and the hooks after it (the liveness watch, the upstream pool) never ran."""
    import asyncio
    from types import SimpleNamespace

    from stack.assemble.runtimes import shutdown_hooks

    order: list[str] = []

    async def stop_engines(state: object) -> None:
        order.append("engines")

    broker = mh.HandoffBroker().start()
    sup = SimpleNamespace(stop=stop_engines, manager=SimpleNamespace(handoff=broker))

    async def shut_down() -> None:
        for hook in shutdown_hooks(sup):  # type: ignore[arg-type]
            await hook(object())
            order.append("hook")

    assert os.path.exists(broker.path)
    asyncio.run(shut_down())
    assert order == ["engines", "hook", "hook"] and not os.path.exists(broker.path)
    alone = SimpleNamespace(stop=stop_engines, manager=SimpleNamespace(handoff=None))
    assert shutdown_hooks(alone) == [stop_engines]  # type: ignore[arg-type]
