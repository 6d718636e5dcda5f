"""The capture store on Mooncake Store: samples in a store node's memory,
served over TCP (RDMA on a GPU fleet), indexed in Redis.

Why this backend beside the tmpfs directory (`drafters.capture.store`): the
directory lives on the capture replica's host, so the trainer must run
there; Mooncake Store serves a sample by key to any host, and the memory it
lives in belongs to a store node (`mooncake_client`), not to the replica that
wrote it (a replica restart loses nothing). It is what the seed document
and hs-connectors' `MooncakeHiddenStatesConnector` use.

Why an index in Redis: Mooncake Store has no key listing and no TTL (its
master evicts by memory watermark, silently), while the trainer must find a
tenant's samples, the controller count the new ones, and the TTL and byte
bound hold whatever the trainer does. So every sample is listed in Redis
(the stack's shared state already): a sorted set per tenant and one across
tenants (score = a strictly increasing capture stamp, ns), its size and its
`SampleMeta`, and the store's counters. Adds and removals are Lua scripts,
so the byte count stays exact when the writer evicts a sample the trainer is
deleting. The bound (`max_bytes`) is kept below the store node's segment
(`segment_bytes_for`), so Mooncake's own eviction never runs; should a
sample go missing anyway (a store node restarted), `read` drops its entry
and counts it in `lost`.

Spec (`store_root` wherever a capture store is named):

    mooncake://MASTER_HOST:PORT/NAMESPACE?index=redis://HOST:6379/0[&local_hostname=H][&buffer_bytes=N]

NAMESPACE prefixes the keys in both stores (default `specgate-capture`);
`local_hostname` is the address this process advertises to the store node
(default 127.0.0.1); `buffer_bytes` this process's transfer buffer, which
bounds the largest sample (default 64 MiB).

The index and the counters need only redis-py: `keys`, `count`, `meta` and
`stats` run in the gateway's venv (the controller counts samples there);
`put`, `read` and `delete` need the Mooncake client (.venv-vllm).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from contract.capture import SAMPLE_SUFFIX, SampleMeta, tenant_slug

from .store import (
    DEFAULT_MAX_BYTES,
    DEFAULT_TTL_S,
    SampleKey,
    StoreStats,
    sample_file_name,
)

SCHEME = "mooncake"
DEFAULT_NAMESPACE = "specgate-capture"
DEFAULT_BUFFER_BYTES = 64 << 20
# Mooncake's master starts evicting at 90 % of the segments; the index's bound
# stays well below it (allocation rounds each object up).
SEGMENT_HEADROOM = 1.25
SEGMENT_SLACK_BYTES = 16 << 20

# KEYS: all, tenant, sizes, metas, stats. ARGV: key, stamp, size, meta.
_ADD = """
local old = redis.call('hget', KEYS[3], ARGV[1])
if old then redis.call('hincrby', KEYS[5], 'bytes', -tonumber(old)) end
redis.call('zadd', KEYS[1], ARGV[2], ARGV[1])
redis.call('zadd', KEYS[2], ARGV[2], ARGV[1])
redis.call('hset', KEYS[3], ARGV[1], ARGV[3])
redis.call('hset', KEYS[4], ARGV[1], ARGV[4])
local used = redis.call('hincrby', KEYS[5], 'bytes', tonumber(ARGV[3]))
local hw = tonumber(redis.call('hget', KEYS[5], 'high_water_bytes') or '0')
if used > hw then redis.call('hset', KEYS[5], 'high_water_bytes', used) end
return used
"""
# KEYS: all, tenant, sizes, metas, stats. ARGV: key, counter ('' = none). 1 if it was listed.
_REMOVE = """
if redis.call('zrem', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('zrem', KEYS[2], ARGV[1])
local size = tonumber(redis.call('hget', KEYS[3], ARGV[1]) or '0')
redis.call('hdel', KEYS[3], ARGV[1])
redis.call('hdel', KEYS[4], ARGV[1])
redis.call('hincrby', KEYS[5], 'bytes', -size)
if ARGV[2] ~= '' then redis.call('hincrby', KEYS[5], ARGV[2], 1) end
return 1
"""


def is_mooncake_spec(spec: str) -> bool:
    return isinstance(spec, str) and spec.startswith(f"{SCHEME}://")


def mooncake_spec(master: str, index_url: str, namespace: str = DEFAULT_NAMESPACE, **query: object) -> str:
    """The spec of a store at `master` indexed at `index_url` (`query`: local_hostname, buffer_bytes)."""
    from urllib.parse import urlencode

    return f"{SCHEME}://{master}/{namespace}?" + urlencode({"index": index_url, **query})


def segment_bytes_for(max_bytes: int) -> int:
    """The store node segment that holds `max_bytes` of samples below Mooncake's eviction watermark."""
    return int(max_bytes * SEGMENT_HEADROOM) + SEGMENT_SLACK_BYTES


@dataclass(frozen=True)
class MooncakeLocation:
    """A parsed `mooncake://` spec."""

    master: str
    index_url: str
    namespace: str = DEFAULT_NAMESPACE
    local_hostname: str = "127.0.0.1"
    buffer_bytes: int = DEFAULT_BUFFER_BYTES

    @classmethod
    def parse(cls, spec: str) -> MooncakeLocation:
        parts = urlsplit(spec)
        if parts.scheme != SCHEME or not parts.hostname or not parts.port:
            raise ValueError(f"capture store: {spec!r} is not mooncake://HOST:PORT/NAMESPACE?index=redis://...")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        index = query.get("index", "")
        if not index.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"capture store: {spec!r} names no Redis index (?index=redis://HOST:PORT/DB)")
        namespace = parts.path.strip("/") or DEFAULT_NAMESPACE
        buffer_bytes = int(query.get("buffer_bytes", DEFAULT_BUFFER_BYTES))
        if buffer_bytes <= 0:
            raise ValueError("capture store: buffer_bytes must be positive")
        return cls(f"{parts.hostname}:{parts.port}", index, namespace, query.get("local_hostname", "127.0.0.1"), buffer_bytes)


