"""The request path's error: raised anywhere inside it, rendered once at the
edge as an OpenAI-shaped body (`contract.errors`)."""

from __future__ import annotations

from contract.errors import error_body


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
        self.raw_body = raw_body  # a replica's error body, already in OpenAI's shape (`replica_errors`)

    def body(self) -> bytes:
        if self.raw_body is not None:
            return self.raw_body
        return error_body(self.status, self.message, param=self.param, code=self.code)
