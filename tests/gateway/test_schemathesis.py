"""Schemathesis over the gateway's whole OpenAPI document (the completion
endpoints included): no 5xx and no response that contradicts the document.

A real uvicorn gateway (in this process, `conftest.start_gateway`) in front
of the fake backend, a budgeted tenant (so 429s are part of the mix) and a
configured replica that is down (so /v1/models lists a model no healthy
replica serves). The schemathesis CLI runs in a subprocess: its own engine
(examples, coverage, fuzzing; positive and negative data) rather than a
hand-rolled loop. `schemathesis_hooks.py` makes completion bodies name a
model the gateway knows, so cases reach admission, routing and the relay.

Checks left out, and why: `negative_data_rejection` / `positive_data_acceptance`
(the gateway validates only what it must and forwards the rest unchanged for
the replica to judge: a value the document calls invalid may be accepted by
the fake backend, by design), `unsupported_method` and the auth checks (401
and 405 have their own tests). One worker: Hypothesis' generation is not
thread-safe in this version (it raised a SystemError in `ast` with -w 2).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.procs import free_port

from .conftest import KEYS, tenant

pytest.importorskip("schemathesis")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance"
MAX_EXAMPLES = int(os.environ.get("SPECGATE_SCHEMATHESIS_EXAMPLES", "300"))


def test_openapi_conformance(start_backend, start_gateway, tmp_path):
    backend = start_backend()
    gw = start_gateway(
        [{"url": backend.url}, {"url": f"http://127.0.0.1:{free_port()}", "model": "down-model", "name": "down"}],
        [tenant("alpha", tokens_per_minute=200_000), tenant("beta")],
    )
    cmd = [
        sys.executable, "-m", "schemathesis.cli", "run", gw.url + "/openapi.json",
        "--checks", CHECKS,
        "-H", f"Authorization: Bearer {KEYS['alpha']}",
        "--max-examples", str(MAX_EXAMPLES),
        "--workers", "1",
        "--seed", "20261201",
        "--generation-database", "none",
        "--no-color",
    ]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.gateway.schemathesis_hooks", "PYTHONPATH": str(REPO)}
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    cases = re.search(r"(\d+) generated, (\d+) passed", out)
    assert cases and int(cases.group(1)) == int(cases.group(2)) >= 200, out[-3000:]
    # The run reached the replica, not only the gateway's own checks.
    assert backend.fake.stats["completed"] > 0
    print(f"schemathesis: {cases.group(1)} cases, all passed")
