"""The relay stage: upstream attempts with failover before the first byte,
then the response relayed to the client (SSE events forwarded as they
arrive; a mid-stream failure becomes an SSE error event).

`replica.inflight` counts one upstream attempt, response relay included, and
is changed in one place only (`Inflight`), so no error path can leak it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import orjson

from contract.knobs import merged_xargs

from .deps import RequestPathState
from .errors import GatewayError
from .request_context import RequestContext
from .sse import StreamTap, error_event
from .upstream import UpstreamBroken, UpstreamConnectError, UpstreamTimeout

log = logging.getLogger("specgate.gateway.proxy")

_perf = time.perf_counter


class Inflight:
    """`with Inflight(replica):` one upstream attempt counts in the replica's
    load from before its request is sent until its response is done with."""

    __slots__ = ("replica",)

    def __init__(self, replica) -> None:
        self.replica = replica

    def __enter__(self) -> None:
        self.replica.inflight += 1

    def __exit__(self, *exc) -> None:
        self.replica.inflight -= 1


class UpstreamBodies:
    """The request body as each replica gets it: `stream_options.include_usage`
    forced on for streams (so tokens can be accounted; `strip_usage` says the
    usage chunk must not reach a client that did not ask for it), and the
    tenant's speculation knobs merged in where the replica honours them. One
    serialisation per distinct knob set."""

    __slots__ = ("_cache", "body", "client_xargs", "plain", "policy", "strip_usage")

    def __init__(self, ctx: RequestContext) -> None:
        body = self.body = ctx.body
        self.client_xargs = ctx.client_xargs
        self.policy = ctx.policy
        self.strip_usage = False
        if ctx.stream:
            so = body.get("stream_options")
            if not (isinstance(so, dict) and so.get("include_usage") is True):
                body["stream_options"] = {**(so if isinstance(so, dict) else {}), "include_usage": True}
                self.strip_usage = True
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
    bodies = UpstreamBodies(ctx)
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
    """Try replicas in rank order; fail over on connect errors and 5xx before
    the first byte; relay the first other response."""
    g = state.settings.gateway
    metrics = state.metrics
    post = state.upstream.post
    last_5xx = None
    last_error = "no replica could be reached"
    n = len(ranked)
    for attempt in range(g.max_attempts):
        replica = ranked[attempt % n]
        now = time.monotonic()
        if attempt:
            if not replica.breaker.allows(now):
                continue
            backoff = min(g.retry_backoff_max_s, g.retry_backoff_base_s * (2 ** (attempt - 1)))
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
        replica.breaker.on_attempt(now)
        body = bodies.for_replica(replica)
        with Inflight(replica):
            t_up = _perf()
            try:
                resp = await post(replica.url + ctx.path, body, headers)
            except UpstreamConnectError as exc:
                _failed(state, replica, "connect_error")
                last_error = f"replica {replica.name} unreachable: {exc}"
                continue
            except UpstreamTimeout:
                _failed(state, replica, "timeout")
                raise GatewayError(504, f"Replica {replica.name} did not answer within {g.first_byte_timeout_s}s.", code="upstream_timeout") from None
            if resp.status >= 500:
                data = await _drain(resp)
                _failed(state, replica, f"http_{resp.status}")
                last_5xx = (resp.status, data)
                continue
            replica.breaker.on_success()
            metrics.child(metrics.attempts, replica.name, "ok").inc()
            ctx.replica = replica
            ctx.t_upstream = t_up
            ctx.status = resp.status
            if span is not None:
                span.set_attribute("specgate.replica", replica.name)
            if ctx.stream and resp.status == 200:
                await _relay_stream(state, ctx, resp, send, bodies.strip_usage)
            else:
                await _relay_whole(state, ctx, resp, send)
            return
    if last_5xx is not None:
        status, data = last_5xx
        if data.startswith(b"{"):
            raise GatewayError(status, "", raw_body=data)  # the replica's own OpenAI-shaped error
        raise GatewayError(502, f"Replica answered {status}.", code="upstream_error")
    raise GatewayError(503, last_error, code="no_healthy_replica")


def _failed(state: RequestPathState, replica, outcome: str) -> None:
    replica.breaker.on_failure(time.monotonic())
    state.metrics.child(state.metrics.attempts, replica.name, outcome).inc()


async def _drain(resp) -> bytes:
    """A 5xx response's body (kept in case every attempt fails)."""
    try:
        data = await resp.read()
        resp.release()
    except (UpstreamBroken, UpstreamTimeout):
        resp.abort()
        data = b""
    except BaseException:  # client gone while reading the error body
        resp.abort()
        raise
    return data


