"""The request path's stages in isolation (no sockets, no Redis): the parse
stage's errors, admission, routing's trace marks, the relay's in-flight
guard on every exit, and the outcome stage's refund rule."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
import pytest

from contract.policy import SpeculationPolicy
from contract.settings import TenantConfig, hash_key, load_settings
from contract.store import WindowDecision
from gateway.asgi_io import ClientGone
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.inflight import UpstreamAttempt
from gateway.relay import relay
from gateway.replicas import Registry
from gateway.request_context import RequestContext
from gateway.outcome import account, deferred_spans, on_error
from gateway.stages import admit, parse, parse_body, route
from gateway.upstream import UpstreamConnectError, UpstreamTimeout

TENANT = TenantConfig(id="t", api_key_sha256=hash_key("sk-t"), requests_per_minute=10, tokens_per_minute=1000)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class FakeAccounting:
    def __init__(self, decision=None, reserved=0, error: Exception | None = None) -> None:
        self.decision, self.reserved, self.error = decision, reserved, error
        self.calls: list[tuple] = []
        self.headers_cache: dict = {}

    async def reserve(self, tenant, estimate):
        if self.error is not None:
            raise self.error
        return self.decision, self.reserved

    def settle(self, tenant, reserved, actual):
        self.calls.append(("settle", tenant.id, reserved, actual))

    def refund_request(self, tenant, reserved):
        self.calls.append(("refund", tenant.id, reserved))

    def record(self, tenant_id, replica, stats):
        self.calls.append(("record", tenant_id, replica, stats.prompt_tokens, stats.completion_tokens))


class FakeResponse:
    def __init__(self, status: int, body: bytes = b"", chunks: list[bytes] | None = None) -> None:
        self.status = status
        self.headers = [(b"content-type", b"application/json")]
        self._body, self._chunks = body, chunks or []
        self.released = self.aborted = False

    async def read(self) -> bytes:
        return self._body

    async def chunks(self):
        for c in self._chunks:
            yield c

    def release(self) -> None:
        self.released = True

    def abort(self) -> None:
        self.aborted = True


class FakeUpstream:
    """Answers each post with the next outcome: a FakeResponse, or an exception to raise."""

    def __init__(self, *outcomes) -> None:
        self.outcomes = list(outcomes)
        self.posts: list[str] = []

    async def post(self, url, body, headers, headers_timeout_s=None):
        self.posts.append(url)
        out = self.outcomes.pop(0)
        if isinstance(out, BaseException) or (isinstance(out, type) and issubclass(out, BaseException)):
            raise out
        return out


def make_state(upstream=None, accounting=None, replicas=("a", "b"), **gateway):
    settings = load_settings(
        replicas=[{"url": f"http://{n}.invalid:8000", "name": n, "model": "m"} for n in replicas],
        tenants=[TENANT],
        gateway={"retry_backoff_base_s": 0.0, **gateway},
    )
    registry = Registry.from_settings(settings)
    for r in registry:
        r.healthy = True
    return SimpleNamespace(
        settings=settings,
        metrics=GatewayMetrics(),
        tracing=SimpleNamespace(enabled=False),
        policy_view=SimpleNamespace(for_tenant=lambda tenant: SpeculationPolicy()),
        upstream=upstream,
        accounting=accounting or FakeAccounting(),
        registry=registry,
        replica_list=list(registry),
        estimate_tokens=lambda body: 7,
        session_header=b"x-session-id",
        capture=None,
    )


def make_ctx(**fields) -> RequestContext:
    ctx = RequestContext(0.0, "chat", "/v1/chat/completions")
    for k, v in fields.items():
        setattr(ctx, k, v)
    return ctx


def receiver(*messages):
    queue = list(messages)

    async def receive():
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)

    return receive


class Sent(list):
    async def __call__(self, message):
        self.append(message)


# -- parse -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "kind", "code", "param"),
    [
        (b"{nope", "chat", "invalid_json", None),
        (b"[1, 2]", "chat", "invalid_body", None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "chat", "missing_model", "model"),
        (b'{"model": "", "messages": [1]}', "chat", "missing_model", "model"),
        (b'{"model": "m", "messages": []}', "chat", "invalid_value", "messages"),
        (b'{"model": "m"}', "completions", "invalid_value", "prompt"),
        (b'{"model": "m", "prompt": 3}', "completions", "invalid_value", "prompt"),
        (b'{"model": "m", "prompt": "x", "stream": "yes"}', "completions", "invalid_value", "stream"),
        (b'{"model": "m", "prompt": "x", "stream_options": []}', "completions", "invalid_value", "stream_options"),
    ],
)
def test_parse_body_errors(raw, kind, code, param):
    with pytest.raises(GatewayError) as exc:
        parse_body(raw, kind)
    assert (exc.value.status, exc.value.code, exc.value.param) == (400, code, param)
    assert set(orjson.loads(exc.value.body())["error"]) == {"message", "type", "param", "code"}


def test_parse_body_accepts_null_stream_and_prompt_arrays():
    assert parse_body(b'{"model": "m", "prompt": ["a"], "stream": null}', "completions")["prompt"] == ["a"]


async def test_parse_fills_the_context():
    state = make_state()
    ctx = make_ctx()
    body = dict(CHAT, stream=True, vllm_xargs={"other_ext": 2})
    await parse(state, ctx, receiver({"type": "http.request", "body": orjson.dumps(body)}))
    assert (ctx.model, ctx.stream, ctx.client_xargs) == ("m", True, {"other_ext": 2})
    assert [r.name for r in ctx.replicas] == ["a", "b"]


async def test_parse_rejects_bad_knobs_and_unknown_models():
    state = make_state()
    with pytest.raises(GatewayError) as exc:
        await parse(state, make_ctx(), receiver({"type": "http.request", "body": orjson.dumps(dict(CHAT, vllm_xargs={"specgate_nope": 1}))}))
    assert (exc.value.status, exc.value.code, exc.value.param) == (400, "invalid_value", "vllm_xargs.specgate_nope")
    with pytest.raises(GatewayError) as exc:
        await parse(state, make_ctx(), receiver({"type": "http.request", "body": orjson.dumps(dict(CHAT, model="other"))}))
    assert (exc.value.status, exc.value.code) == (404, "model_not_found")


async def test_parse_body_size_limit_and_disconnect():
    state = make_state(max_body_bytes=1024)
    with pytest.raises(GatewayError) as exc:  # declared too large: not read at all
        await parse(state, make_ctx(content_length=4096), receiver())
    assert (exc.value.status, exc.value.code) == (413, "request_too_large")
    chunk = {"type": "http.request", "body": b"x" * 600, "more_body": True}
    with pytest.raises(GatewayError) as exc:  # too large as it arrives
        await parse(state, make_ctx(), receiver(chunk, chunk))
    assert exc.value.status == 413
    with pytest.raises(ClientGone):
        await parse(state, make_ctx(), receiver(chunk, {"type": "http.disconnect"}))


# -- admit -----------------------------------------------------------------
async def test_admit_denial_store_outage_and_unlimited():
    denied = WindowDecision(allowed=False, retry_after_s=2.4, used={}, denied_field="tokens")
    state = make_state(accounting=FakeAccounting(decision=denied))
    ctx = make_ctx(tenant=TENANT, tenant_label="t", body=dict(CHAT))
    with pytest.raises(GatewayError) as exc:
        await admit(state, ctx)
    assert (exc.value.status, exc.value.code, exc.value.headers) == (429, "rate_limit_tokens", [(b"retry-after", b"2")])
    assert state.metrics.rejections.value("t", "tokens") == 1
    assert not ctx.reserved_live

    state = make_state(accounting=FakeAccounting(error=ConnectionError("down")))
    with pytest.raises(GatewayError) as exc:
        await admit(state, make_ctx(tenant=TENANT, body=dict(CHAT)))
    assert (exc.value.status, exc.value.code) == (503, "state_store_unavailable")

    ctx = make_ctx(tenant=TENANT, body=dict(CHAT))
    await admit(make_state(accounting=FakeAccounting(decision=None, reserved=0)), ctx)
    assert not ctx.reserved_live

    ok = WindowDecision(allowed=True, retry_after_s=0, used={})
    ctx = make_ctx(tenant=TENANT, body=dict(CHAT))
    await admit(make_state(accounting=FakeAccounting(decision=ok, reserved=7)), ctx)
    assert (ctx.reserved_live, ctx.reserved) == (True, 7)


# -- route -----------------------------------------------------------------
def test_route_marks_when_traced_and_503_when_nothing_is_routable():
    state = make_state()
    ctx = make_ctx(tenant=TENANT, model="m", body=dict(CHAT), replicas=state.replica_list, root=object())
    assert [r.name for r in route(state, ctx)] == ["a", "b"]
    assert ctx.candidates == ["a", "b"] and 0 < ctx.t_route_start_ns <= ctx.t_route_end_ns
    for r in state.replica_list:
        r.healthy = False
    ctx = make_ctx(tenant=TENANT, model="m", body=dict(CHAT), replicas=state.replica_list, root=object())
    with pytest.raises(GatewayError) as exc:
        route(state, ctx)
    assert (exc.value.status, exc.value.code) == (503, "no_healthy_replica")
    assert ctx.candidates == []  # the route span is still recorded
    untraced = make_ctx(tenant=TENANT, model="m", body=dict(CHAT), replicas=state.replica_list)
    with pytest.raises(GatewayError):
        route(state, untraced)
    assert untraced.candidates is None and untraced.t_route_start_ns == 0


def test_route_skips_replicas_whose_context_cannot_hold_the_completion_limit():
    """A limit the longest context admits routes (and so fails over) only to replicas that can take
    it: failing over to a shorter one came back with that replica's 400 (a loaded full run)."""
    state = make_state()
    a, b = state.replica_list
    a.context_lengths, b.context_lengths = {"m": 60_064}, {"m": 4096}
    for limit, expected in ((60_000, ["a"]), (4096, ["a", "b"]), (None, ["a", "b"])):
        body = {**CHAT, "max_tokens": limit} if limit is not None else dict(CHAT)
        ctx = make_ctx(tenant=TENANT, model="m", body=body, replicas=state.replica_list)
        assert sorted(r.name for r in route(state, ctx)) == expected, limit
    ctx = make_ctx(tenant=TENANT, model="m", body={**CHAT, "max_completion_tokens": 5000, "max_tokens": 10},
                   replicas=state.replica_list)
    assert [r.name for r in route(state, ctx)] == ["a"]
    b.context_lengths = {}  # no card length: the replica judges
    ctx = make_ctx(tenant=TENANT, model="m", body={**CHAT, "max_tokens": 60_000}, replicas=state.replica_list)
    assert sorted(r.name for r in route(state, ctx)) == ["a", "b"]
    a.healthy = False  # the one that fits is out of rotation: nothing to route to, not another's 400
    b.context_lengths = {"m": 4096}
    ctx = make_ctx(tenant=TENANT, model="m", body={**CHAT, "max_tokens": 60_000}, replicas=state.replica_list)
    with pytest.raises(GatewayError) as exc:
        route(state, ctx)
    assert (exc.value.status, exc.value.code) == (503, "no_healthy_replica")


