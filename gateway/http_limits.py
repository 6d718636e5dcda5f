"""Per-connection limits at the HTTP protocol layer: header size (431),
header and body read timeouts (408) and an instance-wide connection cap
(which takes the slot of an idle kept-alive connection before it refuses).

Why here and not in the app: uvicorn's httptools protocol buffers a request's
headers without limit and waits for them without a deadline, before any ASGI
code runs. A 48 MiB header or 3,000 connections trickling one byte a second
never reach the app, yet they stall the event loop and pin file descriptors.
So the gateway runs uvicorn with this subclass of its httptools protocol
(`uvicorn.Config(http=GatewayHttpProtocol)`, see `gateway.server`), which
keeps uvicorn's parser and request cycle and adds the checks around them.
It also hands each request's cycle a `ResponseWriter`, so that a whole
response leaves in one write (`gateway.response_writer`).

Cost: on the common path (a request that arrives in one read) no timer is
armed per request, only a length add and two flag writes; timers are armed
only when a read ends with headers or body still incomplete.

Rejections answer with an OpenAI-shaped JSON body and `connection: close`,
then linger briefly (half-close, input discarded) so that a client still
sending sees the answer instead of a connection reset.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from contract.errors import error_body

from . import access_log
from .response_writer import ResponseWriter

# After a rejection the connection reads and drops input this long before it
# closes, so the answer is not lost to a reset (nginx's lingering_close).
LINGER_S = 1.0


def _response(status: int, message: str, code: str, extra: bytes = b"") -> bytes:
    body = error_body(status, message, code=code)
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n"
    ).encode()
    return head + extra + b"\r\n" + body


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits one listener enforces (from `GatewaySettings`)."""

    max_header_bytes: int = 60 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096
    access_log: bool = False  # rejections get an access-log record (`gateway.access_log`)
    # Pre-rendered answers: rejecting must not cost more than accepting.
    too_large: bytes = field(init=False, repr=False)
    header_timeout: bytes = field(init=False, repr=False)
    body_timeout: bytes = field(init=False, repr=False)
    over_capacity: bytes = field(init=False, repr=False)
    bad_request: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "too_large", _response(431, f"Request headers exceed the limit of {self.max_header_bytes} bytes.", "request_headers_too_large"))
        put(self, "header_timeout", _response(408, f"Request headers not received within {self.header_timeout_s:g} s.", "request_timeout"))
        put(self, "body_timeout", _response(408, f"Request body not received within {self.body_timeout_s:g} s.", "request_timeout"))
        put(self, "over_capacity", _response(503, "Too many open connections to this instance; retry shortly.", "server_busy", b"retry-after: 1\r\n"))
        put(self, "bad_request", _response(400, "Invalid HTTP request received.", "invalid_http_request"))

    @classmethod
    def from_settings(cls, gateway) -> "ConnectionLimits":
        return cls(gateway.max_header_bytes, gateway.header_timeout_s, gateway.body_timeout_s, gateway.max_connections, gateway.access_log)


class LimitedServerState(ServerState):
    """uvicorn's shared server state plus the limits its connections enforce,
    and the kept-alive connections now waiting for their next request, oldest
    first (what the cap reclaims)."""

    def __init__(self, limits: ConnectionLimits | None = None) -> None:
        super().__init__()
        self.limits = limits or ConnectionLimits()
        self.idle: dict[GatewayHttpProtocol, None] = {}


_DEFAULT_LIMITS = ConnectionLimits()


