import pytest

from contract.telemetry import COUNTER_FIELDS, RequestSpecStats, increments_for
from drafters.sim import (
    Admission, BasePolicy, ClosedLoopSource, EngineConfig, ModelOraclePolicy, OpenLoopSource, Simulation,
    StaticPolicy, TenantSpec, TraceRequest, piecewise_poisson_trace, run_closed_loop,
)
from drafters.vllm_ext.discovery import advertised_knobs

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


# -- the public interface: snapshot / submit / restart_replica; one telemetry schema -----


def test_tenant_counters_are_the_gateways_telemetry():
    """Each finished request adds `increments_for` of what its response reported: a
    speculative replica reports metrics.speculative_decoding for every request (also
    at max_draft=0), an off replica for none."""
    tenants = [TenantSpec("nospec", "chat", output_mean=60), TenantSpec("spec", "gsm8k", output_mean=60)]

    class Split(BasePolicy):
        def admit(self, request, view):
            if request.tenant == "nospec":
                return Admission(replica="s", vllm_xargs={"specgate_max_draft": 0})
            return Admission(replica="s" if request.id % 2 else "o")

    sim = Simulation([EngineConfig(name="s", profile="dspark-b8"), EngineConfig(name="o", profile="off")],
                     ClosedLoopSource(6, tenants, seed=5), Split(), seed=2)
    rep = sim.run(until_s=15)
    expected: dict = {}
    for r in rep.records:
        spec = r.replica == "s"
        allowance = (8 if r.max_draft is None else min(8, r.max_draft)) if spec else None  # dspark-b8: K = 8
        stats = RequestSpecStats(r.prompt_tokens, r.output_tokens, r.spec_steps if spec else None,
                                 r.draft_tokens if spec else None, r.accepted_tokens if spec else None,
                                 draft_allowance=allowance)
        c = expected.setdefault((r.tenant, r.replica), {f: 0.0 for f in COUNTER_FIELDS})
        for k, v in increments_for(stats).items():
            c[k] += v
    survival = {k: {f: v for f, v in c.items() if f.startswith("survival_")} for k, c in sim.tenant_counters.items()}
    without = {k: {f: v for f, v in c.items() if not f.startswith("survival_")} for k, c in sim.tenant_counters.items()}
    assert without == {k: {f: v for f, v in c.items() if not f.startswith("survival_")} for k, c in expected.items()}
    # The per-request acceptance histogram's survival counters: every proposal step reaches
    # position 1, and the survivors summed over the positions are the accepted drafts.
    spec_s = sim.tenant_counters[("spec", "s")]
    assert survival[("spec", "s")]["survival_reach_1"] == spec_s["num_spec_steps"] > 0
    assert sum(survival[("spec", "s")][f"survival_accepted_{i}"] for i in range(1, 9)) == spec_s["num_accepted_draft_tokens"]
    assert not any(survival[("spec", "o")].values())
    nospec = sim.tenant_counters[("nospec", "s")]
    assert nospec["spec_requests"] == nospec["requests"] > 0 and nospec["num_draft_tokens"] == 0
    assert nospec["allowed_decode_steps"] == 0  # capped at 0: no evidence of how it would propose
    spec = sim.tenant_counters[("spec", "s")]
    assert spec["allowed_spec_steps"] == spec["num_spec_steps"] > 0  # every request of it was allowed to draft
    assert spec["allowed_decode_steps"] >= spec["allowed_spec_steps"]
    assert spec["allowed_full_tokens"] == 8 * spec["num_spec_steps"] >= spec["allowed_draft_tokens"]
    assert sim.tenant_counters[("spec", "o")]["spec_requests"] == 0
    assert set(sim.tenant_counters[("spec", "s")]) == set(COUNTER_FIELDS)


