import json

from typer.testing import CliRunner

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
    assert runner.invoke(app, ["profile", "list"]).output.split() == [
        "off", "dspark-b4", "dspark-b4-av", "dspark-b8", "dspark-b8-av", "dspark-b16", "dspark-b16-av"]


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
    assert runner.invoke(app, ["sim-replica", "--gpu", "a100"]).exit_code == 2
