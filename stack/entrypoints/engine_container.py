"""Inside an engine image: plan the engine with the vLLM installed there, fetch the model into the cache
volume, then exec vLLM on 0.0.0.0:PORT (the container's address on its internal network only).

    python -m stack.entrypoints.engine_container serve [PROFILE_OR_MODEL] [--port N]

The gateway starts engine containers with this command (stack.engine.docker_runtime.ContainerSpec).
"""

from __future__ import annotations

import argparse
import os
import sys

from stack.cli.every_command import run


def serve(target: str | None, port: int) -> None:
    """Plan, fetch the model into the cache, and exec vLLM bound to the container's network address."""
    from stack.assemble import plan_one
    from stack.config import load_config
    from stack.engine_env import ENGINE_KEY_ENV, engine_environ, without_secrets
    from stack.hardware import detect

    def say(line: str) -> None:
        print(f"vstack: {line}", flush=True)

    cfg = load_config()
    plan = plan_one(cfg, target, detect(), on_status=say, port=port)
    for note in plan.notes:
        say(note)
    plan.host = "0.0.0.0"  # the container's own address on its (internal) network; no port is published
    argv = plan.argv()
    say(plan.display())
    # Variables given to the container win over the profile's (an operator's VLLM_CPU_KVCACHE_SPACE, say);
    # its credential (VLLM_API_KEY, set by the gateway) is kept, any other secret dropped.
    env = engine_environ({**plan.env, **without_secrets(os.environ), "PYTHONUNBUFFERED": "1"},
                         os.environ.get(ENGINE_KEY_ENV))
    os.execve(argv[0], argv, env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stack.entrypoints.engine_container",
                                 description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve", help="run vLLM in this container for a profile or model (default: `serve:`)")
    serve_cmd.add_argument("target", nargs="?", default=None)
    serve_cmd.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    try:
        run(lambda: serve(None if args.target in (None, "", "auto") else args.target, args.port),
            lambda exc: print(f"error: {exc}", file=sys.stderr, flush=True))
    except SystemExit as done:  # run() exits with the error's code; a caller in Python gets it back
        return int(done.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
