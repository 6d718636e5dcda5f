"""The relay stage: upstream attempts with failover before the first byte,
then the response relayed to the client (SSE events forwarded as they
arrive; a stream broken mid-way is continued on another replica,
`gateway.splice`, or ends with an SSE error event).

`replica.inflight` counts one upstream attempt, response relay included, and
is changed in one place only (`inflight.Inflight`), so no error path can leak it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import orjson

from contract.knobs import merged_xargs

from .capture import strip_token_ids, whole_body_ids
from .continuation import ContinuationRequest, StreamLedger, unsupported
from .deps import RequestPathState
from .errors import GatewayError
from .inflight import Inflight, take_abort
from .request_context import RequestContext
from .splice import LedgerTap, continue_stream, not_continued
from .sse import StreamTap, error_event
from .upstream import UpstreamBroken, UpstreamConnectError, UpstreamTimeout, read_whole

log = logging.getLogger("specgate.gateway.proxy")

_perf = time.perf_counter


class UpstreamBodies:
    """The request body as each replica gets it: `stream_options.include_usage`
    forced on for streams (so tokens can be accounted; `strip_usage` says the
    usage chunk must not reach a client that did not ask for it),
    `return_token_ids` forced on for streams that can be continued
    (`continuation`) and for capture candidates (`ctx.capture`, streaming or
    not; stripped again for a client that did not ask: `client_ids`), and the
    tenant's speculation knobs merged in where the replica honours them. One
    serialisation per distinct knob set."""

    __slots__ = ("_cache", "body", "client_ids", "client_xargs", "continuation", "not_continuable", "plain", "policy",
                 "strip_usage")

    def __init__(self, ctx: RequestContext, continuations: int = 0) -> None:
        body = self.body = ctx.body
        self.client_xargs = ctx.client_xargs
        self.policy = ctx.policy
        self.strip_usage = False
        self.continuation: ContinuationRequest | None = None
        self.not_continuable: str | None = None
        client_ids = self.client_ids = body.get("return_token_ids") is True
        if ctx.stream:
            so = body.get("stream_options")
            if not (isinstance(so, dict) and so.get("include_usage") is True):
                body["stream_options"] = so = {**(so if isinstance(so, dict) else {}), "include_usage": True}
                self.strip_usage = True
            if continuations > 0:
                self.not_continuable = unsupported(body, ctx.endpoint)
                if self.not_continuable is None:
                    self.continuation = ContinuationRequest(
                        body=dict(body), chat=ctx.endpoint == "chat", client_ids=client_ids, strip_usage=self.strip_usage,
                        continuous=bool(so.get("continuous_usage_stats")), client_xargs=ctx.client_xargs, policy=ctx.policy,
                    )
                    body["return_token_ids"] = True
        if ctx.capture is not None:
            body["return_token_ids"] = True
        self.plain = orjson.dumps(body)
        self._cache: dict[frozenset[str], bytes] = {}

    def for_replica(self, replica) -> bytes:
        knobs = replica.ext_knobs
        cached = self._cache.get(knobs)
        if cached is None:
            xargs = merged_xargs(self.client_xargs, self.policy, knobs)
            if xargs is self.client_xargs or xargs is None:
                cached = self.plain
            else:
                cached = orjson.dumps({**self.body, "vllm_xargs": xargs})
            self._cache[knobs] = cached
        return cached


async def relay(state: RequestPathState, ctx: RequestContext, ranked: list, send) -> None:
    """Proxy the request to the best replica that answers (under a `proxy`
    span when traced) and relay its response; sets `ctx.replica`,
    `ctx.status`, `ctx.usage` and `ctx.spec_metrics`."""
    bodies = UpstreamBodies(ctx, state.settings.gateway.max_continuations)
    headers = {"content-type": "application/json", "accept": "text/event-stream" if ctx.stream else "application/json"}
    span = None
    if ctx.root is not None:
        tracing = state.tracing
        span = tracing.start("proxy", ctx.root_ctx, "client", {"specgate.tenant": ctx.tenant.id})
        tracing.inject(headers, tracing.context_of(span))
    elif ctx.traceparent:
        headers["traceparent"] = ctx.traceparent.decode("latin-1")
        if ctx.tracestate:
            headers["tracestate"] = ctx.tracestate.decode("latin-1")
    try:
        await _attempts(state, ctx, ranked, bodies, headers, send, span)
    finally:
        if span is not None:
            span.end()


async def _attempts(state: RequestPathState, ctx: RequestContext, ranked: list, bodies: UpstreamBodies, headers, send, span) -> None:
    """Try replicas in rank order and relay the first response that is not a
    failure. Until the client has been sent a byte a request is idempotent, so
    every failure before then fails over: connect errors, 5xx, a timeout, a
    non-streaming body that breaks, a replica found wedged while we wait on
    it. A replica that timed out or wedged is not tried twice."""
    g = state.settings.gateway
    post = state.upstream.post
    headers_timeout = g.first_byte_timeout_s if ctx.stream else g.response_timeout_s
    last_5xx = None
    timed_out = False
    stuck: list = []  # replicas that timed out or wedged on this request
    n = len(ranked)
    for attempt in range(g.max_attempts):
        replica = ranked[attempt % n]
        now = time.monotonic()
        if attempt:
            if not replica.breaker.allows(now) or not replica.healthy or replica in stuck:
                continue
            backoff = min(g.retry_backoff_max_s, g.retry_backoff_base_s * (2 ** (attempt - 1)))
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
        replica.breaker.on_attempt(now)
        body = bodies.for_replica(replica)
        with Inflight(replica, ctx):
            t_up = _perf()
            data = b""
            chunks = None
            try:
                resp = await post(replica.url + ctx.path, body, headers, headers_timeout)
                if ctx.stream and resp.status == 200:
                    # The client gets its response headers with the first
                    # event, not with the replica's headers (sent before
                    # queueing and prefill): a replica that dies in between
                    # is still a failover, not a stream cut.
                    chunks = resp.chunks()
                    data = await _first_chunk(resp, chunks)
                else:
                    data = await read_whole(resp)  # a whole response, an error body
            except (UpstreamConnectError, UpstreamBroken) as exc:
                _failed(state, ctx, replica, "connect_error" if isinstance(exc, UpstreamConnectError) else "broken", exc)
                continue
            except UpstreamTimeout:
                _failed(state, ctx, replica, "timeout")
                stuck.append(replica)
                timed_out = True
                continue
            except asyncio.CancelledError:
                if not take_abort(ctx, "replica_wedged"):
                    _shutdown_check(ctx)
                    raise
                _failed(state, ctx, replica, "wedged")
                stuck.append(replica)
                continue
            if resp.status >= 500:
                _failed(state, ctx, replica, f"http_{resp.status}")
                last_5xx = (resp.status, data)
                continue
            ctx.t_upstream = t_up
            _answered(state, ctx, replica, span)
            if chunks is not None:
                await _relay_stream(state, ctx, resp, chunks, data, send, bodies, ranked)
            else:
                await _send_whole(state, ctx, resp, data, send, strip_ids=not bodies.client_ids)
            return
    if last_5xx is not None:
        status, data = last_5xx
        if data.startswith(b"{"):
            raise GatewayError(status, "", raw_body=data)  # the replica's own OpenAI-shaped error
        raise GatewayError(502, f"The model replica answered {status}.", code="upstream_error")
    if timed_out:
        raise GatewayError(504, "No replica answered in time; retry shortly.", code="upstream_timeout")
    raise GatewayError(503, f"No healthy replica could serve model `{ctx.model}`; retry shortly.", code="no_healthy_replica", headers=[_RETRY_1])


_RETRY_1 = (b"retry-after", b"1")


def _answered(state: RequestPathState, ctx: RequestContext, replica, span) -> None:
    replica.breaker.on_success()
    metrics = state.metrics
    metrics.attempts.inc((replica.name, "ok"))
    ctx.replica = replica
    if span is not None:
        span.set_attribute("specgate.replica", replica.name)


def _shutdown_check(ctx: RequestContext) -> None:
    """A request the drain deadline ends before any byte was sent gets a 503
    to retry elsewhere (not a cut connection)."""
    if ctx.abort_reason == "shutdown" and not ctx.client_gone:
        asyncio.current_task().uncancel()
        raise abort_error("shutdown")


def abort_error(reason: str) -> GatewayError:
    """The 503 (retry) for a request the gateway ended itself, by `abort`'s
    reason, before the client was sent a byte."""
    if reason == "shutdown":
        return GatewayError(503, "The gateway is shutting down; retry the request.", code="shutting_down", headers=[_RETRY_1])
    return GatewayError(503, "The model replica stopped making progress; retry the request.", code="no_healthy_replica", headers=[_RETRY_1])


def _failed(state: RequestPathState, ctx: RequestContext, replica, outcome: str, exc: BaseException | None = None) -> None:
    replica.breaker.on_failure(time.monotonic())
    state.metrics.attempts.inc((replica.name, outcome))
    # The detail goes to the log (with the request id), never to the client.
    log.info(
        "upstream attempt failed",
        extra={"fields": {"request_id": ctx.request_id, "replica": replica.name, "outcome": outcome, "error": str(exc)[:200] if exc else None}},
    )


async def _first_chunk(resp, chunks) -> bytes:
    """A stream's first body bytes (b"" for an empty body)."""
    try:
        return await anext(chunks, b"")
    except BaseException:
        resp.abort()
        raise


