"""The layer mapping between capture and serving (drafters/training/layers.py).

Pinned two ways: the pure function's values, and -- where .venv-vllm exists --
the installed vLLM's own config translation: a speculators DSpark config with
`aux_hidden_state_layer_ids` makes vLLM's target record exactly those ids
(`eagle_aux_hidden_state_layer_ids`), so a capture replica recording
`capture_layer_ids(...)` hands the trainer the drafter's serving features
plus the last layer.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from drafters.training.layers import capture_layer_ids, default_target_layer_ids, feature_columns
from testbed import vllm_env


def test_capture_ids_are_the_drafter_aux_ids_plus_the_last_layer():
    assert capture_layer_ids([2, 18, 33], 36) == [2, 18, 33, 36]  # speculators' default for Qwen3-8B
    assert capture_layer_ids([33, 2, 18], 36) == [2, 18, 33, 36]  # vLLM appends them in layer order
    assert capture_layer_ids([0, 1, 2], 2) == [0, 1, 2]  # a drafter that itself uses L: recorded once
    assert capture_layer_ids([1], 2) == [1, 2]


@pytest.mark.parametrize("ids,n", [([], 36), ([37], 36), ([-1, 2], 36), ([2, 2], 36), ([1], 0)])
def test_capture_ids_refuse_impossible_layers(ids, n):
    with pytest.raises(ValueError):
        capture_layer_ids(ids, n)


def test_feature_columns_select_by_id_not_position():
    # a capture with an extra id and the drafter's ids out of order still yields ascending features + L
    assert feature_columns([0, 2, 5, 18, 33, 36], [33, 2, 18], 36) == ([1, 3, 4], 5)
    assert feature_columns([0, 1, 2], [0, 1, 2], 2) == ([0, 1, 2], 2)
    with pytest.raises(ValueError, match=r"eagle_aux_hidden_state_layer_ids=\[2, 18, 33, 36\]"):
        feature_columns([2, 18, 33], [2, 18, 33], 36)  # no last layer: cannot form the target's logits


def test_default_feature_layers():
    assert default_target_layer_ids(36) == [2, 18, 33]
    assert default_target_layer_ids(2) == [1, 2]
    assert 0 not in default_target_layer_ids(4)


@pytest.mark.vllm
def test_vllm_serves_the_aux_ids_the_capture_records():
    reason = vllm_env.unavailable_reason()
    if reason:
        pytest.skip(reason)
    code = """
import json
from types import SimpleNamespace
from vllm.transformers_utils.configs.speculators.algos import update_dspark
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
cfg = {"architectures": ["DSparkDraftModel"], "aux_hidden_state_layer_ids": [2, 18, 33], "mask_token_id": 1,
       "block_size": 8, "draft_vocab_size": 10, "markov_rank": 4}
pre = {}
update_dspark(cfg, pre)
spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(**pre)))
print(json.dumps({"target_layer_ids": pre["target_layer_ids"], "recorded": list(get_eagle3_aux_layers_from_config(spec))}))
"""
    proc = subprocess.run([str(vllm_env.python()), "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["target_layer_ids"] == [1, 17, 32]  # DSpark's naming only (aux - 1) ...
    assert got["recorded"] == [2, 18, 33]  # ... the target records the aux ids themselves
    assert capture_layer_ids([2, 18, 33], 36)[:-1] == got["recorded"]