# -- relay: the in-flight guard --------------------------------------------
def test_inflight_guard_under_an_exception():
    replica = SimpleNamespace(open_attempts=0)
    with pytest.raises(RuntimeError), UpstreamAttempt(replica):
        assert replica.open_attempts == 1
        raise RuntimeError("boom")
    assert replica.open_attempts == 0


def relay_ctx(state, stream=False):
    return make_ctx(tenant=TENANT, model="m", body=dict(CHAT, stream=stream), stream=stream, client_xargs=None, policy=SpeculationPolicy())


async def _relay(state, ctx, send=None):
    await relay(state, ctx, state.replica_list, Sent() if send is None else send)


@pytest.mark.parametrize(
    "outcomes",
    [
        [RuntimeError("client library bug")],
        [asyncio.CancelledError()],
        [UpstreamTimeout(), UpstreamTimeout()],
        [UpstreamConnectError("refused"), UpstreamConnectError("refused"), UpstreamConnectError("refused")],
        [FakeResponse(500, b'{"error": {"message": "x"}}'), FakeResponse(503, b"busy"), FakeResponse(500, b"")],
    ],
    ids=["unexpected", "cancelled", "timeout", "all-unreachable", "all-5xx"],
)
async def test_no_attempt_leaks_inflight(outcomes):
    state = make_state(upstream=FakeUpstream(*outcomes), breaker_failures=100)
    with pytest.raises((RuntimeError, asyncio.CancelledError, GatewayError)):
        await _relay(state, relay_ctx(state))
    assert [r.open_attempts for r in state.replica_list] == [0, 0]


