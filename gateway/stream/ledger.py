"""What the client of one stream (one choice) has been sent, in token ids
and text, per replica that produced it, and what a splice must check
against it: stop strings that start before the splice and end after it.

Why token ids and not text: the gateway asks every replica for
`return_token_ids` (stripped before the client sees them unless it asked),
so when a stream breaks it knows the prompt's ids (from the first chunk) and
the ids of every token it forwarded; a continuation's prompt is exactly
those (`gateway.stream.continuation`). A capture sample is the same ledger
read once the stream ended whole (`gateway.capture.stream_sample`).

Why the gateway checks stop strings at the splice (`StopAcrossSplice`): vLLM
checks stop strings in a request's own output only, and while it does, it
holds back the last `max(len(stop)) - 1` characters of text (the token ids
are not held back). So at a break the client may lack a few characters of
tokens it has the ids of (`withheld_text`, recovered with `/detokenize`),
and a stop string may start before the splice and end after it; the
gateway finds it where vLLM would have, and ends the stream there.

Why a continuation starts from the last character boundary of the sent ids
(`StreamLedger.rewind`, `ends_on_character`): one character can take
several tokens (byte-level and byte-fallback vocabularies), and a break can
come between them -- the client then has the ids of a character whose text
it never got. vLLM primes a request's incremental detokenizer with the whole
prompt (`FastIncrementalDetokenizer`: `DecodeStream(ids=prompt_token_ids)`),
and tokenizers' `DecodeStream` takes the prompt's text as the prefix to cut
off only when it does not end in U+FFFD; a prompt that ends inside a
character therefore makes the first text of the continuation the text of
the *whole prompt* (original prompt and sent text again) plus the new
tokens', and vLLM checks stop strings over that text too, so a stop string
anywhere in the prompt stops the continuation at once. No request field
moves that priming, and the leaked text cannot be cut off reliably by the
gateway (it is the prompt decoded with the request's `skip_special_tokens`,
which `/detokenize` does not apply: a chat template's special tokens), nor
would cutting it undo the stop strings found in it. So the continuation's
prompt ends where the client's text does, on a character boundary, and the
few ids after it (never shown as text) are generated again: the engine's
state is then exactly an uninterrupted run's at that point, detokenizer and
stop strings included. The client's text stays exact (under greedy decoding
the ids too); a client that was sent those ids (`return_token_ids`) is not
sent them twice, and its stream ends with the error event if the
continuation samples other ones (`replay`, checked by the continuation's
tap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract import wire


@dataclass(slots=True)
class Part:
    """What one replica produced of a stream: its telemetry is per part (a
    continued stream's replicas each report their own)."""

    replica: str
    tokens: int = 0  # completion tokens the client was sent from this replica
    metrics: dict[str, Any] | None = None  # its usage chunk's `metrics` (speculative decoding), if it sent one


class StreamLedger:
    """The stream's identity (`id`, `created`, `model`, which a
    continuation's chunks are rewritten to), the prompt's ids, every id and
    character the client was sent, how it finished, and why it can no
    longer be continued (`blocked`)."""

    __slots__ = ("id", "created", "model", "prompt_ids", "sent_ids", "text_parts", "text_len", "finish_reason",
                 "blocked", "parts", "replay")

    def __init__(self) -> None:
        self.id: str | None = None
        self.created: int | None = None
        self.model: str | None = None
        self.prompt_ids: list[int] | None = None
        self.sent_ids: list[int] = []
        self.text_parts: list[str] = []
        self.text_len = 0
        self.finish_reason: str | None = None
        self.blocked: str | None = None  # why this stream can no longer be continued
        self.parts: list[Part] = []
        # Ids the client was sent past `sent_ids` (taken back by `rewind`): a continuation generates them again.
        self.replay: list[int] = []

    @property
    def sent_text(self) -> str:
        if len(self.text_parts) > 1:
            self.text_parts[:] = ["".join(self.text_parts)]
        return self.text_parts[0] if self.text_parts else ""

    def start_part(self, replica: str) -> Part:
        part = Part(replica)
        self.parts.append(part)
        return part

    def took(self, ids: list[int], text: str) -> None:
        """The client was sent `text`, the text of (a prefix of) `ids`."""
        self.sent_ids.extend(ids)
        if self.parts:
            self.parts[-1].tokens += len(ids)
        if text:
            self.text_parts.append(text)
            self.text_len += len(text)

    def rewind(self, n: int) -> None:
        """Keep the first `n` sent ids, the ones whose text ends on a
        character boundary: the ids after them (the start of a character the
        client has no text of) are for the continuation to generate again.
        They leave `sent_ids` and their parts' counts, and go to the front of
        `replay`, for a client that was sent them not to get them twice."""
        back = self.sent_ids[n:]
        if not back:
            return
        del self.sent_ids[n:]
        self.replay[:0] = back
        left = len(back)
        for part in reversed(self.parts):
            taken = min(part.tokens, left)
            part.tokens -= taken
            left -= taken
            if not left:
                break

    def take_chunk(self, obj: dict[str, Any], choices: Any, chat: bool) -> None:
        """A replica's choice chunk, as the client was sent it: ids, text,
        finish, and what rules a continuation out."""
        c = choices[0] if type(choices) is list else None
        if type(c) is not dict:
            self.blocked = "unexpected chunk shape"
            return
        if self.id is None:
            self.id, self.created, self.model = obj.get("id"), obj.get("created"), obj.get("model")
        if self.prompt_ids is None:
            pids = obj.get("prompt_token_ids") if chat else c.get("prompt_token_ids")
            if isinstance(pids, list):
                self.prompt_ids = pids
        ids = c.get("token_ids")
        if chat:
            delta = c.get("delta") or {}
            text = delta.get("content") or ""
            if delta.get("tool_calls") or delta.get("reasoning") or delta.get("reasoning_content"):
                self.blocked = "tool-call or reasoning output"
        else:
            text = c.get("text") or ""
        if not isinstance(ids, list):
            if text:
                self.blocked = "the replica sent no token ids"
            ids = []
        self.took(ids, text)
        if c.get("finish_reason") is not None:
            self.finish_reason = c["finish_reason"]

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids or ())

    def usage(self) -> dict[str, int]:
        """The whole stream's usage: the original prompt once, every completion token the client got."""
        return wire.usage(self.prompt_tokens, len(self.sent_ids))

    def why_not(self) -> str | None:
        """Why this stream cannot be continued now (None: it can)."""
        if self.blocked:
            return self.blocked
        if self.prompt_ids is None:
            return "the replica sent no prompt token ids"
        return None


