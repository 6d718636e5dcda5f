"""The outcome stage: what happens once the response is out (or the request
failed): budget settlement and refunds, usage/telemetry accounting, and for
every request its metrics, access-log line and deferred spans.

Refund rule: a reservation is given back whole (`refund_request`) when the
request failed with 502/503 (no replica could serve it); its token estimate
is settled to 0 when a replica's own error was relayed (nothing generated);
otherwise it is settled to the usage the replica reported.
"""

from __future__ import annotations

import asyncio
import logging
import time

from contract.knobs import STOCK, RequestKnobs, merged_xargs, parse_knobs
from contract.telemetry import RequestSpecStats

from . import access_log
from .asgi_io import ClientGone, send_error
from .capture import StreamSeen, stream_sample, whole_sample
from .deps import RequestPathState
from .errors import GatewayError
from .request_context import RequestContext
from .stream.ends import abort_error, end_stream_with_error

log = logging.getLogger("specgate.gateway.proxy")

_perf = time.perf_counter
_REFUNDED = (503, 502)


def account(state: RequestPathState, ctx: RequestContext) -> None:
    """Settle the reservation against the relayed response's usage and record
    its tokens and speculation telemetry."""
    usage = ctx.usage
    if usage is None:
        if ctx.reserved_live and ctx.status != 200:
            # The replica refused the request (its 4xx/5xx was relayed):
            # nothing was generated, so the token estimate goes back.
            state.accounting.settle(ctx.tenant, ctx.reserved, 0)
        return
    tenant = ctx.tenant
    # The replica's time for the request (from the attempt that answered to its last byte): the
    # rollout's goodput per request. A continued stream had several replicas, so it is not timed.
    duration_s = _perf() - (ctx.t_upstream or ctx.t0) if not ctx.parts else None
    stats = RequestSpecStats.from_response(
        usage, ctx.spec_metrics, duration_s=duration_s, knobs=sent_knobs(ctx), probed=ctx.probe is not None
    )
    if ctx.reserved_live:
        state.accounting.settle(tenant, ctx.reserved, stats.prompt_tokens + stats.completion_tokens)
    metrics = state.metrics
    label = ctx.tenant_label
    metrics.tokens.inc((label, "prompt"), stats.prompt_tokens)
    metrics.tokens.inc((label, "completion"), stats.completion_tokens)
    for replica_name, part in ctx.parts or ((ctx.replica_name, stats),):
        _replica_telemetry(state, ctx, replica_name, part)
    if ctx.capture is not None:
        _capture(state, ctx, usage)


def sent_knobs(ctx: RequestContext) -> RequestKnobs | None:
    """The knobs the answering replica applied to the request (None: no
    replica answered): what the gateway sent it where it honours knobs, stock
    where it does not (it then drafts its full K whatever was asked)."""
    replica = ctx.replica
    if replica is None:
        return None
    if not replica.supports_knobs:
        return STOCK
    xargs = merged_xargs(ctx.client_xargs, ctx.policy, replica.ext_knobs) if ctx.policy is not None else ctx.client_xargs
    return parse_knobs(xargs)


def _capture(state: RequestPathState, ctx: RequestContext, usage: dict) -> None:
    """A capture candidate's response is complete (the client has all of it):
    its sample goes to the capture mirror's queue, or is counted as dropped,
    or -- not a whole, finished request -- is not a sample at all."""
    seen = ctx.capture_seen
    if isinstance(seen, StreamSeen):
        sample = stream_sample(seen, usage, ctx.parts is not None)
    else:
        sample = None if ctx.stream else whole_sample(seen, usage)
    state.capture.finished(ctx.capture, sample)


def _replica_telemetry(state: RequestPathState, ctx: RequestContext, replica_name: str, stats: RequestSpecStats) -> None:
    """Telemetry of what one replica produced (all of a request, or its part of a continued stream)."""
    state.accounting.record(ctx.tenant.id, replica_name, stats)
    metrics = state.metrics
    label = ctx.tenant_label
    if stats.num_draft_tokens is not None:
        metrics.drafted.inc((label, replica_name), stats.num_draft_tokens)
        metrics.accepted.inc((label, replica_name), stats.num_accepted_draft_tokens or 0)
        if stats.num_spec_steps:
            metrics.recent_acceptance.add(ctx.tenant.id, stats.num_accepted_draft_tokens or 0, stats.num_spec_steps)
            metrics.spec_steps.inc((label, replica_name), stats.num_spec_steps)
            al = 1.0 + (stats.num_accepted_draft_tokens or 0) / stats.num_spec_steps
            metrics.acceptance_length.observe((label, replica_name), al)


