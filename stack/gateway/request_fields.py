"""The request-body fields each API defines: the only ones the gateway accepts and forwards (adr/0006).

A body goes to a local engine as JSON and to a cloud provider as LiteLLM keyword arguments. LiteLLM's
keywords include its client options (`api_base`, `base_url`, `api_key`, `extra_headers`,
`custom_llm_provider`, ...): a body field of such a name, passed on, would send our provider key to a host of
the client's choosing. So every route refuses a top-level field its API does not define (400, naming it, as
OpenAI's API does), and the cloud client passes on only these fields whatever a route let through.

The lists are the public APIs' own (OpenAI Chat Completions, Completions, Embeddings and Responses;
Anthropic Messages and count_tokens) plus vLLM's documented extensions to each (its protocol models), so a
local engine still gets every option it serves. Chat, completions and embeddings take theirs from the
request models of their entries in stack.gateway.endpoints (as does any endpoint with no list here).
"""

from __future__ import annotations

from stack.gateway.endpoints import BY_NAME

# OpenAI's Responses API (openai-python's ResponseCreateParams) and vLLM's additions (its ResponsesRequest).
_RESPONSES = frozenset({
    "model", "input", "background", "conversation", "include", "instructions", "max_output_tokens",
    "max_tool_calls", "metadata", "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key",
    "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier", "store", "stream",
    "stream_options", "temperature", "text", "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user",
    # vLLM
    "cache_salt", "chat_template_kwargs", "enable_response_messages", "frequency_penalty", "ignore_eos",
    "include_reasoning", "include_stop_str_in_output", "kv_transfer_params", "logit_bias", "min_p",
    "mm_processor_kwargs", "presence_penalty", "previous_input_messages", "priority", "repetition_penalty",
    "request_id", "seed", "skip_special_tokens", "stop", "stop_token_ids", "structured_outputs", "top_k",
    "vllm_xargs",
})  # fmt: skip

# Anthropic's Messages API and vLLM's additions (its AnthropicMessagesRequest).
_MESSAGES = frozenset({
    "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream", "temperature", "top_k",
    "top_p", "tools", "tool_choice", "thinking", "service_tier", "container", "mcp_servers", "context_management",
    "output_config", "cache_control",
    # vLLM
    "cache_salt", "chat_template_kwargs", "kv_transfer_params", "vllm_xargs",
})  # fmt: skip

_COUNT_TOKENS = frozenset({
    "model", "messages", "system", "tools", "tool_choice", "thinking", "context_management", "output_config",
    "mcp_servers", "chat_template_kwargs",
})  # fmt: skip

# vLLM's /tokenize (completion and chat forms) and /detokenize.
_TOKENIZE = frozenset({
    "model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "continue_final_message",
    "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "tools", "return_token_strs",
})  # fmt: skip
_DETOKENIZE = frozenset({"model", "tokens"})

_FIELDS: dict[str, frozenset[str]] = {
    "responses": _RESPONSES,
    "messages": _MESSAGES,
    "count_tokens": _COUNT_TOKENS,
    "tokenize": _TOKENIZE,
    "detokenize": _DETOKENIZE,
}

# LiteLLM's and the provider SDKs' client options: where a call goes, with which credentials, headers and
# client. None is an API field of any route (tests/gateway/test_request_fields.py checks it); the cloud
# client sets `timeout` and `num_retries` itself.
CLIENT_OPTIONS = frozenset({
    "api_base", "base_url", "api_key", "api_version", "api_type", "custom_llm_provider", "deployment_id",
    "organization", "project", "headers", "extra_headers", "extra_query", "extra_body", "default_headers",
    "client", "http_client", "shared_session", "model_list", "litellm_params", "litellm_credential_name",
    "use_litellm_proxy", "ssl_verify", "timeout", "request_timeout", "stream_timeout", "num_retries",
    "max_retries", "mock_response", "azure_ad_token", "azure_ad_token_provider", "azure_username",
    "azure_password", "tenant_id", "client_id", "client_secret", "region_name", "aws_access_key_id",
    "aws_secret_access_key", "aws_session_token", "aws_region_name", "aws_role_name", "aws_profile_name",
    "aws_web_identity_token", "vertex_project", "vertex_location", "vertex_credentials", "input_cost_per_token",
    "output_cost_per_token", "provider_specific_header", "allowed_openai_params", "proxy_server_request",
})  # fmt: skip


def allowed(endpoint: str) -> frozenset[str]:
    """The top-level fields a request to `endpoint` may carry: its list here, else the fields its request model
    declares; empty for an endpoint we do not know."""
    entry = BY_NAME.get(endpoint)
    return _FIELDS.get(endpoint) or (frozenset(entry.api.model_fields) if entry is not None else frozenset())


def unknown(endpoint: str, body: dict) -> list[str]:
    """The body's top-level fields that `endpoint`'s API does not define, sorted."""
    fields = allowed(endpoint)
    return sorted(k for k in body if k not in fields)


def only_api_fields(endpoint: str, body: dict) -> dict:
    """The body without any field `endpoint`'s API does not define (the cloud client's last line)."""
    fields = allowed(endpoint)
    return {k: v for k, v in body.items() if k in fields}
