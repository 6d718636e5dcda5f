"""Fixtures for drafters tests: DSpark configs written by the real `speculators` package."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Runs inside .venv-vllm (speculators 0.9 + transformers): builds configs with speculators'
# own config classes and writes them with save_pretrained, exactly as training would.
_GEN = r'''
import json, sys
from pathlib import Path
from transformers.models.qwen3.modeling_qwen3 import Qwen3Config
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig
from speculators.models.dspark.config import DSparkSpeculatorConfig

out = Path(sys.argv[1])
TARGETS = {"Qwen/Qwen3-8B": (4096, 12288, 32, [2, 18, 33]), "Qwen/Qwen3-14B": (5120, 17408, 40, [2, 20, 37])}

def make(name, verifier="Qwen/Qwen3-8B", block=8, **kw):
    hidden, ffn, heads, aux = TARGETS[verifier]
    layer = Qwen3Config(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=5, num_attention_heads=heads,
                        num_key_value_heads=8, head_dim=128, vocab_size=151936)
    anchor = kw.pop("sample_from_anchor", True)
    cfg = DSparkSpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=151936, block_size=block, aux_hidden_state_layer_ids=aux,
        mask_token_id=151669, sample_from_anchor=anchor,
        speculators_config=SpeculatorsConfig(
            algorithm="dspark", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=block if anchor else block - 1)],
            verifier=VerifierConfig(name_or_path=verifier, architectures=["Qwen3ForCausalLM"])),
        **kw)
    cfg.save_pretrained(str(out / name))

make("good-8b-b8")
make("good-8b-b16", block=16)
make("good-14b-b8", verifier="Qwen/Qwen3-14B")
make("gated-8b", markov_head_type="gated")
make("rnn-8b", markov_head_type="rnn")
make("no-markov-8b", markov_rank=0, enable_confidence_head=False)
make("no-conf-8b", enable_confidence_head=False)
print(json.dumps(sorted(p.name for p in out.iterdir())))
'''


def _vllm_python() -> Path:
    venv = Path(os.environ.get("SPECGATE_VLLM_VENV") or REPO / ".venv-vllm")
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def speculators_checkpoints(tmp_path_factory) -> Path:
    """Directory of DSpark checkpoints (config.json only) produced by speculators 0.9 in .venv-vllm."""
    py = _vllm_python()
    if not py.exists():
        pytest.skip(f"{py} missing: run scripts/setup_vllm_env.sh (installs speculators) to test real configs")
    out = tmp_path_factory.mktemp("speculators-ckpts")
    proc = subprocess.run([str(py), "-c", _GEN, str(out)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "No module named 'speculators'" in proc.stderr:
        pytest.skip(f"speculators is not installed in {py} (scripts/setup_vllm_env.sh installs it)")
    if proc.returncode != 0:
        raise RuntimeError(f"speculators config generation failed:\n{proc.stderr[-2000:]}")
    names = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "good-8b-b8" in names, names
    return out



@pytest.fixture
def sim_server():
    """Factory: start a sim replica app under a real uvicorn server on a free loopback port.

    Usage: ``async with sim_server(SimReplicaSettings(...)) as (base_url, sim): ...``
    """
    import asyncio
    import contextlib

    import uvicorn

    from drafters.sim.server import create_app
    from testbed.procs import free_port

    @contextlib.asynccontextmanager
    async def start(settings):
        app = create_app(settings)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                               access_log=False, lifespan="on"))
        task = asyncio.create_task(server.serve())
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.02)
        assert server.started, "sim replica did not start"
        try:
            yield f"http://127.0.0.1:{port}", app.state.sim
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)

    return start
