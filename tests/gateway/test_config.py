"""Configuration: YAML + env, errors that name the field, CLI start-up failure."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.config import ConfigError, hash_key, load_settings


def write(tmp_path, text):
    p = tmp_path / "gw.yaml"
    p.write_text(text)
    return p


def test_yaml_and_env(tmp_path, monkeypatch):
    p = write(
        tmp_path,
        f"""
replicas:
  - url: http://127.0.0.1:8000/
    profile: dspark-b8-av
tenants:
  - id: acme
    api_key_sha256: {hash_key('k')}
    requests_per_minute: 60
    speculation: {{enabled: false}}
routing: prefix_affinity
""",
    )
    monkeypatch.setenv("SPECGATE_ADMIN_KEY", "adm")
    monkeypatch.setenv("SPECGATE_CONNECT_TIMEOUT_S", "0.5")
    s = load_settings(p)
    assert s.replicas[0].url == "http://127.0.0.1:8000" and s.replicas[0].name == "127.0.0.1:8000"
    assert s.replicas[0].profile == "dspark-b8-av"
    assert s.tenants[0].speculation.enabled is False
    assert s.admin_key == "adm" and s.connect_timeout_s == 0.5 and s.routing == "prefix_affinity"
    assert s.redis_url is None  # embedded store


def test_env_json_replicas(monkeypatch):
    monkeypatch.setenv("SPECGATE_REPLICAS", '[{"url": "http://10.0.0.1:8000", "model": "m"}]')
    assert load_settings().replicas[0].model == "m"


@pytest.mark.parametrize(
    "text, field",
    [
        ("replicas: [{url: 'ftp://x'}]", "replicas.0.url"),
        ("replicas: [{url: 'http://x:1', profile: 'turbo'}]", "replicas.0.profile"),
        ("tenants: [{id: a, api_key_sha256: plaintext-key}]", "tenants.0.api_key_sha256"),
        (f"tenants: [{{id: a, api_key_sha256: {'a' * 64}, tokens_per_minute: -5}}]", "tenants.0.tokens_per_minute"),
        ("replica: []", "replica"),
        ("connect_timeout_s: fast", "connect_timeout_s"),
        ("routing: random", "routing"),
        ("tracing: {exporter: jaeger}", "tracing.exporter"),
    ],
)
def test_invalid_config_names_the_field(tmp_path, text, field):
    with pytest.raises(ConfigError) as exc:
        load_settings(write(tmp_path, text))
    assert f"  {field}:" in str(exc.value)


def test_duplicate_names_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="unique"):
        load_settings(write(tmp_path, "replicas: [{url: 'http://a:1', name: r}, {url: 'http://b:1', name: r}]"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(write(tmp_path, "replicas: [unclosed"))
    with pytest.raises(ConfigError, match="No such file"):
        load_settings(tmp_path / "missing.yaml")


def test_cli_fails_at_startup_naming_the_field(tmp_path):
    p = write(tmp_path, "tenants: [{id: a, api_key_sha256: nope}]")
    proc = subprocess.run(
        [sys.executable, "-m", "specgate.cli", "gateway", "--config", str(p), "--port", "1"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "tenants.0.api_key_sha256" in proc.stderr


def test_cli_hash_key():
    proc = subprocess.run([sys.executable, "-m", "specgate.cli", "hash-key", "sk-1"], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == hash_key("sk-1")
