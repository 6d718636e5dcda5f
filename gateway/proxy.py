"""The hot path: `/v1/chat/completions` and `/v1/completions` as a pure ASGI
endpoint (no Starlette request objects, no middleware), because every
microsecond here is paid on every request.

`CompletionEndpoint._handle` runs the request through named stages, each
filling in its part of one `RequestContext`:

    auth (401)                                  stages.authenticate
    parse: body size (413), JSON and shape,     stages.parse
      specgate knobs (400), model (404)
    admit: budget reservation (429 +            stages.admit
      Retry-After; 503 when the store is down)
    route (503)                                 stages.route
    relay: upstream attempts with failover      relay.relay
      before the first byte, then the response
      (SSE events forwarded as they arrive)
    outcome: budget settlement and refunds,     outcome.account / on_error /
      telemetry, metrics, access log, spans       finish

A client disconnect (seen by a watcher on ASGI `receive`) cancels the work,
which closes the upstream connection so the replica aborts the request —
for streaming and non-streaming requests alike.
"""

from __future__ import annotations

import asyncio
import random
import time

from . import access_log
from .asgi_io import send_error, watch_disconnect
from .deps import RequestPathState
from .errors import GatewayError
from .relay import relay
from .request_context import RequestContext
from .outcome import account, finish, on_error
from .stages import admit, authenticate, parse, route

__all__ = ["CompletionEndpoint", "send_error"]

_perf = time.perf_counter
# Request ids tie a client's error to the gateway's log lines; they are not
# secrets, so the Mersenne Twister (one C call) rather than os.urandom (a
# system call per request).
_request_bits = random.getrandbits


class CompletionEndpoint:
    """ASGI endpoint for one OpenAI completion surface ("chat" or "completions")."""

    def __init__(self, state: RequestPathState, kind: str) -> None:
        self.state = state
        self.kind = kind
        self.path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        self.endpoint_label = "chat" if kind == "chat" else "completions"

    async def __call__(self, scope, receive, send) -> None:
        t0 = _perf()
        state = self.state
        if scope["method"] != "POST":
            await send_error(send, GatewayError(405, f"Method {scope['method']} not allowed; use POST.", code="method_not_allowed"))
            self._log_refusal(send, t0, 405, "method_not_allowed")
            return
        inflight = state.inflight_requests
        if len(inflight) >= inflight.limit or state.draining_closed:
            # Bounded: past the cap a client is told to come back rather
            # than queued without limit (the replicas' queues are the queue).
            await send_error(
                send,
                GatewayError(503, "The gateway is at capacity; retry shortly.", code="overloaded", headers=[(b"retry-after", b"1")]),
            )
            state.metrics.overloaded.inc()
            self._log_refusal(send, t0, 503, "overloaded")
            return
        ctx = RequestContext(t0, self.endpoint_label, self.path)
        ctx.request_id = f"{_request_bits(64):016x}"
        session_name = state.session_header
        for key, value in scope["headers"]:
            if key == b"authorization":
                ctx.authorization = value
            elif key == b"content-length":
                try:
                    ctx.content_length = int(value)
                except ValueError:
                    ctx.content_length = None
            elif key == b"traceparent":
                ctx.traceparent = value
            elif key == b"tracestate":
                ctx.tracestate = value
            elif key == session_name:
                ctx.session = value.decode("latin-1")
        task = asyncio.current_task()
        inflight[task] = ctx
        tracing = state.tracing
        try:
            if not tracing.enabled:
                await self._handle(ctx, receive, send)
                return
            root = ctx.root = tracing.start("specgate.request", tracing.extract(ctx.traceparent, ctx.tracestate), "server", {"http.route": self.path})
            try:
                ctx.root_ctx = tracing.context_of(root)
                status = await self._handle(ctx, receive, send)
                root.set_attribute("http.status_code", status)
            finally:
                root.end()
        finally:
            del inflight[task]

    def _log_refusal(self, send, t0: float, status: int, code: str) -> None:
        """The access-log record of a request refused at the door, before it
        has a context (`outcome.finish` writes every other one)."""
        if self.state.settings.gateway.access_log:
            access_log.write(access_log.server_record(status, code, access_log.bytes_sent(send), _perf() - t0, self.endpoint_label))

    async def _handle(self, ctx: RequestContext, receive, send) -> int:
        state = self.state
        try:
            authenticate(state, ctx)
            await parse(state, ctx, receive)
            ctx.watcher = watch_disconnect(receive)  # from here on a disconnect cancels this task
            await admit(state, ctx)
            ranked = route(state, ctx)
            await relay(state, ctx, ranked, send)
            account(state, ctx)
        except BaseException as exc:
            if not await on_error(state, ctx, exc, send):
                raise
        finally:
            if ctx.watcher is not None and not ctx.watcher.done():
                ctx.watcher.cancel()
        finish(state, ctx, send)
        return ctx.status
