"""Stream continuation, the pure half: which streams can be continued
exactly, the request that continues one on another replica, and that
replica's output turned into the client's chunks (`ContinuationTap`).

A continuation is a `/v1/completions` request whose prompt is the original
prompt's token ids plus every id the client was sent (the ledger,
`gateway.stream.ledger`) -- vLLM's token-id prompt input, so nothing is
re-tokenized and nothing can drift at the splice -- up to the last character
boundary: ids of a character the client has no text of yet are generated
again (`StreamLedger.rewind`, which says why: vLLM would otherwise emit the
whole prompt's text first), and `ContinuationTap` keeps a client that was
sent them from getting them twice. With greedy decoding the client's text
equals an uninterrupted run; with sampling it is a valid sample conditioned
on what was sent.

Why some requests are refused (`unsupported`): the continuation restarts the
engine's per-request state from a prompt. State that lives in the *output*
cannot be rebuilt from a prompt: a structured-output grammar's position,
frequency/presence penalties (vLLM counts them over output tokens only),
a thinking-token budget, repetition detection; tool-call and reasoning
parsers of the chat endpoint, which the completions endpoint does not run;
and shapes with more than one output or prompt (`gateway.stream.shape`,
the rule capture shares) or with per-token extras a splice would have to
re-derive (`logprobs`, `echo`). Those streams end with the SSE error event
as before a continuation existed.

The client's chunks are built by `contract.wire`'s builders (the ones the
simulated replicas use), with the original stream's id, created and model:
a continued stream reads as the first replica's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contract import wire

from .ledger import StopAcrossSplice, StreamLedger
from .shape import one_prompt_one_output
from .sse import DONE_DATA, EventBuffer, is_error, is_usage, payload

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
    shape = one_prompt_one_output(body, endpoint)
    if shape is not None:
        return shape
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
        if body.get("suffix"):
            return "suffix"
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
    the original prompt's ids plus every id sent (up to the last character
    boundary: the caller rewinds the ledger there first, `StreamLedger.rewind`),
    `max_tokens`/`min_tokens` less what was sent, every sampling parameter
    kept, the tenant's speculation knobs (`xargs`, merged for the new
    replica) included."""
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




class ContinuationTap:
    """A continuation's `/v1/completions` events as the client's events."""

    __slots__ = ("ledger", "chat", "client_ids", "continuous", "stop", "_buf", "usage", "metrics", "saw_done", "error",
                 "done", "cut", "events")

    def __init__(self, ledger: StreamLedger, chat: bool, client_ids: bool, continuous: bool,
                 stop: StopAcrossSplice | None) -> None:
        self.ledger, self.chat, self.client_ids, self.continuous, self.stop = ledger, chat, client_ids, continuous, stop
        self._buf = EventBuffer()
        self.usage: dict[str, Any] | None = None
        self.metrics: dict[str, Any] | None = None
        self.saw_done = False
        self.error: dict[str, Any] | None = None
        self.done = False  # the client's stream got its finish_reason
        self.cut = False  # ... from the gateway, at a stop string across the splice: the replica goes on
        self.events = 0

    def feed(self, data: bytes) -> bytes:
        out = []
        for event in self._buf.events(data):
            self.events += 1
            obj = payload(event)
            if obj == DONE_DATA:
                self.saw_done = True
            elif is_error(obj):
                if not self.done:
                    self.error = obj
                    break
            elif isinstance(obj, dict) and is_usage(obj):
                self.usage = obj["usage"]
                self.metrics = obj.get("metrics") if isinstance(obj.get("metrics"), dict) else None
            elif isinstance(obj, dict) and obj.get("choices") and not self.done:
                chunk = self._take(obj["choices"][0])
                if chunk:
                    out.append(chunk)
                elif self.error is not None:
                    break
        return b"".join(out)

    def _take(self, c: Any) -> bytes:
        if not isinstance(c, dict):
            return b""
        ids = c.get("token_ids") if isinstance(c.get("token_ids"), list) else []
        shown = self._replayed(ids)
        if shown is None:
            return b""
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
        if not text and finish is None and not (self.client_ids and shown):
            return b""
        return client_chunk(ledger, self.chat, text, shown if self.client_ids else None, finish, stop_reason,
                            self.continuous)

    def _replayed(self, ids: list[int]) -> list[int] | None:
        """The ids of a chunk the client has not been sent: the first ones
        may be the ledger's `replay` (ids of a partial character, generated
        again). A client that got those ids must get the same ones: if the
        continuation sampled others, the stream cannot go on exactly
        (`error` set, the ledger blocked; None)."""
        replay = self.ledger.replay
        if not replay or not ids:
            return ids
        n = min(len(ids), len(replay))
        if self.client_ids and ids[:n] != replay[:n]:
            self.ledger.blocked = "the continuation sampled other ids than the client got for a partial character"
            self.error = {"error": {"message": self.ledger.blocked}}
            return None
        del replay[:n]
        return ids[n:]


def client_chunk(ledger: StreamLedger, chat: bool, text: str, token_ids: list[int] | None, finish_reason: str | None,
                 stop_reason: Any, continuous: bool) -> bytes:
    """One SSE event in the client's shape (chat or completions), with the
    original stream's id, created and model: a continuation's output as the
    client would have had it from the first replica. `token_ids` only when
    the client asked for them (None: leave them out); the stream's usage so
    far with `continuous_usage_stats`."""
    counts = (ledger.prompt_tokens, len(ledger.sent_ids)) if continuous else None
    return wire.sse(wire.content_chunk(ledger.id, ledger.created, ledger.model, text, chat=chat,
                                       finish_reason=finish_reason, stop_reason=stop_reason, usage_counts=counts,
                                       token_ids=token_ids))


def usage_event(ledger: StreamLedger, chat: bool) -> bytes:
    """The stream's final usage chunk (`choices: []`), for a client that asked
    for `stream_options.include_usage`: the original prompt and every
    completion token sent. No `metrics`: the speculation summary of a stream
    produced by several replicas is theirs, in the gateway's telemetry."""
    return wire.sse(wire.usage_chunk(ledger.id, ledger.created, ledger.model, ledger.prompt_tokens,
                                     len(ledger.sent_ids), chat=chat))
