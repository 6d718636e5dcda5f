"""Confidence threshold under DSpark adaptive verification, on CPU tensors.

Needs torch (and, for the last group, vLLM's own adaptive-verification code),
so it runs inside .venv-vllm; in the gateway's .venv it skips. `make test` runs
it there through tests/drafters/vllm_ext/test_torch_tier.py.

Adaptive verification itself needs CUDA graphs, so it cannot run end to end on
CPU; what is tested here is (1) the pure cut/floor arithmetic, (2) vLLM's REAL
`AdaptiveVerificationManager.get_num_tokens` (the host-side budget choice)
wrapped by the plugin, fed CPU numpy/tensors, and (3) vLLM's REAL
`_assign_draft_token_budget` admission kernel given the capacities the floor
leaves -- i.e. the whole per-step decision chain except the GPU copies.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from drafters.vllm_ext.confidence import (  # noqa: E402
    apply_floor_to_batch,
    confidence_cut_lengths,
    floor_draft_counts,
)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# ---------------------------------------------------------------- pure arithmetic
def test_cut_at_first_position_whose_cumulative_confidence_falls_below_theta():
    conf = t([[0.9, 0.9, 0.9, 0.9], [0.5, 0.5, 0.5, 0.5], [1.0, 0.2, 1.0, 1.0]])
    # survival: [.9 .81 .729 .6561], [.5 .25 .125 .0625], [1 .2 .2 .2]
    cut = confidence_cut_lengths(conf, torch.tensor([0.7, 0.3, 0.2]))
    assert cut.tolist() == [3, 1, 4]
    assert cut.dtype == torch.int32


def test_theta_zero_keeps_everything_and_theta_one_keeps_only_certain_positions():
    conf = t([[1.0, 1.0, 0.99, 1.0], [0.0, 1.0, 1.0, 1.0]])
    assert confidence_cut_lengths(conf, torch.tensor([0.0, 0.0])).tolist() == [4, 4]
    assert confidence_cut_lengths(conf, torch.tensor([1.0, 1.0])).tolist() == [2, 0]


def test_cut_is_always_a_prefix_even_for_out_of_range_confidences():
    # A confidence > 1 would let survival rise again; the cut must still stop at the first miss.
    conf = t([[0.5, 3.0, 1.0, 1.0]])
    assert confidence_cut_lengths(conf, torch.tensor([0.6])).tolist() == [0]


def test_floor_never_adds_drafts_beyond_what_was_scheduled():
    conf = t([[0.9] * 4, [0.9] * 4, [0.1] * 4])
    counts = floor_draft_counts(conf, torch.tensor([2, 4, 4]), torch.tensor([0.0, 0.7, 0.5]))
    assert counts.tolist() == [2, 3, 0]


def test_shape_errors_are_reported():
    with pytest.raises(ValueError):
        confidence_cut_lengths(torch.ones(4), torch.zeros(1))
    with pytest.raises(ValueError):
        confidence_cut_lengths(torch.ones(2, 4), torch.zeros(3))


def test_apply_floor_to_batch_shortens_copies_only():
    tokens = {"a": 5, "b": 5, "c": 1}
    drafts = {"a": [-1] * 4, "b": [-1] * 4}
    new_tokens, new_drafts = apply_floor_to_batch(tokens, drafts, ["a", "b"], [1, 0])
    assert new_tokens == {"a": 2, "b": 1, "c": 1}
    assert new_drafts == {"a": [-1]}  # b is a plain decode now
    assert tokens == {"a": 5, "b": 5, "c": 1} and len(drafts["a"]) == 4  # inputs untouched


# --------------------------------------------- vLLM's real adaptive verification code
av = pytest.importorskip("vllm.v1.worker.gpu.spec_decode.adaptive_verification")


@pytest.fixture(scope="module")
def patched_manager_cls():
    from drafters.vllm_ext import adaptive_patch

    adaptive_patch.install_manager(av.AdaptiveVerificationManager)
    assert not adaptive_patch.install_manager(av.AdaptiveVerificationManager)  # idempotent
    return av.AdaptiveVerificationManager


K = 4
STALE = np.array(
    [
        [0.9, 0.9, 0.9, 0.9],  # r0: survival .9 .81 .729 .656
        [0.5, 0.5, 0.5, 0.5],  # r1: survival .5 .25 .125 .0625
        [0.95, 0.95, 0.95, 0.95],  # r2: survival .95 .9025 .857 .815
    ],
    dtype=np.float32,
)


def make_manager(cls, verify_cost_per_token: float, floors: dict[str, float]):
    """The real manager class, with only the host-side state get_num_tokens reads.

    Its constructor allocates CUDA streams/events, so the object is built without
    it; every attribute below is one the stock method uses, set as the runner would.
    """
    mgr = object.__new__(cls)
    mgr.num_speculative_steps = K
    mgr.num_bonus_tokens = 1
    mgr._max_total_logits = 10_000
    max_reqs, max_tokens = 8, 256
    mgr.req_states = SimpleNamespace(
        req_id_to_index={"r0": 0, "r1": 1, "r2": 2},
        num_computed_tokens_np=np.full(max_reqs, 100, dtype=np.int32),
        prefill_len=SimpleNamespace(np=np.full(max_reqs, 10, dtype=np.int32)),
    )
    stale = np.ones((max_reqs, K), dtype=np.float32)
    stale[:3] = STALE
    mgr._stale_confidences = [SimpleNamespace(np=stale), SimpleNamespace(np=stale)]
    mgr._stale_idx = 0
    draft_cost = np.zeros(max_reqs + 1)
    verify_cost = 1.0 + verify_cost_per_token * np.arange(max_tokens + 1)
    mgr.cost_tables = (draft_cost, verify_cost)
    mgr._batch_budget = None
    if floors:
        mgr._specgate_floors = dict(floors)
    return mgr


def batch():
    return {"r0": 1 + K, "r1": 1 + K, "r2": 1 + K}, {r: [-1] * K for r in ("r0", "r1", "r2")}


def test_without_floors_the_stock_budget_is_unchanged(patched_manager_cls):
    tokens, drafts = batch()
    stock = make_manager(patched_manager_cls, 0.0, {})
    assert stock.get_num_tokens(tokens, drafts) == 3 + 12  # cheap verification: admit all
    assert stock._batch_budget == ({"r0": 4, "r1": 4, "r2": 4}, {"r0": 1, "r1": 1, "r2": 1}, 12)


def test_floor_removes_slots_before_the_budget_is_chosen(patched_manager_cls):
    tokens, drafts = batch()
    mgr = make_manager(patched_manager_cls, 0.0, {"r0": 0.7, "r1": 0.3})
    num_tokens = mgr.get_num_tokens(tokens, drafts)
    caps, non_draft, budget = mgr._batch_budget
    assert caps == {"r0": 3, "r1": 1, "r2": 4}  # r2 has no floor
    assert non_draft == {"r0": 1, "r1": 1, "r2": 1}
    assert budget == 8 and num_tokens == 3 + 8
    assert drafts["r0"] == [-1] * K and tokens["r0"] == 1 + K  # scheduler's dicts untouched


def test_binding_budget_ranks_only_slots_above_each_floor(patched_manager_cls):
    """Expensive verification makes the stock cost model trim; the floor still holds."""
    tokens, drafts = batch()
    floors = {"r0": 0.7, "r1": 0.3}
    mgr = make_manager(patched_manager_cls, 0.35, floors)
    mgr.get_num_tokens(tokens, drafts)
    caps, _, budget = mgr._batch_budget
    assert 0 < budget < sum(caps.values())  # the budget binds
    # The GPU admission, run as the runner runs it (capacities = floored counts).
    capacities = torch.tensor([caps["r0"], caps["r1"], caps["r2"]], dtype=torch.int32)
    av._assign_draft_token_budget(
        torch.from_numpy(STALE.copy()), torch.tensor([0, 1, 2]), capacities, budget, K
    )
    admitted = capacities.tolist()
    assert sum(admitted) == budget
    survival = np.cumprod(STALE.astype(np.float64), axis=1)
    for i, req in enumerate(("r0", "r1", "r2")):
        kept = survival[i, : admitted[i]]
        assert admitted[i] <= caps[req]
        assert (kept >= floors.get(req, 0.0)).all()  # nothing below a request's floor


def test_floor_of_one_disables_drafting_for_uncertain_requests(patched_manager_cls):
    tokens, drafts = batch()
    mgr = make_manager(patched_manager_cls, 0.0, {"r0": 1.0, "r1": 1.0, "r2": 1.0})
    assert mgr.get_num_tokens(tokens, drafts) == 3  # all drafts cut: plain decodes
    assert mgr._batch_budget[2] == 0
