"""A gateway in front of OpenAI-compatible servers that are already running (no engines started).

    python -m stack.gateway --upstream smollm2=http://127.0.0.1:8100 [--port 8000] [--config FILE]

For benchmarks and for putting vLLM servers you started yourself behind keys, fallbacks and metrics.
`vstack up` is the usual way: it starts the engines as well.
"""

from __future__ import annotations

import argparse

from stack.gateway.app import create_app
from stack.gateway.registry import Deployment, DeploymentRegistry
from stack.gateway.serve import run
from stack.gateway.settings import GatewayConfig


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m stack.gateway", description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", action="append", default=[], metavar="MODEL=URL[@SERVED_NAME]")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--config", help="a vstack config file; its `gateway:` section is used")
    args = ap.parse_args()
    if args.config:
        from stack.config import load_config

        settings = load_config(args.config).gateway
    else:
        settings = GatewayConfig()
    registry = DeploymentRegistry()
    default = None
    for i, spec in enumerate(args.upstream):
        model, _, rest = spec.partition("=")
        url, _, served = rest.partition("@")
        registry.add(
            Deployment(
                id=f"local-{i + 1}",
                model_group=model,
                kind="local",
                upstream_model=served or model,
                api_base=url.rstrip("/").removesuffix("/v1"),
            )
        )
        default = default or model
    app = create_app(settings, default_model=default or "default", registry=registry)
    run(app, args.host, args.port, settings.drain_grace_s)


if __name__ == "__main__":
    main()
