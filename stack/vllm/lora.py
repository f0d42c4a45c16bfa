"""LoRA adapters: where their files are, what they are (rank, target modules, base model), whether the base
model's engine can serve them, and the engine options that let it (adr/0013-model-families-and-adapters.md).

vLLM does the serving: `--enable-lora` with `--max-loras` (adapters in one batch, on the GPU) and
`--max-cpu-loras` (adapters kept loaded, in CPU memory), adapters added while it runs through
`/v1/load_lora_adapter` (VLLM_ALLOW_RUNTIME_LORA_UPDATING). The gateway loads each adapter on its first
request and keeps at most max_cpu_loras loaded, least recently used out first (stack.gateway.routing.adapters).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stack.config.model_extras import AdapterEntry
from stack.config.schema import ModelEntry
from stack.errors import ConfigError

# Largest |weight| an adapter may hold. Trained LoRA weights sit far below 1 (PEFT starts lora_A at
# kaiming-uniform, at most 1/sqrt(fan_in), and lora_B at 0); at 1e3 an A·B product over rank r already reaches
# 1e6·r per unit of input, past float16's 65504 and far past any activation the base model produces: such an
# adapter can only overflow the batch it shares with other tenants (adr/0020).
MAX_ABS_WEIGHT = 1e3
_ROWS = 4096  # rows read at a time: memory stays bounded whatever a tensor's size
RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's --max-lora-rank choices (0.26-0.33)
RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


class AdapterError(ConfigError):
    """An adapter that cannot be served: its files, its rank, or its base model."""


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    path: Path
    rank: int
    target_modules: tuple[str, ...]
    base_model: str | None
    size_bytes: int = 0
    source: dict[str, Any] = field(default_factory=dict)


def adapter_dir(entry: AdapterEntry, cache_dir: Path | None = None) -> Path:
    """The adapter's local folder: its `path`, or its Hub snapshot (downloaded once, huggingface_hub's cache)."""
    if entry.path:
        return Path(entry.path).expanduser()
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(entry.hub, revision=entry.revision,
                                      allow_patterns=["*.json", "*.safetensors", "*.bin"]))  # fmt: skip
    except Exception as exc:  # huggingface_hub raises many kinds; all mean "not fetched"
        raise AdapterError(f"adapter {entry.name!r}: cannot fetch {entry.hub}@{entry.revision} from the Hub: "
                           f"{type(exc).__name__}", hint="check the id and revision, HF_TOKEN for private "
                           "repositories, or give a local `path`") from None


CONFIG_MAX_BYTES = 1 << 20  # PEFT writes ~1 KB; a bigger adapter_config.json is not one (and is not read)


def inspect(entry: AdapterEntry, path: Path) -> AdapterInfo:
    """Read adapter_config.json (PEFT format) and check the weights are there. Every problem with the files
    (missing, unreadable, too large, a name the OS refuses, JSON of the wrong shape) is an AdapterError that
    names the file and the fix, never an OSError or TypeError. Blocking: callers on an event loop run it in
    a thread."""
    try:
        return _inspect(entry, path)
    except OSError as exc:  # a name over 255 bytes, a path through a file, no permission, ...
        raise AdapterError(f"adapter {entry.name!r}: cannot read {_short(exc.filename or path)}: "
                           f"{exc.strerror or type(exc).__name__}",
                           hint="give the path of a readable local folder (each name at most 255 bytes)") from None
    except ValueError as exc:  # an embedded NUL byte in the path
        raise AdapterError(f"adapter {entry.name!r}: the path is not usable: {exc}",
                           hint="give the path of a local folder") from None


def _inspect(entry: AdapterEntry, path: Path) -> AdapterInfo:
    config = path / "adapter_config.json"
    if not path.is_dir():
        raise AdapterError(f"adapter {entry.name!r}: folder {_short(path)} does not exist",
                           hint="give the folder PEFT's save_pretrained wrote (adapter_config.json + weights)")
    if not config.is_file():
        raise AdapterError(f"adapter {entry.name!r}: {_short(path)} has no adapter_config.json (not a PEFT adapter)",
                           hint="save the adapter with PEFT's save_pretrained")
    weights = [p for p in ("adapter_model.safetensors", "adapter_model.bin") if (path / p).is_file()]
    if not weights:
        raise AdapterError(f"adapter {entry.name!r}: {_short(path)} has no adapter_model.safetensors (or .bin)",
                           hint="the weights are missing: copy them next to adapter_config.json")
    size = config.stat().st_size
    if size > CONFIG_MAX_BYTES:
        raise AdapterError(f"adapter {entry.name!r}: {_short(config)} is {size / 2**20:.0f} MiB; PEFT's is about "
                           f"1 KB (the limit is {CONFIG_MAX_BYTES // 1024} KiB)",
                           hint="write adapter_config.json with PEFT's save_pretrained")
    try:
        data = json.loads(config.read_bytes())
    except ValueError as exc:  # invalid JSON or not UTF-8
        raise AdapterError(f"adapter {entry.name!r}: {_short(config)} is not valid JSON ({exc})",
                           hint="write adapter_config.json with PEFT's save_pretrained") from None
    config_fields(entry.name, config, data)
    rank = data.get("r")
    modules = data.get("target_modules") or []
    modules = (modules,) if isinstance(modules, str) else tuple(modules)
    total = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return AdapterInfo(entry.name, path, rank, modules, data.get("base_model_name_or_path"), total,
                       entry.model_dump(exclude_none=True))  # fmt: skip


def check_weights(name: str, path: Path, limit: float = MAX_ABS_WEIGHT) -> None:
    """Refuse an adapter whose tensors hold NaN/Inf or values beyond `limit`, before any engine loads it:
    one such adapter in a batch poisons the base model's answers for every tenant (issue 34). Read with
    the safetensors library, tensor by tensor and in row blocks (bounded memory); an adapter only in the
    pickle format (adapter_model.bin) cannot be read without running it, so it is refused."""
    file = path / "adapter_model.safetensors"
    if not file.is_file():
        raise AdapterError(f"adapter {name!r}: only adapter_model.bin (a pickle) in {path}; its weights cannot be "
                           "checked before loading", hint="save it as safetensors (PEFT's save_pretrained does "
                           "by default, or safe_serialization=True)")  # fmt: skip
    from safetensors import SafetensorError, safe_open

    try:
        import torch  # noqa: F401 (bfloat16 tensors need torch; numpy has no bfloat16)

        framework = "pt"
    except ImportError:
        framework = "np"
    try:
        with safe_open(str(file), framework=framework) as f:
            for tensor in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                piece = f.get_slice(tensor)
                if framework == "np" and piece.get_dtype() == "BF16":
                    raise AdapterError(f"adapter {name!r}: tensor {tensor!r} is bfloat16, which this gateway cannot "
                                       "check without torch", hint="install torch beside the gateway (the cpu or "
                                       "gpu extra), or save the adapter in float16/float32")  # fmt: skip
                worst = _worst_value(piece, framework)
                if worst is not None and not worst <= limit:  # NaN compares false: refused too
                    what = "non-finite values (NaN or Inf)" if worst != worst or worst == float("inf") else \
                        f"a value of magnitude {worst:.3g}, above {limit:g}"
                    raise AdapterError(f"adapter {name!r}: tensor {tensor!r} of {file.name} holds {what}; it "
                                       "would corrupt the base model's answers for every user",
                                       hint="retrain or re-export the adapter; weights must be finite "
                                       f"and within ±{limit:g}")  # fmt: skip
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise AdapterError(f"adapter {name!r}: {file} is not a readable safetensors file "
                           f"({type(exc).__name__}: {str(exc)[:200]})") from None


def _worst_value(piece: Any, framework: str) -> float | None:
    """max |x| of one tensor (NaN if any is NaN, inf if any is infinite), read `_ROWS` rows at a time."""
    shape = piece.get_shape()
    if not shape or 0 in shape:
        return None if shape else _abs_max(piece[:], framework)
    worst = 0.0
    for start in range(0, shape[0], _ROWS):
        block = _abs_max(piece[start:start + _ROWS], framework)
        if block != block:  # NaN: nothing worse
            return block
        worst = max(worst, block)
    return worst


def _abs_max(block: Any, framework: str) -> float:
    if framework == "pt":
        import torch

        values = block.float()
        if torch.isnan(values).any():
            return float("nan")
        return float(values.abs().max()) if values.numel() else 0.0
    import numpy as np

    values = np.asarray(block, dtype=np.float64)
    if np.isnan(values).any():
        return float("nan")
    return float(np.abs(values).max()) if values.size else 0.0
def config_fields(name: str, config: Path, data: object) -> None:
    """The fields we read, of the types PEFT writes: an AdapterError naming the file and the field if not."""
    where = f"adapter {name!r}: {_short(config)}"
    fix = "write adapter_config.json with PEFT's save_pretrained"
    if not isinstance(data, dict):
        raise AdapterError(f"{where} holds a JSON {type(data).__name__}, not an object", hint=fix)
    peft_type = data.get("peft_type", "LORA")
    if not isinstance(peft_type, str) or peft_type.upper() != "LORA":
        raise AdapterError(f"{where}: peft_type {peft_type!r}; vLLM serves LoRA only", hint=fix)
    rank = data.get("r")
    if rank is None or isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"{where}: the rank `r` must be a whole number >= 1, not {_brief(rank)}", hint=fix)
    modules = data.get("target_modules")
    if modules is not None and not isinstance(modules, str) and not (
            isinstance(modules, list) and all(isinstance(m, str) for m in modules)):
        raise AdapterError(f"{where}: target_modules must be a name or a list of names, not {_brief(modules)}",
                           hint=fix)
    base = data.get("base_model_name_or_path")
    if base is not None and not isinstance(base, str):
        raise AdapterError(f"{where}: base_model_name_or_path must be text, not {_brief(base)}", hint=fix)


def _short(path: object, limit: int = 120) -> str:
    """A path for a message: its end when it is very long (a 300-character path is not worth reading twice)."""
    text = str(path)
    return text if len(text) <= limit else "..." + text[-limit:]


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def base_names(model: ModelEntry, model_dir: Path | None = None) -> set[str]:
    """Names an adapter's base_model_name_or_path may carry for this model."""
    names = {model.name, model.api_name}
    for value in (model.source.hub, model.source.path, str(model_dir) if model_dir else None):
        if value:
            names |= {value, value.rstrip("/").rsplit("/", 1)[-1]}
    return {n.lower() for n in names}


