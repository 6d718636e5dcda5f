"""Where a candidate cap is priced: routing's targets, load moves, and the pricing rule."""

from __future__ import annotations

import pytest

from controller.decision import FULL
from controller.decision.placement import move_tenant, place, preferred_profile, pricing_targets, routed_to, tenant_load

from .common import replica


def three(b1=2.0, b2=2.0, b3=4.0, mix1=None, mix2=None, mix3=None, **kw):
    """Two dspark-b8 replicas and an off replica."""
    return [
        replica(b1, mix1 if mix1 is not None else {"code": 1.0}, profile="dspark-b8", block=8, name="s1", **kw),
        replica(b2, mix2 if mix2 is not None else {"code": 1.0}, profile="dspark-b8", block=8, name="s2", **kw),
        replica(b3, mix3 if mix3 is not None else {"chat": 1.0}, profile="off", block=0, name="plain", **kw),
    ]


def test_routing_targets_follow_the_gateways_tiers():
    live = three()
    everyone = {"s1", "s2", "plain"}
    assert routed_to(0, live, off_pool=True) == {"plain"}
    assert routed_to(0, live, off_pool=False) == everyone
    assert routed_to(4, live, off_pool=True) == everyone  # one speculative profile: no preference
    mixed = [replica(1, {}, profile="dspark-b4", block=4, name="b4"), replica(1, {}, profile="dspark-b16", block=16, name="b16")]
    assert preferred_profile(4, mixed) == "dspark-b4" and routed_to(4, mixed, off_pool=False) == {"b4"}
    assert preferred_profile(8, mixed) == "dspark-b16" and routed_to(FULL, mixed, off_pool=False) == {"b4", "b16"}


def test_moving_a_tenant_keeps_every_tenants_load():
    live = three(b1=2.0, b2=2.0, b3=4.0, mix1={"code": 0.5, "chat": 0.5}, mix2={"code": 1.0}, mix3={"chat": 1.0})
    live[2] = replica(4.0, {"chat": 1.0}, profile="off", block=0, name="plain", waiting=2.0)
    moved = {r.name: r for r in move_tenant(live, "chat", frozenset({"s1", "s2"}))}
    assert set(moved) == {"s1", "s2"}  # the off replica held only chat: emptied, dropped
    chat_before = sum(tenant_load(r, "chat") for r in live)
    assert sum(tenant_load(r, "chat") for r in moved.values()) == pytest.approx(chat_before)
    assert tenant_load(moved["s1"], "chat") == pytest.approx(tenant_load(moved["s2"], "chat"))  # spread evenly
    assert sum(tenant_load(r, "code") for r in moved.values()) == pytest.approx(3.0)
    assert sum(r.waiting for r in moved.values()) == pytest.approx(2.0)


def test_a_tenant_without_load_or_without_a_live_target_stays_put():
    live = three(b3=0.0)
    assert move_tenant(live, "chat", frozenset({"s1"})) == live  # no chat load anywhere
    assert move_tenant(live, "code", frozenset({"gone"})) == live


def test_an_idle_target_carries_only_the_moved_tenant():
    live = three(b1=0.0, mix1={"code": 1.0}, b3=4.0)
    moved = {r.name: r for r in move_tenant(live, "chat", frozenset({"s1"}))}
    assert moved["s1"].mix == {"chat": 4.0}  # code's share of an idle replica weighs nothing
    assert moved["s1"].batch == pytest.approx(4.0)


def test_pricing_rule():
    live = three()
    everyone = frozenset({"s1", "s2", "plain"})
    # Speculating now: observed, for k=0 too (the off pool's standing idealisation).
    assert pricing_targets(FULL, FULL, live, off_pool=True) is None
    assert pricing_targets(0, FULL, live, off_pool=True) is None
    # Parked on the off pool: every candidate priced as if it speculated.
    assert pricing_targets(FULL, 0, live, off_pool=True) == everyone
    assert pricing_targets(0, 0, live, off_pool=True) == everyone
    # Without an off pool, k=0 does not move anyone.
    assert pricing_targets(FULL, 0, live, off_pool=False) is None
    # Another preferred profile moves the tenant there.
    mixed = [replica(1, {"code": 1.0}, profile="dspark-b4", block=4, name="b4"),
             replica(1, {"chat": 1.0}, profile="dspark-b16", block=16, name="b16")]
    assert pricing_targets(4, FULL, mixed, off_pool=False) == {"b4"}
    placed = {r.name: r for r in place(mixed, {"code": FULL, "chat": 4}, {"code": FULL, "chat": FULL}, off_pool=False)}
    assert "chat" in placed["b4"].mix and "b16" not in placed  # b16 held only chat
