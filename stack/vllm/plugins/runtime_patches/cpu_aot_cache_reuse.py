"""CPU: reuse the AOT-compiled model on a repeat start instead of compiling it again.

vLLM 0.32's `_try_load_aot_compiled_fn` (compilation/decorators.py) ends a cache load with
`loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)`. With the backends that return vLLM's
own `VllmSerializableFunction` (CUDA) that method exists. On the CPU build the model is compiled by
torch's inductor backend, so torch wraps the result in `BundledAOTAutogradSerializableCallable`, whose
`__getattr__` forwards to the compiled *function*: `'function' object has no attribute
'finalize_loading'`. vLLM catches that, logs "Compiling model again due to a load failure", and every
start pays the whole compile (about 40 s of a 90 s start on 2 cores).

The inductor callable is complete once deserialized (nothing is left to load lazily), so a no-op
`finalize_loading` on torch's wrapper is exactly the missing piece: the cached artifact is then used as
is. A class attribute reaches vLLM's call without touching any file, and it is only set when the class
lacks one (a torch or vLLM release that adds its own keeps it).
"""

from __future__ import annotations

from typing import Any

MARK = "_vstack_patch"


def _finalize_loading(self: Any, vllm_config: Any) -> None:
    """Nothing to finalize: an inductor-compiled callable is ready to run once deserialized."""


setattr(_finalize_loading, MARK, "cpu-aot-cache-reuse")


def apply() -> bool:
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as Bundled

    if "finalize_loading" in Bundled.__dict__:
        return False  # ours already (loaded twice in this process), or torch has its own
    Bundled.finalize_loading = _finalize_loading  # type: ignore[attr-defined]
    return True
