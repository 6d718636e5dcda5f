"""drafters.capture.mooncake_store: the capture store on a real Mooncake Store.

A real `mooncake_master` and store node (`mooncake_client`, the memory the
samples live in) from .venv-vllm's wheel, started per module by
`MooncakeCluster` exactly as the bench starts them (tests/vllm_support/mooncake_fixtures.py),
and the real Redis holding the index. Writers and readers are separate
.venv-vllm processes (`mooncake_ops`: the Mooncake client needs the wheel, the
tensors torch); the index side (`keys`, `count`, `meta`, `stats`) is checked from
this process, the gateway's venv, as the controller reads it.
"""

from __future__ import annotations

import pytest

from contract.capture import SampleMeta
from drafters.capture.backends import open_store
from drafters.capture.mooncake_store import (
    DEFAULT_BUFFER_BYTES,
    MooncakeLocation,
    MooncakeSampleStore,
    mooncake_spec,
    segment_bytes_for,
)
from drafters.capture.replica import CaptureStoreConfig
from drafters.capture.store import SampleKey, SampleStore
from tests.vllm_support.mooncake_fixtures import MOONCAKE_MAX_BYTES, mooncake_ops

SAMPLE_TOKENS = 20  # 20 x 3 x 128 float32 + ids + header: ~31 KB a sample
MAX_BYTES = MOONCAKE_MAX_BYTES  # four samples
TTL_S = 60.0


# -- the spec (pure) -------------------------------------------------------------
def test_a_spec_names_master_namespace_index_and_buffer():
    loc = MooncakeLocation.parse("mooncake://10.0.0.5:50051/team-a?index=redis://r:6379/2&local_hostname=10.0.0.9&buffer_bytes=1024")
    assert loc == MooncakeLocation("10.0.0.5:50051", "redis://r:6379/2", "team-a", "10.0.0.9", 1024)
    default = MooncakeLocation.parse(mooncake_spec("127.0.0.1:50051", "redis://127.0.0.1:6379/0"))
    assert (default.namespace, default.local_hostname, default.buffer_bytes) == ("specgate-capture", "127.0.0.1", DEFAULT_BUFFER_BYTES)


@pytest.mark.parametrize("spec", [
    "mooncake://127.0.0.1/ns?index=redis://x:6379/0",  # no master port
    "mooncake://127.0.0.1:50051/ns",  # no index
    "mooncake://127.0.0.1:50051/ns?index=/tmp/index",  # an index that is not Redis
    "mooncake://127.0.0.1:50051/ns?index=redis://x:6379/0&buffer_bytes=0",
])
def test_a_malformed_spec_is_refused_before_a_replica_starts(spec):
    with pytest.raises(ValueError):
        MooncakeLocation.parse(spec)
    with pytest.raises(ValueError):
        CaptureStoreConfig(store_root=spec)


def test_open_store_picks_the_backend_by_spec(tmp_path):
    assert type(open_store(tmp_path)) is SampleStore
    spec = mooncake_spec("127.0.0.1:1", "redis://127.0.0.1:6379/0")
    assert type(open_store(spec)) is MooncakeSampleStore  # the Mooncake client is set up on first use only
    assert CaptureStoreConfig(store_root=spec).store_root == spec


def test_the_segment_holds_the_bound_below_mooncakes_eviction_watermark():
    for max_bytes in (MAX_BYTES, 1 << 30, 4 << 30):
        assert 0.9 * segment_bytes_for(max_bytes) > max_bytes * 1.1


# -- on a real store (the `cluster` fixture: conftest.py) ----------------------------
@pytest.fixture
def spec(mooncake_store_spec):
    return mooncake_store_spec


run = mooncake_ops


def index(spec: str) -> MooncakeSampleStore:
    """The store as the controller sees it: index only, from the gateway's venv."""
    return MooncakeSampleStore(spec, max_bytes=MAX_BYTES, ttl_s=TTL_S)


