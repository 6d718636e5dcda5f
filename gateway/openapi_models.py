"""Pydantic models that describe the gateway's HTTP surface in `/openapi.json`.

Why they exist only as documentation: the completion endpoints are served by
the pure-ASGI hot path (`proxy.CompletionEndpoint`), which never builds these
models. A client's body is forwarded to the replica as it arrived, so fields
the gateway does not know (sampling options of newer vLLM versions, tools,
`vllm_xargs`, ...) pass through byte for byte. Request models therefore allow
extra fields, list only the fields worth documenting, and constrain only what
the gateway itself checks (`model`, `messages`/`prompt`, `stream`,
`stream_options`); the replica validates the rest and its 4xx is relayed.
Response models describe what an OpenAI-compatible replica (vLLM) answers;
they allow extra fields too, because the gateway relays the replica's body.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    """Unknown fields are allowed (and forwarded unchanged by the gateway)."""

    model_config = ConfigDict(extra="allow")


# -- requests ---------------------------------------------------------------
class StreamOptions(_Open):
    include_usage: bool | None = Field(default=None, description="send a final usage-only chunk (`choices: []`)")


class ChatMessage(_Open):
    role: str = Field(description="system, user, assistant, tool, ...")
    content: Union[str, list[dict[str, Any]], None] = Field(default=None, description="text, or a list of content parts")


class _CompletionParams(_Open):
    model: str = Field(min_length=1, description="a model served by at least one replica (see GET /v1/models)")
    stream: bool | None = Field(default=None, description="true: the response is an SSE stream (text/event-stream)")
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, description="completion length cap; also sizes the budget reservation")
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    user: str | None = None
    vllm_xargs: dict[str, Any] | None = Field(
        default=None,
        description="vLLM extra args; `specgate_*` knobs are validated by the gateway (400 on a bad one), the rest pass through",
    )


class ChatCompletionRequest(_CompletionParams):
    """`POST /v1/chat/completions`. Any other field is forwarded to the replica unchanged."""

    messages: list[ChatMessage] = Field(min_length=1, description="the conversation (non-empty)")
    max_completion_tokens: int | None = None


class CompletionRequest(_CompletionParams):
    """`POST /v1/completions`. Any other field is forwarded to the replica unchanged."""

    prompt: Union[str, list[str], list[int], list[list[int]]] = Field(description="text, texts, or token ids")


# -- responses --------------------------------------------------------------
class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int | None = None
    total_tokens: int


class ChatChoice(_Open):
    index: int
    message: dict[str, Any]
    finish_reason: str | None = None


class ChatCompletion(_Open):
    """A whole chat completion (`stream` false). With `stream: true` the body is
    `text/event-stream`: `data: <chat.completion.chunk JSON>` events, then
    `data: [DONE]`; a failure after the first byte ends the stream with a
    `data: {"error": {...}}` event and `[DONE]`."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class CompletionChoice(_Open):
    index: int
    text: str
    finish_reason: str | None = None


class Completion(_Open):
    """A whole text completion (`stream` false); streaming as for chat, with
    `text_completion` chunks."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Open):
    id: str
    object: str = "model"
    owned_by: str | None = None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    healthy_replicas: list[str]
    policy_version: int


class Readiness(_Open):
    ready: bool
    draining: bool
    healthy_replicas: bool
    budget_store: Literal["up", "down"]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    # A replica's own error is relayed unchanged; vLLM puts the HTTP status (an int) here.
    code: Union[str, int, None] = None


class ErrorResponse(BaseModel):
    """Every error the gateway produces: OpenAI's shape, so SDKs raise the
    usual exception classes."""

    error: ErrorDetail


# -- what each route documents ---------------------------------------------
SSE = "text/event-stream"

# One server-sent event (before OpenAPI 3.2, a `text/event-stream` schema
# describes each event, not the whole stream).
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "description": (
        "One SSE event. `data` is a chunk as JSON (`chat.completion.chunk` or `text_completion`; with "
        "`stream_options.include_usage` the last one has `choices: []` and `usage`), an error object "
        "`{\"error\": {...}}` when the stream fails after its first byte, or the final `[DONE]`."
    ),
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
    "required": ["data"],
}

_ERROR_MEANINGS = {
    400: "malformed JSON, a wrong shape, or a bad `vllm_xargs.specgate_*` knob (or the replica's own 400, relayed)",
    401: "missing or unknown API key",
    404: "no replica serves this model (healthy replicas exist, and no replica ever seen lists it)",
    408: "the request's headers or body arrived too slowly",
    413: "request body over `max_body_bytes`",
    429: "over the tenant's budget (`Retry-After`, `x-ratelimit-*`)",
    431: "request headers too large",
    503: "no healthy replica for the model (`no_healthy_replica`), budget store down, gateway at capacity or draining (`Retry-After`)",
    504: "the replica did not answer in time",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorResponse, "description": _ERROR_MEANINGS.get(s, "error")} for s in statuses}


COMPLETION_ERRORS = (400, 401, 404, 408, 413, 429, 431, 503, 504)


def _header(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}}


# OpenAI's names; present for tenants with a budget on that field.
RATELIMIT_HEADERS = {
    f"x-ratelimit-{kind}-{field}": _header(text.format(field=field))
    for field in ("requests", "tokens")
    for kind, text in (
        ("limit", "the tenant's {field} per window"),
        ("remaining", "{field} left in the window"),
        ("reset", "until the window has room again, e.g. `1.5s`, `6m0s`"),
    )
}
RETRY_AFTER = {"retry-after": _header("seconds to wait before retrying")}


def completion_responses(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """200 as JSON or SSE, then the error statuses (all OpenAI-shaped)."""
    responses = {
        200: {
            "model": model,
            "description": "the replica's completion; with `stream: true`, an SSE stream ending in `data: [DONE]`",
            "content": {SSE: {"schema": SSE_EVENT}},
            "headers": {
                "x-specgate-replica": _header("the replica that answered"),
                "x-specgate-overhead-ms": _header("time the gateway added"),
                **RATELIMIT_HEADERS,
            },
        },
        **error_responses(*COMPLETION_ERRORS),
        "5XX": {"model": ErrorResponse, "description": "every replica tried failed (the last replica's 5xx body is relayed)"},
    }
    responses[429]["headers"] = {**RETRY_AFTER, **RATELIMIT_HEADERS}
    responses[503]["headers"] = dict(RETRY_AFTER)
    return responses


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route whose body the hot path reads raw (no
    parsing here, so the bytes reach the replica unchanged)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


REQUEST_MODELS = (ChatCompletionRequest, CompletionRequest)


def add_request_schemas(openapi: dict[str, Any]) -> dict[str, Any]:
    """Put the request models (referenced by `request_body`) into
    `components.schemas`; FastAPI only adds models it parses itself."""
    from pydantic.json_schema import models_json_schema

    _, top = models_json_schema([(m, "validation") for m in REQUEST_MODELS], ref_template="#/components/schemas/{model}")
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in top.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    return openapi
