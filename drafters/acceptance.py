"""Acceptance model of a DSpark (or DFlash) drafter: how many drafted tokens the target keeps.

Why: whether speculation pays is tokens-per-step over step-time; the cost
model gives the denominator, this module the numerator, per workload and per
request, including the two per-request knobs specgate adds (draft cap,
confidence threshold) and vLLM's adaptive verification.  Pure functions.

Model
-----
* Per request a quality shift ``z ~ N(0, sigma_request)`` (in logits).
  Conditional acceptance at draft position i (1-based, given positions < i
  were accepted) decays along the block::

      a_i(z) = sigmoid(logit(a1) - decay * (i - 1) + z)

  Survival S_i = prod_{j<=i} a_j; expected tokens per step with k drafts
  (bonus token included) tau(k) = 1 + sum_{i<=k} S_i.  Expectations over z use
  Gauss-Hermite quadrature (deterministic, 21 nodes) and are *step-weighted*
  (a request with low tau stays in the batch for more steps), i.e. the
  acceptance length vLLM's counters report: 1 / E_z[1 / tau(z)].
* Confidence head: per position ``c_hat_i = sigmoid(logit(a_i) + eps)``,
  ``eps ~ N(0, sigma_conf)`` each step (calibration noise); cumulative
  confidence C_i = prod_{j<=i} c_hat_j.
* ``specgate_min_confidence`` theta: the draft is cut at the first position
  whose cumulative confidence falls below theta (positions after it are not
  drafted).  ``specgate_max_draft`` k: at most k positions (0 = no drafting).
  In expectations the head is taken as calibrated (eps = 0).
* Adaptive verification (vLLM ``v1/worker/gpu/spec_decode/adaptive_verification.py``):
  each step, rank all (request, position) slots by cumulative confidence,
  admit the global top-B where B maximises
  (n_reqs + sum of the top-B survivals) / (draft_cost + verify_cost(nondraft + B)).
  The drafter still runs for every slot; only verification is trimmed.

Calibration. Two published facts fix each drafter family (seed document
`000_3dd21897158697f9.txt`, which quotes the DSpark paper arXiv 2607.05147):

* **Acceptance length per workload** (Table 1; Qwen3-14B, temperature 1,
  block 16 => k = 16 drafts), DSpark / DFlash: GSM8K 6.21 / 5.41, MATH500
  5.74 / 4.84, MBPP 5.26 / 4.44, HumanEval 5.43 / 4.59, MT-Bench 3.70 / 3.10.
* **Shape per position** (the paper's per-position acceptance on math, a
  measurement over all drafts, like vLLM's per-position counter): DFlash
  decays from ~0.88 at the first position to ~0.78 at the block's end;
  DSpark starts at ~0.93 and stays flat -- the Markov head's whole point.

The measured per-position rate (``measured_conditional_acceptance``: E[S_i] /
E[S_{i-1}] over the step-weighted population) is flat for DSpark and falls
by the seed's ratio 0.78 / 0.88 for DFlash. Because the requests that reach
a late position are the better ones (survivor selection), a flat *measured*
rate needs a slight decay in each request's own curve: ``decay`` is fitted on
GSM8K so that the measured rate at position 16 equals position 1 (DSpark,
0.046 logit per position) or is 0.886 of it (DFlash, 0.098); ``a1`` is then
bisected per workload to its AL (``fit_a1``). The seed's *levels* cannot be
kept with the Table's ALs: a measured 0.93 at every one of 16 positions
means AL = 1 + sum 0.93^i = 10.1, not 6.21, whatever the spread across
requests (the per-position figure evidently comes from another setting), so
the Table sets the level (DSpark GSM8K measured ~0.85 flat, DFlash 0.84 ->
0.74) and the seed the shape. Held out: the Qwen3-8B DSpark card's measured
per-position survival (``drafters.calibration``). sigma_request = 0.6.

    =========  ===========  ===========
    workload   DSpark a1    DFlash a1
    =========  ===========  ===========
    gsm8k      0.8852       0.8787
    math500    0.8713       0.8564
    mbpp       0.8545       0.8370
    humaneval  0.8608       0.8447
    mt-bench   0.7687       0.7307
    =========  ===========  ===========

Resulting DSpark tau at k=7: gsm8k 4.96, math500 4.72, mbpp 4.46,
humaneval 4.56, mt-bench 3.44; at k=4: 3.80 / 3.69 / 3.55 / 3.60 / 2.98.
The measured DSpark rate is flat within 0.01 on the math workloads; on
MT-Bench (lower acceptance, stronger survivor selection) it rises 0.71 ->
0.77. These ALs are fits by construction (``drafters.calibration`` lists
them as *fitted*, not as checks).

The same presets are used for Qwen3-8B (no per-workload table was published
for it), plus one preset measured on it: ``speed-coding``, DeepSeek's
Qwen3-8B block-7 DSpark drafter on SPEED-Bench coding at T=1, AL 3.41 at
k = 7 (as quoted on the Dogacel/Qwen3-8B-DSpark card; a1 0.7657; DSpark
only). Demo aliases: ``chat`` (= mt-bench), ``code`` (= humaneval), ``math``
and ``batch`` (= math500; bulk summarise/classify copies from the prompt, so
acceptance is high), ``creative`` (weak drafter, T=1 coding-like community
fit s1~0.6: a1 0.60, decay 0.35) where speculation rarely pays. No source
gives temperature dependence for these drafters (the paper's numbers are all
at T=1), so none is modelled.

Usage::

    from drafters.acceptance import get_preset, expected_tokens_per_step, expected_draft_length
    p = get_preset("gsm8k")                       # DSpark drafter
    tau = expected_tokens_per_step(p, max_draft=8)                       # ~5.2
    tau_cut = expected_tokens_per_step(p, max_draft=8, min_confidence=0.5)
    drafted = expected_draft_length(p, max_draft=8, min_confidence=0.5)  # < 8
    rng = np.random.default_rng(0)
    req = sample_request(p, rng)                       # per-request quality
    step = sample_step(req, max_draft=8, min_confidence=0.0, rng=rng)    # one verify step
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

MAX_POSITIONS = 32
_GH_NODES, _GH_WEIGHTS = np.polynomial.hermite_e.hermegauss(21)  # probabilists' Hermite: E[f(Z)], Z~N(0,1)
_GH_WEIGHTS = _GH_WEIGHTS / _GH_WEIGHTS.sum()


@dataclass(frozen=True)
class WorkloadPreset:
    """Acceptance behaviour of one workload under one drafter family."""

    name: str
    drafter: str  # "dspark" | "dflash"
    a1: float  # conditional acceptance of the first draft position for an average request
    decay: float  # logit decrease per later position
    sigma_request: float = 0.6  # per-request spread of quality (logits)
    sigma_conf: float = 0.35  # confidence-head calibration noise (logits, per position per step)
    target_al: float | None = None  # published acceptance length at k=16, if any
    source: str = ""


def _logit(p: float) -> float:
    return float(np.log(p / (1.0 - p)))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_PAPER = "DSpark paper arXiv 2607.05147 Table 1 (Qwen3-14B, T=1, k=16) via seed document; shape: seed per-position figures"
SIGMA_REQUEST = 0.6
_FITTED = {
    # name: (dspark a1, dflash a1, dspark AL, dflash AL) -- a1 = fit_a1(AL, decay, 16, SIGMA_REQUEST)
    "gsm8k": (0.8852, 0.8787, 6.21, 5.41),
    "math500": (0.8713, 0.8564, 5.74, 4.84),
    "mbpp": (0.8545, 0.8370, 5.26, 4.44),
    "humaneval": (0.8608, 0.8447, 5.43, 4.59),
    "mt-bench": (0.7687, 0.7307, 3.70, 3.10),
}
DSPARK_DECAY = 0.046  # the measured per-position rate comes out flat (survivor selection offsets it)
DFLASH_DECAY = 0.098  # the measured rate at position 16 is 0.78 / 0.88 of position 1

PRESETS: dict[tuple[str, str], WorkloadPreset] = {}
for _name, (_ad, _af, _ald, _alf) in _FITTED.items():
    PRESETS[(_name, "dspark")] = WorkloadPreset(_name, "dspark", _ad, DSPARK_DECAY, SIGMA_REQUEST, target_al=_ald,
                                                source=_PAPER)
    PRESETS[(_name, "dflash")] = WorkloadPreset(_name, "dflash", _af, DFLASH_DECAY, SIGMA_REQUEST, target_al=_alf,
                                                source=_PAPER)
for _alias, _base in (("chat", "mt-bench"), ("code", "humaneval"), ("math", "math500"), ("batch", "math500")):
    for _d in ("dspark", "dflash"):
        _p = PRESETS[(_base, _d)]
        PRESETS[(_alias, _d)] = WorkloadPreset(_alias, _d, _p.a1, _p.decay, _p.sigma_request, _p.sigma_conf,
                                               _p.target_al, f"alias of {_base}")
for _d in ("dspark", "dflash"):
    PRESETS[("creative", _d)] = WorkloadPreset("creative", _d, 0.60, 0.35, 0.6, 0.35, None,
                                               "weak-drafter regime (community drafter, coding, T=1: s1~0.6, r~0.53)")
# Measured on Qwen3-8B itself (DSpark only; target_al is at k=7, its block).
SPEED_CODING_K = 7
PRESETS[("speed-coding", "dspark")] = WorkloadPreset(
    "speed-coding", "dspark", 0.7657, DSPARK_DECAY, SIGMA_REQUEST, target_al=3.41,
    source="deepseek-ai dspark_qwen3_8b_block7, SPEED-Bench coding, H100, T=1 (AL 3.41 at k=7; HF card Dogacel/Qwen3-8B-DSpark)",
)

WORKLOADS: tuple[str, ...] = tuple(sorted({k[0] for k in PRESETS}))


def get_preset(name: str, drafter: str = "dspark") -> WorkloadPreset:
    """Workload preset by name (``gsm8k``, ``math500``, ``mbpp``, ``humaneval``, ``mt-bench``,
    ``chat``, ``code``, ``math``, ``batch``, ``creative``; ``speed-coding`` for ``dspark`` only)
    for ``dspark`` or ``dflash``."""
    key = (name.lower().replace("_", "-"), drafter.lower())
    if key not in PRESETS:
        raise KeyError(f"unknown workload preset {name!r}/{drafter!r}; known: {list(WORKLOADS)}")
    return PRESETS[key]


def conditional_acceptance(preset: WorkloadPreset, positions: int, z: float = 0.0) -> np.ndarray:
    """a_i for i = 1..positions for a request with quality shift ``z``."""
    i = np.arange(positions)
    return _sigmoid(_logit(preset.a1) - preset.decay * i + z)


def survival(preset: WorkloadPreset, positions: int, z: float = 0.0) -> np.ndarray:
    """S_i = P(positions 1..i all accepted) for a request with quality shift ``z``."""
    return np.cumprod(conditional_acceptance(preset, positions, z))


def confidence_cut_length(cumulative_confidence: np.ndarray, min_confidence: float) -> int:
    """Number of positions drafted: cut at the first position whose cumulative confidence < theta."""
    if min_confidence <= 0.0:
        return int(len(cumulative_confidence))
    below = np.nonzero(np.asarray(cumulative_confidence) < min_confidence)[0]
    return int(below[0]) if below.size else int(len(cumulative_confidence))


@lru_cache(maxsize=4096)
def _expectations(preset: WorkloadPreset, max_draft: int, min_confidence: float) -> tuple[float, float, np.ndarray]:
    k = max(0, min(int(max_draft), MAX_POSITIONS))
    if k == 0:
        return 1.0, 0.0, np.zeros(0)
    # Step-weighted: a request with tau(z) needs 1/tau(z) steps per token, so in a stream of
    # requests (and in a continuous batch) it occupies steps in proportion to 1/tau(z).
    taus, ns, ss = [], [], []
    for node in _GH_NODES:
        s = survival(preset, k, preset.sigma_request * float(node))
        n = confidence_cut_length(s, min_confidence)
        taus.append(1.0 + float(s[:n].sum()))
        ns.append(n)
        ss.append(np.where(np.arange(k) < n, s, 0.0))
    w = _GH_WEIGHTS / np.asarray(taus)
    w = w / w.sum()
    tau = float(np.dot(w, taus))
    drafted = float(np.dot(w, ns))
    per_pos = (w[:, None] * np.asarray(ss)).sum(axis=0)
    return float(tau), float(drafted), per_pos


def expected_tokens_per_step(preset: WorkloadPreset, max_draft: int, min_confidence: float = 0.0) -> float:
    """E[tokens emitted per verify step] (acceptance length incl. the bonus token) for draft cap
    ``max_draft`` and confidence threshold ``min_confidence``; 1.0 when ``max_draft`` is 0."""
    return _expectations(preset, int(max_draft), float(min_confidence))[0]


def expected_draft_length(preset: WorkloadPreset, max_draft: int, min_confidence: float = 0.0) -> float:
    """E[draft tokens proposed (and verified, without adaptive verification) per request-step]."""
    return _expectations(preset, int(max_draft), float(min_confidence))[1]


def expected_accepted_per_position(preset: WorkloadPreset, max_draft: int, min_confidence: float = 0.0) -> np.ndarray:
    """E[accepted at position i per request-step], i = 1..max_draft (vLLM's per-position counter / drafts)."""
    return _expectations(preset, int(max_draft), float(min_confidence))[2].copy()


def measured_conditional_acceptance(preset: WorkloadPreset, max_draft: int) -> np.ndarray:
    """What a per-position acceptance measurement reports at positions 1..k:
    accepted at i / accepted at i-1 over all drafts (vLLM's
    `spec_decode_num_accepted_tokens_per_pos` ratios) -- the figure the seed's
    per-position shapes describe."""
    per_pos = expected_accepted_per_position(preset, max_draft)
    return per_pos / np.concatenate([[1.0], per_pos[:-1]])


def fit_a1(target_al: float, decay: float, positions: int = 16, sigma_request: float = SIGMA_REQUEST) -> float:
    """Bisection for the a1 that makes E[tau(positions)] equal ``target_al`` (how the table was fitted)."""
    lo, hi = 0.05, 0.995
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        p = WorkloadPreset("fit", "fit", mid, decay, sigma_request)
        if expected_tokens_per_step(p, positions) < target_al:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# ---------------------------------------------------------------- sampling (simulator)


@dataclass(frozen=True)
class RequestDraw:
    """One request's drawn quality: its conditional acceptance per position."""

    preset: WorkloadPreset
    z: float
    accept: np.ndarray  # a_i, MAX_POSITIONS long
    logit_accept: np.ndarray


def sample_request(preset: WorkloadPreset, rng: np.random.Generator) -> RequestDraw:
    """Draw a request's quality shift and its per-position conditional acceptance."""
    z = float(rng.normal(0.0, preset.sigma_request))
    a = conditional_acceptance(preset, MAX_POSITIONS, z)
    return RequestDraw(preset, z, a, np.log(a / (1.0 - a)))


@dataclass(frozen=True)
class StepDraw:
    """Outcome of one verify step for one request."""

    drafted: int  # draft tokens proposed (after cap + confidence cut)
    accepted: int  # accepted draft tokens (prefix length); emitted = accepted + 1
    cum_confidence: np.ndarray  # confidence-head cumulative confidence of the drafted positions


def sample_confidences(req: RequestDraw, positions: int, rng: np.random.Generator) -> np.ndarray:
    """Cumulative confidence-head output for the first ``positions`` draft slots of one step."""
    if positions <= 0:
        return np.zeros(0)
    noise = rng.normal(0.0, req.preset.sigma_conf, positions)
    return np.cumprod(_sigmoid(req.logit_accept[:positions] + noise))


def sample_accepted(req: RequestDraw, drafted: int, rng: np.random.Generator) -> int:
    """Accepted prefix length among ``drafted`` verified positions (chain of Bernoulli(a_i))."""
    if drafted <= 0:
        return 0
    fails = rng.random(drafted) >= req.accept[:drafted]
    idx = np.nonzero(fails)[0]
    return int(idx[0]) if idx.size else int(drafted)


def sample_step(req: RequestDraw, max_draft: int, min_confidence: float, rng: np.random.Generator) -> StepDraw:
    """One verify step without adaptive verification: cap, confidence cut, Bernoulli chain."""
    k = max(0, min(int(max_draft), MAX_POSITIONS))
    conf = sample_confidences(req, k, rng)
    n = confidence_cut_length(conf, min_confidence)
    return StepDraw(drafted=n, accepted=sample_accepted(req, n, rng), cum_confidence=conf[:n])


# ---------------------------------------------------------------- adaptive verification


def adaptive_verification_budget(
    slot_scores: np.ndarray,
    n_requests: int,
    nondraft_tokens: int,
    draft_time_s: float,
    verify_time_s: Callable[[np.ndarray], np.ndarray],
    slot_weights: np.ndarray | None = None,
) -> tuple[int, float]:
    """vLLM adaptive verification's per-step budget.

    ``slot_scores``: cumulative confidence of every draftable (request,
    position) slot this step.  ``verify_time_s(tokens_array)`` returns step
    times for candidate verify token counts (``costmodel.step_time_array_s``).
    Returns (B, score threshold): admit the B best slots, i.e. every slot
    scoring >= threshold (per request this is a prefix, since cumulative
    confidence is non-increasing along a draft).  With ``slot_weights`` (the
    analytic use: each slot stands for several requests) B counts weighted
    slots.
    """
    scores = np.asarray(slot_scores, dtype=float)
    if scores.size == 0:
        return 0, float("inf")
    order = np.argsort(-scores, kind="stable")
    s = scores[order]
    w = np.ones_like(s) if slot_weights is None else np.asarray(slot_weights, dtype=float)[order]
    cum_w = np.concatenate([[0.0], np.cumsum(w)])
    cum_gain = np.concatenate([[0.0], np.cumsum(s * w)])
    budgets = np.rint(cum_w).astype(int)
    t = draft_time_s + verify_time_s(nondraft_tokens + budgets)
    rate = (n_requests + cum_gain) / t
    best = int(np.argmax(rate))
    threshold = float(s[best - 1]) if best > 0 else float("inf")
    return int(budgets[best]), threshold


def expected_tokens_adaptive(
    preset: WorkloadPreset,
    max_draft: int,
    batch: int,
    draft_time_s: float,
    verify_time_s: Callable[[np.ndarray], np.ndarray],
    min_confidence: float = 0.0,
) -> tuple[float, float]:
    """Analytic adaptive verification for a homogeneous batch: (tau, verified draft tokens per request).

    Each Gauss-Hermite node stands for ``weight * batch`` requests; slots are
    ranked by their (calibrated) survival and the budget chosen as in vLLM.
    """
    k = max(0, min(int(max_draft), MAX_POSITIONS))
    if k == 0 or batch <= 0:
        return 1.0, 0.0
    scores, weights = [], []
    surv = [survival(preset, k, preset.sigma_request * float(node)) for node in _GH_NODES]
    step_w = _GH_WEIGHTS / np.array([1.0 + s.sum() for s in surv])  # batch composition is step-weighted
    step_w = step_w / step_w.sum()
    for s, w in zip(surv, step_w):
        n = confidence_cut_length(s, min_confidence)
        scores.append(s[:n])
        weights.append(np.full(n, w * batch))
    sc, wt = np.concatenate(scores), np.concatenate(weights)
    budget, thr = adaptive_verification_budget(sc, batch, batch, draft_time_s, verify_time_s, wt)
    keep = sc >= thr
    tau = 1.0 + float((sc[keep] * wt[keep]).sum()) / batch
    return tau, budget / batch


__all__ = [
    "WorkloadPreset", "PRESETS", "WORKLOADS", "MAX_POSITIONS", "get_preset", "conditional_acceptance", "survival",
    "confidence_cut_length", "expected_tokens_per_step", "expected_draft_length", "expected_accepted_per_position",
    "fit_a1", "RequestDraw", "StepDraw", "sample_request", "sample_confidences", "sample_accepted", "sample_step",
    "adaptive_verification_budget", "expected_tokens_adaptive", "DSPARK_DECAY", "DFLASH_DECAY", "SIGMA_REQUEST",
    "SPEED_CODING_K", "measured_conditional_acceptance",
]
