"""A gateway in front of OpenAI-compatible servers that are already running (no engines started).

    python -m stack.gateway --upstream smollm2=http://127.0.0.1:8100 [--port 8000] [--config FILE] [--manage]

For benchmarks and for putting vLLM servers you started yourself behind keys, fallbacks and metrics.
`vstack up` is the usual way: it starts the engines as well. --manage hands the upstreams to the model
manager as attached engines (stack.engine.attached): it puts idle ones to sleep and wakes them on a
request, within the config's `manager:` settings, but never starts or stops them (the static compose
profiles: each model its own service).
"""

from __future__ import annotations

import argparse

from stack.gateway.app import create_app
from stack.gateway.engines import EngineSupervisor, ManagedEngine
from stack.gateway.registry import Deployment, DeploymentRegistry
from stack.gateway.serve import run
from stack.gateway.settings import GatewayConfig
from stack.manager.settings import ManagerConfig

ATTACHED_READY_S = 900.0  # a restarted engine service compiling or loading a large model: minutes


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m stack.gateway", description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", action="append", default=[], metavar="MODEL=URL[@SERVED_NAME]")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--config", help="a vstack config file; its `gateway:` (and `manager:`) sections are used")
    ap.add_argument("--manage", action="store_true", help="sleep idle upstreams and wake them on a request")
    args = ap.parse_args()
    manager = ManagerConfig()
    if args.config:
        from stack.config import load_config

        cfg = load_config(args.config)
        settings, manager = cfg.gateway, cfg.manager
    else:
        settings = GatewayConfig()
    upstreams = [parse_upstream(spec) for spec in args.upstream]
    default = upstreams[0][0] if upstreams else "default"
    if args.manage:
        sup = attached_supervisor(upstreams, manager)
        app = create_app(settings, default_model=default, on_startup=[sup.start], on_shutdown=[sup.stop])
    else:
        registry = DeploymentRegistry()
        for i, (model, url, served) in enumerate(upstreams):
            registry.add(Deployment(id=f"local-{i + 1}", model_group=model, kind="local", upstream_model=served,
                                    api_base=url))  # fmt: skip
        app = create_app(settings, default_model=default, registry=registry)
    run(app, args.host, args.port, settings.drain_grace_s, limits=settings)


def parse_upstream(spec: str) -> tuple[str, str, str]:
    """MODEL=URL[@SERVED_NAME] -> (model, base URL without /v1, served name)."""
    model, sep, rest = spec.partition("=")
    url, _, served = rest.partition("@")
    if not sep or not model or not url.startswith(("http://", "https://")):
        raise SystemExit(f"--upstream {spec!r}: expected MODEL=http://HOST:PORT[@SERVED_NAME]")
    return model, url.rstrip("/").removesuffix("/v1"), served or model


def attached_supervisor(upstreams: list[tuple[str, str, str]], manager: ManagerConfig) -> EngineSupervisor:
    """Each upstream an attached engine of the model manager; it may sleep if the engine says it can."""
    from stack.engine.attached import AttachedEngine, AttachedSpec
    from stack.manager.policy import Capacity

    engines = []
    for model, url, served in upstreams:
        engine = AttachedEngine(AttachedSpec(served, url))
        engines.append(ManagedEngine(engine, model, served, need=0, need_source="its own compose service",
                                     can_sleep=engine.supports_sleep()))  # fmt: skip
    sleep = any(e.can_sleep for e in engines)
    # Compose placed every engine already: memory is not the manager's to budget, only idleness.
    return EngineSupervisor(engines, ATTACHED_READY_S, 0, manager, Capacity(1 << 62, sleep_supported=sleep))


if __name__ == "__main__":
    main()
