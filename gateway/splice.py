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
import re
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
    if tap._buf:
        data = tap._buf + data
    elif data.endswith(_SEP):  # the usual read: whole events, nothing left over (no copies)
        events = data.split(_SEP)
        events.pop()
        return events if all(events) else [e for e in events if e]
    end = data.rfind(_SEP)
    if end < 0:
        tap._buf = data
        return ()
    end += 2
    ready, tap._buf = data[:end], data[end:]
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


# The ids field of a token chunk as vLLM lays it out: the last member of the
# only choice, the event's JSON closing right after it (a completion chunk's
# `"prompt_token_ids":null` goes with it). Cut where the parser would pop it.
_CHAT_IDS = re.compile(rb',"token_ids":\[[0-9,]*\]\}\]\}\n\n')
_TEXT_IDS = re.compile(rb',"prompt_token_ids":null,"token_ids":\[[0-9,]*\]\}\]\}\n\n')
_AFTER_IDS = b"}]}\n\n"
_EVENT_START = b"\n\ndata: {"
_CHOICE = b'"choices":[{"index":0,'
# A chat choice as vLLM lays it out, index then a non-empty delta (an empty
# one is dropped by the parser, not cut): one count proves both.
_CHAT_CHOICE = b'"choices":[{"index":0,"delta":{"'


def cut_token_ids(block: bytes, chat: bool, strip_ids: bool) -> tuple[bytes, int] | None:
    """`block` (whole SSE events, each with its blank line) as the client is
    sent it, and how many events it holds, if every event in it is one the
    parser would relay untouched but for the ids it pops -- one-line
    `data: {...}` choice chunks (so no usage chunk, no error, no `[DONE]`),
    no prompt ids, no empty delta, every ids field where vLLM puts it --
    else None (the caller parses it event by event). A handful of C-level
    scans of the whole block, however many events it holds: why, see
    `LedgerTap`. The markers are counted in raw JSON, where a quote inside
    a string is always escaped and a newline never raw, so a marker found
    is structure, not text."""
    events = block.count(_EVENT_START) + 1
    # Newlines only at the events' ends: each event is one line, and each starts with `data: {`.
    if not block.startswith(b"data: {") or block.count(b"\n") != 2 * events:
        return None
    if block.count(_CHAT_CHOICE if chat and strip_ids else _CHOICE) != events:
        return None
    if not strip_ids:
        return block, events
    if chat:
        out, cut = _CHAT_IDS.subn(_AFTER_IDS, block)
        fields = cut
    else:
        out, cut = _TEXT_IDS.subn(_AFTER_IDS, block)
        fields = 2 * cut  # each cut took `"prompt_token_ids":null` with the ids
    # No ids field (prompt or output) is left in the events that a cut did not take.
    return (out, events) if block.count(b'token_ids":') == fields else None


