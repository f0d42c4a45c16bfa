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
def broker(tmp_path) -> Iterator[mh.HandoffBroker]:
    b = mh.HandoffBroker(tmp_path).start()
    try:
        yield b
    finally:
        b.stop()


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


def test_the_composition_root_wires_the_broker_only_where_it_is_asked_for_and_can_work() -> None:
    from types import SimpleNamespace

    from stack.assemble import handoff_broker
    from stack.config import load_config

    def plan(accelerator: str = "gpu", sleep: bool = True, tp: int = 1) -> SimpleNamespace:
        hardware = SimpleNamespace(accelerator=accelerator)
        engine = {"enable_sleep_mode": sleep, "tensor_parallel_size": tp}
        return SimpleNamespace(resolved=SimpleNamespace(name=f"m-tp{tp}", engine=engine, hardware=hardware), env={})

    def stack(tp: int = 1) -> SimpleNamespace:
        return SimpleNamespace(default=plan(), others=[plan(tp=tp), plan("gpu", sleep=False)])

    off = load_config(text='{"manager": {"sleep_handoff": false}}')
    assert handoff_broker(off, stack()) is None
    docker = load_config(text='{"manager": {"sleep_handoff": true, "runtime": "docker"}}')
    assert handoff_broker(docker, stack()) is None  # a container cannot reach this process's socket
    auto = load_config()
    assert auto.manager.sleep_handoff == "auto"  # on by default where it was measured
    assert handoff_broker(auto, stack(tp=2)) is None  # an engine on two GPUs: not measured, off under auto
    for cfg, planned in ((auto, stack()), (load_config(text='{"manager": {"sleep_handoff": true}}'), stack(tp=2))):
        broker = handoff_broker(cfg, planned)
        try:
            assert broker is not None
            sleepers = [planned.default, *planned.others[:1]]
            assert all(p.env[mh.SOCKET_ENV] == broker.path for p in sleepers)
            assert mh.SOCKET_ENV not in planned.others[1].env  # an engine that never sleeps gets nothing
        finally:
            broker.stop()


def test_the_broker_may_hold_an_engines_worth_of_descriptors() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert mh.allow_many_descriptors(4096) == min(4096, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= min(4096, hard) > 1100
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
