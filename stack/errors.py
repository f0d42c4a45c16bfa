"""One error hierarchy. The library raises these; only the CLI prints them and picks an exit code."""

from __future__ import annotations


class StackError(Exception):
    """Base of every error the stack raises on purpose. `hint` says what to do about it."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.hint}" if self.hint else self.message


class ConfigError(StackError):
    """A configuration problem: a file, a key path, and the fix."""

    exit_code = 2

    def __init__(self, problems: list[str] | str, hint: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems), hint)


class EngineError(StackError):
    """An engine did not start, crashed, or could not be stopped."""

    exit_code = 3

    def __init__(self, message: str, hint: str | None = None, log_tail: str = "") -> None:
        super().__init__(message, hint)
        self.log_tail = log_tail


class ModelSourceError(StackError):
    """A model could not be found, downloaded or converted."""

    exit_code = 4


class VllmNotInstalledError(StackError):
    """No vLLM in the engine's Python environment."""

    exit_code = 5


class ReportedError(StackError):
    """An error another vstack process reported (the gateway `vstack up` started in the background): its
    message, fix, engine log tail and exit code, re-raised in the CLI as if it had happened there."""

    def __init__(self, message: str, hint: str | None = None, log_tail: str = "", exit_code: int = 1) -> None:
        super().__init__(message, hint)
        self.log_tail = log_tail
        self.exit_code = exit_code
