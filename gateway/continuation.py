"""Stream continuation, the pure half: which streams can be continued
exactly, what the client has been sent, the request that continues it on
another replica, and the client-shaped chunks made of that replica's output.

Why token ids and not text: the gateway asks every replica for
`return_token_ids` (stripped before the client sees them unless it asked),
so when a stream breaks it knows the prompt's token ids (from the first
chunk) and the ids of every token it forwarded. The continuation is then a
`/v1/completions` request whose prompt is exactly those ids -- vLLM's
token-id prompt input, so nothing is re-tokenized and nothing can drift at
the splice. With greedy decoding the client's text equals an uninterrupted
run; with sampling it is a valid sample conditioned on what was sent.

Why some requests are refused (`unsupported`): the continuation restarts the
engine's per-request state from a prompt. State that lives in the *output*
cannot be rebuilt from a prompt: a structured-output grammar's position,
frequency/presence penalties (vLLM counts them over output tokens only),
a thinking-token budget, repetition detection; tool-call and reasoning
parsers of the chat endpoint, which the completions endpoint does not run;
and shapes with more than one output (`n`, `best_of`, beam search) or with
per-token extras a splice would have to re-derive (`logprobs`, `echo`).
Those streams end with the SSE error event as before a continuation existed.

Why the gateway checks stop strings at the splice (`StopAcrossSplice`): vLLM
checks stop strings in a request's own output only, and while it does, it
holds back the last `max(len(stop)) - 1` characters of text (the token ids
are not held back). So at a break the client may lack a few characters of
tokens it has the ids of (`withheld`, recovered with `/detokenize`), and a
stop string may start before the splice and end after it; the gateway finds
it where vLLM would have, and ends the stream there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from contract import wire

if TYPE_CHECKING:
    from contract.policy import SpeculationPolicy

# Request fields the continuation carries over unchanged: every sampling
# parameter vLLM's completions endpoint shares with chat (SamplingParams).
_CARRIED = (
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "repetition_penalty",
    "length_penalty", "logit_bias", "allowed_token_ids", "bad_words", "skip_special_tokens",
    "spaces_between_special_tokens", "include_stop_str_in_output", "user", "priority", "cache_salt", "watermarking",
    "stream_interval",
)
# vLLM's CompletionRequest.max_tokens default (chat's is "what fits", None).
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class ContinuationRequest:
    """What a continuation needs of the original request: its body as the
    client sent it, its shape, and what the client asked to see."""

    body: dict[str, Any]
    chat: bool
    client_ids: bool  # the client asked for return_token_ids itself: they stay in its chunks
    strip_usage: bool  # the client did not ask for the usage chunk
    continuous: bool  # stream_options.continuous_usage_stats: usage on every chunk
    client_xargs: dict[str, Any] | None
    policy: SpeculationPolicy | None


_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
# Every body field the rules below read, except `prompt`: a request with none
# of them (most are) is decided with one set operation instead of ~25 reads.
_RULE_FIELDS = frozenset({
    "n", "best_of", "use_beam_search", "logprobs", "top_logprobs", "prompt_logprobs", "echo", "response_format",
    "structured_outputs", *_GUIDED, "tools", "tool_choice", "functions", "frequency_penalty", "presence_penalty",
    "thinking_token_budget", "repetition_detection", "suffix", "prompt_embeds", "include_reasoning",
})


def unsupported(body: dict[str, Any], endpoint: str) -> str | None:
    """Why a streamed request cannot be continued exactly (None: it can).

    Decided from the request alone, before it is sent; the replica's answer
    can still rule a stream out later (`StreamLedger.blocked`)."""
    if _RULE_FIELDS.isdisjoint(body) and (endpoint == "chat" or isinstance(body.get("prompt"), str)):
        return None
    return _ruled_out(body, endpoint)


def _ruled_out(body: dict[str, Any], endpoint: str) -> str | None:
    if _truthy(body.get("n"), 1) or _truthy(body.get("best_of"), 1) or body.get("use_beam_search"):
        return "more than one output (n, best_of, beam search)"
    logprobs = body.get("logprobs")
    if (logprobs is not None and logprobs is not False) or body.get("top_logprobs") is not None:
        return "logprobs"
    if body.get("prompt_logprobs") is not None or body.get("echo"):
        return "prompt logprobs or echo"
    if _structured(body):
        return "structured output"
    if body.get("tools") and body.get("tool_choice") != "none" or body.get("functions"):
        return "tool calls"
    if _truthy(body.get("frequency_penalty"), 0) or _truthy(body.get("presence_penalty"), 0):
        return "frequency/presence penalty (counted over output tokens only)"
    if body.get("thinking_token_budget") is not None or body.get("repetition_detection") is not None:
        return "output-dependent limits (thinking budget, repetition detection)"
    if endpoint == "completions":
        p = body.get("prompt")
        if isinstance(p, list) and p and not isinstance(p[0], int) and len(p) > 1:
            return "several prompts in one request"
        if body.get("suffix") or body.get("prompt_embeds") is not None:
            return "suffix or prompt embeddings"
    elif endpoint == "chat" and body.get("include_reasoning") is False:
        return "hidden reasoning (vLLM then withholds token ids)"
    return None


def _truthy(value: Any, neutral: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value != neutral


def _structured(body: dict[str, Any]) -> bool:
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") not in (None, "text"):
        return True
    if body.get("structured_outputs") is not None:
        return True
    return any(body.get(k) is not None for k in _GUIDED)


class StreamLedger:
    """What the client of one stream (one choice) has been sent, in tokens
    and text, and the stream's identity (`id`, `created`, `model`), which a
    continuation's chunks are rewritten to."""

    __slots__ = ("id", "created", "model", "prompt_ids", "sent_ids", "text_parts", "text_len", "finish_reason",
                 "blocked", "parts")

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
        # Per replica that produced part of the stream: [name, tokens, metrics | None].
        self.parts: list[list[Any]] = []

    @property
    def sent_text(self) -> str:
        if len(self.text_parts) > 1:
            self.text_parts[:] = ["".join(self.text_parts)]
        return self.text_parts[0] if self.text_parts else ""

    def start_part(self, replica: str) -> None:
        self.parts.append([replica, 0, None])

    def took(self, ids: list[int], text: str) -> None:
        """The client was sent `text`, the text of (a prefix of) `ids`."""
        self.sent_ids.extend(ids)
        if self.parts:
            self.parts[-1][1] += len(ids)
        if text:
            self.text_parts.append(text)
            self.text_len += len(text)

    def identify(self, obj: dict[str, Any]) -> None:
        if self.id is None:
            self.id, self.created, self.model = obj.get("id"), obj.get("created"), obj.get("model")

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


