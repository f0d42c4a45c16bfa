"""One error hierarchy, and the one table of exit codes. The library raises these; only the CLI (and the
process entry points) print them and exit with their code (stack.cli.every_command.run).

docs/reference/exit-codes.md is generated from EXIT_CODES (docs/gen_reference.py); tests/test_exit_codes.py checks it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    CONFIG = 2
    ENGINE = 3
    MODEL_NOT_FOUND = 4
    NO_VLLM = 5
    DOES_NOT_FIT = 6
    PATCH = 7
    TRIAGE = 8
    LOAD_TEST = 9
    BENCH = 10
    SLO_NOT_MET = 11
    ALREADY_RUNNING = 12
    PORT_IN_USE = 13
    INTERRUPTED = 130


# What each exit code means for the user: docs/reference/exit-codes.md is generated from it.
EXIT_CODES: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.ERROR: "any other error the stack reports",
    ExitCode.CONFIG: "configuration error (a file, a key, an engine option vLLM does not have)",
    ExitCode.ENGINE: "an engine failed to start, crashed, or could not be stopped",
    ExitCode.MODEL_NOT_FOUND: "model not found, or its files cannot be read",
    ExitCode.NO_VLLM: "no vLLM installed in the engine's Python",
    ExitCode.DOES_NOT_FIT: "the model does not fit the hardware with the settings asked for",
    ExitCode.PATCH: "a vLLM patch cannot be applied, reverted or verified",
    ExitCode.TRIAGE: "upstream releases or a git range could not be read for triage",
    ExitCode.LOAD_TEST: "a load test could not run (Locust failed or sent nothing)",
    ExitCode.BENCH: "a benchmark run (vllm bench serve) failed",
    ExitCode.SLO_NOT_MET: "the load test or tune ran, and the SLO was not met; or `vstack upgrade check` failed its "
                          "SLO, goodput, answer or gate check",
    ExitCode.ALREADY_RUNNING: "vstack is already running here (`vstack status`, `vstack down`)",
    ExitCode.PORT_IN_USE: "the port asked for is in use by another process",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM) after stopping what the command had started",
}


class StackError(Exception):
    """Base of every error the stack raises on purpose. `hint` says what to do about it."""

    exit_code: int = ExitCode.ERROR

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.hint}" if self.hint else self.message


class ConfigError(StackError):
    """A configuration problem: a file, a key path, and the fix."""

    exit_code = ExitCode.CONFIG

    def __init__(self, problems: list[str] | str, hint: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems), hint)


class EngineError(StackError):
    """An engine did not start, crashed, or could not be stopped."""

    exit_code = ExitCode.ENGINE

    def __init__(self, message: str, hint: str | None = None, log_tail: str = "") -> None:
        super().__init__(message, hint)
        self.log_tail = log_tail


class AlreadyRunningError(StackError):
    """`vstack up` while the gateway it started before is still running: nothing failed, nothing started."""

    exit_code = ExitCode.ALREADY_RUNNING


class PortInUseError(StackError):
    """The port asked for is taken by another process: not an engine failure."""

    exit_code = ExitCode.PORT_IN_USE


class ModelSourceError(StackError):
    """A model could not be found, downloaded or converted."""

    exit_code = ExitCode.MODEL_NOT_FOUND


class VllmNotInstalledError(StackError):
    """No vLLM in the engine's Python environment."""

    exit_code = ExitCode.NO_VLLM


class ReportedError(StackError):
    """An error another vstack process reported (the gateway `vstack up` started in the background): its
    message, fix, engine log tail and exit code, re-raised in the CLI as if it had happened there."""

    def __init__(self, message: str, hint: str | None = None, log_tail: str = "",
                 exit_code: int = ExitCode.ERROR) -> None:
        super().__init__(message, hint)
        self.log_tail = log_tail
        self.exit_code = exit_code
