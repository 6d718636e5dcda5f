"""The `kubernetes` fleet actuator through the real `kubernetes` client, against a
loopback simulation of the API server (tests/controller/kube_api_sim.py: no
cluster runs here), and its RBAC Role held to exactly the calls it makes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from kubernetes import client

from contract.settings import RestartGateSettings, Settings
from controller.actuation import GatedActuator, PlanGate, default_actuator, pool_order
from controller.decision import ReplicaRegime
from controller.kube_scaling import KubernetesScaling, converging, replica_profile

from .kube_api_sim import KubeApiSimulation, StatefulSetState

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "deploy" / "k8s" / "base" / "controller-rbac.yaml"
REPLICAS = REPO / "deploy" / "k8s" / "base" / "replicas.yaml"
NS = "specgate"


def to_model(doc: dict, klass: str):
    """Deserialize a manifest dict into the client's model, as the client does API responses."""
    api = client.ApiClient()
    try:
        return api.deserialize(json.dumps(doc), klass, "application/json")  # client >= 35
    except TypeError:
        return api.deserialize(SimpleNamespace(data=json.dumps(doc)), klass)


def rbac_docs() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(RBAC.read_text()) if d}


def role() -> client.V1Role:
    return to_model(rbac_docs()["Role"], "V1Role")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def sim():
    """The base manifests' pools: 2x dspark-b8, 0x dspark-b8-av, 1x off, all ready; RBAC = our Role."""
    s = KubeApiSimulation(namespace=NS, role=[_rule_json(r) for r in role().rules])
    s.statefulsets = {"vllm-dspark-b8": StatefulSetState(2, 2), "vllm-dspark-b8-av": StatefulSetState(0, 0),
                      "vllm-off": StatefulSetState(1, 1)}
    server, _ = s.start()
    yield s
    server.shutdown()
    server.server_close()


def _rule_json(rule: client.V1PolicyRule) -> dict:
    return {"apiGroups": rule.api_groups or [], "resources": rule.resources or [], "verbs": rule.verbs or [],
            "resourceNames": rule.resource_names or []}


@pytest.fixture
def apps(sim):
    cfg = client.Configuration()
    cfg.host = sim.url
    api = client.ApiClient(cfg)
    yield client.AppsV1Api(api)
    api.close()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def action(apps, clock):
    return KubernetesScaling(apps, NS, "vllm-", request_timeout_s=5.0, converge_timeout_s=600.0, clock=clock)


def regime(name: str, profile: str, recommended: str, gain: float) -> ReplicaRegime:
    return ReplicaRegime(name, profile, 32.0, 100.0, 200.0, 0.5, "transition", 3.0, 1000.0, recommended, gain)


# -- the requests the action makes ---------------------------------------------------


async def test_a_restart_reads_both_scales_then_merge_patches_down_and_up(sim, action):
    await action.restart("vllm-dspark-b8-1", "dspark-b8-av")
    assert [(r.method, r.path) for r in sim.requests] == [
        ("GET", f"/apis/apps/v1/namespaces/{NS}/statefulsets/vllm-dspark-b8/scale"),
        ("GET", f"/apis/apps/v1/namespaces/{NS}/statefulsets/vllm-dspark-b8-av/scale"),
        ("GET", f"/apis/apps/v1/namespaces/{NS}/statefulsets/vllm-dspark-b8-av/status"),  # its max-replicas
        ("PATCH", f"/apis/apps/v1/namespaces/{NS}/statefulsets/vllm-dspark-b8/scale"),
        ("PATCH", f"/apis/apps/v1/namespaces/{NS}/statefulsets/vllm-dspark-b8-av/scale"),
    ]
    down, up = sim.requests[3], sim.requests[4]
    assert down.content_type == up.content_type == "application/merge-patch+json"
    # The resourceVersion just read is the patch's precondition (409 if someone changed the pool since).
    assert down.body == {"spec": {"replicas": 1}, "metadata": {"resourceVersion": "1000"}}
    assert up.body == {"spec": {"replicas": 1}, "metadata": {"resourceVersion": "1000"}}
    assert sim.replicas() == {"vllm-dspark-b8": 1, "vllm-dspark-b8-av": 1, "vllm-off": 1}
    assert action.busy() == {"vllm-dspark-b8", "vllm-dspark-b8-av"}
    event = action.report()["events"][-1]
    assert event["scaled"] == [{"pool": "vllm-dspark-b8", "from": 2, "to": 1},
                               {"pool": "vllm-dspark-b8-av", "from": 0, "to": 1}]
    assert event["error"] is None and action.report()["errors"] == []