async def test_failover_outcomes_and_final_errors():
    state = make_state(upstream=FakeUpstream(UpstreamConnectError("x"), UpstreamConnectError("y"), UpstreamConnectError("z")))
    with pytest.raises(GatewayError) as exc:
        await _relay(state, relay_ctx(state))
    assert (exc.value.status, exc.value.code) == (503, "no_healthy_replica")
    assert exc.value.message == "No healthy replica could serve model `m`; retry shortly."  # no replica name, no library detail
    assert (b"retry-after", b"1") in exc.value.headers
    state = make_state(upstream=FakeUpstream(FakeResponse(500, b"x"), FakeResponse(503, b'{"error": {}}'), FakeResponse(502, b"plain")))
    with pytest.raises(GatewayError) as exc:
        await _relay(state, relay_ctx(state))
    assert (exc.value.status, exc.value.code) == (502, "upstream_error")  # last 5xx body not JSON
    state = make_state(upstream=FakeUpstream(FakeResponse(500, b"x"), FakeResponse(503, b'{"error": {}}')), max_attempts=2)
    with pytest.raises(GatewayError) as exc:
        await _relay(state, relay_ctx(state))
    assert exc.value.status == 503 and orjson.loads(exc.value.body()) == {  # the replica's last error, in OpenAI's shape
        "error": {"message": '{"error": {}}', "type": "server_error", "param": None, "code": None}
    }
    # A timeout before the first byte fails over; only when every replica
    # timed out is it a 504, and no replica is tried twice after a timeout.
    state = make_state(upstream=FakeUpstream(UpstreamTimeout(), UpstreamTimeout()))
    with pytest.raises(GatewayError) as exc:
        await _relay(state, relay_ctx(state))
    assert (exc.value.status, exc.value.code) == (504, "upstream_timeout")
    assert len(state.upstream.posts) == 2


