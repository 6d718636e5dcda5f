"""Admin overrides, pause flag, decision history and audit log: the store keys
that the admin API writes and the controller reads.

Kept apart from the controller loop so that the gateway process (admin API)
and a standalone controller process agree on one key layout without either
importing the other's machinery.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from gateway.store import Store

_log = logging.getLogger("specgate.controller.overrides")

OVERRIDES_KEY = "controller:overrides"  # JSON {tenant: TenantOverride}
PAUSED_KEY = "controller:paused"  # JSON {"paused": bool, "by": str, "at": float}
HISTORY_KEY = "controller:history"  # capped log of policy changes (newest first)
AUDIT_KEY = "controller:audit"  # capped log of admin actions (newest first)
LAST_DECISIONS_KEY = "controller:last"  # JSON {tenant: DecisionRecord dict}
REPLICAS_KEY = "controller:replicas"  # JSON {replica: regime dict}
FLEET_PLAN_KEY = "controller:fleet_plan"  # JSON FleetPlan dict
LEADER_KEY = "controller:leader"  # TTL lock; value = owner id
STATUS_KEY = "controller:status"  # JSON heartbeat of the active controller
HISTORY_MAX = 500
AUDIT_MAX = 1000


class TenantOverride(BaseModel):
    """An operator's word on one tenant. `auto` with no bounds = controller decides.

    `on` pins speculation on (the controller still tunes draft length and
    confidence inside the bounds), `off` pins it off; bounds clamp whatever
    the controller would choose.
    """

    mode: Literal["auto", "on", "off"] = "auto"
    max_draft_min: int | None = Field(default=None, ge=1)
    max_draft_max: int | None = Field(default=None, ge=1)
    min_confidence_min: float | None = Field(default=None, ge=0.0, le=1.0)
    min_confidence_max: float | None = Field(default=None, ge=0.0, le=1.0)
    by: str = ""
    at: float = 0.0
    note: str = ""

    @model_validator(mode="after")
    def _ordered(self) -> "TenantOverride":
        if self.max_draft_min is not None and self.max_draft_max is not None and self.max_draft_min > self.max_draft_max:
            raise ValueError("max_draft_min must be <= max_draft_max")
        if (
            self.min_confidence_min is not None
            and self.min_confidence_max is not None
            and self.min_confidence_min > self.min_confidence_max
        ):
            raise ValueError("min_confidence_min must be <= min_confidence_max")
        return self

    @property
    def is_noop(self) -> bool:
        return self.mode == "auto" and all(
            v is None for v in (self.max_draft_min, self.max_draft_max, self.min_confidence_min, self.min_confidence_max)
        )


async def load_overrides(store: Store) -> dict[str, TenantOverride]:
    """Stored overrides; an entry that no longer validates (an older schema,
    a hand edit) is skipped with a warning rather than failing every tick and
    every admin call."""
    raw = await store.get_json(OVERRIDES_KEY) or {}
    overrides: dict[str, TenantOverride] = {}
    for tenant, value in (raw.items() if isinstance(raw, dict) else ()):
        try:
            overrides[tenant] = TenantOverride.model_validate(value)
        except ValidationError as exc:
            _log.warning("ignoring invalid override for tenant %s: %s", tenant, exc.errors()[:1])
    return overrides


async def set_override(store: Store, tenant: str, override: TenantOverride) -> dict[str, TenantOverride]:
    """Replace one tenant's override (`auto` without bounds removes it).

    Read-modify-write of one JSON document: admin writes are rare and human
    paced, so a lost update between two simultaneous admins is acceptable and
    the audit log shows both.
    """
    current = await load_overrides(store)
    if override.is_noop:
        current.pop(tenant, None)
    else:
        current[tenant] = override
    await store.set_json(OVERRIDES_KEY, {t: o.model_dump(mode="json") for t, o in current.items()})
    return current


async def is_paused(store: Store) -> bool:
    raw = await store.get_json(PAUSED_KEY)
    return bool(raw and raw.get("paused"))


async def set_paused(store: Store, paused: bool, by: str) -> None:
    await store.set_json(PAUSED_KEY, {"paused": paused, "by": by, "at": time.time()})


async def audit(store: Store, who: str, action: str, target: str | None, detail: Any) -> dict[str, Any]:
    entry = {"at": time.time(), "who": who, "action": action, "target": target, "detail": detail}
    await store.push_capped(AUDIT_KEY, entry, AUDIT_MAX)
    return entry
