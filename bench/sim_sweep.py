"""Where does static DSpark speculation stop paying?  (SIMULATED H200 replicas.)

One run: closed-loop clients at concurrency 1, 4, 16, 64, 128, 256 against one
simulated vLLM replica per profile (off, dspark-b4/b8/b16, each with and
without adaptive verification), for H200 + Qwen3-8B and H200 + Qwen3-14B.
Prints output throughput (and the ratio to `off` at the same concurrency),
median TPOT, and the first concurrency at which each profile's throughput
falls below `off` ("stops paying").  Then prints every calibration point of
the cost/acceptance models with its error, in three blocks: the points a
parameter was fitted to, the held-out ones (nothing tuned to them; their
errors as they are, with the median) and the derived ones
(drafters/calibration.py).

Everything here is the drafters.sim discrete-event simulator (virtual time,
cost model + acceptance model); no GPU is involved.

    .venv/bin/python bench/sim_sweep.py                 # ~1 minute on 1 core
    .venv/bin/python bench/sim_sweep.py --workload chat --seconds 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drafters.calibration import evaluate_all, format_table  # noqa: E402
from drafters.sim.engine_types import SIMULATED_PROFILE_LABELS  # noqa: E402
from drafters.sim import EngineConfig, TenantSpec, run_closed_loop  # noqa: E402

CONCURRENCY = (1, 4, 16, 64, 128, 256)
MODELS = ("qwen3-8b", "qwen3-14b")


def sweep(gpu: str, model: str, workload: str, seconds: float, warmup: float, seed: int) -> dict:
    tenants = [TenantSpec("bench", workload, prompt_mean=400, output_mean=300)]
    out: dict[str, dict[int, tuple[float, float, float | None]]] = {}
    for profile in SIMULATED_PROFILE_LABELS:
        out[profile] = {}
        for c in CONCURRENCY:
            rep = run_closed_loop(EngineConfig(gpu=gpu, model=model, profile=profile, seed=seed), c, tenants,
                                  until_s=warmup + seconds, warmup_s=warmup, seed=seed, ramp_s=min(warmup / 2, 2.0))
            out[profile][c] = (rep.throughput_tok_s, rep.tpot_ms(50), rep.acceptance_length)
    return out


def stops_paying(res: dict, profile: str) -> str:
    """First grid concurrency where throughput < off, and the crossing interpolated in log(c)."""
    import math

    prev = None
    for c in CONCURRENCY:
        ratio = res[profile][c][0] / res["off"][c][0]
        if ratio < 1.0:
            if prev is None:
                return f"c={c}"
            (c0, r0) = prev
            f = (r0 - 1.0) / (r0 - ratio)
            est = math.exp(math.log(c0) + f * (math.log(c) - math.log(c0)))
            return f"c={c} (~{est:.0f})"
        prev = (c, ratio)
    return f">{CONCURRENCY[-1]}"


def print_table(gpu: str, model: str, res: dict) -> None:
    print(f"\n== {gpu.upper()} + {model}  (SIMULATED; closed loop, output tok/s [x vs off] / TPOT p50 ms; AL) ==")
    head = f"{'profile':14s}" + "".join(f"{'c=' + str(c):>22s}" for c in CONCURRENCY) + f"{'stops paying':>18s}"
    print(head)
    for profile in SIMULATED_PROFILE_LABELS:
        cells = []
        for c in CONCURRENCY:
            tput, tpot, al = res[profile][c]
            ratio = tput / res["off"][c][0] if res["off"][c][0] else float("nan")
            cells.append(f"{tput:7.0f} [{ratio:4.2f}x] {tpot:5.1f}")
        tail = "" if profile == "off" else stops_paying(res, profile)
        print(f"{profile:14s}" + "".join(f"{x:>22s}" for x in cells) + f"{tail:>18s}")
    als = {p: res[p][1][2] for p in SIMULATED_PROFILE_LABELS if res[p][1][2]}
    print("acceptance length at c=1: " + ", ".join(f"{p} {v:.2f}" for p, v in als.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--workload", default="gsm8k", help="acceptance preset (gsm8k, math500, mbpp, humaneval, mt-bench, chat, creative)")
    ap.add_argument("--seconds", type=float, default=20.0, help="simulated seconds measured per point")
    ap.add_argument("--warmup", type=float, default=10.0, help="simulated warm-up seconds before measuring")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(f"sim_sweep: workload={args.workload}, prompt~400 / output~300 tokens (lognormal), "
          f"{args.seconds:.0f} simulated s measured per point after {args.warmup:.0f} s warm-up")
    for model in MODELS:
        print_table(args.gpu, model, sweep(args.gpu, model, args.workload, args.seconds, args.warmup, args.seed))
    print("\n== calibration points (cost + acceptance model vs published) ==")
    print(format_table(evaluate_all()))
    print(f"\n(wall time {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
