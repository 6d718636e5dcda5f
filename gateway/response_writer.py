"""One write for a whole response: its head and its body.

uvicorn writes a response's status line and headers as soon as the app sends
`http.response.start`, and the body as a write of its own: every response
left the gateway in at least two writes, so two TCP segments and two
wake-ups of the client (on loopback, where the gateway meets its load
balancer or sidecar, a segment costs the sender ~5-10 µs of kernel time).

A `ResponseWriter` stands in for the transport of one request/response cycle
(`GatewayHttpProtocol` gives it to every cycle but a HEAD request's, whose
body send writes nothing). A head that announces a `content-length` (a whole
body, which the gateway always sends right after the head) is held and
leaves with the body's first write. A chunked head (a stream) leaves at
once: the client parses it while the gateway reads the first event, and
holding it would put that parse on the stream's time to first token
(measured: +0.16 ms at 10 req/s, docs/gateway.md). A close flushes a head
still held (an app that fails after `http.response.start`), so the client
sees what it saw before, a head and then the close.
"""

from __future__ import annotations

import asyncio

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"  # what uvicorn writes before reading a body that expects it
# uvicorn writes header names in lower case, each line after a CRLF.
_WHOLE_BODY = b"\r\ncontent-length: "


class ResponseWriter:
    """The transport as one response cycle sees it (write, close, is_closing)."""

    __slots__ = ("_head", "sent", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._head: bytes | None = None  # None: no head held yet; bytes: held; b"": sent
        self.sent = 0  # bytes written to the client (the access log's `bytes`)

    def write(self, data: bytes) -> None:
        head = self._head
        if head is None:  # the cycle's first write: the response head, or a 100 Continue before it
            if data != _CONTINUE:
                if _WHOLE_BODY in data:
                    self._head = data  # it leaves with the body
                    return
                self._head = b""  # a stream's head: at once
        elif head:
            self._head = b""
            data = head + data
        self.sent += len(data)
        self.transport.write(data)

    def flush(self) -> None:
        if self._head:
            self.sent += len(self._head)
            self.transport.write(self._head)
            self._head = b""

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()
