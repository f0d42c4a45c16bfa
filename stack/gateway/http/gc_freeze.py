"""What the gateway process built while starting (modules, config, the app) kept out of the garbage collector.

CPython's full (generation 2) collection walks every object tracked: in a started gateway that is ~100,000
objects (~400,000 once LiteLLM is imported), and one pass stopped the event loop for 100-350 ms on this 2-core
machine, every stream in flight with it (bench: adr/0031). `gc.freeze()` moves what exists now to a generation no
collection visits; what requests make later is collected as before. Only the server process freezes (serve.py):
tests build many apps in one process and keep their collector as it is.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze() -> None:
    """Freeze what exists now; later `refreeze()` calls do the same (a bulk import made after start)."""
    global _frozen
    _frozen = True
    gc.collect()  # the garbage of starting goes first, or it would be kept for good
    gc.freeze()


def refreeze() -> None:
    """After a late bulk import (LiteLLM's, on its thread): its objects join the frozen ones, where freeze() ran."""
    if _frozen:
        gc.freeze()
