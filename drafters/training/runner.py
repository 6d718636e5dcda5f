"""Run `python -m drafters.training ...` in an interpreter that has torch.

Why a subprocess: the `specgate` CLI lives in the gateway's environment, which
deliberately has no torch (the gateway must stay small); training needs torch
and speculators, which specgate's vLLM environment has. No torch here.

Interpreter, first that works: `--python` when given (an error if it lacks
torch or speculators), the current interpreter, `$SPECGATE_VLLM_VENV/bin/python`,
`<repo>/.venv-vllm/bin/python`. The child inherits stdout/stderr, so its
progress bar streams straight to the terminal.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NEEDS = ("torch", "speculators")
_PROBE = "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in %r) else 3)" % (NEEDS,)


class NoTorchError(RuntimeError):
    """No interpreter with torch and speculators was found (message says where it looked)."""


def _has_deps(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", _PROBE], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def current_has_deps() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in NEEDS)


def candidates(explicit: str | None = None, env: dict | None = None) -> list[tuple[str, str]]:
    """(interpreter, where it came from), in the order tried."""
    env = os.environ if env is None else env
    if explicit:
        return [(explicit, "--python")]
    out = [(sys.executable, "this interpreter")]
    venv = env.get("SPECGATE_VLLM_VENV")
    if venv:
        out.append((str(Path(venv) / "bin" / "python"), "$SPECGATE_VLLM_VENV"))
    out.append((str(REPO_ROOT / ".venv-vllm" / "bin" / "python"), "<repo>/.venv-vllm"))
    return out


def find_python(explicit: str | None = None, env: dict | None = None) -> str:
    tried = []
    for python, where in candidates(explicit, env):
        ok = current_has_deps() if python == sys.executable and where == "this interpreter" else _has_deps(python)
        if ok:
            return python
        tried.append(f"{python} ({where})")
    raise NoTorchError(
        "training needs torch and speculators, and none of these interpreters has them: " + "; ".join(tried)
        + ". Install specgate's vLLM environment (scripts/setup_vllm_env.sh), set SPECGATE_VLLM_VENV to it, "
        "or pass --python /path/to/python."
    )


def run(args: list[str], python: str) -> int:
    """Run the training module with `args`; returns its exit status."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return subprocess.run([python, "-m", "drafters.training", *args], env=env, cwd=str(REPO_ROOT)).returncode
