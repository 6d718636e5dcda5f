"""Fixed per-tenant draft caps on the simulated fleet: what one tenant's cap does to the batch.

    .venv/bin/python bench/sim_fixed_caps.py                       # 2x dspark-b8-av, 48 requests, code:chat 1:1 (0.5 each)
    .venv/bin/python bench/sim_fixed_caps.py --profile dspark-b8 --caps 8:8,8:0,0:0

SIMULATION (drafters.sim, the H200 + Qwen3-8B roofline of bench/control_sweep.py). Why: the
controller's goodput model must price what a cap does to the *other* tenants, and the
simulator, a discrete-event model of the requests themselves, shares none of the model's
arithmetic. Here each tenant gets a fixed cap (the simulator's `StaticPolicy`: the knobs a
gateway would merge, least-loaded routing), the same clients (one closed-loop pool drawing
each request's tenant from the mix), and the output tok/s is printed per combination. It is
how the batch-share error in `controller/decision/goodput.py` (`batch_shares`) was found:
a tenant left at 0 beside a drafting one fills the batch with its slow requests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.control_sweep import GPU, MODEL, REPLICAS, TENANTS  # noqa: E402
from drafters.sim import ClosedLoopSource, EngineConfig, Simulation, TenantSpec  # noqa: E402
from drafters.sim.policy import StaticPolicy  # noqa: E402


def rate(profile: str, caps: dict[str, int], concurrency: int, mix: dict[str, float], measure_s: float,
         warm_s: float, seed: int) -> float:
    """Output tok/s of `REPLICAS` replicas of `profile` with every tenant at its fixed cap."""
    cfgs = [EngineConfig(gpu=GPU, model=MODEL, profile=profile, name=f"r{i}", seed=i) for i in range(REPLICAS)]
    specs = [TenantSpec(**{**TENANTS[t].__dict__, "weight": w}) for t, w in mix.items()]
    policy = StaticPolicy(per_tenant={t: (k, None) for t, k in caps.items()})
    report = Simulation(cfgs, ClosedLoopSource(concurrency, specs, seed=seed), policy, tick_s=1.0, seed=seed).run(
        warm_s + measure_s, warm_s)
    return report.output_tokens / measure_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="dspark-b8-av", help="every replica's launch profile")
    ap.add_argument("--concurrency", type=int, default=48, help="closed-loop clients (the fleet's, not per replica)")
    ap.add_argument("--mix", default="code:0.5,chat:0.5", help="tenant:weight,... (bench/control_sweep.py's TENANTS)")
    ap.add_argument("--caps", default="8:8,4:4,4:2,8:2,8:0,4:0,0:0",
                    help="combinations, each the tenants' caps in --mix order joined by ':'")
    ap.add_argument("--measure", type=float, default=120.0)
    ap.add_argument("--warm", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    mix = {t: float(w) for t, w in (item.split(":") for item in args.mix.split(","))}
    unknown = sorted(set(mix) - set(TENANTS))
    if unknown:
        ap.error(f"--mix: unknown tenants {unknown}; known: {sorted(TENANTS)}")
    names = list(mix)
    print(f"SIMULATION: {REPLICAS}x {args.profile}, {args.concurrency} closed-loop clients, mix {mix}, "
          f"{args.measure:.0f} s after {args.warm:.0f} s")
    for combo in args.caps.split(","):
        values = [int(x) for x in combo.split(":")]
        if len(values) != len(names):
            ap.error(f"--caps {combo!r}: one cap per tenant of --mix ({', '.join(names)})")
        caps = dict(zip(names, values))
        label = " ".join(f"{t}={k}" for t, k in caps.items())
        print(f"  {label:<24} {rate(args.profile, caps, args.concurrency, mix, args.measure, args.warm, args.seed):8.0f} tok/s",
              flush=True)


if __name__ == "__main__":
    main()
