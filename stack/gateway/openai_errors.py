"""The gateway's one error model: each error knows its HTTP status and OpenAI's error envelope.

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

Every room raises these (http: bad requests and keys; routing: nothing can serve; upstreams: an engine or a
provider failed); the http room's handlers (stack.gateway.http.error_handlers) are the only place that turns
them into responses. Messages never include request headers or configuration values, so a key cannot leak.
"""

from __future__ import annotations

from typing import Any

from stack.errors import StackError


class GatewayError(StackError):
    status = 500
    type = "server_error"
    code: str | None = None
    in_activity = False  # the console's Activity has it already (the dispatcher recorded it): not twice

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.param = param
        self.code = code or type(self).code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return envelope(self.message, self.type, self.param, self.code)


class InvalidRequest(GatewayError):
    status, type = 400, "invalid_request_error"


class ContextTooLong(InvalidRequest):
    code = "context_length_exceeded"


class Unauthorized(GatewayError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class Forbidden(GatewayError):
    status, type = 403, "permission_error"


class ModelNotFound(GatewayError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class BodyTooLarge(GatewayError):
    status, type, code = 413, "invalid_request_error", "request_too_large"


class RateLimited(GatewayError):
    status, type, code = 429, "rate_limit_error", "rate_limit_exceeded"


class NoDeployment(GatewayError):
    """No deployment of the model (nor of its fallbacks) can serve now: 503 with Retry-After."""

    status, type, code = 503, "server_error", "no_deployment_available"


class UpstreamError(GatewayError):
    """An engine or provider failed. `retryable` decides between falling back and answering the client."""

    type = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        retryable: bool = True,
        reason: str = "error",
        upstream_body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, headers=headers)
        self.status = status
        self.retryable = retryable
        self.reason = reason  # for metrics: error, timeout, rate_limit, context_window, connect
        self.upstream_body = upstream_body
        if status < 500:
            self.type = "invalid_request_error" if status != 429 else "rate_limit_error"


def envelope(message: str, type_: str, param: str | None = None, code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
