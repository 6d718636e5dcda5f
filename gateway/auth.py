"""API key -> tenant. Keys are never stored: only their SHA-256 digests.

The lookup is a dict keyed by digest, so a wrong key costs one hash and one
miss; no key material or digest of a presented key is ever logged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from contract.policy import ANONYMOUS_TENANT
from contract.settings import Settings, TenantConfig

ANONYMOUS = TenantConfig(id=ANONYMOUS_TENANT, api_key_sha256="0" * 64)


@dataclass(frozen=True)
class AuthResult:
    tenant: TenantConfig | None
    error: str | None = None


class TenantDirectory:
    def __init__(self, settings: Settings) -> None:
        self._by_hash = {t.api_key_sha256: t for t in settings.tenants}
        self._anonymous = settings.gateway.allow_anonymous and not settings.tenants
        self.by_id = {t.id: t for t in settings.tenants}

    def authenticate(self, authorization: bytes | None) -> AuthResult:
        if self._anonymous:
            return AuthResult(ANONYMOUS)
        if not authorization:
            return AuthResult(None, "Missing API key: send 'Authorization: Bearer <key>'.")
        scheme, _, key = authorization.partition(b" ")
        key = key.strip()
        if scheme.lower() != b"bearer" or not key:
            return AuthResult(None, "Malformed Authorization header: expected 'Bearer <key>'.")
        tenant = self._by_hash.get(hashlib.sha256(key).hexdigest())
        if tenant is None:
            return AuthResult(None, "Incorrect API key provided.")
        return AuthResult(tenant)
