"""The sim replica's stand-in tokenizer: deterministic token ids for prompts and outputs.

Why: vLLM can return the token ids of a request (``return_token_ids``), take a
prompt as token ids, and ``/detokenize`` ids; the gateway's stream
continuation relies on all three to re-issue the rest of a broken stream on
another replica, token-exact.  A sim replica has no model and no vocabulary,
so this module defines one that makes that possible and checkable:

* **Output tokens** are positions: the token at output position ``j`` has id
  ``OUTPUT_TOKEN_BASE + j`` and text ``synthetic_text(j, 1)`` (one word;
  position 0 is the ``[specgate-sim]`` marker).  Every replica decodes
  "greedily" the same way, so the output is a function of the position only.
* **Prompt tokens** of a text prompt have ids below ``OUTPUT_TOKEN_BASE``:
  one per 4 characters (the count the sim has always charged,
  ``count_prompt_tokens``), id = CRC-32 of the piece mod ``OUTPUT_TOKEN_BASE``
  (the last piece takes the remainder); a chat prompt adds 4 template tokens
  per message, as its token count always did.  Text -> ids is lossy (like a
  tokenizer without its vocabulary file); ids -> text is a function: a prompt
  id detokenizes to a 4-letter code (base 26), the same on every replica.
* **Continuation**: a token-id prompt whose LAST id is an output id
  (``>= OUTPUT_TOKEN_BASE``) continues the output after that position:
  ``output_start(ids) = 1 + (ids[-1] - OUTPUT_TOKEN_BASE)``, so a request
  re-issued with ``prompt = original prompt ids + ids already sent`` produces
  exactly the rest of the uninterrupted text, ``synthetic_text(j0, n)`` --
  what greedy decoding on a real engine would give.  Any other prompt starts
  at position 0.
* **Vocabulary**: ids in ``[0, OUTPUT_TOKEN_BASE + max_model_len)`` (an output
  position never reaches the context length); others are out of vocabulary,
  which vLLM answers with a 400 (``check_vocab``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

OUTPUT_TOKEN_BASE = 100_000
"""Output position j has token id OUTPUT_TOKEN_BASE + j; prompt ids are below it."""

PROMPT_CHARS_PER_TOKEN = 4
_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do", "eiusmod",
          "tempor", "incididunt", "ut", "labore", "et", "dolore", "magna", "aliqua")
_MARKER = "[specgate-sim]"
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_TEMPLATE = ("<|im_start|>", "{role}", "\n", "<|im_end|>")  # the 4 template tokens of one chat message


def synthetic_text(start: int, n: int) -> str:
    """Tokens [start, start+n) of the synthetic output (one word per token; the first is a marker)."""
    words = []
    for i in range(start, start + n):
        words.append(_MARKER if i == 0 else " " + _WORDS[i % len(_WORDS)])
    return "".join(words)


def output_token_ids(start: int, n: int) -> list[int]:
    """The ids of output positions [start, start+n)."""
    return list(range(OUTPUT_TOKEN_BASE + start, OUTPUT_TOKEN_BASE + start + n))


def count_prompt_tokens(text: str) -> int:
    return max(1, len(text) // PROMPT_CHARS_PER_TOKEN)


def _piece_id(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8", "surrogatepass")) % OUTPUT_TOKEN_BASE


def text_token_ids(text: str) -> list[int]:
    """The prompt ids of ``text``: ``count_prompt_tokens(text)`` of them, all below ``OUTPUT_TOKEN_BASE``."""
    n = count_prompt_tokens(text)
    c = PROMPT_CHARS_PER_TOKEN
    return [_piece_id(text[i * c:(i + 1) * c] if i < n - 1 else text[i * c:]) for i in range(n)]


def chat_token_ids(text: str, roles: Iterable[str]) -> list[int]:
    """A chat prompt's ids: its messages' text (joined) and 4 template tokens per message."""
    ids = text_token_ids(text)
    for role in roles:
        ids += [_piece_id(t.format(role=role)) for t in _TEMPLATE]
    return ids


def output_start(prompt_ids: Sequence[int]) -> int:
    """Output position a token-id prompt continues at: after its last id when that is an output id, else 0."""
    if prompt_ids and prompt_ids[-1] >= OUTPUT_TOKEN_BASE:
        return prompt_ids[-1] - OUTPUT_TOKEN_BASE + 1
    return 0


def _prompt_piece(token_id: int) -> str:
    out = []
    for _ in range(4):
        token_id, r = divmod(token_id, 26)
        out.append(_LETTERS[r])
    return "".join(reversed(out))


def detokenize(ids: Iterable[int]) -> str:
    """The text of ``ids`` (checked with ``check_vocab`` first): output ids -> their word, prompt ids -> a
    4-letter code."""
    return "".join(synthetic_text(i - OUTPUT_TOKEN_BASE, 1) if i >= OUTPUT_TOKEN_BASE else _prompt_piece(i)
                   for i in ids)


def vocab_size(max_model_len: int) -> int:
    return OUTPUT_TOKEN_BASE + max_model_len


def check_vocab(ids: Sequence[int], max_model_len: int) -> str | None:
    """vLLM's message for the first out-of-vocabulary id (None: all valid)."""
    if not ids:
        return None
    lo, hi = min(ids), max(ids)
    if lo < 0:
        return f"Token id {lo} is out of vocabulary"
    if hi >= vocab_size(max_model_len):
        return f"Token id {hi} is out of vocabulary"
    return None


__all__ = ["OUTPUT_TOKEN_BASE", "synthetic_text", "output_token_ids", "count_prompt_tokens", "text_token_ids",
           "chat_token_ids", "output_start", "detokenize", "vocab_size", "check_vocab"]
