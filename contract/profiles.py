"""Speculation profiles: the named replica configurations specgate routes
between, and the one parser of their labels.

Why: the speculation method, its draft length, adaptive verification and the
drafter are fixed when vLLM starts, so the controller cannot retune a replica;
it chooses *which replica pool* a tenant goes to. A profile label names a
pool's configuration. The gateway's config, the controller's cost model, the
simulator and the vLLM image's entrypoint all parse labels here, so an
unsupported profile is rejected at start-up everywhere with the same message,
instead of one side accepting it and another modelling it as something else.

Label grammar (case-insensitive; ``none`` / ``no-spec`` are aliases of ``off``)::

    off
    ngram-k{2,4,8}          vLLM prompt lookup (method "ngram"), no drafter checkpoint
    eagle3-k{2,4,8}         EAGLE-3 drafter checkpoint (method "eagle3")
    dflash-b{4,8,16}        DFlash drafter checkpoint (method "dflash")
    dspark-b{4,8,16}[-av]   DSpark drafter checkpoint (method "dspark"); -av = adaptive verification

``kN`` / ``bN`` is ``num_speculative_tokens = N`` (``k`` for the autoregressive /
lookup methods, ``b`` for the block-parallel drafters), exposed as
``Profile.block_size`` for every method (the longest draft a replica verifies
per step; 0 = no speculation). ``-av`` exists only where vLLM 0.32/0.33
supports adaptive verification for the method: DSpark (the config field
``SpeculativeConfig.enable_adaptive_verification`` is documented "Currently
only supported for method='dspark'", and it needs the V2 model runner).

Runners: DSpark runs only on vLLM's Model Runner V2; ngram, EAGLE-3 and DFlash
run on Model Runner V1 (the runner specgate's vLLM plugin was tested with for
them). The plugin's per-request knobs ``max_draft`` / ``max_batch`` act in the
engine-core scheduler and therefore work for every method;
``min_confidence`` needs draft confidences, i.e. adaptive verification (``-av``).
"""

from __future__ import annotations

import functools

import re
from dataclasses import dataclass

from .knobs import honoured_knobs

# Methods, in label order. "off" = no speculation.
METHODS: tuple[str, ...] = ("off", "ngram", "eagle3", "dflash", "dspark")
SPECULATIVE_METHODS: tuple[str, ...] = METHODS[1:]
# Allowed draft lengths (num_speculative_tokens) per method, and the letter of the label.
SIZES: dict[str, tuple[int, ...]] = {"ngram": (2, 4, 8), "eagle3": (2, 4, 8), "dflash": (4, 8, 16), "dspark": (4, 8, 16)}
SIZE_LETTER: dict[str, str] = {"ngram": "k", "eagle3": "k", "dflash": "b", "dspark": "b"}
# Methods that load a drafter checkpoint (ngram looks up the prompt, no checkpoint).
DRAFTER_METHODS: frozenset[str] = frozenset({"eagle3", "dflash", "dspark"})
# Methods with vLLM adaptive verification (the "-av" suffix) in vLLM 0.32/0.33.
ADAPTIVE_METHODS: frozenset[str] = frozenset({"dspark"})
# Methods whose requests honour the plugin's per-request max_draft / max_batch
# (drafters.vllm_ext: cut in the engine-core scheduler, which every method goes through).
KNOB_METHODS: frozenset[str] = frozenset(SPECULATIVE_METHODS)
# vLLM model runner per method ("v2" = Model Runner V2, VLLM_USE_V2_MODEL_RUNNER=1).
MODEL_RUNNER: dict[str, str] = {"ngram": "v1", "eagle3": "v1", "dflash": "v1", "dspark": "v2"}

BLOCK_SIZES: tuple[int, ...] = SIZES["dspark"]  # DSpark's block sizes (the original label set)
ADAPTIVE_SUFFIX = "-av"


def _labels_of(method: str) -> tuple[str, ...]:
    if method == "off":
        return ("off",)
    suffixes = ("", ADAPTIVE_SUFFIX) if method in ADAPTIVE_METHODS else ("",)
    return tuple(f"{method}-{SIZE_LETTER[method]}{n}{s}" for n in SIZES[method] for s in suffixes)


PROFILE_LABELS: tuple[str, ...] = tuple(label for m in METHODS for label in _labels_of(m))
# The grammar in words, for messages and help: "off, ngram-k{2,4,8}, ..., dspark-b{4,8,16}[-av]".
LABEL_PATTERNS: str = ", ".join(
    ["off"]
    + [
        f"{m}-{SIZE_LETTER[m]}{{{','.join(map(str, SIZES[m]))}}}" + (f"[{ADAPTIVE_SUFFIX}]" if m in ADAPTIVE_METHODS else "")
        for m in SPECULATIVE_METHODS
    ]
)
_LABEL_RE = re.compile(r"^([a-z][a-z0-9]*)-([a-z])(\d+)(-av)?$")


def supports_knobs(method: str) -> bool:
    """Whether requests on a replica of ``method`` honour the plugin's per-request
    ``max_draft`` / ``max_batch`` (every speculative method: the cut is in the scheduler)."""
    return method in KNOB_METHODS


