"""Files replaced whole: a reader sees the old or the new content, never half, and two processes writing the
same file at once (two `vstack` commands filling one cache) each write their own temporary file. And the
folders the stack ships (configs/, loadtests/): found in a source checkout, else inside the installed wheel."""

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


# The folders at the top of a source checkout that the wheel ships inside the package as stack/_NAME
# (pyproject.toml: [tool.hatch.build.targets.wheel.force-include]).
PACKAGE_DIR = Path(__file__).resolve().parent


def shipped_folder(name: str, marker: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """NAME/ of the source checkout the package sits in, else the copy packaged in the wheel (stack/_NAME):
    whichever holds `marker`; None when neither does. One copy in a checkout, read where it is edited."""
    for candidate in (package_dir.parent / name, package_dir / f"_{name}"):
        if (candidate / marker).is_file():
            return candidate
    return None
