"""Table-driven tests of the pure decision across regimes, plus hysteresis.

The cost model is the real `drafters.costmodel` roofline (H200 + Qwen3-8B);
tenants are described by their conditional per-position acceptance a.
"""

from __future__ import annotations

import math
import random

import pytest

from controller.costs import RooflineCost
from controller.decision import DecisionConfig, GoodputModel, ReplicaInput, TenantState, TenantView, decide
from contract.knobs import cap_at, schedule_cap
from contract.overrides import TenantOverride

CODE, CHAT, POOR = 0.88, 0.55, 0.15  # conditional acceptance per position


def replica(batch, mix, profile="dspark-b16", block=16, adaptive=False, knobs=True, name="r1", **kw):
    return ReplicaInput(name, profile, block, adaptive, knobs, RooflineCost.for_names("h200", "qwen3-8b"), batch=batch,
                       context_tokens=1024, mix=mix, **kw)


def fleet(batch, mix, profile="dspark-b16", block=16, adaptive=False):
    """A speculative replica plus an `off` pool (where k=0 tenants are routed)."""
    return [replica(batch, mix, profile=profile, block=block, adaptive=adaptive),
            replica(batch, mix, profile="off", block=0, name="plain")]


def cap(p, batch=None, block=16):
    """Effective draft cap of a policy (None = no cap = the replica's block) in a step of
    `batch` requests (its schedule's entry and load threshold; None: the cap alone)."""
    if not p.enabled:
        return 0
    if batch is not None:
        k = cap_at(p.max_draft, p.max_batch, math.ceil(batch), p.schedule)
        return block if k is None else min(k, block)
    return block if p.max_draft is None else p.max_draft


def tenants(**acc):
    return [TenantView(t, a, 10_000) for t, a in acc.items()]