def supports_adaptive_verification(method: str) -> bool:
    """Whether vLLM 0.32/0.33 offers adaptive verification (``-av``) for ``method``."""
    return method in ADAPTIVE_METHODS


@dataclass(frozen=True)
class Profile:
    """A replica's speculation configuration.

    ``method`` may be left out for DSpark/off (back-compatible constructor):
    ``Profile(block_size=8)`` is ``dspark-b8``, ``Profile()`` is ``off``."""

    block_size: int = 0  # num_speculative_tokens: the longest draft verified per step; 0 = no speculation
    adaptive: bool = False
    method: str = ""  # one of METHODS; "" = "dspark" if block_size else "off"

    def __post_init__(self) -> None:
        method = self.method or ("dspark" if self.block_size > 0 else "off")
        if method not in METHODS:
            raise ValueError(f"unknown speculation method {method!r}; expected one of {', '.join(METHODS)}")
        if (method == "off") != (self.block_size <= 0):
            raise ValueError(f"method {method!r} with block_size {self.block_size}: "
                             "'off' has no draft tokens, every other method drafts at least one")
        if self.adaptive and method not in ADAPTIVE_METHODS:
            raise ValueError(f"adaptive verification is not available for method {method!r} "
                             f"(only {', '.join(sorted(ADAPTIVE_METHODS))})")
        object.__setattr__(self, "method", method)

    @property
    def speculative(self) -> bool:
        return self.method != "off"

    @property
    def num_speculative_tokens(self) -> int:
        return self.block_size

    @property
    def needs_drafter(self) -> bool:
        """Whether vLLM needs a drafter checkpoint (``model`` in the speculative config)."""
        return self.method in DRAFTER_METHODS

    @property
    def model_runner(self) -> str | None:
        """vLLM model runner the profile runs on ("v1" / "v2"); None for off (vLLM's choice)."""
        return MODEL_RUNNER.get(self.method)

    @property
    def supports_knobs(self) -> bool:
        """Per-request ``max_draft`` / ``max_batch`` are honoured (any speculative method)."""
        return supports_knobs(self.method)

    @property
    def supports_adaptive_verification(self) -> bool:
        """The method offers ``-av`` (this profile may or may not use it: see ``adaptive``)."""
        return supports_adaptive_verification(self.method)

    @property
    def knobs(self) -> tuple[str, ...]:
        """The plugin's knobs a replica of this profile honours (what it advertises in
        ``specgate_ext_info``): ``max_draft,max_batch,schedule`` when it speculates, plus
        ``min_confidence`` under adaptive verification (the only path with confidences)."""
        return honoured_knobs(self.supports_knobs, self.adaptive)

    @property
    def label(self) -> str:
        if not self.speculative:
            return "off"
        return f"{self.method}-{SIZE_LETTER[self.method]}{self.block_size}" + (ADAPTIVE_SUFFIX if self.adaptive else "")

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.label


OFF = Profile()


def _reject(label: object, hint: str = "") -> ValueError:
    return ValueError(f"unknown speculation profile {label!r}; expected one of {LABEL_PATTERNS}" + (f" ({hint})" if hint else ""))


def parse_profile(label: str) -> Profile:
    """Parse a profile label; raises ValueError naming the accepted labels."""
    if not isinstance(label, str):
        raise _reject(label)
    return _parse_label(label)


@functools.lru_cache(maxsize=1024)
def _parse_label(label: str) -> Profile:
    """`parse_profile` of a string, memoised: the controller prices every
    candidate of every tenant on every replica through a profile's method
    (~200,000 parses a tick with two replicas and two tenants: 45 % of the
    decision's time), and a fleet has a handful of labels. `Profile` is
    frozen, so the shared instances cannot be changed by a caller; a bad
    label is not cached and raises every time."""
    text = label.strip().lower()
    if text in ("off", "none", "no-spec"):
        return OFF
    method = text.split("-", 1)[0]
    if method not in SPECULATIVE_METHODS:
        raise _reject(label)
    hint = f"{method} labels: {', '.join(_labels_of(method))}"
    m = _LABEL_RE.match(text)
    if not m or m.group(1) != method or m.group(2) != SIZE_LETTER[method]:
        raise _reject(label, hint)
    size, adaptive = int(m.group(3)), bool(m.group(4))
    if adaptive and method not in ADAPTIVE_METHODS:
        raise _reject(label, f"-av (adaptive verification) is available only for "
                             f"{', '.join(sorted(ADAPTIVE_METHODS))} in vLLM 0.32/0.33; {hint}")
    if size not in SIZES[method]:
        raise _reject(label, hint)
    return Profile(block_size=size, adaptive=adaptive, method=method)


def is_profile_label(label: str) -> bool:
    try:
        parse_profile(label)
    except ValueError:
        return False
    return True


def all_profiles() -> list[Profile]:
    return [parse_profile(label) for label in PROFILE_LABELS]


def profiles_of(method: str) -> list[Profile]:
    """Every profile of one method (``off`` -> [OFF])."""
    if method not in METHODS:
        raise ValueError(f"unknown speculation method {method!r}; expected one of {', '.join(METHODS)}")
    return [parse_profile(label) for label in _labels_of(method)]
