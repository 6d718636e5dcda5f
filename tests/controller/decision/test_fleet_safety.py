"""Fleet-plan safety: a restart is only ever recommended into a profile the
replica's drafter checkpoint can serve, and an `off` replica without a
configured drafter is never turned into a drafting one."""

from __future__ import annotations

import pytest

from contract.profiles import PROFILE_LABELS, parse_profile
from contract.settings import DecisionSettings, DrafterSettings, Settings
from controller.decision import DecisionConfig, TenantState, replica_regimes, restart_targets, servable_profiles
from drafters.checkpoint import validate_config

from .common import CHAT, CODE, context, replica, tenants

DSPARK_B16 = DrafterSettings(method="dspark", speculative_tokens=16)


def test_an_off_replica_without_a_drafter_can_only_stay_off():
    assert servable_profiles("off") == ("off",)
    assert servable_profiles("off", DrafterSettings()) == ("off",)  # the unset default


def test_a_drafting_replica_keeps_its_method_and_at_most_its_block():
    assert servable_profiles("dspark-b8") == ("off", "dspark-b4", "dspark-b4-av", "dspark-b8", "dspark-b8-av")
    assert servable_profiles("dspark-b8-av") == servable_profiles("dspark-b8")
    assert servable_profiles("dspark-b4") == ("off", "dspark-b4", "dspark-b4-av")
    assert servable_profiles("dflash-b8") == ("off", "dflash-b4", "dflash-b8")
    assert servable_profiles("eagle3-k4") == ("off", "eagle3-k2", "eagle3-k4")
    # ngram looks up the prompt: no checkpoint limits its length.
    assert servable_profiles("ngram-k2") == ("off", "ngram-k2", "ngram-k4", "ngram-k8")


def test_a_fleet_drafter_extends_every_replica_up_to_its_tokens():
    dspark = [label for label in PROFILE_LABELS if label.startswith("dspark-")]
    assert servable_profiles("off", DSPARK_B16) == ("off", *dspark)
    assert servable_profiles("dspark-b4", DSPARK_B16) == ("off", *dspark)
    b8 = DrafterSettings(method="dspark", speculative_tokens=8)
    assert "dspark-b16" not in servable_profiles("off", b8) and "dspark-b8-av" in servable_profiles("off", b8)
    # Another method's checkpoint adds its own profiles, never DSpark's longer blocks.
    dflash = DrafterSettings(method="dflash", speculative_tokens=16)
    assert servable_profiles("dspark-b8", dflash) == (
        "off", "dflash-b4", "dflash-b8", "dflash-b16", "dspark-b4", "dspark-b4-av", "dspark-b8", "dspark-b8-av")


def test_the_drafter_setting_is_validated():
    with pytest.raises(ValueError, match="set both or neither"):
        DrafterSettings(method="dspark")
    with pytest.raises(ValueError, match="drafter method"):
        DrafterSettings(method="ngram", speculative_tokens=4)
    s = Settings(controller={"decision": {"drafter": {"method": "dspark", "speculative_tokens": 16}}})
    assert s.controller.decision.drafter == DSPARK_B16
    hash(s.controller.decision)  # DecisionSettings stays a frozen, hashable record


def _checkpoint_config(tokens: int) -> dict:
    """A speculators-format DSpark config.json for Qwen/Qwen3-8B proposing `tokens` per block."""
    return {
        "speculators_model_type": "dspark", "block_size": tokens, "sample_from_anchor": True,
        "markov_rank": 256, "markov_head_type": "vanilla", "enable_confidence_head": True,
        "aux_hidden_state_layer_ids": [1, 17, 33], "mask_token_id": 151669,
        "transformer_layer_config": {"hidden_size": 4096, "num_hidden_layers": 1, "num_attention_heads": 32,
                                     "num_key_value_heads": 8, "vocab_size": 151936},
        "speculators_config": {"proposal_methods": [{"speculative_tokens": tokens}],
                               "verifier": {"name_or_path": "Qwen/Qwen3-8B"}},
    }


@pytest.mark.parametrize("tokens", [4, 8, 16])
def test_servable_agrees_with_the_checkpoint_validator(tokens):
    """What the plan may recommend for a replica serving dspark-b{tokens} is exactly what
    drafters/checkpoint.py accepts for a checkpoint proposing that many tokens."""
    cfg = _checkpoint_config(tokens)
    assert validate_config(cfg, "Qwen/Qwen3-8B", f"dspark-b{tokens}").ok
    servable = set(servable_profiles(f"dspark-b{tokens}"))
    for label in PROFILE_LABELS:
        if parse_profile(label).method != "dspark":
            continue
        assert (label in servable) == validate_config(cfg, "Qwen/Qwen3-8B", label).ok, label


