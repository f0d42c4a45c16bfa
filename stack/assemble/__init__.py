"""The composition root: the one place that turns a configuration into a plan, and a plan into a gateway.

    plan = plan_up(cfg, target)                 # inputs gathered once: hardware, vLLM options, Docker, Ray
    app, sup = build_gateway(Launch(plan))      # the FastAPI app and the supervisor of its engines
    serve(Launch(plan), port)                   # both, until SIGTERM; EngineError if the default fails to start

`vstack up` plans in its own process and hands the plan to the gateway process it starts
(`python -m stack.entrypoints.up --plan FILE`), which serves it without loading the configuration or
detecting the hardware again; `vstack up -f` does both in one process; the compose gateway (no --plan)
plans then serves. `vstack tune`, `vstack plan` and the engine container's entry plan through `plan_up` too,
so no entry point can choose settings the others would not.

- planning.py: `plan_up`, and the `Launch` that serves a plan;
- runtimes.py: each planned model's engine runtime and the supervisor of them all (the model manager's slots);
- reloader.py: `vstack reload` inside the running gateway;
- gateways.py: `build_gateway`, `serve`, and the gateway in front of running servers (`build_front_gateway`).
"""
