"""vLLM's OpenAI wire format, built in one place.

Pure builders for what a vLLM 0.32 replica sends: response ids, the
non-streaming chat / completion bodies, the stream chunks (role chunk, content
chunks, the usage chunk), ``usage``, ``metrics.speculative_decoding`` (vLLM's
``--per-request-spec-decode-metrics summary``), SSE framing and ``[DONE]``,
error bodies and ``/v1/models``.  The simulated replica
(``drafters.sim.server``) and the fast fake backend of the gateway tests
(``testbed/fake_openai.py``) both build through this module, so
they cannot drift apart; the gateway reads this format with the framing
constants below (``gateway/stream/sse.py``) and builds the chunks of a
continued stream with these builders (``gateway/stream/continuation.py``).

What is mirrored, from vLLM's ``entrypoints/openai`` (pydantic models dumped
with ``model_dump()`` for bodies, ``model_dump_json(exclude_unset=True)`` for
chunks, ``exclude_none=True`` for the final usage chunk), key order included:

* Streaming: the chat role chunk ``delta: {"role": "assistant", "content": ""}``
  goes out with the first engine output; each engine step is one content chunk;
  ``finish_reason`` rides on the chunk of the *last* output (there is no
  separate empty finish chunk unless the last output carried no text); chat
  finish chunks also carry ``stop_reason``, completion chunks always do.
* ``usage`` is ``{prompt_tokens, total_tokens, completion_tokens}``; non-
  streaming bodies add ``prompt_tokens_details`` / ``completion_tokens_details``
  (null); with ``continuous_usage_stats`` (honoured only together with
  ``include_usage``) every chat chunk carries usage with
  ``completion_tokens_details: null``, every completion chunk the plain three.
* ``metrics.speculative_decoding`` appears in the non-streaming body and, when
  streaming, ONLY in the final usage chunk (``choices: []``), which exists only
  with ``stream_options.include_usage``.  It is absent on non-speculative
  replicas.
* ``return_token_ids``: streaming, the output's ``token_ids`` on every
  choice, the prompt's ``prompt_token_ids`` once (chat: top level of the role
  chunk; completions: on the first chunk's choice); non-streaming, the
  choice's ``token_ids`` and ``prompt_token_ids`` (chat: top level of the
  body). Without it both are left out (vLLM sends ``null``). The gateway's
  stream continuation reads them.
* Errors: ``{"error": {"message", "type", "param", "code"}}`` with an integer
  ``code`` (the HTTP status).

Deliberately left out (vLLM serialises them as ``null`` or omits them by
default; clients treat absent and null alike): ``system_fingerprint``,
``service_tier``, ``prompt_logprobs``, ``prompt_text``, ``kv_transfer_params``,
``ec_transfer_params``, ``routed_experts``, the message's ``refusal`` /
``annotations`` / ``audio`` / ``function_call`` / ``reasoning``, the
per-request timing metrics, the ``detailed``-level ``per_step_*`` arrays, and
a top-level ``"metrics": null`` on bodies without speculative metrics.
``tests/contract/test_wire.py`` checks all of this against vLLM's own pydantic
models (vllm tier).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

import orjson

CHAT_OBJECT = "chat.completion"
CHAT_CHUNK_OBJECT = "chat.completion.chunk"
COMPLETION_OBJECT = "text_completion"  # non-streaming bodies and stream chunks alike
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
# SSE framing: an event is ``data: <payload>`` lines ended by a blank line.
DATA = b"data: "
EVENT_END = b"\n\n"
DONE = DATA + b"[DONE]" + EVENT_END
_MASK_64 = (1 << 64) - 1

Usage = dict[str, Any]


# -------------------------------------------------------------------- ids


def response_id(chat: bool, request_id: str | None = None) -> str:
    """``chatcmpl-…`` / ``cmpl-…``: vLLM uses the ``X-Request-Id`` header when
    the client sent one, else 16 random hex digits."""
    if request_id is None:
        request_id = f"{uuid.uuid4().int & _MASK_64:016x}"
    return ("chatcmpl-" if chat else "cmpl-") + request_id


def created_now() -> int:
    return int(time.time())


# -------------------------------------------------------------------- usage / metrics


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    """The usage object of a stream's final usage chunk (vLLM's field order)."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


