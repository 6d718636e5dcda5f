"""The controller's operator state besides overrides: the pause flag and the
audit log of admin actions (who, when, what).

Overrides themselves and the keys live in the contract package
(`contract.overrides`, `contract.keys`); this module is what only the
controller side (its loop and its admin API) reads and writes.
"""

from __future__ import annotations

import time
from typing import Any

from contract.keys import AUDIT_KEY, AUDIT_MAX, PAUSED_KEY
from contract.store import Store


async def is_paused(store: Store) -> bool:
    raw = await store.get_json(PAUSED_KEY)
    return bool(raw and raw.get("paused"))


async def set_paused(store: Store, paused: bool, by: str) -> None:
    await store.set_json(PAUSED_KEY, {"paused": paused, "by": by, "at": time.time()})


async def audit(store: Store, who: str, action: str, target: str | None, detail: Any) -> dict[str, Any]:
    entry = {"at": time.time(), "who": who, "action": action, "target": target, "detail": detail}
    await store.push_capped(AUDIT_KEY, entry, AUDIT_MAX)
    return entry
