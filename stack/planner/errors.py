"""The planner's errors: part of the stack's one hierarchy (stack.errors)."""

from __future__ import annotations

from stack.errors import StackError


class ModelShapeError(StackError):
    """A config.json or a weight file the planner cannot read."""

    exit_code = 4


class FitError(StackError):
    """The model does not fit the hardware with the settings asked for; the message carries the numbers."""

    exit_code = 6
