"""Where upstream changes come from: a git range (commit subjects and paths) or two released wheels."""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stack.patches.tool_errors import TriageError
from stack.patches.triage.rules import Change

# Files are read from the target version to judge each tracked patch against it.
Reader = Callable[[str], bytes | None]
PR_REF = re.compile(r"(?:vllm-project/vllm/pull/|vllm/pull/|\(#)(\d{3,6})")


def cache_dir() -> Path:
    return Path(os.environ.get("VSTACK_CACHE_DIR", Path.home() / ".cache" / "vstack")) / "upstream"


@dataclass
class Side:
    version: str
    commit: str | None
    read: Reader


@dataclass
class Changes:
    changes: list[Change]
    baseline: Side
    target: Side
    dist: str
    source: str  # "release" or "git"


# -- git range ------------------------------------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    except FileNotFoundError as e:
        raise TriageError("git is not installed", hint="apt-get install git") from e
    except subprocess.CalledProcessError as e:
        raise TriageError(
            f"{repo}: git {' '.join(args[:2])} failed: {e.stderr.strip()}",
            hint="check that PATH is a git clone and both revisions exist (git fetch --tags)",
        ) from e
    return done.stdout


def git_range(repo: Path, start: str, end: str) -> Changes:
    """One Change per non-merge commit in start..end, oldest first."""
    sides = []
    for rev in (start, end):
        sha = _git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}").strip()

        def read(rel: str, sha: str = sha) -> bytes | None:
            done = subprocess.run(["git", "-C", str(repo), "show", f"{sha}:{rel}"], capture_output=True)
            return done.stdout if done.returncode == 0 else None

        sides.append(Side(rev, sha, read))
    log = _git(
        repo, "log", "--no-merges", "--reverse", "--format=%x00%H%x1f%s", "--name-only", f"{start}..{end}"
    )
    changes = []
    for block in log.split("\x00")[1:]:
        head, _, names = block.partition("\n")
        sha, _, subject = head.partition("\x1f")
        paths = [n for n in names.splitlines() if n.strip()]
        changes.append(Change.from_commit(sha[:12], subject, paths))
    return Changes(changes, sides[0], sides[1], "vllm", "git")


# -- released wheels ------------------------------------------------------------------------------
def fetch_wheel(dist: str, version: str, dest: Path | None = None) -> Path:
    """The wheel of dist==version from the package index, downloaded once into the cache."""
    dest = dest or cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    stem = dist.replace("-", "_")
    found = sorted(dest.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q"]
    cmd += ["-d", str(dest), f"{dist}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(f"{stem}-{version}-*.whl"))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel downloaded"]
        raise TriageError(
            f"cannot download {dist}=={version}: {tail[0]}",
            hint=f"check the version exists (pip index versions {dist}) and the index is reachable",
        )
    return found[0]


def _python_files(whl: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(whl) as z:
        return {n: z.read(n) for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")}


def _commit_of(files: dict[str, bytes]) -> str | None:
    m = re.search(rb"__commit_id__ = commit_id = '(?:g)?([0-9a-f]+)'", files.get("vllm/_version.py", b""))
    return m.group(1).decode() if m else None


def release_range(dist: str, start: str, end: str) -> Changes:
    """One Change per Python file of the vllm package that differs between the two released wheels."""
    old, new = (_python_files(fetch_wheel(dist, v)) for v in (start, end))
    changes = []
    for rel in sorted(old.keys() | new.keys()):
        a, b = old.get(rel), new.get(rel)
        if a == b or rel == "vllm/_version.py":
            continue
        status = "added" if a is None else "removed" if b is None else "modified"
        a_lines = (a or b"").decode(errors="replace").splitlines()
        b_lines = (b or b"").decode(errors="replace").splitlines()
        delta = [ln for ln in difflib.unified_diff(a_lines, b_lines, lineterm="", n=0) if ln[:1] in "+-"]
        added_text = "\n".join(ln for ln in delta if ln.startswith("+"))
        prs = sorted({int(x) for x in PR_REF.findall(added_text)})
        changes.append(
            Change(rel, f"{status}, {len(delta)} lines", [rel], status=status, prs=prs, size=len(delta))
        )
    return Changes(
        changes,
        Side(start, _commit_of(old), old.get),
        Side(end, _commit_of(new), new.get),
        dist,
        "release",
    )