def _body_usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return {**usage(prompt_tokens, completion_tokens), "prompt_tokens_details": None,
            "completion_tokens_details": None}


def _chunk_usage(chat: bool, counts: tuple[int, int]) -> Usage:
    u = usage(*counts)
    if chat:
        u["completion_tokens_details"] = None
    return u


def spec_decoding(acceptance_histogram: Sequence[int], num_draft_tokens: int, num_spec_tokens: int) -> dict[str, Any]:
    """``metrics.speculative_decoding`` at vLLM's ``summary`` level.

    ``acceptance_histogram[j]`` = verify steps that accepted exactly ``j`` draft
    tokens (bonus token excluded); padded to ``num_spec_tokens + 1`` entries.
    Step and accepted counts are derived from it, and the two ratios computed at
    full precision, exactly as vLLM's ``RequestSpecDecodeMetrics.to_dict``.
    """
    hist = list(acceptance_histogram)
    if len(hist) < num_spec_tokens + 1:
        hist += [0] * (num_spec_tokens + 1 - len(hist))
    steps = sum(hist)
    accepted = sum(j * c for j, c in enumerate(hist))
    return {
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / num_draft_tokens if num_draft_tokens else 0.0,
        "acceptance_histogram": hist,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": num_draft_tokens,
        "num_spec_tokens": num_spec_tokens,
    }


def metrics(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The response's ``metrics`` object (``None``: leave the key out)."""
    return {"speculative_decoding": spec} if spec is not None else None


def stream_usage_flags(stream_options: Any) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) as vLLM reads ``stream_options``:
    continuous stats only count together with ``include_usage``."""
    if not isinstance(stream_options, dict):
        return False, False
    include = bool(stream_options.get("include_usage"))
    return include, include and bool(stream_options.get("continuous_usage_stats"))


# -------------------------------------------------------------------- non-streaming bodies


def completion_body(*, chat: bool, rid: str, created: int, model: str, text: str, finish_reason: str,
                    prompt_tokens: int, completion_tokens: int, spec: dict[str, Any] | None = None,
                    stop_reason: int | str | None = None, token_ids: Sequence[int] | None = None,
                    prompt_token_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """A whole ``chat.completion`` / ``text_completion`` response (n=1).

    With ``return_token_ids`` vLLM adds the output's ``token_ids`` to the
    choice and the prompt's ``prompt_token_ids`` to the body (chat: top level,
    after ``usage``; completions: on the choice, after ``token_ids``).
    """
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason, "stop_reason": stop_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": stop_reason}
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    if prompt_token_ids is not None and not chat:
        choice["prompt_token_ids"] = list(prompt_token_ids)
    body = {"id": rid, "object": CHAT_OBJECT if chat else COMPLETION_OBJECT, "created": created, "model": model,
            "choices": [choice], "usage": _body_usage(prompt_tokens, completion_tokens)}
    if prompt_token_ids is not None and chat:
        body["prompt_token_ids"] = list(prompt_token_ids)
    m = metrics(spec)
    if m is not None:
        body["metrics"] = m
    return body


# -------------------------------------------------------------------- stream chunks


def _chunk(chat: bool, rid: str, created: int, model: str, choices: list, usage_: Usage | None) -> dict[str, Any]:
    d = {"id": rid, "object": CHAT_CHUNK_OBJECT if chat else COMPLETION_OBJECT, "created": created, "model": model,
         "choices": choices}
    if usage_ is not None:
        d["usage"] = usage_
    return d


def role_chunk(rid: str, created: int, model: str, *, usage_counts: tuple[int, int] | None = None,
               prompt_token_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """Chat only: the first chunk, ``delta: {"role": "assistant", "content": ""}``.

    ``usage_counts`` = (prompt_tokens, completion_tokens) with continuous usage stats.
    ``prompt_token_ids``: with ``return_token_ids``, vLLM puts the prompt's ids
    on this chunk, top level (chat) -- once per stream.
    """
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    d = _chunk(True, rid, created, model, [choice],
               _chunk_usage(True, usage_counts) if usage_counts is not None else None)
    if prompt_token_ids is not None:
        d["prompt_token_ids"] = list(prompt_token_ids)
    return d


def content_chunk(rid: str, created: int, model: str, text: str, *, chat: bool, finish_reason: str | None = None,
                  stop_reason: int | str | None = None,
                  usage_counts: tuple[int, int] | None = None,
                  token_ids: Sequence[int] | None = None,
                  prompt_token_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """One engine output: ``text`` (possibly empty on a finish chunk) and, on the
    last output, ``finish_reason``.  ``usage_counts`` as in :func:`role_chunk`.

    With ``return_token_ids`` vLLM adds the output's ``token_ids`` to the
    choice, and (completions only) the prompt's ``prompt_token_ids`` to the
    choice of the stream's first chunk (chat: on the role chunk instead).
    """
    if chat:
        choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": stop_reason}
        if prompt_token_ids is not None:
            choice["prompt_token_ids"] = list(prompt_token_ids)
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    return _chunk(chat, rid, created, model, [choice],
                  _chunk_usage(chat, usage_counts) if usage_counts is not None else None)


def usage_chunk(rid: str, created: int, model: str, prompt_tokens: int, completion_tokens: int, *, chat: bool,
                spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The final ``choices: []`` chunk sent with ``stream_options.include_usage``;
    the only chunk of a stream that carries ``metrics``."""
    d = _chunk(chat, rid, created, model, [], usage(prompt_tokens, completion_tokens))
    m = metrics(spec)
    if m is not None:
        d["metrics"] = m
    return d


