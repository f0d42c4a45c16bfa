"""Errors of the patch tooling: each names the file or ledger entry and says what to do."""

from __future__ import annotations

from stack.errors import ConfigError, ExitCode, StackError


class LedgerError(ConfigError):
    """patches/ledger.yaml (or a file it names) is invalid; nothing was touched."""


class PatchError(StackError):
    """A patch cannot be applied, reverted or verified; the installation was left as it was."""

    exit_code = ExitCode.PATCH


class TriageError(StackError):
    """Upstream artifacts or a git range could not be read for triage."""

    exit_code = ExitCode.TRIAGE
