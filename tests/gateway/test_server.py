"""gateway.server and gateway.http_limits: what one hostile client can no
longer do to the instance (header size, header/body timeouts, connection cap),
the drain on SIGTERM (through the real `specgate gateway` CLI), and /metrics
on its own port. Bounded loops, behaviour rather than speed."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from testbed.procs import free_port

from .conftest import KEYS, read_until_close, tenant, wait_for

ROOT = Path(__file__).resolve().parents[2]
SPECGATE = str(Path(sys.executable).with_name("specgate"))
AUTH = f"Authorization: Bearer {KEYS['alpha']}\r\n"


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


@pytest.fixture
def gw(start_backend, start_gateway):
    def _start(**gateway):
        backend = start_backend()
        return start_gateway([{"url": backend.url}], **gateway), backend

    return _start


# -- header size ------------------------------------------------------------
def test_48_mib_header_gets_431_while_others_are_served(gw):
    gateway, _ = gw()
    port = gateway.server.port
    result: dict = {}
    sock = _connect(port)
    # Half the limit first, so the server holds a half-read header while the
    # others are served: with the rest sent in one go a fast machine answered
    # 431 before the first other request was made (no overlap was tested).
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (30 * 1024))
    statuses = [httpx.get(gateway.url + "/health", timeout=5).status_code for _ in range(3)]

    def hostile() -> None:
        chunk, sent = b"a" * 65536, 30 * 1024
        while sent < 48 * 1024 * 1024:
            sock.sendall(chunk)
            sent += len(chunk)
            if select.select([sock], [], [], 0)[0]:  # answered: stop sending
                break
        result["sent"] = sent
        result["response"] = read_until_close(sock)
        sock.close()

    t = threading.Thread(target=hostile)
    t.start()
    while t.is_alive() and len(statuses) < 200:
        statuses.append(httpx.get(gateway.url + "/health", timeout=5).status_code)
    t.join(timeout=30)
    assert result["response"].startswith(b"HTTP/1.1 431 ")
    body = json.loads(result["response"].split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "request_headers_too_large"
    assert result["sent"] < 48 * 1024 * 1024  # answered before the header was all sent
    assert set(statuses) == {200}
    assert httpx.get(gateway.url + "/health", timeout=5).status_code == 200


def test_header_limit_is_exact_whether_headers_come_in_one_read_or_many(gw):
    gateway, _ = gw(max_header_bytes=4096)
    port = gateway.server.port
    for pad, expect in ((2000, b"200"), (5000, b"431")):
        for pieces in (1, 8):
            raw = f"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: {'p' * pad}\r\nConnection: close\r\n\r\n".encode()
            sock = _connect(port)
            step = -(-len(raw) // pieces)
            for i in range(0, len(raw), step):
                sock.sendall(raw[i : i + step])
                time.sleep(0.01)
            assert read_until_close(sock).split(b" ")[1] == expect, (pad, pieces)
            sock.close()


# -- read timeouts ----------------------------------------------------------
def test_trickling_headers_get_408_and_are_closed(gw):
    gateway, _ = gw(header_timeout_s=0.5)
    sock = _connect(gateway.server.port)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    response = b""
    for _ in range(100):  # one byte every 50 ms; bounded well past the timeout
        try:
            sock.sendall(b"X")
        except (BrokenPipeError, ConnectionResetError):
            break
        if select.select([sock], [], [], 0.05)[0]:
            response = read_until_close(sock)
            break
    assert response.startswith(b"HTTP/1.1 408 "), response[:80]
    assert b"connection: close" in response.lower()
    sock.close()


def test_a_connection_that_sends_nothing_is_closed_by_the_header_timeout(gw):
    gateway, _ = gw(header_timeout_s=0.3)
    sock = _connect(gateway.server.port)
    assert read_until_close(sock, timeout=5).startswith(b"HTTP/1.1 408 ")


def test_slow_body_gets_408(gw):
    gateway, _ = gw(body_timeout_s=0.5)
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sock = _connect(gateway.server.port)
    sock.sendall(head.encode() + body[:10])
    response = read_until_close(sock, timeout=10)
    assert response.startswith(b"HTTP/1.1 408 "), response[:80]
    assert json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    sock.close()
    # A body in pieces well inside the timeout is served as usual.
    sock = _connect(gateway.server.port)
    sock.sendall(head.encode() + body[:10])
    time.sleep(0.1)
    sock.sendall(body[10:])
    sock.settimeout(10)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    sock.close()


# -- connection cap ---------------------------------------------------------
def test_connections_beyond_the_cap_are_refused_and_slots_free_up(gw):
    gateway, _ = gw(max_connections=50, header_timeout_s=3.0)
    port = gateway.server.port
    state = gateway.server.server.server_state
    socks = []
    for _ in range(200):
        s = _connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\n")  # and never more
        socks.append(s)
    # The 150 over the cap are answered 503 and closed at once; 50 stay open.
    refused: set[socket.socket] = set()
    deadline = time.monotonic() + 2.0
    while len(refused) < 150 and time.monotonic() < deadline:
        for s in select.select([s for s in socks if s not in refused], [], [], 0.1)[0]:
            data = read_until_close(s, timeout=2)
            assert data.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in data.lower(), data[:80]
            refused.add(s)
    assert len(refused) == 150
    assert len(state.connections) <= 50
    # The header timeout frees the held slots (408; a slot is free once the client
    # closes, or after the server's short linger); then other clients are served again.
    for s in socks:
        if s not in refused:
            assert read_until_close(s, timeout=10).startswith(b"HTTP/1.1 408 ")
        s.close()
    assert wait_for(lambda: httpx.get(gateway.url + "/health", timeout=5).status_code == 200, timeout=5)


def _get_health(sock: socket.socket) -> bytes:
    """One GET /health on a kept-alive connection: the whole response."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")))
    while len(body) < length:
        body += sock.recv(65536)
    return data


