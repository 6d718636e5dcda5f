import json

from typer.testing import CliRunner

from contract.profiles import LABEL_PATTERNS, PROFILE_LABELS
from specgate.cli import app

runner = CliRunner()


def test_profile_show_prints_vllm_command():
    r = runner.invoke(app, ["profile", "show", "dspark-b8", "--drafter", "/ckpt/d8", "--target", "Qwen/Qwen3-14B"])
    assert r.exit_code == 0, r.output
    line = r.output.strip()
    assert line.startswith("VLLM_USE_V2_MODEL_RUNNER=1 vllm serve Qwen/Qwen3-14B --speculative-config")
    assert '"num_speculative_tokens":8' in line and '"enable_adaptive_verification":false' in line
    assert "--per-request-spec-decode-metrics summary" in line


def test_profile_show_json_and_errors():
    r = runner.invoke(app, ["profile", "show", "dspark-b16-av", "--drafter", "d", "--json"])
    data = json.loads(r.output)
    assert data["speculative_config"]["enable_adaptive_verification"] is True
    assert runner.invoke(app, ["profile", "show", "dspark-b7", "--drafter", "d"]).exit_code == 2
    assert runner.invoke(app, ["profile", "show", "dspark-b8"]).exit_code == 2  # no drafter
    off = runner.invoke(app, ["profile", "show", "off"])
    assert off.exit_code == 0 and "speculative" not in off.output
    assert runner.invoke(app, ["profile", "list"]).output.split() == list(PROFILE_LABELS)


def test_profile_show_ngram_needs_no_drafter():
    r = runner.invoke(app, ["profile", "show", "ngram-k4"])
    assert r.exit_code == 0, r.output
    line = r.output.strip()
    assert line.startswith("VLLM_USE_V2_MODEL_RUNNER=0 vllm serve Qwen/Qwen3-8B --speculative-config")
    assert ('\'{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":1}\'') in line
    assert line.endswith("--per-request-spec-decode-metrics summary")
    r = runner.invoke(app, ["profile", "show", "ngram-k8", "--prompt-lookup-min", "2", "--prompt-lookup-max", "3",
                            "--json"])
    data = json.loads(r.output)
    assert data["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 3,
                                          "prompt_lookup_min": 2}
    assert data["method"] == "ngram" and data["model_runner"] == "v1" and data["knobs"] == ["max_draft", "max_batch", "schedule"]
    bad = runner.invoke(app, ["profile", "show", "dspark-b8", "--drafter", "d", "--prompt-lookup-max", "3"])
    assert bad.exit_code == 2 and "ngram profiles only" in bad.output


def test_profile_show_drafter_methods_and_errors():
    r = runner.invoke(app, ["profile", "show", "eagle3-k4", "--drafter", "/ckpt/e3"])
    assert r.exit_code == 0 and '{"method":"eagle3","model":"/ckpt/e3","num_speculative_tokens":4}' in r.output
    r = runner.invoke(app, ["profile", "show", "dflash-b16", "--drafter", "/ckpt/df"])
    assert r.exit_code == 0 and '"method":"dflash"' in r.output and r.output.startswith("VLLM_USE_V2_MODEL_RUNNER=0 ")
    for label, kind in (("eagle3-k4", "EAGLE-3"), ("dflash-b8", "DFlash"), ("dspark-b8", "DSpark")):
        r = runner.invoke(app, ["profile", "show", label])
        assert r.exit_code == 2 and f"needs a{'n' if kind[0] == 'E' else ''} {kind} drafter checkpoint path" in r.output
    r = runner.invoke(app, ["profile", "show", "dflash-b8-av", "--drafter", "d"])
    assert r.exit_code == 2 and "-av (adaptive verification) is available only for dspark" in r.output
    r = runner.invoke(app, ["profile", "show", "nope"])
    assert r.exit_code == 2 and LABEL_PATTERNS in r.output
    assert LABEL_PATTERNS in runner.invoke(app, ["profile", "--help"], env={"COLUMNS": "300"}).output


def test_checkpoint_validate_cli(speculators_checkpoints):
    ok = runner.invoke(app, ["checkpoint", "validate", str(speculators_checkpoints / "good-8b-b8"),
                             "--target", "Qwen/Qwen3-8B", "--profile", "dspark-b8-av"])
    assert ok.exit_code == 0 and ok.output.startswith("ok: dspark drafter for Qwen/Qwen3-8B")
    bad = runner.invoke(app, ["checkpoint", "validate", str(speculators_checkpoints / "gated-8b"),
                              "--target", "Qwen/Qwen3-8B"])
    assert bad.exit_code == 1 and "vanilla" in bad.output


def test_sim_replica_rejects_bad_options():
    r = runner.invoke(app, ["sim-replica", "--profile", "dspark-b5"])
    assert r.exit_code == 2 and "unknown speculation profile" in r.output
    r = runner.invoke(app, ["sim-replica", "--profile", "eagle3-k4"])
    assert r.exit_code == 2 and "cannot be simulated" in r.output and "dspark-b8-av" in r.output
    assert runner.invoke(app, ["sim-replica", "--gpu", "a100"]).exit_code == 2


def test_drafter_layers_prints_the_capture_ids_of_a_drafter_on_a_target(tmp_path):
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    target.mkdir()
    drafter.mkdir()
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 36}))
    (drafter / "config.json").write_text(json.dumps({"aux_hidden_state_layer_ids": [2, 18, 33]}))
    result = runner.invoke(app, ["drafter", "layers", "--target", str(target), "--drafter", str(drafter)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "2,18,33,36"  # the drafter's features + the target's last layer (pre-norm)
    # No drafter: the target's default feature layers (speculators' [2, L/2, L-3]) + L.
    result = runner.invoke(app, ["drafter", "layers", "--target", str(target)])
    assert result.output.strip() == "2,18,33,36"
    # A multimodal target nests its text layers.
    (target / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 4}}))
    result = runner.invoke(app, ["drafter", "layers", "--target", str(target), "--drafter", str(drafter)])
    assert result.exit_code == 2 and "outside" in result.output  # aux 18, 33 do not exist on a 4-layer target
    result = runner.invoke(app, ["drafter", "layers", "--target", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "error:" in result.output
