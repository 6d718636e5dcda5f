"""deploy/k8s, rendered by the real `kubectl kustomize` and checked offline.

No cluster runs here. Each overlay (sim, gpu; plus the optional components) is rendered once
per module by kubectl's embedded Kustomize, every built-in object is validated strictly by the
`kubernetes-validate` package against the pinned Kubernetes version's schemas, and the
manifests are then held to the code the same way tests/stack/test_compose.py holds
docker-compose.yml: probe paths are real gateway routes, every SPECGATE_* variable is a real
Settings field, the settings a pod would load are accepted by `contract.settings`, the replica
list points at real StatefulSet pods, the drain fits the grace period, and the GPU replicas
launch exactly what `specgate profile show` prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import yaml

from tests.stack.conftest import REPO
from tests.stack.k8s_manifests import (
    K8S,
    K8S_VERSION,
    container,
    expand,
    find,
    kustomize,
    kustomize_with,
    mounted_file,
    one,
    probe_total_s,
    resolve_env,
    settings_field,
)

OVERLAYS = ("sim", "gpu")
POOL_PROFILES = {"vllm-dspark-b8": "dspark-b8", "vllm-dspark-b8-av": "dspark-b8-av", "vllm-off": "off"}
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
ENTRYPOINT = REPO / "docker" / "vllm" / "entrypoint.py"
DOCS = REPO / "docs" / "kubernetes.md"


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> dict[str, list[dict]]:
    """Every rendering the tests judge, each rendered once (about a second each)."""
    out = {name: kustomize(K8S / "overlays" / name) for name in OVERLAYS}
    tmp = tmp_path_factory.mktemp("k8s")
    out["gpu+components"] = kustomize_with(tmp / "gpu", "gpu", ["prometheus-operator", "external-redis"])
    out["sim+prometheus"] = kustomize_with(tmp / "sim", "sim", ["prometheus-operator"])
    return out


def _statefulsets(objs):
    return [o for o in find(objs, "StatefulSet") if o["metadata"]["labels"].get("app.kubernetes.io/component") == "replica"]


def _load_settings(monkeypatch, tmp_path, objs, deployment: str, container_name: str, **overrides):
    """The Settings a pod of `deployment` builds: its resolved environment plus the settings file
    its SPECGATE_CONFIG names, read from the mounted ConfigMap."""
    from contract.settings import load_settings

    workload = one(objs, "Deployment", deployment)
    env, missing = resolve_env(objs, workload, container_name)
    # specgate-secrets is created by the operator in the gpu overlay (docs/kubernetes.md)
    assert missing <= {"Secret/specgate-secrets"}, f"{deployment} references objects the render lacks: {missing}"
    for key in [k for k in os.environ if k.startswith("SPECGATE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = tmp_path / f"{deployment}.yaml"
    config.write_text(mounted_file(objs, workload, container_name, env["SPECGATE_CONFIG"]))
    return load_settings(config, **overrides)


def _cli():
    """The `specgate` commands the manifests run, registered by the modules that own them
    (as specgate/cli.py does), so a change elsewhere in the CLI does not break these checks."""
    import typer

    from controller.cli import register as register_controller
    from drafters.cli import register as register_drafters
    from specgate.gateway_cli import register as register_gateway

    app = typer.Typer()
    for register in (register_gateway, register_controller, register_drafters):
        register(app)
    return app


def _cli_command(name: str):
    """The click command behind `specgate NAME`: its `make_context` parses args as the CLI would."""
    import typer.main

    return typer.main.get_command(_cli()).commands[name]


# --- rendering and schema validation ----------------------------------------------------------


@pytest.mark.parametrize("name", [*OVERLAYS, "gpu+components", "sim+prometheus"])
def test_every_rendered_builtin_object_passes_strict_schema_validation(renders, name):
    import kubernetes_validate

    objs = renders[name]
    assert len(objs) > 20
    crds = 0
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            # Not in the built-in schemas: checked structurally here and by
            # test_service_monitors_select_real_services_and_label_like_compose.
            assert obj["metadata"]["name"] and obj["spec"]["selector"]["matchLabels"] and obj["spec"]["endpoints"]
            crds += 1
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert crds == (3 if "components" in name or "prometheus" in name else 0)
    names = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert len(names) == len(set(names)), "duplicate objects"


def test_strict_validation_rejects_a_misspelt_field(renders):
    """The validation above is not vacuous: a misspelt probe field fails the pinned schema."""
    import kubernetes_validate

    bad = json.loads(json.dumps(one(renders["gpu"], "Deployment", "specgate-gateway")))
    container(bad, "gateway")["readinessProbe"]["periodSecond"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_every_object_is_namespaced_into_specgate(renders):
    for name in OVERLAYS:
        for obj in renders[name]:
            if obj["kind"] != "Namespace":
                assert obj["metadata"].get("namespace") == "specgate", (obj["kind"], obj["metadata"]["name"])


# --- gateway ----------------------------------------------------------------------------------


def _gateway_paths() -> set[str]:
    """GET paths the real gateway app serves (built without a network: embedded store)."""
    from contract.settings import load_settings
    from specgate.node import create_node_app

    app = create_node_app(load_settings(replicas=[{"url": "http://r:8000"}], redis_url=None))
    return {path for path, ops in app.openapi()["paths"].items() if "get" in ops}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_probes_and_ports_are_real(renders, overlay):
    objs = renders[overlay]
    dep = one(objs, "Deployment", "specgate-gateway")
    c = container(dep, "gateway")
    paths = _gateway_paths()
    # Readiness follows /ready; liveness must never be /ready (503 through a replica outage).
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {"/ready", "/health", "/metrics"} <= paths
    # The CLI parses the args as given and binds the port the probes and Service use.
    params = _cli_command("gateway").make_context("gateway", c["args"][1:]).params
    assert c["args"][0] == "gateway" and params["host"] == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == params["port"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] in ("http", params["port"])
    svc = one(objs, "Service", "specgate-gateway")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"]
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == params["port"]
    assert ann["prometheus.io/path"] in paths


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_termination_grace_outlasts_prestop_and_drain(renders, overlay, monkeypatch, tmp_path):
    """The kubelet SIGKILLs after terminationGracePeriodSeconds, counted from the preStop hook:
    it must cover the hook, the drain's pre-window and deadline (as the pod's Settings load
    them) and the request tasks' grace, or open streams are cut without their SSE error event."""
    from gateway.server import ABORT_GRACE_S

    objs = renders[overlay]
    g = _load_settings(monkeypatch, tmp_path, objs, "specgate-gateway", "gateway").gateway
    dep = one(objs, "Deployment", "specgate-gateway")
    pre_stop = container(dep, "gateway")["lifecycle"]["preStop"]
    cmd = pre_stop["exec"]["command"]
    assert cmd[0] == "sleep"
    hook_s = float(cmd[1])
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > hook_s + g.drain_pre_s + g.drain_deadline_s + ABORT_GRACE_S