def sse(obj: Any) -> bytes:
    """One SSE event: ``data: <compact JSON>\\n\\n``."""
    return DATA + orjson.dumps(obj) + EVENT_END


# -------------------------------------------------------------------- errors, models


def error_body(message: str, type_: str = "BadRequestError", code: int = 400, param: str | None = None) -> dict[str, Any]:
    """vLLM's ``ErrorResponse``; ``code`` is the HTTP status."""
    return {"error": {"message": message, "type": type_, "param": param, "code": int(code)}}


def http_error_body(status: int, detail: str | None = None) -> dict[str, Any]:
    """What vLLM answers for a framework ``HTTPException`` (unknown route, wrong
    method): the type is the status phrase, e.g. ``"Not Found"``."""
    phrase = HTTPStatus(status).phrase
    return error_body(detail if detail is not None else phrase, phrase, status)


def model_not_found_body(model: Any, served_model: str) -> dict[str, Any]:
    """The 404 body for a ``model`` this replica does not serve."""
    return error_body(f"The model `{model}` does not exist. Valid aliases: {served_model}.", "NotFoundError", 404,
                      "model")


def model_list(model: str, created: int, max_model_len: int | None, root: str | None = None) -> dict[str, Any]:
    """``GET /v1/models`` of a replica serving one model."""
    permission = {"id": "modelperm-" + f"{uuid.uuid4().int & _MASK_64:016x}", "object": "model_permission",
                  "created": created, "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                  "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                  "organization": "*", "group": None, "is_blocking": False}
    return {"object": "list", "data": [{
        "id": model, "object": "model", "created": created, "owned_by": "vllm", "root": root or model,
        "parent": None, "max_model_len": max_model_len, "permission": [permission],
    }]}


__all__ = [
    "CHAT_OBJECT", "CHAT_CHUNK_OBJECT", "COMPLETION_OBJECT", "SSE_CONTENT_TYPE", "DATA", "EVENT_END", "DONE", "response_id",
    "created_now", "usage", "spec_decoding", "metrics", "stream_usage_flags", "completion_body", "role_chunk",
    "content_chunk", "usage_chunk", "sse", "error_body", "http_error_body", "model_not_found_body", "model_list",
]
