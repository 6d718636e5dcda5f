"""`specgate drafter train|eval` on HF-computed samples (conftest.py): the
training run, its checkpoint, resume and the offline evaluation."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from .conftest import OTHER_SAMPLES, TENANT, TENANT_SAMPLES, TRAIN_ARGS, specgate

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_training_lowers_heldout_loss_and_raises_offline_acceptance(trained):
    r = trained["result"]
    print(f"\n[offline, held-out] loss {r['heldout_loss_before']:.4f} -> {r['heldout_loss_after']:.4f}; "
          f"acceptance (served-equivalent) {r['acceptance_current']:.3f} -> {r['acceptance_new']:.3f}; "
          f"all anchors {r['acceptance_all_anchors_current']:.3f} -> {r['acceptance_all_anchors_new']:.3f}",
          file=sys.stderr)
    assert r["heldout_loss_after"] < 0.93 * r["heldout_loss_before"]
    assert r["acceptance_new"] > r["acceptance_current"] + 0.1
    assert r["acceptance_all_anchors_new"] > r["acceptance_all_anchors_current"] + 0.2
    ev = json.loads((trained["dir"] / "eval.json").read_text())
    assert ev["new"]["acceptance_length"] == r["acceptance_new"]
    assert ev["current"]["drafter"].endswith("for-tiny-qwen3-v2") and ev["new"]["samples"] >= 1
    assert all(k.startswith(f"{TENANT}/") for k in ev["held_out_samples"])


def test_only_the_tenants_samples_train_and_held_out_ones_never_do(trained):
    t = json.loads((trained["dir"] / "training.json").read_text())
    assert t["train_samples"] + t["held_out_samples"] == TENANT_SAMPLES  # not the other tenant's OTHER_SAMPLES
    assert OTHER_SAMPLES > 0 and t["held_out_samples"] >= 1
    assert t["capture_layer_ids"] == [0, 1, 2] and t["spec"]["target_layer_ids"] == [0, 1, 2]
    assert t["result"]["stopped"] == "max_steps" and t["result"]["step"] == 200


def test_checkpoint_passes_specgate_checkpoint_validate(trained, tiny_model_dir):
    proc = specgate("checkpoint", "validate", str(trained["dir"]), "--target", str(tiny_model_dir),
                    "--profile", "dspark-b4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: dspark drafter") and "block_size=4" in proc.stdout


def test_rerun_resumes_from_the_saved_step(trained, capture_store, untrained_drafter, tiny_model_dir, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(trained["dir"].parent / f"{trained['dir'].name}.state", tmp_path / "resumed.state")
    args = [a if a != "200" else "210" for a in TRAIN_ARGS]  # 10 more steps in all
    proc = specgate("drafter", "train", "--tenant", TENANT, "--store", str(capture_store), "--target",
                    str(tiny_model_dir), "--init-from", str(untrained_drafter), "--out", str(out), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "training.json").read_text())["result"]
    assert (res["resumed_from"], res["step"], res["steps_this_run"]) == (200, 210, 10)
    # the held-out loss before training is the original run's, not the resumed model's
    assert res["heldout_loss_before"] == trained["result"]["heldout_loss_before"]


def test_resume_refuses_another_runs_state(trained, capture_store, tiny_model_dir, tmp_path):
    shutil.copytree(trained["dir"].parent / f"{trained['dir'].name}.state", tmp_path / "other.state")
    proc = specgate("drafter", "train", "--tenant", TENANT, "--store", str(capture_store), "--target",
                    str(tiny_model_dir), "--out", str(tmp_path / "other"), "--block-size", "8", "--max-steps", "1")
    assert proc.returncode == 2 and "belongs to another run" in proc.stderr
    assert not (tmp_path / "other").exists()


def test_eval_command_reproduces_the_training_runs_numbers(trained, untrained_drafter, capture_store, tiny_model_dir,
                                                           tmp_path):
    out = tmp_path / "eval.json"
    proc = specgate("drafter", "eval", str(trained["dir"]), str(untrained_drafter), "--tenant", TENANT,
                    "--store", str(capture_store), "--target", str(tiny_model_dir), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())["drafters"]
    ev = json.loads((trained["dir"] / "eval.json").read_text())
    assert got[str(trained["dir"])]["acceptance_length"] == pytest.approx(ev["new"]["acceptance_length"])
    assert got[str(untrained_drafter)]["acceptance_length"] == pytest.approx(ev["current"]["acceptance_length"])
