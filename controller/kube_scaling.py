"""The `kubernetes` fleet actuator: apply fleet-plan restarts by scaling per-profile pools.

Why: on Kubernetes a replica's launch profile is its pool's. Each profile runs
as a StatefulSet `<pool_prefix><profile>` (`vllm-dspark-b8`, `vllm-off`)
behind a headless Service of the same name, its pods being the replicas
`vllm-<profile>-<ordinal>` listed in SPECGATE_REPLICAS. "Restart replica R
(profile P) as profile Q" is therefore "scale pool P down by one and pool Q
up by one": the same GPU changes profile, through the API a cluster already
has, with no privileged access to pods.

What it does (the official `kubernetes` client, synchronous, so every call
runs in a worker thread and the controller's event loop keeps ticking):

* `restart(replica, profile)`: read both pools' `statefulsets/scale` and
  Q's StatefulSet (through `statefulsets/status`, which returns the whole
  object), refuse when Q is at its `specgate.io/max-replicas` (the ordinals
  SPECGATE_REPLICAS lists for it: a pod past them would be a GPU the
  gateway never routes to), then patch P to n-1 and Q to m+1 (`application/merge-patch+json`, carrying the
  `resourceVersion` just read, so a concurrent change -- a person, another
  controller -- fails with 409 Conflict instead of being overwritten). Down
  first: the freed GPU is what Q's new pod is scheduled on, and the restart's
  downtime is what the payback gate priced. If Q cannot be scaled, P is put
  back. The StatefulSet removes its *highest* ordinal, which need not be the
  replica the plan named: a pool's replicas are interchangeable copies of
  one profile, so the fleet ends up as the plan said.
* `busy()`: the pools it scaled that have not converged yet (status replicas
  != spec, ready < spec, or the StatefulSet controller has not observed the
  change): the gate holds meanwhile. `refresh()` reads them
  (`statefulsets/status`) once per tick. A pool not ready within
  `converge_timeout_s` stops holding the gate and is reported.
* API errors (403 from RBAC, 404 for a missing pool, 409 conflicts, network
  errors) are logged and recorded in the plan document (`report()`), never
  raised: a failed scale leaves the fleet as it was and the controller keeps
  deciding.

RBAC it needs (deploy/k8s/base/controller-rbac.yaml): `get` + `patch` on
`statefulsets/scale`, `get` on `statefulsets/status`, in its namespace.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from contract.profiles import parse_profile
from contract.settings import KubernetesActuatorSettings

log = logging.getLogger("specgate.controller.kubernetes")

# Where Kubernetes mounts a pod's service-account namespace.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
MERGE_PATCH = "application/merge-patch+json"
# A pool's largest size: the ordinals the gateway's replica list names (deploy/k8s/base/replicas.yaml).
MAX_REPLICAS_ANNOTATION = "specgate.io/max-replicas"


def pool_name(prefix: str, profile: str) -> str:
    """The StatefulSet of a profile's pool."""
    return f"{prefix}{parse_profile(profile).label}"


def replica_profile(prefix: str, replica: str) -> str | None:
    """The profile of replica `<prefix><profile>-<ordinal>`, or None when the name does not follow it."""
    if not replica.startswith(prefix):
        return None
    stem, _, ordinal = replica[len(prefix):].rpartition("-")
    if not stem or not ordinal.isdigit():
        return None
    try:
        return parse_profile(stem).label
    except ValueError:
        return None


def converging(sts: Any) -> str | None:
    """Why a StatefulSet (V1StatefulSet) is still converging, or None when it is done."""
    want = sts.spec.replicas if sts.spec and sts.spec.replicas is not None else 1
    st = sts.status
    if st is None:
        return "no status yet"
    generation = sts.metadata.generation if sts.metadata else None
    if generation is not None and (st.observed_generation or 0) < generation:
        return f"generation {generation} not observed yet"
    if (st.replicas or 0) != want:
        return f"{st.replicas or 0}/{want} pods"
    if (st.ready_replicas or 0) < want:
        return f"{st.ready_replicas or 0}/{want} ready"
    return None


