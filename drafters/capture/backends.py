"""Which capture store a name means: one place where every party that names
a store (the connector, the trainer, the controller, the bench) opens it.

Apart from both backends so that neither imports the other: a directory
(`store.SampleStore`) or a `mooncake://` spec (`mooncake_store.MooncakeSampleStore`),
with the same interface.
"""

from __future__ import annotations

import os

from .mooncake_store import MooncakeSampleStore, is_mooncake_spec
from .store import DEFAULT_MAX_BYTES, DEFAULT_TTL_S, SampleStore


def open_store(spec: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
               ttl_s: float = DEFAULT_TTL_S) -> SampleStore | MooncakeSampleStore:
    """The capture store `spec` names: `mooncake://...` or a directory."""
    if is_mooncake_spec(os.fspath(spec)):
        return MooncakeSampleStore(os.fspath(spec), max_bytes=max_bytes, ttl_s=ttl_s)
    return SampleStore(spec, max_bytes=max_bytes, ttl_s=ttl_s)
