"""Speculation profiles: the named replica configurations specgate routes
between, and the one parser of their labels.

Why: block size, adaptive verification and the drafter are fixed when vLLM
starts, so the controller cannot retune a replica; it chooses *which replica
pool* a tenant goes to. A profile label names a pool's configuration. The
gateway's config, the controller's cost model, the simulator and the vLLM
image's entrypoint all parse labels here, so an unsupported profile is
rejected at start-up everywhere with the same message, instead of one side
accepting it and another modelling it as something else.

Labels: ``off``, ``dspark-b4``, ``dspark-b8``, ``dspark-b16``, each DSpark one
optionally suffixed ``-av`` (vLLM adaptive verification), e.g. ``dspark-b8-av``.
A ``dspark-bN`` profile runs ``num_speculative_tokens = N``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BLOCK_SIZES: tuple[int, ...] = (4, 8, 16)
ADAPTIVE_SUFFIX = "-av"
PROFILE_LABELS: tuple[str, ...] = ("off",) + tuple(
    f"dspark-b{b}{suffix}" for b in BLOCK_SIZES for suffix in ("", ADAPTIVE_SUFFIX)
)
_LABEL_RE = re.compile(r"^dspark-b(\d+)(-av)?$")


@dataclass(frozen=True)
class Profile:
    """A replica's speculation configuration."""

    block_size: int = 0  # 0 = no speculation
    adaptive: bool = False

    @property
    def speculative(self) -> bool:
        return self.block_size > 0

    @property
    def num_speculative_tokens(self) -> int:
        return self.block_size

    @property
    def label(self) -> str:
        if not self.speculative:
            return "off"
        return f"dspark-b{self.block_size}" + (ADAPTIVE_SUFFIX if self.adaptive else "")

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.label


OFF = Profile()


def parse_profile(label: str) -> Profile:
    """Parse a profile label; raises ValueError naming the accepted labels."""
    text = (label or "").strip().lower() if isinstance(label, str) else ""
    if text in ("off", "none", "no-spec"):
        return OFF
    m = _LABEL_RE.match(text)
    if not m or int(m.group(1)) not in BLOCK_SIZES:
        raise ValueError(f"unknown speculation profile {label!r}; expected one of {', '.join(PROFILE_LABELS)}")
    return Profile(block_size=int(m.group(1)), adaptive=bool(m.group(2)))


def is_profile_label(label: str) -> bool:
    try:
        parse_profile(label)
    except ValueError:
        return False
    return True


def all_profiles() -> list[Profile]:
    return [parse_profile(label) for label in PROFILE_LABELS]
