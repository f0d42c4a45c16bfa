"""Every inference endpoint the gateway serves, declared once (issue 51, item 2; adr/0047).

An entry says what each part of the gateway needs to know about its endpoint: its paths (the first is the one
the reference shows; the others are aliases vLLM serves it at too), which model tasks serve it and where the
engine serves it, the public API's body (checked for a cloud deployment; a local engine checks its own), what
the gateway reads of it (the rest is forwarded as sent), whether it streams and takes
`stream_options.include_usage`, which LiteLLM call serves it on a cloud deployment, whether the fast path may
serve it, and which fields the gateway's `max_tokens_limit` applies to. The FastAPI routes
(stack.gateway.http.endpoint_routes), the fast path's table, the cloud client's calls, the task check and the
Activity's routes are all built from this table: a new endpoint is one entry here (and its API's request model).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from pydantic import BaseModel

from stack.gateway import schemas

GENERATE, EMBED = "generate", "embed"


@dataclass(frozen=True)
class Endpoint:
    name: str  # the dispatcher's, the metrics' and the trace's word for it
    paths: tuple[str, ...]  # where the gateway serves it; paths[0] is the documented one
    api: type[BaseModel]  # the public API's body: checked by the cloud client, its fields all a cloud call gets
    tasks: frozenset[str]  # the model tasks (`task:` in a model's config) whose engines serve it
    engine_path: str = ""  # where a local engine serves it (paths[0] when empty)
    operation: str = ""  # OpenTelemetry's gen_ai.operation.name (the name when empty)
    streams: bool = False  # may answer a stream (`"stream": true`)
    usage_option: bool = False  # its streams take stream_options.include_usage (the gateway counts tokens)
    cloud_call: str | None = None  # the LiteLLM function that serves it on a cloud deployment
    event_stream: bool = False  # its streams are typed events (`event:` lines), not chat chunks
    fast_path: bool = False  # a plain request may skip FastAPI's layers (stack.gateway.http.openai_fast_path)
    token_fields: tuple[str, ...] = ()  # the fields `max_tokens_limit` bounds
    reads: type[BaseModel] = schemas.Read  # what the route checks (the rest is the engine's: adr/0047)

    @property
    def path(self) -> str:
        return self.paths[0]

    @property
    def pools(self) -> bool:
        """Served by pooling models only (embeddings, scores): it generates no tokens."""
        return self.tasks == {EMBED}

    @property
    def upstream_path(self) -> str:
        return self.engine_path or self.paths[0]


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("chat", ("/v1/chat/completions",), schemas.ChatCompletionRequest, frozenset({GENERATE}),
             operation="chat", streams=True, usage_option=True,
             cloud_call="acompletion", fast_path=True, token_fields=("max_tokens", "max_completion_tokens")),
    Endpoint("completions", ("/v1/completions",), schemas.CompletionRequest, frozenset({GENERATE}),
             operation="text_completion", streams=True, usage_option=True,
             cloud_call="atext_completion", fast_path=True, token_fields=("max_tokens",)),
    Endpoint("embeddings", ("/v1/embeddings",), schemas.EmbeddingRequest, frozenset({EMBED}),
             cloud_call="aembedding", fast_path=True),
    Endpoint("responses", ("/v1/responses",), schemas.ResponsesRequest, frozenset({GENERATE}),
             operation="chat", streams=True, cloud_call="aresponses",
             event_stream=True, token_fields=("max_output_tokens",)),
    Endpoint("messages", ("/v1/messages",), schemas.MessagesRequest, frozenset({GENERATE}),
             operation="chat", streams=True, cloud_call="anthropic_messages",
             event_stream=True, token_fields=("max_tokens",)),
    Endpoint("count_tokens", ("/v1/messages/count_tokens",), schemas.Named, frozenset({GENERATE})),
    Endpoint("rerank", ("/v1/rerank", "/rerank", "/v2/rerank"), schemas.RerankRequest, frozenset({EMBED}),
             engine_path="/rerank", cloud_call="arerank"),
    Endpoint("score", ("/v1/score", "/score"), schemas.ScoreRequest, frozenset({EMBED}), engine_path="/score"),
    Endpoint("pooling", ("/pooling",), schemas.Named, frozenset({EMBED})),  # vLLM's raw pooler output
    Endpoint("tokenize", ("/tokenize",), schemas.TokenizeRequest, frozenset({GENERATE, EMBED}),
             reads=schemas.TokenizeRequest),
    Endpoint("detokenize", ("/detokenize",), schemas.TokenizeRequest, frozenset({GENERATE, EMBED}),
             reads=schemas.TokenizeRequest),
)  # fmt: skip

BY_NAME: MappingProxyType[str, Endpoint] = MappingProxyType({e.name: e for e in ENDPOINTS})
BY_PATH: MappingProxyType[str, Endpoint] = MappingProxyType({p: e for e in ENDPOINTS for p in e.paths})


def serves(task: str) -> frozenset[str]:
    """The endpoints a model of `task` serves."""
    return frozenset(e.name for e in ENDPOINTS if task in e.tasks)


def paths_of(task: str) -> list[str]:
    """The documented paths of the endpoints a model of `task` serves (for the error that names them)."""
    return [e.path for e in ENDPOINTS if task in e.tasks and e.path.startswith("/v1/")]