def test_samples_one_process_writes_another_reads_bit_exact_by_key(spec):
    written = run(spec, [["put", "acme", "r1", SAMPLE_TOKENS, 1], ["put", "team/b", "r2", SAMPLE_TOKENS, 2],
                         ["put", "acme", "r3", SAMPLE_TOKENS, 3]])
    # The writer has exited: the samples live in the store node, not in it.
    read = run(spec, [["read", w["key"]] for w in written])
    assert [r["digest"] for r in read] == [w["digest"] for w in written]
    assert [r["request_id"] for r in read] == ["r1", "r2", "r3"]

    store = index(spec)
    assert [k.key for k in store.keys("acme")] == ["acme/r1.safetensors", "acme/r3.safetensors"]
    assert [k.key for k in store.keys()] == [w["key"] for w in written]  # oldest first, across tenants
    assert store.keys("team/b") == [SampleKey("team_b", "r2.safetensors")]
    assert store.count("acme") == 2 and store.count("nobody") == 0
    meta = store.meta("team_b/r2.safetensors")
    assert isinstance(meta, SampleMeta) and (meta.tenant, meta.request_id, meta.layer_ids) == ("team/b", "r2", (0, 1, 2))
    stats = store.stats()
    assert stats.samples == 3 and stats.bytes == written[-1]["bytes"] and stats.evicted_full == 0
    with pytest.raises(ValueError):
        store.meta("../elsewhere")


def test_the_byte_bound_evicts_the_oldest_and_frees_their_memory(spec):
    written = run(spec, [["put", "acme" if i % 2 else "beta", f"r{i}", SAMPLE_TOKENS, i] for i in range(10)])
    assert all(w["bytes"] <= MAX_BYTES for w in written)
    store = index(spec)
    kept = [k.key for k in store.keys()]
    assert kept == [w["key"] for w in written][-len(kept):] and 3 <= len(kept) <= 4
    stats = store.stats()
    assert stats.evicted_full == 10 - len(kept) and stats.high_water_bytes <= MAX_BYTES
    assert stats.bytes == sum(int(store._redis.hget(store._sizes, k)) for k in kept)  # exact, not drifting
    # Evicted means gone from Mooncake too, not only unlisted.
    assert run(spec, [["read", written[0]["key"]], ["vanish", written[0]["key"]]])[0] == "gone"
    assert run(spec, [["read", kept[-1]]])[0]["digest"] == written[-1]["digest"]


def test_the_ttl_empties_the_store(spec):
    run(spec, [["put", "acme", "old1", SAMPLE_TOKENS, 1], ["put", "acme", "old2", SAMPLE_TOKENS, 2]])
    assert index(spec).count("acme") == 2
    stats = run(spec, [["enforce", TTL_S + 1]])[0]
    assert (stats["samples"], stats["bytes"], stats["evicted_ttl"]) == (0, 0, 2)
    assert run(spec, [["read", "acme/old1.safetensors"]]) == ["gone"]


def test_delete_keeps_the_byte_count_exact_and_a_vanished_sample_is_counted_lost(spec):
    written = run(spec, [["put", "acme", f"r{i}", SAMPLE_TOKENS, i] for i in range(3)])
    before = index(spec).stats().bytes
    after = run(spec, [["delete", written[0]["key"]], ["delete", written[0]["key"]]])  # twice: counted once
    assert after[0]["bytes"] == after[1]["bytes"] < before and after[1]["samples"] == 2
    # Gone behind the index's back (Mooncake's own eviction, a restarted store node):
    # the read says so, the entry goes, and the loss is counted.
    assert run(spec, [["vanish", written[1]["key"]], ["read", written[1]["key"]]])[1] == "gone"
    stats = index(spec).stats()
    assert stats.lost == 1 and stats.samples == 1 and [k.key for k in index(spec).keys()] == [written[2]["key"]]
