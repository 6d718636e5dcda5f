"""`specgate drafter ...` in the gateway's environment (no torch): the
interpreter search and its errors. The torch runs are in test_train.py."""

from __future__ import annotations

import sys

from typer.testing import CliRunner

from drafters.training import runner
from specgate.cli import app

cli = CliRunner()


def test_no_interpreter_with_torch_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "current_has_deps", lambda: False)
    monkeypatch.setattr(runner, "REPO_ROOT", tmp_path)  # no <repo>/.venv-vllm there
    monkeypatch.setenv("SPECGATE_VLLM_VENV", str(tmp_path / "nowhere"))
    r = cli.invoke(app, ["drafter", "train", "--tenant", "a", "--target", "t", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert "needs torch and speculators" in r.output and "SPECGATE_VLLM_VENV" in r.output
    assert str(tmp_path / "nowhere" / "bin" / "python") in r.output


def test_explicit_python_is_the_only_candidate(tmp_path):
    assert runner.candidates(str(tmp_path / "py")) == [(str(tmp_path / "py"), "--python")]
    r = cli.invoke(app, ["drafter", "eval", "d", "--tenant", "a", "--target", "t", "--python", str(tmp_path / "py")])
    assert r.exit_code == 2 and f"{tmp_path / 'py'} (--python)" in r.output


def test_search_order(monkeypatch, tmp_path):
    cands = runner.candidates(None, {"SPECGATE_VLLM_VENV": str(tmp_path)})
    assert [w for _, w in cands] == ["this interpreter", "$SPECGATE_VLLM_VENV", "<repo>/.venv-vllm"]
    assert cands[0][0] == sys.executable and cands[1][0] == str(tmp_path / "bin" / "python")