def _regimes(reps, cfg: DecisionConfig, acceptance=CODE):
    ctx = context(reps, tenants(code=acceptance), cfg=cfg)
    state = {"code": TenantState(k=8), "*": TenantState(k=8)}
    return replica_regimes(ctx, ctx.goodput_model(), state, cfg)


def demo_fleet(batch: float):
    """`specgate up`'s default fleet (specgate/up.py): two dspark-b8 replicas and one off."""
    return [replica(batch, {"code": 1.0}, profile="dspark-b8", block=8, name="sim-dspark-b8-1"),
            replica(batch, {"code": 1.0}, profile="dspark-b8", block=8, name="sim-dspark-b8-2"),
            replica(batch, {"code": 1.0}, profile="off", block=0, name="sim-off-1")]


def test_the_demo_fleet_under_light_load_never_drafts_on_its_off_replica():
    regimes = _regimes(demo_fleet(1), DecisionSettings())
    assert regimes["sim-off-1"].recommended_profile == "off"
    assert regimes["sim-off-1"].recommended_gain == 1.0
    for r in regimes.values():  # and no b16: the b8 checkpoint cannot serve it
        assert r.recommended_profile in servable_profiles(r.profile)
    # With a fleet drafter proposing 16 tokens the same load converts every replica, the off one included.
    with_drafter = _regimes(demo_fleet(1), DecisionSettings(drafter=DSPARK_B16))
    assert {r.recommended_profile for r in with_drafter.values()} <= set(servable_profiles("off", DSPARK_B16)) - {"off"}
    assert with_drafter["sim-off-1"].recommended_gain > 1.0


@pytest.mark.parametrize("batch", [1, 8, 64, 256])
@pytest.mark.parametrize("acceptance", [CODE, CHAT])
@pytest.mark.parametrize("drafter", [DrafterSettings(), DrafterSettings(method="dspark", speculative_tokens=8), DSPARK_B16])
def test_every_recommendation_is_servable(batch, acceptance, drafter):
    reps = demo_fleet(batch) + [replica(batch, {"code": 1.0}, profile="dspark-b4-av", block=4, adaptive=True, name="av")]
    cfg = DecisionSettings(drafter=drafter)
    for r in _regimes(reps, cfg, acceptance).values():
        assert r.recommended_profile in servable_profiles(r.profile, drafter), (r.name, r.recommended_profile)
        if r.profile == "off" and drafter.method is None:
            assert r.recommended_profile == "off"


K8S_POOLS = frozenset({"dspark-b8", "dspark-b8-av", "off"})  # deploy/k8s/base: vllm-dspark-b8, -b8-av, vllm-off


def test_restart_targets_can_be_held_to_the_configured_profiles():
    assert restart_targets("dspark-b8", None, K8S_POOLS) == ("off", "dspark-b8", "dspark-b8-av")
    assert restart_targets("off", DSPARK_B16, K8S_POOLS) == ("off", "dspark-b8", "dspark-b8-av")
    assert restart_targets("dspark-b8", None, frozenset({"dspark-b8"})) == ("dspark-b8",)  # its own, always
    assert restart_targets("dspark-b8") == servable_profiles("dspark-b8")


@pytest.mark.parametrize("batch", [1, 64])
def test_a_pool_fleet_is_only_recommended_pools_that_exist(batch):
    """On Kubernetes (plan_configured_profiles_only) the plan names only profiles some configured
    replica runs -- an absent pool's ordinals are configured but unhealthy -- so the actuator
    never scales a StatefulSet that does not exist."""
    reps = [replica(batch, {"code": 1.0}, profile="dspark-b8", block=8, name=f"vllm-dspark-b8-{i}") for i in range(2)]
    reps += [replica(batch, {"code": 1.0}, profile="off", block=0, name="vllm-off-0"),
             replica(0, {}, profile="dspark-b8-av", block=8, adaptive=True, name="vllm-dspark-b8-av-0", healthy=False)]
    cfg = DecisionSettings(drafter=DSPARK_B16, plan_configured_profiles_only=True)
    regimes = _regimes(reps, cfg)
    assert set(regimes) == {"vllm-dspark-b8-0", "vllm-dspark-b8-1", "vllm-off-0"}
    assert {r.recommended_profile for r in regimes.values()} <= K8S_POOLS
    # Unrestricted, the same fleet is told to restart into a profile no pool runs.
    free = _regimes(reps, DecisionSettings(drafter=DSPARK_B16))
    assert not {r.recommended_profile for r in free.values()} <= K8S_POOLS
