"""The training run: a tenant's samples -> a speculators-format DSpark checkpoint.

An eager loop, not speculators' `Trainer`: the Trainer moves the model to a
CUDA device (`train/trainer.py` `.to(local_rank)`), its default loss is a
Triton kernel and its default attention is flex attention, whose backward does
not run on CPU. The loop here calls the same model forward with speculators'
*eager* losses (`get_trainer_kwargs(loss_implementation="eager")`) and SDPA or
eager attention, so it runs on CPU and, unchanged, on one GPU (`cuda` when
available). On a GPU fleet, `speculators train` / `torchrun -m
speculators.train` over the same samples is the faster path (docs/drafters.md).

Bounded: `max_minutes` of wall time per run, `max_steps` in all, `max_samples`
newest training samples, `max_tokens` per packed batch (memory ~ tokens x
anchors x block). Resumable: the state directory holds the model, optimizer,
step, the data order's RNG state and the held-out loss before training; a
rerun with the same state directory continues from the saved step. The
checkpoint is written to a temporary sibling directory and renamed into place,
so a reader (vLLM, `specgate checkpoint validate`) never sees half of one.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from .dataset import Sample, batches, pack
from .model import DrafterSpec

STATE_FILE = "state.pt"
STATE_VERSION = 1


@dataclass
class TrainConfig:
    lr: float = 3e-3
    weight_decay: float = 0.0
    max_steps: int = 300
    max_minutes: float = 30.0
    max_tokens: int = 2048  # per packed batch
    max_anchors: int = 512  # per batch (all completion positions up to this)
    grad_clip: float = 1.0
    seed: int = 0
    save_every: int = 50
    loss_implementation: str = "eager"
    loss_fn: str = "kl_div"  # speculators' name or JSON weights, e.g. '{"ce": 0.5, "kl_div": 0.5}'


@dataclass
class TrainResult:
    step: int
    resumed_from: int
    steps_this_run: int
    stopped: str  # "max_steps" | "max_minutes"
    seconds: float
    heldout_loss_before: float | None
    heldout_loss_after: float | None
    train_loss_last: float | None
    history: list[dict] = field(default_factory=list)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def trainer_kwargs(model, cfg: TrainConfig, anchors: int) -> dict:
    kw, _ = model.get_trainer_kwargs(loss_fn=cfg.loss_fn, loss_implementation=cfg.loss_implementation,
                                     max_anchors=max(1, min(anchors, cfg.max_anchors)))
    return kw


def batch_loss(model, batch, cfg: TrainConfig) -> tuple[torch.Tensor, dict]:
    _, loss, metrics = model(
        hidden_states=batch.hidden_states, input_ids=batch.input_ids, loss_mask=batch.loss_mask,
        verifier_last_hidden_states=batch.verifier_last_hidden_states, document_ids=batch.document_ids,
        position_ids=batch.position_ids, **trainer_kwargs(model, cfg, batch.anchors))
    return loss, metrics


@torch.no_grad()
def heldout_loss(model, samples: Sequence[Sample], cfg: TrainConfig) -> float | None:
    """Mean loss over held-out samples, every completion anchor used (deterministic)."""
    if not samples:
        return None
    was = model.training
    model.eval()
    dev = model.fc.weight.device
    total = weight = 0.0
    try:
        for s in samples:
            b = pack([s], model.block_size).to(dev)
            if b.anchors == 0:
                continue
            kw = trainer_kwargs(model, TrainConfig(**{**cfg.__dict__, "max_anchors": b.anchors}), b.anchors)
            _, loss, _ = model(hidden_states=b.hidden_states, input_ids=b.input_ids, loss_mask=b.loss_mask,
                               verifier_last_hidden_states=b.verifier_last_hidden_states,
                               document_ids=b.document_ids, position_ids=b.position_ids, **kw)
            total += float(loss) * b.anchors
            weight += b.anchors
    finally:
        model.train(was)
    return total / weight if weight else None


def _save_state(state_dir: Path, payload: dict) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".{STATE_FILE}.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, state_dir / STATE_FILE)


def load_state(state_dir: Path) -> dict | None:
    path = state_dir / STATE_FILE
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def train(model, spec: DrafterSpec, train_samples: Sequence[Sample], held_out: Sequence[Sample], cfg: TrainConfig,
          state_dir: Path, *, identity: dict, progress: Callable | None = None) -> TrainResult:
    """Train `model` in place. `identity` (tenant, target, spec) must match a
    saved state to resume from it; a mismatch is refused (ValueError) rather
    than mixing two runs."""
    dev = device()
    model.to(dev).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    step = 0
    saved = load_state(state_dir)
    before = None
    history: list[dict] = []
    if saved is not None:
        if saved.get("version") != STATE_VERSION or saved.get("identity") != identity:
            raise ValueError(f"state in {state_dir} belongs to another run ({saved.get('identity')}); "
                             f"use another --state-dir or remove it")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        step = int(saved["step"])
        rng.setstate(saved["rng"])
        torch.set_rng_state(saved["torch_rng"])
        before = saved.get("heldout_loss_before")
        history = list(saved.get("history", []))
    resumed_from = step
    if saved is None:
        before = heldout_loss(model, held_out, cfg)

    def snapshot() -> None:
        _save_state(state_dir, {
            "version": STATE_VERSION, "identity": identity, "model": model.state_dict(),
            "optimizer": opt.state_dict(), "step": step, "rng": rng.getstate(), "torch_rng": torch.get_rng_state(),
            "heldout_loss_before": before, "history": history,
        })

    groups = batches(train_samples, cfg.max_tokens)
    if not groups:
        raise ValueError("no training samples with a completion")
    packed = [pack(g, model.block_size) for g in groups]
    t0 = time.monotonic()
    deadline = t0 + cfg.max_minutes * 60.0
    stopped = "max_steps"
    last = None
    order: list[int] = []
    while step < cfg.max_steps:
        if time.monotonic() >= deadline:
            stopped = "max_minutes"
            break
        if not order:
            order = list(range(len(packed)))
            rng.shuffle(order)
        b = packed[order.pop()].to(dev)
        loss, _ = batch_loss(model, b, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step += 1
        last = float(loss.detach())
        if not math.isfinite(last):
            raise FloatingPointError(f"training loss became {last} at step {step}")
        if progress:
            progress(step, last)
        if step % max(1, cfg.save_every) == 0:
            history.append({"step": step, "train_loss": round(last, 6)})
            snapshot()
    snapshot()
    after = heldout_loss(model, held_out, cfg)
    return TrainResult(step=step, resumed_from=resumed_from, steps_this_run=step - resumed_from, stopped=stopped,
                       seconds=round(time.monotonic() - t0, 3), heldout_loss_before=before,
                       heldout_loss_after=after, train_loss_last=last, history=history)


def save_checkpoint(model, out_dir: Path, extra: dict[str, dict]) -> Path:
    """`save_pretrained` into a temporary sibling, extra JSON files beside it,
    then rename over `out_dir` (the previous checkpoint is replaced whole)."""
    out_dir = Path(out_dir)
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    try:
        model.to("cpu").save_pretrained(str(tmp))
        for name, data in extra.items():
            (tmp / name).write_text(json.dumps(data, indent=2) + "\n")
        old = None
        if out_dir.exists():
            old = parent / f".{out_dir.name}.old-{os.getpid()}"
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