async def test_busy_until_the_pools_converge_and_are_ready(sim, action, clock):
    await action.restart("vllm-dspark-b8-1", "dspark-b8-av")
    await action.refresh()
    assert action.busy() == {"vllm-dspark-b8", "vllm-dspark-b8-av"}
    assert action.report()["converging"] == {"vllm-dspark-b8": "generation 2 not observed yet",
                                             "vllm-dspark-b8-av": "generation 2 not observed yet"}
    sim.converge("vllm-dspark-b8")
    sim.progress("vllm-dspark-b8-av", ready=0)  # pod created, still loading the model
    await action.refresh()
    assert action.busy() == {"vllm-dspark-b8-av"}
    assert action.report()["converging"] == {"vllm-dspark-b8-av": "0/1 ready"}
    sim.converge("vllm-dspark-b8-av")
    await action.refresh()
    assert action.busy() == set()
    status_reads = [r.path for r in sim.requests if r.path.endswith("/status")]
    assert status_reads[-1] == f"/apis/apps/v1/namespaces/{NS}/statefulsets/vllm-dspark-b8-av/status"


async def test_a_pool_that_never_gets_ready_stops_holding_the_gate_and_is_reported(sim, action, clock):
    await action.restart("vllm-dspark-b8-1", "dspark-b8-av")
    sim.converge("vllm-dspark-b8")
    sim.progress("vllm-dspark-b8-av", ready=0)
    clock.t = 601.0
    await action.refresh()
    assert action.busy() == set()
    assert "vllm-dspark-b8-av did not converge within 600 s (0/1 ready)" in action.report()["errors"][-1]["error"]


# -- API errors are recorded, never raised --------------------------------------------


async def test_a_pool_at_its_listed_maximum_is_not_grown(sim, action):
    """Past `specgate.io/max-replicas` a new pod is a GPU no gateway routes to: refused, nothing scaled."""
    sim.statefulsets["vllm-dspark-b8-av"].annotations["specgate.io/max-replicas"] = "0"
    await action.restart("vllm-dspark-b8-1", "dspark-b8-av")
    assert sim.replicas() == {"vllm-dspark-b8": 2, "vllm-dspark-b8-av": 0, "vllm-off": 1}
    assert [r.method for r in sim.requests] == ["GET", "GET", "GET"]
    err = action.report()["errors"][-1]
    assert "vllm-dspark-b8-av is at its specgate.io/max-replicas (0)" in err["error"] and err["status"] is None
    sim.statefulsets["vllm-dspark-b8-av"].annotations["specgate.io/max-replicas"] = "1"
    await action.restart("vllm-dspark-b8-1", "dspark-b8-av")
    assert sim.replicas() == {"vllm-dspark-b8": 1, "vllm-dspark-b8-av": 1, "vllm-off": 1}


async def test_a_missing_pool_is_a_recorded_404_and_nothing_changes(sim, action):
    del sim.statefulsets["vllm-dspark-b8-av"]
    await action.restart("vllm-dspark-b8-1", "dspark-b8-av")
    assert sim.replicas() == {"vllm-dspark-b8": 2, "vllm-off": 1}
    assert [r.method for r in sim.requests] == ["GET", "GET"]  # read, found missing, touched nothing
    err = action.report()["errors"][-1]
    assert err["status"] == 404 and err["replica"] == "vllm-dspark-b8-1" and "reading the pools' scale" in err["error"]
    assert action.busy() == set()


