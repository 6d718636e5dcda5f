"""The access log tells what the client saw (issue 33 item 3): for each
probe case a real gateway (its production server, on loopback) gets the
request from a real client, and the one access-log record it writes is
compared with the status line, the stream's end and the replicas the client
observed. Cases: 200, streamed 200, gateway 400, 401, 429, slow body 408,
oversized header 431, header timeout 408, bytes that are not HTTP (400),
a wrong method (405), the in-flight and connection caps (503), a stream
continued on another replica, one whose continuation failed, a stream
ended by the drain."""

from __future__ import annotations

import json
import logging
import socket
import threading

import httpx
import pytest

from .conftest import KEYS, read_until_close, tenant, wait_for


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(dict(record.fields))

    def one(self, **match) -> dict:
        """The single record matching `match`, waited for (records are written when requests end)."""
        found = wait_for(lambda: [r for r in self.records if all(r.get(k) == v for k, v in match.items())], timeout=10)
        assert len(found) == 1, (match, found)
        return found[0]


@pytest.fixture
def access():
    logger = logging.getLogger("specgate.gateway.access")
    handler = _Records()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _chat(url: str, key: str = "alpha", stream: bool = False, max_tokens: int = 2, **extra) -> dict:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": max_tokens, "stream": stream, **extra}
    return {"url": url + "/v1/chat/completions", "json": body, "headers": {"authorization": f"Bearer {KEYS.get(key, key)}"}}


def _stream(url: str, **kw) -> tuple[httpx.Headers, int, list[dict | str]]:
    with httpx.stream("POST", timeout=30, **_chat(url, stream=True, **kw)) as r:
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
        return r.headers, r.status_code, [e if e == "[DONE]" else json.loads(e) for e in events]


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        return read_until_close(sock)


def test_records_match_what_clients_saw(start_backend, start_gateway, access):
    backend = start_backend(name="r1")
    gw = start_gateway(
        [{"url": backend.url, "name": "r1"}], [tenant("alpha"), tenant("beta", requests_per_minute=1)],
        access_log=True, header_timeout_s=0.5, body_timeout_s=0.5,
    )
    url, port = gw.url, gw.server.port

    r = httpx.post(timeout=30, **_chat(url))  # 200
    rec = access.one(request_id=r.headers["x-request-id"])
    assert (r.status_code, rec["status"], rec["stream"], rec["replicas"], rec["stream_error"]) == (200, 200, False, ["r1"], None)
    assert rec["completion_tokens"] == r.json()["usage"]["completion_tokens"] == 2
    assert rec["bytes"] > len(r.content) and rec["tenant"] == "alpha" and rec["duration_ms"] > 0

    headers, status, events = _stream(url)  # streamed 200
    rec = access.one(request_id=headers["x-request-id"])
    assert events[-1] == "[DONE]" and not any("error" in e for e in events if isinstance(e, dict))
    assert (status, rec["status"], rec["stream"], rec["stream_error"], rec["replicas"]) == (200, 200, True, None, ["r1"])

    r = httpx.post(timeout=30, **_chat(url, messages="not a list"))  # the gateway's 400
    assert (r.status_code, access.one(request_id=r.headers["x-request-id"])["status"]) == (400, 400)

    r = httpx.post(timeout=30, **_chat(url, key="sk-wrong"))  # 401
    assert (r.status_code, access.one(request_id=r.headers["x-request-id"])["status"]) == (401, 401)

    assert httpx.post(timeout=30, **_chat(url, key="beta")).status_code == 200
    r = httpx.post(timeout=30, **_chat(url, key="beta"))  # 429: over the budget
    rec = access.one(request_id=r.headers["x-request-id"])
    assert (r.status_code, rec["status"], rec["tenant"], rec["replicas"]) == (429, 429, "beta", [])

    body = json.dumps(_chat(url)["json"]).encode()
    auth = f"Authorization: Bearer {KEYS['alpha']}\r\n"
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    seen = _raw(port, head.encode() + body[:10])  # slow body: the server answers 408, the app saw a disconnect
    assert seen.startswith(b"HTTP/1.1 408 ")
    rec = access.one(status=408, endpoint="chat")
    assert rec["bytes"] == len(seen) and rec["duration_ms"] >= 450 and not any(r["status"] == 499 for r in access.records)

    seen = _raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 * 1024) + b"\r\n\r\n")  # 431
    assert seen.startswith(b"HTTP/1.1 431 ")
    rec = access.one(status=431)
    assert (rec["error"], rec["bytes"], rec["endpoint"]) == ("request_headers_too_large", len(seen), None)

    seen = _raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n")  # headers never finished: 408
    assert seen.startswith(b"HTTP/1.1 408 ")
    rec = access.one(status=408, endpoint=None)
    assert rec["error"] == "request_timeout" and rec["duration_ms"] >= 450

    seen = _raw(port, b"NOT HTTP AT ALL\r\n\r\n")  # not HTTP: the server's 400, in OpenAI's shape
    head, _, body = seen.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"application/json" in head
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    rec = access.one(status=400, endpoint=None)
    assert (rec["error"], rec["bytes"]) == ("invalid_http_request", len(seen))

    r = httpx.get(url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEYS['alpha']}"}, timeout=30)  # 405
    rec = access.one(status=405)
    assert (r.status_code, r.json()["error"]["code"], rec["endpoint"], rec["error"]) == (405, "method_not_allowed", "chat", "method_not_allowed")
    assert rec["bytes"] > len(r.content)


