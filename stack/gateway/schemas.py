"""Request bodies: what the gateway itself reads of one (`Read`), and the public APIs' own (OpenAI's
parameters, Anthropic's, Jina's and Cohere's rerank, plus vLLM's documented extensions).

A route checks only `Read` (or `TokenizeRequest`): the model it routes by, whether to stream. A local
engine gets the client's JSON as sent (`model` rewritten to the deployment's name) and checks every other
field itself, so the gateway accepts each field the installed vLLM accepts and refuses each one it refuses
with vLLM's own reason (adr/0047). A cloud deployment has no vLLM to check for it: the cloud client checks the
body against the API's model here (types, ranges, unknown fields -> 400, like OpenAI's own API) before LiteLLM
sees it; LiteLLM's keywords include client options that must never come from a body (request_fields).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

Stop = str | list[str] | None
Temperature = Annotated[float, Field(ge=0, le=2)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
# Strict: JSON `true` is not the integer 1 (pydantic's lax mode would take it); OpenAI refuses it too.
PositiveInt = Annotated[StrictInt, Field(ge=1)]


class Read(BaseModel):
    """What the gateway reads of a body itself: the model it routes by, whether and how to stream. Every other
    field is forwarded as sent, for the engine to check."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None  # the gateway adds include_usage to count tokens


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VllmSampling(_Request):
    """vLLM's sampling extensions (sent by the openai client through `extra_body`)."""

    top_k: StrictInt | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    length_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    ignore_eos: bool | None = None
    min_tokens: StrictInt | None = Field(None, ge=0)
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=-1)
    prompt_logprobs: StrictInt | None = Field(None, ge=-1)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    use_beam_search: bool | None = None
    add_special_tokens: bool | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    structural_tag: str | None = None
    priority: StrictInt | None = None
    request_id: str | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    logits_processors: list[Any] | None = None


class ContentPart(BaseModel):
    # text, image_url, input_audio, file, refusal, ...: forwarded as sent; every part names its type
    # (OpenAI refuses a part without one, and providers behind LiteLLM fail on it instead of answering 400).
    model_config = ConfigDict(extra="allow")
    type: str = Field(min_length=1)


class Message(BaseModel):
    # Content parts, tool calls, names, audio...: forwarded as sent; only the role is checked here.
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None


class StreamOptions(_Request):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM
    include_obfuscation: bool | None = None


class ChatCompletionRequest(VllmSampling):
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    n: StrictInt | None = Field(None, ge=1, le=128)
    response_format: dict[str, Any] | None = None
    seed: StrictInt | None = None
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: float | None = Field(None, ge=0, le=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # vLLM chat extensions
    echo: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None

    @field_validator("response_format")
    @classmethod
    def _format_type(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") not in ("text", "json_object", "json_schema", "structural_tag"):
            raise ValueError("type must be one of text, json_object, json_schema")
        if v is not None and v.get("type") == "json_schema" and not isinstance(v.get("json_schema"), dict):
            raise ValueError("json_schema must be an object with a `schema`")
        return v


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(VllmSampling):
    model: str = Field(min_length=1)
    prompt: Prompt
    best_of: StrictInt | None = Field(None, ge=1, le=128)
    echo: bool | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: StrictInt | None = Field(None, ge=0, le=20)
    max_tokens: PositiveInt | None = None
    n: StrictInt | None = Field(None, ge=1, le=128)
    seed: StrictInt | None = None
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: Temperature | None = None
    top_p: float | None = Field(None, ge=0, le=1)
    user: str | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, v: Prompt) -> Prompt:
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        return v


class EmbeddingRequest(_Request):
    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: StrictInt | None = Field(None, ge=1)
    user: str | None = None
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=-1)

    @field_validator("input")
    @classmethod
    def _not_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("input must not be empty")
        return v


class Named(BaseModel):
    # Forwarded as sent: the engine (or LiteLLM) checks the fields of these rich APIs.
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)


class ResponsesRequest(Named):
    input: str | list[dict[str, Any]] | None = None
    stream: bool | None = None
    metadata: dict[str, str] | None = None  # string pairs, as OpenAI defines it


class MessagesRequest(Named):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    stream: bool | None = None
    metadata: dict[str, str] | None = None  # Anthropic's {"user_id": ...}


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = "default"  # vLLM's: the served model


class RerankRequest(Named):
    """Rerank (Jina's and Cohere's API; vLLM's /rerank): the query's relevance to each document."""

    query: str | dict[str, Any]
    documents: list[Any] | str | dict[str, Any]
    top_n: StrictInt | None = Field(None, ge=0)
    return_documents: bool | None = None
    rank_fields: list[str] | None = None
    max_chunks_per_doc: StrictInt | None = None
    max_tokens_per_doc: StrictInt | None = None


class ScoreRequest(Named):
    """vLLM's /score: the similarity of each pair (one side against each of the other's), in any of its forms."""

    text_1: Any = None
    text_2: Any = None
    queries: Any = None
    documents: Any = None
    items: Any = None
    data_1: Any = None
    data_2: Any = None
