"""Turning an OpenAI-style request body into what the sim engine needs -- or into vLLM's error.

Why a module of its own: the HTTP handlers (``server.py``) should only route
and stream; the rules for what a valid ``/v1/chat/completions`` or
``/v1/completions`` body is (JSON object, served model name, ``n``,
``stream_options``, ``vllm_xargs``, messages / prompt shapes, token limits,
context length), how many prompt tokens it counts for, and which acceptance
workload it follows are plain functions of the body and the replica's
settings, testable without a server.  A body's prompt becomes a ``Prompt``:
its text (for the workload marker), its token ids (``tokens.py``'s stand-in
tokenizer; a completions prompt may be given as token ids, vLLM's
``list[int]`` or ``[[ids]]``), the output position it continues at, and its
``max_tokens``.  Every rejection is an ``ApiError``, rendered as vLLM's
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi.responses import JSONResponse

from .. import acceptance as acc
from contract import wire
from .tokens import chat_token_ids, check_vocab, count_prompt_tokens, output_start, text_token_ids

logger = logging.getLogger("specgate.sim")

_WORKLOAD_RE = re.compile(r"\[workload=([A-Za-z0-9_\-]+)\]")


class ApiError(Exception):
    """A request the replica refuses: HTTP ``status`` and vLLM's error ``type`` / ``param``."""

    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param


def error_response(status: int, message: str, type_: str = "BadRequestError", param: str | None = None) -> JSONResponse:
    return JSONResponse(wire.error_body(message, type_, status, param), status)


def messages_text(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ApiError(400, f"messages[{i}] must be an object with a 'role'", param="messages")
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for j, p in enumerate(content):
                text = p.get("text", "") if isinstance(p, dict) else None
                if not isinstance(text, str):
                    raise ApiError(400, f"messages[{i}].content[{j}].text must be a string", param="messages")
                parts.append(text)
        elif content is not None:
            raise ApiError(400, f"messages[{i}].content must be a string or a list of parts", param="messages")
    return "\n".join(parts)


def int_field(body: dict, name: str, minimum: int = 1) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ApiError(400, f"'{name}' must be an integer >= {minimum}", param=name)
    return v


def parse_body(raw: bytes, model_name: str) -> dict:
    """The request body as a JSON object, after the checks common to both endpoints (model, ``n``,
    ``stream_options``, ``vllm_xargs``)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        err = wire.model_not_found_body(model, model_name)["error"]
        raise ApiError(404, err["message"], err["type"], err["param"])
    if body.get("n", 1) != 1:
        raise ApiError(400, "only n=1 is supported by the sim replica", param="n")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    if so is not None and not body.get("stream"):
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    xargs = body.get("vllm_xargs")
    if xargs is not None and not isinstance(xargs, dict):
        raise ApiError(400, "'vllm_xargs' must be an object", param="vllm_xargs")
    return body


@dataclass
class Prompt:
    """What the engine needs of a request's prompt.

    ``ids``: the token ids as given (a token-id completions prompt), else
    ``None`` and derived from the text on demand (``token_ids``: only streams
    and bodies with ``return_token_ids`` need them).  ``tokens`` = their count.
    ``start``: the output position the request continues at (``tokens.output_start``).
    """

    text: str
    tokens: int
    max_tokens: int | None
    ids: list[int] | None = None
    roles: list[str] | None = None  # chat: the messages' roles (4 template tokens each)
    start: int = 0
    _derived: list[int] | None = field(default=None, repr=False)

    def token_ids(self) -> list[int]:
        if self.ids is not None:
            return self.ids
        if self._derived is None:
            self._derived = (chat_token_ids(self.text, self.roles) if self.roles is not None
                             else text_token_ids(self.text))
        return self._derived


def chat_prompt(body: dict) -> Prompt:
    """The prompt of a chat completions body."""
    text = messages_text(body.get("messages"))
    max_tokens = int_field(body, "max_completion_tokens") or int_field(body, "max_tokens")
    roles = [str(m["role"]) for m in body["messages"]]
    return Prompt(text, count_prompt_tokens(text) + 4 * len(roles), max_tokens, roles=roles)


def _token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def completion_prompt(body: dict, max_model_len: int) -> Prompt:
    """The prompt of a completions body: a string or token ids (``[ids]`` or ``[[ids]]``; one prompt only).

    Token ids must be in the sim's vocabulary (``tokens.check_vocab``), else 400
    as on vLLM; their count is the prompt's token count, and a tail of output
    ids continues the output after them (``tokens.output_start``).
    """
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    max_tokens = int_field(body, "max_tokens")
    if isinstance(prompt, str) and prompt:
        return Prompt(prompt, count_prompt_tokens(prompt), max_tokens)
    if _token_list(prompt):
        bad = check_vocab(prompt, max_model_len)
        if bad:
            raise ApiError(400, bad, param="prompt")
        return Prompt("", len(prompt), max_tokens, ids=list(prompt), start=output_start(prompt))
    raise ApiError(400, "'prompt' must be a non-empty string or a list of token ids (one prompt)", param="prompt")


def detokenize_tokens(body: dict, max_model_len: int) -> list[int]:
    """The ``tokens`` of a ``POST /detokenize`` body (vLLM's ``DetokenizeRequest``), checked against the vocabulary."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ApiError(400, "'tokens' must be a list of token ids", param="tokens")
    bad = check_vocab(tokens, max_model_len)
    if bad:
        raise ApiError(400, bad, param="tokens")
    return tokens


def return_token_ids(body: dict) -> bool:
    """vLLM's ``return_token_ids`` (``bool | None``)."""
    v = body.get("return_token_ids")
    if v is not None and not isinstance(v, bool):
        raise ApiError(400, "'return_token_ids' must be a boolean", param="return_token_ids")
    return bool(v)


def fit_context(prompt_tokens: int, max_tokens: int | None, max_model_len: int, chat: bool) -> int | None:
    """``max_tokens`` cut to the room the prompt leaves; the prompt itself must fit."""
    if prompt_tokens >= max_model_len:
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens; "
                            f"the prompt has {prompt_tokens}.", param="messages" if chat else "prompt")
    if max_tokens is not None:
        max_tokens = min(max_tokens, max_model_len - prompt_tokens)
    return max_tokens


def resolve_workload(xargs: dict | None, header: str | None, text: str, drafter_family: str, default: str) -> str:
    """The acceptance preset a request follows: ``vllm_xargs.specgate_workload`` / ``sim_workload``, then
    header ``x-sim-workload``, then a ``[workload=NAME]`` marker in the prompt; unknown names are logged
    and skipped; ``default`` when none is known."""
    cands = []
    if isinstance(xargs, dict):
        cands += [xargs.get("specgate_workload"), xargs.get("sim_workload")]
    cands.append(header)
    m = _WORKLOAD_RE.search(text or "")
    if m:
        cands.append(m.group(1))
    for c in cands:
        if isinstance(c, str) and c:
            try:
                acc.get_preset(c, drafter_family)
                return c.lower()
            except KeyError:
                logger.warning("unknown workload %r; using %r", c, default)
    return default


__all__ = ["ApiError", "error_response", "parse_body", "Prompt", "chat_prompt", "completion_prompt", "fit_context",
           "resolve_workload", "count_prompt_tokens", "messages_text", "int_field", "detokenize_tokens",
           "return_token_ids"]