async def test_a_pool_rbac_does_not_name_is_a_recorded_403(sim, action):
    sim.statefulsets["vllm-dspark-b4"] = StatefulSetState(0, 0)  # exists, but the Role does not name it
    await action.restart("vllm-dspark-b8-1", "dspark-b4")
    assert sim.replicas()["vllm-dspark-b8"] == 2 and sim.replicas()["vllm-dspark-b4"] == 0
    err = action.report()["errors"][-1]
    assert err["status"] == 403 and "RBAC" in err["error"] and action.report()["events"][-1]["error"] == err["error"]


async def test_when_the_pool_to_grow_refuses_the_shrunk_one_is_restored(sim, action):
    # Readable but not patchable (a Role granting get only): the up-scale fails after the down-scale.
    sim.role = [{"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["get", "patch"],
                 "resourceNames": ["vllm-dspark-b8"]},
                {"apiGroups": ["apps"], "resources": ["statefulsets/scale", "statefulsets/status"], "verbs": ["get"],
                 "resourceNames": ["vllm-dspark-b8-av"]}]
    await action.restart("vllm-dspark-b8-1", "dspark-b8-av")
    assert sim.replicas() == {"vllm-dspark-b8": 2, "vllm-dspark-b8-av": 0, "vllm-off": 1}
    event = action.report()["events"][-1]
    assert event["scaled"] == [{"pool": "vllm-dspark-b8", "from": 2, "to": 1},
                               {"pool": "vllm-dspark-b8", "from": 1, "to": 2, "rollback": True}]
    assert "403" in event["error"]


async def test_a_concurrent_change_is_a_recorded_409_conflict(sim, action, apps):
    real_read = apps.read_namespaced_stateful_set_scale

    def read_then_someone_scales(name, namespace, **kw):
        scale = real_read(name, namespace, **kw)
        if name == "vllm-dspark-b8":  # a person scales the pool between our read and our patch
            sim.statefulsets[name].replicas = 3
            sim.statefulsets[name].resource_version += 1
        return scale

    apps.read_namespaced_stateful_set_scale = read_then_someone_scales
    await action.restart("vllm-dspark-b8-1", "dspark-b8-av")
    assert sim.replicas() == {"vllm-dspark-b8": 3, "vllm-dspark-b8-av": 0, "vllm-off": 1}  # theirs stands
    assert action.report()["errors"][-1]["status"] == 409


async def test_a_replica_outside_the_pool_naming_is_recorded(sim, action):
    await action.restart("sim-dspark-b8-1", "off")
    assert sim.requests == []
    assert "not named vllm-<profile>-<ordinal>" in action.report()["errors"][-1]["error"]


async def test_an_unreachable_api_server_is_recorded(action, sim):
    action.apps.api_client.configuration.host = "http://127.0.0.1:9"  # nothing listens (discard port)
    await action.restart("vllm-dspark-b8-1", "off")
    assert action.report()["errors"] and action.busy() == set()


# -- the gate and the action together --------------------------------------------------


