"""The relay's taps: what the client is sent of each read of a replica's
stream, and what the gateway reads out of it on the way.

`StreamTap` forwards whole events as they arrive, reads `usage` and
`metrics` out of the final usage chunk, and drops that chunk when the
gateway asked for it (`stream_options.include_usage` injected) and the
client did not. `LedgerTap` does the same for a stream whose token ids the
gateway reads (one that can be continued, a capture candidate): it keeps the
stream's ledger, strips what the gateway injected (`return_token_ids`),
and, with `hold_errors`, notes an engine error event instead of forwarding
it, so the relay can continue the stream rather than end it.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from ..replica_errors import openai_error_event
from .ledger import StreamLedger
from .sse import DATA, DONE_DATA, ERROR_DATA, EVENT_END, EventBuffer, is_done, is_error, is_usage, payload

_END_LEN = len(EVENT_END)


class _Tap:
    """What every tap knows of the stream it relayed, which the relay's loop
    and ending read: its usage chunk, its events, whether `[DONE]` came, an
    engine error event it held back."""

    __slots__ = ("strip_usage", "_buf", "usage", "metrics", "events", "saw_done", "error")

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self._buf = EventBuffer()
        self.usage: dict[str, Any] | None = None
        self.metrics: dict[str, Any] | None = None
        self.events = 0
        self.saw_done = False
        self.error: dict[str, Any] | None = None  # an engine error event held back (only `LedgerTap` holds one)

    def tail(self) -> bytes:
        """What is left when the stream ends (an event that never ended)."""
        return self._buf.tail()


class StreamTap(_Tap):
    """The tap of a stream whose ids the gateway does not read."""

    __slots__ = ()

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward to the client now."""
        ready = self._buf.whole(data)
        if not ready:
            return b""
        if b'"usage"' not in ready and DONE_DATA not in ready and b'{"error"' not in ready:
            self.events += ready.count(EVENT_END)
            return ready
        out = []
        for event in ready.split(EVENT_END):
            if not event:
                continue
            self.events += 1
            if is_done(event):
                self.saw_done = True
            elif b'"usage"' in event and self._take_usage(event):
                if self.strip_usage:
                    continue
            elif event.startswith(ERROR_DATA):
                obj = payload(event)
                if is_error(obj):
                    event = openai_error_event(obj)  # the engine's error, in OpenAI's shape
            out.append(event)
            out.append(EVENT_END)
        return b"".join(out)

    def _take_usage(self, event: bytes) -> bool:
        """Keep usage/metrics; True when this is the usage-only final chunk."""
        obj = payload(event)
        if type(obj) is not dict or not isinstance(obj.get("usage"), dict):
            return False
        self.usage = obj["usage"]
        if isinstance(obj.get("metrics"), dict):
            self.metrics = obj["metrics"]
        return obj.get("choices") == []


# The ids field of a token chunk as vLLM lays it out: the last member of the
# only choice, the event's JSON closing right after it (a completion chunk's
# `"prompt_token_ids":null` goes with it). Cut where the parser would pop it.
_CHAT_IDS = re.compile(rb',"token_ids":\[[0-9,]*\]\}\]\}' + re.escape(EVENT_END))
_TEXT_IDS = re.compile(rb',"prompt_token_ids":null,"token_ids":\[[0-9,]*\]\}\]\}' + re.escape(EVENT_END))
_AFTER_IDS = b"}]}" + EVENT_END
_EVENT_START = EVENT_END + DATA + b"{"
_FIRST_EVENT = DATA + b"{"
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
    if not block.startswith(_FIRST_EVENT) or block.count(b"\n") != 2 * events:
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


# Raw reads kept for the ledger before they are parsed into it (see LedgerTap.ledger_so_far).
MAX_UNREAD_BYTES = 64 * 1024


