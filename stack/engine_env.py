"""The environment of an engine and of any child process run in the engine's Python (`engine_python`).

Two jobs (adr/0020-engine-isolation-and-tenant-integrity.md):
- our package goes first on its path, the caller's entries kept after it (a GPU site's packages may only
  be reachable through them);
- the gateway's secrets stay out: its own keys (VSTACK_API_KEY, VSTACK_ADMIN_KEY, any variable the config
  names for a key) and every provider key. An engine runs model code and answers anyone holding its key;
  what it never had, it cannot leak (/proc/<pid>/environ, a crash dump, a remote-code model).
The engine's own credential travels as VLLM_API_KEY (vLLM reads it; argv would show it in `ps`).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
ENGINE_KEY_ENV = "VLLM_API_KEY"  # vLLM's own variable for --api-key (envs.py); the gateway holds the value
GATEWAY_SECRETS = ("VSTACK_API_KEY", "VSTACK_ADMIN_KEY", "VSTACK_METRICS_KEY")
# Names that look like credentials (OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN, DB_PASSWORD, SMTP_PASS,
# a *_KEY, a DATABASE_URL or *_DSN that carries a password ...). A deny list, not an allow list (adr/0039): an
# allow list would drop what a site's engines need under names nobody listed (NCCL_*, a scheduler's, a driver's);
# a secret under a name none of these match still reaches engines: docs/guides/security.md says so.
_SECRET_NAME = re.compile(
    r"API_?KEY|SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|_PASS$|CREDENTIAL|PRIVATE|ACCESS_KEY|"
    r"AUTH|COOKIE|SESSION_KEY|_KEY$|DATABASE_URL|_DSN$|CONNECTION_STRING",
    re.I,
)
# What an engine may need although it looks like a secret: the Hub token to fetch gated models.
ENGINE_MAY_READ = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
# The one `__main__` of the stack's child processes (stack/entrypoints/run.py): named here, below every layer
# that starts a child, which may not import the entry points above them; tests/test_children.py checks it.
RUN_ENTRY = "stack.entrypoints.run"


def child_args(module: ModuleType) -> list[str]:
    """What follows the Python of a child process that runs `module`'s main(): `-m stack.entrypoints.run
    MODULE`. Children are named by module object, so a module that moves takes its command along."""
    return ["-m", RUN_ENTRY, module.__name__]


def child_argv(python: str, module: ModuleType, *args: str) -> list[str]:
    """The whole command of a child process running `module`'s main() with `args` in `python`."""
    return [python, *child_args(module), *args]


def new_engine_key() -> str:
    """A fresh credential for one engine: only the gateway that started it holds it."""
    return secrets.token_urlsafe(32)


def is_secret(name: str, also: Iterable[str] = ()) -> bool:
    """True for a variable an engine must not inherit: ours, one the config names for a key (`also`),
    or one whose name says it is a credential."""
    if name in ENGINE_MAY_READ:
        return False
    if name in GATEWAY_SECRETS or name in set(also):
        return True
    if name.startswith("VLLM_") and name != ENGINE_KEY_ENV:
        return False  # vLLM's own settings (none is a credential of ours)
    return bool(_SECRET_NAME.search(name))


def without_secrets(environ: Mapping[str, str], also: Iterable[str] = ()) -> dict[str, str]:
    """`environ` less every secret (is_secret); `also`: more names to drop (the config's key variables)."""
    extra = set(also)
    return {k: v for k, v in environ.items() if not is_secret(k, extra)}


def engine_environ(extra: Mapping[str, str], key: str | None = None, also: Iterable[str] = (),
                   base: Mapping[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """An engine's whole environment: this process's (or `base`) less the secrets, plus the plan's own
    variables (`extra`: set on purpose by the profile, so kept), plus its credential as VLLM_API_KEY."""
    env = {**without_secrets(os.environ if base is None else base, also), **extra}
    env.pop(ENGINE_KEY_ENV, None)
    if key:
        env[ENGINE_KEY_ENV] = key
    return env


def engine_python_env(keep_secrets: bool = False, **extra: str) -> dict[str, str]:
    """This process's env (less the secrets, unless `keep_secrets`: a client of the gateway, such as the
    benchmark worker, may need its key), plus `extra`, with the stack's package root first on PYTHONPATH."""
    env = {**(os.environ if keep_secrets else without_secrets(os.environ)), **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env


def visible_gpus(env: Mapping[str, str], count: int) -> list[int] | None:
    """The GPU indices an engine of `count` GPUs uses by its CUDA_VISIBLE_DEVICES: the first `count` listed (vLLM's
    ranks take the visible devices in order); None when unset or not a list of indices (UUIDs, MIG names: GPUs we
    cannot place it on by index)."""
    parts = [p.strip() for p in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if p.strip()]
    return [int(p) for p in parts[: max(1, count)]] if parts and all(p.isdigit() for p in parts) else None