async def test_inflight_covers_the_relay_and_is_released_when_the_client_send_fails():
    body = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}})
    state = make_state(upstream=FakeUpstream(UpstreamConnectError("down"), FakeResponse(200, body)))
    seen = []

    async def send(message):
        seen.append([r.open_attempts for r in state.replica_list])
        raise OSError("client socket closed")

    ctx = relay_ctx(state)
    with pytest.raises(OSError):
        await _relay(state, ctx, send)
    assert seen == [[0, 1]]  # a failed over, b held while relaying
    assert [r.open_attempts for r in state.replica_list] == [0, 0]
    assert ctx.replica.name == "b"


async def test_stream_relay_injects_and_strips_usage():
    events = [b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n', b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\n', b"data: [DONE]\n\n"]
    upstream = FakeUpstream(FakeResponse(200, chunks=events))
    state = make_state(upstream=upstream)
    ctx = relay_ctx(state, stream=True)
    sent = Sent()
    await _relay(state, ctx, sent)
    assert ctx.body["stream_options"] == {"include_usage": True}
    out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert b"usage" not in out and out.endswith(b"data: [DONE]\n\n")
    assert (ctx.status, ctx.usage) == (200, {"prompt_tokens": 1, "completion_tokens": 1})
    assert state.replica_list[0].open_attempts == 0


# -- outcome: the refund rule ---------------------------------------------------
@pytest.mark.parametrize(
    ("status", "reserved_live", "refunded"),
    [(503, True, True), (502, True, True), (429, True, False), (504, True, False), (500, True, False), (503, False, False)],
)
async def test_failed_requests_are_refunded_only_when_no_replica_served_them(status, reserved_live, refunded):
    state = make_state()
    ctx = make_ctx(tenant=TENANT, reserved=9, reserved_live=reserved_live)
    sent = Sent()
    assert await on_error(state, ctx, GatewayError(status, "x"), sent)
    assert ctx.status == status and sent[0]["status"] == status
    assert state.accounting.calls == ([("refund", "t", 9)] if refunded else [])


def test_relayed_replica_errors_settle_the_estimate_to_zero():
    state = make_state()
    account(state, make_ctx(tenant=TENANT, reserved=9, reserved_live=True, status=400))
    account(state, make_ctx(tenant=TENANT, reserved=9, reserved_live=False, status=400))
    account(state, make_ctx(tenant=TENANT, reserved=9, reserved_live=True, status=200))  # no usage reported: kept
    assert state.accounting.calls == [("settle", "t", 9, 0)]


def test_usage_settles_the_reservation_and_records_telemetry():
    state = make_state()
    replica = state.replica_list[0]
    ctx = make_ctx(tenant=TENANT, tenant_label="t", reserved=9, reserved_live=True, status=200, replica=replica,
                   usage={"prompt_tokens": 2, "completion_tokens": 3})
    account(state, ctx)
    assert state.accounting.calls == [("settle", "t", 9, 5), ("record", "t", "a", 2, 3)]
    assert state.metrics.tokens.value("t", "completion") == 3


async def test_on_error_client_gone_unexpected_and_foreign_cancellation():
    state = make_state()
    ctx = make_ctx(tenant=TENANT, reserved_live=True)
    sent = Sent()
    assert await on_error(state, ctx, ClientGone(), sent) and ctx.status == 499 and not sent
    assert await on_error(state, ctx, KeyError("bug"), sent)
    assert ctx.status == 500 and sent[0]["status"] == 500
    assert orjson.loads(sent[1]["body"])["error"]["type"] == "server_error"
    assert not await on_error(state, make_ctx(), asyncio.CancelledError(), sent)  # not the watcher's: re-raise
    assert not await on_error(state, make_ctx(), KeyboardInterrupt(), sent)
    assert state.accounting.calls == []