class LedgerTap(_Tap):
    """`StreamTap`'s job (forward events, read and maybe strip the usage
    chunk) for a stream whose token ids the gateway reads, plus the ledger.
    `hold_errors`: an engine error event is noted and not forwarded (the
    relay continues the stream instead); without it the event and what
    follows are forwarded, as `StreamTap` does.

    The ledger is filled lazily: the reads are kept raw (at most
    MAX_UNREAD_BYTES, then parsed into the ledger) and parsed only when
    someone needs the ledger -- `ledger_so_far()`, called where a stream is
    continued or captured. A stream that ends whole is never parsed event
    by event: the token chunks of a read, however many, are forwarded with
    their ids cut out of the bytes in one pass (`cut_token_ids`), and only
    the first chunk (the prompt's ids), the usage chunk, `[DONE]` and
    anything unusual go through the parser for what the client is sent.
    Why: every token of every continuable stream passes here. Parsing,
    editing and re-serialising each event made such a stream ~25 % dearer
    in gateway instructions than one relayed untouched, and even a regex
    and a Python step per event cost the tap 2.4x `StreamTap`'s
    instructions (docs/benchmarks.md#gateway-cpu-per-request)."""

    __slots__ = ("strip_ids", "chat", "ledger", "hold_errors", "_unread", "_unread_bytes")

    def __init__(self, strip_usage: bool, strip_ids: bool, chat: bool, ledger: StreamLedger, hold_errors: bool = True) -> None:
        super().__init__(strip_usage)
        self.strip_ids, self.chat, self.ledger = strip_ids, chat, ledger
        self.hold_errors = hold_errors
        self._unread: list[bytes] = []  # the reads relayed and not yet parsed into the ledger (whole events)
        self._unread_bytes = 0

    def feed(self, data: bytes) -> bytes:
        data = self._buf.whole(data)
        if not data:
            return b""
        if self.error is None or not self.hold_errors:  # what follows a held error is dropped, not kept
            self._unread.append(data)
            self._unread_bytes += len(data)
            if self._unread_bytes > MAX_UNREAD_BYTES:  # a long stream: parsed as it goes, in batches
                self.ledger_so_far()
        size = len(data)
        if self.error is not None:
            return self._each(data, 0, size)
        # A read is one token chunk (a replica streaming token by token), or
        # token chunks in a row, perhaps after the first chunk (the prompt's
        # ids) and before the usage chunk and [DONE]: those are cut in one
        # pass, the events around them parsed.
        head = data.find(EVENT_END) + _END_LEN
        if head == size:
            head = 0
            tail = size
        else:
            if data.find(b'"prompt_token_ids":[', 0, head) < 0:  # prompt ids anywhere else: the cut refuses the read
                head = 0
            tail = data.rfind(b'"token_ids":', head)
            if tail < 0:
                return self._each(data, 0, size)
            tail = data.find(EVENT_END, tail) + _END_LEN
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
            end = data.find(EVENT_END, pos)
            start, pos = pos, end + _END_LEN
            if end == start:
                continue
            self.events += 1
            if self.error is not None and self.hold_errors:
                continue
            event = self._parsed(data[start:end])
            if event is not None:
                out.append(event)
                out.append(EVENT_END)
        return b"".join(out)

    def _parsed(self, event: bytes) -> bytes | None:
        """What the client is sent of one event, read as JSON (None: nothing)."""
        obj = payload(event)
        if type(obj) is dict:
            choices = obj.get("choices")
            if choices:
                kept = self._strip(obj, choices)
                if kept is None:
                    return None
                if kept:
                    return DATA + orjson.dumps(obj)
            elif is_error(obj):
                self.error = obj
                if self.hold_errors:
                    return None
                return openai_error_event(obj)  # relayed as the stream's last word, in OpenAI's shape
            elif is_usage(obj):
                self.usage = obj["usage"]
                if isinstance(obj.get("metrics"), dict):
                    self.metrics = obj["metrics"]
                if self.strip_usage:
                    return None
        elif obj == DONE_DATA:
            self.saw_done = True
        return event

    def ledger_so_far(self) -> StreamLedger:
        """The ledger with every choice chunk relayed so far in it."""
        unread, self._unread, self._unread_bytes = self._unread, [], 0
        ledger, chat = self.ledger, self.chat
        for block in unread:
            for event in block.split(EVENT_END):
                obj = payload(event) if event else None
                if type(obj) is not dict:
                    continue
                if obj.get("choices"):
                    ledger.take_chunk(obj, obj["choices"], chat)
                elif self.hold_errors and is_error(obj):
                    return ledger  # the stream ended there (what came after it was not relayed)
        return ledger

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
