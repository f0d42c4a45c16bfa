"""Where a model's config.json and weight metadata come from: a local folder, the Hugging Face Hub
(metadata only, never the weights), or, offline, the copies of known configs shipped in known_configs/."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from stack.config.schema import ModelSource
from stack.planner.errors import ModelShapeError
from stack.planner.model_meta import ModelShape, parse_config
from stack.planner.weights import Weights, weights_from_config, weights_from_folder, weights_from_hub

KNOWN_CONFIGS = Path(__file__).parent / "known_configs"


@dataclass(frozen=True)
class ModelFacts:
    shape: ModelShape
    weights: Weights
    config_source: str


def known_config_path(repo_id: str) -> Path:
    return KNOWN_CONFIGS / (repo_id.replace("/", "--") + ".json")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ModelShapeError(f"{path}: no such file", hint="the model folder needs a config.json") from exc
    except ValueError as exc:
        raise ModelShapeError(f"{path}: not valid JSON ({exc})") from exc


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"} or not _hub_reachable()


def _endpoint() -> str | None:
    # Read at call time (huggingface_hub reads HF_ENDPOINT once, at import): mirrors and test stand-ins.
    return os.environ.get("HF_ENDPOINT") or None


def _hub_reachable() -> bool:
    return _reachable(_endpoint() or "https://huggingface.co")


@lru_cache(maxsize=8)
def _reachable(endpoint: str) -> bool:
    """One quick connection attempt: huggingface_hub retries for ~25 s before it gives up on a dead network."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # the proxy decides; let huggingface_hub try
    from urllib.parse import urlparse

    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "huggingface.co", port), timeout=3).close()
    except OSError:
        return False
    return True


def _hub_config(repo_id: str, revision: str, token: str | None) -> tuple[dict[str, Any], str] | None:
    """config.json through huggingface_hub (the HF cache first when offline); None when unreachable."""
    import httpx
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        path = hf_hub_download(repo_id, "config.json", revision=revision, token=token,
                               local_files_only=_hub_offline(), endpoint=_endpoint())
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, httpx.HTTPError):
        return None
    return _read_json(Path(path)), f"config.json of {repo_id}@{revision} (Hugging Face Hub)"


def _hub_weights(repo_id: str, revision: str, token: str | None) -> Weights | None:
    if _hub_offline():
        return None
    import httpx
    from huggingface_hub.errors import HfHubHTTPError, NotASafetensorsRepoError

    try:
        return weights_from_hub(repo_id, revision, token, endpoint=_endpoint())
    except (NotASafetensorsRepoError, HfHubHTTPError, OSError, httpx.HTTPError):
        return None


def load_facts(source: ModelSource | str | Path, name: str | None = None, token: str | None = None) -> ModelFacts:
    """Model facts from a configured source, a Hub repository id, or a local folder."""
    if isinstance(source, str | Path) and Path(source).is_dir():
        source = ModelSource(path=str(source))
    elif isinstance(source, str | Path):
        source = ModelSource(hub=str(source))
    label = name or source.hub or source.path or "model"
    if source.path and Path(source.path).is_dir():
        folder = Path(source.path)
        shape = parse_config(_read_json(folder / "config.json"), label)
        weights = weights_from_folder(folder) or weights_from_config(shape)
        return ModelFacts(shape, weights, f"{folder / 'config.json'}")
    if not source.hub:
        raise ModelShapeError(f"{label}: the folder {source.path} does not exist",
                              hint="check models.<name>.source.path")
    found = _hub_config(source.hub, source.revision, token)
    if found is None and known_config_path(source.hub).is_file():
        found = (_read_json(known_config_path(source.hub)),
                 f"config.json of {source.hub} (built-in copy: the Hub was not reachable)")
    if found is None:
        raise ModelShapeError(
            f"{label}: config.json of {source.hub} could not be read from the Hugging Face Hub",
            hint="check the repository id and HF_TOKEN (gated models), or point source.path at a local folder",
        )
    config, config_source = found
    shape = parse_config(config, label)
    weights = _hub_weights(source.hub, source.revision, token) or weights_from_config(shape)
    return ModelFacts(shape, weights, config_source)