async def on_error(state: RequestPathState, ctx: RequestContext, exc: BaseException, send) -> bool:
    """Turn a failure of any stage into the request's status (and the error
    response, refund) it calls for. False: not ours to handle (re-raise)."""
    if isinstance(exc, GatewayError):
        ctx.status = exc.status
        if ctx.reserved_live and exc.status in _REFUNDED:
            state.accounting.refund_request(ctx.tenant, ctx.reserved)
        await _try_send_error(send, ctx, exc)
    elif isinstance(exc, ClientGone):
        _client_left(state, ctx)
    elif isinstance(exc, asyncio.CancelledError):
        if ctx.client_gone:
            # Our watcher cancelled us: the client went away. The upstream
            # response was closed by the relay's cleanup.
            _client_left(state, ctx)
        elif ctx.abort_reason is not None:
            # The gateway ended the request itself (drain deadline) outside
            # the relay's own handling: the client still gets an answer.
            ctx.status = 503
            if ctx.reserved_live and not ctx.response_started:
                state.accounting.refund_request(ctx.tenant, ctx.reserved)
            state.metrics.child(state.metrics.aborted, ctx.abort_reason, "error_response").inc()
            await _try_send_error(send, ctx, abort_error(ctx.abort_reason))
        else:
            return False  # cancelled from outside (server shutdown): propagate
        asyncio.current_task().uncancel()
    elif isinstance(exc, Exception):
        log.exception(
            "unexpected error in request path",
            exc_info=exc,
            extra={"fields": {"request_id": ctx.request_id, "tenant": ctx.tenant.id if ctx.tenant else None}},
        )
        ctx.status = 500
        await _try_send_error(send, ctx, GatewayError(500, "Internal gateway error."))
    else:
        return False
    return True


def _client_left(state: RequestPathState, ctx: RequestContext) -> None:
    """The client went away. If the replica's stream had already reported its
    usage (the last chunk before [DONE]), the client left at the end of a
    complete response -- an OpenAI SDK closes the connection at [DONE] -- so
    it is a success and is settled and recorded like one; otherwise 499."""
    if ctx.usage is not None:
        ctx.status = 200
        account(state, ctx)
    else:
        ctx.status = 499


async def _try_send_error(send, ctx: RequestContext, err: GatewayError) -> None:
    """The error as a response, or in-band (an SSE error event and [DONE])
    when the response is already under way; the message carries the request
    id, which the gateway's log lines carry too."""
    try:
        if ctx.response_started:
            if ctx.stream:
                await end_stream_with_error(ctx, send, err.message or "The request failed.", err.code or "upstream_error")
            return
        await send_error(send, err, [(b"x-request-id", ctx.request_id.encode())] if ctx.request_id else None)
    except Exception:
        pass


def finish(state: RequestPathState, ctx: RequestContext, send=None) -> None:
    """Per-request observability, after the response is out: deferred spans,
    request/latency metrics, the access-log record (`gateway.access_log`)."""
    elapsed = _perf() - ctx.t0
    if ctx.root is not None:
        deferred_spans(state.tracing, ctx)
    metrics = state.metrics
    status = str(ctx.status)
    replica_name = ctx.replica_name
    metrics.requests.inc((ctx.tenant_label, replica_name, ctx.endpoint, status))
    metrics.latency.observe((ctx.tenant_label, replica_name, status), elapsed)
    if state.settings.gateway.access_log:
        access_log.write(access_log.request_record(ctx, elapsed, send))


def deferred_spans(tracing, ctx: RequestContext) -> None:
    """The auth and route spans, from the timestamps their stages took: the
    same spans as if opened live, but their SDK cost is off the latency path.
    (Only the root and proxy spans must exist before the upstream call, for
    `traceparent`.) A stage not reached gets no span."""
    parent = ctx.root_ctx
    if ctx.t_auth_end_ns:
        tracing.span_at("auth", parent, ctx.t_auth_start_ns, ctx.t_auth_end_ns, {"specgate.authenticated": ctx.authenticated})
    if ctx.candidates is not None:
        tracing.span_at("route", parent, ctx.t_route_start_ns, ctx.t_route_end_ns, {"specgate.candidates": ctx.candidates})
