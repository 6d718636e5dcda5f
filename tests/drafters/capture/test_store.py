"""drafters.capture.store: the bounded, TTL-evicted sample directory.

Samples here are real safetensors files built by hand (`_blob`: the format is
an 8-byte header length, a JSON header, the data), so the store's bookkeeping
is tested in the gateway's venv without torch; the torch round trip
(`put` -> `read`) runs in .venv-vllm (`test_put_read_round_trip_with_torch`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from contract.capture import SampleMeta, tenant_slug
from drafters.capture.store import SampleKey, SampleStore

REPO = Path(__file__).resolve().parents[3]


def _blob(meta: SampleMeta | None = None, nbytes: int = 1000) -> bytes:
    """A valid safetensors file of `nbytes` data bytes (one U8 tensor)."""
    header = {"x": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}
    if meta is not None:
        header["__metadata__"] = meta.to_metadata()
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + bytes(nbytes)


def _meta(tenant: str = "acme", request_id: str = "r") -> SampleMeta:
    return SampleMeta(tenant=tenant, prompt_tokens=3, captured_at=1.5, layer_ids=(1, 2), request_id=request_id)


def _age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_put_bytes_lays_out_tenant_directories_and_keys_per_tenant(tmp_path):
    store = SampleStore(tmp_path, max_bytes=1 << 20, ttl_s=60)
    a1 = store.put_bytes("acme", "r1", _blob(_meta("acme", "r1")))
    b1 = store.put_bytes("team/b", "r2", _blob(_meta("team/b", "r2")))
    a2 = store.put_bytes("acme", "r3", _blob(_meta("acme", "r3")))
    assert a1 == tmp_path / "acme" / "r1.safetensors" and b1 == tmp_path / "team_b" / "r2.safetensors"
    assert [k.key for k in store.keys("acme")] == ["acme/r1.safetensors", "acme/r3.safetensors"]
    assert [k.key for k in store.keys("team/b")] == ["team_b/r2.safetensors"]
    assert [k.name for k in store.keys()] == ["r1.safetensors", "r2.safetensors", "r3.safetensors"]  # oldest first
    assert store.meta("acme/r3.safetensors") == _meta("acme", "r3")
    assert store.meta(SampleKey("team_b", "r2.safetensors")).tenant == "team/b"
    assert not list(tmp_path.rglob(".tmp-*")) and not list(tmp_path.rglob("*.lock"))
    stats = store.stats()
    assert (stats.samples, stats.bytes) == (3, sum(p.stat().st_size for p in (a1, b1, a2)))


def test_eviction_is_oldest_first_across_tenants_and_stays_under_the_bound(tmp_path):
    size = len(_blob(_meta()))
    store = SampleStore(tmp_path, max_bytes=3 * size + size // 2, ttl_s=60)  # room for three
    for i in range(7):  # back to back: order must not depend on the file system's clock
        store.put_bytes("acme" if i % 2 else "other", f"r{i}", _blob(_meta()))
        assert store.stats().bytes <= store.max_bytes
    assert [k.name for k in store.keys()] == ["r4.safetensors", "r5.safetensors", "r6.safetensors"]
    stats = store.stats()
    assert (stats.samples, stats.evicted_full, stats.evicted_ttl) == (3, 4, 0)
    assert stats.high_water_bytes == 3 * size <= stats.max_bytes


def test_a_sample_larger_than_the_store_is_refused_and_nothing_is_evicted(tmp_path):
    store = SampleStore(tmp_path, max_bytes=5000, ttl_s=60)
    store.put_bytes("acme", "small", _blob(nbytes=100))
    with pytest.raises(ValueError, match="exceeds max_bytes"):
        store.put_bytes("acme", "huge", _blob(nbytes=6000))
    assert [k.name for k in store.keys()] == ["small.safetensors"] and store.stats().evicted_full == 0


def test_ttl_expires_old_samples_on_enforce_and_on_put(tmp_path):
    store = SampleStore(tmp_path, max_bytes=1 << 20, ttl_s=10)
    old = store.put_bytes("acme", "old", _blob())
    store.put_bytes("acme", "young", _blob())
    _age(old, 11)
    store.put_bytes("acme", "new", _blob())  # a write applies the TTL first
    assert [k.name for k in store.keys()] == ["young.safetensors", "new.safetensors"]
    assert store.stats().evicted_ttl == 1
    store.enforce(now=time.time() + 5)
    assert len(store.keys()) == 2  # not yet expired
    store.enforce(now=time.time() + 11)
    stats = store.stats()
    assert (stats.samples, stats.bytes, stats.evicted_ttl, stats.evicted_full) == (0, 0, 3, 0)


def test_stats_persist_across_store_instances(tmp_path):
    size = len(_blob())
    first = SampleStore(tmp_path, max_bytes=2 * size, ttl_s=60)
    for i in range(3):
        first.put_bytes("acme", f"r{i}", _blob())
    for key in first.keys():
        first.delete(key)
    second = SampleStore(tmp_path, max_bytes=2 * size, ttl_s=60)  # e.g. the trainer, or a restarted replica
    stats = second.stats()
    assert (stats.samples, stats.bytes, stats.high_water_bytes, stats.evicted_full) == (0, 0, 2 * size, 1)


@pytest.mark.parametrize(
    "key",
    [
        "../escape.safetensors",
        "acme/../../escape.safetensors",
        "/etc/passwd",
        ".stats.json",
        "acme",
        "acme/r0.txt",
        "acme/.tmp-r0.safetensors",
        "acme/sub/r0.safetensors",
        "",
    ],
)
def test_a_key_that_does_not_name_a_sample_in_the_store_is_refused(tmp_path, key):
    store = SampleStore(tmp_path / "store", max_bytes=1 << 20, ttl_s=60)
    store.put_bytes("acme", "r0", _blob(_meta()))
    (tmp_path / "escape.safetensors").write_bytes(_blob(_meta()))
    with pytest.raises(ValueError):
        store.meta(key)
    with pytest.raises(ValueError):
        store.read(key)


@pytest.mark.parametrize("tenant", ["..", ".", ".hidden", "a/../..", ""])
def test_hostile_tenant_ids_stay_inside_the_store(tmp_path, tenant):
    store = SampleStore(tmp_path / "store", max_bytes=1 << 20, ttl_s=60)
    path = store.put_bytes(tenant, "r", _blob())
    assert path.parent.parent == tmp_path / "store" and path.parent.name == tenant_slug(tenant)
    assert [k.key for k in store.keys(tenant)] == [f"{path.parent.name}/r.safetensors"]  # visible, so bounded


@pytest.mark.parametrize("request_id", [".tmp-x", "..", "", "a/../../b"])
def test_odd_request_ids_still_make_visible_bounded_samples(tmp_path, request_id):
    store = SampleStore(tmp_path, max_bytes=1 << 20, ttl_s=60)
    path = store.put_bytes("acme", request_id, _blob())
    assert path.parent == tmp_path / "acme"
    assert store.stats().samples == 1 and store.keys("acme")[0].name == path.name


def test_stale_temporary_files_of_a_crashed_writer_are_removed_after_the_ttl(tmp_path):
    store = SampleStore(tmp_path, max_bytes=1 << 20, ttl_s=10)
    store.put_bytes("acme", "r", _blob())
    stale, live = tmp_path / "acme" / ".tmp-dead.safetensors", tmp_path / "acme" / ".tmp-live.safetensors"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    _age(stale, 11)
    store.enforce()
    assert not stale.exists() and live.exists() and store.stats().samples == 1


def test_read_of_an_evicted_key_is_file_not_found(tmp_path):
    store = SampleStore(tmp_path, max_bytes=1 << 20, ttl_s=60)
    store.put_bytes("acme", "r", _blob(_meta()))
    store.delete("acme/r.safetensors")
    with pytest.raises(FileNotFoundError):
        store.meta("acme/r.safetensors")


_ROUND_TRIP = r'''
import sys, torch
from contract.capture import SampleMeta
from drafters.capture.store import SampleStore
store = SampleStore(sys.argv[1], max_bytes=1 << 20, ttl_s=60)
hs = torch.randn(5, 3, 16, dtype=torch.bfloat16)
ids = torch.arange(5, dtype=torch.long)
meta = SampleMeta("acme", 3, 12.5, (0, 1, 2), "req-1")
path = store.put("acme", "req-1", {"hidden_states": hs[:, ::1], "token_ids": ids}, meta)
tensors, got = store.read(store.keys("acme")[0])
assert got == meta, got
assert torch.equal(tensors["hidden_states"], hs) and tensors["hidden_states"].dtype == torch.bfloat16
assert torch.equal(tensors["token_ids"], ids)
assert store.meta(store.keys()[0]) == meta
print("ok", path)
'''


@pytest.mark.vllm
def test_put_read_round_trip_with_torch(tmp_path, vllm_available):
    from testbed import vllm_env

    proc = subprocess.run(
        [str(vllm_env.python()), "-c", _ROUND_TRIP, str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]
