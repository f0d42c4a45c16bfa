"""A model's states and the moves between them: one table, checked on every change.

    stopped -> starting -> ready -> (sleeping | stopping) ...
    stopped -> sleeping: an engine `vstack down` kept asleep, re-attached by the next gateway (adr/0030)
                  \\-> failed            sleeping -> starting (wake) | stopping
A crash of a ready engine goes ready -> starting (restart) or ready -> failed (restart budget spent).
"""

from __future__ import annotations

from enum import StrEnum

from stack.errors import StackError


class ModelState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"  # cold start, wake-up or restart in progress
    READY = "ready"
    SLEEPING = "sleeping"  # vLLM sleep mode: weights in host RAM, GPU memory freed
    STOPPING = "stopping"
    FAILED = "failed"


S = ModelState
ALLOWED: dict[ModelState, frozenset[ModelState]] = {
    S.STOPPED: frozenset({S.STARTING, S.SLEEPING}),  # sleeping: an engine `vstack down` kept asleep, re-attached
    S.STARTING: frozenset({S.READY, S.FAILED, S.STOPPING, S.STOPPED}),
    S.READY: frozenset({S.SLEEPING, S.STOPPING, S.STARTING, S.FAILED}),
    S.SLEEPING: frozenset({S.STARTING, S.STOPPING, S.FAILED, S.STOPPED}),
    S.STOPPING: frozenset({S.STOPPED, S.FAILED}),
    S.FAILED: frozenset({S.STARTING, S.STOPPING, S.STOPPED}),
}


class TransitionError(StackError):
    """A move the state machine does not allow: a bug in the manager, never a user error."""


def check_move(name: str, before: ModelState, after: ModelState) -> None:
    if after != before and after not in ALLOWED[before]:  # the same state again only updates the detail
        raise TransitionError(f"model {name!r}: {before} -> {after} is not a valid move")

