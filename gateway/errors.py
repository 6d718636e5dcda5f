"""OpenAI-shaped error bodies.

Every failure the gateway itself produces is `{"error": {message, type,
param, code}}` with the status the OpenAI API would use, so SDK clients raise
the same exception classes (AuthenticationError, RateLimitError, ...) they
would against OpenAI or vLLM directly.
"""

from __future__ import annotations

import orjson

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class GatewayError(Exception):
    """Raised inside the request path; rendered once at the edge."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
        raw_body: bytes | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or []
        self.raw_body = raw_body  # a replica's own error body, relayed unchanged

    def body(self) -> bytes:
        if self.raw_body is not None:
            return self.raw_body
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_payload(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "api_error"), "param": param, "code": code}}


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps(error_payload(status, message, param=param, code=code))