def _closed_by_server(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_keep_alive_outlasts_load_balancer_idle_timeouts_by_default():
    """A gateway that closes idle connections before its load balancer does
    races it (a request sent as the close arrives: a 502 at the balancer);
    uvicorn's own 5 s is below every common one (ALB, ingress-nginx: 60 s)."""
    from contract.settings import load_settings
    from gateway.server import build_config

    settings = load_settings()
    assert settings.gateway.keep_alive_timeout_s > 60
    assert build_config(object(), settings).timeout_keep_alive == settings.gateway.keep_alive_timeout_s


def test_an_idle_kept_alive_connection_stays_open_until_the_keep_alive_timeout(gw):
    gateway, _ = gw(keep_alive_timeout_s=1.5)
    sock = _connect(gateway.server.port)
    assert _get_health(sock).startswith(b"HTTP/1.1 200 ")
    assert not _closed_by_server(sock, timeout=0.5)  # idle 0.5 s: still open
    assert _get_health(sock).startswith(b"HTTP/1.1 200 ")  # the same connection serves the next request
    assert _closed_by_server(sock, timeout=10)  # then closed once idle past the timeout
    sock.close()


def test_at_the_cap_a_new_connection_takes_the_slot_of_the_longest_idle_one(gw):
    gateway, _ = gw(max_connections=3, header_timeout_s=5.0)
    port = gateway.server.port
    idle = []
    for _ in range(3):  # the cap, all kept alive and idle after one request each
        sock = _connect(port)
        assert _get_health(sock).startswith(b"HTTP/1.1 200 ")
        idle.append(sock)
        time.sleep(0.05)
    newcomer = _connect(port)
    assert _get_health(newcomer).startswith(b"HTTP/1.1 200 ")  # served, not refused
    assert _closed_by_server(idle[0], timeout=5)  # the oldest idle one gave up its slot
    assert not _closed_by_server(idle[1], timeout=0.2)
    assert _get_health(idle[1]).startswith(b"HTTP/1.1 200 ")  # the others still serve
    # With no connection idle (all busy sending headers), the cap refuses as before.
    busy = [idle[1], idle[2], newcomer]
    for sock in busy:
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # and never more
    assert wait_for(lambda: not gateway.server.server.server_state.idle, timeout=5)
    refused = _connect(port)
    assert read_until_close(refused, timeout=5).startswith(b"HTTP/1.1 503 ")
    for sock in [*idle, newcomer, refused]:
        sock.close()


def test_three_thousand_trickling_connections_are_closed_by_the_header_timeout_while_others_are_served(gw):
    """The issue's probe: 3,000 connections trickling a header used to be held
    open indefinitely. Under the default cap they are held only until the
    header timeout, answered 408 and closed, and meanwhile another client's
    /health is answered every time."""
    import resource
    import selectors

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * 3000 + 512  # client and server ends live in this one process
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"needs {need} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    # The header timeout outlasts opening the 3,000 connections on a loaded box (at 3 s, a
    # full run saw only 2,593 held: the first ones had already been answered 408).
    gateway, _ = gw(header_timeout_s=10.0)
    port = gateway.server.port
    sel = selectors.DefaultSelector()  # epoll: select() stops at fd 1024
    socks = []
    try:
        for _ in range(3000):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and never the rest
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
            socks.append(sock)
        held = gateway.server.server.server_state.connections
        # Under the default cap (4096): held, not refused (the server's accept loop may lag the client's).
        wait_for(lambda: len(held) >= 2900, timeout=5)
        for _ in range(5):  # other clients are served while the 3,000 are held
            assert httpx.get(gateway.url + "/health", timeout=5).status_code == 200
        answers: dict[socket.socket, bytes] = {}
        deadline = time.monotonic() + 30
        while len(answers) < len(socks) and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.5):
                try:
                    data = key.fileobj.recv(65536)
                except (BlockingIOError, ConnectionResetError):
                    data = b""
                answers[key.fileobj] = answers.get(key.fileobj, b"") + data
                if not data or data.startswith(b"HTTP/1.1 408") or answers[key.fileobj].startswith(b"HTTP/1.1 408"):
                    sel.unregister(key.fileobj)
        assert len(answers) == 3000
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers.values())
    finally:
        for sock in socks:
            sock.close()
        sel.close()
    assert wait_for(lambda: len(gateway.server.server.server_state.connections) < 10, timeout=10)
    assert httpx.get(gateway.url + "/health", timeout=5).status_code == 200


