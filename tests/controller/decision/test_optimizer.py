"""The joint choice of caps: allowed caps (admin bounds), ascent, TPOT and SLO."""

from __future__ import annotations

import pytest

from contract.overrides import TenantOverride
from controller.acceptance_fit import tokens_per_step
from controller.decision import FULL, TenantView

from .common import CHAT, CODE, POOR, fleet, optimizer, replica, tenants


def test_allowed_caps_without_override_gate_long_drafts_by_load():
    low = optimizer([replica(2, {"code": 1.0})], tenants(code=CODE))
    assert low.allowed_caps("code") == [0, 2, 4, 8, FULL]
    high = optimizer([replica(256, {"code": 1.0})], tenants(code=CODE))
    assert high.allowed_caps("code") == [0, 2, 4, 8]  # survey rule: no long drafts near the knee


@pytest.mark.parametrize(
    "ov,expected",
    [
        (TenantOverride(mode="off"), [0]),
        (TenantOverride(mode="on"), [2, 4, 8]),  # never 0; FULL is above the bounds' 10**6 ceiling
        (TenantOverride(mode="auto", max_draft_max=4), [0, 2, 4]),
        (TenantOverride(mode="auto", max_draft_min=3, max_draft_max=8), [0, 4, 8]),
        (TenantOverride(mode="on", max_draft_min=20), [16]),  # nothing inside: the bound, at most the block
        (TenantOverride(mode="on", max_draft_max=1), [1]),
    ],
)
def test_allowed_caps_follow_the_override(ov, expected):
    opt = optimizer([replica(2, {"code": 1.0})], tenants(code=CODE), overrides={"code": ov})
    assert opt.allowed_caps("code") == expected
    if ov.max_draft_min is None or ov.max_draft_min <= 16:  # else the fallback above
        assert all(ov.allows_cap(k) for k in expected)


def test_pinned_on_without_a_speculative_replica_can_only_stay_off():
    opt = optimizer([replica(2, {"code": 1.0}, profile="off", block=0)], tenants(code=CODE),
                    overrides={"code": TenantOverride(mode="on")})
    assert opt.allowed_caps("code") == [0]


@pytest.mark.parametrize(
    "batch,mix,acc,check",
    [
        (1, {"code": 1.0}, {"code": CODE}, lambda p: p["code"] >= 8),
        (1, {"poor": 1.0}, {"poor": POOR}, lambda p: p["poor"] == 0),
        (256, {"code": 1.0}, {"code": CODE}, lambda p: p["code"] == 0),
        (8, {"code": 0.5, "chat": 0.5}, {"code": CODE, "chat": CHAT}, lambda p: p["code"] > p["chat"] > 0),
    ],
)
def test_propose_follows_regime_and_acceptance(batch, mix, acc, check):
    plan = optimizer(fleet(batch, mix), tenants(**acc)).propose()
    assert check(plan.proposal), plan.proposal
    for t, table in plan.tables.items():
        assert set(table) == set(plan.options[t])
        assert plan.proposal[t] in table


def test_fleet_goodput_prices_a_newcomer_as_a_small_share():
    opt = optimizer([replica(8, {"code": 1.0})], tenants(code=CODE, chat=CHAT))
    choice = {"code": 8, "chat": 8, "*": 8}
    assert opt.fleet_goodput(choice, "chat") != opt.fleet_goodput(choice, "code")
    assert opt.fleet_goodput(choice, "chat", {"chat": None}) == opt.fleet_goodput(choice, "chat")


def test_a_trickle_tenant_is_priced_and_divided_by_the_same_share():
    """A tenant whose traffic decayed to 0.5 % of an idle replica is priced as
    a 5 % participant and its fleet gain divided by 5 %: the improvement the
    hysteresis sees is the tenant's own, the share of its time its drafts save
    (1 - 1/tau: the replica's time freed, `goodput.batch_shares`), not a tenth of it."""
    opt = optimizer([replica(0, {"bulk": 0.995, "code": 0.005})], tenants(bulk=CHAT, code=CODE))
    assert opt.share("code") == pytest.approx(0.05)
    on, off = opt.fleet_goodput({"bulk": 0, "code": 16, "*": 0}, "code"), opt.fleet_goodput({"bulk": 0, "code": 0, "*": 0}, "code")
    own = tokens_per_step(CODE, 16)
    assert (on / off - 1) / opt.share("code") == pytest.approx(1 - 1 / own, rel=0.25)


def test_tpot_and_share():
    opt = optimizer([replica(24, {"slo": 0.2, "chat": 0.8})], tenants(slo=CODE, chat=CHAT))
    assert opt.share("slo") == pytest.approx(0.2) and opt.share("chat") == pytest.approx(0.8)
    short, long = opt.tpot_ms({"slo": 2, "chat": 0, "*": 0}, "slo"), opt.tpot_ms({"slo": 8, "chat": 0, "*": 0}, "slo")
    assert long < short  # a code-like tenant's own tokens come faster with longer drafts


def test_slo_choice_buys_a_longer_draft_only_when_affordable():
    reps = [replica(24, {"slo": 0.2, "chat": 0.8})]
    ts = [TenantView("slo", CODE, 10_000, tpot_target_ms=2.0), TenantView("chat", CHAT, 10_000)]
    opt = optimizer(reps, ts)
    plan = opt.propose()
    table = plan.tables["slo"]
    k, note = opt.slo_choice("slo", plan.proposal["slo"], table, 2.0, plan.proposal)
    assert table[k] >= 0.9 * table[plan.proposal["slo"]]
    assert opt.tpot_ms({**plan.proposal, "slo": k}, "slo") <= opt.tpot_ms(plan.proposal, "slo")
    assert note == "" or "SLO 2ms" in note
    same, why = opt.slo_choice("slo", plan.proposal["slo"], table, 0.01, plan.proposal)
    assert same == plan.proposal["slo"] and "unreachable" in why


def test_tenant_proposal_prices_off_and_current():
    opt = optimizer(fleet(8, {"code": 0.5, "chat": 0.5}), tenants(code=CODE, chat=CHAT),
                    overrides={"chat": TenantOverride(mode="auto", max_draft_max=4)})
    plan = opt.propose()
    fresh = opt.tenant_proposal("code", plan, -1)
    assert fresh.g_cur == 0.0 and fresh.g_off == plan.tables["code"][0] and fresh.pinned is None
    held = opt.tenant_proposal("code", plan, 4)
    assert held.g_cur == plan.tables["code"][4]
    off_table = opt.tenant_proposal("chat", plan, 16)  # 16 is not in chat's bounded table: priced directly
    assert off_table.pinned == "auto" and 16 not in off_table.allowed and off_table.g_cur > 0