def test_snapshot_advertises_the_plugins_knobs():
    sim = Simulation([EngineConfig(name=p, profile=p) for p in ("off", "dspark-b8", "dspark-b8-av")],
                     OpenLoopSource([]))
    views = sim.replica_views()
    assert set(views) == {"off", "dspark-b8", "dspark-b8-av"}
    off, b8, av = (sim.snapshot(n) for n in ("off", "dspark-b8", "dspark-b8-av"))
    assert off.ext_knobs == frozenset() and not off.supports_knobs and off.spec_num_drafts is None
    assert b8.ext_knobs == frozenset(advertised_knobs("dspark", False)) == {"max_draft", "max_batch", "schedule"}
    assert av.ext_knobs == frozenset(advertised_knobs("dspark", True)) and "min_confidence" in av.ext_knobs
    assert b8.spec_num_drafts == 0 and b8.num_requests_running == 0


def test_knobs_reach_the_engine_as_vllm_xargs_parsed_leniently():
    trace = [TraceRequest(i, 0.1 * i, "t", "gsm8k", 100, 40) for i in range(1, 5)]
    xargs = {1: {"specgate_max_draft": 2, "specgate_max_batch": 8}, 2: {"specgate_max_draft": "junk"},
             3: {"specgate_max_draft": -1, "other_ext": 1}, 4: None}

    class Knobs(BasePolicy):
        def admit(self, request, view):
            return Admission(replica="s", vllm_xargs=xargs[request.id])

    sim = Simulation([EngineConfig(name="s", profile="dspark-b8")], OpenLoopSource(trace), Knobs())
    rep = sim.run(until_s=10)
    by_id = {r.id: r for r in rep.records}
    assert by_id[1].max_draft == 2 and by_id[1].draft_tokens <= 2 * by_id[1].spec_steps
    assert by_id[2].max_draft is None and by_id[3].max_draft is None and by_id[4].max_draft is None
    # the shorthand fields are the same keys
    assert Admission(max_draft=3, vllm_xargs={"specgate_max_draft": 1}).xargs() == {"specgate_max_draft": 1}
    assert Admission(max_draft=3, min_confidence=0.5).xargs() == {"specgate_max_draft": 3,
                                                                  "specgate_min_confidence": 0.5}
    assert Admission().xargs() is None


class RestartAt(BasePolicy):
    """Restarts replica `name` into `profile` at tick `at`; logs what it sees every tick."""

    def __init__(self, name, profile, at, downtime_s):
        self.name_, self.profile, self.at, self.downtime_s = name, profile, at, downtime_s
        self.sim = None
        self.seen = []

    def attach(self, sim):
        self.sim = sim

    def tick(self, view):
        v = self.sim.replica_views()[self.name_]
        self.seen.append((view.now, v.status, v.profile, self.sim.snapshot(self.name_) is None, self.sim.restarting()))
        if round(view.now) == self.at:
            self.sim.restart_replica(self.name_, self.profile, self.downtime_s)


def test_restart_replica_drains_goes_down_and_comes_back_with_the_new_profile():
    pol = RestartAt("r0", "off", at=5, downtime_s=4.0)
    sim = Simulation([EngineConfig(name="r0", profile="dspark-b8"), EngineConfig(name="r1", profile="dspark-b8")],
                     ClosedLoopSource(8, GSM, seed=3), pol, seed=1)
    rep = sim.run(until_s=30)
    statuses = [(round(t), s, p, none) for t, s, p, none, _ in pol.seen]
    assert statuses[3] == (4, "ready", "dspark-b8", False)
    after = [s for s in statuses if s[0] > 5]
    # draining (old profile, still scraped), then down (new profile, no /metrics), then ready
    kinds = [s[1] for s in after]
    assert kinds[0] in ("draining", "down") and "down" in kinds and kinds[-1] == "ready"
    assert all(p == "off" and none for _, s, p, none in after if s == "down")
    assert all(p == "dspark-b8" and not none for _, s, p, none in after if s == "draining")
    down = [t for t, s, *_ in after if s == "down"]
    assert 3 <= len(down) <= 5  # 4 s of downtime, seen at 1 s ticks
    assert sim.restarts == [(5.0, "r0", "off")]
    assert all(r == {"r0"} for t, s, p, n, r in pol.seen if s != "ready")
    # nothing admitted to r0 between the restart and its return; its new engine does not speculate
    back = min(t for t, s, *_ in after if s == "ready")
    r0 = [r for r in rep.records if r.replica == "r0"]
    assert not [r for r in r0 if 5.0 < r.arrival_s < back - 1.0]
    assert all(r.spec_steps == 0 for r in r0 if r.arrival_s >= back)
    assert any(r.arrival_s >= back for r in r0)
    # the report's counters add the retired engine's to the new one's
    assert rep.drafts >= sum(r.spec_steps for r in r0 if r.finish_s <= 5.0)
    with pytest.raises(ValueError):
        sim.restart_replica("r1", "no-such-profile", 1.0)