# -- /metrics on its own port -------------------------------------------------
def test_metrics_on_a_separate_port(gw):
    mport = free_port()
    gateway, _ = gw(metrics_port=mport)
    assert httpx.get(gateway.url + "/metrics").status_code == 404
    r = httpx.get(f"http://127.0.0.1:{mport}/metrics")
    assert r.status_code == 200 and "specgate_" in r.text
    assert httpx.get(f"http://127.0.0.1:{mport}/health").status_code == 404


# -- drain --------------------------------------------------------------------
def _gateway_process(tmp_path, backend, redis_url, redis_prefix, *, workers: int = 1, **gateway):
    cfg = {
        "replicas": [{"url": backend.url}],
        "tenants": [tenant("alpha")],
        "redis_url": redis_url,
        "redis_prefix": redis_prefix,
        "gateway": {"health_interval_s": 0.2, **gateway},
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECGATE_")}
    proc = subprocess.Popen(
        [SPECGATE, "gateway", "--config", str(path), "--port", str(port), "--workers", str(workers)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        try:
            return httpx.get(url + "/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, timeout=60, interval=0.2)
    return proc, url, port


def _chat(url: str, stream: bool, max_tokens: int):
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": stream}
    return {"url": url + "/v1/chat/completions", "json": body, "headers": {"Authorization": f"Bearer {KEYS['alpha']}"}}


def test_sigterm_drains_then_ends_open_streams_with_an_error_event(tmp_path, start_backend, redis_url, redis_prefix):
    backend = start_backend()
    pre, deadline = 1.0, 3.0
    proc, url, port = _gateway_process(tmp_path, backend, redis_url, redis_prefix, drain_pre_s=pre, drain_deadline_s=deadline)
    try:
        backend.fake.control["chunk_delay_s"] = 0.2  # 200 tokens: a 40 s stream
        lines: list[str] = []
        first = threading.Event()

        def consume() -> None:
            with httpx.stream("POST", timeout=60, **_chat(url, True, 200)) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        first.set()

        reader = threading.Thread(target=consume)
        reader.start()
        assert first.wait(10)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        # /ready turns 503 at once, while the listener still accepts ...
        assert wait_for(lambda: httpx.get(url + "/ready", timeout=1).status_code == 503, timeout=pre / 2, interval=0.02)
        # ... and a new request within the pre-drain window is still served.
        r = httpx.post(timeout=10, **_chat(url, False, 2))
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == " tok0 tok1"
        assert time.monotonic() - t0 < pre
        # After the window the listener is closed (checked mid-deadline).
        time.sleep(max(0.0, pre + deadline / 2 - (time.monotonic() - t0)))
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=1)
        assert reader.is_alive()  # the stream is still going
        # At the deadline the stream ends with an SSE error event, then [DONE].
        reader.join(timeout=deadline + 10)
        assert not reader.is_alive()
        assert lines[-1] == "data: [DONE]"
        assert "error" in json.loads(lines[-2][len("data: "):]), lines[-3:]
        # The process exits by itself, code 0 (not 143), soon after the deadline.
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < pre + deadline + 6
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_workers_run_the_gateway_server_and_drain(tmp_path, start_backend, redis_url, redis_prefix):
    backend = start_backend()
    proc, url, port = _gateway_process(tmp_path, backend, redis_url, redis_prefix, workers=2, drain_pre_s=0.5, drain_deadline_s=1.0,
                                       header_timeout_s=0.3)
    try:
        # The workers enforce the limits (their protocol is the gateway's).
        sock = _connect(port)
        assert read_until_close(sock, timeout=5).startswith(b"HTTP/1.1 408 ")
        sock.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
