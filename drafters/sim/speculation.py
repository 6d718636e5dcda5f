"""One engine step's speculation, drawn for the whole batch at once (vectorised).

Why a module of its own: this is the drafting arithmetic of the simulated
engine -- confidence-head draws, the per-request ``specgate_min_confidence``
cut, adaptive verification's global top-B slot choice, and the Bernoulli
acceptance chain -- and it is independent of how the scheduler picks the batch
(``engine.py``).  Keeping it apart lets the scheduler read as a scheduler and
this arithmetic be read (and checked against ``drafters.acceptance`` /
``drafters.costmodel``) on its own.

Per decoding request with a cap k_r > 0: cumulative confidences are drawn
(only ``-av`` profiles honour a confidence floor, as ``drafters.vllm_ext``
does on real vLLM), the draft is cut at the first position below the floor
(or at k_r), adaptive verification keeps only the slots above the batch-wide
threshold, and the accepted prefix is the first rejection of the verified
drafts.  Emitted tokens = accepted + 1 (the bonus token), applied by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import acceptance as acc
from .. import costmodel as cm
from contract.profiles import Profile
from .engine_types import EngineRequest


@dataclass
class SpecDraws:
    """Speculation outcome of one step for the decoding requests that drafted.

    Arrays are aligned with ``idx`` (indices into the step's decode list)."""

    idx: list[int]
    drafted: np.ndarray  # drafted tokens per request (cap / confidence-floor cut)
    verified: np.ndarray  # drafted tokens sent to verification
    accepted: np.ndarray  # accepted prefix length (<= verified)
    kmax: int  # the longest cap among them (width of the draw)


def draw_speculation(decode: list[EngineRequest], prefill: list[tuple[EngineRequest, int]], caps: np.ndarray, *,
                     profile: Profile, gpu: cm.GpuSpec, model: cm.ModelSpec, rng: np.random.Generator, n_sched: int,
                     batch_ctx: float, draft_time_s: float, av_context: float | None = None,
                     av_draft_time_s: float | None = None) -> SpecDraws | None:
    """Draw drafts, verification and acceptance for the decoding requests whose cap ``caps[i]`` is > 0.

    ``caps`` is per decoding request, already cut to the step's K; ``batch_ctx`` the
    step's mean context; ``draft_time_s`` what the step's drafter pass costs (adaptive
    verification budgets with it). ``av_context`` / ``av_draft_time_s``: the context and
    drafter cost adaptive verification *believes* (its start-up tables; default: the
    truth).  Returns ``None`` when no request drafts (nothing is drawn)."""
    spec_idx = np.nonzero(caps > 0)[0].tolist()
    if not spec_idx:
        return None
    sreqs = [decode[i] for i in spec_idx]
    kcap = caps[spec_idx]
    kmax = int(kcap.max())
    logits = np.stack([r.logit_accept[:kmax] for r in sreqs])
    accept_p = np.stack([r.accept[:kmax] for r in sreqs])
    sig_c = np.array([r.preset.sigma_conf for r in sreqs])[:, None]
    pos = np.arange(kmax)[None, :]
    in_cap = pos < kcap[:, None]
    conf = np.cumprod(1.0 / (1.0 + np.exp(-(logits + rng.normal(0.0, 1.0, logits.shape) * sig_c))), axis=1)
    # The confidence head only runs under adaptive verification (vLLM V2 DSpark), so only
    # -av replicas can honour a per-request confidence floor (as drafters/vllm_ext does).
    theta = np.array([(r.min_confidence or 0.0) if profile.adaptive else 0.0 for r in sreqs])[:, None]
    ok = (conf >= theta) & in_cap
    # drafted = first position that fails the threshold (or the cap)
    drafted = np.where(ok.all(axis=1), kmax, np.argmin(ok, axis=1))
    drafted = np.minimum(drafted, kcap)
    if profile.adaptive:
        slot_mask = pos < drafted[:, None]
        scores = conf[slot_mask]
        nondraft = len(decode) + sum(c for _, c in prefill)
        ctx = batch_ctx if av_context is None else av_context
        _, thr = acc.adaptive_verification_budget(
            scores, n_sched, nondraft, draft_time_s if av_draft_time_s is None else av_draft_time_s,
            lambda n: cm.step_time_array_s(gpu, model, n, n_sched, ctx))
        verified = np.where(slot_mask & (conf >= thr), 1, 0).sum(axis=1)
    else:
        verified = drafted
    fails = (rng.random(conf.shape) >= accept_p) | (pos >= verified[:, None])
    accepted = np.where(fails.any(axis=1), np.argmax(fails, axis=1), kmax)
    accepted = np.minimum(accepted, verified)
    return SpecDraws(spec_idx, drafted, verified, accepted, kmax)


__all__ = ["SpecDraws", "draw_speculation"]
