"""Writes the overlay a GPU start of PROFILE needs here (dummy weights of the real shape, held to the
profile's card) and prints its path: the input of `bench/startup_time.py --config` on the lent GPU.

    python3 -m bench.gpu.startup_prep PROFILE WORKDIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.gpu.device import detect
from bench.gpu.profiles import prepare
from stack.config import load_config


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python3 -m bench.gpu.startup_prep PROFILE WORKDIR")
    profile, work = sys.argv[1], Path(sys.argv[2])
    cfg = load_config()
    if profile not in cfg.profiles:
        sys.exit(f"{profile!r} is not a shipped profile; one of: {', '.join(sorted(cfg.profiles))}")
    run = prepare(cfg, profile, detect(), work)
    if run.held_to:
        print(f"held to: {run.held_to}", file=sys.stderr)
    print(run.overlay)


if __name__ == "__main__":
    main()