def test_hpa_scales_the_gateway_on_cpu_and_its_inflight_gauge(renders, monkeypatch, tmp_path):
    from gateway.metrics import GatewayMetrics

    objs = renders["gpu"]
    dep = one(objs, "Deployment", "specgate-gateway")
    hpa = one(objs, "HorizontalPodAutoscaler", "specgate-gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "specgate-gateway"}
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    # CPU utilisation is relative to the request: the container must have one.
    assert container(dep, "gateway")["resources"]["requests"]["cpu"]
    pods_metric = metrics["Pods"]["pods"]
    gauges = {m.name: m.type for m in GatewayMetrics().registry.collect()}
    assert gauges.get(pods_metric["metric"]["name"]) == "gauge", "the Pods metric must be a gateway gauge"
    settings = _load_settings(monkeypatch, tmp_path, objs, "specgate-gateway", "gateway")
    assert 0 < float(pods_metric["target"]["averageValue"]) < settings.gateway.max_inflight_requests
    assert pods_metric["metric"]["name"] in DOCS.read_text(), "document the metrics adapter rule"
    # The PDB covers the same pods and never blocks every eviction.
    pdb = one(objs, "PodDisruptionBudget", "specgate-gateway")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert hpa["spec"]["minReplicas"] >= 2 and pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]


# --- settings -----------------------------------------------------------------------------------


