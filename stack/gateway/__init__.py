"""The public endpoint: OpenAI-compatible API, routing, auth, admin API, metrics; LiteLLM for cloud providers.

Three rooms, each importing only those below it (.importlinter, adr/0010 and adr/0028):
- `http/`: what clients and operators speak: routes, keys, the error handlers, the server;
- `routing/`: which deployment answers (our one routing brain): fallback plan, choice, cooldowns, retries,
  replicas, liveness, admission, adapters, one attempt at a time;
- `upstreams/`: how an answer is fetched: the local fast path (aiohttp, bytes through) and the cloud client
  (LiteLLM's public API);
over a floor every room speaks (`registry`, `openai_errors`, `metrics`, `schemas`, `request_fields`,
`log_health`), under `app` (create_app wires the rooms), `engines` (the engines the gateway owns through
the model manager) and `console/` (the browser console, a client of the http room).

Import stack.gateway.app for create_app(); this package root stays light (stack.config imports settings).
"""
