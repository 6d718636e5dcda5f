"""Per-replica step-time model for the decision: the curve each replica's
own /metrics teach (`step_cost.StepCostLearner`), with an optional roofline
preset as its prior.

Why a preset is only a prior: `drafters.costmodel` describes named hardware
(`--gpu h200 --model qwen3-8b`); a replica that is not that pair -- another
GPU, another model, a CPU -- would be priced with a knee that can be 10x
off. So the preset (when given) shapes the curve only until the replica's
own steps have been seen at two or more loads; without a preset the
generic prior does the same, and the controller needs no hint at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from contract.profiles import parse_profile as _parse_label
from drafters import costmodel as cm

from .step_cost import (
    GENERIC_PRIOR,
    Prior,
    StepCostLearner,
    StepCurve,
    StepPoint,
    fit_step_curve,
)


def parse_profile(label: str | None) -> tuple[int, bool]:
    """`dspark-b8-av` -> (8, True); `off`/None -> (0, False). Labels were
    validated at config load (`contract.profiles`); an unknown one raises
    here rather than being modelled as a replica without speculation."""
    profile = _parse_label(label or "off")
    return profile.block_size, profile.adaptive


# Context length the preset's curve is sampled at (attention reads grow with
# it; the learned curve absorbs the replica's real mix).
_PRIOR_CONTEXT = 1024.0


def roofline_prior(gpu: str, model: str, block: int = 0, model_drafter: bool = True) -> Prior:
    """A preset's roofline, reduced to the learner's shape: the flat-then-linear
    curve closest to it over 1..8192 tokens per step (batch = tokens / (1 +
    block)), and its drafter's cost per drafting request at a mid-size batch
    (none for a model-free drafter such as ngram)."""
    g, m = cm.get_gpu(gpu), cm.get_model(model)
    points = []
    for i in range(0, 27):
        n = int(round(2 ** (i / 2)))
        b = max(1, n // (1 + block))
        points.append(StepPoint(float(n), cm.step_time_s(g, m, n, b, _PRIOR_CONTEXT)))
    flat = Prior(StepCurve(points[0].step_s, 64.0, points[0].step_s / 64.0), knee_strength=0.0,
                 shape_strength=0.0, draft_strength=0.0)
    curve = fit_step_curve(points, flat)
    fixed = per_request = 0.0
    if block > 0 and model_drafter:
        one = cm.drafter_time_s(g, m, 1, block, _PRIOR_CONTEXT)
        per_request = max(0.0, cm.drafter_time_s(g, m, 64, block, _PRIOR_CONTEXT) - one) / 63
        fixed = max(0.0, one - per_request)
    return Prior(StepCurve(curve.flat_s, curve.knee_tokens, curve.slope_s, per_request, fixed), label=f"{gpu}/{model}")


# A model drafter's work per proposed slot relative to the target's per token:
# the published DSpark / DFlash drafters are a few target-width layers plus the
# target's LM head (Qwen3-8B: 5 layers + fc + head ~ 1.7B of 8.2B parameters).
DRAFTER_WORK_SHARE = 0.2


def prior_for(gpu: str | None, model: str | None, profile: str | None = None) -> Prior:
    """The prior a replica's learner starts from: the named preset's roofline
    when both names are given, else the generic shape (whose drafter, for a
    model drafter, costs DRAFTER_WORK_SHARE of the target's work for each of
    the block + 1 slots it proposes per request)."""
    parsed = _parse_label(profile or "off")
    method = getattr(parsed, "method", "dspark")
    if not gpu or not model:
        if parsed.block_size <= 0 or method == "ngram":
            return GENERIC_PRIOR
        return replace(GENERIC_PRIOR, draft_work_tokens=DRAFTER_WORK_SHARE * (parsed.block_size + 1))
    return roofline_prior(gpu, model, parsed.block_size, model_drafter=method != "ngram")


@dataclass
class ReplicaCost:
    """CostFn (see decision.views) over one replica's learned step curve."""

    learner: StepCostLearner = field(default_factory=StepCostLearner)
    # The block size the drafting evidence was observed at (the replica's
    # profile). The drafter's per-request work is its block + 1 slots, so a
    # profile with another block is priced with the pass scaled by the slots.
    observed_block: int = 0

    @classmethod
    def for_names(
        cls, gpu: str | None = None, model: str | None = None, profile: str | None = None, half_life_s: float = 300.0
    ) -> "ReplicaCost":
        return cls(StepCostLearner(prior=prior_for(gpu, model, profile), half_life_s=half_life_s))

    @property
    def curve(self) -> StepCurve:
        return self.learner.current()

    @property
    def updates(self) -> int:
        return self.learner.observations

    def step_time_s(
        self, batch: float, verify_tokens: float, draft_len: int, context_tokens: float, drafting_batch: float | None = None
    ) -> float:
        """One engine step verifying `verify_tokens` (drafts + 1 per request,
        plus prefill) with `drafting_batch` requests (default: all) drafting
        when `draft_len` > 0."""
        n = max(verify_tokens, batch, 1.0)
        drafting = 0.0 if draft_len <= 0 else max(batch if drafting_batch is None else drafting_batch, 0.0)
        slots = (draft_len + 1) / (self.observed_block + 1) if self.observed_block > 0 and draft_len > 0 else 1.0
        return self.curve.step_time_s(n, drafting * slots, 1.0 if drafting > 0 else 0.0, max(batch, 1.0))

    def knee_tokens(self, batch: float, context_tokens: float) -> float:
        return self.curve.knee_tokens

    def observe(self, dt_s: float, steps: float, forward_tokens: float, drafting_requests: float, batch: float,
                prompt_tokens: float = 0.0, prompt_chunk: float | None = None, block: int = 0) -> bool:
        """One busy scrape interval (see `StepCostLearner.observe`); `block`:
        the replica's draft block while it was observed."""
        if drafting_requests > 0 and block > 0:
            self.observed_block = block
        return self.learner.observe(dt_s, steps, forward_tokens, drafting_requests, batch, prompt_tokens, prompt_chunk)

    def observe_cells(self, dt_s: float, cells: dict, block: int = 0) -> bool:
        """One scrape interval's engine-timed steps (`StepCostLearner.observe_cells`)."""
        if block > 0 and any(drafting for (_, _, drafting) in cells):
            self.observed_block = block
        return self.learner.observe_cells(dt_s, cells)

    def describe(self) -> dict:
        return self.learner.describe()