async def _relay_whole(state: RequestPathState, ctx: RequestContext, resp, send) -> None:
    replica = ctx.replica
    try:
        data = await resp.read()
    except UpstreamTimeout:
        resp.abort()
        raise GatewayError(504, f"Replica {replica.name} stopped answering.", code="upstream_timeout") from None
    except UpstreamBroken as exc:
        resp.abort()
        raise GatewayError(502, f"Replica {replica.name} broke the connection: {exc}", code="upstream_error") from None
    except BaseException:
        resp.abort()
        raise
    resp.release()
    t_up = ctx.t_upstream
    t_done = _perf()
    overhead = (t_up - ctx.t0) + (_perf() - t_done)
    headers = resp.headers + [
        (b"content-length", str(len(data)).encode()),
        (b"x-specgate-replica", replica.name.encode()),
        (b"x-specgate-overhead-ms", f"{overhead * 1000:.3f}".encode()),
    ]
    await send({"type": "http.response.start", "status": resp.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
    # Everything below runs after the response is out (usage parsing,
    # histograms): off the client's latency.
    metrics = state.metrics
    metrics.child(metrics.overhead, ctx.endpoint, "false").observe(overhead)
    metrics.child(metrics.ttft, replica.name).observe(t_done - t_up)
    if resp.status == 200 and not ctx.stream:
        try:
            obj = orjson.loads(data)
            if isinstance(obj, dict):
                ctx.usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
                ctx.spec_metrics = obj.get("metrics") if isinstance(obj.get("metrics"), dict) else None
        except orjson.JSONDecodeError:
            pass


async def _relay_stream(state: RequestPathState, ctx: RequestContext, resp, send, strip_usage: bool) -> None:
    replica = ctx.replica
    metrics = state.metrics
    tap = StreamTap(strip_usage)
    t_up = ctx.t_upstream
    t_headers = _perf()
    overhead_pre = t_headers - ctx.t0 - (t_headers - t_up)
    headers = resp.headers + [
        (b"x-specgate-replica", replica.name.encode()),
        (b"x-specgate-overhead-ms", f"{overhead_pre * 1000:.3f}".encode()),
    ]
    status = 200
    first = True
    t_first = None
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    try:
        async for data in resp.chunks():
            if t_first is None:
                t_first = _perf()
                metrics.child(metrics.ttft, replica.name).observe(t_first - t_up)
            out = tap.feed(data)
            if tap.usage is not None and ctx.usage is None:
                # The stream's end is here (its usage chunk is the last before
                # [DONE]): recorded now, so a client that leaves at [DONE] while
                # the replica is still closing the stream is accounted for.
                ctx.usage, ctx.spec_metrics = tap.usage, tap.metrics
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
                if first:
                    first = False
                    overhead = overhead_pre + (_perf() - t_first)
                    metrics.child(metrics.overhead, ctx.endpoint, "true").observe(overhead)
        rest = tap.tail()
        if rest.strip():
            await send({"type": "http.response.body", "body": rest, "more_body": True})
        resp.release()
    except (UpstreamBroken, UpstreamTimeout) as exc:
        resp.abort()
        status = 502
        replica.breaker.on_failure(time.monotonic())
        log.warning("upstream stream broke", extra={"fields": {"replica": replica.name, "error": type(exc).__name__}})
        await send({"type": "http.response.body", "body": error_event(f"Replica {replica.name} failed mid-stream: {exc}"), "more_body": True})
    except BaseException:
        resp.abort()
        raise
    await send({"type": "http.response.body", "body": b""})
    ctx.usage, ctx.spec_metrics, ctx.status = tap.usage, tap.metrics, status
