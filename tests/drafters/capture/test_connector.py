"""specgate's hidden-states connector on a real vLLM CPU capture replica.

One private server per module (the tiny 2-layer Qwen3, `extract_hidden_states`
at layer ids 0, 1, 2 = embeddings, after layer 0, after layer 1 before the
final norm), started with `capture_replica_args` exactly as the bench and
docker start one, and driven with the OpenAI SDK sending
`contract.capture.capture_request_body`. Its store is small (a handful of
samples) and its TTL short, so the bound and the TTL are exercised on the
real write path.

The test process runs in the gateway's venv (no torch): tensors are read back
with `SampleStore.read` and compared with HF transformers' hidden states in a
.venv-vllm subprocess (hf_reference.py). Samples are copied out of the live
store (same key, same bytes) as soon as they appear, so the short TTL cannot
race a slow comparison.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from contract.capture import capture_request_body, tenant_slug
from drafters.capture.replica import SAMPLE_KEY_PARAM, capture_replica_args
from drafters.capture.store import _STATS_FILE, _TMP_PREFIX, SampleStore
from testbed import vllm_env
from testbed.vllm_server import VllmServer, VllmServerSpec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HERE = Path(__file__).parent
REPO = HERE.parents[2]
LAYER_IDS = [0, 1, 2]  # the tiny model has 2 layers: id 2 = L, the last layer's pre-norm output
HIDDEN = 128
MAX_BYTES = 128_000  # about five 16-token samples of 3 x 128 float32 states
TTL_S = 20.0
SWEEP_S = 0.5
FILE_WAIT_S = 60.0


@pytest.fixture(scope="module")
def store_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("capture-store")


@pytest.fixture(scope="module")
def capture_server(tiny_model_dir, vllm_log_dir, store_root):
    spec = VllmServerSpec(
        model_dir=str(tiny_model_dir),
        name="capture",
        speculative_config=None,  # capture_replica_args carries --speculative-config
        extra_args=capture_replica_args(LAYER_IDS, store_root, MAX_BYTES, TTL_S, enforce_interval_s=SWEEP_S),
    )
    server = VllmServer(spec, vllm_log_dir)
    with server:
        yield server


@pytest.fixture(scope="module")
def client(capture_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=capture_server.base_url, api_key="unused", timeout=120, max_retries=0)




def live_store(root: Path) -> SampleStore:
    return SampleStore(root, max_bytes=MAX_BYTES, ttl_s=TTL_S)


def send(client: openai.OpenAI, body: dict) -> dict:
    """POST a capture body (or any completions body) through the SDK; the response as a dict."""
    extra = {k: v for k, v in body.items() if k not in ("model", "prompt", "max_tokens", "temperature")}
    resp = client.completions.create(
        model=body["model"],
        prompt=body["prompt"],
        max_tokens=body["max_tokens"],
        temperature=body.get("temperature", 0.0),
        extra_body=extra or None,
    )
    return resp.model_dump()


def tokenize(server: VllmServer, text: str) -> list[int]:
    resp = httpx.post(server.url + "/tokenize", json={"model": server.model, "prompt": text}, timeout=60)
    resp.raise_for_status()
    return resp.json()["tokens"]


def wait_for(path: Path, timeout_s: float = FILE_WAIT_S) -> None:
    """The reply can precede the writer thread's rename by a moment."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


_BOOKKEEPING = (_STATS_FILE, _TMP_PREFIX + _STATS_FILE)


