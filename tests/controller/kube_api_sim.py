"""A simulation of the Kubernetes API server's StatefulSet scale and status endpoints.

Why a simulation: no cluster is available where these tests run, and the
fleet actuator must still be exercised through the real `kubernetes` client
(its URL building, content types, serialisation and error mapping). This
loopback HTTP server implements faithfully the part of the apps/v1 API the
actuator uses, as the API server documents and answers it:

* `GET  /apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale` -> an
  `autoscaling/v1` `Scale` (spec.replicas, status.replicas, status.selector,
  metadata.resourceVersion);
* `PATCH` of the same path with `application/merge-patch+json` or
  `application/strategic-merge-patch+json` (a `Scale` has no lists, so both
  merge alike) or `application/json-patch+json` (RFC 6902 `test` / `replace` /
  `add` on `/spec/replicas`); other content types get 415. Only
  `spec.replicas` is writable through the subresource; a
  `metadata.resourceVersion` in the patch is a precondition (409 Conflict
  when stale); negative replicas are 422. A change bumps the StatefulSet's
  `metadata.generation` and `resourceVersion`;
* `GET  /apis/apps/v1/namespaces/{ns}/statefulsets/{name}/status` -> the
  `apps/v1` `StatefulSet` (spec, status with replicas, readyReplicas,
  observedGeneration);
* errors as the API server returns them: a `v1` `Status` body with `reason`
  and `code`; 404 NotFound for a StatefulSet that does not exist (or another
  namespace); 403 Forbidden when RBAC (`role`: the rules of an rbac/v1 Role,
  as loaded from deploy/k8s/base/controller-rbac.yaml) does not allow the
  request's (verb, resource, resourceName). Authorization comes first, as in
  the real server: a forbidden request for a missing object is 403, not 404.

What it does not simulate is the StatefulSet controller and the kubelet:
status follows spec only when the test says so (`converge`, `progress`),
which is what lets the tests see the actuator wait for a pool to be ready.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PATH = re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/statefulsets/(?P<name>[^/]+)/(?P<sub>scale|status)$")
MERGE_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
JSON_PATCH = "application/json-patch+json"


@dataclass
class StatefulSetState:
    replicas: int
    ready: int
    generation: int = 1
    observed_generation: int = 1
    status_replicas: int | None = None
    resource_version: int = 1000
    annotations: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status_replicas is None:
            self.status_replicas = self.replicas


@dataclass
class Request:
    method: str
    path: str
    content_type: str | None
    body: Any


@dataclass
class KubeApiSimulation:
    """State of the simulated API server; `start()` serves it on 127.0.0.1 (see module docstring)."""

    namespace: str = "specgate"
    statefulsets: dict[str, StatefulSetState] = field(default_factory=dict)
    role: list[dict] | None = None  # rbac/v1 Role rules; None = everything allowed
    user: str = "system:serviceaccount:specgate:specgate-controller"
    requests: list[Request] = field(default_factory=list)
    url: str = ""  # set by start()
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- test controls: the StatefulSet controller and kubelet's part --------
    def converge(self, name: str) -> None:
        """All pods of `name` exist and are ready; the controller observed the latest spec."""
        with self.lock:
            s = self.statefulsets[name]
            s.status_replicas = s.ready = s.replicas
            s.observed_generation = s.generation

    def progress(self, name: str, ready: int) -> None:
        """The controller created/removed the pods; `ready` of them pass their readiness probe."""
        with self.lock:
            s = self.statefulsets[name]
            s.status_replicas, s.ready, s.observed_generation = s.replicas, ready, s.generation

    def replicas(self) -> dict[str, int]:
        with self.lock:
            return {n: s.replicas for n, s in self.statefulsets.items()}

    def calls(self) -> set[tuple[str, str, str]]:
        """(RBAC verb, resource, resourceName) of every request served."""
        out = set()
        for r in self.requests:
            m = PATH.match(r.path.split("?")[0])
            if m:
                out.add((_verb(r.method), f"statefulsets/{m['sub']}", m["name"]))
        return out

    # -- the API ----------------------------------------------------------------
    def allowed(self, verb: str, resource: str, name: str) -> bool:
        if self.role is None:
            return True
        return any(
            "apps" in rule.get("apiGroups", []) and resource in rule.get("resources", []) and verb in rule.get("verbs", [])
            and (not rule.get("resourceNames") or name in rule["resourceNames"])
            for rule in self.role
        )

    def handle(self, method: str, path: str, content_type: str | None, raw: bytes) -> tuple[int, dict]:
        body = json.loads(raw) if raw else None
        with self.lock:
            self.requests.append(Request(method, path, content_type, body))
            m = PATH.match(path.split("?")[0])
            if m is None:
                return 404, _status(404, "NotFound", "the server could not find the requested resource")
            ns, name, sub = m["ns"], m["name"], m["sub"]
            verb, resource = _verb(method), f"statefulsets/{sub}"
            if method not in ("GET", "PATCH") or (sub == "status" and method != "GET"):
                return 405, _status(405, "MethodNotAllowed", f"{method} is not supported here")
            if not self.allowed(verb, resource, name):
                return 403, _status(403, "Forbidden", f'statefulsets.apps "{name}" is forbidden: User "{self.user}" '
                                                      f'cannot {verb} resource "{resource}" in API group "apps" in '
                                                      f'the namespace "{ns}"')
            s = self.statefulsets.get(name) if ns == self.namespace else None
            if s is None:
                return 404, _status(404, "NotFound", f'statefulsets.apps "{name}" not found')
            if sub == "status":
                return 200, self._statefulset(name, s)
            if method == "GET":
                return 200, self._scale(name, s)
            return self._patch(name, s, content_type, body)

    def _patch(self, name: str, s: StatefulSetState, content_type: str | None, body: Any) -> tuple[int, dict]:
        ctype = (content_type or "").split(";")[0].strip()
        current = self._scale(name, s)
        if ctype in MERGE_TYPES:
            if not isinstance(body, dict):
                return 400, _status(400, "BadRequest", "a merge patch must be a JSON object")
            patched = _merge(current, body)
        elif ctype == JSON_PATCH:
            if not isinstance(body, list):
                return 400, _status(400, "BadRequest", "a JSON patch must be a list of operations")
            patched = json.loads(json.dumps(current))
            for op in body:
                if op.get("path") != "/spec/replicas" or op.get("op") not in ("test", "replace", "add"):
                    return 422, _status(422, "Invalid", f"unsupported operation {op}")
                if op["op"] == "test" and patched["spec"]["replicas"] != op.get("value"):
                    return 422, _status(422, "Invalid", "the server rejected our request due to an error in our "
                                                        "request: test operation failed")
                if op["op"] != "test":
                    patched["spec"]["replicas"] = op.get("value")
        else:
            return 415, _status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                                                             f"accepted media types include: {', '.join(MERGE_TYPES + (JSON_PATCH,))}")
        rv = (patched.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != str(s.resource_version):
            return 409, _status(409, "Conflict", f'Operation cannot be fulfilled on statefulsets.apps "{name}": the '
                                                 "object has been modified; please apply your changes to the latest "
                                                 "version and try again")
        replicas = (patched.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            return 422, _status(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid '
                                                f"value: {replicas}: must be greater than or equal to 0")
        if replicas != s.replicas:
            s.replicas = replicas
            s.generation += 1
            s.resource_version += 1
        return 200, self._scale(name, s)

    def _scale(self, name: str, s: StatefulSetState) -> dict:
        return {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": name, "namespace": self.namespace, "uid": f"uid-{name}",
                         "resourceVersion": str(s.resource_version), "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"replicas": s.replicas},
            "status": {"replicas": s.status_replicas, "selector": f"app.kubernetes.io/name={name}"},
        }

    def _statefulset(self, name: str, s: StatefulSetState) -> dict:
        labels = {"app.kubernetes.io/name": name}
        return {
            "kind": "StatefulSet", "apiVersion": "apps/v1",
            "metadata": {"name": name, "namespace": self.namespace, "uid": f"uid-{name}", "generation": s.generation,
                         "resourceVersion": str(s.resource_version), "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": dict(s.annotations)},
            "spec": {"replicas": s.replicas, "serviceName": name, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "replica", "image": "specgate"}]}}},
            "status": {"replicas": s.status_replicas, "readyReplicas": s.ready, "availableReplicas": s.ready,
                       "currentReplicas": s.status_replicas, "updatedReplicas": s.status_replicas,
                       "observedGeneration": s.observed_generation},
        }

    def start(self) -> tuple[ThreadingHTTPServer, str]:
        """Serve on a loopback port; returns (server, base URL). `server.shutdown()` stops it."""
        sim = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                code, doc = sim.handle(self.command, self.path, self.headers.get("Content-Type"), raw)
                out = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_PATCH = do_PUT = do_POST = do_DELETE = _serve

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        return server, self.url


def _verb(method: str) -> str:
    return {"GET": "get", "PATCH": "patch", "PUT": "update", "POST": "create", "DELETE": "delete"}.get(method, method.lower())


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out
