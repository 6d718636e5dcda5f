"""Helpers for the deployment checks.

The checks run real tools (docker-compose, promtool, hadolint) that
scripts/setup_tools.sh installs. Where a tool is missing on a developer's
machine the check skips and says which setup script installs it; under CI
(CI=true) a missing tool is a failure, because CI must run every check.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def require_tool(name: str) -> str:
    """Absolute path of a tool on PATH or in the project venv; skip (or fail under CI) if absent."""
    venv_bin = Path(sys.executable).parent
    path = shutil.which(name) or shutil.which(name, path=str(venv_bin))
    if path:
        return path
    msg = f"{name} is not installed; run scripts/setup_tools.sh"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture
def repo() -> Path:
    return REPO
