"""What fixes a DSpark drafter's shape: the one description that vLLM's
config, the capture replica, training (`drafters.training`) and the cost
model (`drafters.costmodel`) agree on.

Why one: the cost model prices a drafter by its decoder layers, its feature
(auxiliary) layers and its Markov head; training builds one from the same
numbers. Two classes with different field names for them (`n_layers` /
`draft_layers`, `aux_layers` / the feature layer ids) could describe two
different drafters under one name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DrafterSpec:
    """A DSpark drafter built on a target (speculators layout)."""

    block_size: int
    markov_rank: int
    target_layer_ids: tuple[int, ...]  # the target's layers whose hidden states it reads (drafters.training.layers)
    mask_token_id: int
    draft_layers: int = 1  # its own decoder layers
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True

    @property
    def aux_layers(self) -> int:
        """How many target layers feed it (the width of its input projection)."""
        return len(self.target_layer_ids)

    def to_json(self) -> dict:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        return d
