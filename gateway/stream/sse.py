"""Server-sent events as the gateway reads them: the one splitter (whole
events out of a replica's reads, an incomplete trailing event held back
until its end arrives) and the one payload parser. Framing is
`contract.wire`'s (`DATA`, `EVENT_END`, `DONE`), the same constants the
simulated replicas build their streams with.

Why the splitter hands out whole *blocks* (`EventBuffer.whole`) and lists
of events (`EventBuffer.events`) both: the taps that forward a read
untouched want it in one piece (no copy, no split: every token of every
stream passes here), the ones that rewrite events want them one by one.
"""

from __future__ import annotations

from typing import Any

import orjson

from contract.wire import DATA, DONE, EVENT_END

__all__ = ["DATA", "DONE", "DONE_DATA", "ERROR_DATA", "EVENT_END", "EventBuffer", "data_of", "is_done", "is_error", "is_usage", "payload"]

DONE_DATA = b"[DONE]"  # the data of the stream's last event (`payload` answers it as bytes)
_END_LEN = len(EVENT_END)
_JSON_LINE = DATA + b"{"
ERROR_DATA = DATA + b'{"error"'  # how an engine's in-stream error event starts
_DATA_FIELD = DATA.rstrip()  # `data:`, the space after it optional
_DONE_SPACED = DATA + DONE_DATA
_DONE_UNSPACED = _DATA_FIELD + DONE_DATA


class EventBuffer:
    """The bytes of a replica's stream that do not yet end an event."""

    __slots__ = ("rest",)

    def __init__(self) -> None:
        self.rest = b""

    def whole(self, data: bytes) -> bytes:
        """`data` (after what was held back) up to the end of its last whole
        event, each with its blank line; b"" while no event has ended. The
        rest is held back for the next read."""
        if self.rest:
            data, self.rest = self.rest + data, b""
        end = data.rfind(EVENT_END)
        if end < 0:
            self.rest = data
            return b""
        end += _END_LEN
        if end < len(data):
            data, self.rest = data[:end], data[end:]
        return data

    def events(self, data: bytes) -> list[bytes]:
        """The whole events of `data` (after what was held back), without
        their blank lines, empty events left out."""
        if not self.rest and data.endswith(EVENT_END):  # the usual read: whole events, nothing left over (no copies)
            events = data.split(EVENT_END)
            events.pop()
            return events if all(events) else [e for e in events if e]
        block = self.whole(data)
        return [e for e in block.split(EVENT_END) if e] if block else []

    def tail(self) -> bytes:
        """What is left when the stream ends (an event that never ended)."""
        rest, self.rest = self.rest, b""
        return rest


def data_of(event: bytes) -> bytes | None:
    """The event's data: its `data:` lines joined (None: it has none)."""
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(_DATA_FIELD)]
    return b"\n".join(lines) if lines else None


def payload(event: bytes) -> Any:
    """The event's data as JSON; b"[DONE]"; or None (not a data event, not JSON)."""
    if event.startswith(_JSON_LINE) and b"\n" not in event:  # vLLM's events: one compact JSON line
        try:
            return orjson.loads(event[6:])
        except orjson.JSONDecodeError:
            return None
    data = data_of(event)
    if data is None:
        return None
    if data == DONE_DATA:
        return data
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def is_done(event: bytes) -> bool:
    """The `[DONE]` event (with or without the space after `data:`)."""
    return event.startswith(_DONE_SPACED) or event.startswith(_DONE_UNSPACED)


def is_error(obj: Any) -> bool:
    """An engine error event (`{"error": ...}`, no choices)."""
    return isinstance(obj, dict) and "error" in obj and "choices" not in obj


def is_usage(obj: dict) -> bool:
    """The usage-only final chunk (`choices: []`)."""
    return isinstance(obj.get("usage"), dict) and obj.get("choices") == []
