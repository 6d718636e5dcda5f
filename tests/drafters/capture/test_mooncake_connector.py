"""specgate's hidden-states connector writing into a real Mooncake Store.

The capture replica of test_connector.py (the tiny Qwen3 under
`extract_hidden_states`, started with `capture_replica_args`), with
`store_root` a `mooncake://` spec: a real `mooncake_master` and store node
(conftest.py) hold the samples, the real Redis their index. What the replica
writes, another process (the trainer's side: hf_reference.py in .venv-vllm)
reads by the returned key through Mooncake and compares with HF
transformers' hidden states; the store's byte bound holds on the replica's
own write path.
"""

from __future__ import annotations

import time

import pytest

from contract.capture import capture_request_body, tenant_slug
from drafters.capture.mooncake_store import MooncakeSampleStore
from drafters.capture.replica import SAMPLE_KEY_PARAM, capture_replica_args
from testbed.vllm_server import VllmServer, VllmServerSpec
from tests.vllm_support.mooncake_fixtures import MOONCAKE_MAX_BYTES, fresh_store_spec

from .test_connector import HIDDEN, LAYER_IDS, capture_three, hf_reference, send

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TTL_S = 600.0  # the TTL itself is tested on the store (test_mooncake_store.py); here samples must stay


@pytest.fixture(scope="module")
def spec(mooncake_cluster, redis_url):
    with fresh_store_spec(mooncake_cluster, redis_url) as spec:  # one namespace for the module's replica
        yield spec


@pytest.fixture(scope="module")
def capture_server(tiny_model_dir, vllm_log_dir, spec):
    server_spec = VllmServerSpec(
        model_dir=str(tiny_model_dir),
        name="capture-mooncake",
        served_model_name="tiny-capture",
        speculative_config=None,  # capture_replica_args carries --speculative-config
        extra_args=capture_replica_args(LAYER_IDS, spec, MOONCAKE_MAX_BYTES, TTL_S, enforce_interval_s=0.5),
    )
    with VllmServer(server_spec, vllm_log_dir) as server:
        yield server


@pytest.fixture(scope="module")
def client(capture_server):
    import openai

    return openai.OpenAI(base_url=capture_server.base_url, api_key="unused", timeout=120, max_retries=0)


def listed(store: MooncakeSampleStore, key: str, timeout_s: float = 60.0) -> None:
    """The reply can precede the writer thread's put by a moment."""
    deadline = time.monotonic() + timeout_s
    while key not in {k.key for k in store.keys()}:
        assert time.monotonic() < deadline, f"{key} never listed"
        time.sleep(0.05)


def test_the_trainer_reads_from_mooncake_what_the_replica_captured(capture_server, client, spec, tiny_model_dir):
    started = time.time()
    finished, responses = capture_three(capture_server, client)

    store = MooncakeSampleStore(spec, max_bytes=MOONCAKE_MAX_BYTES, ttl_s=TTL_S)
    keys = []
    for (tenant, _, _), resp in zip(finished, responses):
        params = resp["kv_transfer_params"]
        key = params[SAMPLE_KEY_PARAM]
        assert key.startswith(tenant_slug(tenant) + "/") and "hidden_states_path" not in params  # no file anywhere
        listed(store, key)
        keys.append(key)
    assert {k.key for k in store.keys("acme")} >= set(keys[:2]) and store.meta(keys[2]).tenant == "team/b"

    got = hf_reference(spec, tiny_model_dir, keys)  # another process, through Mooncake, by key
    for (tenant, prompt, completion), key in zip(finished, keys):
        sample = got[key]
        ids = prompt + completion
        assert sample["token_ids"] == ids and sample["shape"] == [len(ids), len(LAYER_IDS), HIDDEN]
        assert (sample["tenant"], sample["prompt_tokens"], sample["layer_ids"]) == (tenant, len(prompt), LAYER_IDS)
        assert started - 1 <= sample["captured_at"] <= time.time()
        tolerance = 1e-4 * max(1.0, sample["ref_scale"])
        assert all(d <= tolerance for d in sample["max_abs_diff"].values()), sample["max_abs_diff"]


def test_the_replica_keeps_the_store_under_its_bound(capture_server, client, spec):
    store = MooncakeSampleStore(spec, max_bytes=MOONCAKE_MAX_BYTES, ttl_s=TTL_S)
    keys = []
    for i in range(12):  # ~3x the bound in 16-token samples
        resp = send(client, capture_request_body(capture_server.model, "bulk", [30 + i] * 12, [5, 6, 7, 8]))
        keys.append(resp["kv_transfer_params"][SAMPLE_KEY_PARAM])
        listed(store, keys[-1])
        assert store.stats().bytes <= MOONCAKE_MAX_BYTES
    stats = store.stats()
    assert stats.evicted_full > 0 and stats.high_water_bytes <= MOONCAKE_MAX_BYTES
    kept = [k.key for k in store.keys("bulk")]
    assert kept == keys[-len(kept):]  # the oldest went first
