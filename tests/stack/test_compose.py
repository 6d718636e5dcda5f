"""docker-compose.yml, checked by a real compose implementation.

No Docker engine runs here, but `docker-compose config` (Debian's docker-compose
1.29, installed by scripts/setup_tools.sh) parses, interpolates, merges the
YAML anchors and validates the file against the compose schema without one.
The resolved configuration it prints is then checked for what the stack
promises: two gateways sharing one Redis, two controllers, GPU replicas with
a sim twin answering on the same network names, and a gateway configuration
that the real `contract.settings` Settings accepts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.stack.conftest import REPO, require_tool

GPU_REPLICAS = {"replica-a", "replica-b", "replica-off"}
SIM_REPLICAS = {"sim-replica-a", "sim-replica-b", "sim-replica-off"}


def _clean_env() -> dict[str, str]:
    """The caller's environment minus anything compose would interpolate (shell beats --env-file)."""
    documented = set(re.findall(r"^([A-Z0-9_]+)=", (REPO / ".env.example").read_text(), re.M))
    return {k: v for k, v in os.environ.items() if k not in documented and not k.startswith(("SPECGATE_", "COMPOSE_"))}


def _compose_config(env_file: Path, compose_file: Path = REPO / "docker-compose.yml", extra_env=None):
    tool = require_tool("docker-compose")
    env = _clean_env()
    env.update(extra_env or {})
    return subprocess.run(
        [tool, "--project-directory", str(REPO), "-f", str(compose_file), "--env-file", str(env_file), "config"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def resolved() -> dict:
    proc = _compose_config(REPO / ".env.example")
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def test_compose_config_is_valid_with_env_example(resolved):
    services = set(resolved["services"])
    assert {"redis", "gateway-1", "gateway-2", "controller-1", "controller-2", "prometheus", "grafana",
            "otel-collector", "jaeger", "dcgm-exporter"} <= services
    assert GPU_REPLICAS | SIM_REPLICAS <= services


def test_compose_tool_rejects_an_invalid_file(tmp_path):
    """The check is not vacuous: the same tool fails on a schema violation."""
    broken = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    broken["services"]["redis"]["healthcheck"]["interval"] = ["not", "a", "duration"]
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    proc = _compose_config(REPO / ".env.example", compose_file=path)
    assert proc.returncode != 0
    assert "interval" in proc.stderr


def test_required_secrets_must_be_set(tmp_path):
    env_file = tmp_path / ".env"
    lines = [l for l in (REPO / ".env.example").read_text().splitlines() if not l.startswith("SPECGATE_ADMIN_KEY=")]
    env_file.write_text("\n".join(lines) + "\n")
    proc = _compose_config(env_file)
    assert proc.returncode != 0
    assert "SPECGATE_ADMIN_KEY" in proc.stderr


def test_profiles_split_gpu_and_sim_replicas(resolved):
    services = resolved["services"]
    for name in GPU_REPLICAS | {"dcgm-exporter"}:
        assert services[name].get("profiles") == ["gpu"], name
    for name in SIM_REPLICAS:
        assert services[name].get("profiles") == ["sim"], name
    for name in ("redis", "gateway-1", "gateway-2", "controller-1", "controller-2", "prometheus", "grafana"):
        assert not services[name].get("profiles"), f"{name} must run in every profile"
    # The sim twins answer on the GPU replicas' network names, so one gateway config serves both.
    aliases = set()
    for name in SIM_REPLICAS:
        aliases |= set(services[name]["networks"]["default"]["aliases"])
        assert services[name]["command"][0] == "sim-replica"
    assert aliases == GPU_REPLICAS


def test_gpu_replicas_reserve_a_gpu_each_and_one_runs_off(resolved):
    services = resolved["services"]
    gpu_ids = []
    for name in sorted(GPU_REPLICAS):
        svc = services[name]
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
        gpu_ids += devices[0]["device_ids"]
        assert svc["environment"]["SPECGATE_TARGET_MODEL"]
        assert svc["build"]["dockerfile"] == "docker/vllm/Dockerfile"
    assert len(set(gpu_ids)) == len(gpu_ids) == 3
    assert services["replica-off"]["environment"]["SPECGATE_PROFILE"] == "off"
    for name in ("replica-a", "replica-b"):
        env = services[name]["environment"]
        assert env["SPECGATE_PROFILE"].startswith("dspark-b")
        assert env["SPECGATE_DRAFTER_PATH"].startswith("/models/")


def test_gateways_and_controllers_share_one_redis(resolved):
    services = resolved["services"]
    ports = []
    for name in ("gateway-1", "gateway-2"):
        svc = services[name]
        assert svc["command"][0] == "gateway"
        assert svc["environment"]["SPECGATE_REDIS_URL"] == "redis://redis:6379/0"
        ports += [str(p["published"]) if isinstance(p, dict) else str(p).split(":")[0] for p in svc["ports"]]
    assert len(set(ports)) == 2, ports
    ids = set()
    for name in ("controller-1", "controller-2"):
        svc = services[name]
        assert svc["command"][0] == "controller"
        assert svc["environment"]["SPECGATE_REDIS_URL"] == "redis://redis:6379/0"
        ids.add(svc["environment"]["SPECGATE_CONTROLLER__INSTANCE_ID"])
    assert len(ids) == 2
    for name in ("gateway-1", "gateway-2", "controller-1", "controller-2"):
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_gateway_environment_is_accepted_by_the_real_settings(resolved, monkeypatch):
    """The env + YAML the compose file gives a gateway builds valid `contract.settings.Settings`."""
    from contract.settings import load_settings

    env = resolved["services"]["gateway-1"]["environment"]
    for key in [k for k in os.environ if k.startswith("SPECGATE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key == "SPECGATE_CONFIG":
            continue  # the in-container path; point at the repo copy instead
        monkeypatch.setenv(key, str(value))
    settings = load_settings(REPO / "docker" / "specgate" / "specgate.yaml")
    assert {r.name for r in settings.replicas} == GPU_REPLICAS
    profiles = {r.name: r.profile for r in settings.replicas}
    assert profiles["replica-off"] == "off"
    assert profiles["replica-a"].startswith("dspark-b")
    assert settings.redis_url == "redis://redis:6379/0"
    assert settings.admin_key
    assert len(settings.tenants) >= 2
    assert settings.gateway.tracing.enabled and settings.gateway.tracing.exporter == "otlp"


def test_controller_environment_is_accepted_by_the_real_controller_config(resolved, monkeypatch):
    from contract.settings import load_settings

    for key in [k for k in os.environ if k.startswith("SPECGATE_")]:
        monkeypatch.delenv(key)
    ids = set()
    for name in ("controller-1", "controller-2"):
        for key, value in resolved["services"][name]["environment"].items():
            monkeypatch.setenv(key, str(value))
        cfg = load_settings(REPO / "docker" / "specgate" / "specgate.yaml").controller
        ids.add(cfg.instance_id)
        assert cfg.gpu in ("h100", "h200") and cfg.model.startswith("qwen3-")
        assert cfg.tick_s > 0 and not cfg.dcgm_url
    assert ids == {"controller-1", "controller-2"}


def test_every_compose_variable_is_documented_in_env_example():
    text = (REPO / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    documented = set()
    for line in (REPO / ".env.example").read_text().splitlines():
        m = re.match(r"^([A-Z0-9_]+)=", line)
        if m:
            documented.add(m.group(1))
    assert used - documented == set(), "undocumented in .env.example"
    assert documented - used - {"COMPOSE_PROFILES"} == set(), "documented but unused"


def test_mounted_files_exist(resolved):
    for name, svc in resolved["services"].items():
        for vol in svc.get("volumes", []):
            source = vol["source"] if isinstance(vol, dict) else vol.split(":")[0]
            if source.startswith(str(REPO / "docker")):
                assert Path(source).exists(), f"{name} mounts missing {source}"


def test_prometheus_scrapes_every_stack_endpoint(resolved):
    prom = yaml.safe_load((REPO / "docker" / "prometheus" / "prometheus.yml").read_text())
    targets = {}
    for job in prom["scrape_configs"]:
        for sc in job["static_configs"]:
            for t in sc["targets"]:
                targets[t] = (job["job_name"], sc.get("labels", {}))
    services = resolved["services"]
    assert targets["gateway-1:8000"][0] == targets["gateway-2:8000"][0] == "gateway"
    for name in ("controller-1", "controller-2"):
        port = services[name]["command"][services[name]["command"].index("--metrics-port") + 1]
        assert targets[f"{name}:{port}"][0] == "controller"
    for name in GPU_REPLICAS:
        job, labels = targets[f"{name}:8000"]
        assert job == "replica" and labels["replica"] == name
    assert targets["dcgm-exporter:9400"][0] == "dcgm"


def test_otel_collector_pipeline_is_wired_to_jaeger(resolved):
    cfg = yaml.safe_load((REPO / "docker" / "otel-collector" / "config.yaml").read_text())
    pipeline = cfg["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        for name in pipeline[kind]:
            assert name in cfg[kind], f"{kind} {name} used but not defined"
    assert cfg["exporters"]["otlp/jaeger"]["endpoint"].split(":")[0] == "jaeger"
    gw_endpoint = resolved["services"]["gateway-1"]["environment"]["SPECGATE_GATEWAY__TRACING__OTLP_ENDPOINT"]
    assert gw_endpoint.startswith("http://otel-collector:4318")
    assert cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    assert json.loads(json.dumps(cfg))  # plain data, no YAML tags


def test_gateway_stop_grace_period_outlasts_the_drain(resolved):
    """Docker SIGKILLs after stop_grace_period: it must come after the whole drain
    (pre-window + deadline + the request tasks' grace), or open streams are cut
    without their SSE error event."""
    from contract.settings import load_settings
    from gateway.server import ABORT_GRACE_S

    g = load_settings(REPO / "docker" / "specgate" / "specgate.yaml").gateway
    for name in ("gateway-1", "gateway-2"):
        grace = resolved["services"][name].get("stop_grace_period")
        assert grace, f"{name} has no stop_grace_period (Docker's default is 10 s)"
        seconds = float(re.fullmatch(r"(\d+)s", str(grace)).group(1))
        assert seconds > g.drain_pre_s + g.drain_deadline_s + ABORT_GRACE_S, name
