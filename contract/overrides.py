"""Admin overrides: the operator's word on one tenant, and what it does to a
policy (`apply_override`), defined once for the decision and the admin API.

The admin API (controller/admin.py) writes overrides; the controller reads
them every tick and keeps honouring them; `apply_override` is the one rule
both use, so a pinned tenant gets the same policy whether the admin write or
the next controller tick produced it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

from pydantic import BaseModel, Field, model_validator

from .keys import OVERRIDES_KEY
from .knobs import compact_schedule
from .policy import SpeculationPolicy
from .profiles import parse_profile
from .store import Store
from .store.tenant_docs import load_docs


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

    def allows_cap(self, k: int) -> bool:
        """Whether a draft cap `k` (0 = speculation off) is inside this override."""
        if self.mode == "off":
            return k == 0
        if k == 0:
            return self.mode != "on"
        lo = self.max_draft_min or 0
        hi = self.max_draft_max if self.max_draft_max is not None else 10**6
        return lo <= k <= hi

    def clamp_cap(self, k: int) -> int:
        if self.max_draft_min is not None:
            k = max(k, self.max_draft_min)
        if self.max_draft_max is not None:
            k = min(k, self.max_draft_max)
        return k

    def clamp_confidence(self, theta: float | None) -> float | None:
        """A floor inside the bounds; a lower bound turns "no floor" into that floor."""
        if theta is None and self.min_confidence_min is None:
            return None
        theta = theta or 0.0
        if self.min_confidence_min is not None:
            theta = max(theta, self.min_confidence_min)
        if self.min_confidence_max is not None:
            theta = min(theta, self.min_confidence_max)
        return theta


@dataclass(frozen=True)
class FleetShape:
    """What an override's policy depends on in the fleet: whether a pool of
    `off` replicas exists (a tenant pinned off is routed there) and the
    largest drafter block among live replicas (0 = none drafts; None =
    unknown, no clamp)."""

    off_pool: bool = False
    max_block: int | None = None

    @classmethod
    def of_profiles(cls, labels: Iterable[str | None]) -> "FleetShape":
        """From the profile labels of the live replicas (None = unlabelled)."""
        blocks = [parse_profile(label).block_size for label in labels if label is not None]
        return cls(off_pool=0 in blocks, max_block=max(blocks) if blocks else None)


def apply_override(
    current: SpeculationPolicy, ov: TenantOverride | None, fleet: FleetShape = FleetShape()
) -> SpeculationPolicy | None:
    """The policy an override implies given the `current` one, or None when the
    controller's own choice stands (no override, bounds on a tenant whose
    speculation is off, or an `on` pin while no live replica drafts).

    - `off`: speculation off (routed to the off pool when there is one).
    - `on`: speculation on at any load (no `max_batch` threshold, no
      schedule), draft cap and confidence floor clamped into the bounds.
    - `auto` with bounds: the current choice clamped into the bounds; the
      controller's load threshold stays, and so do its schedule's zeros (the
      batch sizes where it stops drafting) while its other draft lengths are
      clamped like the cap.

    The tenant's drafter, canary and capture opt-in are kept from `current`.
    A cap is never above the largest live block. The decision (controller/
    decision/assembly.py) and the admin API (controller/admin.py) both apply
    overrides through this function only.
    """
    if ov is None or ov.is_noop:
        return None
    # An override is about speculating and its caps; the tenant's drafter, canary
    # and capture opt-in are not its business and stay as they are.
    kept = {"drafter": current.drafter, "canary": current.canary, "capture": current.capture}
    if ov.mode == "off":
        return SpeculationPolicy(
            enabled=False, preferred_profile="off" if fleet.off_pool else None, max_draft=0,
            reason="admin override: off", source="admin", **kept,
        )
    enabled = True if ov.mode == "on" else current.enabled
    if not enabled or fleet.max_block == 0:
        return None

    def bounded(draft: int) -> int:
        """A draft cap inside the override's bounds and the largest live block."""
        draft = ov.clamp_cap(draft)
        return min(draft, fleet.max_block) if fleet.max_block is not None else draft

    k = current.max_draft if current.enabled and current.max_draft else (ov.max_draft_max or ov.max_draft_min)
    if k is not None:
        k = bounded(k)
    schedule = None
    if current.enabled and ov.mode != "on" and current.schedule is not None:
        # Its zeros stay: where it stops drafting is the controller's load verdict, as max_batch is.
        schedule = compact_schedule((max_batch, bounded(draft) if draft else 0) for max_batch, draft in current.schedule)
    return SpeculationPolicy(
        enabled=True,
        preferred_profile=current.preferred_profile if current.enabled else None,
        max_draft=k,
        min_confidence=ov.clamp_confidence(current.min_confidence if current.enabled else None),
        max_batch=current.max_batch if current.enabled and ov.mode != "on" else None,
        schedule=schedule,
        reason=f"admin override: {ov.mode}",
        source="admin",
        **kept,
    )


async def load_overrides(store: Store) -> dict[str, TenantOverride]:
    """Stored overrides; an entry that no longer validates (an older schema,
    a hand edit) is skipped with a warning rather than failing every tick and
    every admin call."""
    return await load_docs(store, OVERRIDES_KEY, TenantOverride)


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
