"""The access log: one record per request, written when it ends, with what
the client saw (issue 33 item 3).

Why its own module: the record is built in two places that must agree on
its fields -- the request path's outcome stage (`outcome.finish`) for every
request the app handled, and the HTTP protocol layer (`http_limits`) for
requests rejected before the app saw them (431, header timeout 408, the
connection cap's 503, bytes that are not HTTP), and the completion endpoint
for what it refuses at its door (405, the in-flight cap's 503). The
decisions (which status the client saw, which replicas served it) are pure
functions of what those layers recorded; the logger call is the only I/O.

Fields (JSON, `gateway.logs.JsonFormatter`; absent ones are null):
`request_id`, `tenant`, `endpoint`, `status` (the status line the client
received: 200 for a stream that then ended with an error event, 408 for a
body the server stopped waiting for, 499 for a client that left first),
`stream` (bool), `stream_error` (the `code` of the SSE error event that
ended the stream, e.g. `shutting_down`, `upstream_error`; null when it
ended with `[DONE]` alone), `error` (the code of a rejection by the server
layer), `replicas` (the replicas that produced the response, in order, a
continued stream's continuations included), `continuations` (every attempt
to continue a broken stream: `{"replica", "outcome"}`, outcome `done`,
`spliced` (sent tokens, then broke too), `failed` or `refused`; a failed
continuation's replica shows here), `bytes` (bytes written to the
client's connection, head included), `prompt_tokens`, `completion_tokens`,
`duration_ms` (arrival to end).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .request_context import RequestContext

access_log = logging.getLogger("specgate.gateway.access")

# Set on uvicorn's request cycle by the protocol layer when it answered the
# request itself while the app was still reading it (body timeout): (status, bytes).
SERVER_ANSWER = "specgate_server_answer"


def client_status(status: int, response_started: bool, stream_error: str | None, server_status: int | None) -> int:
    """The status line the client received. The server's own answer (the
    body timeout's 408) wins over the app's view (a disconnect, 499); a
    stream whose head was out is a 200 whatever ended it in-band (the
    gateway counts it under the failure's status in its metrics)."""
    if server_status is not None:
        return server_status
    if response_started and stream_error is not None:
        return 200
    return status


def served_by(ctx: RequestContext) -> list[str]:
    """The replicas whose output the client got, in order: a continued
    stream's parts; for one whose continuation failed, the first replica
    and each continuation that sent bytes before it broke."""
    if ctx.parts:
        return [name for name, _ in ctx.parts]
    first = [] if ctx.replica is None else [ctx.replica.name]
    if ctx.continuations:
        first += [name for name, outcome in ctx.continuations if outcome in _SENT]
    return first


_SENT = ("done", "spliced")  # continuation outcomes whose replica's tokens reached the client


def continuations(ctx: RequestContext) -> list[dict[str, str]]:
    """Each continuation attempt of a broken stream and how it ended."""
    return [{"replica": name, "outcome": outcome} for name, outcome in ctx.continuations or ()]


def request_record(ctx: RequestContext, elapsed_s: float, send: Any) -> dict[str, Any]:
    """The record of a request the app handled. `send` is uvicorn's bound
    `cycle.send`: its cycle carries the protocol's answer (if any) and its
    transport (`ResponseWriter`) the bytes written."""
    cycle = getattr(send, "__self__", None)
    answer = getattr(cycle, SERVER_ANSWER, None)
    sent = answer[1] if answer else bytes_sent(send)
    usage = ctx.usage or {}
    return {
        "request_id": ctx.request_id,
        "tenant": ctx.tenant.id if ctx.tenant else None,
        "endpoint": ctx.endpoint,
        "status": client_status(ctx.status, ctx.response_started, ctx.stream_error, answer[0] if answer else None),
        "stream": ctx.stream,
        "stream_error": ctx.stream_error,
        "error": None,
        "replicas": served_by(ctx),
        "continuations": continuations(ctx),
        "bytes": sent,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "duration_ms": round(elapsed_s * 1000, 3),
    }


def bytes_sent(send: Any) -> int | None:
    """Bytes written so far to the connection of uvicorn's bound `cycle.send`
    (its `ResponseWriter` counts them); None where it cannot be known."""
    return getattr(getattr(getattr(send, "__self__", None), "transport", None), "sent", None)


def server_record(status: int, code: str, sent: int | None, elapsed_s: float, endpoint: str | None = None) -> dict[str, Any]:
    """The record of a request rejected before the request path ran: by the
    server layer (`endpoint` None) or at the endpoint's door (wrong method,
    the instance at its in-flight cap)."""
    return {
        "request_id": None,
        "tenant": None,
        "endpoint": endpoint,
        "status": status,
        "stream": False,
        "stream_error": None,
        "error": code,
        "replicas": [],
        "continuations": [],
        "bytes": sent,
        "prompt_tokens": None,
        "completion_tokens": None,
        "duration_ms": round(elapsed_s * 1000, 3),
    }


def write(fields: dict[str, Any]) -> None:
    access_log.info("request", extra={"fields": fields})
