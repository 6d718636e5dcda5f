"""The one settings tree: YAML + env, nested sections, errors that name the
field, one profile parser for every plane, the generated configuration doc,
and start-up failures of the gateway and the controller alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract.settings import ConfigError, Settings, hash_key, load_settings
from specgate.config_doc import render_configuration_doc

REPO = Path(__file__).resolve().parents[2]


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
gateway:
  routing: prefix_affinity
controller:
  tick_s: 2.5
  decision: {{min_dwell_s: 12, draft_caps: [2, 4]}}
""",
    )
    monkeypatch.setenv("SPECGATE_ADMIN_KEY", "adm")
    monkeypatch.setenv("SPECGATE_GATEWAY__CONNECT_TIMEOUT_S", "0.5")
    monkeypatch.setenv("SPECGATE_CONTROLLER__DECISION__ON_MARGIN", "0.07")
    monkeypatch.setenv("SPECGATE_CONTROLLER__RESTART_GATE__MIN_LOSS", "0.6")
    s = load_settings(p)
    assert s.replicas[0].url == "http://127.0.0.1:8000" and s.replicas[0].name == "127.0.0.1:8000"
    assert s.replicas[0].profile == "dspark-b8-av"
    assert s.tenants[0].speculation.enabled is False
    assert s.admin_key == "adm" and s.gateway.connect_timeout_s == 0.5 and s.gateway.routing == "prefix_affinity"
    assert s.redis_url is None  # embedded store
    # YAML and env merge inside a section; untouched settings keep their defaults.
    assert s.controller.tick_s == 2.5 and s.controller.decision.min_dwell_s == 12
    assert s.controller.decision.draft_caps == (2, 4) and s.controller.decision.on_margin == 0.07
    assert s.controller.decision.off_margin == 0.03 and s.controller.restart_gate.min_loss == 0.6


def test_keyword_overrides_merge_into_a_section(tmp_path):
    s = load_settings(write(tmp_path, "controller: {tick_s: 3, decision: {confirm_ticks: 5}}"),
                      controller={"decision": {"min_dwell_s": 1}})
    assert s.controller.tick_s == 3 and s.controller.decision.confirm_ticks == 5 and s.controller.decision.min_dwell_s == 1


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
        ("gateway: {connect_timeout_s: fast}", "gateway.connect_timeout_s"),
        ("gateway: {routing: random}", "gateway.routing"),
        ("gateway: {tracing: {exporter: jaeger}}", "gateway.tracing.exporter"),
        ("routing: least_load", "routing"),  # a gateway setting outside its section
        ("controller: {decision: {confirm_ticks: 0}}", "controller.decision.confirm_ticks"),
        ("sim: {time_scale: -1}", "sim.time_scale"),
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


@pytest.mark.parametrize("label", ["dspark-b32", "dspark-b8-fast", "eagle3", "ngram-k4-av"])
def test_an_unsupported_profile_is_rejected_with_the_accepted_labels(tmp_path, label):
    with pytest.raises(ConfigError) as exc:
        load_settings(write(tmp_path, f"replicas: [{{url: 'http://x:1', profile: {label}}}]"))
    assert "replicas.0.profile" in str(exc.value) and "dspark-b{4,8,16}[-av]" in str(exc.value)


def test_profiles_are_normalised_and_an_unquoted_yaml_off_is_off(tmp_path):
    s = load_settings(write(tmp_path, "replicas: [{url: 'http://x:1', profile: off}, {url: 'http://y:1', profile: DSPARK-B8-AV},"
                                      " {url: 'http://z:1', profile: NGRAM-K4}, {url: 'http://w:1', profile: eagle3-k8}]"))
    assert [r.profile for r in s.replicas] == ["off", "dspark-b8-av", "ngram-k4", "eagle3-k8"]


@pytest.mark.parametrize("command", [["gateway", "--port", "1"], ["controller"]])
def test_gateway_and_controller_refuse_an_unsupported_profile_at_startup_alike(tmp_path, command):
    p = write(tmp_path, "replicas: [{url: 'http://127.0.0.1:9', profile: dspark-b32}]")
    proc = subprocess.run([sys.executable, "-m", "specgate.cli", *command, "--config", str(p)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "replicas.0.profile: Value error, unknown speculation profile 'dspark-b32'" in proc.stderr


def test_the_configuration_doc_is_generated_from_the_model():
    """docs/configuration.md is `specgate config-doc`'s output; regenerate it when a setting changes."""
    assert (REPO / "docs" / "configuration.md").read_text() == render_configuration_doc()


def test_every_setting_has_a_documented_default():
    doc = render_configuration_doc()
    for name in ("gateway.read_timeout_s", "controller.decision.min_dwell_s", "controller.restart_gate.min_loss",
                 "sim.time_scale", "redis_url", "SPECGATE_CONTROLLER__DECISION__MIN_DWELL_S"):
        assert f"`{name}`" in doc
    assert "total_timeout_s" not in doc  # never read: removed
    assert Settings().controller.decision.min_dwell_s == 30.0


def test_an_unquoted_yaml_boolean_in_a_text_setting_gets_a_hint(tmp_path):
    """`preferred_profile: off` reaches pydantic as False ('Input should be a
    valid string'); the error says why and how to write it."""
    p = write(tmp_path, (
        "replicas: [{url: 'http://127.0.0.1:9', profile: on}]\n"
        "tenants:\n"
        f"  - {{id: a, api_key_sha256: '{hash_key('k')}', speculation: {{preferred_profile: off}}}}\n"
    ))
    with pytest.raises(ConfigError) as err:
        load_settings(p)
    text = str(err.value)
    assert 'tenants.0.speculation.preferred_profile: Input should be a valid string (YAML reads unquoted off, no and ' \
           'false as the boolean false: write preferred_profile: "off")' in text
    assert "replicas.0.profile:" in text and "YAML reads unquoted on, yes and true as the boolean true" in text
    # A boolean setting given a boolean is no YAML accident: no hint there.
    p = write(tmp_path, "gateway: {metrics_tenant_labels: maybe}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(p)
    assert "YAML reads" not in str(err.value)


@pytest.mark.parametrize("grid", [(0, 4), (1, 1 << 17), tuple(range(1, 70))])
def test_a_schedule_grid_that_no_schedule_could_use_is_refused_at_start(grid):
    with pytest.raises(ValueError, match="schedule_grid"):
        Settings.model_validate({"controller": {"decision": {"schedule_grid": grid}}})
