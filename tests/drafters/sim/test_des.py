import pytest

from drafters.sim import (
    Admission, BasePolicy, ClosedLoopSource, EngineConfig, ModelOraclePolicy, OpenLoopSource, Simulation,
    StaticPolicy, TenantSpec, piecewise_poisson_trace, run_closed_loop,
)

GSM = [TenantSpec("t", "gsm8k")]


def test_spec_pays_at_low_load_not_at_high_load():
    def tput(profile, c):
        return run_closed_loop(EngineConfig(profile=profile), c, GSM, until_s=12, warmup_s=3).throughput_tok_s

    assert tput("dspark-b8", 1) > 2.5 * tput("off", 1)
    assert tput("dspark-b8", 256) < tput("off", 256)
    off = [tput("off", c) for c in (1, 16, 128)]
    assert off == sorted(off)


def test_report_fields():
    rep = run_closed_loop(EngineConfig(profile="dspark-b4"), 8, GSM, until_s=10, warmup_s=2)
    s = rep.summary()
    assert s["completed"] > 0 and s["tpot_p50_ms"] > 0 and s["ttft_p50_ms"] > 0
    assert 1.0 < rep.acceptance_length <= 5.0
    assert rep.tpot_ms(90) >= rep.tpot_ms(50)
    assert len(rep.timeline) >= 9


class Recorder(BasePolicy):
    def __init__(self):
        self.admits, self.ticks = [], []

    def admit(self, request, view):
        self.admits.append((view.now, request.tenant))
        if request.tenant == "nospec":
            return Admission(replica="spec", max_draft=0)
        return Admission(replica="spec" if len(self.admits) % 2 else "plain", max_draft=None, min_confidence=0.2)

    def tick(self, view):
        r = view.replicas["spec"]
        self.ticks.append((view.now, r.running, r.waiting, r.counters["num_drafts"], dict(r.gauges),
                           dict(view.tenant_counters)))


def test_policy_hook_sees_measurements_and_controls_requests():
    tenants = [TenantSpec("nospec", "chat", output_mean=80), TenantSpec("spec", "gsm8k", output_mean=80)]
    trace = piecewise_poisson_trace([(10, 5.0), (10, 20.0)], tenants, seed=4)
    pol = Recorder()
    sim = Simulation([EngineConfig(name="spec", profile="dspark-b8"), EngineConfig(name="plain", profile="off")],
                     OpenLoopSource(trace), pol, tick_s=1.0, seed=1)
    rep = sim.run(until_s=25)
    assert len(pol.admits) == len(trace)
    assert [round(t) for t, *_ in pol.ticks[:3]] == [1, 2, 3] and len(pol.ticks) == 25
    assert pol.ticks[-1][3] > 0  # drafts counted on the spec replica
    assert "DCGM_FI_DEV_GPU_UTIL" in pol.ticks[5][4]
    tc = sim.tenant_counters
    assert tc[("nospec", "spec")]["num_spec_steps"] == 0 and tc[("nospec", "spec")]["requests"] > 0
    assert tc[("spec", "spec")]["num_spec_steps"] > 0
    assert ("spec", "plain") in tc and tc[("spec", "plain")]["spec_requests"] == 0
    assert {r.replica for r in rep.records} == {"spec", "plain"}
    # the second phase has ~4x the arrival rate
    first = sum(1 for r in trace if r.arrival_s < 10)
    assert len(trace) - first > 2.5 * first


def test_static_policy_pins_tenants():
    tenants = [TenantSpec("a", "gsm8k"), TenantSpec("b", "creative")]
    pol = StaticPolicy(per_tenant={"b": (0, None)}, replicas_by_tenant={"a": ["s1"], "b": ["o1"]})
    sim = Simulation([EngineConfig(name="s1", profile="dspark-b8"), EngineConfig(name="o1", profile="off")],
                     ClosedLoopSource(4, tenants, seed=2), pol)
    rep = sim.run(until_s=8)
    assert {(r.tenant, r.replica) for r in rep.records} <= {("a", "s1"), ("b", "o1")}


def test_oracle_routes_to_off_pool_under_load():
    from drafters.sim.engine import EngineRequest, ReplicaEngine
    from drafters.sim.policy import ClusterView, ReplicaView
    from drafters.sim.trace import TraceRequest

    spec, off = ReplicaEngine(EngineConfig(name="s", profile="dspark-b8")), ReplicaEngine(EngineConfig(name="o"))
    view = ClusterView(0.0, {"s": ReplicaView(spec), "o": ReplicaView(off)})
    req = TraceRequest(1, 0.0, "t", "gsm8k", 300, 300)
    assert ModelOraclePolicy().admit(req, view) == Admission(replica="s", max_draft=8)
    for eng in (spec, off):
        for i in range(256):
            eng.add_request(EngineRequest(str(i), 300, 300), 0.0)
        eng.step(0.0)
    assert ModelOraclePolicy().admit(req, view) == Admission(replica="o", max_draft=0)


def test_validation():
    with pytest.raises(ValueError):
        Simulation([], OpenLoopSource([]))
    with pytest.raises(ValueError):
        Simulation([EngineConfig(name="x"), EngineConfig(name="x")], OpenLoopSource([]))


def test_simulated_speedup_matches_the_analytic_cost_model():
    """At c=1 the DES (engine + batching + sampling) agrees with costmodel.static_speedup."""
    from drafters.acceptance import expected_tokens_per_step, get_preset
    from drafters.costmodel import get_gpu, get_model, static_speedup

    t = [TenantSpec("t", "gsm8k", prompt_mean=300, output_mean=600, length_cv=0.0)]
    off = run_closed_loop(EngineConfig(profile="off"), 1, t, until_s=25, warmup_s=1, seed=3)
    spec = run_closed_loop(EngineConfig(profile="dspark-b8"), 1, t, until_s=25, warmup_s=1, seed=3)
    tau = spec.acceptance_length
    assert tau == pytest.approx(expected_tokens_per_step(get_preset("gsm8k"), 8), rel=0.12)
    want = static_speedup(get_gpu("h200"), get_model("qwen3-8b"), 1, 600, 8, tau)
    got = spec.mean_tpot_ms() and off.mean_tpot_ms() / spec.mean_tpot_ms()
    assert got == pytest.approx(want, rel=0.12)
