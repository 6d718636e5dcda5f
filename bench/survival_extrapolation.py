"""How well does the controller price a longer draft than the one a tenant ran at? (SIMULATION)

Why: a tenant capped at 4 drafts gives evidence about positions 1-4 only, and
whether the controller lets it draft 8 depends on what it predicts there.
The geometric model (one conditional acceptance `a` fitted to the drafted and
accepted totals) extrapolates along a^i; the measured survival per position
(`controller.estimators`, from vLLM's per-request `acceptance_histogram`)
continues the last measured position's conditional rate. A whole-match
drafter (ngram: a copy accepted whole or left early) does not follow a^i.

What it does, per workload and seed: one simulated ngram-k8 replica
(drafters.sim, whose ngram truth is `drafters.sim.ngram_acceptance`,
calibrated on the CPU bed, not on the controller's model) runs closed-loop
requests capped at 8, then the same requests capped at 4. From the cap-4
run's telemetry the controller's estimator predicts the tokens per decode
step at 8, both ways; the cap-8 run measured it. Prints each prediction's
error.

    .venv/bin/python bench/survival_extrapolation.py [--seconds 60] [--seeds 1 2 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.acceptance_fit import expected_accepted  # noqa: E402
from controller.estimators import TenantEstimator  # noqa: E402
from controller.signals import TenantSample  # noqa: E402
from drafters.sim.des import EngineConfig, Simulation  # noqa: E402
from drafters.sim.policy import Admission, BasePolicy  # noqa: E402
from drafters.sim.trace import ClosedLoopSource, TenantSpec  # noqa: E402

# One workload of each ngram preset: greedy text (code) and sampled text (chat).
WORKLOADS = ("code", "chat")


def run(workload: str, cap: int, seed: int, seconds: float) -> tuple[dict[str, float], TenantEstimator]:
    """The tenant's telemetry counters after `seconds` at draft cap `cap`, and an estimator fed them."""

    class Capped(BasePolicy):
        def admit(self, request, view):
            return Admission(replica="n", vllm_xargs={"specgate_max_draft": cap})

    source = ClosedLoopSource(4, [TenantSpec("t", workload, output_mean=300)], seed=seed)
    sim = Simulation([EngineConfig(name="n", profile="ngram-k8")], source, Capped(), seed=seed)
    sim.run(until_s=seconds)
    counters = dict(sim.tenant_counters[("t", "n")])
    est = TenantEstimator()
    est.update([TenantSample("t", "n", counters)], methods={"n": "ngram"})
    return counters, est


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="simulated seconds per run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args(argv)
    print("tokens per decode step at a cap of 8 (simulated ngram-k8), predicted from a run at a cap of 4")
    for workload in WORKLOADS:
        for seed in args.seeds:
            at8, _ = run(workload, 8, seed, args.seconds)
            measured = 1 + at8["num_accepted_draft_tokens"] / at8["allowed_decode_steps"]
            _, est = run(workload, 4, seed, args.seconds)
            proposal, a = est.method_proposal("t")["ngram"], est.method_acceptance("t")["ngram"]
            survival = proposal.tokens(a, 8)
            geometric = 1 + proposal.rate * expected_accepted(a, proposal.fill * 8)
            print(f"{workload:5s} seed {seed}: measured {measured:.3f} | survival {survival:.3f} "
                  f"({survival / measured - 1:+.1%}) | geometric {geometric:.3f} ({geometric / measured - 1:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