def check_fits(info: AdapterInfo, model: ModelEntry, max_rank: int | None, model_dir: Path | None = None) -> None:
    """Refuse an adapter whose rank is above the engine's max_lora_rank or that was trained on another model."""
    if max_rank is not None and info.rank > max_rank:
        raise AdapterError(f"adapter {info.name!r}: rank {info.rank} is above the engine's max_lora_rank "
                           f"{max_rank}", hint=f"set models.{model.name}.lora.max_lora_rank to "
                           f"{next(r for r in RANKS if r >= info.rank)} (restarts the engine)")
    base = (info.base_model or "").rstrip("/")
    if base and base.lower() not in base_names(model, model_dir) and \
            base.rsplit("/", 1)[-1].lower() not in base_names(model, model_dir):
        raise AdapterError(f"adapter {info.name!r} was trained on {base!r}, not on {model.name!r} "
                           f"({model.source.hub or model.source.path})",
                           hint="serve it on its own base model (or fix base_model_name_or_path if it is this model)")


def engine_options(model: ModelEntry, infos: list[AdapterInfo], engine: dict[str, Any],
                   accelerator: str) -> tuple[dict[str, Any], dict[str, str]]:
    """enable_lora, max_lora_rank, max_loras, max_cpu_loras for a model with adapters: the config's `lora:`
    first, else decided here (one batch slot per adapter up to 4 on a GPU, 1 on a CPU; all kept loaded)."""
    if not infos and not model.lora.max_loras:
        return {}, {}
    limits = model.lora
    top = max((i.rank for i in infos), default=8)
    rank = limits.max_lora_rank or next((r for r in RANKS if r >= top), RANKS[-1])
    max_loras = limits.max_loras or max(1, min(len(infos), 4 if accelerator == "gpu" else 1))
    max_cpu = limits.max_cpu_loras or max(max_loras, len(infos))
    said = f"models.{model.name}.lora"
    decided = {
        "enable_lora": (True, f"{said}: the model has {len(infos)} adapter(s)"),
        "max_lora_rank": (rank, f"{said}.max_lora_rank" if limits.max_lora_rank else
                          f"planner: the highest adapter rank is {top}"),
        "max_loras": (max_loras, f"{said}.max_loras" if limits.max_loras else
                      f"planner: {max_loras} adapter(s) per batch on the {accelerator}"),
        "max_cpu_loras": (max_cpu, f"{said}.max_cpu_loras" if limits.max_cpu_loras else
                          "planner: every adapter stays loaded"),
    }
    options = {k: v for k, (v, _) in decided.items() if k not in engine}
    return options, {k: o for k, (_, o) in decided.items() if k in options}
