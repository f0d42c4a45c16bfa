"""Unified diffs: parsed and checked with `unidiff`, applied in memory by `git apply` in a scratch dir.

Nothing here writes to an installation: callers get the new file contents and decide (apply.py
writes them in one transaction). `git apply` gives exact-context matching with line offsets and
all-or-nothing semantics per diff, the behaviour reviewers know from git.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from stack.patches.tool_errors import LedgerError, PatchError


@dataclass(frozen=True)
class Diff:
    path: Path  # the .patch file
    text: str
    files: tuple[str, ...]  # paths relative to site-packages, e.g. vllm/entrypoints/cli/main.py
    added: int
    removed: int


def _rel(name: str) -> str:
    # git-style a/ b/ prefixes (patch -p1)
    return name[2:] if name[:2] in ("a/", "b/") else name


def load_diff(path: Path) -> Diff:
    """Parse and check a patch file; errors name the file and say how to fix it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise LedgerError(
            f"{path}: cannot read patch file ({e.strerror})", hint="fix the ledger's `file:`"
        ) from e
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise LedgerError(
            f"{path}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})",
            hint="regenerate the patch with `git diff` (UTF-8); do not edit it in another encoding",
        ) from None
    try:
        patch = PatchSet(text)
    except UnidiffParseError as e:
        raise LedgerError(
            f"{path}: not a valid unified diff: {e}",
            hint="regenerate it with `diff -u a/... b/...` or `git diff`; do not edit hunks by hand",
        ) from e
    if not patch:
        raise LedgerError(
            f"{path}: contains no diff hunks", hint="the file needs ---/+++ headers and @@ hunks"
        )
    files = []
    for pf in patch:
        if pf.is_added_file or pf.is_removed_file:
            raise LedgerError(
                f"{path}: {pf.path}: adds or deletes a file", hint="patches may only modify files"
            )
        rel = _rel(pf.target_file)
        parts = PurePosixPath(rel).parts
        if _rel(pf.source_file) != rel or not parts or parts[0] != "vllm" or ".." in parts:
            raise LedgerError(
                f"{path}: {pf.target_file}: must modify a file under vllm/ with a/ b/ prefixes",
                hint="paths are relative to site-packages, e.g. a/vllm/entrypoints/cli/main.py",
            )
        files.append(rel)
    return Diff(path, text, tuple(files), patch.added, patch.removed)


def git_apply(diff: Diff, contents: dict[str, bytes], *, reverse: bool = False) -> dict[str, bytes]:
    """The files of `contents` with the diff applied (or reversed); PatchError if it does not apply.

    `contents` maps each of diff.files to its current bytes. The scratch copy is thrown away.
    """
    if shutil.which("git") is None:
        raise PatchError("git is not installed; it applies the diffs", hint="apt-get install git")
    with tempfile.TemporaryDirectory(prefix="vstack-apply-") as tmp:
        root = Path(tmp)
        for rel in diff.files:
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(contents[rel])
        cmd = ["git", "apply", "--whitespace=nowarn", *(["--reverse"] if reverse else []), "-"]
        # GIT_DIR pointing nowhere keeps git from treating an enclosing repository as the target.
        env = {"GIT_DIR": str(root / ".no-git"), "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": tmp}
        done = subprocess.run(cmd, cwd=root, input=diff.text, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise PatchError(_explain(diff, done.stderr, reverse))
        return {rel: (root / rel).read_bytes() for rel in diff.files}


def applies(diff: Diff, contents: dict[str, bytes], *, reverse: bool = False) -> str | None:
    """None when the diff applies cleanly (reverse: is already present), else git's reason."""
    try:
        git_apply(diff, contents, reverse=reverse)
    except PatchError as e:
        return e.message
    return None


def _explain(diff: Diff, stderr: str, reverse: bool) -> str:
    lines = [ln.removeprefix("error: ") for ln in stderr.strip().splitlines() if ln.strip()]
    what = "reverse-apply" if reverse else "apply"
    return f"{diff.path.name} does not {what}: " + "; ".join(lines[:4])