def _specgate_containers(objs):
    """(workload, container) of every container running the specgate image's CLI."""
    for obj in find(objs, "Deployment") + find(objs, "StatefulSet"):
        for c in obj["spec"]["template"]["spec"]["containers"]:
            if c.get("image", "").split(":")[0].endswith("/specgate") or c.get("image", "").split(":")[0] == "specgate":
                yield obj, c


@pytest.mark.parametrize("name", [*OVERLAYS, "gpu+components"])
def test_every_specgate_variable_is_a_real_setting(renders, name):
    import contract.settings

    objs = renders[name]
    seen: set[str] = set()
    for workload, c in _specgate_containers(objs):
        env, _ = resolve_env(objs, workload, c["name"])
        for key in env:
            if key == "SPECGATE_CONFIG":  # the settings file's path (contract/settings.py)
                assert "SPECGATE_CONFIG" in contract.settings.__doc__
                continue
            if key.startswith("SPECGATE_"):
                assert settings_field(key) is not None, f"{workload['metadata']['name']}: {key} is no Settings field"
                seen.add(key)
    assert {"SPECGATE_REPLICAS", "SPECGATE_LOG_LEVEL", "SPECGATE_CONTROLLER__INSTANCE_ID"} <= seen
    assert settings_field("SPECGATE_GATEWAY__DRAIN_PRE_S") is not None
    assert settings_field("SPECGATE_GATEWAY__DRAIN_PRE") is None and settings_field("SPECGATE_REPLICA") is None


def test_vllm_variables_are_the_entrypoint_documented_ones(renders):
    documented = set(re.findall(r"SPECGATE_[A-Z_]+[A-Z]", ENTRYPOINT.read_text().split('"""')[1]))
    objs = renders["gpu"]
    for sts in _statefulsets(objs):
        env, _ = resolve_env(objs, sts, "replica")
        used = {k for k in env if k.startswith("SPECGATE_")}
        assert used and used <= documented, used - documented


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_and_controller_settings_load_and_share_one_redis(renders, overlay, monkeypatch, tmp_path):
    objs = renders[overlay]
    redis = one(objs, "Service", "redis")
    loaded = {}
    for dep, name in (("specgate-gateway", "gateway"), ("specgate-controller", "controller")):
        loaded[dep] = s = _load_settings(monkeypatch, tmp_path, objs, dep, name)
        url = urlsplit(s.redis_url)
        assert url.hostname == "redis" and url.port == redis["spec"]["ports"][0]["port"]
        assert container(one(objs, "Deployment", "redis"), "redis")["ports"][0]["containerPort"] == url.port
    assert loaded["specgate-gateway"].replicas == loaded["specgate-controller"].replicas
    if overlay == "sim":
        assert loaded["specgate-gateway"].admin_key and len(loaded["specgate-gateway"].tenants) >= 2
    else:
        assert not find(objs, "Secret"), "the gpu overlay must not ship keys (docs: kubectl create secret)"


def test_sim_demo_tenants_are_the_compose_ones(renders, monkeypatch, tmp_path):
    from contract.settings import TenantConfig

    s = _load_settings(monkeypatch, tmp_path, renders["sim"], "specgate-gateway", "gateway")
    compose = yaml.safe_load((REPO / "docker" / "specgate" / "specgate.yaml").read_text())["tenants"]
    assert s.tenants == [TenantConfig(**t) for t in compose]


def test_external_redis_component_replaces_the_in_cluster_redis(renders):
    objs = renders["gpu+components"]
    assert not find(objs, "Deployment", "redis") and not find(objs, "Service", "redis")
    for dep, name in (("specgate-gateway", "gateway"), ("specgate-controller", "controller")):
        env, missing = resolve_env(objs, one(objs, "Deployment", dep), name)
        # the Secret is the operator's to create: the URL comes from it, not from the ConfigMap
        assert "Secret/specgate-redis" in missing and "SPECGATE_REDIS_URL" not in env
        refs = [e for e in container(one(objs, "Deployment", dep), name)["env"] if e["name"] == "SPECGATE_REDIS_URL"]
        assert refs[0]["valueFrom"]["secretKeyRef"] == {"name": "specgate-redis", "key": "url"}