def _extra_headers(ctx: RequestContext) -> list[tuple[bytes, bytes]]:
    extra = [(b"x-request-id", ctx.request_id.encode())]
    if ctx.response_headers:
        extra += ctx.response_headers
    return extra


async def _send_whole(state: RequestPathState, ctx: RequestContext, resp, data: bytes, send, strip_ids: bool = False) -> None:
    replica = ctx.replica
    raw = data
    capture = ctx.capture
    if capture is not None and strip_ids and resp.status == 200:
        data = strip_token_ids(raw)  # the ids were the gateway's: the client gets the body it would have had
    t_up = ctx.t_upstream
    t_done = _perf()
    overhead = (t_up - ctx.t0) + (_perf() - t_done)
    headers = resp.headers + [
        (b"content-length", str(len(data)).encode()),
        (b"x-specgate-replica", replica.name.encode()),
        (b"x-specgate-overhead-ms", f"{overhead * 1000:.3f}".encode()),
    ]
    headers += _extra_headers(ctx)
    ctx.status = resp.status
    ctx.response_started = True
    await send({"type": "http.response.start", "status": resp.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
    # Everything below runs after the response is out (usage parsing,
    # histograms): off the client's latency.
    metrics = state.metrics
    metrics.overhead.observe((ctx.endpoint, "false"), overhead)
    metrics.ttft.observe((replica.name,), t_done - t_up)
    if resp.status == 200 and not ctx.stream:
        try:
            obj = orjson.loads(raw)
            if isinstance(obj, dict):
                ctx.usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
                ctx.spec_metrics = obj.get("metrics") if isinstance(obj.get("metrics"), dict) else None
                if capture is not None:
                    capture.whole = whole_body_ids(obj, ctx.endpoint == "chat")
        except orjson.JSONDecodeError:
            pass


_DONE = b"data: [DONE]\n\n"
# What a client reads when its stream cannot go on; the detail is in the
# gateway's log under the request id.
_STREAM_ENDS = {
    "broken": ("The model replica serving this stream failed mid-stream; retry the request.", "upstream_error", 502),
    "replica_wedged": ("The model replica serving this stream stopped making progress; retry the request.", "upstream_timeout", 504),
    "shutdown": ("The gateway is shutting down; retry the request.", "shutting_down", 503),
}


async def _relay_stream(state: RequestPathState, ctx: RequestContext, resp, chunks, first: bytes, send,
                        bodies: UpstreamBodies, ranked: list) -> None:
    """Relay a stream as its events arrive. A stream that cannot go on (the
    replica broke it, sent an engine error event, went silent past
    `read_timeout_s`, or was found wedged) is continued on another replica
    where it can be (`gateway.splice`); otherwise, and at the drain
    deadline, it ends with an SSE error event and `[DONE]`, never a silent cut."""
    replica = ctx.replica
    metrics = state.metrics
    req = bodies.continuation
    capture = ctx.capture
    ledger = None
    if req is not None or capture is not None:
        # The ledger reads the ids (a continuation's prompt, a capture's
        # sample) and strips them for a client that did not ask; engine
        # error events are held back only where a continuation replaces them.
        ledger = StreamLedger()
        ledger.start_part(replica.name)
        tap = LedgerTap(bodies.strip_usage, not bodies.client_ids, ctx.endpoint == "chat", ledger, hold_errors=req is not None)
        if capture is not None:
            capture.ledger, capture.tap = ledger, tap
    else:
        tap = StreamTap(bodies.strip_usage)
    t_up = ctx.t_upstream
    t_headers = _perf()
    overhead_pre = t_headers - ctx.t0 - (t_headers - t_up)
    headers = resp.headers + [
        (b"x-specgate-replica", replica.name.encode()),
        (b"x-specgate-overhead-ms", f"{overhead_pre * 1000:.3f}".encode()),
    ]
    headers += _extra_headers(ctx)
    status = 200
    pending_overhead = True
    t_first = _perf()
    metrics.ttft.observe((replica.name,), t_first - t_up)
    ended = None
    ctx.status = 200
    ctx.response_started = True
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    data = first
    try:
        while data:  # the first read, then the rest as they come (b"": the body ended)
            out = tap.feed(data)
            if tap.usage is not None and ctx.usage is None:
                # The stream's end is here (its usage chunk is the last before
                # [DONE]): recorded now, so a client that leaves at [DONE] while
                # the replica is still closing the stream is accounted for.
                ctx.usage, ctx.spec_metrics = tap.usage, tap.metrics
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
                if pending_overhead:
                    pending_overhead = False
                    overhead = overhead_pre + (_perf() - t_first)
                    metrics.overhead.observe((ctx.endpoint, "true"), overhead)
            if req is not None and tap.error is not None:
                raise UpstreamBroken(f"engine error event: {str(tap.error)[:200]}")
            data = await anext(chunks, b"")
        if req is not None and not tap.saw_done:
            raise UpstreamBroken("the stream ended without [DONE]")
        rest = tap.tail()
        if rest.strip():
            await send({"type": "http.response.body", "body": rest, "more_body": True})
        resp.release()
    except (UpstreamBroken, UpstreamTimeout) as exc:
        resp.abort()
        replica.breaker.on_failure(time.monotonic())
        ended = "broken"
        log.warning(
            "upstream stream broke",
            extra={"fields": {"request_id": ctx.request_id, "replica": replica.name, "error": f"{type(exc).__name__}: {exc}"[:200]}},
        )
    except asyncio.CancelledError:
        resp.abort()
        reason = ctx.abort_reason
        if reason is None or ctx.client_gone or tap.saw_done:
            raise
        asyncio.current_task().uncancel()
        ended = reason if reason in _STREAM_ENDS else "broken"
        if ended == "replica_wedged" and req is not None:
            ctx.abort_reason = None  # the wedge is handled here: the continuation may be aborted afresh
        else:
            metrics.child(metrics.aborted, ended, "error_event").inc()
    except BaseException:
        resp.abort()
        raise
    if capture is not None:
        capture.broken = ended is not None
    if ended is not None and not tap.saw_done:
        if ended != "shutdown" and state.settings.gateway.max_continuations > 0:
            if req is not None:
                if await continue_stream(state, ctx, req, tap.settle(), replica, ranked, send, _perf()):
                    return
            else:
                not_continued(metrics, ctx, "unsupported", bodies.not_continuable)
            if ended == "replica_wedged":
                metrics.child(metrics.aborted, ended, "error_event").inc()
        message, code, status = _STREAM_ENDS[ended]
        await end_stream_with_error(ctx, send, message, code)
    else:
        await send({"type": "http.response.body", "body": b""})
    ctx.usage, ctx.spec_metrics, ctx.status = tap.usage, tap.metrics, status


async def end_stream_with_error(ctx: RequestContext, send, message: str, code: str) -> None:
    """In-band end of a stream whose headers are out: an SSE error event
    carrying the request id, `[DONE]`, end of body."""
    body = error_event(f"{message} (request id {ctx.request_id})", code) + _DONE
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
