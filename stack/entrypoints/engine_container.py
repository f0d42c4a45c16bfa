"""Inside an engine image: run the ModelPlan the gateway handed over (or plan the engine with the vLLM installed
here, fetching the model into the cache volume), then exec vLLM on 0.0.0.0:PORT (the container's address on
its internal network only).

    python -m stack.entrypoints.engine_container serve [PROFILE_OR_MODEL] [--plan-json JSON] [--port N]

The gateway starts engine containers with this command (stack.engine.docker_runtime.ContainerSpec), with
the model's plan as --plan-json (its secrets in VSTACK_PLAN_SECRETS): the container runs it as planned,
without loading the configuration or detecting the hardware. It plans for itself only where the handed plan
cannot run here, and says why: another vLLM than the plan was rendered for, or the model's files not in this
container's cache (a gateway on a host, whose engines keep a cache of their own). A container started
without a plan (the static compose profiles) plans for itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from stack.assemble.planning import PLAN_SECRETS_ENV
from stack.cli.every_command import run


def say(line: str) -> None:
    print(f"vstack: {line}", flush=True)


def handed_plan(plan_json: str | None):  # -> ModelPlan | None
    """The gateway's ModelPlan, when this container can run it as it is; else None (said why)."""
    if not plan_json:
        return None
    from stack.planner.plans import ModelPlan
    from stack.vllm.launcher import installed_vllm

    plan = ModelPlan.from_public(json.loads(plan_json), json.loads(os.environ.get(PLAN_SECRETS_ENV) or "{}"))
    here = installed_vllm()
    if here is None or (here[0], here[1]) != (plan.vllm.distribution, plan.vllm.version):
        found = f"{here[0]} {here[1]}" if here else "no vLLM"
        say(f"planning here: the plan was rendered for {plan.vllm.distribution} {plan.vllm.version}, this image "
            f"has {found}")
        return None
    if not Path(plan.model_arg).is_dir():
        say(f"planning here: the model's files ({plan.model_arg}) are not in this container's cache")
        return None
    return plan


def serve(target: str | None, port: int, plan_json: str | None = None) -> None:
    """Run the handed plan (else plan, fetching the model into the cache) and exec vLLM bound to the
    container's network address."""
    from stack.engine_env import ENGINE_KEY_ENV, engine_environ, without_secrets

    plan = handed_plan(plan_json)
    if plan is None:
        from stack.assemble.planning import plan_up
        from stack.config import load_config

        plan = plan_up(load_config(), target, on_status=say).default
    for note in plan.notes:
        say(note)
    # The container's own address on its (internal) network; no port is published. Its own Python runs vLLM.
    argv = [sys.executable, *plan.argv(port, host="0.0.0.0")[1:]]
    say(plan.display(port, host="0.0.0.0"))
    # Variables given to the container win over the plan's (an operator's VLLM_CPU_KVCACHE_SPACE, say);
    # its credential (VLLM_API_KEY, set by the gateway) is kept, any other secret dropped.
    env = engine_environ({**plan.env, **without_secrets(os.environ), "PYTHONUNBUFFERED": "1"},
                         os.environ.get(ENGINE_KEY_ENV))
    env.pop(PLAN_SECRETS_ENV, None)
    os.execve(argv[0], argv, env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stack.entrypoints.engine_container",
                                 description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve", help="run vLLM in this container for a profile or model (default: `serve:`)")
    serve_cmd.add_argument("target", nargs="?", default=None)
    serve_cmd.add_argument("--plan-json", default=None, help="the model's plan, as the gateway planned it")
    serve_cmd.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    try:
        run(lambda: serve(None if args.target in (None, "", "auto") else args.target, args.port, args.plan_json),
            lambda exc: print(f"error: {exc}", file=sys.stderr, flush=True))
    except SystemExit as done:  # run() exits with the error's code; a caller in Python gets it back
        return int(done.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