class _Rejected(Exception):
    """Raised from a parser callback to stop parsing a rejected request."""


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header size, header/body timeouts and
    a connection cap. Phases: headers (`_in_headers`) -> body (`_in_body`) ->
    response; `_timer` is the deadline of the phase in progress, if armed."""

    def __init__(self, config, server_state, app_state, _loop=None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits: ConnectionLimits = getattr(server_state, "limits", _DEFAULT_LIMITS)
        if not hasattr(server_state, "idle"):  # uvicorn's plain ServerState
            server_state.idle = {}
        self._idle: dict[GatewayHttpProtocol, None] = server_state.idle
        self._timer: asyncio.TimerHandle | None = None
        self._in_headers = True
        self._in_body = False
        self._header_bytes = 0
        self._last_read = 0
        self._dropping = False  # rejected: input is discarded until the connection closes
        self._t_request = 0.0  # loop time the current request's first byte arrived (or the connection opened)

    # Connection -----------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections and not self._reclaim_idle():
            # Over the cap: answer and close at once, without joining `connections`,
            # so a flood of idle sockets cannot pin file descriptors.
            self.transport = transport
            self._dropping = True
            transport.write(self.limits.over_capacity)
            transport.close()
            if self.limits.access_log:
                access_log.write(access_log.server_record(503, "server_busy", len(self.limits.over_capacity), 0.0))
            return
        super().connection_made(transport)
        self._t_request = self.loop.time()
        # A connection that never sends a byte is bounded by the header timeout too.
        self._timer = self.loop.call_later(self.limits.header_timeout_s, self._on_header_timeout)

    def _reclaim_idle(self) -> bool:
        """At the cap, close the kept-alive connection idle longest rather than
        refuse a new one (nginx reuses its idle keepalive connections the same
        way): with a keep-alive longer than the load balancers' idle timeouts,
        idle pools must not cost an active client its connection."""
        for conn in self._idle:
            conn._unset_keepalive_if_required()
            conn.transport.close()
            return True
        return False

    def _unset_keepalive_if_required(self) -> None:
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
            self._idle.pop(self, None)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # armed: idle until the next request
            self._idle[self] = None

    def connection_lost(self, exc) -> None:
        self._cancel_timer()
        if self._dropping and self.flow is None:  # refused by the cap: never joined
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._dropping:
            return
        self._unset_keepalive_if_required()
        if self._in_headers:
            self._header_bytes += len(data)
        else:
            self._last_read = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if self._dropping:  # our own rejection, raised from a callback
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        if self._in_headers:
            if self._header_bytes > self.limits.max_header_bytes:
                self._reject(self.limits.too_large, current=False, status=431, code="request_headers_too_large")
            elif self._timer is None:
                self._timer = self.loop.call_later(self.limits.header_timeout_s, self._on_header_timeout)
        elif self._in_body and self._timer is None:
            self._timer = self.loop.call_later(self.limits.body_timeout_s, self._on_body_timeout)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are not HTTP (or a header it
        refuses), in OpenAI's error shape like every other error of the
        gateway's, and logged: uvicorn would send plain text and log
        nothing to the access log. Goes through `_reject`, so the answer is
        not lost to a reset either."""
        # Broken inside a body (bad chunked framing): the app is reading this
        # request, so it is `current` (the app logs it under our 400).
        self._reject(self.limits.bad_request, current=self._in_body, status=400, code="invalid_http_request")

    # Parser callbacks -----------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_headers:  # the next request on a kept-alive connection
            self._t_request = self.loop.time()
            self._in_headers = True
            self._header_bytes = self._last_read

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._timer is not None:  # (`_cancel_timer` inline: every request passes here)
            self._timer.cancel()
            self._timer = None
        # The read count may include body bytes of the last read: measure exactly only then.
        if self._header_bytes > self.limits.max_header_bytes and self._header_size() > self.limits.max_header_bytes:
            self._reject(self.limits.too_large, current=False, status=431, code="request_headers_too_large")
            raise _Rejected()
        self._in_body = True
        super().on_headers_complete()
        cycle = self.cycle
        # This request's cycle (an upgrade makes none); a HEAD response has no body write to carry its head.
        if cycle is not None and cycle.scope is self.scope and self.scope["method"] != "HEAD":
            cycle.transport = ResponseWriter(self.transport)

    def on_message_complete(self) -> None:
        self._in_body = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().on_message_complete()

    def _header_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    # Deadlines ------------------------------------------------------------
    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_header_timeout(self) -> None:
        self._timer = None
        if not self.transport.is_closing() and not self._dropping:
            self._reject(self.limits.header_timeout, current=False, status=408, code="request_timeout")

    def _on_body_timeout(self) -> None:
        self._timer = None
        if not self.transport.is_closing() and not self._dropping:
            self._reject(self.limits.body_timeout, current=True, status=408, code="request_timeout")

    # Rejection ------------------------------------------------------------
    def _reject(self, response: bytes, *, current: bool, status: int, code: str) -> None:
        """Answer `response` (`status`, error `code`) and close. `current`: the
        request being rejected already has a request cycle (body phase);
        otherwise a cycle still open belongs to an earlier, pipelined request.
        The access log gets the rejection: from the app, which is still
        reading a current request (told on the cycle what the client got),
        or from here for a request the app never saw."""
        self._dropping = True
        self._cancel_timer()
        cycle = self.cycle
        app_logs = False  # the app's request path writes this request's record
        if cycle is not None and not cycle.response_complete:
            if current and not cycle.response_started:
                # The app is still reading this body: it sees a disconnect and
                # whatever it sends later is dropped; the answer is ours.
                setattr(cycle, access_log.SERVER_ANSWER, (status, len(response)))
                app_logs = True
                cycle.disconnected = True
                cycle.message_event.set()
            else:
                # A response is under way on this connection: let it finish, then close.
                cycle.keep_alive = False
                return
        self.transport.write(response)
        if self.limits.access_log and not app_logs:
            access_log.write(access_log.server_record(status, code, len(response), self.loop.time() - self._t_request))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self.flow is not None:
            self.flow.resume_reading()  # keep draining input so the close is not a reset
        self._timer = self.loop.call_later(LINGER_S, self.transport.close)
