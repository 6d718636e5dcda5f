"""The load threshold sent with a drafting policy (specgate_max_batch).

Why: a load step (a burst of clients) turns a replica compute-bound faster
than one controller tick, and requests admitted before the tick keep drafting
for their whole life. The threshold travels with each request and the engine
checks it every step, so drafting stops at the next step after the batch
crosses it -- for requests already in flight too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from .config import DecisionConfig
from .goodput import GoodputModel, run_batch
from .views import ReplicaInput


def spec_max_batch(model: GoodputModel, rep: ReplicaInput, choice: Mapping[str, int], cfg: DecisionConfig) -> int | None:
    """The largest batch (on `cfg.max_batch_grid`) at which `choice` still holds
    against everyone off on this replica; None if it holds on the whole grid.

    Keyed on off_margin, the margin at which the decision itself turns
    speculation off; the first crossing above today's batch (with prefill in
    the steps the goodput ratio is not monotonic in the batch, and a larger
    margin's crossing jumps between distant grid points from tick to tick).
    """
    grid = cfg.max_batch_grid
    if not grid or rep.block <= 0:
        return None
    off = {t: 0 for t in choice}
    # Grid points below today's batch are where the replica already runs
    # (the decision has judged them); search upwards from there.
    now_b = run_batch(rep)
    below = [b for b in grid if b < now_b]
    last_ok: int | None = below[-1] if below else None
    for b in grid[len(below):]:
        at = replace(rep, batch=float(b), waiting=0.0)
        on = model.goodput(at, choice)
        without = model.goodput(at, off)
        if without >= on * (1 + cfg.off_margin):
            return last_ok if last_ok is not None else b
        last_ok = b
    return None


class LoadThresholds:
    """`spec_max_batch` per knob-capable speculative replica, memoised per tick:
    every tenant that holds the same joint choice asks the same question."""

    def __init__(self, model: GoodputModel, cfg: DecisionConfig):
        self.model, self.cfg = model, cfg
        self._cache: dict[tuple, int | None] = {}  # (replica, joint choice) -> max_batch

    def for_choice(self, choice: Mapping[str, int], reps: list[ReplicaInput]) -> int | None:
        """The lowest threshold over `reps` (None: no replica needs one)."""
        key = tuple(sorted(choice.items()))
        limits = []
        for r in reps:
            if r.supports_knobs and r.block > 0:
                if (r.name, key) not in self._cache:
                    self._cache[(r.name, key)] = spec_max_batch(self.model, r, choice, self.cfg)
                limits.append(self._cache[(r.name, key)])
        return min((m for m in limits if m is not None), default=None)
