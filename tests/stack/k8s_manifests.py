"""Helpers for tests/stack/test_k8s.py: render deploy/k8s with the real `kubectl kustomize`
and read the rendered objects the way the kubelet would.

Why a module of its own: what a container really sees (envFrom ConfigMaps and Secrets, then
`env` entries that override them, downward-API fields such as the pod name and pod labels,
`$(VAR)` expansion in args) is what the consistency checks must judge, and that resolution is
a few dozen lines that the tests should not repeat.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from tests.stack.conftest import REPO

K8S = REPO / "deploy" / "k8s"
# The Kubernetes version whose schemas (shipped by the kubernetes-validate package) the rendered
# objects are checked against: the kubectl v1.32 client that renders them.
K8S_VERSION = "1.32.0"


@functools.lru_cache(maxsize=None)
def _kustomize_major(kubectl: str) -> int:
    proc = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=30)
    m = re.search(r"^Kustomize Version: v(\d+)", proc.stdout, re.M)
    return int(m.group(1)) if m else 0


def kubectl() -> str:
    """A kubectl whose embedded Kustomize is v5+ (the venv's from scripts/setup_tools.sh, else the
    one on PATH). An older one (Debian bookworm's is 1.20, Kustomize v2) cannot read these
    kustomizations, so it counts as missing: skip, or fail under CI."""
    candidates = [Path(sys.executable).parent / "kubectl", shutil.which("kubectl")]
    for path in candidates:
        if path and Path(path).is_file() and os.access(path, os.X_OK) and _kustomize_major(str(path)) >= 5:
            return str(path)
    msg = "no kubectl with Kustomize v5+ is installed; run scripts/setup_tools.sh"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """Objects `kubectl kustomize DIRECTORY` renders (fails the test with kubectl's message)."""
    proc = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def kustomize_with(tmp: Path, overlay: str, components: list[str], namespace: str = "specgate") -> list[dict[str, Any]]:
    """An overlay plus optional components, as a user's own kustomization would combine them
    (kustomize accepts only relative paths to other directories)."""
    tmp.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(K8S, tmp))
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace,
        "resources": [str(rel / "overlays" / overlay)],
        "components": [str(rel / "components" / c) for c in components],
    }))
    return kustomize(tmp)


def find(objs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict], kind: str, name: str) -> dict:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def container(workload: dict, name: str) -> dict:
    found = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(found) == 1, f"{workload['metadata']['name']} has no container {name}"
    return found[0]


def _data(obj: dict) -> dict[str, str]:
    out = dict(obj.get("data") or {})
    if obj["kind"] == "Secret":
        out = {k: base64.b64decode(v).decode() for k, v in out.items()}
        out.update(obj.get("stringData") or {})
    return out


def _source(objs: list[dict], kind: str, name: str) -> dict[str, str] | None:
    found = find(objs, kind, name)
    return _data(found[0]) if found else None


def _field(workload: dict, path: str, pod_name: str) -> str:
    meta = workload["spec"]["template"]["metadata"]
    if path == "metadata.name":
        return pod_name
    m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    if m:
        return str(meta["labels"][m.group(1)])
    raise AssertionError(f"fieldRef {path} not resolved by this helper")


def resolve_env(objs: list[dict], workload: dict, name: str, pod_name: str | None = None) -> tuple[dict[str, str], set[str]]:
    """(environment the container gets, names whose Secret/ConfigMap is not in the render).

    envFrom first, then `env` (which wins, as in the kubelet); downward-API fields from the pod
    template, the pod name being `pod_name` (default: the workload's name + `-0`)."""
    c = container(workload, name)
    pod_name = pod_name or workload["metadata"]["name"] + "-0"
    env: dict[str, str] = {}
    missing: set[str] = set()
    for src in c.get("envFrom", []):
        kind, ref = ("ConfigMap", src["configMapRef"]) if "configMapRef" in src else ("Secret", src["secretRef"])
        data = _source(objs, kind, ref["name"])
        if data is None:
            missing.add(f"{kind}/{ref['name']}")
        else:
            env.update(data)
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = item["valueFrom"]
        if "fieldRef" in ref:
            env[item["name"]] = _field(workload, ref["fieldRef"]["fieldPath"], pod_name)
            continue
        kind, key_ref = ("Secret", ref["secretKeyRef"]) if "secretKeyRef" in ref else ("ConfigMap", ref["configMapKeyRef"])
        data = _source(objs, kind, key_ref["name"])
        if data is None or key_ref["key"] not in data:
            missing.add(f"{kind}/{key_ref['name']}")
            env.pop(item["name"], None)
        else:
            env[item["name"]] = data[key_ref["key"]]
    return env, missing


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' `$(VAR)` expansion of command/args."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def mounted_file(objs: list[dict], workload: dict, name: str, path: str) -> str:
    """Content of the file at `path` in the container, from a mounted ConfigMap volume."""
    c = container(workload, name)
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    for mount in c.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix) and "configMap" in volumes[mount["name"]]:
            data = _data(one(objs, "ConfigMap", volumes[mount["name"]]["configMap"]["name"]))
            return data[path[len(prefix):]]
    raise AssertionError(f"{path} is not mounted from a ConfigMap in {workload['metadata']['name']}")


def settings_field(env_name: str):
    """The `contract.settings.Settings` field an environment variable sets (pydantic-settings'
    SPECGATE_ prefix and `__` nesting), or None. Needed because unknown top-level SPECGATE_*
    names are silently ignored by pydantic-settings, so loading alone proves nothing."""
    from contract.settings import Settings

    if not env_name.startswith("SPECGATE_"):
        return None
    model: type[BaseModel] = Settings
    field = None
    for part in env_name[len("SPECGATE_"):].lower().split("__"):
        if model is None or part not in model.model_fields:
            return None
        field = model.model_fields[part]
        ann = field.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return field


def probe_total_s(probe: dict) -> float:
    """Longest a probe tolerates failure before it acts."""
    return probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
