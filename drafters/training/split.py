"""Deterministic held-out split of a tenant's samples.

Why a hash of the sample key and not a random draw: the trainer runs again and
again over a store whose content changes (new captures arrive, old ones are
evicted); a sample must land on the same side every time, or a later run would
train on what an earlier evaluation held out. A hash of the key gives that with
no state to keep. Pure, no torch.
"""

from __future__ import annotations

import hashlib
from typing import Sequence, TypeVar

K = TypeVar("K")

DEFAULT_HELD_OUT = 0.2


def key_fraction(key: str) -> float:
    """A stable number in [0, 1) for a sample key."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_keys(keys: Sequence[K], fraction: float = DEFAULT_HELD_OUT, *, key=str) -> tuple[list[K], list[K]]:
    """(train, held_out), both in the input order. A key is held out when its
    hash falls below `fraction`; with two or more samples at least one is held
    out (the lowest hash) and at least one is trained on (the highest), so an
    evaluation always exists and the split still never moves a sample that the
    hash placed."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1), got {fraction!r}")
    scored = [(key_fraction(key(k)), i) for i, k in enumerate(keys)]
    held = {i for f, i in scored if f < fraction}
    if len(keys) >= 2 and fraction > 0:
        if not held:
            held.add(min(scored)[1])
        if len(held) == len(keys):
            held.discard(max(scored)[1])
    return [k for i, k in enumerate(keys) if i not in held], [k for i, k in enumerate(keys) if i in held]
