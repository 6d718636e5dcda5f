"""Gateway configuration: `SPECGATE_*` environment variables plus an optional
YAML file (`SPECGATE_CONFIG=path` or `specgate gateway --config path`).

Precedence (highest first): explicit keyword arguments, environment variables,
the YAML file, defaults. Invalid configuration fails at start-up with
`ConfigError`, whose message names every offending field by its dotted path
(`tenants.1.requests_per_minute: ...`), because a gateway that starts with a
half-understood config silently misroutes or unlimits tenants.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .speculation_policy import SpeculationPolicy


class ConfigError(ValueError):
    """Start-up configuration is invalid; the message names the fields."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaConfig(_Strict):
    """One vLLM replica. `model` None = learn the served model(s) from its /v1/models."""

    url: str
    name: str | None = None
    model: str | None = None
    profile: str | None = Field(
        default=None, description="speculation profile label: off, dspark-b4, dspark-b8, dspark-b16 (+ '-av')"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000")
        return value.rstrip("/")

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str | None) -> str | None:
        if value is None:
            return None
        base = value[:-3] if value.endswith("-av") else value
        if base != "off" and not (base.startswith("dspark-b") and base[8:].isdigit()):
            raise ValueError("must be 'off' or 'dspark-b<N>' optionally suffixed '-av' (e.g. dspark-b8-av)")
        return value

    @model_validator(mode="after")
    def _default_name(self) -> "ReplicaConfig":
        if not self.name:
            parts = urlsplit(self.url)
            self.name = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        return self


class TenantConfig(_Strict):
    """A tenant. Only the SHA-256 of its API key is stored (`specgate hash-key` prints it)."""

    id: str = Field(min_length=1)
    api_key_sha256: str
    requests_per_minute: int = Field(default=0, ge=0, description="0 = unlimited")
    tokens_per_minute: int = Field(default=0, ge=0, description="prompt + completion tokens; 0 = unlimited")
    tpot_target_ms: float | None = Field(default=None, gt=0)
    speculation: SpeculationPolicy | None = Field(
        default=None, description="config default speculation policy (the controller's policy overrides it)"
    )

    @field_validator("api_key_sha256")
    @classmethod
    def _hash(cls, value: str) -> str:
        value = value.strip().lower()
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError("must be the 64-hex-digit SHA-256 of the API key, not the key itself")
        return value


class TracingConfig(_Strict):
    enabled: bool = False
    exporter: Literal["none", "console", "otlp"] = "none"
    otlp_endpoint: str | None = None
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0, description="share of new traces recorded (parent decision wins)")
    service_name: str = "specgate-gateway"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPECGATE_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    replicas: list[ReplicaConfig] = Field(default_factory=list)
    tenants: list[TenantConfig] = Field(default_factory=list)
    admin_key: str | None = Field(default=None, description="bearer key for /admin; None disables admin writes")
    redis_url: str | None = Field(default=None, description="None -> embedded in-memory store")
    redis_prefix: str = "specgate:"
    allow_anonymous: bool = Field(
        default=True,
        description="with NO tenants configured, serve every caller as tenant 'anonymous' (like vLLM without --api-key); "
        "ignored as soon as one tenant is configured",
    )

    # Timeouts (seconds).
    connect_timeout_s: float = Field(default=2.0, gt=0)
    first_byte_timeout_s: float = Field(default=300.0, gt=0, description="until upstream response headers")
    read_timeout_s: float = Field(default=300.0, gt=0, description="max gap between upstream body chunks")
    total_timeout_s: float = Field(default=900.0, gt=0)

    # Resilience.
    max_attempts: int = Field(default=3, ge=1, le=10, description="attempts across replicas before the first byte")
    retry_backoff_base_s: float = Field(default=0.05, ge=0)
    retry_backoff_max_s: float = Field(default=1.0, ge=0)
    breaker_failures: int = Field(default=5, ge=1, description="consecutive failures that open a replica's breaker")
    breaker_open_s: float = Field(default=30.0, gt=0)

    # Health and load.
    health_interval_s: float = Field(default=2.0, gt=0)
    health_timeout_s: float = Field(default=2.0, gt=0)
    health_fail_threshold: int = Field(default=3, ge=1)
    health_success_threshold: int = Field(default=2, ge=1)
    metrics_interval_s: float = Field(default=1.0, gt=0)
    policy_poll_s: float = Field(default=1.0, gt=0)

    # Routing.
    routing: Literal["least_load", "prefix_affinity", "session_affinity"] = "least_load"
    session_header: str = "x-session-id"
    prefix_chars: int = Field(default=256, ge=16)

    # Admission.
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    default_max_tokens: int = Field(default=256, ge=1, description="completion estimate when max_tokens is absent")
    budget_window_s: int = Field(default=60, ge=1)
    budget_lease_fraction: float = Field(
        default=0.01,
        ge=0,
        le=0.25,
        description="largest share of a tenant's per-minute limits one instance may pre-reserve in Redis and admit from "
        "locally (0 = a Redis round trip for every request); tenants whose limits are too small to lease are decided per request",
    )
    budget_lease_s: float = Field(default=1.0, gt=0, le=10, description="a budget lease covers about this much traffic and is returned after this long unused")

    # Observability.
    metrics_top_tenants: int = Field(default=20, ge=1)
    telemetry_flush_s: float = Field(default=0.5, gt=0, description="how often per-request telemetry is flushed to the store")
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    log_level: str = "INFO"
    access_log: bool = Field(default=False, description="one JSON line per request (never keys or prompts)")

    # Upstream HTTP client.
    upstream_pool_size: int = Field(default=256, ge=1)
    upstream_client: Literal["aiohttp", "httpx"] = "aiohttp"

    @model_validator(mode="after")
    def _unique(self) -> "Settings":
        names = [r.name for r in self.replicas]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"replica names must be unique, duplicated: {sorted(dup)}")
        ids = [t.id for t in self.tenants]
        if len(set(ids)) != len(ids):
            raise ValueError("tenant ids must be unique")
        hashes = [t.api_key_sha256 for t in self.tenants]
        if len(set(hashes)) != len(hashes):
            raise ValueError("two tenants share one api_key_sha256")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls))


class _YamlSource(PydanticBaseSettingsSource):
    """Reads the YAML named by SPECGATE_CONFIG (set by `--config`)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("SPECGATE_CONFIG")
        if not path:
            return {}
        return read_yaml(path)


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping of setting names")
    return data


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown setting (check the spelling)"
        lines.append(f"  {loc}: {msg}")
    return "invalid specgate configuration:\n" + "\n".join(lines)


def load_settings(config_path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build Settings from env + YAML (+ overrides); raise ConfigError naming bad fields."""
    old = os.environ.get("SPECGATE_CONFIG")
    try:
        if config_path is not None:
            os.environ["SPECGATE_CONFIG"] = str(config_path)
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    finally:
        if config_path is not None:
            if old is None:
                os.environ.pop("SPECGATE_CONFIG", None)
            else:
                os.environ["SPECGATE_CONFIG"] = old


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()
