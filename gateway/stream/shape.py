"""The request-shape rule that capture and continuation share: one prompt,
one output.

Why both need it: a capture sample is one prompt and one completion, and a
continuation re-prefills one prompt's ids plus one output's ids. A request
with several outputs (`n`, `best_of`, beam search), several prompts, or a
prompt given as embeddings (no prompt ids to re-feed) fits neither. Each
caller adds its own rules after this one (`gateway.capture.shape_refusal`,
`gateway.stream.continuation.unsupported`).
"""

from __future__ import annotations

from typing import Any

MORE_THAN_ONE_OUTPUT = "more than one output (n, best_of, beam search)"
SEVERAL_PROMPTS = "several prompts in one request"
PROMPT_EMBEDDINGS = "prompt embeddings"


def one_prompt_one_output(body: dict[str, Any], endpoint: str) -> str | None:
    """Why the request is not one prompt and one output (None: it is)."""
    if _not_one(body.get("n")) or _not_one(body.get("best_of")) or body.get("use_beam_search"):
        return MORE_THAN_ONE_OUTPUT
    if endpoint == "completions":
        p = body.get("prompt")
        if isinstance(p, list) and len(p) > 1 and not isinstance(p[0], int):
            return SEVERAL_PROMPTS
        if body.get("prompt_embeds") is not None:
            return PROMPT_EMBEDDINGS
    return None


def _not_one(value: Any) -> bool:
    """A count other than one (None, absent, or a non-number: the default, one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value != 1