def test_referenced_secrets_are_documented(renders):
    docs = DOCS.read_text()
    names = set()
    for objs in renders.values():
        for workload in find(objs, "Deployment") + find(objs, "StatefulSet"):
            for c in workload["spec"]["template"]["spec"]["containers"]:
                names |= {s["secretRef"]["name"] for s in c.get("envFrom", []) if "secretRef" in s}
                names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    names = {re.sub(r"-[a-z0-9]{10}$", "", n) for n in names}
    assert {"specgate-secrets", "specgate-hf-token", "specgate-redis"} <= names
    for name in names:
        assert f"kubectl create secret generic {name}" in docs or f"create secret generic {name}" in docs, name


# --- replica pools -----------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replica_list_points_at_statefulset_pods(renders, overlay, monkeypatch, tmp_path):
    """SPECGATE_REPLICAS, parsed by the real Settings, names each pool's pods by their stable
    DNS names (vllm-<profile>-<i>.vllm-<profile>) up to the pool's maximum, on the port the
    headless Service and the container serve, with the pool's profile."""
    objs = renders[overlay]
    settings = _load_settings(monkeypatch, tmp_path, objs, "specgate-gateway", "gateway")
    pools = {s["metadata"]["name"]: s for s in _statefulsets(objs)}
    assert {n: s["metadata"]["labels"]["specgate.io/profile"] for n, s in pools.items()} == POOL_PROFILES
    listed: dict[str, set[int]] = {name: set() for name in pools}
    for replica in settings.replicas:
        url = urlsplit(replica.url)
        pod, _, service = url.hostname.partition(".")
        sts_name, _, ordinal = pod.rpartition("-")
        sts = pools[sts_name]
        svc = one(objs, "Service", service)
        assert replica.name == pod and replica.profile == sts["metadata"]["labels"]["specgate.io/profile"]
        assert sts["spec"]["serviceName"] == service == sts_name
        assert svc["spec"]["clusterIP"] == "None", "per-pod DNS needs a headless Service"
        assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
        assert url.port in {p["port"] for p in svc["spec"]["ports"]}
        assert url.port in {p["containerPort"] for p in container(sts, "replica")["ports"]}
        listed[sts_name].add(int(ordinal))
    for name, sts in pools.items():
        labels = sts["metadata"]["labels"]
        pod_labels = sts["spec"]["template"]["metadata"]["labels"]
        for key, value in (("app.kubernetes.io/part-of", "specgate"), ("app.kubernetes.io/component", "replica"),
                           ("specgate.io/profile", POOL_PROFILES[name])):
            assert labels[key] == pod_labels[key] == value, (name, key)
        maximum = int(sts["metadata"]["annotations"]["specgate.io/max-replicas"])
        assert listed[name] == set(range(maximum)), f"{name}: list every ordinal up to its maximum"
        assert 1 <= sts["spec"]["replicas"] <= maximum
        svc = one(objs, "Service", name)
        assert svc["metadata"]["labels"]["specgate.io/profile"] == labels["specgate.io/profile"]
        assert [p["port"] for p in svc["spec"]["ports"]] == [8000]


