"""A replica's stream relayed to the client, in three steps: setup (the tap
that reads it, the response headers), the loop (each read forwarded as its
events complete), and the ending (`[DONE]` as the replica sent it; or, for
a stream that could not go on, a continuation on another replica,
`gateway.stream.splice`, or an in-band error event, `gateway.stream.ends`,
never a silent cut).

A stream "cannot go on" when the replica broke it, sent an engine error
event (where a continuation may replace it), went silent past
`read_timeout_s`, or was found wedged; at the drain deadline it ends with
the error event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ..capture import StreamSeen
from ..upstream import UpstreamBroken, UpstreamTimeout
from .continuation import ContinuationRequest
from .ends import STREAM_ENDS, end_stream
from .ledger import StreamLedger
from .splice import continue_stream, not_continued
from .taps import LedgerTap, StreamTap

if TYPE_CHECKING:
    from ..deps import RequestPathState
    from ..request_context import RequestContext
    from ..upstream_bodies import UpstreamBodies

log = logging.getLogger("specgate.gateway.proxy")

_perf = time.perf_counter


async def relay_stream(state: RequestPathState, ctx: RequestContext, resp, chunks, first: bytes, send,
                       bodies: UpstreamBodies, ranked: list) -> None:
    """Relay the stream `resp` of `ctx.replica` (`first`: its first read,
    `chunks`: the rest); sets `ctx.status`, `ctx.usage`, `ctx.spec_metrics`
    (and `ctx.parts` where it was continued)."""
    tap = _tap(ctx, bodies)
    t_first, overhead_pre = await _start(state, ctx, resp, send)
    ended = await _loop(state, ctx, resp, chunks, first, send, tap, bodies.continuation, t_first, overhead_pre)
    await _ending(state, ctx, send, tap, bodies, ranked, ended)


def _tap(ctx: RequestContext, bodies: UpstreamBodies) -> StreamTap | LedgerTap:
    """The tap for this stream. A ledger where the ids are read (a
    continuation's prompt, a capture's sample), stripped for a client that
    did not ask; engine error events are held back only where a
    continuation replaces them."""
    req, capture = bodies.continuation, ctx.capture
    if req is None and capture is None:
        return StreamTap(bodies.strip_usage)
    ledger = StreamLedger()
    ledger.start_part(ctx.replica.name)
    tap = LedgerTap(bodies.strip_usage, not bodies.client_ids, ctx.endpoint == "chat", ledger, hold_errors=req is not None)
    if capture is not None:
        ctx.capture_seen = StreamSeen(tap, broken=False)
    return tap


async def _start(state: RequestPathState, ctx: RequestContext, resp, send) -> tuple[float, float]:
    """The response headers, with the replica's name and the gateway's
    overhead so far; returns (when they went out, that overhead)."""
    replica = ctx.replica
    t_up = ctx.t_upstream
    t_headers = _perf()
    overhead_pre = t_headers - ctx.t0 - (t_headers - t_up)
    headers = resp.headers + [
        (b"x-specgate-replica", replica.name.encode()),
        (b"x-specgate-overhead-ms", f"{overhead_pre * 1000:.3f}".encode()),
    ]
    headers += ctx.client_headers()
    t_first = _perf()
    state.metrics.ttft.observe((replica.name,), t_first - t_up)
    ctx.status = 200
    ctx.response_started = True
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    return t_first, overhead_pre


async def _loop(state: RequestPathState, ctx: RequestContext, resp, chunks, data: bytes, send,
                tap: StreamTap | LedgerTap, req: ContinuationRequest | None, t_first: float, overhead_pre: float) -> str | None:
    """Forward the reads until the body ends; returns why the stream could
    not go on (a `STREAM_ENDS` key), None when it ended as the replica ended it."""
    metrics = state.metrics
    pending_overhead = True
    try:
        while data:  # the first read, then the rest as they come (b"": the body ended)
            out = tap.feed(data)
            if tap.usage is not None and ctx.usage is None:
                # The stream's end is here (its usage chunk is the last before
                # [DONE]): kept now, so a client that leaves at [DONE] while
                # the replica is still closing the stream is accounted for.
                ctx.usage, ctx.spec_metrics = tap.usage, tap.metrics
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
                if pending_overhead:
                    pending_overhead = False
                    metrics.overhead.observe((ctx.endpoint, "true"), overhead_pre + (_perf() - t_first))
            if req is not None and tap.error is not None:
                raise UpstreamBroken(f"engine error event: {str(tap.error)[:200]}")
            data = await anext(chunks, b"")
        if req is not None and not tap.saw_done:
            raise UpstreamBroken("the stream ended without [DONE]")
        rest = tap.tail()
        if rest.strip():
            await send({"type": "http.response.body", "body": rest, "more_body": True})
        resp.release()
        return None
    except (UpstreamBroken, UpstreamTimeout) as exc:
        resp.abort()
        ctx.replica.breaker.on_failure(time.monotonic())
        log.warning(
            "upstream stream broke",
            extra={"fields": {"request_id": ctx.request_id, "replica": ctx.replica.name, "error": f"{type(exc).__name__}: {exc}"[:200]}},
        )
        return "broken"
    except asyncio.CancelledError:
        resp.abort()
        ended = _aborted(state, ctx, tap, req)
        if ended is None:
            raise
        return ended
    except BaseException:
        resp.abort()
        raise


def _aborted(state: RequestPathState, ctx: RequestContext, tap: StreamTap | LedgerTap,
             req: ContinuationRequest | None) -> str | None:
    """Why the gateway's own `abort` cut the stream (drain deadline, wedged
    replica), for the ending; None: not the gateway's (the client left) or
    the stream was complete, and the cancellation propagates."""
    reason = ctx.abort_reason
    if reason is None or ctx.client_gone or tap.saw_done:
        return None
    asyncio.current_task().uncancel()
    ended = reason if reason in STREAM_ENDS else "broken"
    if ended == "replica_wedged" and req is not None:
        ctx.abort_reason = None  # the wedge is handled here: the continuation may be aborted afresh
    else:
        metrics = state.metrics
        metrics.child(metrics.aborted, ended, "error_event").inc()
    return ended


async def _ending(state: RequestPathState, ctx: RequestContext, send, tap: StreamTap | LedgerTap,
                  bodies: UpstreamBodies, ranked: list, ended: str | None) -> None:
    """End the client's stream: as the replica ended it, continued on
    another replica, or with the error event."""
    status = 200
    if ended is not None and ctx.capture is not None:
        ctx.capture_seen = StreamSeen(tap, broken=True)
    if ended is not None and not tap.saw_done:
        metrics = state.metrics
        if ended != "shutdown" and state.settings.gateway.max_continuations > 0:
            req = bodies.continuation
            if req is not None:
                if await continue_stream(state, ctx, req, tap.ledger_so_far(), ctx.replica, ranked, send, _perf()):
                    return
            else:
                not_continued(metrics, ctx, "unsupported", bodies.not_continuable)
            if ended == "replica_wedged":
                metrics.child(metrics.aborted, ended, "error_event").inc()
        status = await end_stream(ctx, send, ended)
    else:
        await send({"type": "http.response.body", "body": b""})
    ctx.usage, ctx.spec_metrics, ctx.status = tap.usage, tap.metrics, status
