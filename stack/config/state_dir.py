"""`state_dir` must be a folder this user can write: records, logs and runtime state live there.

Checked by `vstack config validate` and before `vstack up` starts anything, by writing (and removing) a
probe file there, so a read-only mount, a full disk or a path under a regular file is named up front
instead of failing later as a traceback. The check leaves nothing behind: folders it had to create for the
probe are removed again.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from stack.errors import ConfigError


def state_dir_problem(path: Path) -> str | None:
    """None when `path` is (or can be made) a writable folder; else what is wrong, in words."""
    path = Path(path).expanduser()
    made: list[Path] = []
    try:
        for parent in [*reversed(path.parents), path]:
            if not parent.exists():
                parent.mkdir()
                made.append(parent)
        if not path.is_dir():
            return f"{path} is not a folder"
        fd, probe = tempfile.mkstemp(prefix=".vstack-write-check-", dir=path)
        try:
            os.write(fd, b"ok")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return f"{path} is not writable: {exc.strerror or type(exc).__name__}"
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


def check_state_dir(cfg: Any) -> None:
    """ConfigError (exit code 2) naming the key and where it was set when state_dir cannot be written."""
    problem = state_dir_problem(cfg.state_dir)
    if problem:
        raise ConfigError(f"{cfg.where('state_dir')}: state_dir: {problem}",
                          hint="point state_dir (or VSTACK_STATE_DIR) at a folder this user can write")
