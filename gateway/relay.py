"""The relay stage: upstream attempts with failover before the first byte,
then the response relayed to the client: a whole body here, a stream by
`gateway.stream.relay` (SSE events forwarded as they arrive; a stream broken
mid-way is continued on another replica or ends with an SSE error event).

`replica.open_attempts` counts one upstream attempt, response relay included,
and is changed in one place only (`inflight.UpstreamAttempt`), so no error
path can leak it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import orjson

from .capture import strip_token_ids, whole_body_ids
from .deps import RequestPathState
from .errors import GatewayError
from .inflight import UpstreamAttempt, take_abort
from .replica_errors import openai_error_body
from .request_context import RequestContext
from .stream.ends import RETRY_1, abort_error
from .stream.relay import relay_stream
from .upstream import UpstreamBroken, UpstreamConnectError, UpstreamTimeout, read_whole
from .upstream_bodies import UpstreamBodies

log = logging.getLogger("specgate.gateway.proxy")

_perf = time.perf_counter


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
        with UpstreamAttempt(replica, ctx):
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
                await relay_stream(state, ctx, resp, chunks, data, send, bodies, ranked)
            else:
                await _send_whole(state, ctx, resp, data, send, strip_ids=not bodies.client_ids)
            return
    if last_5xx is not None:
        status, data = last_5xx
        if data.startswith(b"{"):
            raise GatewayError(status, "", raw_body=openai_error_body(status, data))  # the replica's message, OpenAI's shape
        raise GatewayError(502, f"The model replica answered {status}.", code="upstream_error")
    if timed_out:
        raise GatewayError(504, "No replica answered in time; retry shortly.", code="upstream_timeout")
    raise GatewayError(503, f"No healthy replica could serve model `{ctx.model}`; retry shortly.", code="no_healthy_replica", headers=[RETRY_1])



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


async def _send_whole(state: RequestPathState, ctx: RequestContext, resp, data: bytes, send, strip_ids: bool = False) -> None:
    replica = ctx.replica
    raw = data
    capture = ctx.capture
    if resp.status >= 400:
        data = openai_error_body(resp.status, raw)  # vLLM's error, in OpenAI's shape
    elif capture is not None and strip_ids:
        data = strip_token_ids(raw)  # the ids were the gateway's: the client gets the body it would have had
    t_up = ctx.t_upstream
    t_done = _perf()
    overhead = (t_up - ctx.t0) + (_perf() - t_done)
    headers = resp.headers + [
        (b"content-length", str(len(data)).encode()),
        (b"x-specgate-replica", replica.name.encode()),
        (b"x-specgate-overhead-ms", f"{overhead * 1000:.3f}".encode()),
    ]
    headers += ctx.client_headers()
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
                    ctx.capture_seen = whole_body_ids(obj, ctx.endpoint == "chat")
        except orjson.JSONDecodeError:
            pass
