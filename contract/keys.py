"""Every store key and channel specgate uses, in one place.

Keys are relative to the store's prefix (`specgate:` by default). The
gateway, the controller, the admin API and the benchmarks all reach shared
state through these names, so that a key renamed here is renamed for every
reader and writer at once.
"""

from __future__ import annotations

# -- speculation policies (written by the controller, read by every gateway)
POLICIES_KEY = "policies"  # JSON: {"version": int, "policies": {tenant: SpeculationPolicy}}
POLICIES_VERSION_KEY = "policies:version"  # integer, incremented on every publish
POLICIES_CHANNEL = "policies:changed"  # pub/sub: {"version": int}

# -- per-request telemetry (written by gateways, read by the controller) --
TELEMETRY_INDEX_KEY = "telemetry:index"  # set of "tenant|replica"


def telemetry_counters_key(tenant: str, replica: str) -> str:
    """Hash of monotonic counters (contract.telemetry.COUNTER_FIELDS)."""
    return f"telemetry:{tenant}|{replica}"


def telemetry_seq_key(writer: str) -> str:
    """The last flush sequence number applied for one writer (a gateway
    instance): what makes a resent flush count once (`Store.hincr_once`)."""
    return f"telemetry:seq:{writer}"


# -- budgets (gateways only) ----------------------------------------------
def budget_key(tenant_id: str) -> str:
    """Sliding request/token window of one tenant."""
    return f"budget:{tenant_id}"


# -- the controller's documents (written by the controller, read by admin) -
OVERRIDES_KEY = "controller:overrides"  # JSON {tenant: TenantOverride}
PAUSED_KEY = "controller:paused"  # JSON {"paused": bool, "by": str, "at": float}
HISTORY_KEY = "controller:history"  # capped log of policy changes (newest first)
AUDIT_KEY = "controller:audit"  # capped log of admin actions (newest first)
LAST_DECISIONS_KEY = "controller:last"  # JSON {tenant: decision record}
REPLICAS_KEY = "controller:replicas"  # JSON {replica: regime record}
FLEET_PLAN_KEY = "controller:fleet_plan"  # JSON fleet plan
LEADER_KEY = "controller:leader"  # TTL lock; value = owner id
STATUS_KEY = "controller:status"  # JSON heartbeat of the active controller
ROLLOUTS_KEY = "controller:rollouts"  # JSON {tenant: TenantDrafters} (controller/rollout.py): drafter, canary, verdicts
TRAINING_KEY = "controller:training"  # JSON {tenant: TenantTraining} (controller/training.py): drafter training jobs
HISTORY_MAX = 500
AUDIT_MAX = 1000
