"""No request field may redirect a provider key (issue 34, item 1).

A cloud deployment's key is handed to LiteLLM, whose keyword arguments include its client options
(`api_base`, `base_url`, `extra_headers`, `custom_llm_provider`, ...). A body field of such a name, passed on,
would send our provider key to a host of the client's choice. The gateway forwards only the fields each API
defines: every route refuses any other top-level field (400, the field named), and the cloud client passes on
only those fields whatever a route let through.

The cloud provider is outside this machine: `bench/harness/mock_upstream.py` stands in for it, reached the way
the README's `openai/gpt-4o-mini` example is (no `api_base` in the entry: LiteLLM's OpenAI provider takes its
base URL from `OPENAI_BASE_URL`). A second local server, the trap, records anything sent to it: any request
that reaches it carries the provider key away.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stack.config.sections.gateway import GatewayConfig
from stack.gateway import request_fields
from stack.gateway.registry import Deployment
from stack.gateway.upstreams.cloud_client import CloudUpstream

from .conftest import run_gateway

KEY = "sk-provider-secret-0123456789"
GROUP = "gpt-4o-mini"
ROUTES = {  # endpoint -> (path, a valid body for it)
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    "completions": ("/v1/completions", {"prompt": "hi"}),
    "embeddings": ("/v1/embeddings", {"input": "hi"}),
    "responses": ("/v1/responses", {"input": "hi"}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
    "count_tokens": ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
    "tokenize": ("/tokenize", {"prompt": "hi"}),
    "detokenize": ("/detokenize", {"tokens": [1, 2]}),
}


class Trap:
    """A loopback HTTP server that answers 200 to anything and records what reached it."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, str]] = []  # (path, authorization header)
        trap = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                trap.hits.append((self.path, self.headers.get("authorization", "")))
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = _record

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def trap() -> Iterator[Trap]:
    t = Trap()
    yield t
    t.close()


@pytest.fixture(scope="module")
def gateway(cloud_mock, trap: Trap) -> Iterator:
    """The README's cloud entry: no api_base; the provider's URL comes from LiteLLM's environment."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PROVIDER_TEST_KEY", KEY)
    mp.setenv("OPENAI_BASE_URL", f"{cloud_mock.url}/v1")
    entry = {"model_name": GROUP, "litellm_params": {"model": "openai/gpt-4o-mini"},
             "api_key_env": "PROVIDER_TEST_KEY"}  # fmt: skip
    try:
        with run_gateway(GatewayConfig(cloud=[entry]), default_model=GROUP) as gw:
            yield gw
    finally:
        mp.undo()


def litellm_parameter_names() -> set[str]:
    """Every name LiteLLM takes as a keyword: its own parameter list and the signatures of the calls we make."""
    import litellm
    from litellm.anthropic_interface import messages
    from litellm.types.utils import all_litellm_params

    names = set(all_litellm_params)
    for fn in (litellm.acompletion, litellm.atext_completion, litellm.aembedding, litellm.aresponses,
               messages.acreate):  # fmt: skip
        names |= {p for p, v in inspect.signature(fn).parameters.items() if v.kind is not v.VAR_KEYWORD}
    # The OpenAI client's own request options, which LiteLLM hands to it.
    names |= {"base_url", "extra_headers", "extra_query", "extra_body", "default_headers", "http_client",
              "organization", "project", "api_type", "azure_ad_token", "aws_access_key_id", "aws_secret_access_key",
              "aws_region_name", "vertex_project", "vertex_location", "vertex_credentials", "input_cost_per_token"}
    return names - {"model", "self"}


def _post(gw, endpoint: str, extra: dict) -> httpx.Response:
    path, body = ROUTES[endpoint]
    return httpx.post(f"{gw.url}{path}", json={"model": GROUP, **body, **extra}, timeout=30)


@pytest.mark.parametrize("endpoint", ["responses", "messages", "chat"])
def test_api_base_in_the_body_cannot_take_the_provider_key(gateway, trap: Trap, endpoint: str) -> None:
    """The attack as found: today /v1/responses and /v1/messages passed `api_base` into LiteLLM's arguments."""
    trap.hits.clear()
    r = _post(gateway, endpoint, {"api_base": f"{trap.url}/v1"})
    assert trap.hits == [], f"the provider key went to the trap: {trap.hits}"
    assert r.status_code == 400, r.text
    assert "api_base" in r.json()["error"]["message"]
    assert KEY not in r.text


def test_every_litellm_parameter_name_on_every_route(gateway, trap: Trap) -> None:
    """Each LiteLLM keyword, with the trap's URL as its value, on each route: refused unless the route's API
    defines the field; whatever passed, nothing reached the trap."""
    trap.hits.clear()
    names = sorted(litellm_parameter_names())
    assert len(names) > 300  # LiteLLM's list, not an empty import
    accepted: dict[str, list[str]] = {}
    with httpx.Client(timeout=30) as http:
        for endpoint, (path, body) in ROUTES.items():
            allowed = request_fields.allowed(endpoint)
            for name in names:
                r = http.post(f"{gateway.url}{path}", json={"model": GROUP, **body, name: f"{trap.url}/v1"})
                if name in allowed:  # an API field (`user`, `metadata`, ...): type-checked, never a destination;
                    # a URL where the provider wants another shape may fail upstream (502/503), never as ours (500)
                    accepted.setdefault(endpoint, []).append(name)
                    assert r.status_code != 500, (endpoint, name, r.text)
                else:
                    assert r.status_code == 400, (endpoint, name, r.status_code, r.text)
                    assert name in r.json()["error"]["message"], (endpoint, name, r.text)
                assert KEY not in r.text
    assert trap.hits == [], trap.hits
    # LiteLLM's client options are never API fields of any route.
    for endpoint in ROUTES:
        assert not request_fields.allowed(endpoint) & request_fields.CLIENT_OPTIONS, endpoint


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    endpoint=st.sampled_from(["chat", "responses", "messages"]),
    name=st.sampled_from(sorted(request_fields.CLIENT_OPTIONS)),
    nest=st.sampled_from(["top", "metadata", "extra_body", "litellm_params"]),
)
def test_client_options_never_pass_in_any_shape(gateway, trap: Trap, endpoint: str, name: str, nest: str) -> None:
    """A client option at the top level or nested in a field that LiteLLM might merge: never reaches the trap."""
    trap.hits.clear()
    value = f"{trap.url}/v1"
    extra = {name: value} if nest == "top" else {nest: {name: value}}
    r = _post(gateway, endpoint, extra)
    assert r.status_code != 500, r.text
    assert KEY not in r.text
    assert trap.hits == [], trap.hits


def test_the_cloud_client_passes_only_api_fields() -> None:
    """Defence in depth: whatever a route let through, LiteLLM gets the API's fields and the entry's own."""
    dep = Deployment(id="c", model_group=GROUP, kind="cloud", upstream_model="openai/gpt-4o-mini",
                     litellm_params={"model": "openai/gpt-4o-mini"}, api_key_env="VSTACK_NO_SUCH_KEY")  # fmt: skip
    body = {"model": GROUP, "input": "hi", "temperature": 0, "api_base": "http://x", "base_url": "http://x",
            "extra_headers": {"a": "b"}, "custom_llm_provider": "openai", "metadata": {"k": "v"}}
    _, kwargs, _ = CloudUpstream(30)._kwargs(dep, "responses", body)
    assert not set(kwargs) & request_fields.CLIENT_OPTIONS - {"timeout", "num_retries"}
    assert {"input", "temperature", "metadata"} <= set(kwargs)
    assert kwargs["model"] == "openai/gpt-4o-mini"