def test_requests_wait_for_the_only_replica_to_come_back():
    pol = RestartAt("r0", "dspark-b4", at=2, downtime_s=5.0)
    sim = Simulation([EngineConfig(name="r0", profile="off")], ClosedLoopSource(4, GSM, seed=3), pol, seed=1)
    rep = sim.run(until_s=25)
    back = min(t for t, s, *_ in pol.seen if t > 2 and s == "ready")
    late = [r for r in rep.records if r.arrival_s > 2.5]
    assert late and all(r.first_token_s >= back - 1.0 for r in late)
    assert any(r.spec_steps > 0 for r in rep.records if r.arrival_s >= back)


def test_an_idle_replica_goes_down_at_once_and_cannot_restart_twice():
    sim = Simulation([EngineConfig(name="r0", profile="off")], OpenLoopSource([]))
    sim.restart_replica("r0", "dspark-b8-av", 10.0)
    v = sim.replica_views()["r0"]
    assert (v.status, v.profile, sim.snapshot("r0"), sim.restarting()) == ("down", "dspark-b8-av", None, {"r0"})
    with pytest.raises(ValueError):
        sim.restart_replica("r0", "off", 1.0)
    with pytest.raises(KeyError):
        sim.restart_replica("nope", "off", 1.0)


def test_an_ngram_fleet_advertises_its_knobs_and_its_tenants_telemetry_shows_the_lookup():
    """What a controller sees of ngram replicas: the plugin's knobs (no confidence floor), and per
    tenant the lookup's proposal rate (fewer speculation steps per decode step for sampled chat than
    for code) and acceptance."""
    tenants = [TenantSpec("code", "code", output_mean=120), TenantSpec("chat", "chat", output_mean=120)]
    sim = Simulation([EngineConfig(name="n", profile="ngram-k4")], ClosedLoopSource(8, tenants, seed=3), seed=1)
    sim.run(until_s=20)
    snap = sim.snapshot("n")
    assert snap.ext_knobs == frozenset(advertised_knobs("ngram", False)) == {"max_draft", "max_batch", "schedule"}
    code, chat = sim.tenant_counters[("code", "n")], sim.tenant_counters[("chat", "n")]
    assert code["spec_requests"] == code["requests"] > 0 and chat["spec_requests"] == chat["requests"] > 0
    # decode steps = tokens after each request's first, less the accepted drafts (a step emits 1 + accepted)
    rate = {t: c["num_spec_steps"] / (c["completion_tokens"] - c["requests"] - c["num_accepted_draft_tokens"])
            for t, c in (("code", code), ("chat", chat))}
    assert rate["code"] == pytest.approx(0.378, abs=0.05) and rate["chat"] < 0.7 * rate["code"]
    al = {t: 1 + c["num_accepted_draft_tokens"] / c["num_spec_steps"] for t, c in (("code", code), ("chat", chat))}
    assert al["code"] > 2.0 and al["chat"] < 1.05
    assert snap.spec_num_drafts >= code["num_spec_steps"] + chat["num_spec_steps"]  # + requests still running
