"""A workload as a sequence of phases: one type for `specgate load`, the simulated
control sweep and the real-engine sweep.

A phase is one stretch of the run at one load level -- an offered `rate`
(arrivals per second, open loop: `specgate load`) or a `concurrency` (clients
with one request each in flight, closed loop: the sweeps) -- with an optional
tenant `mix` and a `settle_s` head that is not measured (the controller
reacts, a closed loop refills). Its place in the run (`start_s`, `end_s`,
`index`) comes from `lay_out`, which puts phases end to end from t=0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Phase:
    name: str
    duration_s: float
    rate: float | None = None  # offered arrivals per second (open loop)
    concurrency: int | None = None  # requests in flight (closed loop)
    settle_s: float = 0.0  # the phase's head, not measured
    mix: Mapping[str, float] | None = None  # tenant -> weight; None: the workload's own
    start_s: float = 0.0  # from the run's start (lay_out)
    index: int = 0  # 1-based position in the run (lay_out); 0: not laid out

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def measure_s(self) -> float:
        return self.duration_s - self.settle_s

    @property
    def label(self) -> str:
        """"2 heavy": the index tells apart two phases of one name (a step pattern's two `light`s)."""
        return f"{self.index} {self.name}" if self.index else self.name


def lay_out(phases: Iterable[Phase]) -> list[Phase]:
    """The phases end to end from t=0, numbered from 1."""
    out, t = [], 0.0
    for i, phase in enumerate(phases, 1):
        out.append(replace(phase, start_s=t, index=i))
        t += phase.duration_s
    return out


def phase_at(t: float, phases: Iterable[Phase]) -> Phase | None:
    """The laid-out phase holding time t (None before the first or after the last)."""
    return next((p for p in phases if p.start_s <= t < p.end_s), None)