def test_refusals_at_the_caps_are_logged_as_sent(start_backend, start_gateway, access):
    """The connection cap's 503 (server layer) and the in-flight cap's 503
    (the endpoint's door) each get the record of what the client saw."""
    backend = start_backend(name="r1")
    backend.fake.control["chunk_delay_s"] = 0.2
    gw = start_gateway([{"url": backend.url, "name": "r1"}], access_log=True, max_connections=2, max_inflight_requests=1)
    url, port = gw.url, gw.server.port
    got: dict = {}
    first = threading.Event()

    def consume() -> None:  # holds the one in-flight slot (and one connection) for ~4 s
        with httpx.stream("POST", timeout=30, **_chat(url, stream=True, max_tokens=20)) as r:
            for line in r.iter_lines():
                first.set()
            got["status"] = r.status_code

    reader = threading.Thread(target=consume)
    reader.start()
    try:
        assert first.wait(10)
        r = httpx.post(timeout=30, **_chat(url))  # the second connection, over the in-flight cap
        assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
        rec = access.one(status=503, error="overloaded")
        assert (rec["endpoint"], rec["replicas"]) == ("chat", []) and rec["bytes"] > len(r.content)
        connections = gw.server.server.server_state.connections
        wait_for(lambda: len(connections) == 1, timeout=10)  # the 503's connection is closed: only the stream's is left
        with socket.create_connection(("127.0.0.1", port), timeout=10) as held:
            held.sendall(b"GET /health HTTP/1.1\r\n")  # the second connection, busy reading headers
            wait_for(lambda: len(connections) == 2, timeout=10)
            seen = _raw(port, b"")  # a third: over the connection cap
        assert seen.startswith(b"HTTP/1.1 503 ")
        rec = access.one(status=503, error="server_busy")
        assert (rec["endpoint"], rec["bytes"]) == (None, len(seen))
    finally:
        reader.join(timeout=15)
    assert got["status"] == 200


def test_a_failed_continuation_names_its_replica(start_backend, start_gateway, access):
    a = start_backend(name="a")
    b = start_backend(name="b")
    gw = start_gateway([{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}], access_log=True, max_continuations=1)
    a.fake.control["die_after_chunks"] = 4  # the stream's replica dies mid-stream ...
    b.fake.control.update(fail_next=1, fail_status=500)  # ... and the continuation's answers 500
    headers, status, events = _stream(gw.url, max_tokens=8)
    errors = [e["error"] for e in events if isinstance(e, dict) and "error" in e]
    assert status == 200 and len(errors) == 1
    rec = access.one(request_id=headers["x-request-id"])
    assert (rec["status"], rec["stream_error"], rec["replicas"]) == (200, errors[0]["code"], ["a"])
    assert rec["continuations"] == [{"replica": "b", "outcome": "failed"}]


def test_a_continued_stream_is_logged_under_every_replica(start_backend, start_gateway, access):
    a = start_backend(name="a")
    b = start_backend(name="b")
    gw = start_gateway([{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}], access_log=True)
    a.fake.control["die_after_chunks"] = 4  # the stream's replica dies mid-stream
    headers, status, events = _stream(gw.url, max_tokens=8)
    assert status == 200 and events[-1] == "[DONE]" and not any("error" in e for e in events if isinstance(e, dict))
    rec = access.one(request_id=headers["x-request-id"])
    assert (rec["status"], rec["stream_error"], rec["replicas"]) == (200, None, ["a", "b"])
    assert rec["continuations"] == [{"replica": "b", "outcome": "done"}]


def test_a_stream_ended_by_the_drain_is_a_200_with_its_error_event(start_backend, start_gateway, access):
    backend = start_backend(name="r1")
    gw = start_gateway([{"url": backend.url, "name": "r1"}], access_log=True, drain_pre_s=0.2, drain_deadline_s=1.0)
    backend.fake.control["chunk_delay_s"] = 0.2  # 200 tokens: a 40 s stream
    got: dict = {}
    first = threading.Event()

    def consume() -> None:
        with httpx.stream("POST", timeout=30, **_chat(gw.url, stream=True, max_tokens=200)) as r:
            got["status"], got["id"], got["events"] = r.status_code, r.headers["x-request-id"], []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got["events"].append(line[len("data: "):])
                    first.set()

    reader = threading.Thread(target=consume)
    reader.start()
    assert first.wait(10)
    gw.server.server.begin_drain()
    reader.join(timeout=15)
    assert not reader.is_alive()
    error = json.loads(got["events"][-2])["error"]
    assert (got["status"], got["events"][-1], error["code"]) == (200, "[DONE]", "shutting_down")
    rec = access.one(request_id=got["id"])
    assert (rec["status"], rec["stream"], rec["stream_error"], rec["replicas"]) == (200, True, "shutting_down", ["r1"])
