"""drafters.capture.replica: the capture replica's vLLM arguments and the
connector's knobs (pure; the real server that takes them is in test_connector.py)."""

from __future__ import annotations

import json

import pytest

from drafters.capture.replica import (
    CONNECTOR_CLASS,
    CONNECTOR_MODULE,
    MAX_ENFORCE_INTERVAL_S,
    CaptureStoreConfig,
    capture_replica_args,
)
from drafters.capture.store import DEFAULT_MAX_BYTES, DEFAULT_ROOT, DEFAULT_TTL_S


def _parse(args: list[str]) -> tuple[dict, dict]:
    assert args[0] == "--speculative-config" and args[2] == "--kv-transfer-config" and len(args) == 4
    return json.loads(args[1]), json.loads(args[3])


def test_args_name_extract_hidden_states_and_the_connector():
    spec, kv = _parse(capture_replica_args([1, 2], "/dev/shm/x", 1234, 56.0))
    assert spec == {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}},
    }
    assert kv == {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"store_root": "/dev/shm/x", "max_bytes": 1234, "ttl_s": 56.0},
    }
    assert CONNECTOR_MODULE == "drafters.capture.connector" and CONNECTOR_CLASS == "SpecgateHiddenStatesConnector"


def test_defaults_are_the_stores():
    _, kv = _parse(capture_replica_args([3]))
    assert kv["kv_connector_extra_config"] == {"store_root": DEFAULT_ROOT, "max_bytes": DEFAULT_MAX_BYTES, "ttl_s": DEFAULT_TTL_S}
    _, kv = _parse(capture_replica_args([3], enforce_interval_s=2))
    assert kv["kv_connector_extra_config"]["enforce_interval_s"] == 2


@pytest.mark.parametrize("ids", [[], [1, 1], [-1, 2]])
def test_layer_ids_are_required_distinct_and_non_negative(ids):
    with pytest.raises(ValueError):
        capture_replica_args(ids)


@pytest.mark.parametrize(
    "extra",
    [
        {"max_bytes": 0},
        {"max_bytes": 1.5},
        {"max_bytes": True},
        {"ttl_s": 0},
        {"ttl_s": "60"},
        {"enforce_interval_s": -1},
        {"store_root": ""},
    ],
)
def test_bad_knobs_are_refused(extra):
    with pytest.raises(ValueError):
        CaptureStoreConfig.from_extra_config(extra)


def test_extra_config_round_trip_ignores_stock_keys():
    config = CaptureStoreConfig.from_extra_config(
        {"store_root": "/r", "max_bytes": 10, "ttl_s": 8, "num_writer_threads": 4, "shared_storage_path": "/tmp"}
    )
    assert config == CaptureStoreConfig("/r", 10, 8)
    assert CaptureStoreConfig.from_extra_config(config.extra_config()) == config
    assert CaptureStoreConfig.from_extra_config(None) == CaptureStoreConfig()


def test_ttl_sweep_interval():
    assert CaptureStoreConfig(ttl_s=8).interval_s == 2.0  # four sweeps per TTL
    assert CaptureStoreConfig(ttl_s=24 * 3600).interval_s == MAX_ENFORCE_INTERVAL_S
    assert CaptureStoreConfig(ttl_s=8, enforce_interval_s=0.5).interval_s == 0.5
