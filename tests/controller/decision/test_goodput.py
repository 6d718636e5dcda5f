"""The goodput evaluator on its own: one replica, one joint choice of caps."""

from __future__ import annotations

import pytest

from controller.acceptance_fit import Proposal, expected_accepted, method_proposal, tokens_per_step
from controller.decision import effective_cap, regime_label, replica_load, run_batch
from controller.decision.goodput import batch_shares

from .common import CHAT, CODE, model, replica


def test_effective_cap_follows_block_and_knobs():
    assert effective_cap(replica(4, {}), 4) == 4
    assert effective_cap(replica(4, {}), 64) == 16  # capped at the block
    assert effective_cap(replica(4, {}, profile="off", block=0), 8) == 0
    assert effective_cap(replica(4, {}, knobs=False), 2) == 16  # no knobs: the whole block
    assert effective_cap(replica(4, {}, knobs=False), 0) == 0


def test_load_counts_the_queue_and_idle_runs_as_one():
    assert replica_load(replica(4, {}, waiting=3)) == 7
    assert run_batch(replica(0, {})) == 1.0
    assert regime_label(0.3) == "memory-bound" and regime_label(0.8) == "near-knee" and regime_label(1.5) == "compute-bound"


def test_speculation_pays_memory_bound_and_costs_compute_bound():
    m = model()
    for batch, spec_wins in ((2, True), (256, False)):
        rep = replica(batch, {"code": 1.0})
        on, off = m.goodput(rep, {"code": 16, "*": 16}), m.goodput(rep, {"code": 0, "*": 0})
        assert (on > off) is spec_wins, (batch, on, off)


def test_missing_tenants_take_the_default_cap_and_fleet_acceptance():
    m = model(acc={}, fleet_a=CODE)
    rep = replica(4, {"newcomer": 1.0})
    assert m.evaluate(rep, {"*": 8}) == m.evaluate(rep, {"newcomer": 8, "*": 8})
    assert m.evaluate(rep, {}).taus["newcomer"] == 1.0  # no default cap: no drafting


def test_off_pool_charges_the_drafter_only_for_the_drafting_share():
    rep = replica(64, {"code": 0.5, "chat": 0.5})
    choice = {"code": 16, "chat": 0, "*": 16}
    pooled, in_place = model(off_pool=True).evaluate(rep, choice), model().evaluate(rep, choice)
    assert pooled.step_s < in_place.step_s  # the chat half is routed away, its drafter share with it
    assert pooled.taus == in_place.taus


def test_floor_only_binds_on_adaptive_replicas():
    choice = {"chat": 16, "*": 16}
    floored = model(thetas={"chat": 0.3})
    static = replica(8, {"chat": 1.0})
    av = replica(8, {"chat": 1.0}, profile="dspark-b16-av", adaptive=True)
    assert floored.evaluate(static, choice) == model().evaluate(static, choice)
    assert floored.evaluate(av, choice).verify_tokens < model().evaluate(av, choice).verify_tokens


def test_prefill_slows_the_steps():
    rep = replica(16, {"code": 1.0})
    base = model().evaluate(rep, {"code": 8, "*": 8})
    with_prefill = model().evaluate(replica(16, {"code": 1.0}, prefill_ratio=2.0), {"code": 8, "*": 8})
    assert with_prefill.step_s > base.step_s
    assert with_prefill.verify_tokens > base.verify_tokens
    assert base.goodput == pytest.approx(16 * base.taus["code"] / base.step_s)


def test_with_thetas_is_a_variant_not_a_mutation():
    m = model()
    v = m.with_thetas({"code": 0.5})
    assert m.thetas == {} and v.thetas == {"code": 0.5} and v.acc is m.acc
    assert CHAT in m.acc.values()


def test_each_replica_is_priced_with_the_acceptance_of_its_method():
    ngram = replica(4, {"code": 1.0}, profile="ngram-k8", block=8, name="ng")
    dspark = replica(4, {"code": 1.0}, profile="dspark-b8", block=8, name="ds")
    m = model(acc={"code": 0.6}, method_acc={"code": {"ngram": 0.2, "dspark": 0.9}})
    assert m.acceptance("code", "ngram") == 0.2 and m.acceptance("code", "eagle3") == 0.6
    ng, ds = m.evaluate(ngram, {"code": 8}), m.evaluate(dspark, {"code": 8})
    # ngram proposes in a share of the steps only (its prior here: no evidence); DSpark its whole cap.
    prior = method_proposal("ngram")
    assert prior.rate < 1 and prior.fill < 1
    assert ng.taus["code"] == pytest.approx(1 + prior.rate * expected_accepted(0.2, prior.fill * 8))
    assert ds.taus["code"] == pytest.approx(tokens_per_step(0.9, 8))


