"""A gateway in front of OpenAI-compatible servers that are already running (no engines started).

    python -m stack.entrypoints.gateway --upstream smollm2=http://127.0.0.1:8100 [--port 8000] [--config FILE]
        [--manage]

For benchmarks and for putting vLLM servers you started yourself behind keys, fallbacks and metrics.
`vstack up` is the usual way: it starts the engines as well. --manage hands the upstreams to the model
manager as attached engines (stack.engine.attached): it puts idle ones to sleep and wakes them on a
request, within the config's `manager:` settings, but never starts or stops them (the static compose
profiles: each model its own service).
"""

from __future__ import annotations

import argparse

from stack.assemble.gateways import build_front_gateway
from stack.config.sections.gateway import GatewayConfig, resolve_workers
from stack.config.sections.manager import ManagerConfig
from stack.config.sections.observability import TracingConfig
from stack.gateway.http.serve import run
from stack.tracing.settings import resolve


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m stack.entrypoints.gateway", description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", action="append", default=[], metavar="MODEL=URL[@SERVED_NAME]")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--config", help="a vstack config file; its `gateway:` (and `manager:`) sections are used")
    ap.add_argument("--manage", action="store_true", help="sleep idle upstreams and wake them on a request")
    ap.add_argument("--workers", help="processes on the port: a count or `auto` (default: gateway.workers)")
    args = ap.parse_args()
    manager, tracing = ManagerConfig(), TracingConfig()
    state_file = token_file = None  # without a config, /admin changes are not kept across restarts (/admin/models
    if args.config:  # says so), and /admin answers local clients without a token, as a gateway in a test does
        from stack.config import load_config
        from stack.manager.admin_token import token_path

        cfg = load_config(args.config)
        settings, manager, state_file = cfg.gateway, cfg.manager, cfg.state_dir / "runtime.json"
        token_file = token_path(cfg.state_dir)
        tracing = cfg.observability.tracing
    else:
        settings = GatewayConfig()
    settings = settings.model_copy(update={"host": args.host})  # the names /admin and /ui answer to include it
    upstreams = [parse_upstream(spec) for spec in args.upstream]
    app = build_front_gateway(settings, manager, upstreams, args.manage, state_file, token_file,
                              tracing=resolve(tracing))
    # --workers, else the config's gateway.workers; without either one process (benchmarks and tests rely on it)
    chosen = args.workers or (settings.workers if args.config else 1)
    workers = resolve_workers("auto" if chosen == "auto" else int(chosen))
    if workers > 1:  # N processes on the port, this one the owner behind them (adr/0049)
        from stack.gateway.workers.pool import owner_server

        owner_server(app, settings, args.host, args.port, workers).run()
        return
    run(app, args.host, args.port, settings.drain_grace_s, limits=settings)


def parse_upstream(spec: str) -> tuple[str, str, str]:
    """MODEL=URL[@SERVED_NAME] -> (model, base URL without /v1, served name)."""
    model, sep, rest = spec.partition("=")
    url, _, served = rest.partition("@")
    if not sep or not model or not url.startswith(("http://", "https://")):
        raise SystemExit(f"--upstream {spec!r}: expected MODEL=http://HOST:PORT[@SERVED_NAME]")
    return model, url.rstrip("/").removesuffix("/v1"), served or model


if __name__ == "__main__":
    main()
