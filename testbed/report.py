"""What the benches and `specgate load` print alike: a speculation policy's knobs, and
plain-text tables.

Why here: the real-engine sweep's per-window policy column and `specgate load`'s
decision lines name the same knobs; written twice they drifted (one dropped the
confidence floor, the two ordered the knobs differently).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# (policy field, long name, short form) in the one order both spellings use.
_KNOBS = (
    ("max_draft", "max_draft={}", "k<={}"),
    ("min_confidence", "min_conf={:.2f}", "conf>={:.2f}"),
    ("max_batch", "max_batch={}", "B<={}"),
    ("schedule", "schedule={}", "S={}"),
    ("preferred_profile", "profile={}", "->{}"),
)


def _value(key: str, value: Any) -> Any:
    """A schedule [[max_batch, max_draft], ...] as "4:16/32:8" (draft 16 up to batch 4, 8 up to 32)."""
    if key == "schedule":
        return "/".join(f"{b}:{k}" for b, k in value)
    return value


def speculating(policy: Mapping[str, Any]) -> bool:
    """Enabled, and not capped at zero drafts."""
    return bool(policy.get("enabled", True)) and policy.get("max_draft") != 0


def policy_knobs(policy: Mapping[str, Any], short: bool = False) -> list[str]:
    """The knobs a speculating policy sets, e.g. ["max_draft=2", "max_batch=4"] or, short,
    ["k<=2", "B<=4"] (a schedule: "schedule=4:8/32:2", short "S=4:8/32:2"); none for a
    policy that does not speculate."""
    if not speculating(policy):
        return []
    return [(s if short else long).format(_value(key, policy[key])) for key, long, s in _KNOBS
            if policy.get(key) not in (None, "")]


def probe_label(policy: Mapping[str, Any]) -> str | None:
    """A probe as "probe 5% S=6:8" (a share of requests under that schedule), or None."""
    probe = policy.get("probe")
    if not probe:
        return None
    return f"probe {probe['share']:.0%} S={_value('schedule', probe['schedule'])}"


def policy_label(policy: Mapping[str, Any] | None) -> str:
    """Short: "off", "on", "on k<=2 B<=4", "off + probe 5% S=6:8", "?" for no policy."""
    if not policy:
        return "?"
    label = " ".join(["on", *policy_knobs(policy, short=True)]) if speculating(policy) else "off"
    probe = probe_label(policy)
    return label if probe is None else f"{label} + {probe}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns under a rule, two spaces apart."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])