async def test_gate_and_action_move_the_pools_as_the_plan_says(sim, action):
    # A 15-s restart: at +100 % the restart and the way back (2 x 15 s) are paid after 30 s.
    act = GatedActuator(PlanGate(restart_s=15.0, order=pool_order("vllm-")), action, "vllm-")

    def plan(b8: int, av: int) -> dict[str, ReplicaRegime]:
        """What the controller sees live: b8 replicas told to become b8-av (gain 2.0), the off one staying."""
        regs = {f"vllm-dspark-b8-{i}": regime(f"vllm-dspark-b8-{i}", "dspark-b8", "dspark-b8-av", 2.0) for i in range(b8)}
        regs |= {f"vllm-dspark-b8-av-{i}": regime(f"vllm-dspark-b8-av-{i}", "dspark-b8-av", "dspark-b8-av", 1.0)
                 for i in range(av)}
        return regs | {"vllm-off-0": regime("vllm-off-0", "off", "off", 1.0)}

    docs = [await act.apply(plan(2, 0), float(t)) for t in range(0, 30)]
    assert all(d["restart_now"] is None for d in docs) and sim.replicas()["vllm-dspark-b8"] == 2
    docs.append(await act.apply(plan(2, 0), 30.0))
    assert docs[0]["recommendation"]["summary"].startswith(
        "scale vllm-dspark-b8 2->1 and vllm-dspark-b8-av 0->1: predicted 2.00x goodput per converted replica")
    assert "pays back its restart and the way back in ~30 s" in docs[0]["recommendation"]["summary"]
    # At 30 s of +100 % the 15-s restart and the one back have paid back: the highest ordinal goes (what the StatefulSet removes).
    assert docs[30]["restart_now"] == ["vllm-dspark-b8-1", "dspark-b8-av"]
    assert sim.replicas() == {"vllm-dspark-b8": 1, "vllm-dspark-b8-av": 1, "vllm-off": 1}
    assert docs[30]["restarting"] == ["vllm-dspark-b8", "vllm-dspark-b8-av"]
    assert docs[30]["action"]["events"][-1]["scaled"][-1] == {"pool": "vllm-dspark-b8-av", "from": 0, "to": 1}
    # Converging: the gate holds, nothing else is scaled.
    for t in range(31, 40):
        doc = await act.apply(plan(2, 0), float(t))
        assert doc["restart_now"] is None and doc["restarting"]
        assert "waiting for vllm-dspark-b8, vllm-dspark-b8-av" in doc["recommendation"]["summary"]
    sim.converge("vllm-dspark-b8")
    sim.converge("vllm-dspark-b8-av")
    # Ready: the fleet-wide streak carries on, and the remaining b8 replica follows at once.
    doc = await act.apply(plan(1, 1), 40.0)
    assert doc["restart_now"] == ["vllm-dspark-b8-0", "dspark-b8-av"]
    assert sim.replicas() == {"vllm-dspark-b8": 0, "vllm-dspark-b8-av": 2, "vllm-off": 1}
    assert doc["action"]["errors"] == []
    # Every call the action made is one the Role allows (the simulated API server enforced it).
    assert all(r.method in ("GET", "PATCH") for r in sim.requests)


async def test_errors_reach_the_plan_document_and_the_controller_carries_on(sim, action):
    del sim.statefulsets["vllm-dspark-b8-av"]
    act = GatedActuator(PlanGate(restart_s=15.0, order=pool_order("vllm-")), action, "vllm-")
    regs = {f"vllm-dspark-b8-{i}": regime(f"vllm-dspark-b8-{i}", "dspark-b8", "dspark-b8-av", 2.0) for i in range(2)}
    for t in range(0, 40):
        doc = await act.apply(regs, float(t))
    assert doc["action"]["errors"][0]["status"] == 404 and doc["restarting"] == []
    assert sim.replicas() == {"vllm-dspark-b8": 2, "vllm-off": 1}


