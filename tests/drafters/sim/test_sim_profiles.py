"""The simulator models DSpark and ngram: other speculation methods are refused at config load."""

import pytest
from pydantic import ValidationError

from contract.profiles import PROFILE_LABELS, parse_profile
from drafters.sim import EngineConfig, Simulation
from drafters.sim.engine_types import SIMULATED_PROFILE_LABELS, simulated_profile
from drafters.sim.policy import BasePolicy
from drafters.sim.replica import SimReplicaSettings
from drafters.sim.trace import OpenLoopSource

NOT_SIMULATED = [label for label in PROFILE_LABELS if parse_profile(label).method not in ("off", "ngram", "dspark")]


def test_simulated_labels_are_off_ngram_and_dspark():
    assert SIMULATED_PROFILE_LABELS == ("off", "ngram-k2", "ngram-k4", "ngram-k8", "dspark-b4", "dspark-b4-av",
                                        "dspark-b8", "dspark-b8-av", "dspark-b16", "dspark-b16-av")
    assert NOT_SIMULATED and all(parse_profile(label).method in ("eagle3", "dflash") for label in NOT_SIMULATED)
    for label in SIMULATED_PROFILE_LABELS:
        assert simulated_profile(label).label == label
        assert EngineConfig(profile=label).profile_obj == parse_profile(label)
        assert SimReplicaSettings(profile=label).profile == label


@pytest.mark.parametrize("label", NOT_SIMULATED)
def test_other_methods_are_refused_at_config_load(label):
    with pytest.raises(ValueError, match="cannot be simulated: the simulator models DSpark and ngram only"):
        EngineConfig(profile=label)
    with pytest.raises(ValidationError, match="cannot be simulated"):
        SimReplicaSettings(profile=label)


def test_unknown_labels_keep_the_parser_message_and_restart_refuses_other_methods():
    with pytest.raises(ValueError, match="unknown speculation profile"):
        EngineConfig(profile="dspark-b7")
    sim = Simulation([EngineConfig(name="r0", profile="dspark-b8")], OpenLoopSource([]), BasePolicy())
    with pytest.raises(ValueError, match="cannot be simulated"):
        sim.restart_replica("r0", "eagle3-k4", downtime_s=1.0)
    sim.restart_replica("r0", "ngram-k4", downtime_s=1.0)  # an idle replica restarts into ngram at once
    assert sim.restarts == [(0.0, "r0", "ngram-k4")]
    assert SimReplicaSettings(profile=False).profile == "off"  # YAML's unquoted off