def test_gpu_replicas_launch_exactly_what_profile_show_prints(renders):
    """The image's entrypoint, run with --dry-run on each pool's resolved environment, builds the
    argv and environment `specgate profile show <profile> --json` prints, plus the bind flags."""
    from typer.testing import CliRunner

    from contract.profiles import parse_profile

    objs = renders["gpu"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPECGATE_")}
    for sts in _statefulsets(objs):
        c = container(sts, "replica")
        assert c["image"].split(":")[0].endswith("specgate-vllm") and "command" not in c and "args" not in c
        env, missing = resolve_env(objs, sts, "replica")
        assert missing == {"Secret/specgate-hf-token"}  # optional, created by the operator
        profile = sts["metadata"]["labels"]["specgate.io/profile"]
        assert env["SPECGATE_PROFILE"] == profile
        # the drafter is validated at start-up in the cluster; its files are not here
        proc = subprocess.run([sys.executable, str(ENTRYPOINT), "--dry-run"], capture_output=True, text=True, timeout=60,
                              env={**base, **env, "SPECGATE_SKIP_CHECKPOINT_VALIDATION": "1"})
        assert proc.returncode == 0, proc.stderr
        launched = json.loads(proc.stdout)
        drafter = ["--drafter", env["SPECGATE_DRAFTER_PATH"]] if parse_profile(profile).needs_drafter else []
        shown = CliRunner().invoke(_cli(), ["profile", "show", profile, *drafter, "--target", env["SPECGATE_TARGET_MODEL"], "--json"])
        assert shown.exit_code == 0, shown.output
        shown = json.loads(shown.stdout)
        port = c["ports"][0]["containerPort"]
        assert launched["argv"] == shown["argv"] + ["--host", "0.0.0.0", "--port", str(port)]
        assert launched["env"] == shown["env"]
        if profile != "off":
            assert "--speculative-config" in launched["argv"]


def test_gpu_replicas_get_a_gpu_the_drafter_and_a_long_startup(renders):
    objs = renders["gpu"]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    start_period_s = int(compose["x-vllm-replica"]["healthcheck"]["start_period"].rstrip("s"))
    claims = {p["metadata"]["name"] for p in find(objs, "PersistentVolumeClaim")}
    for sts in _statefulsets(objs):
        spec = sts["spec"]["template"]["spec"]
        c = container(sts, "replica")
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        env, _ = resolve_env(objs, sts, "replica")
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        drafter_mount = next(m for p, m in mounts.items() if env["SPECGATE_DRAFTER_PATH"].startswith(p + "/"))
        assert drafter_mount.get("readOnly") is True
        volumes = {v["name"]: v for v in spec["volumes"]}
        templates = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
        for mount in c["volumeMounts"]:
            vol = volumes.get(mount["name"])
            assert vol is not None or mount["name"] in templates, mount["name"]
            if vol and "persistentVolumeClaim" in vol:
                assert vol["persistentVolumeClaim"]["claimName"] in claims
        assert "persistentVolumeClaim" in volumes[drafter_mount["name"]]
        # model load + CUDA graph capture: at least compose's start_period before liveness acts
        assert c["startupProbe"]["httpGet"]["path"] == "/health"
        assert probe_total_s(c["startupProbe"]) >= start_period_s
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"


def test_sim_replicas_run_the_compose_sim_replica(renders, monkeypatch, tmp_path):
    from drafters.sim.engine_types import simulated_profile

    objs = renders["sim"]
    controller = _load_settings(monkeypatch, tmp_path, objs, "specgate-controller", "controller").controller
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["sim-replica-a"]["command"]
    command = _cli_command("sim-replica")
    for sts in _statefulsets(objs):
        c = container(sts, "replica")
        env, _ = resolve_env(objs, sts, "replica")
        args = expand(c["args"], env)
        assert args[0] == compose[0] == "sim-replica"
        assert {a for a in args if a.startswith("--")} == {a for a in compose if a.startswith("--")}
        params = command.make_context("sim-replica", args[1:]).params
        profile = sts["metadata"]["labels"]["specgate.io/profile"]
        assert simulated_profile(params["profile"]).label == profile
        assert params["name"] == sts["metadata"]["name"] + "-0"  # the pod name = its replica name
        assert params["port"] == c["ports"][0]["containerPort"] and params["host"] == "0.0.0.0"
        # the simulated engine is the one the controller's step-cost prior describes
        assert (params["gpu"], params["model"]) == (controller.gpu, controller.model)
        assert "nvidia.com/gpu" not in json.dumps(c["resources"])


# --- controller ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_controller_runs_two_instances_under_its_service_account(renders, overlay, monkeypatch, tmp_path):
    objs = renders[overlay]
    dep = one(objs, "Deployment", "specgate-controller")
    assert dep["spec"]["replicas"] == 2
    spec = dep["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "specgate-controller"
    one(objs, "ServiceAccount", "specgate-controller")
    bound = [b for b in find(objs, "RoleBinding")
             if {"kind": "ServiceAccount", "name": "specgate-controller", "namespace": "specgate"} in b["subjects"]]
    assert bound, "controller-rbac.yaml must bind a Role to the specgate-controller ServiceAccount"
    c = container(dep, "controller")
    params = _cli_command("controller").make_context("controller", c["args"][1:]).params
    assert c["args"][0] == "controller" and params["host"] == "0.0.0.0"
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
    assert params["metrics_port"] == port
    assert c["livenessProbe"]["httpGet"]["path"] == "/metrics" and c["livenessProbe"]["httpGet"]["port"] in ("metrics", port)
    # Two instances, two leader-lock identities (the pod names).
    ids = set()
    for pod in ("specgate-controller-abc-1", "specgate-controller-abc-2"):
        env, _ = resolve_env(objs, dep, "controller", pod_name=pod)
        ids.add(env["SPECGATE_CONTROLLER__INSTANCE_ID"])
    assert len(ids) == 2
    cfg = _load_settings(monkeypatch, tmp_path, objs, "specgate-controller", "controller").controller
    assert cfg.instance_id == "specgate-controller-0" and cfg.tick_s > 0


# --- observability --------------------------------------------------------------------------------


def test_dashboard_configmap_is_the_compose_dashboard(renders):
    source = (REPO / "docker" / "grafana" / "dashboards" / "specgate.json").read_text()
    copy = K8S / "base" / "grafana" / "specgate.json"
    assert copy.read_text() == source, f"refresh the copy: cp docker/grafana/dashboards/specgate.json {copy.relative_to(REPO)}"
    for overlay in OVERLAYS:
        cm = one(renders[overlay], "ConfigMap", "specgate-grafana-dashboard")
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(cm["data"]["specgate.json"]) == json.loads(source)


def test_service_monitors_select_real_services_and_label_like_compose(renders):
    objs = renders["sim+prometheus"]
    prom = yaml.safe_load((REPO / "docker" / "prometheus" / "prometheus.yml").read_text())
    compose_jobs = {j["job_name"] for j in prom["scrape_configs"]}
    services = find(objs, "Service")
    monitors = find(objs, "ServiceMonitor")
    jobs = set()
    for sm in monitors:
        assert sm["metadata"]["namespace"] == "specgate"
        selected = [s for s in services if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert selected, f"{sm['metadata']['name']} selects no Service"
        for ep in sm["spec"]["endpoints"]:
            for svc in selected:
                assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}, (sm["metadata"]["name"], svc["metadata"]["name"])
            relabel = {r["targetLabel"]: r for r in ep.get("relabelings", [])}
            jobs.add(relabel["job"]["replacement"])
            if sm["metadata"]["name"] == "specgate-replicas":
                assert {s["metadata"]["name"] for s in selected} == set(POOL_PROFILES)
                assert relabel["replica"]["sourceLabels"] == ["__meta_kubernetes_pod_name"]
                assert relabel["profile"]["sourceLabels"] == ["__meta_kubernetes_pod_label_specgate_io_profile"]
    assert jobs == compose_jobs - {"dcgm"}
    dashboard = json.loads((REPO / "docker" / "grafana" / "dashboards" / "specgate.json").read_text())
    uids = set(_prometheus_uids(dashboard))
    assert uids
    ds = yaml.safe_load(one(objs, "ConfigMap", "specgate-grafana-datasource")["data"]["specgate-datasource.yaml"])
    assert uids == {d["uid"] for d in ds["datasources"] if d["type"] == "prometheus"}
    assert one(objs, "ConfigMap", "specgate-grafana-datasource")["metadata"]["labels"]["grafana_datasource"] == "1"


def _prometheus_uids(node):
    if isinstance(node, dict):
        if node.get("type") == "prometheus" and "uid" in node:
            yield node["uid"]
        for value in node.values():
            yield from _prometheus_uids(value)
    elif isinstance(node, list):
        for value in node:
            yield from _prometheus_uids(value)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scrape_annotations_name_a_served_port(renders, overlay):
    objs = renders[overlay]
    workloads = find(objs, "Deployment") + find(objs, "StatefulSet")
    annotated = 0
    for w in workloads:
        ann = w["spec"]["template"]["metadata"].get("annotations", {})
        if ann.get("prometheus.io/scrape") != "true":
            continue
        annotated += 1
        ports = {p["containerPort"] for c in w["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        assert int(ann["prometheus.io/port"]) in ports and ann["prometheus.io/path"] == "/metrics"
    assert annotated == 2 + len(POOL_PROFILES)  # gateway, controller, each pool
    for svc in find(objs, "Service"):
        assert "prometheus.io/scrape" not in svc["metadata"].get("annotations", {}), "pods only: no double scrape"
