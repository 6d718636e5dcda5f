"""The confidence floor theta* = G * c_m and its 'only when it pays' gate."""

from __future__ import annotations

from controller.decision import DecisionConfig, confidence_floor, marginal_theta
from controller.decision.floor import theta_star

from .common import CHAT, CODE, model, optimizer, replica, tenants

AV = {"profile": "dspark-b16-av", "adaptive": True}


def test_marginal_theta_rises_with_load_and_is_capped():
    cfg = DecisionConfig()
    low, high = replica(2, {"code": 1.0}, **AV), replica(64, {"code": 1.0}, **AV)
    m = model()
    g_lo, _, n_lo, _ = m.evaluate(low, {"code": 16})
    g_hi, _, n_hi, _ = m.evaluate(high, {"code": 16})
    assert marginal_theta(low, g_lo, n_lo, cfg) < marginal_theta(high, g_hi, n_hi, cfg) <= cfg.theta_max
    assert marginal_theta(low, 0.0, n_lo, cfg) == 0.0


def test_theta_star_only_on_knob_capable_adaptive_replicas_and_drafting_tenants():
    cfg = DecisionConfig()
    proposal = {"code": 16, "*": 16}
    av = optimizer([replica(24, {"code": 1.0}, **AV)], tenants(code=CODE))
    star = theta_star(av, "code", 16, proposal, cfg)
    assert star is not None and 0 < star <= CODE**16 + 1e-9 and round(star / cfg.theta_step, 6).is_integer()
    assert theta_star(av, "code", 0, proposal, cfg) is None
    static = optimizer([replica(24, {"code": 1.0})], tenants(code=CODE))
    assert theta_star(static, "code", 16, proposal, cfg) is None


def test_floor_is_published_only_when_predicted_to_pay():
    proposal = {"code": 16, "*": 16}
    opt = optimizer([replica(24, {"code": 1.0}, **AV)], tenants(code=CODE))
    star, worth = confidence_floor(opt, "code", 16, proposal, DecisionConfig())
    assert star > 0 and worth == 0.0  # a lone tenant's cap already subsumes the floor
    assert confidence_floor(opt, "code", 16, proposal, DecisionConfig(theta_min_gain=-1.0)) == (star, star)
    # A low-acceptance tenant: theta* is capped by its own mean survival (a**k), here below the grid.
    chat = optimizer([replica(24, {"chat": 1.0}, **AV)], tenants(chat=CHAT))
    assert confidence_floor(chat, "chat", 16, {"chat": 16, "*": 16}, DecisionConfig(theta_min_gain=-1.0)) == (0.0, 0.0)
