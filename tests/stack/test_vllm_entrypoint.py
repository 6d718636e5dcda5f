"""docker/vllm/entrypoint.py: the replica image's launcher, run here with --dry-run.

It must take the launch arguments from drafters.profiles (not re-implement them), refuse a
missing or unknown profile with a message, and never start vLLM in --dry-run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from contract.profiles import parse_profile
from drafters.profiles import vllm_env, vllm_launch_args
from tests.stack.conftest import REPO

ENTRYPOINT = REPO / "docker" / "vllm" / "entrypoint.py"


def _run(env: dict, *args: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPECGATE_")}
    return subprocess.run([sys.executable, str(ENTRYPOINT), "--dry-run", *args], env={**base, **env},
                          capture_output=True, text=True, timeout=60)


def test_off_profile_launches_plain_vllm():
    proc = _run({"SPECGATE_PROFILE": "off", "SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B",
                 "SPECGATE_VLLM_ARGS": "--max-num-seqs 128"}, "--max-model-len", "8192")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    expected = vllm_launch_args(parse_profile("off"), target_model="Qwen/Qwen3-8B", extra_args=[
        "--host", "0.0.0.0", "--port", "8000", "--max-num-seqs", "128", "--max-model-len", "8192"])
    assert out["argv"] == expected
    assert "--speculative-config" not in out["argv"]
    assert out["env"] == vllm_env(parse_profile("off"))


@pytest.mark.parametrize("env, needle", [
    ({"SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B"}, "SPECGATE_PROFILE"),
    ({"SPECGATE_PROFILE": "off"}, "SPECGATE_TARGET_MODEL"),
    ({"SPECGATE_PROFILE": "dspark-b7", "SPECGATE_TARGET_MODEL": "m"}, "dspark-b8"),
    ({"SPECGATE_PROFILE": "dspark-b8", "SPECGATE_TARGET_MODEL": "m"}, "SPECGATE_DRAFTER_PATH"),
])
def test_bad_environment_is_refused_with_a_message(env, needle):
    proc = _run(env)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


# Drafter checkpoints written by the real `speculators` 0.9 package (fixture of tests/drafters).
from tests.drafters.conftest import speculators_checkpoints  # noqa: E402,F401


def test_speculative_profile_validates_the_drafter_and_uses_the_profile_args(speculators_checkpoints):
    drafter = str(speculators_checkpoints / "good-8b-b8")
    proc = _run({"SPECGATE_PROFILE": "dspark-b8-av", "SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B",
                 "SPECGATE_DRAFTER_PATH": drafter})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    profile = parse_profile("dspark-b8-av")
    assert out["argv"] == vllm_launch_args(profile, target_model="Qwen/Qwen3-8B", drafter_path=drafter,
                                           extra_args=["--host", "0.0.0.0", "--port", "8000"])
    spec = json.loads(out["argv"][out["argv"].index("--speculative-config") + 1])
    assert spec["method"] == "dspark" and spec["model"] == drafter and spec["enable_adaptive_verification"] is True
    assert out["env"] == vllm_env(profile)


@pytest.mark.parametrize("name, target, needle", [
    ("gated-8b", "Qwen/Qwen3-8B", "markov"),          # vLLM implements only the vanilla Markov head
    ("good-14b-b8", "Qwen/Qwen3-8B", "Qwen3-14B"),    # drafter trained for another verifier
])
def test_unservable_drafter_is_refused_before_vllm_starts(speculators_checkpoints, name, target, needle):
    proc = _run({"SPECGATE_PROFILE": "dspark-b8", "SPECGATE_TARGET_MODEL": target,
                 "SPECGATE_DRAFTER_PATH": str(speculators_checkpoints / name)})
    assert proc.returncode == 2, proc.stdout
    assert "refused" in proc.stderr and needle.lower() in proc.stderr.lower(), proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_drafter_directory_is_refused(tmp_path):
    proc = _run({"SPECGATE_PROFILE": "dspark-b8", "SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B",
                 "SPECGATE_DRAFTER_PATH": str(tmp_path / "nope")})
    assert proc.returncode == 2
    assert "no config.json" in proc.stderr and "Traceback" not in proc.stderr
