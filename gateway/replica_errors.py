"""A replica's error body, rewritten into the OpenAI shape before it reaches
the client.

vLLM writes its errors as `{"error": {"message", "type": "BadRequestError",
"param", "code": 400}}` (older versions: `{"object": "error", "message", ...}`
at the top level). Clients reading `error.type` / `error.code` would see two
conventions from one endpoint, since the gateway's own errors follow OpenAI
(`contract.errors`). This is the one place a replica's error body is turned
into the OpenAI shape: the status and the replica's message are kept, `param`
is kept when the replica named one, `type` follows the status as OpenAI's API
does, and `code` is a string or null, never vLLM's numeric copy of the status.
"""

from __future__ import annotations

import orjson

from contract.errors import error_type
from contract.wire import DATA

_MAX_MESSAGE = 4000  # a replica's message can echo a huge prompt back


def openai_error_body(status: int, data: bytes) -> bytes:
    """The OpenAI-shaped body for a replica's error answer `data` with HTTP
    `status`. A body that is not JSON (a proxy's HTML page, plain text) keeps
    its text as the message, so nothing the replica said is lost; the
    message is capped at `_MAX_MESSAGE` characters."""
    err = _replica_error(data)
    message = err.get("message")
    if not isinstance(message, str) or not message:
        # No message field (a proxy's page, FastAPI's `detail`): its text is the message.
        message = data.decode("utf-8", "replace").strip() or f"The model replica answered {status}."
    return orjson.dumps(_openai_error(status, message, err))


def openai_error_event(obj: dict) -> bytes:
    """An engine's in-stream error event (`{"error": {...}}`, parsed), as the
    OpenAI-shaped SSE data line. The stream's HTTP status is long sent, so the
    status is vLLM's numeric `code` where it gave one (a 500 otherwise)."""
    inner = obj.get("error")
    if isinstance(inner, dict) and "message" not in inner and isinstance(inner.get("error"), dict):
        inner = inner["error"]  # the error response wrapped once more
    err = inner if isinstance(inner, dict) else {"message": inner} if isinstance(inner, str) else {}
    code = err.get("code")
    status = code if type(code) is int and 400 <= code <= 599 else 500
    message = err.get("message")
    if not isinstance(message, str) or not message:
        message = f"The model replica's stream failed ({status})."
    return DATA + orjson.dumps(_openai_error(status, message, err))


def _openai_error(status: int, message: str, err: dict) -> dict:
    param = err.get("param")
    code = err.get("code")
    return {
        "error": {
            "message": message[:_MAX_MESSAGE],
            "type": error_type(status),
            "param": param if isinstance(param, str) else None,
            "code": code if isinstance(code, str) and code else None,
        }
    }


def _replica_error(data: bytes) -> dict:
    """The replica's error object: `{"error": {...}}` or vLLM's older
    top-level `{"object": "error", ...}`; {} when the body is not JSON."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(obj, dict):
        return {}
    inner = obj.get("error")
    if isinstance(inner, dict):
        return inner
    if isinstance(inner, str):
        return {"message": inner}
    return obj
