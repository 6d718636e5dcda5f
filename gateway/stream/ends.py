"""How a request the gateway cannot finish is ended, by whether the client
was sent a byte yet: before, a 503 it may retry (`abort_error`); after (the
stream's headers are out), in-band: an SSE error event carrying the request
id, `[DONE]`, end of body (`end_stream_with_error`), never a silent cut.

One module for both because the relay (a stream that cannot go on) and the
request's outcome stage (a failure of any stage) end requests alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contract import wire

from ..errors import GatewayError

if TYPE_CHECKING:
    from ..request_context import RequestContext

RETRY_1 = (b"retry-after", b"1")

# What a client reads when its stream cannot go on, by why it ended: (message,
# code, the status the request is counted under); the detail is in the
# gateway's log under the request id.
STREAM_ENDS = {
    "broken": ("The model replica serving this stream failed mid-stream; retry the request.", "upstream_error", 502),
    "replica_wedged": ("The model replica serving this stream stopped making progress; retry the request.", "upstream_timeout", 504),
    "shutdown": ("The gateway is shutting down; retry the request.", "shutting_down", 503),
}


def abort_error(reason: str) -> GatewayError:
    """The 503 (retry) for a request the gateway ended itself, by `abort`'s
    reason, before the client was sent a byte."""
    if reason == "shutdown":
        return GatewayError(503, "The gateway is shutting down; retry the request.", code="shutting_down", headers=[RETRY_1])
    return GatewayError(503, "The model replica stopped making progress; retry the request.", code="no_healthy_replica", headers=[RETRY_1])


def error_event(message: str, code: str = "upstream_error") -> bytes:
    """The in-band error: an SSE event with an OpenAI-shaped error body."""
    return wire.sse({"error": {"message": message, "type": "server_error", "param": None, "code": code}})


async def end_stream_with_error(ctx: RequestContext, send, message: str, code: str) -> None:
    """In-band end of a stream whose headers are out: an SSE error event
    carrying the request id, `[DONE]`, end of body."""
    body = error_event(f"{message} (request id {ctx.request_id})", code) + wire.DONE
    ctx.stream_error = code  # the access log's record of how the stream ended
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def end_stream(ctx: RequestContext, send, ended: str) -> int:
    """End a stream that cannot go on, by why (`STREAM_ENDS`); returns the
    status the request is counted under."""
    message, code, status = STREAM_ENDS[ended]
    await end_stream_with_error(ctx, send, message, code)
    return status