CASES = [
    # id, batch, mix, tenants, expectations {tenant: (enabled, min_k, max_k)}
    ("idle-memory-bound", 1, {"code": 1.0}, dict(code=CODE), {"code": (True, 8, 16)}),
    ("low-load-both-on", 2, {"code": 0.5, "chat": 0.5}, dict(code=CODE, chat=CHAT), {"code": (True, 8, 16), "chat": (True, 2, 16)}),
    ("poor-drafter-alone-off", 1, {"poor": 1.0}, dict(poor=POOR), {"poor": (False, 0, 0)}),
    ("mid-load-code-longer", 8, {"code": 0.5, "chat": 0.5}, dict(code=CODE, chat=CHAT), {"code": (True, 8, 16), "chat": (True, 2, 4)}),
    # Chat drafts short beside code before it stops: left at one token a step its
    # requests would fill the batch (goodput.batch_shares).
    ("mid-high-chat-short-code-long", 16, {"code": 0.5, "chat": 0.5}, dict(code=CODE, chat=CHAT), {"code": (True, 4, 16), "chat": (True, 1, 2)}),
    ("high-chat-off-code-on", 24, {"code": 0.5, "chat": 0.5}, dict(code=CODE, chat=CHAT), {"code": (True, 4, 16), "chat": (False, 0, 0)}),
    ("compute-bound-chat-off", 128, {"code": 0.5, "chat": 0.5}, dict(code=CODE, chat=CHAT), {"code": (None, 0, 2), "chat": (False, 0, 0)}),
    ("compute-bound-all-off", 128, {"chat": 0.5, "poor": 0.5}, dict(chat=CHAT, poor=POOR), {"chat": (False, 0, 0), "poor": (False, 0, 0)}),
    ("very-high-load-off", 256, {"code": 1.0}, dict(code=CODE), {"code": (False, 0, 0)}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_regime_table(case):
    _, batch, mix, acc, expect = case
    d = decide(fleet(batch, mix), tenants(**acc), {}, {}, now=0.0)
    for tenant, (enabled, lo, hi) in expect.items():
        p = d.policies[tenant]
        assert enabled is None or p.enabled is enabled, (tenant, p)
        k = cap(p, batch)
        assert lo <= k <= hi, (tenant, p, d.records)
        if not p.enabled:
            assert p.preferred_profile == "off"
        rec = next(r for r in d.records if r.tenant == tenant)
        assert rec.reason and "rho=" in rec.reason and "gain_vs_off=" in rec.reason
        assert set(rec.numbers) >= {"k", "acceptance", "gain_vs_off", "goodput_by_k", "rho", "predicted_tpot_ms"}
    reg = d.replicas["r1"]
    if batch >= 128:
        assert reg.rho >= 0.3


def test_code_tenant_gets_longer_draft_than_chat_tenant():
    d = decide(fleet(8, {"code": 0.5, "chat": 0.5}), tenants(code=CODE, chat=CHAT), {}, {}, now=0.0)
    assert cap(d.policies["code"], 8) > cap(d.policies["chat"], 8)
    # ... at every batch size where either drafts, in the same steps (their schedules).
    for batch in (1, 4, 8, 16, 24):
        assert cap(d.policies["code"], batch) >= cap(d.policies["chat"], batch), batch


def test_confidence_floor_rises_with_load():
    """Floors only exist on -av replicas (the confidence head runs only there).
    theta* = G * c_m rises with load; it is published only when it beats no
    floor (theta_min_gain), which a lone tenant's cap already subsumes."""
    av = dict(profile="dspark-b16-av", adaptive=True)

    def run(batch, cfg=DecisionConfig()):
        d = decide([replica(batch, {"code": 1.0}, **av)], tenants(code=CODE), {}, {}, now=0.0, cfg=cfg)
        return d.policies["code"], next(r for r in d.records if r.tenant == "code").numbers

    (lo, lo_n), (hi, hi_n) = run(2), run(24)
    assert (lo_n["theta_star"] or 0.0) < (hi_n["theta_star"] or 0.0)
    assert lo.min_confidence is None and hi.min_confidence is None  # a floor on top of the cap gains nothing
    always = DecisionConfig(theta_min_gain=-1.0)  # publish theta* whatever it is predicted to gain
    assert (run(2, always)[0].min_confidence or 0.0) < (run(24, always)[0].min_confidence or 0.0)


def test_max_batch_is_where_everyone_off_starts_to_win():
    """The load threshold sent with a drafting policy (specgate_max_batch) lies
    at or above today's batch, where the decision still drafts (it may retune
    the caps there, with a threshold of their own), and well below the batch
    at which it turns speculation off; off policies carry none."""
    mix = {"code": 0.5, "chat": 0.5}
    cfg = DecisionConfig(schedule_grid=None)  # with schedules, their zeros say where drafting stops
    low = decide([replica(4, mix)], tenants(code=CODE, chat=CHAT), {}, {}, now=0.0, cfg=cfg)
    mb = low.policies["code"].max_batch
    assert mb is not None and mb >= 4
    at = decide([replica(mb, mix)], tenants(code=CODE, chat=CHAT), {}, {}, now=0.0, cfg=cfg)
    assert at.policies["code"].enabled and at.policies["code"].max_batch >= mb
    high = decide([replica(4 * mb, mix)], tenants(code=CODE, chat=CHAT), {}, {}, now=0.0, cfg=cfg)
    assert all(not p.enabled and p.max_batch is None for t, p in high.policies.items()), high.policies
    assert decide([replica(4, mix)], tenants(code=CODE, chat=CHAT), {}, {}, now=0.0,
                  cfg=DecisionConfig(max_batch_grid=None, schedule_grid=None)).policies["code"].max_batch is None
    pinned = decide([replica(4, mix)], tenants(code=CODE, chat=CHAT), {}, {"code": TenantOverride(mode="on")}, now=0.0,
                    cfg=cfg)
    assert pinned.policies["code"].max_batch is None  # pinned on = on at any load


def test_no_knob_replicas_steer_to_off_pool():
    reps = [
        replica(128, {"chat": 1.0}, knobs=False, name="spec"),
        replica(128, {"chat": 1.0}, profile="off", block=0, knobs=False, name="plain"),
    ]
    p = decide(reps, tenants(chat=CHAT), {}, {}, now=0.0).policies["chat"]
    assert not p.enabled and p.preferred_profile == "off"


def test_adaptive_verification_replica_keeps_speculation_longer():
    """AV trims verification itself, so at mid load it keeps more gain than static."""
    static = decide([replica(24, {"chat": 1.0})], tenants(chat=CHAT), {}, {}, now=0.0)
    av = decide([replica(24, {"chat": 1.0}, profile="dspark-b16-av", adaptive=True)], tenants(chat=CHAT), {}, {}, now=0.0)
    g = lambda d: max(float(v) for v in d.records[-1].numbers["goodput_by_k"].values())  # noqa: E731
    assert g(av) >= g(static) * 0.999


def test_slo_tenant_keeps_speculation_when_affordable():
    # At this load the goodput optimum for a chat-like tenant is a short draft
    # or none; a tight TPOT target buys it a longer one if the fleet can afford it.
    reps = [replica(24, {"slo": 0.2, "chat": 0.8})]
    free = decide(reps, [TenantView("slo", CODE, 10_000), TenantView("chat", CHAT, 10_000)], {}, {}, now=0.0)
    tight = decide(reps, [TenantView("slo", CODE, 10_000, tpot_target_ms=2.0), TenantView("chat", CHAT, 10_000)], {}, {}, now=0.0)
    t_free = next(r for r in free.records if r.tenant == "slo").numbers["predicted_tpot_ms"]
    t_tight = next(r for r in tight.records if r.tenant == "slo").numbers["predicted_tpot_ms"]
    assert tight.policies["slo"].enabled
    assert t_tight <= t_free + 1e-9
    rec = next(r for r in tight.records if r.tenant == "slo")
    assert rec.numbers["tpot_target_ms"] == 2.0


@pytest.mark.parametrize(
    "override,batch,check",
    [
        (TenantOverride(mode="off"), 1, lambda p: not p.enabled),
        (TenantOverride(mode="on"), 256, lambda p: p.enabled and cap(p) >= 1),
        (TenantOverride(mode="auto", max_draft_max=4), 1, lambda p: p.enabled and p.max_draft <= 4),
        (TenantOverride(mode="on", max_draft_min=8, min_confidence_max=0.1), 16, lambda p: cap(p) >= 8 and (p.min_confidence or 0) <= 0.1),
    ],
)
def test_overrides_win(override, batch, check):
    # Start from an established opposite state: the override must apply at once.
    d0 = decide(fleet(batch, {"code": 1.0}), tenants(code=CODE), {}, {}, now=0.0)
    d = decide(fleet(batch, {"code": 1.0}), tenants(code=CODE), d0.state, {"code": override}, now=0.1)
    p = d.policies["code"]
    assert check(p), p
    assert p.source == "admin"


def test_without_an_off_pool_knobs_switch_speculation_off():
    """No off pool to route to: on a knob-capable replica k=0 for everyone runs
    its steps at K=0 (drafters.vllm_ext), which skips the drafter too, so a
    compute-bound batch turns speculation off in place (without schedules: with
    them the schedule stops drafting there instead, below); with an off pool the
    tenant is sent there instead."""
    d = decide([replica(256, {"chat": 1.0})], tenants(chat=CHAT), {}, {}, now=0.0, cfg=DecisionConfig(schedule_grid=None))
    p = d.policies["chat"]
    assert not p.enabled and p.max_draft == 0
    d = decide(fleet(256, {"chat": 1.0}), tenants(chat=CHAT), {}, {}, now=0.0)
    assert not d.policies["chat"].enabled and d.policies["chat"].preferred_profile == "off"


def test_one_drafting_tenant_keeps_the_drafter_running_for_the_batch():
    """The drafter pass is shared: while one tenant on a replica drafts, the pass
    is paid for the whole batch, so turning a second tenant off saves only its
    verification -- the model must price that, not the K=0 saving."""
    rep = replica(64, {"code": 0.5, "chat": 0.5})
    model = GoodputModel({"code": CODE, "chat": CHAT}, 0.7)
    one_off = model.evaluate(rep, {"code": 16, "chat": 0, "*": 16}).step_s
    both_on = model.evaluate(rep, {"code": 16, "chat": 16, "*": 16}).step_s
    both_off = model.evaluate(rep, {"code": 0, "chat": 0, "*": 0}).step_s
    plain = model.evaluate(replica(64, {"code": 0.5, "chat": 0.5}, profile="off", block=0), {"code": 0, "chat": 0, "*": 0}).step_s
    drafter = RooflineCost.for_names("h200", "qwen3-8b").step_time_s(64, 64, 16, 1024) - \
        RooflineCost.for_names("h200", "qwen3-8b").step_time_s(64, 64, 0, 1024)
    assert drafter > 0
    assert both_off == pytest.approx(plain)  # K=0: no drafter, an off replica's step
    assert one_off - both_off >= drafter * 0.99  # one drafter keeps the whole pass
    assert both_on > one_off  # and the other's verification still costs


def _run(batches, cfg, acc=CHAT, dt=1.0):
    state: dict[str, TenantState] = {}
    policies = []
    changes = 0
    for i, b in enumerate(batches):
        d = decide(fleet(b, {"t": 1.0}), [TenantView("t", acc, 10_000)], state, {}, now=i * dt, cfg=cfg)
        state = d.state
        changes += sum(1 for r in d.changes if r.tenant == "t") if i else 0
        policies.append(d.policies["t"])
    return policies, changes


def test_weak_change_needs_confirmation_and_dwell():
    """The cap's own hysteresis, without schedules (with them the engine meets the
    load at once: test_a_schedule_meets_a_load_step_without_a_policy_change)."""
    cfg = DecisionConfig(confirm_ticks=3, min_dwell_s=5.0, strong_margin=10.0, schedule_grid=None)  # nothing strong
    batches = [2] * 3 + [16] * 10
    policies, _ = _run(batches, cfg)
    before = cap(policies[2])
    # Load changed at tick 3: the new choice appears only after 3 confirmations and dwell.
    changed_at = next(i for i, p in enumerate(policies) if cap(p) != before)
    assert changed_at >= 3 + cfg.confirm_ticks - 1
    assert changed_at >= 5  # dwell since the first decision at t=0


def test_strong_turn_off_acts_within_two_ticks_despite_dwell():
    cfg = DecisionConfig(confirm_ticks=5, min_dwell_s=60.0)
    policies, _ = _run([1] * 3 + [256] * 3, cfg, acc=CHAT)
    assert policies[2].enabled and policies[3].enabled and not policies[4].enabled


def test_turn_back_on_waits_for_dwell_and_confirmation():
    cfg = DecisionConfig(confirm_ticks=2, min_dwell_s=5.0)
    policies, _ = _run([1] * 3 + [256] * 3 + [1] * 10, cfg, acc=CHAT)
    assert not policies[5].enabled
    back_on = next(i for i, p in enumerate(policies) if i > 5 and p.enabled)
    assert back_on >= 4 + 5  # off at tick 4, dwell 5 s


def test_no_flap_under_noisy_signals():
    """Batch size jitters +-35 % around a level where two choices are close."""
    rng = random.Random(7)
    cfg = DecisionConfig(min_dwell_s=10.0)
    for level in (6, 12, 20, 32):
        batches = [max(1, round(level * (1 + rng.uniform(-0.35, 0.35)))) for _ in range(300)]
        _, changes = _run(batches, cfg)
        assert changes <= 3, (level, changes)


def test_flaps_without_hysteresis_for_contrast():
    """The same noise with hysteresis disabled does change often (the test can fail)."""
    rng = random.Random(7)
    cfg = DecisionConfig(min_dwell_s=0.0, confirm_ticks=1, on_margin=0.0, off_margin=0.0, retune_margin=0.0,
                         thin_extra_margin=0.0, theta_min_change=0.0, smoothing=1.0, strong_ticks=1,
                         schedule_grid=None)  # a schedule covers the jitter: the policy would not move
    batches = [max(1, round(12 * (1 + rng.uniform(-0.35, 0.35)))) for _ in range(300)]
    _, changes = _run(batches, cfg)
    assert changes > 10


def test_decide_is_pure():
    reps = fleet(12, {"code": 0.5, "chat": 0.5})
    ts = tenants(code=CODE, chat=CHAT)
    a = decide(reps, ts, {}, {}, now=3.0)
    b = decide(reps, ts, {}, {}, now=3.0)
    assert a.policies == b.policies and [r.numbers for r in a.records] == [r.numbers for r in b.records]


def test_no_replica_at_all_is_a_decision_not_a_crash():
    """Every replica down (none scraped healthy): the tick still decides and
    records an undefined predicted TPOT instead of dividing by zero."""
    d = decide([], tenants(code=CODE, chat=CHAT), {}, {}, now=0.0)
    assert {"code", "chat"} <= set(d.policies)
    assert all(r.numbers["predicted_tpot_ms"] is None for r in d.records)


def _closed_loop(loads, cfg=DecisionConfig()):
    """Ticks of a fleet whose traffic follows the published policies as the
    gateway routes it: chat (60 % of the requests) and code spread over two
    dspark-b8 replicas and the off replica while they speculate, wholly on the
    off replica while they do not. Returns chat's `enabled` per tick."""
    shares, names = {"chat": 0.6, "code": 0.4}, ("s1", "s2", "plain")
    state: dict[str, TenantState] = {}
    policies: dict = {}
    chat_on = []
    for i, total in enumerate(loads):
        per: dict[str, dict[str, float]] = {n: {} for n in names}
        for t, share in shares.items():
            dest = names if t not in policies or policies[t].enabled else ("plain",)
            for n in dest:
                per[n][t] = total * share / len(dest)
        reps = []
        for n in names:
            b = sum(per[n].values())
            profile, block = ("off", 0) if n == "plain" else ("dspark-b8", 8)
            reps.append(replica(b, {t: v / b for t, v in per[n].items()} if b else {}, profile=profile, block=block, name=n))
        d = decide(reps, tenants(chat=CHAT, code=CODE), state, {}, now=float(i), cfg=cfg)
        state, policies = d.state, d.policies
        chat_on.append(policies["chat"].enabled)
    return chat_on


def test_a_tenant_parked_on_the_off_pool_comes_back_when_the_load_drops():
    """Switched off under load, a tenant's traffic sits wholly on the off
    replica, where no cap gains anything; priced there, it stayed off for
    good after the load dropped (seen in `specgate load`'s step workload).
    Priced where speculating would route it, it comes back at once -- and
    under load the off pool's relief is not mistaken for a speculation gain
    (no on-off flapping while the load stays)."""
    light, heavy = [6] * 15, [400] * 30
    chat_on = _closed_loop(light + heavy + light)
    assert all(chat_on[:15])
    heavy_part = chat_on[15:45]
    assert not heavy_part[-1] and sum(a != b for a, b in zip(heavy_part, heavy_part[1:])) <= 1  # off once, stays off
    assert chat_on[-1] and chat_on.index(True, 45) <= 45 + 5


def test_a_schedule_meets_a_load_step_without_a_policy_change():
    """Load 2 -> 16 (as above): the schedule published at load 2 already holds the
    draft length for 16, which the engine applies at the next step, and the policy
    does not change for the load step (the cap at today's batch moves with the
    hysteresis, but the schedule covers both loads)."""
    cfg = DecisionConfig(confirm_ticks=3, min_dwell_s=5.0, strong_margin=10.0)
    batches = [2] * 3 + [16] * 10
    policies, changes = _run(batches, cfg)
    first = policies[2]
    assert first.schedule is not None and cap(first, 2) > cap(first, 16) > 0
    # Where the cap's hysteresis ends up at load 16 is what the schedule drafted there from the start.
    assert cap(policies[-1], 16) == cap(first, 16)
    assert all(p.schedule == first.schedule for p in policies[3:])
    assert changes == 0


def test_schedules_are_monotone_per_tenant_and_absent_where_no_drafting_pays():
    d = decide(fleet(4, {"code": 0.5, "chat": 0.5}), tenants(code=CODE, chat=CHAT), {}, {}, now=0.0)
    for t in ("code", "chat"):
        schedule = d.policies[t].schedule
        assert schedule is not None, t
        drafts = [k for _, k in schedule]
        assert drafts == sorted(drafts, reverse=True) and [b for b, _ in schedule] == sorted(b for b, _ in schedule)
        rec = next(r for r in d.records if r.tenant == t)
        assert rec.numbers["schedule"] == [list(p) for p in schedule]
        assert d.policies[t].max_batch is None  # where it stops drafting is the schedule's business
    poor = decide(fleet(1, {"poor": 1.0}), tenants(poor=POOR), {}, {}, now=0.0).policies["poor"]
    assert not poor.enabled and poor.schedule is None
    # No schedule without a grid, or on a replica without the plugin's knobs.
    assert decide(fleet(4, {"code": 1.0}), tenants(code=CODE), {}, {}, now=0.0,
                  cfg=DecisionConfig(schedule_grid=None)).policies["code"].schedule is None
    plain = [replica(4, {"code": 1.0}, knobs=False)]
    assert decide(plain, tenants(code=CODE), {}, {}, now=0.0).policies["code"].schedule is None


def test_a_changed_schedule_waits_for_its_dwell_unless_the_tenant_turns_on_or_off():
    cfg = DecisionConfig(schedule_dwell_s=60.0)
    reps = fleet(8, {"code": 1.0})
    first = decide(reps, tenants(code=CODE), {}, {}, now=0.0, cfg=cfg)
    # The acceptance estimate moves (slow input): the schedule the model now wants differs.
    later = [TenantView("code", 0.6, 10_000)]
    early = decide(reps, later, first.state, {}, now=10.0, cfg=cfg)
    wanted = decide(reps, later, {}, {}, now=0.0, cfg=cfg).policies["code"].schedule
    assert wanted != first.policies["code"].schedule
    assert early.policies["code"].schedule == first.policies["code"].schedule  # inside the dwell
    late = decide(reps, later, first.state, {}, now=61.0, cfg=cfg)
    assert late.policies["code"].schedule == wanted
    gain = next(r for r in late.records if r.tenant == "code").numbers["schedule_gain"]
    assert gain >= cfg.retune_margin  # it pays at the batches the replicas run (8 requests a step)


def test_past_its_dwell_a_schedule_that_differs_strongly_at_another_load_is_published():
    """At 2 requests a step a tenant's schedule from its first tick (acceptance 0.4: it
    stops drafting above 8) and the one its measured acceptance now wants (0.88: it
    drafts up to 48) run alike, so today's gain is 0; at the batches between they differ
    by far more than the strong margin, and the requests admitted when the load gets
    there keep what they were sent, so it is published once the dwell has passed."""
    cfg = DecisionConfig(schedule_dwell_s=60.0)
    reps = [replica(2, {"code": 1.0})]
    first = decide(reps, [TenantView("code", 0.4, 10_000)], {}, {}, now=0.0, cfg=cfg)
    measured = [TenantView("code", CODE, 10_000)]
    wanted = decide(reps, measured, {}, {}, now=0.0, cfg=cfg).policies["code"].schedule
    assert cap(first.policies["code"], 24) == 0 < schedule_cap(wanted, 24)
    early = decide(reps, measured, first.state, {}, now=30.0, cfg=cfg)
    assert early.policies["code"].schedule == first.policies["code"].schedule  # inside the dwell
    late = decide(reps, measured, first.state, {}, now=100.0, cfg=cfg)
    record = next(r for r in late.records if r.tenant == "code")
    assert record.numbers["schedule_gain"] < cfg.retune_margin  # nothing gained where it acts now
    assert record.numbers["schedule_gain_elsewhere"] >= cfg.strong_margin
    assert late.policies["code"].schedule == wanted and record.changed


def test_a_recomputed_schedule_that_gains_little_where_it_acts_now_is_not_published():
    """A schedule recomputed from slightly moved inputs differs by a grid step
    somewhere; past the dwell it still replaces the one in force only where it
    gains the retune margin at today's batches."""
    cfg = DecisionConfig(schedule_dwell_s=60.0)
    reps = fleet(8, {"code": 1.0})
    first = decide(reps, tenants(code=CODE), {}, {}, now=0.0, cfg=cfg)
    better = [TenantView("code", 0.92, 10_000)]  # longer drafts now pay, but little at 8 requests a step
    wanted = decide(reps, better, {}, {}, now=0.0, cfg=cfg).policies["code"].schedule
    assert wanted != first.policies["code"].schedule
    late = decide(reps, better, first.state, {}, now=200.0, cfg=cfg)
    assert late.policies["code"].schedule == first.policies["code"].schedule
    record = next(r for r in late.records if r.tenant == "code")
    assert 0 < record.numbers["schedule_gain"] < cfg.retune_margin and not record.changed
    # The margin is the knob: with none, the same tick publishes it.
    eager = decide(reps, better, first.state, {}, now=200.0, cfg=cfg.model_copy(update={"retune_margin": 0.0}))
    assert eager.policies["code"].schedule == wanted


def test_the_load_alone_never_turns_a_tenant_on_or_off_under_schedules():
    """Knob-capable replicas, no off pool: each drafting tenant's schedule stops
    where drafting stops paying, so a tenant's on/off is priced where drafting
    pays it and a compute-bound tick leaves it on, drafting nothing there;
    without schedules (or with an off pool) that tick switches it off."""
    views = tenants(code=CODE, chat=CHAT)
    light = decide([replica(2, {"code": 0.5, "chat": 0.5})], views, {}, {}, now=0.0)
    heavy = decide([replica(256, {"code": 0.5, "chat": 0.5})], views, {}, {}, now=0.0)
    for t in ("code", "chat"):
        assert light.policies[t].enabled and heavy.policies[t].enabled, t
        assert light.policies[t].schedule == heavy.policies[t].schedule, t
        assert cap(heavy.policies[t], 256) == 0 and max(cap(light.policies[t], b) for b in (1, 2, 4)) > 0, t
    # A heavy tick after a light one keeps every tenant on.
    after = decide([replica(256, {"code": 0.5, "chat": 0.5})], views, light.state, {}, now=100.0)
    assert all(after.policies[t].enabled for t in ("code", "chat"))
    old = decide([replica(256, {"code": 0.5, "chat": 0.5})], views, {}, {}, now=0.0, cfg=DecisionConfig(schedule_grid=None))
    assert not old.policies["chat"].enabled


@pytest.mark.parametrize("target_ms", [1e6, 1e-3], ids=["met-by-the-optimum", "unreachable"])
def test_a_tpot_target_that_chooses_no_cap_leaves_on_off_where_drafting_pays(target_ms):
    """A TPOT target is about today's batch, and where it chooses nothing there (the
    goodput optimum meets it, or no affordable cap does) the tenant's on/off is priced
    where drafting pays, as an untargeted tenant's: a compute-bound tick leaves it on,
    drafting nothing there, so the requests admitted now draft once the batch falls.
    Priced at today's batch instead, every tenant of the simulated trace (all of which
    carry targets) was switched off at c=256, and the requests admitted then ran the
    c=16 phase after it undrafted."""
    views = [TenantView("code", CODE, 10_000, tpot_target_ms=target_ms),
             TenantView("chat", CHAT, 10_000, tpot_target_ms=target_ms)]
    light = decide([replica(2, {"code": 0.5, "chat": 0.5})], views, {}, {}, now=0.0)
    heavy = decide([replica(256, {"code": 0.5, "chat": 0.5})], views, {}, {}, now=0.0)
    for t in ("code", "chat"):
        assert heavy.policies[t].enabled and heavy.policies[t].schedule is not None, t
        assert heavy.policies[t].schedule == light.policies[t].schedule, t
        assert cap(heavy.policies[t], 256) == 0 and max(cap(heavy.policies[t], b) for b in (1, 2, 4)) > 0, t


def test_a_tpot_target_that_moves_the_cap_today_decides_at_today_s_batch_without_a_schedule():
    """Where the target does choose (a longer draft keeps the tenant inside it at
    affordable cost), that choice stands at today's batch: the schedule knows no
    targets, so the tenant gets none."""
    reps = [replica(24, {"slo": 0.2, "chat": 0.8})]
    free = decide(reps, [TenantView("slo", CODE, 10_000), TenantView("chat", CHAT, 10_000)], {}, {}, now=0.0)
    k_free = cap(free.policies["slo"], 24)
    t_free = next(r for r in free.records if r.tenant == "slo").numbers["predicted_tpot_ms"]
    # A target just under the free choice's TPOT: the SLO must buy a longer draft.
    tight = decide(reps, [TenantView("slo", CODE, 10_000, tpot_target_ms=0.97 * t_free),
                          TenantView("chat", CHAT, 10_000)], {}, {}, now=0.0)
    p = tight.policies["slo"]
    rec = next(r for r in tight.records if r.tenant == "slo")
    assert p.enabled and p.schedule is None and cap(p, 24) > k_free
    assert rec.numbers["predicted_tpot_ms"] <= 0.97 * t_free


def test_reason_prints_the_acceptance_the_decision_priced_not_the_overall_estimate():
    """A tenant measured at 0.88 on DSpark replicas but 0.30 overall (its ngram history):
    the decision prices DSpark at 0.88, and the reason's `a=` must say so."""
    view = TenantView("code", 0.30, 10_000, by_method={"dspark": CODE, "ngram": 0.30})
    d = decide(fleet(8, {"code": 1.0}), [view], {}, {}, now=0.0)
    assert "a=0.88" in d.policies["code"].reason
    assert "a=0.30" not in d.policies["code"].reason
