"""pytest fixtures for the real-vLLM tier. Import them into a test module or an
area conftest:

    from tests.vllm_support.fixtures import tiny_model_dir, vllm_ngram_server, vllm_plain_server  # noqa: F401

- `vllm_available` (session): skips (reason from scripts/setup_vllm_env.sh) when
  .venv-vllm is missing; under CI=true / SPECGATE_REQUIRE_VLLM=1 it FAILS instead.
- `tiny_model_dir` (session): path of the generated tiny Qwen3 checkpoint
  (cached under .cache/specgate-tests/, regenerated when testbed.models.SPEC_VERSION changes).
- `mid_model_dir` (session): the ~100M-parameter `mid` Qwen3 (same cache).
- `vllm_ngram_server` (session): a VllmServer with ngram speculation (K=NGRAM_K),
  `--per-request-spec-decode-metrics summary` and the model's whole context (NGRAM_MAX_MODEL_LEN).
- `vllm_plain_server` (session): a VllmServer without speculation.
- `vllm_log_dir` (session): where server logs go.

Servers are shared through `shared_server(key, spec)`: a per-process registry, so
that two modules (or two conftests) importing these fixtures still boot each
flavour once per pytest session. Every server is stopped at interpreter exit at
the latest (atexit), and the session fixtures stop theirs at session teardown.
Another test area needing a differently-flagged server calls
`shared_server("my-key", VllmServerSpec(...))` (or uses VllmServer directly).

Tests that kill a server (failover) must not use the shared ones: start a
private VllmServer instead.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path

import pytest

from testbed import vllm_env
from testbed.vllm_server import (
    VllmBootError,
    VllmServer,
    VllmServerSpec,
    generate_model,
    ngram_speculation,
)
from testbed.models import SPEC_VERSION

NGRAM_K = 4

_servers: dict[str, VllmServer] = {}


def _stop_all() -> None:
    for server in list(_servers.values()):
        server.stop(grace_s=5)
    _servers.clear()


atexit.register(_stop_all)


def _skip_or_fail(reason: str) -> None:
    if vllm_env.required():
        pytest.fail(f"real-vLLM tier is required here (CI / SPECGATE_REQUIRE_VLLM=1) but: {reason}", pytrace=False)
    pytest.skip(reason)


def generate_tiny_model(out_dir: Path) -> Path:
    return generate_model(out_dir, "tiny")


def shared_server(key: str, spec: VllmServerSpec, log_dir: Path | None = None) -> VllmServer:
    """Boot (once per process) and return the server registered under key."""
    server = _servers.get(key)
    if server is not None and server.alive():
        return server
    server = VllmServer(spec, log_dir or (vllm_env.cache_dir() / "logs"))
    server.start()
    _servers[key] = server
    try:
        server.wait_ready()
    except VllmBootError:
        _servers.pop(key, None)
        raise
    print(f"[vllm_support] vLLM '{spec.name}' ready on {server.url} after {server.boot_seconds:.1f}s", file=sys.stderr)
    return server


def release_server(key: str) -> None:
    server = _servers.pop(key, None)
    if server is not None:
        server.stop()


@pytest.fixture(scope="session")
def vllm_available() -> None:
    reason = vllm_env.unavailable_reason()
    if reason:
        _skip_or_fail(reason)


@pytest.fixture(scope="session")
def vllm_log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_available) -> Path:
    return generate_tiny_model(vllm_env.cache_dir() / SPEC_VERSION)


@pytest.fixture(scope="session")
def mid_model_dir(vllm_available) -> Path:
    """The ~100M-parameter Qwen3 (testbed/models.py --arch mid): big enough that two
    CPU cores turn compute-bound at a handful of tokens per step."""
    from testbed.models import SPEC_VERSIONS

    return generate_model(vllm_env.cache_dir() / SPEC_VERSIONS["mid"], "mid")


# The tiny model's whole context (its max_position_embeddings): the bed-validity and schedule
# tests keep long neighbours decoding beside a short request, and on a loaded machine the short
# one can take seconds to reach the engine -- a neighbour's life is bounded by this length.
NGRAM_MAX_MODEL_LEN = 4096


def ngram_server_spec(model_dir: Path, **overrides) -> VllmServerSpec:
    return VllmServerSpec(
        model_dir=str(model_dir),
        **{"name": "ngram", "speculative_config": ngram_speculation(k=NGRAM_K), "max_model_len": NGRAM_MAX_MODEL_LEN,
           **overrides},
    )


def plain_server_spec(model_dir: Path, **overrides) -> VllmServerSpec:
    return VllmServerSpec(model_dir=str(model_dir), **{"name": "plain", **overrides})


@pytest.fixture(scope="session")
def vllm_ngram_server(tiny_model_dir, vllm_log_dir) -> VllmServer:
    yield shared_server("ngram", ngram_server_spec(tiny_model_dir), vllm_log_dir)
    release_server("ngram")


@pytest.fixture(scope="session")
def vllm_plain_server(tiny_model_dir, vllm_log_dir) -> VllmServer:
    yield shared_server("plain", plain_server_spec(tiny_model_dir), vllm_log_dir)
    release_server("plain")
