"""Server-sent-event tap for streamed completions.

Forwards complete SSE events as soon as they arrive (only an incomplete
trailing event is held back until its end arrives), reads `usage` and
`metrics` out of the final usage chunk, and removes that chunk when the
gateway asked for it (`stream_options.include_usage` injected) and the
client did not.
"""

from __future__ import annotations

from typing import Any

import orjson

_SEP = b"\n\n"


class StreamTap:
    __slots__ = ("strip_usage", "_buf", "usage", "metrics", "events", "saw_done")

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self._buf = b""
        self.usage: dict[str, Any] | None = None
        self.metrics: dict[str, Any] | None = None
        self.events = 0
        self.saw_done = False

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward to the client now."""
        buf = self._buf + data if self._buf else data
        end = buf.rfind(_SEP)
        if end < 0:
            self._buf = buf
            return b""
        end += 2
        ready, self._buf = buf[:end], buf[end:]
        if b'"usage"' not in ready and b"[DONE]" not in ready:
            self.events += ready.count(_SEP)
            return ready
        out = []
        for event in ready.split(_SEP):
            if not event:
                continue
            self.events += 1
            if event.startswith(b"data: [DONE]") or event.startswith(b"data:[DONE]"):
                self.saw_done = True
            elif b'"usage"' in event and self._take_usage(event):
                if self.strip_usage:
                    continue
            out.append(event)
            out.append(_SEP)
        return b"".join(out)

    def _take_usage(self, event: bytes) -> bool:
        """Record usage/metrics; True when this is the usage-only final chunk."""
        payload = _data_of(event)
        if payload is None:
            return False
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(obj, dict) or not isinstance(obj.get("usage"), dict):
            return False
        self.usage = obj["usage"]
        if isinstance(obj.get("metrics"), dict):
            self.metrics = obj["metrics"]
        return obj.get("choices") == []

    def tail(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest


def _data_of(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def error_event(message: str, code: str = "upstream_error") -> bytes:
    return b"data: " + orjson.dumps({"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}) + _SEP
