"""Whether a vLLM process will run one of the stack's runtime patches, read from its environment.

The patches run from the `vstack_patches` entry point of vLLM's `vllm.general_plugins` group
(stack.patches.plugin). Three switches decide: VSTACK_RUNTIME_PATCHES=0 turns all off, VSTACK_DISABLE_PATCHES
lists ids to leave out, and vLLM's own VLLM_PLUGINS, when set, loads only the plugins it names (split on ","
exactly as vllm.envs does: an empty value loads none). The plugin reads them inside vLLM; the tune reads them
before it relies on a patch (a pre-started engine the start gate does not hold would take the device at once).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PLUGIN_NAME = "vstack_patches"  # pyproject.toml [project.entry-points."vllm.general_plugins"]
ALL_OFF_ENV = "VSTACK_RUNTIME_PATCHES"
DISABLE_ENV = "VSTACK_DISABLE_PATCHES"


def switched_off(value: str | None) -> bool:
    return (value or "").strip().lower() in ("0", "off", "false", "no")


def disabled_patches(environ: Mapping[str, str] = os.environ) -> set[str]:
    return {x.strip() for x in environ.get(DISABLE_ENV, "").split(",") if x.strip()}


def plugin_loaded(environ: Mapping[str, str] = os.environ) -> bool:
    """vLLM loads our plugin: VLLM_PLUGINS unset, or naming it."""
    return "VLLM_PLUGINS" not in environ or PLUGIN_NAME in environ["VLLM_PLUGINS"].split(",")


def patch_runs(patch_id: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """None when a vLLM process with this environment runs the patch (if its range covers that vLLM);
    else the switch that turns it off, for a message."""
    if not plugin_loaded(environ):
        return f"VLLM_PLUGINS={environ['VLLM_PLUGINS']!r} does not name {PLUGIN_NAME}"
    if switched_off(environ.get(ALL_OFF_ENV)):
        return f"{ALL_OFF_ENV}={environ[ALL_OFF_ENV]}"
    if patch_id in disabled_patches(environ):
        return f"{DISABLE_ENV} names {patch_id}"
    return None
