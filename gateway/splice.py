"""Stream continuation, the I/O half: the taps that keep a stream's ledger
as it is relayed, and the loop that continues a broken stream on another
replica and splices its output into the client's stream.

`LedgerTap` replaces `StreamTap` for streams that can be continued: it reads
every event (the ids and text the client is sent), strips what the gateway
injected (`return_token_ids`, the usage chunk) from what the client did not
ask for, and notes an engine error event instead of forwarding it, so the
relay can continue the stream rather than end it. `ContinuationTap` turns a
continuation's `/v1/completions` chunks into the client's shape (see
`gateway.continuation`). `continue_stream` runs the attempts, at most
`max_continuations`, each on a healthy replica serving the model (others
before the one that broke); its answer says whether the client's stream was
completed (the caller sends nothing more) or must end with an error event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from contract.knobs import merged_xargs
from contract.telemetry import RequestSpecStats

from .continuation import (
    ContinuationRequest,
    StopAcrossSplice,
    StreamLedger,
    client_chunk,
    continuation_body,
    stop_strings,
    usage_event,
    withheld_text,
)
from .deps import RequestPathState
from .inflight import Inflight, take_abort
from .request_context import RequestContext
from .upstream import UpstreamBroken, UpstreamConnectError, UpstreamTimeout, read_whole

log = logging.getLogger("specgate.gateway.proxy")

_SEP = b"\n\n"
_DONE = b"data: [DONE]\n\n"
_perf = time.perf_counter


def _events(tap, data: bytes):
    """Complete SSE events of `data` (an incomplete trailing one is kept in `tap._buf`)."""
    buf = tap._buf + data if tap._buf else data
    end = buf.rfind(_SEP)
    if end < 0:
        tap._buf = buf
        return ()
    end += 2
    ready, tap._buf = buf[:end], buf[end:]
    return [e for e in ready.split(_SEP) if e]


def _payload(event: bytes) -> Any:
    """The event's data as JSON; b"[DONE]"; or None (not a data event, not JSON)."""
    if event.startswith(b"data: {") and b"\n" not in event:  # vLLM's events: one compact JSON line
        try:
            return orjson.loads(event[6:])
        except orjson.JSONDecodeError:
            return None
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    data = b"\n".join(lines)
    if data == b"[DONE]":
        return data
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _is_error(obj: Any) -> bool:
    return isinstance(obj, dict) and "error" in obj and "choices" not in obj


def _is_usage(obj: dict) -> bool:
    return isinstance(obj.get("usage"), dict) and obj.get("choices") == []


