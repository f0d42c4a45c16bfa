"""What counts as secret, decided in one place for every output (`config render`, its --json, logs, errors).

By what is secret, not by how it is named: an environment value is shown only when its *name* is on the
list of variables known to hold no secret (the ones vLLM and the stack set for the engine); every other
value is `***`, whatever its name (`*_PASSWORD`, `*_CREDENTIALS`, `DATABASE_URL`, ...). Configuration
keys are secret when the schema says so (a `SecretStr` field, or `json_schema_extra={"secret": True}`),
and engine options when vLLM's option holds a credential.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

from pydantic import BaseModel, SecretStr

MASK = "***"
# Variables whose values are settings, never credentials. Anything else is masked.
SAFE_ENV = frozenset({
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_SGL_KERNEL",
    "VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_LOGGING_LEVEL", "VLLM_PLUGINS",
    "VLLM_ATTENTION_BACKEND", "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_USE_V1", "VLLM_CACHE_ROOT",
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_TARGET_DEVICE",
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_ENABLE_HF_TRANSFER",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "PYTORCH_CUDA_ALLOC_CONF", "NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME",
    "VSTACK_RUNTIME_PATCHES", "VSTACK_DISABLE_PATCHES", "PYTHONUNBUFFERED", "LD_PRELOAD", "VLLM_DISABLED_KERNELS",
    "OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",  # tracing (adr/0042); its headers stay masked
    "VLLM_USE_FLASHINFER_SAMPLER", "VSTACK_SLEEP_KEEP_HOST_COPY", "VSTACK_SLEEP_HANDOFF_SOCKET",
})  # fmt: skip
# vLLM options whose values are credentials (or name a private key file).
SECRET_OPTIONS = frozenset({"api_key", "hf_token", "ssl_keyfile", "ssl_keyfile_password"})


def env_is_safe(name: str) -> bool:
    return name.upper() in SAFE_ENV


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (v if env_is_safe(k) else MASK) for k, v in env.items()}


def option_is_secret(dest: str) -> bool:
    # By word, not substring: max_num_batched_tokens is not a token.
    words = dest.lower().split("_")
    return (dest in SECRET_OPTIONS or words[-1] in ("token", "key")
            or any(w in ("password", "secret", "credential", "credentials") for w in words))


def named_secret(key: str, value: Any) -> bool:
    """A credential by its key's name (a vLLM option, a LiteLLM param): never a number, so that settings such as
    `chars_per_token` or `max_num_batched_tokens` are shown whatever their last word."""
    return option_is_secret(key) and not isinstance(value, (bool, int, float))


def _marked_secret(field: Any) -> bool:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    annotation = field.annotation
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    return bool(extra.get("secret")) or annotation is SecretStr or SecretStr in args


@functools.cache  # a schema's secret paths never change; a plan's JSON asks for them for every key
def secret_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> frozenset[tuple[str, ...]]:
    """Key paths the schema marks secret (nested models followed; mappings of models by any name: '*')."""
    found: set[tuple[str, ...]] = set()
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        if _marked_secret(field):
            found.add(path)
            continue
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel) and arg is not model:
                found |= secret_paths(arg, path)
            elif typing.get_origin(arg) is dict:
                inner = typing.get_args(arg)[1]
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    found |= secret_paths(inner, (*path, "*"))
    return frozenset(found)


def is_secret_key(model: type[BaseModel], path: tuple[str, ...]) -> bool:
    """True when the schema marks `path` (or a parent of it) secret, or when it is an env value not known safe."""
    if len(path) >= 2 and path[-2] == "env" and not env_is_safe(path[-1]):
        return True
    for secret in secret_paths(model):
        if len(path) >= len(secret) and all(s in ("*", p) for s, p in zip(secret, path, strict=False)):
            return True
    return False


def redacted_dump(config: BaseModel) -> dict[str, Any]:
    """The configuration as JSON data with every secret masked by the rules above (the console's Plan & config
    page): schema-marked keys, environment values not known safe, credential engine options, key digests."""
    model = type(config)

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, dict) and not (path and is_secret_key(model, path)):  # a KeyRef: its env name shows
            return {k: walk(v, (*path, str(k))) for k, v in value.items()}
        if path and (is_secret_key(model, path) or named_secret(path[-1], value) or path[-1] == "sha256"):
            return MASK if value not in (None, "", {}, []) else value
        if isinstance(value, dict):
            return {k: walk(v, (*path, str(k))) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, path) for v in value]
        return value

    return walk(config.model_dump(mode="json"), ())
