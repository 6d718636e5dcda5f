"""The suite's parallel grouping (tests/conftest.py) holds under the installed pytest and pytest-xdist.

`scripts/test.sh` runs the suite on several workers with `--dist loadgroup`, and relies on every
module that uses a costly shared session fixture (`_SHARED_FIXTURES`: a trained drafter, a tiny
vLLM server) running on one worker, so that fixture is built once. If the grouping is dropped,
nothing fails: each worker builds its own copy and the suite takes minutes longer (pytest 9.2 with
pytest-xdist 3.8 did exactly that, pytest-xdist#1386). This runs a small suite the same way and
counts the builds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import _SHARED_FIXTURES

REPO = Path(__file__).resolve().parents[1]


def test_modules_sharing_a_costly_fixture_run_on_one_worker(tmp_path):
    shared = next(iter(_SHARED_FIXTURES))
    builds = tmp_path / "builds.txt"
    ran = tmp_path / "ran.txt"
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import os
        import pytest
        from tests.conftest import pytest_collection_modifyitems  # noqa: F401 - the hook under test

        @pytest.fixture(scope="session")
        def {shared}():
            with open({str(builds)!r}, "a") as f:
                f.write(os.environ.get("PYTEST_XDIST_WORKER", "none") + "\\n")

        @pytest.fixture(autouse=True)
        def _where(request):
            with open({str(ran)!r}, "a") as f:
                f.write(request.node.module.__name__ + " " + os.environ.get("PYTEST_XDIST_WORKER", "none") + "\\n")
    """))
    for module in ("test_a", "test_b"):
        (tmp_path / f"{module}.py").write_text(
            "import pytest\n\n@pytest.mark.parametrize('i', range(6))\n"
            f"def test_uses_it({shared}, i):\n    pass\n"
        )
    (tmp_path / "test_c.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('i', range(6))\ndef test_alone(i):\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers_by_module: dict[str, set[str]] = {}
    for line in ran.read_text().splitlines():
        module, worker = line.split()
        workers_by_module.setdefault(module, set()).add(worker)
    assert sum(len(w) for w in workers_by_module.values()) == 3, workers_by_module  # each module on one worker
    assert workers_by_module["test_a"] == workers_by_module["test_b"], workers_by_module
    assert len(builds.read_text().splitlines()) == 1, "the shared fixture was built on more than one worker"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
