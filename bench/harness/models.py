"""The SmolLM2 checkpoint the CPU runs and the end-to-end tests serve, converted once by `stack.models`."""

from __future__ import annotations

from pathlib import Path

SMOLLM2 = "smollm2-135m-instruct"


def smollm2_dir() -> Path:
    """Its local folder: the cache, else pulled (and converted) through the stack's configuration; raises what
    `stack.models` raises when it cannot be had (offline, no cache)."""
    cached = Path.home() / ".cache" / "vstack" / "models" / SMOLLM2
    if (cached / "config.json").is_file():
        return cached
    from stack.config import load_config
    from stack.models import pull

    cfg = load_config()
    return Path(pull(cfg.models[SMOLLM2], cfg).path)
