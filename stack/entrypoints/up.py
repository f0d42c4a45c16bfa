"""What `vstack up` runs in the background (and the compose gateway runs): the gateway on the public
port, owning the engine(s) it starts on loopback.

    python -m stack.entrypoints.up [PROFILE] --port P [--config FILE] [--failure-file F]

Exit codes are the stack's own (stack.errors.EXIT_CODES): a configuration error 2, the default model's
engine failing to start 3, a model not found 4, a model that does not fit 6, ... With --failure-file the
error (message, hint, this run's engine log tail, exit code) is written there as JSON too, so that `vstack
up`, which started this process, reports it as if it had failed itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from stack.cli.every_command import run
from stack.errors import StackError

CTRL_C = " (Press CTRL+C to quit)"


class NoCtrlCHint(logging.Filter):
    """This process runs detached (`vstack up` in the background, a Compose service): no terminal sends it
    Ctrl-C, so uvicorn's "(Press CTRL+C to quit)" would mislead; `vstack down` / `docker compose down` stop it."""

    def filter(self, record: logging.LogRecord) -> bool:
        for attr in ("msg", "color_message"):
            value = getattr(record, attr, None)
            if isinstance(value, str) and CTRL_C in value:
                setattr(record, attr, value.replace(CTRL_C, ""))
        return True


def main() -> None:
    logging.getLogger("uvicorn.error").addFilter(NoCtrlCHint())
    ap = argparse.ArgumentParser(prog="python -m stack.entrypoints.up")
    ap.add_argument("profile", nargs="?")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--config")
    ap.add_argument("--failure-file", type=Path)
    args = ap.parse_args()
    from stack.assemble import plan_engines, serve
    from stack.cli.console_sources import console_sources
    from stack.config import load_config
    from stack.config.state_dir import check_state_dir

    def body() -> int:
        cfg = load_config(args.config)
        check_state_dir(cfg)
        planned = plan_engines(cfg, args.profile, on_status=lambda s: print(s, flush=True))
        return serve(planned, args.port, reload_from=(args.profile, args.config), console=console_sources(cfg))

    def on_error(exc: StackError) -> None:
        if args.failure_file:
            args.failure_file.write_text(json.dumps({
                "message": exc.message, "hint": exc.hint, "log_tail": getattr(exc, "log_tail", ""),
                "exit_code": exc.exit_code, "kind": type(exc).__name__,
            }))  # fmt: skip
        print(f"vstack gateway: {exc}", file=sys.stderr)

    run(body, on_error)


if __name__ == "__main__":
    main()