def max_tokens_left(body: dict[str, Any], endpoint: str, sent: int) -> int | None:
    """The client's completion-token limit minus what was sent (None: none was
    set; the replica fills what fits in its context, as for the original)."""
    if endpoint == "chat":
        limit = body.get("max_completion_tokens")
        if limit is None:
            limit = body.get("max_tokens")
    else:
        limit = body.get("max_tokens", _COMPLETIONS_DEFAULT_MAX_TOKENS)
    if not isinstance(limit, int) or isinstance(limit, bool):
        return None
    return limit - sent


def continuation_body(body: dict[str, Any], endpoint: str, ledger: StreamLedger, xargs: dict[str, Any] | None) -> dict[str, Any]:
    """The `/v1/completions` request that continues the stream: the prompt is
    the original prompt's ids plus every id sent, `max_tokens`/`min_tokens`
    less what was sent, every sampling parameter kept, the tenant's
    speculation knobs (`xargs`, merged for the new replica) included."""
    sent = len(ledger.sent_ids)
    out: dict[str, Any] = {"model": body.get("model"), "prompt": [*(ledger.prompt_ids or ()), *ledger.sent_ids]}
    for key in _CARRIED:
        if key in body:
            out[key] = body[key]
    left = max_tokens_left(body, endpoint, sent)
    if left is not None:
        out["max_tokens"] = left
    elif endpoint == "chat":
        out["max_tokens"] = None
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, int) and min_tokens > 0:
        out["min_tokens"] = max(0, min_tokens - sent)
    if xargs:
        out["vllm_xargs"] = xargs
    out.update(stream=True, stream_options={"include_usage": True}, return_token_ids=True)
    return out


def stop_strings(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list):
        return [s for s in stop if isinstance(s, str) and s]
    return []


def withheld_text(decoded: str, sent_text: str) -> str | None:
    """The text of the sent ids the client has not seen (vLLM held it back
    while checking stop strings), given the ids decoded whole; None when the
    decoded text does not extend what was sent (the splice cannot be exact).
    A trailing incomplete character is left to the continuation, which emits
    it whole once its remaining bytes arrive."""
    if not decoded.startswith(sent_text):
        return None
    return decoded[len(sent_text):].rstrip("\ufffd")


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


def client_chunk(ledger: StreamLedger, chat: bool, text: str, token_ids: list[int] | None, finish_reason: str | None,
                 stop_reason: Any, usage: dict[str, int] | None) -> bytes:
    """One SSE event in the client's shape (chat or completions), with the
    original stream's id, created and model: a continuation's output as the
    client would have had it from the first replica. `token_ids` only when
    the client asked for them (None: leave them out)."""
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None,
                                  "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": stop_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    obj = {"id": ledger.id, "object": wire.CHAT_CHUNK_OBJECT if chat else wire.COMPLETION_OBJECT,
           "created": ledger.created, "model": ledger.model, "choices": [choice]}
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def usage_event(ledger: StreamLedger, chat: bool) -> bytes:
    """The stream's final usage chunk (`choices: []`), for a client that asked
    for `stream_options.include_usage`: the original prompt and every
    completion token sent. No `metrics`: the speculation summary of a stream
    produced by several replicas is theirs, in the gateway's telemetry."""
    obj = {"id": ledger.id, "object": wire.CHAT_CHUNK_OBJECT if chat else wire.COMPLETION_OBJECT,
           "created": ledger.created, "model": ledger.model, "choices": [], "usage": ledger.usage()}
    return b"data: " + orjson.dumps(obj) + b"\n\n"
