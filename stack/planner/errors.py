"""The planner's errors: part of the stack's one hierarchy (stack.errors)."""

from __future__ import annotations

from stack.errors import ExitCode, StackError


class ModelShapeError(StackError):
    """A config.json or a weight file the planner cannot read."""

    exit_code = ExitCode.MODEL_NOT_FOUND


class FitError(StackError):
    """The model does not fit the hardware with the settings asked for; the message carries the numbers."""

    exit_code = ExitCode.DOES_NOT_FIT