# Raw reads kept for the ledger before they are parsed into it (see LedgerTap.settle).
MAX_UNSETTLED_BYTES = 64 * 1024


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
    `StreamTap` does.

    The ledger is filled lazily: the reads are kept raw (at most
    MAX_UNSETTLED_BYTES, then parsed into the ledger) and parsed only when
    someone needs the ledger -- `settle()`, called where a stream is
    continued or captured. A stream that ends whole is never parsed event
    by event: the token chunks of a read, however many, are forwarded with
    their ids cut out of the bytes in one pass (`cut_token_ids`), and only
    the first chunk (the prompt's ids), the usage chunk, `[DONE]` and
    anything unusual go through the parser for what the client is sent.
    Why: every token of every continuable stream passes here. Parsing,
    editing and re-serialising each event made such a stream ~25 % dearer
    in gateway instructions than one relayed untouched, and even a regex
    and a Python step per event cost the tap 2.4x `StreamTap`'s
    instructions (docs/gateway.md#performance)."""

    __slots__ = ("strip_usage", "strip_ids", "chat", "ledger", "hold_errors", "_buf", "usage", "metrics", "events",
                 "saw_done", "error", "_unsettled", "_unsettled_bytes")

    def __init__(self, strip_usage: bool, strip_ids: bool, chat: bool, ledger: StreamLedger, hold_errors: bool = True) -> None:
        self.strip_usage, self.strip_ids, self.chat, self.ledger = strip_usage, strip_ids, chat, ledger
        self.hold_errors = hold_errors
        self._buf = b""
        self.usage: dict[str, Any] | None = None
        self.metrics: dict[str, Any] | None = None
        self.events = 0
        self.saw_done = False
        self.error: dict[str, Any] | None = None  # an engine error event the replica sent mid-stream
        self._unsettled: list[bytes] = []  # the reads relayed and not yet recorded in the ledger (whole events)
        self._unsettled_bytes = 0

    def feed(self, data: bytes) -> bytes:
        if self._buf:
            data, self._buf = self._buf + data, b""
        end = data.rfind(_SEP)
        if end < 0:
            self._buf = data
            return b""
        if end + 2 < len(data):
            data, self._buf = data[:end + 2], data[end + 2:]
        if self.error is None or not self.hold_errors:  # what follows a held error is dropped, not recorded
            self._unsettled.append(data)
            self._unsettled_bytes += len(data)
            if self._unsettled_bytes > MAX_UNSETTLED_BYTES:  # a long stream: parsed as it goes, in batches
                self.settle()
        size = len(data)
        if self.error is not None:
            return self._each(data, 0, size)
        # A read is one token chunk (a replica streaming token by token), or
        # token chunks in a row, perhaps after the first chunk (the prompt's
        # ids) and before the usage chunk and [DONE]: those are cut in one
        # pass, the events around them parsed.
        head = data.find(_SEP) + 2
        if head == size:
            head = 0
            tail = size
        else:
            if data.find(b'"prompt_token_ids":[', 0, head) < 0:  # prompt ids anywhere else: the cut refuses the read
                head = 0
            tail = data.rfind(b'"token_ids":', head)
            if tail < 0:
                return self._each(data, 0, size)
            tail = data.find(_SEP, tail) + 2
        whole = head == 0 and tail == size
        cut = cut_token_ids(data if whole else data[head:tail], self.chat, self.strip_ids)
        if cut is None:
            return self._each(data, 0, size)
        first = self._each(data, 0, head) if head else b""
        if self.error is not None:  # the first event was an engine error: the rest is the loop's
            return first + self._each(data, head, size)
        self.events += cut[1]
        if whole:
            return cut[0]
        return b"".join((first, cut[0], self._each(data, tail, size) if tail < size else b""))

    def _each(self, data: bytes, pos: int, size: int) -> bytes:
        """`data[pos:size]` (whole events) relayed event by event through the parser."""
        out: list[bytes] = []
        while pos < size:
            end = data.find(_SEP, pos)
            start, pos = pos, end + 2
            if end == start:
                continue
            self.events += 1
            if self.error is not None and self.hold_errors:
                continue
            event = self._parsed(data[start:end])
            if event is not None:
                out.append(event)
                out.append(_SEP)
        return b"".join(out)

    def _parsed(self, event: bytes) -> bytes | None:
        """What the client is sent of one event, read as JSON (None: nothing)."""
        obj = _payload(event)
        if type(obj) is dict:
            choices = obj.get("choices")
            if choices:
                kept = self._strip(obj, choices)
                if kept is None:
                    return None
                if kept:
                    return b"data: " + orjson.dumps(obj)
            elif _is_error(obj):
                self.error = obj
                if self.hold_errors:
                    return None
            elif _is_usage(obj):
                self.usage = obj["usage"]
                if isinstance(obj.get("metrics"), dict):
                    self.metrics = obj["metrics"]
                if self.strip_usage:
                    return None
        elif obj == b"[DONE]":
            self.saw_done = True
        return event

    def settle(self) -> StreamLedger:
        """The ledger with every choice chunk relayed so far recorded in it."""
        unsettled, self._unsettled, self._unsettled_bytes = self._unsettled, [], 0
        for block in unsettled:
            for event in block.split(_SEP):
                obj = _payload(event) if event else None
                if type(obj) is not dict:
                    continue
                if obj.get("choices"):
                    self._record(obj, obj["choices"])
                elif self.hold_errors and _is_error(obj):
                    return self.ledger  # the stream ended there (what came after it was not relayed)
        return self.ledger

    def _record(self, obj: dict, choices: Any) -> None:
        """A choice chunk into the ledger: ids, text, finish, what blocks a continuation."""
        ledger = self.ledger
        c = choices[0] if type(choices) is list else None
        if type(c) is not dict:
            ledger.blocked = "unexpected chunk shape"
            return
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

    def _strip(self, obj: dict, choices: Any) -> bool | None:
        """What the client is sent of a choice chunk: True: changed (re-serialise), None: drop it."""
        c = choices[0] if type(choices) is list else None
        if not self.strip_ids or type(c) is not dict:
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
