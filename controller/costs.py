"""Per-replica step-time model for the decision: `drafters.costmodel` (the
roofline every part of specgate shares), refined online.

Why refine: the roofline's effective bandwidth and FLOP fractions are fitted
to published points, not to *this* replica. The controller observes each
replica's real step time (interval / engine steps from vLLM's
`iteration_tokens` histogram count) at a known step shape, and scales the
memory or compute side — whichever the model says dominated that step — by
the observed/predicted ratio (EMA in log space, clipped). The knee moves
with the ratio of the two scales, so rho = tokens per step / knee is
calibrated to the machine, not to a datasheet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from contract.profiles import parse_profile as _parse_label
from contract.settings import DEFAULT_GPU, DEFAULT_MODEL
from drafters import costmodel as cm


def parse_profile(label: str | None) -> tuple[int, bool]:
    """`dspark-b8-av` -> (8, True); `off`/None -> (0, False). Labels were
    validated at config load (`contract.profiles`); an unknown one raises
    here rather than being modelled as a replica without speculation."""
    profile = _parse_label(label or "off")
    return profile.block_size, profile.adaptive


@dataclass
class ReplicaCost:
    """CostFn over drafters.costmodel with online scale factors."""

    gpu: cm.GpuSpec
    model: cm.ModelSpec
    mem_scale: float = 1.0
    compute_scale: float = 1.0
    updates: int = 0
    _scaled: cm.GpuSpec | None = field(default=None, repr=False)

    @classmethod
    def for_names(cls, gpu: str = DEFAULT_GPU, model: str = DEFAULT_MODEL) -> "ReplicaCost":
        return cls(cm.get_gpu(gpu), cm.get_model(model))

    @property
    def scaled_gpu(self) -> cm.GpuSpec:
        if self._scaled is None:
            self._scaled = cm.with_overrides(
                self.gpu, bw_eff=self.gpu.bw_eff / self.mem_scale, flops_eff=self.gpu.flops_eff / self.compute_scale
            )
        return self._scaled

    def step_time_s(
        self, batch: float, verify_tokens: float, draft_len: int, context_tokens: float, drafting_batch: float | None = None
    ) -> float:
        """Drafter pass (for `drafting_batch` sequences, default all, over `draft_len`) + verify step."""
        b = max(int(round(batch)), 1)
        n = max(int(math.ceil(verify_tokens)), b)
        d = b if drafting_batch is None else max(int(math.ceil(drafting_batch - 1e-9)), 0)
        draft = cm.drafter_time_s(self.scaled_gpu, self.model, d, draft_len, context_tokens) if draft_len > 0 and d > 0 else 0.0
        return draft + cm.step_time_s(self.scaled_gpu, self.model, n, b, context_tokens)

    def knee_tokens(self, batch: float, context_tokens: float) -> float:
        return cm.knee_tokens(self.scaled_gpu, self.model, max(int(round(batch)), 1), context_tokens)

    def observe(
        self, batch: float, tokens_per_step: float, draft_len: int, context_tokens: float, observed_step_s: float,
        weight: float = 0.2, drafting_batch: float | None = None,
    ) -> None:
        """Fold one observed step time into the scale of the dominant side."""
        if observed_step_s <= 0 or batch < 1 or tokens_per_step <= 0:
            return
        b = max(int(round(batch)), 1)
        predicted = self.step_time_s(b, tokens_per_step, draft_len, context_tokens, drafting_batch)
        if predicted <= 0:
            return
        ratio = min(2.0, max(0.5, observed_step_s / predicted))
        breakdown = cm.step_breakdown(self.scaled_gpu, self.model, int(math.ceil(tokens_per_step)), b, context_tokens)
        attr = "compute_scale" if breakdown.compute_bound else "mem_scale"
        current = getattr(self, attr)
        new = math.exp((1 - weight) * math.log(current) + weight * math.log(current * ratio))
        setattr(self, attr, min(4.0, max(0.25, new)))
        self._scaled = None
        self.updates += 1