class MooncakeSampleStore:
    """`SampleStore`'s interface over Mooncake Store + a Redis index. Safe for
    one writer process per namespace plus any readers (as the directory)."""

    def __init__(self, spec: str, *, max_bytes: int = DEFAULT_MAX_BYTES, ttl_s: float = DEFAULT_TTL_S):
        if max_bytes <= 0 or ttl_s <= 0:
            raise ValueError("capture store: max_bytes and ttl_s must be positive")
        self.location = MooncakeLocation.parse(spec)
        self.root = spec  # what logs and messages name the store by
        self.max_bytes = int(max_bytes)
        self.ttl_s = float(ttl_s)
        import redis

        # Bounded waits: a hung Redis must fail a write (logged by the connector), not stall it.
        self._redis = redis.Redis.from_url(self.location.index_url, socket_timeout=10, socket_connect_timeout=5)
        self._add = self._redis.register_script(_ADD)
        self._remove = self._redis.register_script(_REMOVE)
        prefix = f"{self.location.namespace}:"
        self._all, self._sizes, self._metas, self._stats = (prefix + n for n in ("all", "sizes", "metas", "stats"))
        self._tenant_prefix = prefix + "tenant:"
        self._client = None
        self._lock = threading.Lock()
        self._last_stamp_ns = 0

    # -- the Mooncake side ---------------------------------------------------
    def _mooncake(self):
        """The Mooncake client, set up on first use: it mounts no segment (the
        store node holds the samples) and a transfer buffer of `buffer_bytes`."""
        if self._client is None:
            from .mooncake_runtime import distributed_store_class

            client = distributed_store_class()()
            loc = self.location
            rc = client.setup(loc.local_hostname, "P2PHANDSHAKE", 0, loc.buffer_bytes, "tcp", "", loc.master)
            if rc != 0:
                raise ConnectionError(f"capture store: Mooncake setup against master {loc.master} failed ({rc})")
            self._client = client
        return self._client

    def _object(self, key: str) -> str:
        return f"{self.location.namespace}/{key}"

    # -- writing -------------------------------------------------------------
    def key_for(self, tenant: str, request_id: str) -> SampleKey:
        return SampleKey(tenant_slug(tenant), sample_file_name(request_id))

    def put(self, tenant: str, request_id: str, tensors: dict[str, Any], meta: SampleMeta) -> SampleKey:
        """Write one sample (torch tensors) and keep the store within its bounds."""
        from safetensors.torch import save

        blob = save({k: v.contiguous() for k, v in tensors.items()}, metadata=meta.to_metadata())
        return self.put_bytes(tenant, request_id, blob)

    def put_bytes(self, tenant: str, request_id: str, blob: bytes) -> SampleKey:
        """A sample larger than the bound or the transfer buffer is refused
        (ValueError). Its `SampleMeta` (from the blob's header) is indexed."""
        if len(blob) > self.max_bytes:
            raise ValueError(f"capture store: a {len(blob)}-byte sample exceeds max_bytes={self.max_bytes}")
        if len(blob) > self.location.buffer_bytes:
            raise ValueError(f"capture store: a {len(blob)}-byte sample exceeds the transfer buffer "
                             f"(buffer_bytes={self.location.buffer_bytes})")
        key = self.key_for(tenant, request_id)
        meta = _meta_of(blob)
        meta_json = json.dumps(meta.to_metadata() if meta is not None else None)
        with self._lock:
            self._evict_locked(incoming=len(blob), now=time.time())
            client = self._mooncake()
            obj = self._object(key.key)
            if client.is_exist(obj) == 1:  # the same request captured again: replaced
                client.remove(obj, True)
            rc = client.put(obj, blob)
            if rc != 0:
                raise OSError(f"capture store: Mooncake put of {key.key} failed ({rc})")
            self._last_stamp_ns = max(time.time_ns(), self._last_stamp_ns + 1)
            self._add(keys=self._index_keys(key), args=[key.key, self._last_stamp_ns, len(blob), meta_json])
        return key

    # -- bounds --------------------------------------------------------------
    def enforce(self, now: float | None = None) -> None:
        """Apply the TTL and the bound now (also done on every put)."""
        with self._lock:
            self._evict_locked(incoming=0, now=time.time() if now is None else now)

    def _evict_locked(self, *, incoming: int, now: float) -> None:
        cutoff_ns = int((now - self.ttl_s) * 1e9)
        for raw in self._redis.zrangebyscore(self._all, "-inf", f"({cutoff_ns}"):
            self._drop(raw.decode(), "evicted_ttl")
        while int(self._redis.hget(self._stats, "bytes") or 0) + incoming > self.max_bytes:
            oldest = self._redis.zrange(self._all, 0, 0)
            if not oldest:
                break
            self._drop(oldest[0].decode(), "evicted_full")

    def _drop(self, key: str, counter: str) -> bool:
        """Unlist `key` (counted under `counter`) and free its memory; False if it was not listed."""
        listed = bool(self._remove(keys=self._index_keys(_split(key)), args=[key, counter]))
        if listed:
            self._mooncake().remove(self._object(key), True)
        return listed

    # -- reading -------------------------------------------------------------
    def keys(self, tenant: str | None = None) -> list[SampleKey]:
        """Samples listed now, oldest first (optionally one tenant's)."""
        zset = self._all if tenant is None else self._tenant_prefix + tenant_slug(tenant)
        return [_split(raw.decode()) for raw in self._redis.zrange(zset, 0, -1)]

    def count(self, tenant: str, since: float | None = None) -> int:
        """A tenant's samples listed now, captured at or after `since` (epoch s; None: all)."""
        low = "-inf" if since is None else int(since * 1e9)
        return int(self._redis.zcount(self._tenant_prefix + tenant_slug(tenant), low, "+inf"))

    def read(self, key: SampleKey | str) -> tuple[dict[str, Any], SampleMeta | None]:
        """(tensors, meta) of one sample; FileNotFoundError once it is gone
        (as the directory store, so a trainer needs no second except clause)."""
        k = self._checked(key)
        if self._redis.zscore(self._all, k.key) is None:
            raise FileNotFoundError(f"capture store: no sample {k.key}")
        blob = self._mooncake().get(self._object(k.key))
        if not blob:
            self._drop(k.key, "lost")
            raise FileNotFoundError(f"capture store: sample {k.key} is listed but Mooncake no longer holds it")
        from safetensors.torch import load

        return load(blob), _meta_of(blob)

    def meta(self, key: SampleKey | str) -> SampleMeta | None:
        raw = self._redis.hget(self._metas, self._checked(key).key)
        if raw is None:
            raise FileNotFoundError(f"capture store: no sample {self._checked(key).key}")
        return SampleMeta.from_metadata(json.loads(raw))  # None: not a specgate sample (as the directory store)

    def delete(self, key: SampleKey | str) -> None:
        self._drop(self._checked(key).key, "")

    def stats(self) -> StoreStats:
        saved = {k.decode(): int(v) for k, v in self._redis.hgetall(self._stats).items()}
        used = saved.get("bytes", 0)
        return StoreStats(
            bytes=used,
            samples=int(self._redis.zcard(self._all)),
            high_water_bytes=max(saved.get("high_water_bytes", 0), used),
            evicted_full=saved.get("evicted_full", 0),
            evicted_ttl=saved.get("evicted_ttl", 0),
            max_bytes=self.max_bytes,
            lost=saved.get("lost", 0),
        )

    def close(self) -> None:
        """Release the Redis connections and the Mooncake client."""
        self._redis.close()
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- internals -----------------------------------------------------------
    def _index_keys(self, key: SampleKey) -> list[str]:
        return [self._all, self._tenant_prefix + key.tenant_dir, self._sizes, self._metas, self._stats]

    @staticmethod
    def _checked(key: SampleKey | str) -> SampleKey:
        k = key if isinstance(key, SampleKey) else _split(key)
        if k.tenant_dir != tenant_slug(k.tenant_dir) or not k.name.endswith(SAMPLE_SUFFIX) or "/" in k.name:
            raise ValueError(f"capture store: key {k.key!r} does not name a sample")
        return k


def _split(key: str) -> SampleKey:
    tenant_dir, _, name = key.partition("/")
    return SampleKey(tenant_dir, name)


def _meta_of(blob: bytes) -> SampleMeta | None:
    """The `SampleMeta` in a safetensors blob's header."""
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    return SampleMeta.from_metadata(header.get("__metadata__"))
