"""The gateway's one error model: each error knows its HTTP status and OpenAI's error envelope.

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

Every room raises these (http: bad requests and keys; routing: nothing can serve; upstreams: an engine or a
provider failed); the http room's handlers (stack.gateway.http.error_handlers) are the only place that turns
them into responses. Messages never include request headers or configuration values, so a key cannot leak.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stack.errors import StackError


class GatewayError(StackError):
    status = 500
    type = "server_error"
    code: str | None = None
    in_activity = False  # the console's Activity has it already (the dispatcher recorded it): not twice
    rejection: str | None = None  # the reason /metrics counts it under (its code, or its type, when None)

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


class InvalidBody(InvalidRequest):
    """A body its API's model refuses (a route's schema, or the cloud client's check): counted as FastAPI's
    validation errors are."""

    rejection = "invalid_body"


class Unauthorized(GatewayError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class Forbidden(GatewayError):
    status, type = 403, "permission_error"


class ModelNotFound(GatewayError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


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


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None]:
    """pydantic's errors (a route's, or the cloud client's check of an API body) as OpenAI's message and param."""
    if not errors:
        return "Invalid request body.", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        return (
            "We could not parse the JSON body of your request. Make sure the body is valid JSON "
            "and the Content-Type header is application/json.",
            None,
        )
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}", param
    if kind == "missing" and param is not None:
        return f"Missing required parameter: '{param}'.", param
    if param is None:
        # An empty or `null` body arrives as a missing body (loc ('body',)): no parameter to name.
        return (
            "The request body must be a JSON object with `model` and the endpoint's parameters "
            "(Content-Type: application/json); it was empty, null or not an object."
        ), None
    # pydantic's message names the field and the rule; never echo the input (it may be large or private).
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"Invalid value for '{param}': {first.get('msg', 'invalid')}{more}", param
