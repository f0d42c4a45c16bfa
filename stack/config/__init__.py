"""Configuration: typed schema, YAML loading with `extends:` and VSTACK_* overrides, vLLM argv rendering."""

from stack.config.loader import load_config
from stack.config.resolve import ResolvedProfile, resolve_profile
from stack.config.schema import HardwareProfile, ModelEntry, Profile, StackConfig

__all__ = [
    "HardwareProfile",
    "ModelEntry",
    "Profile",
    "ResolvedProfile",
    "StackConfig",
    "load_config",
    "resolve_profile",
]