def all_files(root: Path) -> set[str]:
    """Files under the store, minus its own bookkeeping (the stats file, and
    the temporary file it is rewritten through after every write)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name not in _BOOKKEEPING}


def hf_reference(root: Path, model_dir: Path, keys: list[str]) -> dict:
    proc = subprocess.run(
        [str(vllm_env.python()), str(HERE / "hf_reference.py")],
        input=json.dumps({"root": str(root), "model_dir": str(model_dir), "keys": keys}),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def capture_three(server: VllmServer, client: openai.OpenAI) -> tuple[list, list[dict]]:
    """Two tenants' finished requests (prompt ids and the target's own completion
    ids, what the gateway mirrors), then their capture bodies sent at once
    (batched together in the replica). Returns (tenant, prompt, completion) per
    request and the capture responses."""
    finished = []
    for tenant, text in [("acme", "the cat sat on the mat"), ("acme", "one two three four"), ("team/b", "hello world")]:
        prompt = tokenize(server, text)
        plain = send(client, {"model": server.model, "prompt": prompt, "max_tokens": 6, "return_token_ids": True})
        assert plain.get("kv_transfer_params") is None  # a normal request: no sample
        finished.append((tenant, prompt, plain["choices"][0]["token_ids"]))
    bodies = [capture_request_body(server.model, t, p, c) for t, p, c in finished]
    with cf.ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda b: send(client, b), bodies))
    return finished, responses


def test_capture_writes_the_targets_hidden_states_under_the_returned_key(
    capture_server, client, store_root, tiny_model_dir, tmp_path
):
    started = time.time()
    finished, responses = capture_three(capture_server, client)

    snapshot = tmp_path / "snapshot"
    keys = []
    for (tenant, _, _), resp in zip(finished, responses):
        params = resp["kv_transfer_params"]
        key = params[SAMPLE_KEY_PARAM]
        assert key.startswith(tenant_slug(tenant) + "/") and key.endswith(".safetensors")
        assert params["hidden_states_path"] == str(store_root / key)
        wait_for(store_root / key)
        (snapshot / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(store_root / key, snapshot / key)
        keys.append(key)
    store = live_store(store_root)
    acme = {k.key for k in store.keys("acme")}
    assert set(keys[:2]) <= acme and keys[2] not in acme and keys[2] in {k.key for k in store.keys("team/b")}
    assert store.meta(keys[2]).tenant == "team/b"  # the header alone, no torch
    assert not list(store_root.rglob("*.lock"))

    got = hf_reference(snapshot, tiny_model_dir, keys)
    for (tenant, prompt, completion), resp, key in zip(finished, responses, keys):
        sample = got[key]
        ids = prompt + completion
        assert sample["token_ids"] == ids and sample["token_dtype"] == "torch.int64"
        assert sample["shape"] == [len(ids), len(LAYER_IDS), HIDDEN] and sample["dtype"] == "torch.float32"
        assert sample["n_layers"] == 2 and sample["hidden_size"] == HIDDEN
        assert (sample["tenant"], sample["prompt_tokens"], sample["layer_ids"]) == (tenant, len(prompt), LAYER_IDS)
        assert sample["request_id"] and key.endswith(sample["request_id"] + ".safetensors")
        assert started - 1 <= sample["captured_at"] <= time.time()
        tolerance = 1e-4 * max(1.0, sample["ref_scale"])
        assert set(sample["max_abs_diff"]) == {"0", "1", "2"}
        assert all(d <= tolerance for d in sample["max_abs_diff"].values()), sample["max_abs_diff"]


@pytest.mark.parametrize(
    "kv_transfer_params",
    [
        None,
        {"hidden_states_path": "/tmp/specgate-capture-escape.safetensors"},
        {"include_output_tokens": True},
        {"specgate_capture": {"tenant": "", "prompt_tokens": 3}},
        {"specgate_capture": {"tenant": "acme", "prompt_tokens": 0}},
        {"specgate_capture": {"tenant": "acme", "prompt_tokens": "3"}},
        {"specgate_capture": {"tenant": "acme", "prompt_tokens": 99}},  # more than the prompt holds
        {"specgate_capture": "acme"},
    ],
    ids=["plain", "custom-path", "stock-option", "no-tenant", "zero-prompt", "string-count", "too-long", "not-a-block"],
)
def test_a_request_that_is_not_a_capture_writes_nothing(capture_server, client, store_root, kv_transfer_params):
    before = all_files(store_root)
    body = {"model": capture_server.model, "prompt": [11, 12, 13, 14, 15, 16], "max_tokens": 1, "temperature": 0.0}
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    resp = send(client, body)
    assert resp["choices"][0]["finish_reason"] == "length" and resp.get("kv_transfer_params") is None
    # A capture sent afterwards goes through the same single writer thread: once its
    # sample is there, anything the first request had written would be there too.
    marker = send(client, capture_request_body(capture_server.model, "marker", [21, 22, 23], [24]))
    key = marker["kv_transfer_params"][SAMPLE_KEY_PARAM]
    wait_for(store_root / key)
    assert all_files(store_root) - before == {key}
    assert not Path("/tmp/specgate-capture-escape.safetensors").exists()


def test_the_store_stays_under_its_bound_and_evicts_the_oldest(capture_server, client, store_root):
    store = live_store(store_root)
    before = store.stats()
    keys = []
    for i in range(12):  # each 16 tokens x 3 ids x 128 floats: about 5 fit
        prompt = [(37 * i + 7 * j) % 900 + 50 for j in range(12)]
        resp = send(client, capture_request_body(capture_server.model, "flood", prompt, [1, 2, 3, 4]))
        keys.append(resp["kv_transfer_params"][SAMPLE_KEY_PARAM])
        assert store.stats().bytes <= MAX_BYTES
    wait_for(store_root / keys[-1])
    after = store.stats()
    present = [k.key for k in store.keys("flood")]
    assert 2 <= len(present) < len(keys)
    assert present == keys[-len(present) :]  # the newest survive, in order
    assert after.bytes <= MAX_BYTES and after.high_water_bytes <= MAX_BYTES
    evicted = (after.evicted_full - before.evicted_full) + (after.evicted_ttl - before.evicted_ttl)
    assert after.evicted_full > before.evicted_full and evicted >= len(keys) - len(present)


def test_the_ttl_empties_an_idle_store_without_any_write(capture_server, client, store_root):
    keys = []
    for i in range(2):
        resp = send(client, capture_request_body(capture_server.model, "idle", [60 + i, 61, 62, 63], [64]))
        keys.append(resp["kv_transfer_params"][SAMPLE_KEY_PARAM])
    for key in keys:
        wait_for(store_root / key)
    store = live_store(store_root)
    before = store.stats()
    assert before.samples >= 2
    deadline = time.monotonic() + TTL_S + 60  # the replica's sweep runs every SWEEP_S; margin for a busy machine

    def drained_and_counted(stats) -> bool:
        # A sweep deletes the files first and saves its counters after, so a
        # reader can see the store empty a moment before the evictions count.
        return stats.samples == 0 and stats.evicted_ttl - before.evicted_ttl >= before.samples

    while not drained_and_counted(after := store.stats()):
        assert time.monotonic() < deadline, f"store not drained and counted: {after} (before: {before})"
        time.sleep(0.5)
    assert after.bytes == 0
    assert after.evicted_full == before.evicted_full


def test_the_replica_logs_its_store_and_bounds_and_no_failed_write(capture_server):
    log = capture_server.log_path.read_text(errors="replace")
    assert "specgate capture: writing samples to" in log and f"max_bytes {MAX_BYTES}" in log
    assert "Hidden-states write failed" not in log and "TTL sweep of" not in log