def test_default_actuator_builds_the_kubernetes_action_from_settings(tmp_path, monkeypatch):
    """`controller.restart_gate.actuator: kubernetes` (env SPECGATE_CONTROLLER__RESTART_GATE__ACTUATOR),
    credentials from the kubeconfig when not in a cluster."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sim",
        "clusters": [{"name": "sim", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "u", "namespace": "from-kubeconfig"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("SPECGATE_CONTROLLER__RESTART_GATE__ACTUATOR", "kubernetes")
    monkeypatch.setenv("SPECGATE_CONTROLLER__RESTART_GATE__KUBERNETES__POOL_PREFIX", "pool-")
    gate = Settings().controller.restart_gate
    act = default_actuator(gate)
    assert isinstance(act.restart, KubernetesScaling) and act.name == "kubernetes"
    assert act.restart.namespace == "from-kubeconfig" and act.restart.prefix == "pool-"
    assert act.restart.apps.api_client.configuration.host == "http://127.0.0.1:9"
    assert default_actuator(gate.model_copy(update={"kubernetes": gate.kubernetes.model_copy(
        update={"namespace": "specgate"})})).restart.namespace == "specgate"
    assert default_actuator(RestartGateSettings()).name == "recommend"  # recommend: the default


def test_names_and_convergence_rules():
    assert replica_profile("vllm-", "vllm-dspark-b8-av-3") == "dspark-b8-av"
    assert replica_profile("vllm-", "vllm-off-0") == "off"
    assert replica_profile("vllm-", "vllm-dspark-b8") is None  # no ordinal
    assert replica_profile("vllm-", "sim-off-1") is None
    key = pool_order("vllm-")
    assert sorted(["vllm-dspark-b8-0", "vllm-dspark-b8-2", "vllm-dspark-b8-1"], key=key)[0] == "vllm-dspark-b8-2"
    sts = to_model({"metadata": {"generation": 3}, "spec": {"replicas": 2, "selector": {}, "serviceName": "x",
                                                            "template": {}},
                    "status": {"replicas": 2, "readyReplicas": 2, "observedGeneration": 3}}, "V1StatefulSet")
    assert converging(sts) is None
    sts.status.ready_replicas = 1
    assert converging(sts) == "1/2 ready"


# -- RBAC: least privilege, exactly what the action does ------------------------------


def test_the_role_allows_exactly_the_calls_the_action_makes(sim, action):
    """Run every kind of call the action makes (restart + refresh) against the simulated API
    server enforcing the Role, then compare: the Role grants those (verb, resource) pairs and
    nothing else -- no wildcard, no other resource, verb or API group, only named pools."""
    import asyncio

    async def exercise():
        await action.restart("vllm-dspark-b8-1", "dspark-b8-av")
        await action.restart("vllm-off-0", "dspark-b8")
        await action.refresh()

    asyncio.run(exercise())
    assert action.report()["errors"] == []
    made = sim.calls()
    assert made >= {("get", "statefulsets/scale", "vllm-dspark-b8"), ("patch", "statefulsets/scale", "vllm-off"),
                    ("get", "statefulsets/status", "vllm-dspark-b8-av")}
    granted = set()
    for rule in role().rules:
        assert rule.api_groups == ["apps"]
        assert "*" not in rule.verbs and "*" not in rule.resources and rule.resource_names
        assert not any(v for k, v in rule.to_dict().items() if k.startswith("non_resource"))
        granted |= {(v, res, n) for v in rule.verbs for res in rule.resources for n in rule.resource_names}
    assert {(v, res) for v, res, _ in granted} == {(v, res) for v, res, _ in made}
    assert made <= granted


def test_the_role_names_exactly_the_pools_of_the_base_manifests():
    pools = {d["metadata"]["name"] for d in yaml.safe_load_all(REPLICAS.read_text())
             if d and d.get("kind") == "StatefulSet" and d["metadata"]["name"].startswith("vllm-")}
    assert pools
    for rule in role().rules:
        assert set(rule.resource_names) == pools


def test_the_binding_gives_the_role_to_the_controller_service_account():
    binding = to_model(rbac_docs()["RoleBinding"], "V1RoleBinding")
    assert binding.role_ref.kind == "Role" and binding.role_ref.name == role().metadata.name
    assert [(s.kind, s.name) for s in binding.subjects] == [("ServiceAccount", "specgate-controller")]
    controller = [d for d in yaml.safe_load_all((RBAC.parent / "controller.yaml").read_text())
                  if d and d["kind"] == "Deployment"][0]
    assert controller["spec"]["template"]["spec"]["serviceAccountName"] == "specgate-controller"


def test_the_rbac_manifest_passes_strict_schema_validation():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in rbac_docs().values():
        kubernetes_validate.validate(doc, "1.32.0", strict=True)
