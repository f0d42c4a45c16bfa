"""The `vllm.general_plugins` entry point: runs the ledger's runtime patches in every vLLM process.

vLLM calls it in the API server, the engine core and each worker, possibly several times per
process, so it is idempotent and logs once per process. Switches: VSTACK_RUNTIME_PATCHES=0 turns
all off; VSTACK_DISABLE_PATCHES=id1,id2 turns some off; vLLM's own VLLM_PLUGINS allowlist applies too.
"""

from __future__ import annotations

import importlib
import logging
import os

from packaging.version import Version

from stack.vllm import launcher
from stack.vllm.plugins.runtime_switches import ALL_OFF_ENV, DISABLE_ENV, disabled_patches, patch_runs, switched_off

# Under "vllm." so vLLM's log handler and format apply.
log = logging.getLogger("vllm.vstack_patches")
_loaded: dict[str, str] | None = None  # patch id -> outcome, once per process


def installed_vllm() -> tuple[str, Version] | None:
    found = launcher.installed_vllm()
    return (found[0], Version(found[1])) if found else None


def register() -> dict[str, str]:
    """Apply every active runtime patch whose range covers the installed vLLM. Returns id -> outcome."""
    global _loaded
    if _loaded is not None:
        return _loaded
    _loaded = outcomes = {}
    if switched_off(os.environ.get(ALL_OFF_ENV)):
        log.info("vstack runtime patches: off (%s=0)", ALL_OFF_ENV)
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
    disabled = disabled_patches()
    dist, version = found
    for patch in ledger.patches:
        if patch.kind is not Kind.PLUGIN:
            continue
        if not patch.covers(dist, version):
            outcomes[patch.id] = f"not needed ({patch.why_not_needed(dist, version)})"
        elif patch.id in disabled:
            outcomes[patch.id] = f"disabled ({DISABLE_ENV})"
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


def would_run(patch_id: str, dist: str, version: str, environ: dict[str, str]) -> str | None:
    """None when a vLLM process of that distribution and version, started with this environment, runs the
    runtime patch (as `register` decides inside it); else why not, for a message."""
    from stack.patches.ledger import load_ledger

    patch = next((p for p in load_ledger().patches if p.id == patch_id), None)
    if patch is None:
        return f"patches/ledger.yaml has no patch {patch_id}"
    if not patch.covers(dist, Version(version)):
        return f"not for {dist} {version} ({patch.why_not_needed(dist, Version(version))})"
    switch = patch_runs(patch_id, environ)
    return f"turned off: {switch}" if switch else None


def probe() -> None:
    """`python -c "from stack.patches.plugin import probe; probe()"` in a candidate's Python (the upgrade gate,
    stack.upgrade.triage.plugin_load): loads the ledger ($VSTACK_LEDGER) and runs its runtime patches as a vLLM
    process would, then prints {"ledger_error": ..., "outcomes": {id: outcome}} as one JSON line."""
    import json

    from stack.patches.ledger import load_ledger

    error = None
    try:
        load_ledger()
    except Exception as e:  # what `register` logs as "ledger not loaded, none applied"
        error = f"{type(e).__name__}: {e}"
    print(json.dumps({"ledger_error": error, "outcomes": register()}), flush=True)
