"""gateway.response_writer: a whole response leaves in one write, a stream's
head at once; through the real server (GatewayHttpProtocol gives every cycle
its writer) and on its own."""

from __future__ import annotations

import socket

import httpx
import pytest

from gateway import http_limits
from gateway.response_writer import ResponseWriter

from .conftest import KEYS

HEAD_WHOLE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"
HEAD_STREAM = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_a_whole_response_leaves_in_one_write():
    t = RecordingTransport()
    w = ResponseWriter(t)
    w.write(HEAD_WHOLE)
    assert t.writes == []
    w.write(b"{}")
    assert t.writes == [HEAD_WHOLE + b"{}"]


def test_a_streams_head_leaves_at_once_and_its_chunks_pass_through():
    t = RecordingTransport()
    w = ResponseWriter(t)
    w.write(HEAD_STREAM)
    assert t.writes == [HEAD_STREAM]
    w.write(b"5\r\ndata:\r\n")
    w.write(b"0\r\n\r\n")
    assert t.writes == [HEAD_STREAM, b"5\r\ndata:\r\n", b"0\r\n\r\n"]


def test_a_100_continue_is_not_taken_for_the_head():
    t = RecordingTransport()
    w = ResponseWriter(t)
    w.write(CONTINUE)
    assert t.writes == [CONTINUE]
    w.write(HEAD_WHOLE)
    w.write(b"{}")
    assert t.writes == [CONTINUE, HEAD_WHOLE + b"{}"]


def test_a_close_sends_a_held_head_first():
    t = RecordingTransport()
    w = ResponseWriter(t)
    w.write(HEAD_WHOLE)
    w.close()
    assert t.writes == [HEAD_WHOLE] and t.closed and w.is_closing()


# -- through the real server ----------------------------------------------------
@pytest.fixture
def recorded(monkeypatch):
    """Every write the gateway's response writers hand the real transport."""
    writes: list[bytes] = []

    class Recording(ResponseWriter):
        __slots__ = ()

        def __init__(self, transport) -> None:
            real_write = transport.write

            class Tee:
                def write(self, data: bytes) -> None:
                    writes.append(data)
                    real_write(data)

                def __getattr__(self, name):
                    return getattr(transport, name)

            super().__init__(Tee())

    monkeypatch.setattr(http_limits, "ResponseWriter", Recording)
    return writes


def _chat(**extra) -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


def test_the_gateways_whole_responses_leave_in_one_write(recorded, start_backend, start_gateway):
    gw = start_gateway([{"url": start_backend().url}])
    headers = {"Authorization": f"Bearer {KEYS['alpha']}"}
    with httpx.Client(base_url=gw.url, headers=headers, timeout=10) as client:
        r = client.post("/v1/chat/completions", json=_chat())
        assert r.status_code == 200
        whole = [w for w in recorded if w.startswith(b"HTTP/1.1 200")]
        assert len(whole) == 1 and whole[0].endswith(r.content)  # head and body, one write
        recorded.clear()
        bad = client.post("/v1/chat/completions", content=b"{not json")
        assert bad.status_code == 400
        assert len(recorded) == 1 and recorded[0].endswith(bad.content)  # errors too
        recorded.clear()
        with client.stream("POST", "/v1/chat/completions", json=_chat(stream=True)) as s:
            events = [line for line in s.iter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]"
        assert recorded[0].startswith(b"HTTP/1.1 200") and recorded[0].endswith(b"\r\n\r\n")  # the head alone, at once


def test_head_and_expect_100_continue_are_answered(start_backend, start_gateway):
    gw = start_gateway([{"url": start_backend().url}])
    port = gw.server.port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # HEAD: no body write follows, so its head is not held (and the connection stays usable).
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        head_answer, get_answer = data.split(b"\r\n\r\n", 1)
        assert head_answer.startswith(b"HTTP/1.1 ") and get_answer.startswith(b"HTTP/1.1 200")  # no body after HEAD's head
    body = b'{"model":"fake-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEYS['alpha']}\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        data = b""
        while b'"choices"' not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        assert data.startswith(b"HTTP/1.1 200")
