"""docker/prometheus/prometheus.yml, checked by Prometheus' own `promtool check config`."""

from __future__ import annotations

import subprocess

from tests.stack.conftest import REPO, require_tool


def _check(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [require_tool("promtool"), "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )


def test_promtool_accepts_the_stack_config():
    proc = _check(REPO / "docker" / "prometheus" / "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_rejects_a_broken_config(tmp_path):
    """The check is not vacuous: a bad scrape interval is refused by the same tool."""
    text = (REPO / "docker" / "prometheus" / "prometheus.yml").read_text()
    bad = tmp_path / "prometheus.yml"
    bad.write_text(text.replace("scrape_interval: 5s", "scrape_interval: five-seconds", 1))
    proc = _check(bad)
    assert proc.returncode != 0
