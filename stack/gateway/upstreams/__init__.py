"""The gateway's upstreams room: how an answer is fetched. `fast_path`: a local engine's bytes streamed through
(aiohttp, no LiteLLM); `cloud_client`: cloud providers through LiteLLM's public API; `provider_keys`: which
provider keys may go where."""
