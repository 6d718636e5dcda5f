"""One engine step's ngram (prompt-lookup) speculation, drawn for the whole batch at once (vectorised).

Why a module of its own: it is the ngram counterpart of ``speculation.py``
(the block drafter's confidence draws and Bernoulli chain) and shares its
output record, so the engine applies either draw the same way -- counters,
per-request metrics, emitted tokens. What differs is the arithmetic, which
follows ``ngram_acceptance``: a request proposes only when its lookup finds a
match, its proposal is a copy of up to K tokens that the target accepts whole
or leaves early, and its cap truncates the copy. There are no confidences
(ngram has no ``-av``), and no drafter pass on the GPU: the proposer's CPU
time is the engine's host term (``drafters.costmodel.ngram_propose_time_s``).
"""

from __future__ import annotations

import numpy as np

from .engine_types import EngineRequest
from .ngram_acceptance import sample_proposals
from .speculation import SpecDraws


def draw_ngram_speculation(decode: list[EngineRequest], caps: np.ndarray, *, k_propose: int,
                           rng: np.random.Generator) -> SpecDraws | None:
    """Draw proposals and acceptance for the decoding requests whose cap ``caps[i]`` is > 0.

    ``k_propose``: the K vLLM hands the proposer this step (the profile's
    ``num_speculative_tokens``, cut by its batch-size table); ``caps`` are the
    requests' own caps, already within it. A request whose lookup finds no
    match drafts 0 tokens (not a speculation step for it, as in vLLM's
    counters). Returns ``None`` when no request may draft."""
    spec_idx = np.nonzero(caps > 0)[0].tolist()
    if not spec_idx or k_propose <= 0:
        return None
    kcap = np.minimum(caps[spec_idx], k_propose)
    _, length, agreement = sample_proposals([decode[i].preset for i in spec_idx], k_propose, rng)
    drafted = np.minimum(length, kcap)  # the plugin truncates the copy to the request's cap
    accepted = np.minimum(agreement, drafted)
    return SpecDraws(spec_idx, drafted, drafted.copy(), accepted, int(kcap.max()))


__all__ = ["draw_ngram_speculation"]
