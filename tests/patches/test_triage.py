"""Upgrade triage over a git range (a small repository built here) and over the real 0.32.0 -> 0.33.0
released artifacts (downloaded once into the cache)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from stack.patches.ledger import load_ledger
from stack.patches.tool_errors import LedgerError, TriageError
from stack.patches.triage import option_changes as opts
from stack.patches.triage.change_sources import git_range, release_range
from stack.patches.triage.report import build, to_markdown, update_tracking
from stack.patches.triage.rules import Bucket, Change, load_rules
from tests.patches.conftest import PATCHES, git

UTILS = "vllm/tool_parsers/utils.py"
MAIN = "vllm/entrypoints/cli/main.py"

# (subject, {path: content or None to keep}) in order; each is one commit after the baseline.
COMMITS = [
    ("[Bugfix][Tool Parser] Preserve large integer tool arguments (#55743)", {UTILS: "fixed"}),
    ("[ROCm] Tune the aiter fused MoE path (#60001)", {"vllm/platforms/rocm.py": "x = 2\n"}),
    ("[CI/Build] Bump the buildkite image (#60002)", {".buildkite/test.yaml": "steps: []\n"}),
    ("[Model] Add FooLM (#60003)", {"vllm/model_executor/models/foolm.py": "class Foo: ...\n"}),
    ("[Frontend] Add a response header (#60004)", {"vllm/entrypoints/openai/api_server.py": "h = 1\n"}),
    ("[torch.compile] Fuse more ops (#60005)", {"vllm/compilation/passes.py": "p = 1\n"}),
    ("[Perf][Spec Decode] Faster EAGLE proposer (#60006)", {"vllm/v1/spec_decode/eagle.py": "fast = 1\n"}),
    ("Rename a test helper", {"tests/test_x.py": "def helper(): ...\n"}),
    ("[Misc] Reword the CLI epilog", {MAIN: "edit-main"}),
    ("Touch the CPU attention backend", {"vllm/v1/attention/backends/cpu_attn.py": "cpu = 2\n"}),
]
EXPECTED = [
    ("high", "high-bugfix-tag"),
    ("skip", "skip-other-platform-tag"),
    ("skip", "skip-ci-docs-tag"),
    ("medium", "medium-model-tag"),
    ("low", "low-frontend-tag"),
    ("skip", "skip-torch-compile-tag"),
    ("high", "high-perf-tag"),
    ("skip", "skip-ci-docs-paths"),
    ("low", "low-frontend-tag"),
    ("high", "high-cpu-paths"),
]


@pytest.fixture
def upstream_repo(tmp_path: Path, pristine_site: Path) -> Path:
    """A small vLLM-shaped repository: the real 0.32.0 files at the baseline, then one commit per change."""
    repo = tmp_path / "vllm-src"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for rel in (UTILS, MAIN, "vllm/v1/attention/backends/cpu_attn.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes((pristine_site / rel).read_bytes())
    for rel in ("vllm/platforms/rocm.py",):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "v0.32.0")
    git(repo, "tag", "v0.32.0")
    for subject, files in COMMITS:
        for rel, content in files.items():
            path = repo / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if content == "fixed":  # the upstream fix itself, as upstream wrote it
                git(repo, "apply", str(PATCHES / "backport-55743-tool-args-large-int.patch"))
            elif content == "edit-main":  # moves the context our dist-name patch needs
                text = path.read_text().replace(
                    "    from vllm.utils.argparse_utils import Flexible",
                    "    from vllm.utils.argparse_utils import (Flexible",
                )
                path.write_text(text.replace("FlexibleArgumentParser\n", "FlexibleArgumentParser)\n", 1))
            else:
                path.write_text(content)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", subject)
    git(repo, "tag", "v0.33.0")
    return repo


def test_git_range_triage_classifies_each_commit_by_its_rule(upstream_repo: Path, tmp_path: Path) -> None:
    changes = git_range(upstream_repo, "v0.32.0", "v0.33.0")
    assert [c.title for c in changes.changes] == [s for s, _ in COMMITS]
    assert changes.changes[0].tags == ["Bugfix", "Tool Parser"] and changes.changes[0].prs == [55743]
    rules = load_rules()
    got = [(rules.classify(c).bucket.value, rules.classify(c).id) for c in changes.changes]
    assert got == EXPECTED

    report = build(changes, rules, load_ledger(), None, "git range: options not compared")
    assert report["counts"] == {"high": 3, "medium": 1, "low": 2, "skip": 4}
    assert report["target"]["commit"] == git(upstream_repo, "rev-parse", "v0.33.0").strip()
    verdicts = {p["id"]: p["verdict"] for p in report["patches"]}
    assert verdicts["backport-55743-tool-args-large-int"] == "needless"  # upstream has it now
    assert verdicts["vllm-cpu-dist-name"] == "breaks"  # the [Misc] commit moved its context
    assert verdicts["cpu-fp8-kv-isa-check"] == "review"

    md = to_markdown(report)
    assert "| high | 3 |" in md and "**needless**" in md and "(#55743)" in md and "high-bugfix-tag" in md

    again = build(changes, rules, load_ledger(), None, None, [{"change": "#60003", "decision": "deferred"}])
    assert again["buckets"]["medium"][0]["decided"].startswith("deferred")

    tracking = tmp_path / "tracking.yaml"
    tracking.write_text(
        yaml.safe_dump({"decisions": [{"change": "#60003", "decision": "deferred", "reason": "r"}]})
    )
    update_tracking(report, [tmp_path / "r.md"], tracking)
    saved = yaml.safe_load(tracking.read_text())
    assert (
        saved["baseline"]["version"] == "v0.32.0" and saved["target"]["commit"] == report["target"]["commit"]
    )
    assert saved["decisions"] == [{"change": "#60003", "decision": "deferred", "reason": "r"}]  # kept


def test_git_range_errors_name_the_repo_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(TriageError) as e:
        git_range(tmp_path, "v1", "v2")
    assert str(tmp_path) in str(e.value) and "fix:" in str(e.value)


def test_bad_rules_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "rules.yaml"
    bad.write_text(
        "buckets: {high: x}\nrules:\n  - {id: r, bucket: urgent, why: w}\n"
        "default: {id: d, bucket: low, why: w}\n"
    )
    with pytest.raises(LedgerError, match=r"rules.yaml: rules.0.bucket"):
        load_rules(bad)


def test_release_without_tags_uses_path_rules() -> None:
    rules = load_rules()
    assert (
        rules.classify(Change("f", "added", ["vllm/model_executor/models/x.py"], status="added")).bucket
        is Bucket.MEDIUM
    )
    assert rules.classify(Change("f", "modified", ["vllm/platforms/rocm.py"])).bucket is Bucket.SKIP
    assert rules.classify(Change("f", "modified", ["vllm/platforms/cpu.py"])).bucket is Bucket.HIGH


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def test_release_triage_on_the_real_0_32_to_0_33_artifacts() -> None:
    try:
        changes = release_range("vllm", "0.32.0", "0.33.0")
    except TriageError:
        if not _pypi_reachable():
            pytest.skip("PyPI is unreachable: cannot download the vllm 0.32.0 / 0.33.0 wheels")
        raise
    assert (changes.baseline.commit, changes.target.commit) == ("5df63a720", "4ba787ec9")
    assert len(changes.changes) > 900
    old, new = opts.dump_for("0.32.0"), opts.dump_for("0.33.0")
    assert old and new
    options = opts.diff_options(old, new, opts.used_options())
    report = build(changes, load_rules(), load_ledger(), options)
    assert sum(report["counts"].values()) == len(changes.changes) and all(report["counts"].values())
    verdicts = {p["id"]: p for p in report["patches"]}
    assert verdicts["backport-55743-tool-args-large-int"]["verdict"] == "needless"
    assert verdicts["backport-55743-tool-args-large-int"]["range"] == "target outside applies_to"
    assert verdicts["vllm-cpu-dist-name"]["verdict"] == "breaks"  # 0.33 moved the imports it touches
    utils = next(i for items in report["buckets"].values() for i in items if i["ref"] == UTILS)
    assert utils["rule"] == "low-frontend-paths"
    used = {(o["option"], o["change"]) for o in report["serve_options"]["used_by_our_configs"]}
    assert ("enable_prefix_caching", "flags") in used  # --no-X became --disable-X in 0.33


def test_option_changes_0_26_to_0_32_include_removed_and_default_changes() -> None:
    old, new = opts.dump_for("0.26.0"), opts.dump_for("0.32.0")
    assert old and new
    changes = {(c.option, c.change): c for c in opts.diff_options(old, new, {"swap_space": ["x.yaml"]})}
    assert ("calculate_kv_scales", "removed") in changes
    assert changes[("allowed_origins", "default")].new == []
