"""The test session's engine zygote (stack.engine.zygote, adr/0038): one per pytest process that runs tests which
start engines, started in the background at the end of collection (engines asked for before it is ready are
exec'd as before), stopped when the process ends. Its log lists each engine it forked and each it refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stack.engine.zygote import ZYGOTE_ENV

ROOT = Path(__file__).resolve().parents[2]
_running: dict[str, subprocess.Popen[bytes] | Path] = {}


def start() -> Path:
    """Start this process's zygote (its socket's path goes into VSTACK_ENGINE_ZYGOTE, inherited by every `vstack`
    and engine a test starts); the folder holding its socket, exit codes and log."""
    folder = Path(tempfile.mkdtemp(prefix="vstack-zygote-"))
    log = (folder / "zygote.log").open("wb")
    popen = subprocess.Popen([sys.executable, "-m", "stack.entrypoints.run", "stack.engine.zygote",
                              str(folder / "sock")], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    log.close()
    (folder / "zygote.pid").write_text(str(popen.pid))  # engines asked for while it imports wait for it
    _running.update(popen=popen, folder=folder)
    os.environ[ZYGOTE_ENV] = str(folder / "sock")
    return folder


def ready(timeout: float) -> int | None:
    """The pid of this process's zygote once it listens (None: it runs none, or it exited)."""
    popen, folder = _running.get("popen"), _running.get("folder")
    if not isinstance(popen, subprocess.Popen) or not isinstance(folder, Path):
        return None
    deadline = time.monotonic() + timeout
    while not (folder / "sock").exists() and popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return popen.pid if (folder / "sock").exists() else None


def stop() -> None:
    """Stop the zygote (the engines it forked are each stopped by whoever started them); its log is kept."""
    popen, folder = _running.pop("popen", None), _running.pop("folder", None)
    os.environ.pop(ZYGOTE_ENV, None)
    if isinstance(popen, subprocess.Popen):
        popen.kill()
        popen.wait(10)
    if isinstance(folder, Path):  # its log stays, for a look at what it forked and refused
        shutil.rmtree(folder / "sock.exits", ignore_errors=True)
        (folder / "sock").unlink(missing_ok=True)