def max_replicas(sts: Any) -> int | None:
    """A StatefulSet's `specgate.io/max-replicas`, or None when it has none (no limit)."""
    annotations = (sts.metadata.annotations if sts.metadata else None) or {}
    try:
        return int(annotations[MAX_REPLICAS_ANNOTATION])
    except (KeyError, TypeError, ValueError):
        return None


def default_namespace() -> str:
    """The pod's own namespace (in-cluster), else the kubeconfig context's, else `default`."""
    try:
        text = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        if text:
            return text
    except OSError:
        pass
    try:
        from kubernetes import config

        _, active = config.list_kube_config_contexts(config_file=_kubeconfig())
        namespace = (active or {}).get("context", {}).get("namespace")
        if namespace:
            return namespace
    except Exception:  # no kubeconfig: not in a cluster either
        pass
    return "default"


def load_client_configuration() -> Any:
    """In-cluster service-account configuration, else the kubeconfig (KUBECONFIG / ~/.kube/config)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(config_file=_kubeconfig(), client_configuration=cfg)
    return cfg


def _kubeconfig() -> str | None:
    """KUBECONFIG as it is now (the client reads it once, at import); None = ~/.kube/config."""
    return os.environ.get("KUBECONFIG") or None


class KubernetesScaling:
    """`RestartAction` that scales the per-profile StatefulSets (see the module docstring)."""

    name = "kubernetes"

    def __init__(
        self,
        apps: Any,
        namespace: str,
        pool_prefix: str = "vllm-",
        request_timeout_s: float = 10.0,
        converge_timeout_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
        keep: int = 20,
    ) -> None:
        """`apps`: a `kubernetes.client.AppsV1Api`."""
        self.apps = apps
        self.namespace = namespace
        self.prefix = pool_prefix
        self.request_timeout_s = request_timeout_s
        self.converge_timeout_s = converge_timeout_s
        self.clock = clock
        self.keep = keep
        self._pending: dict[str, float] = {}  # pool -> when this action scaled it
        self._state: dict[str, str] = {}  # pool -> why it is still converging
        self.events: list[dict[str, Any]] = []  # the last `keep` restarts, each with its outcome
        self.errors: list[dict[str, Any]] = []  # the last `keep` API errors

    @classmethod
    def from_settings(cls, settings: KubernetesActuatorSettings) -> KubernetesScaling:
        """Configured from `controller.restart_gate.kubernetes`; credentials in-cluster or from kubeconfig."""
        from kubernetes import client

        apps = client.AppsV1Api(client.ApiClient(load_client_configuration()))
        return cls(apps, settings.namespace or default_namespace(), settings.pool_prefix,
                   settings.request_timeout_s, settings.converge_timeout_s)

    # -- RestartAction ------------------------------------------------------
    def busy(self) -> set[str]:
        return set(self._pending)

    async def restart(self, replica: str, profile: str) -> None:
        event: dict[str, Any] = {"at": round(time.time(), 3), "replica": replica, "profile": profile, "scaled": [],
                                 "error": None}
        self.events = (self.events + [event])[-self.keep:]
        current = replica_profile(self.prefix, replica)
        if current is None:
            self._error(event, None, f"replica {replica!r} is not named {self.prefix}<profile>-<ordinal>: "
                                     "no pool to scale down")
            return
        src, dst = pool_name(self.prefix, current), pool_name(self.prefix, profile)
        event["from_pool"], event["to_pool"] = src, dst
        if src == dst:
            return
        try:
            down = await self._call(self.apps.read_namespaced_stateful_set_scale, src)
            up = await self._call(self.apps.read_namespaced_stateful_set_scale, dst)
            limit = max_replicas(await self._call(self.apps.read_namespaced_stateful_set_status, dst))
        except Exception as exc:  # noqa: BLE001 -- recorded, never raised (see module docstring)
            self._error(event, exc, "reading the pools' scale")
            return
        n, m = down.spec.replicas or 0, up.spec.replicas or 0
        if n < 1:
            self._error(event, None, f"{src} has no replica to give ({n})")
            return
        if limit is not None and m + 1 > limit:
            self._error(event, None, f"{dst} is at its {MAX_REPLICAS_ANNOTATION} ({limit}): list more of its "
                                     "ordinals in SPECGATE_REPLICAS and raise the annotation to grow it")
            return
        try:
            shrunk = await self._scale(src, n - 1, down.metadata.resource_version)
        except Exception as exc:  # noqa: BLE001
            self._error(event, exc, f"scaling {src} {n}->{n - 1}")
            return
        event["scaled"].append({"pool": src, "from": n, "to": n - 1})
        self._pending[src] = self.clock()
        try:
            await self._scale(dst, m + 1, up.metadata.resource_version)
        except Exception as exc:  # noqa: BLE001
            self._error(event, exc, f"scaling {dst} {m}->{m + 1}")
            try:  # give the capacity back: the fleet stays as it was
                await self._scale(src, n, shrunk.metadata.resource_version)
                event["scaled"].append({"pool": src, "from": n - 1, "to": n, "rollback": True})
            except Exception as again:  # noqa: BLE001
                self._error(event, again, f"restoring {src} {n - 1}->{n}")
            return
        event["scaled"].append({"pool": dst, "from": m, "to": m + 1})
        self._pending[dst] = self.clock()
        log.info("fleet plan: scaled %s %d->%d and %s %d->%d (replica %s as %s)", src, n, n - 1, dst, m, m + 1,
                 replica, profile)

    # -- observed state (GatedActuator calls these each tick) -----------------
    async def refresh(self) -> None:
        """Re-read the pools still converging: converged ones stop holding the gate."""
        for pool, since in list(self._pending.items()):
            try:
                sts = await self._call(self.apps.read_namespaced_stateful_set_status, pool)
                why = converging(sts)
            except Exception as exc:  # noqa: BLE001
                self._error(None, exc, f"reading {pool}'s status")
                why = "status unreadable"
            if why is None:
                self._pending.pop(pool, None)
                self._state.pop(pool, None)
            elif self.clock() - since > self.converge_timeout_s:
                self._pending.pop(pool, None)
                self._state.pop(pool, None)
                self._error(None, None, f"{pool} did not converge within {self.converge_timeout_s:.0f} s ({why}); "
                                        "the gate no longer waits for it")
            else:
                self._state[pool] = why

    def report(self) -> dict[str, Any]:
        """This action's part of the plan document."""
        return {
            "namespace": self.namespace,
            "pool_prefix": self.prefix,
            "converging": {p: self._state.get(p, "scaled") for p in sorted(self._pending)},
            "events": list(self.events),
            "errors": list(self.errors),
        }

    def pool_of(self, profile: str) -> str:
        return pool_name(self.prefix, profile)

    # -- API ------------------------------------------------------------------
    async def _call(self, fn: Callable[..., Any], name: str, **kw: Any) -> Any:
        return await asyncio.to_thread(fn, name, self.namespace, _request_timeout=self.request_timeout_s, **kw)

    async def _scale(self, pool: str, replicas: int, resource_version: str | None) -> Any:
        body: dict[str, Any] = {"spec": {"replicas": replicas}}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self._call(self.apps.patch_namespaced_stateful_set_scale, pool, body=body,
                                _content_type=MERGE_PATCH)

    def _error(self, event: dict[str, Any] | None, exc: BaseException | None, doing: str) -> None:
        status = getattr(exc, "status", None)
        reason = getattr(exc, "reason", None)
        message = doing if exc is None else f"{doing}: {status or type(exc).__name__} {reason or exc}".rstrip()
        if status == 403:
            message += " (RBAC: see deploy/k8s/base/controller-rbac.yaml)"
        record = {"at": round(time.time(), 3), "error": message, "status": status}
        if event is not None:
            event["error"] = message
            record["replica"] = event["replica"]
        self.errors = (self.errors + [record])[-self.keep:]
        log.warning("kubernetes fleet actuator: %s", message)
