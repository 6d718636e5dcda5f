"""Failover, mid-stream failure, circuit breaker, and cancellation reaching
the replica — over real sockets."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from .conftest import KEYS, wait_for

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
AUTH = {"authorization": f"Bearer {KEYS['alpha']}"}


def test_failover_when_replica_dies_before_first_byte(start_backend, start_gateway):
    dead = start_backend(name="a")
    alive = start_backend(name="b")
    gw = start_gateway([{"url": dead.url, "name": "a"}, {"url": alive.url, "name": "b"}])
    first = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH)
    assert first.headers["x-specgate-replica"] == "a"  # tie on load -> name order
    dead.stop()  # the health check (every 30 s here) has not noticed yet
    c = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0)
    for stream in (False, True):
        out = c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=stream)
        if stream:
            assert "".join(ch.choices[0].delta.content or "" for ch in out if ch.choices) == " tok0 tok1"
        else:
            assert out.choices[0].message.content == " tok0 tok1"
    assert alive.fake.stats["completed"] == 2


def test_failover_on_5xx_then_relay_when_all_fail(start_backend, start_gateway):
    a = start_backend(name="a")
    b = start_backend(name="b")
    gw = start_gateway([{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}], breaker_failures=100)
    a.fake.control.update(fail_next=1, fail_status=500)
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 200 and r.headers["x-specgate-replica"] == "b"
    a.fake.control.update(fail_next=10, fail_status=503)
    b.fake.control.update(fail_next=10, fail_status=503)
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 503
    assert "injected failure" in r.json()["error"]["message"]  # the replica's own error body


def test_mid_stream_death_sends_error_event_and_ends(start_backend, start_gateway):
    """With continuation off (tests/gateway/test_continuation.py covers it on), a broken stream ends in-band."""
    backend = start_backend()
    gw = start_gateway([{"url": backend.url}], max_continuations=0)
    backend.fake.control.update(die_after_chunks=3)
    c = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0, timeout=10)
    received = []
    with pytest.raises(openai.APIError) as exc:
        for chunk in c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}], max_tokens=8, stream=True):
            received.append(chunk)
    assert len(received) == 3
    assert "mid-stream" in str(exc.value)


def test_circuit_breaker_stops_sending_to_failing_replica(start_backend, start_gateway):
    a = start_backend(name="a")
    b = start_backend(name="b")
    # a answers /health: a good health check would half-open its breaker (tested in test_health.py); here
    # open replicas are not re-checked during the test, so only request failures and the breaker decide.
    gw = start_gateway([{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}], breaker_failures=2, breaker_open_s=60,
                       health_unhealthy_interval_s=30)
    a.fake.control.update(fail_next=1000, fail_status=500)
    for _ in range(6):
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH)
        assert r.status_code == 200 and r.headers["x-specgate-replica"] == "b"
    assert a.fake.stats["requests"] == 2  # opened after two failures; no further attempts
    assert gw.state.registry.get("a").breaker.state(time.monotonic()) == "open"
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'specgate_replica_breaker_open{replica="a"} 1.0' in metrics


def test_breaker_half_open_probe_closes_on_success(start_backend, start_gateway):
    a = start_backend(name="a")
    gw = start_gateway([{"url": a.url, "name": "a"}], breaker_failures=1, breaker_open_s=60, max_attempts=1)
    a.fake.control.update(fail_next=1, fail_status=500)
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 500
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 503  # open
    # The open period passes (moved back rather than slept: with a short one, a loaded machine
    # let it pass between the two requests above, and the "open" one was the probe).
    breaker = gw.state.registry.get("a").breaker
    breaker.opened_at -= breaker.open_s
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 200  # probe
    assert gw.state.registry.get("a").breaker.state(time.monotonic()) == "closed"


def test_client_disconnect_cancels_non_streaming_upstream(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([{"url": backend.url}])
    backend.fake.control.update(delay_s=60.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=2.0)
    assert backend.fake.stats["requests"] == 1  # it reached the replica before the client left
    wait_for(lambda: backend.fake.stats["cancelled"] == 1, timeout=15)
    assert backend.fake.stats["completed"] == 0
    wait_for(lambda: gw.state.registry.get(next(iter(gw.state.registry.replicas))).open_attempts == 0, timeout=15)


def test_client_disconnect_cancels_streaming_upstream(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([{"url": backend.url}])
    backend.fake.control.update(chunk_delay_s=1.0)
    c = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0)
    stream = c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}], max_tokens=50, stream=True)
    next(iter(stream))
    stream.close()
    wait_for(lambda: backend.fake.stats["cancelled"] == 1, timeout=15)
    assert backend.fake.stats["completed"] == 0


def test_health_thresholds(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([{"url": backend.url, "name": "r"}], health_interval_s=0.1, health_fail_threshold=2, health_success_threshold=2)
    replica = gw.state.registry.get("r")
    assert replica.healthy
    backend.fake.control["healthy"] = False
    wait_for(lambda: not replica.healthy, timeout=15)
    assert replica.consecutive_fail >= 2
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 503
    backend.fake.control["healthy"] = True
    wait_for(lambda: replica.healthy, timeout=15)
    assert replica.consecutive_ok >= 2
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 200


def test_load_is_scraped_from_replica_metrics(start_backend, start_gateway):
    backend = start_backend(knobs=True)
    gw = start_gateway([{"url": backend.url, "name": "r"}])
    replica = gw.state.registry.get("r")
    assert replica.supports_knobs
    backend.fake.running = 7  # the fake reports its in-progress count as vllm:num_requests_running
    wait_for(lambda: replica.running == 7, timeout=15)
    backend.fake.running = 0


def test_session_affinity_keeps_a_session_on_one_replica(start_backend, start_gateway):
    a = start_backend(name="a")
    b = start_backend(name="b")
    gw = start_gateway([{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}], routing="session_affinity")
    chosen = {}
    for session in ("s-1", "s-2", "s-3", "s-4", "s-5", "s-6"):
        picks = {
            httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers={**AUTH, "x-session-id": session}).headers["x-specgate-replica"]
            for _ in range(3)
        }
        assert len(picks) == 1
        chosen[session] = picks.pop()
    assert set(chosen.values()) == {"a", "b"}  # sessions spread over both replicas


# -- hardening: breaker and health agree, wedges cost seconds ----------------
def test_a_good_health_check_half_opens_the_breaker_of_a_restarted_replica(start_backend, start_gateway):
    a = start_backend(name="a")
    b = start_backend(name="b")
    gw = start_gateway(
        [{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}], breaker_failures=2, breaker_open_s=300, health_interval_s=0.2
    )
    a.fake.control.update(fail_next=2, fail_status=500)  # e.g. a restart: two failures open its breaker
    for _ in range(2):
        assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH).headers["x-specgate-replica"] == "b"
    breaker = gw.state.registry.get("a").breaker
    assert breaker.opened_at is not None
    # Without the health check it would stay out for breaker_open_s (300 s);
    # its next good check lets a probe through and the probe closes it.
    wait_for(lambda: breaker.state(time.monotonic()) == "half_open", timeout=10)
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 200 and r.headers["x-specgate-replica"] == "a"
    assert breaker.state(time.monotonic()) == "closed"


def test_a_timeout_before_the_first_byte_fails_over(start_backend, start_gateway):
    slow = start_backend(name="a")
    fast = start_backend(name="b")
    gw = start_gateway([{"url": slow.url, "name": "a"}, {"url": fast.url, "name": "b"}], first_byte_timeout_s=0.3)
    slow.fake.control["delay_s"] = 30.0
    c = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0, timeout=20)
    out = c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in out if ch.choices) == " tok0 tok1"
    assert fast.fake.stats["completed"] == 1
    wait_for(lambda: slow.fake.stats["cancelled"] == 1, timeout=15)  # the abandoned attempt was closed upstream


def _wedge_gateway(start_backend, start_gateway, **settings):
    a = start_backend(name="a")
    b = start_backend(name="b")
    # connect_timeout_s 10 (default 2): the fake backends serve from threads of this process, and in a
    # loaded full run `b` once took over 2 s to accept the failed-over request, which then had nowhere
    # left to go (a 503); these tests are about the wedge path, not connect timeouts.
    # wedge_after_s 3 (not 0.5): in a loaded full run the in-process fakes' probes once went unanswered
    # for over 0.5 s, a false wedge of `b` opened its breaker, and the frozen `a`'s stream then had
    # nowhere to continue ("stream not continued"); a real freeze is caught at 3 s all the same.
    gw = start_gateway(
        [{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}],
        **{"wedge_after_s": 3.0, "metrics_interval_s": 0.1, "health_interval_s": 0.2, "connect_timeout_s": 10.0, **settings},
    )
    return a, b, gw


def test_a_request_waiting_on_a_frozen_replica_fails_over_and_the_replica_comes_back(start_backend, start_gateway):
    a, b, gw = _wedge_gateway(start_backend, start_gateway)
    replica = gw.state.registry.get("a")
    a.fake.control["frozen"] = True  # like SIGSTOP: nothing answers, nothing is refused
    # Routed to `a` (name order on a tie) before the watchdog sees it; the
    # response timeout is 900 s, so only the wedge path can answer this.
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.headers["x-specgate-replica"] == "b"
    assert not replica.healthy and replica.wedged == "no answer"
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'specgate_replica_ejections_total{reason="no_answer",replica="a"} 1.0' in metrics
    assert 'specgate_upstream_attempts_total{outcome="wedged",replica="a"} 1.0' in metrics
    # New requests avoid it while it is out.
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH).headers["x-specgate-replica"] == "b"
    a.fake.control["frozen"] = False
    wait_for(lambda: replica.healthy and replica.wedged is None, timeout=10)
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH).headers["x-specgate-replica"] == "a"


def _stream_freezing_a_after(gw, a, n_lines: int):
    """A 200-token chat stream that starts on `a`, which freezes (like
    SIGSTOP) once the client has read `n_lines` lines; `a` thaws after.
    Returns the lines read and the response."""
    a.fake.control["chunk_delay_s"] = 0.05
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 200, "stream": True}, headers=AUTH, timeout=30) as r:
        assert r.headers["x-specgate-replica"] == "a"
        lines = []
        for line in r.iter_lines():
            lines.append(line)
            if len(lines) == n_lines:
                a.fake.control["frozen"] = True
    a.fake.control["frozen"] = False
    return lines, r


def test_a_stream_under_way_on_a_frozen_replica_is_continued_on_another(start_backend, start_gateway):
    """The wedge watchdog aborts the attempt; the stream goes on from `b`, token for token."""
    a, b, gw = _wedge_gateway(start_backend, start_gateway)
    lines, _ = _stream_freezing_a_after(gw, a, 8)
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("error" not in c for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "".join(f" tok{i}" for i in range(200))
    assert b.fake.recorded[-1]["path"] == "/v1/completions"  # the continuation, on b
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'specgate_continuations_total{outcome="continued"} 1.0' in metrics


def test_a_stream_under_way_on_a_frozen_replica_ends_with_an_error_event_and_done(start_backend, start_gateway):
    """Continuation off: the wedged stream ends in-band."""
    a, b, gw = _wedge_gateway(start_backend, start_gateway, max_continuations=0)
    lines, r = _stream_freezing_a_after(gw, a, 4)
    data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    error = data[-2]
    assert '"error"' in error and "stopped making progress" in error and "request id" in error
    assert a.url not in error and "a" != r.headers.get("x-request-id")


def test_a_replica_whose_engine_stalls_behind_a_live_api_is_ejected_by_progress(start_backend, start_gateway):
    # wedge_after_s 3 (`_wedge_gateway`'s; no progress is judged after max(it, 3 metrics intervals)): at
    # 0.5 s a loaded full run once saw the in-process fake's probes go unanswered that long, and the
    # stalled replica was ejected for "no answer" instead of the "no progress" this test is about.
    a, b, gw = _wedge_gateway(start_backend, start_gateway)
    replica = gw.state.registry.get("a")
    a.fake.control["stalled"] = True  # /health and /metrics answer; completions make no progress
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.headers["x-specgate-replica"] == "b"
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'specgate_replica_ejections_total{reason="no_progress",replica="a"} 1.0' in metrics
    wait_for(lambda: a.fake.stats["cancelled"] == 1, timeout=10)  # the stuck attempt was closed upstream
    # With nothing running there is nothing to judge: it is let back after its
    # health check, its breaker half-open, and a stuck request is caught again.
    wait_for(lambda: replica.healthy, timeout=10)
    a.fake.control["stalled"] = False
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH).headers["x-specgate-replica"] == "a"


def test_a_stream_whose_replica_dies_after_its_headers_but_before_any_event_fails_over(start_backend, start_gateway):
    a = start_backend(name="a")
    b = start_backend(name="b")
    gw = start_gateway([{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}])
    a.fake.control["die_after_chunks"] = 0  # vLLM-like: headers at once, then the process dies before the first token
    c = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0, timeout=20)
    with c.chat.completions.with_streaming_response.create(
        model="fake-model", messages=[{"role": "user", "content": "x"}], max_tokens=3, stream=True
    ) as response:
        assert response.headers["x-specgate-replica"] == "b"  # the client's headers come with the first event
        text = "".join(ch.choices[0].delta.content or "" for ch in response.parse() if ch.choices)
    assert text == " tok0 tok1 tok2"
    assert a.fake.stats["requests"] == 1 and b.fake.stats["completed"] == 1
