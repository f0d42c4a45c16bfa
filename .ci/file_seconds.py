"""Refresh tests/file-seconds.json, the committed seconds per test file that a fresh clone's run orders its files by
(longest first; tests/support/timing.py), from the last run's cache. Run it after a whole `.venv/bin/pytest`:

    .venv/bin/python .ci/file_seconds.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".pytest_cache" / "v" / "vstack" / "file-seconds"
COMMITTED = ROOT / "tests" / "file-seconds.json"


def main() -> int:
    if not CACHE.is_file():
        print(f"no {CACHE.relative_to(ROOT)}: run the suite first (.venv/bin/pytest)", file=sys.stderr)
        return 2
    seconds = json.loads(CACHE.read_text())
    present = {k: v for k, v in sorted(seconds.items()) if (ROOT / k).is_file()}  # files since moved or removed
    COMMITTED.write_text(json.dumps(present, indent=1) + "\n")
    print(f"{COMMITTED.relative_to(ROOT)}: {len(present)} files, {sum(present.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
