"""The background half of `vstack up` (and what the compose gateway runs, as stack.entrypoints.up): the
gateway on the public port, owning the engine(s) it starts on loopback.

    python -m stack.entrypoints.run stack.cli.gateway_process --plan FILE [--secrets-stdin] --port P [--failure-file F]
    python -m stack.entrypoints.up [PROFILE] --port P [--config FILE]                  (compose: plans first)

It lives with the CLI because `vstack up` starts it by module object (stack.engine_env.child_argv, from
stack.cli.lifecycle), and the CLI imports nothing above itself (adr/0010).

With --plan the gateway serves the StackPlan `vstack up` made (stack.planner.plans): it loads neither
the configuration nor the hardware, and plans nothing; the plan's secrets (key digests, the Hub token) come
on stdin with --secrets-stdin, never in the file. Without it, it plans first, as `vstack up -f` does.

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    ap = argparse.ArgumentParser(prog="python -m stack.entrypoints.up")  # its public name (compose)
    ap.add_argument("profile", nargs="?")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--config")
    ap.add_argument("--plan", type=Path, help="serve this plan (`vstack up` writes it): no planning here")
    ap.add_argument("--secrets-stdin", action="store_true", help="the plan's secrets, as JSON on stdin")
    ap.add_argument("--failure-file", type=Path)
    args = ap.parse_args()
    from stack.engine.early_spawn import KEY, spawn  # the standard library only: ~10 ms

    handed = json.loads(sys.stdin.read() or "{}") if args.plan is not None and args.secrets_stdin else {}
    early = None
    if isinstance(handed.get(KEY), dict):  # `vstack up` drew the default engine: spawn it before any import
        early = spawn(handed[KEY])
    from stack.assemble.gateways import serve
    from stack.assemble.planning import Launch, plan_up
    from stack.cli.console_sources import console_sources
    from stack.cli.every_command import run

    def body() -> int:
        try:
            return serve_plan()
        finally:  # a failure before the assembly took it over leaves no engine behind
            if early is not None:
                early.stop()

    def serve_plan() -> int:
        if args.plan is not None:
            from stack.planner.plans import StackPlan

            # {"secrets": {pointer: value}, "early_engine": ...} from `vstack up`; a bare {pointer: value} too
            plan = StackPlan.load(args.plan, handed.get("secrets", handed))
        else:
            from stack.config import load_config
            from stack.config.state_dir import check_state_dir

            cfg = load_config(args.config)
            check_state_dir(cfg)
            plan = plan_up(cfg, args.profile, on_status=lambda s: print(s, flush=True))
        return serve(Launch(plan, early_spawn=early), args.port, reload_from=(args.profile or plan.target, args.config),
                     console=console_sources(plan.config))  # fmt: skip

    def on_error(exc: StackError) -> None:
        if args.failure_file:
            args.failure_file.write_text(json.dumps({
                "message": exc.message, "hint": exc.hint, "log_tail": getattr(exc, "log_tail", ""),
                "exit_code": exc.exit_code, "kind": type(exc).__name__,
            }))  # fmt: skip
        print(f"vstack gateway: {exc}", file=sys.stderr)

    run(body, on_error)