def test_spans_only_for_stages_reached():
    recorded = []
    tracing = SimpleNamespace(span_at=lambda name, parent, start, end, attrs: recorded.append((name, start, end, attrs)))
    deferred_spans(tracing, make_ctx())
    assert recorded == []
    deferred_spans(tracing, make_ctx(t_auth_start_ns=1, t_auth_end_ns=2, authenticated=False))
    assert recorded == [("auth", 1, 2, {"specgate.authenticated": False})]
    recorded.clear()
    deferred_spans(tracing, make_ctx(t_auth_start_ns=1, t_auth_end_ns=2, authenticated=True, t_route_start_ns=3, t_route_end_ns=4, candidates=["a"]))
    assert recorded == [("auth", 1, 2, {"specgate.authenticated": True}), ("route", 3, 4, {"specgate.candidates": ["a"]})]


# -- the gateway's own aborts (drain deadline, wedged replica) ----------------
class HangingUpstream:
    """Each post hangs (a replica that never answers), except the outcomes queued after it."""

    def __init__(self, *then) -> None:
        self.then = list(then)
        self.posts: list[str] = []
        self.entered = asyncio.Event()

    async def post(self, url, body, headers, headers_timeout_s=None):
        self.posts.append(url)
        if len(self.posts) > 1 and self.then:
            return self.then.pop(0)
        self.entered.set()
        await asyncio.sleep(3600)


async def _started(state, ctx, send):
    from gateway.inflight import InflightRequests

    registry = InflightRequests(10)
    task = asyncio.ensure_future(_relay_and_settle(state, ctx, send))
    registry[task] = ctx
    await asyncio.wait_for(state.upstream.entered.wait(), 5)
    return registry, task


async def _relay_and_settle(state, ctx, send):
    try:
        await relay(state, ctx, state.replica_list, send)
    except BaseException as exc:
        if not await on_error(state, ctx, exc, send):
            raise


async def test_a_request_aborted_as_its_replica_wedged_fails_over_before_the_first_byte():
    body = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}})
    state = make_state(upstream=HangingUpstream(FakeResponse(200, body)))
    ctx, sent = relay_ctx(state), Sent()
    registry, task = await _started(state, ctx, sent)
    a = state.replica_list[0]
    assert registry.abort("replica_wedged", state.replica_list[1]) == 0  # only requests waiting on that replica
    assert registry.abort("replica_wedged", a) == 1
    await asyncio.wait_for(task, 5)
    assert sent[0]["status"] == 200 and (b"x-specgate-replica", b"b") in sent[0]["headers"]
    assert ctx.replica.name == "b" and [r.open_attempts for r in state.replica_list] == [0, 0]


async def test_a_request_ended_by_the_drain_deadline_before_any_byte_gets_a_503_to_retry():
    state = make_state(upstream=HangingUpstream())
    ctx, sent = relay_ctx(state), Sent()
    ctx.reserved_live = True
    registry, task = await _started(state, ctx, sent)
    registry.abort("shutdown")
    await asyncio.wait_for(task, 5)
    assert sent[0]["status"] == 503 and (b"retry-after", b"1") in sent[0]["headers"]
    assert orjson.loads(sent[1]["body"])["error"]["code"] == "shutting_down"
    assert ("refund", "t", 0) in state.accounting.calls  # nothing was served


class EndlessStream(FakeResponse):
    async def chunks(self):
        yield b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
        await asyncio.sleep(3600)


async def test_a_stream_under_way_ended_by_the_drain_deadline_gets_an_error_event_then_done():
    state = make_state(upstream=SimpleNamespace(post=None))
    entered = asyncio.Event()

    async def post(url, body, headers, headers_timeout_s=None):
        entered.set()
        return EndlessStream(200)

    state.upstream = SimpleNamespace(post=post, entered=entered)
    ctx, sent = relay_ctx(state, stream=True), Sent()
    registry, task = await _started(state, ctx, sent)
    for _ in range(100):
        if len(sent) >= 2:
            break
        await asyncio.sleep(0.01)
    registry.abort("shutdown")
    await asyncio.wait_for(task, 5)
    tail = b"".join(m.get("body", b"") for m in sent[2:])
    assert tail.endswith(b"data: [DONE]\n\n") and b'"code":"shutting_down"' in tail
    assert sent[-1] == {"type": "http.response.body", "body": b""}
    assert ctx.status == 503
