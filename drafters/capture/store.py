"""The capture store: a bounded, TTL-evicted directory of hidden-state samples.

Why a directory and not a database: vLLM's hidden-states connectors already
write one safetensors file per request, and a trainer reads them with
`safetensors.safe_open` without copying; what they lack is any bound. This
module adds it, so hidden states never pile up: samples older than `ttl_s`
are deleted, and before a new sample is written the oldest ones are evicted
until it fits under `max_bytes` (what Mooncake Store's master does with its
high watermark). Put the root on a tmpfs (`/dev/shm/...`, the default) and the
samples live in RAM only, never on persistent storage.

Layout: `<root>/<tenant_slug>/<request_id>.safetensors`, written to a
`.tmp-*` file first and renamed into place, so a reader never sees half a
sample (no lock files). Every sample describes itself (contract.capture).

Eviction is oldest-first by modification time, across tenants: a lagging
trainer loses the oldest samples, as it would with Mooncake; the `stats()`
counters make that visible.

Torch is imported only by `read`; everything else runs anywhere.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from contract.capture import SAMPLE_SUFFIX, SampleMeta, tenant_slug

DEFAULT_ROOT = "/dev/shm/specgate-capture"
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_TTL_S = 24 * 3600.0
_TMP_PREFIX = ".tmp-"
_STATS_FILE = ".stats.json"


@dataclass(frozen=True)
class SampleKey:
    """One stored sample: its tenant directory and file."""

    tenant_dir: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.tenant_dir}/{self.name}"


@dataclass(frozen=True)
class StoreStats:
    bytes: int
    samples: int
    high_water_bytes: int  # the most the store ever held at once (persisted in the root)
    evicted_full: int  # samples dropped to make room
    evicted_ttl: int  # samples dropped for age
    max_bytes: int
    lost: int = 0  # listed samples the backend no longer held when read (Mooncake: a store node restarted)


def sample_file_name(request_id: str) -> str:
    """A request id as a sample's name: path-safe, never hidden (a hidden
    name would pass for a temporary file and escape the bounds)."""
    safe_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in request_id) or "_"
    if safe_id.startswith("."):
        safe_id = "_" + safe_id[1:]
    return f"{safe_id}{SAMPLE_SUFFIX}"


class SampleStore:
    """A bounded sample directory; safe for one writer process per root plus any readers."""

    def __init__(self, root: str | os.PathLike = DEFAULT_ROOT, *, max_bytes: int = DEFAULT_MAX_BYTES, ttl_s: float = DEFAULT_TTL_S):
        if max_bytes <= 0 or ttl_s <= 0:
            raise ValueError("capture store: max_bytes and ttl_s must be positive")
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.ttl_s = float(ttl_s)
        self._lock = threading.Lock()
        self._last_stamp_ns = 0

    def _next_stamp_ns(self) -> int:
        """A strictly increasing modification time for each write: file systems
        stamp files with a coarse clock (a few ms), so back-to-back samples
        would tie and "oldest first" would be arbitrary."""
        self._last_stamp_ns = max(time.time_ns(), self._last_stamp_ns + 1)
        return self._last_stamp_ns

    # -- writing -------------------------------------------------------------
    def path_for(self, tenant: str, request_id: str) -> Path:
        return self.root / tenant_slug(tenant) / sample_file_name(request_id)

    def key_for(self, tenant: str, request_id: str) -> SampleKey:
        return SampleKey(tenant_slug(tenant), sample_file_name(request_id))

    def put(self, tenant: str, request_id: str, tensors: dict[str, Any], meta: SampleMeta) -> Path:
        """Write one sample (torch tensors) and keep the store within its bounds.
        A sample larger than the whole store is refused (ValueError)."""
        from safetensors.torch import save

        blob = save({k: v.contiguous() for k, v in tensors.items()}, metadata=meta.to_metadata())
        return self.put_bytes(tenant, request_id, blob)

    def put_bytes(self, tenant: str, request_id: str, blob: bytes) -> Path:
        if len(blob) > self.max_bytes:
            raise ValueError(f"capture store: a {len(blob)}-byte sample exceeds max_bytes={self.max_bytes}")
        path = self.path_for(tenant, request_id)
        with self._lock:
            stats = self._load_stats()
            self._evict_locked(stats, incoming=len(blob), now=time.time())
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f"{_TMP_PREFIX}{path.name}"
            with open(tmp, "wb") as f:
                f.write(blob)
            stamp = self._next_stamp_ns()
            os.utime(tmp, ns=(stamp, stamp))
            os.replace(tmp, path)
            stats["high_water_bytes"] = max(stats.get("high_water_bytes", 0), self._used_bytes())
            self._save_stats(stats)
        return path

    # -- bounds --------------------------------------------------------------
    def enforce(self, now: float | None = None) -> None:
        """Apply the TTL and the memory bound now (also done on every put)."""
        with self._lock:
            stats = self._load_stats()
            self._evict_locked(stats, incoming=0, now=time.time() if now is None else now)
            self._save_stats(stats)

    def _evict_locked(self, stats: dict, *, incoming: int, now: float) -> None:
        self._drop_stale_tmp(now)
        files = sorted(self._files(), key=lambda e: e[1])  # oldest first
        used = sum(size for _, _, size in files)
        for path, mtime_ns, size in files:
            expired = now - mtime_ns / 1e9 > self.ttl_s
            if not expired and used + incoming <= self.max_bytes:
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            used -= size
            stats["evicted_ttl" if expired else "evicted_full"] = stats.get("evicted_ttl" if expired else "evicted_full", 0) + 1

    # -- reading -------------------------------------------------------------
    def keys(self, tenant: str | None = None) -> list[SampleKey]:
        """Samples present now, oldest first (optionally one tenant's)."""
        found = [(p, m) for p, m, _ in self._files() if tenant is None or p.parent.name == tenant_slug(tenant)]
        return [SampleKey(p.parent.name, p.name) for p, _ in sorted(found, key=lambda e: (e[1], e[0].name))]

    def count(self, tenant: str, since: float | None = None) -> int:
        """A tenant's samples present now, captured at or after `since` (epoch s; None: all).
        The file stamp is the capture time (strictly increasing per store), so no header is read."""
        slug = tenant_slug(tenant)
        floor = None if since is None else int(since * 1e9)
        return sum(1 for p, m, _ in self._files() if p.parent.name == slug and (floor is None or m >= floor))

    def read(self, key: SampleKey | str) -> tuple[dict[str, Any], SampleMeta | None]:
        """(tensors, meta) of one sample; FileNotFoundError once it was evicted."""
        path = self._path(key)  # a bad key is refused before anything is imported or opened
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = SampleMeta.from_metadata(f.metadata())
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        return tensors, meta

    def meta(self, key: SampleKey | str) -> SampleMeta | None:
        """A sample's description without loading its tensors (reads the safetensors header)."""
        with open(self._path(key), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        return SampleMeta.from_metadata(header.get("__metadata__"))

    def delete(self, key: SampleKey | str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    def stats(self) -> StoreStats:
        """The store now. A sweep deletes files before it saves its counters,
        so a reader racing a sweep may see samples gone a moment before they
        are counted as evicted; the counters never run ahead of the files."""
        files = list(self._files())
        saved = self._load_stats()
        used = sum(size for _, _, size in files)
        return StoreStats(
            bytes=used,
            samples=len(files),
            high_water_bytes=max(saved.get("high_water_bytes", 0), used),
            evicted_full=saved.get("evicted_full", 0),
            evicted_ttl=saved.get("evicted_ttl", 0),
            max_bytes=self.max_bytes,
        )

    def close(self) -> None:
        """Nothing to release (the Mooncake store's counterpart closes its connections)."""

    # -- internals -----------------------------------------------------------
    def _path(self, key: SampleKey | str) -> Path:
        rel = key.key if isinstance(key, SampleKey) else key
        path = (self.root / rel).resolve()
        # A key names a sample file one tenant directory below the root, nothing else
        # (not the root's own files, not a directory, not a file elsewhere).
        if (
            path.parent.parent != self.root.resolve()
            or not path.name.endswith(SAMPLE_SUFFIX)
            or path.name.startswith(_TMP_PREFIX)
        ):
            raise ValueError(f"capture store: key {rel!r} does not name a sample in the store")
        return path

    def _files(self) -> Iterator[tuple[Path, int, int]]:
        """(path, mtime in ns, size) of every sample: integer ns, as floats of
        seconds cannot tell apart stamps a few hundred ns apart."""
        if not self.root.is_dir():
            return
        for tenant_dir in self.root.iterdir():
            if not tenant_dir.is_dir():
                continue
            for path in tenant_dir.iterdir():
                if not path.name.endswith(SAMPLE_SUFFIX) or path.name.startswith(_TMP_PREFIX):
                    continue
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                yield path, st.st_mtime_ns, st.st_size

    def _drop_stale_tmp(self, now: float) -> None:
        """Temporary files a crashed writer left behind: invisible to the bound,
        so they go once older than the TTL (a live write takes far less)."""
        if not self.root.is_dir():
            return
        for tenant_dir in self.root.iterdir():
            if not tenant_dir.is_dir():
                continue
            for path in tenant_dir.glob(f"{_TMP_PREFIX}*"):
                try:
                    if now - path.stat().st_mtime > self.ttl_s:
                        path.unlink()
                except FileNotFoundError:
                    continue

    def _used_bytes(self) -> int:
        return sum(size for _, _, size in self._files())

    def _load_stats(self) -> dict:
        try:
            return json.loads((self.root / _STATS_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _save_stats(self, stats: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{_TMP_PREFIX}{_STATS_FILE}"
        tmp.write_text(json.dumps(stats))
        os.replace(tmp, self.root / _STATS_FILE)

