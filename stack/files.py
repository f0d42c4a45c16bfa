"""Files replaced whole: a reader sees the old or the new content, never half, and two processes writing the
same file at once (two `vstack` commands filling one cache) each write their own temporary file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def replace_file(path: Path, data: bytes | str, *, mode: int | None = 0o644, fsync: bool = False) -> None:
    """Write `data` beside `path` under a name of its own, then rename it over `path` (one atomic step).
    mode 0o600 for files that may hold a secret, None to keep the mode `path` has (0o644 for a new file);
    fsync where the content must survive a crash."""
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