@dataclass(frozen=True)
class RooflineCost:
    """CostFn of a named preset's full roofline (`drafters.costmodel`: batch
    and context dependence, the drafter's pass), with no learning.

    Why keep it beside the learned curve: it is the simulator's own truth, so
    decision tests and what-if pricing can pose a question against a known
    machine exactly; the live controller prices with `ReplicaCost`.
    """

    gpu: cm.GpuSpec
    model: cm.ModelSpec

    @classmethod
    def for_names(cls, gpu: str, model: str) -> "RooflineCost":
        return cls(cm.get_gpu(gpu), cm.get_model(model))

    def step_time_s(
        self, batch: float, verify_tokens: float, draft_len: int, context_tokens: float, drafting_batch: float | None = None
    ) -> float:
        b = max(int(round(batch)), 1)
        n = max(int(math.ceil(verify_tokens)), b)
        d = b if drafting_batch is None else max(int(math.ceil(drafting_batch - 1e-9)), 0)
        draft = cm.drafter_time_s(self.gpu, self.model, d, draft_len, context_tokens) if draft_len > 0 and d > 0 else 0.0
        return draft + cm.step_time_s(self.gpu, self.model, n, b, context_tokens)

    def knee_tokens(self, batch: float, context_tokens: float) -> float:
        return cm.knee_tokens(self.gpu, self.model, max(int(round(batch)), 1), context_tokens)
