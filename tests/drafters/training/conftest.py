"""Session fixtures of the trainer's tests: HF-computed samples of two tenants
in a real SampleStore, the untrained tiny DSpark drafter (the tenant's
"current" drafter: random seeded weights, tests/drafters/vllm_ext/tiny_dspark.py)
and one drafter trained from tenant-a's samples through the real
`specgate drafter train` CLI (which runs the torch side in .venv-vllm).

The training budget is small (the test box has two shared CPU cores); the
loss is speculators' eager `ce` (argmax labels: what greedy acceptance rewards).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import vllm_env
from testbed.cache import exclusive
from tests.vllm_support.fixtures import (  # noqa: F401
    tiny_model_dir,
    vllm_available,
    vllm_log_dir,
    vllm_plain_server,
)
from testbed.models import SPEC_VERSION as VERIFIER_VERSION

HERE = Path(__file__).parent
REPO = HERE.parents[2]
TENANT, OTHER = "tenant-a", "tenant-b"
TENANT_SAMPLES, OTHER_SAMPLES = 200, 12
MAX_NEW_TOKENS = 40
TRAIN_ARGS = ["--loss", "ce", "--lr", "1e-2", "--max-tokens", "1024", "--max-steps", "200", "--max-minutes", "15",
              "--save-every", "25"]


def torch_env() -> dict:
    return {**os.environ, "SPECGATE_VLLM_VENV": str(vllm_env.venv_dir()), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


def specgate(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """The real `specgate` CLI of this (torch-free) environment."""
    return subprocess.run([sys.executable, "-m", "specgate.cli", *args], cwd=str(REPO), env=torch_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def untrained_drafter(tiny_model_dir) -> Path:
    from tests.drafters.vllm_ext.tiny_dspark import SPEC_VERSION as DRAFTER_VERSION

    out = vllm_env.cache_dir() / f"{DRAFTER_VERSION}-for-{VERIFIER_VERSION}"
    with exclusive(out):  # test_vllm_dspark.py builds the same one, maybe on another worker
        proc = subprocess.run([str(vllm_env.python()), str(REPO / "tests/drafters/vllm_ext/tiny_dspark.py"),
                               str(tiny_model_dir), str(out)], capture_output=True, text=True, timeout=600, env=torch_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def capture_store(tiny_model_dir, tmp_path_factory) -> Path:
    """HF-computed samples (tests/drafters/training/hf_samples.py) of two tenants."""
    root = tmp_path_factory.mktemp("capture-store")
    for tenant, n in ((TENANT, TENANT_SAMPLES), (OTHER, OTHER_SAMPLES)):
        proc = subprocess.run(
            [str(vllm_env.python()), str(HERE / "hf_samples.py"), str(tiny_model_dir), str(root), tenant, str(n), "1"],
            cwd=str(REPO), env={**torch_env(), "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def trained(capture_store, untrained_drafter, tiny_model_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("trained") / "tenant-a-drafter"
    proc = specgate("drafter", "train", "--tenant", TENANT, "--store", str(capture_store), "--target",
                    str(tiny_model_dir), "--init-from", str(untrained_drafter), "--out", str(out), *TRAIN_ARGS)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\n[trained] {json.dumps(result)}", file=sys.stderr)
    return {"dir": out, "result": result, "log": proc.stderr}
