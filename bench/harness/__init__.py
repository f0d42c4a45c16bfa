"""What every benchmark (and the tests) share, so each starts, waits for, stops and records things one way:

- `children`: child processes (engines, gateways, stand-ins) in their own sessions, stopped as a tree.
- `waiting`: free ports, waiting for an HTTP endpoint or a condition.
- `gateway_thread`: the gateway app served in a thread of this process (its state reachable).
- `stack_engine`: an engine's argv and env rendered by the stack, as `vstack up` renders them.
- `scrape`: the engines' Prometheus text through the gateway's /metrics/targets, with its key.
- `mock_upstream`: the local OpenAI-compatible stand-in for a cloud provider.
- `stream_load`: streamed requests timed, in a closed loop of c clients or open-loop (Poisson) arrivals.
- `relay_clients`, `relay_summary`: streams held in flight by several client processes, counted over one window,
  and the side-by-side figures of bench/gateway_relay.py (the gateway's relay ceiling).
- `byte_proxy`, `http_floor`: the floors under the gateway, a byte-forwarding proxy and a bare HTTP one.
- `ray_cluster`: a real local Ray cluster of several nodes with the stack on it.
- `models`: the SmolLM2 checkpoint the CPU runs use.
- `manifest`, `results`: one folder per run under bench/results/, with manifest.json beside the raw results.
- `performance_page`: docs/performance.md, generated from the manifests.
"""
