"""Stream continuation, the I/O half: continue a broken stream on another
replica and splice its output into the client's stream.

`continue_stream` runs the attempts, at most `max_continuations`, each on a
healthy replica serving the model (others before the one that broke); its
answer says whether the client's stream was completed (the caller sends
nothing more) or must end with an error event (`gateway.stream.ends`).
What is sent, and how the continuation is asked for, is the pure half's
(`gateway.stream.continuation`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import orjson

from contract import wire
from contract.knobs import merged_xargs
from contract.telemetry import RequestSpecStats

from ..inflight import UpstreamAttempt, take_abort
from ..upstream import UpstreamBroken, UpstreamConnectError, UpstreamTimeout, read_whole
from .continuation import ContinuationRequest, ContinuationTap, client_chunk, continuation_body, usage_event
from .ledger import StopAcrossSplice, StreamLedger, ends_on_character, stop_strings, withheld_text

if TYPE_CHECKING:
    from ..deps import RequestPathState
    from ..request_context import RequestContext

log = logging.getLogger("specgate.gateway.proxy")

_perf = time.perf_counter


async def continue_stream(state: RequestPathState, ctx: RequestContext, req: ContinuationRequest, ledger: StreamLedger,
                          broken, ranked: list, send, t_break: float) -> bool:
    """Continue the stream elsewhere and finish it (usage chunk if asked,
    `[DONE]`, end of body). False: it could not be continued; the caller
    ends it with the error event."""
    metrics = state.metrics
    why = ledger.why_not()
    if why is not None:
        return not_continued(metrics, ctx, "unsupported", why)
    if ledger.finish_reason is not None:
        # Broken after its last token: nothing to generate, only the end to send.
        metrics.child(metrics.continuations, "continued").inc()
        await _finish(ctx, req, ledger, send)
        return True
    g = state.settings.gateway
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    if ctx.traceparent:
        headers["traceparent"] = ctx.traceparent.decode("latin-1")
    tried: list = []
    for _ in range(g.max_continuations):
        replica = _next_replica(ranked, broken, tried)
        if replica is None:
            return not_continued(metrics, ctx, "failed", "no healthy replica serves the model")
        tried.append(replica)
        replica.breaker.on_attempt(time.monotonic())
        with UpstreamAttempt(replica, ctx):
            try:
                outcome = await _one(state, ctx, req, ledger, replica, headers, send, g.first_byte_timeout_s, t_break)
            except asyncio.CancelledError:
                if not take_abort(ctx, "replica_wedged"):
                    raise
                outcome = "broken"
        if ctx.continuations is None:
            ctx.continuations = []
        ctx.continuations.append((replica.name, outcome))
        if outcome == "done":
            replica.breaker.on_success()
            return True
        replica.breaker.on_failure(time.monotonic())
        if outcome == "spliced":  # it sent bytes, then broke too: the next one continues from there
            broken = replica
            t_break = _perf()
        elif outcome == "refused":
            break
        why = ledger.why_not()
        if why is not None:
            return not_continued(metrics, ctx, "unsupported", why)
    return not_continued(metrics, ctx, "exhausted" if tried else "failed", f"{len(tried)} continuation attempt(s) failed")


def not_continued(metrics, ctx: RequestContext, outcome: str, why: str | None) -> bool:
    """Count and log a stream that ends with the error event instead of
    being continued; returns False (what `continue_stream` answers then)."""
    metrics.child(metrics.continuations, outcome).inc()
    _log(ctx, "stream not continued", why=why)
    return False


def _next_replica(ranked: list, broken, tried: list):
    """The best-ranked healthy replica not tried yet, the one that broke last."""
    now = time.monotonic()
    usable = [r for r in ranked if r not in tried and r.healthy and r.breaker.allows(now)]
    others = [r for r in usable if r is not broken]
    return (others or usable or [None])[0]


async def _one(state: RequestPathState, ctx: RequestContext, req: ContinuationRequest, ledger: StreamLedger, replica,
               headers, send, headers_timeout: float, t_break: float) -> str:
    """One continuation attempt: "done" (the client's stream is complete),
    "spliced" (bytes were sent, then it broke), "failed" (nothing sent; try
    another replica), "refused" (the replica rejected the request: another
    one would too)."""
    post = state.upstream.post
    stops = stop_strings(req.body)
    include_stop = bool(req.body.get("include_stop_str_in_output"))
    try:
        withheld = ""
        if ledger.sent_ids:
            # The continuation's prompt must end on a character boundary (`StreamLedger.rewind` says why).
            decoded = await _rewind_to_character(post, replica.url, ctx.model, ledger, headers_timeout)
            if decoded is not None and stops and not include_stop:
                withheld = withheld_text(decoded, ledger.sent_text)
            if decoded is None or withheld is None:
                ledger.blocked = "the sent text could not be matched to its token ids"
                return "failed"
        xargs = merged_xargs(req.client_xargs, req.policy, replica.ext_knobs) if req.policy is not None else req.client_xargs
        body = continuation_body(req.body, ctx.endpoint, ledger, xargs)
        if body.get("max_tokens") is not None and body["max_tokens"] <= 0:
            ledger.finish_reason = "length"
            await _finish(ctx, req, ledger, send, final=client_chunk(ledger, req.chat, "", None, "length", None, False))
            state.metrics.child(state.metrics.continuations, "continued").inc()
            return "done"
        resp = await post(replica.url + "/v1/completions", orjson.dumps(body), headers, headers_timeout)
    except (UpstreamConnectError, UpstreamBroken, UpstreamTimeout) as exc:
        _log(ctx, "continuation attempt failed", replica=replica.name, error=f"{type(exc).__name__}: {exc}")
        return "failed"
    if resp.status != 200:
        return await _refused(ctx, replica, resp)
    state.metrics.continuation_prefill.inc(len(body["prompt"]))
    stop = StopAcrossSplice(stops, include_stop, ledger.sent_text, withheld) if stops else None
    tap = ContinuationTap(ledger, req.chat, req.client_ids, req.continuous, stop)
    return await _splice(state, ctx, req, ledger, replica, resp, tap, send, t_break)


# A character is at most 4 UTF-8 bytes, so at most 4 byte tokens; a run of bytes that makes no
# character at all (a random model's) may be longer. Past this many ids back the continuation
# is not attempted: each step back is one `/detokenize` call.
MAX_REWIND_IDS = 16


async def _rewind_to_character(post, url: str, model: str, ledger: StreamLedger, timeout: float) -> str | None:
    """Rewind the ledger to the longest prefix of the sent ids that ends on a
    character boundary (`/detokenize` of the prefixes, longest first: a
    partial character is a few ids) and return that prefix's text (None:
    `/detokenize` failed, or no boundary within `MAX_REWIND_IDS` ids)."""
    ids = ledger.sent_ids
    for end in range(len(ids), max(len(ids) - MAX_REWIND_IDS, 0) - 1, -1):
        text = await _detokenize(post, url, model, ids[:end], timeout) if end else ""
        if text is None:
            return None
        if ends_on_character(text):
            ledger.rewind(end)
            return text
    return None


async def _refused(ctx: RequestContext, replica, resp) -> str:
    """A continuation answered with an error status: "failed" (5xx: another replica may
    answer) or "refused" (the request itself was rejected)."""
    try:
        detail = (await resp.read())[:300]
    except BaseException:
        resp.abort()
        detail = b""
    _log(ctx, "continuation refused", replica=replica.name, status=resp.status, error=detail.decode("utf-8", "replace"))
    return "failed" if resp.status >= 500 else "refused"


async def _splice(state: RequestPathState, ctx: RequestContext, req: ContinuationRequest, ledger: StreamLedger,
                  replica, resp, tap: ContinuationTap, send, t_break: float) -> str:
    """Relay the continuation's output into the client's stream until its last token."""
    metrics = state.metrics
    part = ledger.start_part(replica.name)
    spliced = False
    try:
        async for data in resp.chunks():
            out = tap.feed(data)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
                if not spliced:
                    spliced = True
                    _spliced(metrics, t_break)
            if tap.error is not None:
                raise UpstreamBroken(f"engine error event: {str(tap.error)[:200]}")
            if tap.cut or tap.saw_done:
                break
        if not tap.done:
            raise UpstreamBroken("continuation ended before its last token")
    except (UpstreamBroken, UpstreamTimeout) as exc:
        resp.abort()
        part.metrics = tap.metrics
        if not tap.done:
            _log(ctx, "continuation broke", replica=replica.name, error=f"{type(exc).__name__}: {exc}")
            return "spliced" if spliced else "failed"
    except BaseException:
        resp.abort()
        raise
    else:
        if tap.saw_done:
            resp.release()
        else:
            resp.abort()  # stopped by the gateway: the replica must stop generating
        part.metrics = tap.metrics
    if not spliced:
        _spliced(metrics, t_break)
    await _finish(ctx, req, ledger, send)
    return "done"


def _spliced(metrics, t_break: float) -> None:
    """The first continued byte is out: a splice done (counted once per break)."""
    metrics.splice_latency.observe(_perf() - t_break)
    metrics.child(metrics.continuations, "continued").inc()


async def _detokenize(post, url: str, model: str, ids: list[int], timeout: float) -> str | None:
    resp = await post(url + "/detokenize", orjson.dumps({"model": model, "tokens": ids}),
                      {"content-type": "application/json"}, timeout)
    data = await read_whole(resp)
    if resp.status != 200:
        return None
    try:
        text = orjson.loads(data).get("prompt")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return text if isinstance(text, str) else None


async def _finish(ctx: RequestContext, req: ContinuationRequest, ledger: StreamLedger, send, final: bytes = b"") -> None:
    """The end of a continued stream: the usage chunk if the client asked for it, `[DONE]`, end of body."""
    body = final + (b"" if req.strip_usage else usage_event(ledger, req.chat)) + wire.DONE
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
    ctx.usage = ledger.usage()
    ctx.spec_metrics = None
    # Telemetry per replica that produced a part: the prompt is the first
    # part's (a continuation's re-prefill is the gateway's metric, not billed).
    ctx.parts = [
        (p.replica, RequestSpecStats.from_response({"prompt_tokens": ledger.prompt_tokens if i == 0 else 0,
                                                    "completion_tokens": p.tokens}, p.metrics))
        for i, p in enumerate(ledger.parts)
        if p.tokens or i == 0
    ]


def _log(ctx: RequestContext, msg: str, **fields) -> None:
    log.info(msg, extra={"fields": {"request_id": ctx.request_id, **fields}})
