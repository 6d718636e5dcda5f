"""OpenAI-shaped error bodies, for every HTTP surface specgate serves (the
gateway's completion routes, its other routes and the admin API).

Every failure specgate itself produces is `{"error": {message, type, param,
code}}` with the status the OpenAI API would use, so SDK clients raise the
same exception classes (AuthenticationError, RateLimitError, ...) they would
against OpenAI or vLLM directly.
"""

from __future__ import annotations

import orjson

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
}
# OpenAI answers every 5xx with `server_error` (the SDK maps by status only,
# but code reading `error.type` expects OpenAI's names, not ours).
_SERVER_ERROR = "server_error"


def error_type(status: int) -> str:
    """OpenAI's `error.type` for an HTTP status: one table for the gateway's
    own errors and the replicas' (`gateway.replica_errors`)."""
    if status >= 500:
        return _SERVER_ERROR
    return _TYPES.get(status, "invalid_request_error")


def error_payload(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps(error_payload(status, message, param=param, code=code))


def install_error_handlers(app) -> None:
    """Make a FastAPI app answer HTTP and validation errors with OpenAI-shaped
    bodies (the gateway's routes and the admin API, wherever it is hosted)."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    def respond(status: int, message: str) -> JSONResponse:
        return JSONResponse(error_payload(status, message), status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException) -> JSONResponse:
        return respond(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError) -> JSONResponse:
        return respond(400, "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