def test_ngram_is_priced_at_the_tenants_measured_proposals_not_a_full_block():
    """A tenant that proposes in 40 % of its steps, 6 of 8 tokens a time,
    verifies 1 + 0.4 x 6 tokens a step and gains 0.4 x the accepted tokens of a
    6-token proposal; a trained drafter at the same acceptance verifies its
    whole cap every step. The measured proposal wins over the method's prior."""
    ngram = replica(4, {"code": 1.0}, profile="ngram-k8", block=8, name="ng")
    measured = Proposal(rate=0.4, fill=0.75)
    m = model(acc={"code": 0.6}, proposal={"code": {"ngram": measured}})
    assert m.proposes("code", "ngram") == measured and m.proposes("code", "dspark") == Proposal(1.0, 1.0)
    assert m.proposes("chat", "ngram") == method_proposal("ngram")
    ng = m.evaluate(ngram, {"code": 8})
    assert ng.taus["code"] == pytest.approx(1 + 0.4 * expected_accepted(0.6, 6))
    assert ng.verify_tokens == pytest.approx(4 * (1 + 0.4 * 6) + ngram.prefill_ratio * 4 * ng.taus["code"], rel=1e-6)
    full = model(acc={"code": 0.6}, proposal={"code": {"ngram": Proposal()}}).evaluate(ngram, {"code": 8})
    assert full.taus["code"] == pytest.approx(tokens_per_step(0.6, 8))
    assert full.verify_tokens == pytest.approx(4 * 9 + ngram.prefill_ratio * 4 * full.taus["code"], rel=1e-6)


def test_without_a_k0_skip_every_step_pays_the_pass():
    """EAGLE's first forward, or a DSpark engine whose sources the plugin did not
    verify: a step capped at 0 still runs the drafter, so capping everyone saves
    verification, not the pass -- priced like a replica without knobs."""
    m = model(acc={"code": CODE, "bulk": CHAT})
    for batch in (0, 64):
        mix = {"bulk": 0.95, "code": 0.05}
        skips, runs = replica(batch, mix), replica(batch, mix, k0_skips_pass=False)
        all_off = {"bulk": 0, "code": 0}
        assert m.evaluate(runs, all_off).step_s > m.evaluate(skips, all_off).step_s  # the pass, every step
        assert m.evaluate(runs, all_off).taus == m.evaluate(skips, all_off).taus  # nothing more emitted
        one_on = {"bulk": 0, "code": 16}
        gain_runs = m.goodput(runs, one_on) / m.goodput(runs, all_off)
        gain_skips = m.goodput(skips, one_on) / m.goodput(skips, all_off)
        assert gain_runs > gain_skips  # drafting costs only its verification when the pass is paid anyway


def test_at_light_load_a_small_drafting_tenant_pays_the_pass_only_in_its_own_steps():
    """With per-request knobs a step skips the drafter when nobody in it
    drafts: at batch 1 a tenant with 5 % of the tokens holds the replica less
    than 5 % of the time, and only then pays the pass; turning it on saves it
    the share 1 - 1/tau of its time, so the replica gains ~5 % x (1 - 1/tau);
    at a deep batch every step holds a drafter and the pass is paid throughout."""
    m = model(acc={"code": CODE, "bulk": CHAT})
    light = replica(0, {"bulk": 0.95, "code": 0.05})
    on, off = m.evaluate(light, {"bulk": 0, "code": 16}), m.evaluate(light, {"bulk": 0, "code": 0})
    own = tokens_per_step(CODE, 16)
    saved = 0.05 * (1 - 1 / own)  # of the replica's time: the gain is 1 / (1 - saved) - 1
    assert on.goodput / off.goodput - 1 == pytest.approx(1 / (1 - saved) - 1, rel=0.25)
    assert on.step_s < off.step_s * 1.05  # the pass shows up in under 5 % of steps
    deep = replica(256, {"bulk": 0.95, "code": 0.05})
    on_deep, off_deep = m.evaluate(deep, {"bulk": 0, "code": 16}), m.evaluate(deep, {"bulk": 0, "code": 0})
    assert on_deep.goodput < off_deep.goodput  # ~every step drafts: the pass and the verify tokens cost the batch


def test_a_tenant_s_share_of_the_batch_follows_its_tokens_and_its_speed():
    """Little's law: the mix is measured in tokens, which the caps do not move; a request
    holds its slot for its output / its tokens per step, so a slower tenant fills the batch.
    With code drafting and chat off, chat's requests hold most slots and code's drafting
    buys far less than equal slots would say; with both drafting, the batch is shared
    by how fast each goes."""
    assert batch_shares({"code": 0.5, "chat": 0.5}, {"code": 4.2, "chat": 1.0}) == pytest.approx(
        {"code": 0.5 / 4.2 / (0.5 / 4.2 + 0.5), "chat": 0.5 / (0.5 / 4.2 + 0.5)})
    assert batch_shares({"code": 0.5, "chat": 0.5}, {"code": 2.0, "chat": 2.0}) == pytest.approx({"code": 0.5, "chat": 0.5})
    m = model()
    rep = replica(16, {"code": 0.5, "chat": 0.5}, profile="dspark-b8", block=8)
    code_only = m.evaluate(rep, {"code": 8, "chat": 0})
    both = m.evaluate(rep, {"code": 8, "chat": 8})
    # Tokens a request-step: the token-weighted harmonic mean of the tenants' taus.
    per_slot = 1 / (0.5 / code_only.taus["code"] + 0.5 / code_only.taus["chat"])
    assert code_only.goodput * code_only.step_s / 16 == pytest.approx(per_slot)
    assert per_slot < (code_only.taus["code"] + 1) / 2
    assert both.goodput > code_only.goodput  # the pass is paid anyway: chat's drafts cost only their verification
