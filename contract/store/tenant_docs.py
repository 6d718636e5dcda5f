"""One store key holding a JSON object of per-tenant documents (pydantic
models): the admin overrides (`contract.overrides`), the rollouts
(`controller:rollouts`) and the training jobs (`controller:training`) are
kept this way.

Read-modify-write of the whole object: the writers are the admin API
(human-paced) and the leader's tick, and each writes one tenant's entry after
re-reading the rest, so other tenants' writes stand. An entry that no longer
validates (an older or hand-edited shape) is skipped with a warning on read
and dropped by the next write.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from .base import Store

log = logging.getLogger("specgate.contract.store")

Doc = TypeVar("Doc", bound=BaseModel)


async def load_docs(store: Store, key: str, model: type[Doc]) -> dict[str, Doc]:
    raw = await store.get_json(key) or {}
    docs: dict[str, Doc] = {}
    for tenant, value in (raw.items() if isinstance(raw, dict) else ()):
        try:
            docs[tenant] = model.model_validate(value)
        except ValidationError as exc:
            log.warning("ignoring invalid %s entry of tenant %s: %s", key, tenant, exc.errors()[:1])
    return docs


async def save_doc(store: Store, key: str, model: type[Doc], tenant: str, doc: Doc) -> None:
    """Replace one tenant's entry (re-reading the rest)."""
    docs = await load_docs(store, key, model)
    docs[tenant] = doc
    await store.set_json(key, {t: d.model_dump(mode="json") for t, d in docs.items()})