def stop_strings(body: dict[str, Any]) -> list[str]:
    """The request's stop strings (`stop`: one string or a list)."""
    stop = body.get("stop")
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list):
        return [s for s in stop if isinstance(s, str) and s]
    return []


def ends_on_character(decoded: str) -> bool:
    """Whether ids decoded whole end on a character boundary: their text
    does not end in U+FFFD, the character a decoder puts for bytes that do
    not (yet) make one. It is the test tokenizers' `DecodeStream` applies,
    so vLLM emits text exactly at such ends, and primes a request's
    detokenizer cleanly only with a prompt that has one (module docstring)."""
    return not decoded.endswith("\ufffd")


def withheld_text(decoded: str, sent_text: str) -> str | None:
    """The text of the sent ids the client has not seen (vLLM held it back
    while checking stop strings), given the ids decoded whole (ending on a
    character boundary: `StreamLedger.rewind`); None when the decoded text
    does not extend what was sent (the splice cannot be exact)."""
    if not decoded.startswith(sent_text):
        return None
    return decoded[len(sent_text):]


class StopAcrossSplice:
    """Finds a stop string that starts before the splice and ends after it.

    `feed(text)` takes the continuation's text and returns (what may be
    sent now, the stop string that ends the stream or None). Like vLLM, it
    holds back the last `max(len(stop)) - 1` characters until they cannot be
    the start of a stop string (unless stop strings are included in the
    output); `flush()` gives them up at the end of the stream."""

    __slots__ = ("stops", "include", "keep", "context", "pending")

    def __init__(self, stops: list[str], include: bool, sent_text: str, withheld: str) -> None:
        self.stops = stops
        self.include = include
        self.keep = max(map(len, stops)) - 1
        self.context = sent_text[len(sent_text) - self.keep:] if self.keep else ""  # already at the client
        self.pending = withheld

    def feed(self, text: str) -> tuple[str, str | None]:
        self.pending += text
        window = self.context + self.pending
        best: tuple[int, str] | None = None
        for s in self.stops:
            i = window.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            i, s = best
            end = (i + len(s) if self.include else i) - len(self.context)
            out, self.pending = self.pending[:max(0, end)], ""
            return out, s
        cut = len(self.pending) if self.include else max(0, len(self.pending) - self.keep)
        out, self.pending = self.pending[:cut], self.pending[cut:]
        if out and self.keep:
            self.context = (self.context + out)[-self.keep:]
        return out, None

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