class LedgerTap:
    """`StreamTap`'s job (forward events, read and maybe strip the usage
    chunk) for a stream whose token ids the gateway reads (a stream that can
    be continued, a capture candidate), plus the ledger. `hold_errors`: an
    engine error event is noted and not forwarded (the relay continues the
    stream instead); without it the event and what follows are forwarded, as
    `StreamTap` does."""

    __slots__ = ("strip_usage", "strip_ids", "chat", "ledger", "hold_errors", "_buf", "usage", "metrics", "events",
                 "saw_done", "error")

    def __init__(self, strip_usage: bool, strip_ids: bool, chat: bool, ledger: StreamLedger, hold_errors: bool = True) -> None:
        self.strip_usage, self.strip_ids, self.chat, self.ledger = strip_usage, strip_ids, chat, ledger
        self.hold_errors = hold_errors
        self._buf = b""
        self.usage: dict[str, Any] | None = None
        self.metrics: dict[str, Any] | None = None
        self.events = 0
        self.saw_done = False
        self.error: dict[str, Any] | None = None  # an engine error event the replica sent mid-stream

    def feed(self, data: bytes) -> bytes:
        out = []
        for event in _events(self, data):
            self.events += 1
            if self.error is not None and self.hold_errors:
                continue
            obj = _payload(event)
            if obj == b"[DONE]":
                self.saw_done = True
            elif _is_error(obj):
                self.error = obj
                if self.hold_errors:
                    continue
            elif isinstance(obj, dict):
                if _is_usage(obj):
                    self.usage = obj["usage"]
                    if isinstance(obj.get("metrics"), dict):
                        self.metrics = obj["metrics"]
                    if self.strip_usage:
                        continue
                elif obj.get("choices"):
                    kept = self._take(obj)
                    if kept is None:
                        continue
                    if kept:
                        event = b"data: " + orjson.dumps(obj)
            out.append(event)
            out.append(_SEP)
        return b"".join(out)

    def _take(self, obj: dict) -> bool | None:
        """Record a choice chunk; True: it was changed (re-serialise), None: drop it."""
        ledger, c = self.ledger, obj["choices"][0]
        if not isinstance(c, dict):
            ledger.blocked = "unexpected chunk shape"
            return False
        ledger.identify(obj)
        if ledger.prompt_ids is None:
            pids = obj.get("prompt_token_ids") if self.chat else c.get("prompt_token_ids")
            if isinstance(pids, list):
                ledger.prompt_ids = pids
        ids = c.get("token_ids")
        if self.chat:
            delta = c.get("delta") or {}
            text = delta.get("content") or ""
            if delta.get("tool_calls") or delta.get("reasoning") or delta.get("reasoning_content"):
                ledger.blocked = "tool-call or reasoning output"
        else:
            text = c.get("text") or ""
        if not isinstance(ids, list):
            if text:
                ledger.blocked = "the replica sent no token ids"
            ids = []
        ledger.took(ids, text)
        if c.get("finish_reason") is not None:
            ledger.finish_reason = c["finish_reason"]
        if not self.strip_ids:
            return False
        changed = obj.pop("prompt_token_ids", None) is not None
        changed = c.pop("prompt_token_ids", None) is not None or changed
        changed = c.pop("token_ids", None) is not None or changed
        if self.chat and changed and not c.get("delta") and c.get("finish_reason") is None and c.get("logprobs") is None:
            return None  # vLLM sends an empty delta only because token ids were asked for
        return changed

    def tail(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest


class ContinuationTap:
    """A continuation's `/v1/completions` events as the client's events."""

    __slots__ = ("ledger", "chat", "client_ids", "continuous", "stop", "_buf", "usage", "metrics", "saw_done", "error",
                 "done", "cut", "events")

    def __init__(self, ledger: StreamLedger, chat: bool, client_ids: bool, continuous: bool,
                 stop: StopAcrossSplice | None) -> None:
        self.ledger, self.chat, self.client_ids, self.continuous, self.stop = ledger, chat, client_ids, continuous, stop
        self._buf = b""
        self.usage: dict[str, Any] | None = None
        self.metrics: dict[str, Any] | None = None
        self.saw_done = False
        self.error: dict[str, Any] | None = None
        self.done = False  # the client's stream got its finish_reason
        self.cut = False  # ... from the gateway, at a stop string across the splice: the replica goes on
        self.events = 0

    def feed(self, data: bytes) -> bytes:
        out = []
        for event in _events(self, data):
            self.events += 1
            obj = _payload(event)
            if obj == b"[DONE]":
                self.saw_done = True
            elif _is_error(obj):
                if not self.done:
                    self.error = obj
                    break
            elif isinstance(obj, dict) and _is_usage(obj):
                self.usage = obj["usage"]
                self.metrics = obj.get("metrics") if isinstance(obj.get("metrics"), dict) else None
            elif isinstance(obj, dict) and obj.get("choices") and not self.done:
                chunk = self._take(obj["choices"][0])
                if chunk:
                    out.append(chunk)
        return b"".join(out)

    def _take(self, c: Any) -> bytes:
        if not isinstance(c, dict):
            return b""
        ids = c.get("token_ids") if isinstance(c.get("token_ids"), list) else []
        text = c.get("text") or ""
        finish, stop_reason = c.get("finish_reason"), c.get("stop_reason")
        if self.stop is not None:
            text, hit = self.stop.feed(text)
            if hit is not None:
                finish, stop_reason = "stop", hit
                self.cut = True
            elif finish is not None:
                text += self.stop.flush()
        ledger = self.ledger
        ledger.took(ids, text)
        if finish is not None:
            ledger.finish_reason = finish
            self.done = True
        if not text and finish is None and not (self.client_ids and ids):
            return b""
        return client_chunk(ledger, self.chat, text, ids if self.client_ids else None, finish, stop_reason,
                            ledger.usage() if self.continuous else None)


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
    post = state.upstream.post
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
        with Inflight(replica, ctx):
            try:
                outcome = await _one(state, ctx, req, ledger, replica, post, headers, send, g.first_byte_timeout_s, t_break)
            except asyncio.CancelledError:
                if not take_abort(ctx, "replica_wedged"):
                    raise
                outcome = "broken"
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
               post, headers, send, headers_timeout: float, t_break: float) -> str:
    """One continuation attempt: "done" (the client's stream is complete),
    "spliced" (bytes were sent, then it broke), "failed" (nothing sent; try
    another replica), "refused" (the replica rejected the request: another
    one would too)."""
    metrics = state.metrics
    model = ctx.model
    withheld = ""
    stops = stop_strings(req.body)
    include_stop = bool(req.body.get("include_stop_str_in_output"))
    try:
        if stops and not include_stop and ledger.sent_ids:
            decoded = await _detokenize(post, replica.url, model, ledger.sent_ids, headers_timeout)
            withheld = withheld_text(decoded, ledger.sent_text) if decoded is not None else None
            if withheld is None:
                ledger.blocked = "the sent text could not be matched to its token ids"
                return "failed"
        xargs = merged_xargs(req.client_xargs, req.policy, replica.ext_knobs) if req.policy is not None else req.client_xargs
        body = continuation_body(req.body, ctx.endpoint, ledger, xargs)
        if body.get("max_tokens") is not None and body["max_tokens"] <= 0:
            ledger.finish_reason = "length"
            await _finish(ctx, req, ledger, send, final=client_chunk(ledger, req.chat, "", None, "length", None, None))
            metrics.child(metrics.continuations, "continued").inc()
            return "done"
        resp = await post(replica.url + "/v1/completions", orjson.dumps(body), headers, headers_timeout)
    except (UpstreamConnectError, UpstreamBroken, UpstreamTimeout) as exc:
        _log(ctx, "continuation attempt failed", replica=replica.name, error=f"{type(exc).__name__}: {exc}")
        return "failed"
    if resp.status != 200:
        try:
            detail = (await resp.read())[:300]
        except BaseException:
            resp.abort()
            detail = b""
        _log(ctx, "continuation refused", replica=replica.name, status=resp.status, error=detail.decode("utf-8", "replace"))
        return "failed" if resp.status >= 500 else "refused"
    metrics.continuation_prefill.inc(len(body["prompt"]))
    stop = StopAcrossSplice(stops, include_stop, ledger.sent_text, withheld) if stops else None
    tap = ContinuationTap(ledger, req.chat, req.client_ids, req.continuous, stop)
    ledger.start_part(replica.name)
    part = ledger.parts[-1]
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
        part[2] = tap.metrics
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
        part[2] = tap.metrics
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
    body = final + (b"" if req.strip_usage else usage_event(ledger, req.chat)) + _DONE
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
    ctx.usage = ledger.usage()
    ctx.spec_metrics = None
    # Telemetry per replica that produced a part: the prompt is the first
    # part's (a continuation's re-prefill is the gateway's metric, not billed).
    ctx.parts = [
        (name, RequestSpecStats.from_response({"prompt_tokens": ledger.prompt_tokens if i == 0 else 0, "completion_tokens": n}, m))
        for i, (name, n, m) in enumerate(ledger.parts)
        if n or i == 0
    ]


def _log(ctx: RequestContext, msg: str, **fields) -> None:
    log.info(msg, extra={"fields": {"request_id": ctx.request_id, **fields}})
