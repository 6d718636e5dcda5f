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
    ({"SPECGATE_PROFILE": "eagle3-k4", "SPECGATE_TARGET_MODEL": "m"}, "an EAGLE-3 drafter"),
    ({"SPECGATE_PROFILE": "dflash-b8", "SPECGATE_TARGET_MODEL": "m"}, "a DFlash drafter"),
    ({"SPECGATE_PROFILE": "dflash-b8-av", "SPECGATE_TARGET_MODEL": "m", "SPECGATE_DRAFTER_PATH": "/d"},
     "-av (adaptive verification) is available only for dspark"),
    ({"SPECGATE_PROFILE": "ngram-k5", "SPECGATE_TARGET_MODEL": "m"}, "ngram-k{2,4,8}"),
    ({"SPECGATE_PROFILE": "ngram-k4", "SPECGATE_TARGET_MODEL": "m", "SPECGATE_PROMPT_LOOKUP_MIN": "x"},
     "SPECGATE_PROMPT_LOOKUP_MIN must be an integer"),
    ({"SPECGATE_PROFILE": "ngram-k4", "SPECGATE_TARGET_MODEL": "m", "SPECGATE_PROMPT_LOOKUP_MIN": "5",
      "SPECGATE_PROMPT_LOOKUP_MAX": "2"}, "prompt_lookup_min=5 must be <= prompt_lookup_max=2"),
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


def test_ngram_profile_needs_no_drafter_and_takes_the_lookup_window():
    proc = _run({"SPECGATE_PROFILE": "ngram-k4", "SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    profile = parse_profile("ngram-k4")
    assert out["argv"] == vllm_launch_args(profile, target_model="Qwen/Qwen3-8B",
                                           extra_args=["--host", "0.0.0.0", "--port", "8000"])
    assert out["env"] == vllm_env(profile) == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    spec = json.loads(out["argv"][out["argv"].index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}

    # a drafter path left in the environment (compose sets one for every replica) is ignored, with a warning
    proc = _run({"SPECGATE_PROFILE": "ngram-k8", "SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B",
                 "SPECGATE_DRAFTER_PATH": "/models/dspark", "SPECGATE_PROMPT_LOOKUP_MIN": "2",
                 "SPECGATE_PROMPT_LOOKUP_MAX": "3"})
    assert proc.returncode == 0, proc.stderr
    assert "SPECGATE_DRAFTER_PATH ignored" in proc.stderr
    argv = json.loads(proc.stdout)["argv"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert (spec["num_speculative_tokens"], spec["prompt_lookup_min"], spec["prompt_lookup_max"]) == (8, 2, 3)
    assert "/models/dspark" not in argv


def test_eagle3_drafter_is_passed_to_vllm_unvalidated():
    proc = _run({"SPECGATE_PROFILE": "eagle3-k4", "SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B",
                 "SPECGATE_DRAFTER_PATH": "AngelSlim/Qwen3-8B_eagle3", "SPECGATE_PROMPT_LOOKUP_MAX": "3"})
    assert proc.returncode == 0, proc.stderr
    assert "not validated by specgate" in proc.stderr and "ngram profiles only" in proc.stderr
    out = json.loads(proc.stdout)
    spec = json.loads(out["argv"][out["argv"].index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "AngelSlim/Qwen3-8B_eagle3", "num_speculative_tokens": 4}
    assert out["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def test_dflash_profile_validates_its_drafter_and_refuses_another_method(speculators_checkpoints, tmp_path):
    dspark = speculators_checkpoints / "good-8b-b8"
    proc = _run({"SPECGATE_PROFILE": "dflash-b8", "SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B",
                 "SPECGATE_DRAFTER_PATH": str(dspark)})
    assert proc.returncode == 2 and "it is a dspark drafter" in proc.stderr, proc.stderr

    config = json.loads((dspark / "config.json").read_text())
    config["speculators_model_type"] = "dflash"
    dflash = tmp_path / "dflash-8b-b8"
    dflash.mkdir()
    (dflash / "config.json").write_text(json.dumps(config))
    proc = _run({"SPECGATE_PROFILE": "dflash-b8", "SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B",
                 "SPECGATE_DRAFTER_PATH": str(dflash)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    spec = json.loads(out["argv"][out["argv"].index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "model": str(dflash), "num_speculative_tokens": 8}
    assert out["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    proc = _run({"SPECGATE_PROFILE": "dspark-b8", "SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B",
                 "SPECGATE_DRAFTER_PATH": str(dflash)})
    assert proc.returncode == 2 and "it is a dflash drafter" in proc.stderr, proc.stderr


def test_capture_role_launches_the_capture_replica_from_drafters_capture():
    from drafters.capture.replica import capture_replica_args

    proc = _run({"SPECGATE_ROLE": "capture", "SPECGATE_TARGET_MODEL": "Qwen/Qwen3-8B", "SPECGATE_CAPTURE_LAYERS": "1,18,33,36",
                 "SPECGATE_CAPTURE_MAX_BYTES": "1000000", "SPECGATE_CAPTURE_TTL_S": "600",
                 "SPECGATE_CAPTURE_STORE": "/dev/shm/cap", "SPECGATE_PROFILE": "dspark-b8"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["argv"] == ["vllm", "serve", "Qwen/Qwen3-8B", *capture_replica_args([1, 18, 33, 36], "/dev/shm/cap", 1000000, 600.0),
                           "--host", "0.0.0.0", "--port", "8000"]
    assert out["env"] == {}


@pytest.mark.parametrize(("env", "needle"), [
    ({"SPECGATE_ROLE": "capture", "SPECGATE_TARGET_MODEL": "m"}, "SPECGATE_CAPTURE_LAYERS"),
    ({"SPECGATE_ROLE": "capture", "SPECGATE_TARGET_MODEL": "m", "SPECGATE_CAPTURE_LAYERS": "1,x"}, "capture replica"),
    ({"SPECGATE_ROLE": "capture", "SPECGATE_TARGET_MODEL": "m", "SPECGATE_CAPTURE_LAYERS": "1,1"}, "distinct"),
    ({"SPECGATE_ROLE": "trainer", "SPECGATE_TARGET_MODEL": "m"}, "SPECGATE_ROLE"),
])
def test_capture_role_refuses_bad_settings_with_a_message(env, needle):
    proc = _run(env)
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr
