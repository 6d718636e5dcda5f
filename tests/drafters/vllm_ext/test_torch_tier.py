"""Run the torch-only tests of this package inside .venv-vllm.

The gateway's .venv has no torch (by design), so `test_confidence_floor.py`
skips there; this test runs it with .venv-vllm's interpreter, where torch and
vLLM's adaptive-verification code live, and fails with pytest's own report if
anything in it fails. This .venv's site-packages are appended to the END of the
child's sys.path: pytest (and tests/conftest.py's redis import) resolve from
there when .venv-vllm lacks them, while torch, numpy and vllm still come from
.venv-vllm, which is searched first.
"""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import pytest

from testbed import vllm_env

HERE = Path(__file__).parent
TORCH_MODULES = ["test_confidence_floor.py", "test_scheduler_caps.py", "test_expand_fix.py"]


@pytest.mark.vllm
def test_confidence_floor_suite_in_vllm_env():
    reason = vllm_env.unavailable_reason()
    if reason:
        if vllm_env.required():
            pytest.fail(reason)
        pytest.skip(reason)
    lean_site = sysconfig.get_paths()["purelib"]
    code = f"import sys\nsys.path.append({lean_site!r})\nimport pytest\nsys.exit(pytest.main(sys.argv[1:]))\n"
    args = ["-q", "-p", "no:cacheprovider", "-rs", *(str(HERE / m) for m in TORCH_MODULES)]
    proc = subprocess.run(
        [str(vllm_env.python()), "-c", code, *args],
        cwd=str(vllm_env.REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, f"torch-tier tests failed in {vllm_env.venv_dir()}:\n{report}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report
