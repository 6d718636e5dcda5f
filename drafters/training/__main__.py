"""`python -m drafters.training train|eval ...`: the torch side of
`specgate drafter train|eval` (drafters/cli.py runs this in an interpreter that
has torch and speculators; the gateway's environment has neither).

Progress goes to stderr (a tqdm bar, or one line per save when stderr is not a
terminal); the last line on stdout is one JSON object with the result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _ids(text: str | None) -> list[int] | None:
    return [int(x) for x in text.split(",") if x.strip()] if text else None


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", required=True)
    p.add_argument("--store", required=True, help="capture store: a directory or a mooncake:// spec (drafters.capture.backends.open_store)")
    p.add_argument("--target", required=True, help="target model directory (the verifier)")
    p.add_argument("--held-out", type=float, default=0.2, help="fraction of samples kept for evaluation (by key hash)")
    p.add_argument("--max-samples", type=int, default=None, help="newest training samples to load (memory bound)")
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"), help="draft attention for CPU/one-GPU runs")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m drafters.training")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train a tenant's DSpark drafter from its captured samples")
    _common(t)
    t.add_argument("--out", required=True, help="checkpoint directory (replaced atomically)")
    t.add_argument("--init-from", default=None, help="current drafter checkpoint: warm start, shape and baseline")
    t.add_argument("--profile", default=None, help="served profile (dspark-bN[-av]): block size N")
    t.add_argument("--block-size", type=int, default=None)
    t.add_argument("--markov-rank", type=int, default=None)
    t.add_argument("--target-layer-ids", default=None, help="aux ids, comma-separated (default: the current drafter's)")
    t.add_argument("--mask-token-id", type=int, default=None)
    t.add_argument("--max-minutes", type=float, default=30.0, help="wall time of this run (resume continues)")
    t.add_argument("--max-steps", type=int, default=300, help="optimizer steps in all, across resumed runs")
    t.add_argument("--max-tokens", type=int, default=2048, help="tokens per packed batch")
    t.add_argument("--max-anchors", type=int, default=512, help="anchors (blocks) per batch")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--loss", default="kl_div",
                   help="speculators loss: kl_div (its default), ce (argmax labels: greedy acceptance), tv, or JSON weights")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--save-every", type=int, default=50, help="steps between resumable state snapshots")
    t.add_argument("--state-dir", default=None, help="resume state (default: OUT.state)")
    e = sub.add_parser("eval", help="offline teacher-forced acceptance of drafters on a tenant's held-out samples")
    _common(e)
    e.add_argument("drafters", nargs="+", help="checkpoint directories")
    e.add_argument("--split", default="held-out", choices=("held-out", "train", "all"))
    e.add_argument("--out", default=None, help="write the JSON result here too")
    return ap


def _load(args, spec, num_layers):
    from drafters.capture.backends import open_store

    from .dataset import load_tenant

    store = open_store(args.store)
    data = load_tenant(store, args.tenant, spec.target_layer_ids, num_layers, held_out_fraction=args.held_out,
                       max_samples=args.max_samples)
    return data


def _baseline(args, target_config):
    """The drafter training starts from: the current checkpoint, or a fresh seeded one."""
    from .model import build, read_checkpoint_config, resolve_spec

    import torch

    if args.init_from:
        cfg = read_checkpoint_config(args.init_from)
        spec = resolve_spec(target_config, init_config=cfg)
        return spec, build(args.target, spec, attn_impl=args.attn, init_from=args.init_from), args.init_from
    torch.manual_seed(args.seed)
    spec = _train_spec(args, target_config)
    return spec, build(args.target, spec, attn_impl=args.attn), "untrained"


def _train_spec(args, target_config):
    from .model import read_checkpoint_config, resolve_spec

    init = read_checkpoint_config(args.init_from) if args.init_from else None
    return resolve_spec(target_config, init_config=init, profile=args.profile, block_size=args.block_size,
                        markov_rank=args.markov_rank, target_layer_ids=_ids(args.target_layer_ids),
                        mask_token_id=args.mask_token_id)


def cmd_train(args) -> dict:
    import torch
    from transformers import AutoConfig

    from .evaluate import evaluate
    from .layers import capture_layer_ids
    from .loop import TrainConfig, device, log, save_checkpoint, train
    from .model import build

    target_config = AutoConfig.from_pretrained(args.target)
    n_layers = int(target_config.num_hidden_layers)
    spec = _train_spec(args, target_config)
    data = _load(args, spec, n_layers)
    log(f"[train] tenant {args.tenant}: {len(data.train)} training / {len(data.held_out)} held-out samples "
        f"({sum(s.completion_tokens for s in data.train)} completion tokens), skipped {len(data.skipped)}; "
        f"device {device()}; block {spec.block_size}, markov rank {spec.markov_rank}, "
        f"aux layers {list(spec.target_layer_ids)} (capture ids {capture_layer_ids(spec.target_layer_ids, n_layers)})")
    if not data.train:
        raise SystemExit(f"error: no usable samples of tenant {args.tenant!r} in {args.store} "
                         f"(skipped: {dict(list(data.skipped.items())[:3])})")

    base_spec, base_model, base_name = _baseline(args, target_config)
    current = evaluate(base_model.to(device()), data.held_out)
    del base_model

    torch.manual_seed(args.seed)
    model = build(args.target, spec, attn_impl=args.attn, init_from=args.init_from)
    cfg = TrainConfig(lr=args.lr, max_steps=args.max_steps, max_minutes=args.max_minutes, max_tokens=args.max_tokens,
                      max_anchors=args.max_anchors, seed=args.seed, save_every=args.save_every,
                      loss_fn=args.loss)
    state_dir = Path(args.state_dir or f"{args.out.rstrip('/')}.state")
    identity = {"tenant": args.tenant, "target": str(Path(args.target).resolve()), "spec": spec.to_json(),
                "init_from": str(Path(args.init_from).resolve()) if args.init_from else None}
    bar = _progress(cfg.max_steps)
    result = train(model, spec, data.train, data.held_out, cfg, state_dir, identity=identity, progress=bar.update)
    bar.close()
    new = evaluate(model, data.held_out)
    log(f"[train] step {result.step} ({result.steps_this_run} this run, stopped by {result.stopped}, "
        f"{result.seconds:.1f}s); held-out loss {result.heldout_loss_before} -> {result.heldout_loss_after}; "
        f"offline acceptance {current.acceptance_length:.3f} ({base_name}) -> {new.acceptance_length:.3f}")
    eval_doc = {
        "tenant": args.tenant, "held_out_samples": [s.key for s in data.held_out], "method": "teacher-forced greedy",
        "new": new.to_json(), "current": {"drafter": base_name, **current.to_json()},
    }
    training_doc = {
        "tenant": args.tenant, "target": args.target, "init_from": args.init_from, "spec": spec.to_json(),
        "capture_layer_ids": capture_layer_ids(spec.target_layer_ids, n_layers),
        "train_samples": len(data.train), "held_out_samples": len(data.held_out), "skipped": data.skipped,
        "config": cfg.__dict__, "result": result.__dict__, "device": str(device()), "finished_at": time.time(),
    }
    out = save_checkpoint(model, Path(args.out), {"eval.json": eval_doc, "training.json": training_doc})
    return {"checkpoint": str(out), "block_size": spec.block_size, "step": result.step, "stopped": result.stopped,
            "heldout_loss_before": result.heldout_loss_before, "heldout_loss_after": result.heldout_loss_after,
            "acceptance_current": current.acceptance_length, "acceptance_new": new.acceptance_length,
            "acceptance_all_anchors_current": current.acceptance_all_anchors,
            "acceptance_all_anchors_new": new.acceptance_all_anchors, "state_dir": str(state_dir)}


def cmd_eval(args) -> dict:
    from transformers import AutoConfig

    from .evaluate import evaluate
    from .loop import device, log, write_json_atomic
    from .model import build, read_checkpoint_config, resolve_spec

    target_config = AutoConfig.from_pretrained(args.target)
    n_layers = int(target_config.num_hidden_layers)
    results = {}
    for path in args.drafters:
        spec = resolve_spec(target_config, init_config=read_checkpoint_config(path))
        data = _load(args, spec, n_layers)
        samples = {"held-out": data.held_out, "train": data.train, "all": data.train + data.held_out}[args.split]
        model = build(args.target, spec, attn_impl=args.attn, init_from=path).to(device())
        r = evaluate(model, samples)
        log(f"[eval] {path}: acceptance {r.acceptance_length:.3f} over {r.steps} steps of {r.samples} samples "
            f"(all anchors {r.acceptance_all_anchors:.3f})")
        results[path] = r.to_json()
    doc = {"tenant": args.tenant, "split": args.split, "method": "teacher-forced greedy", "drafters": results}
    if args.out:
        write_json_atomic(Path(args.out), doc)
    return doc


class _Lines:
    def __init__(self, total: int):
        self.total, self.last = total, time.monotonic()

    def update(self, step: int, loss: float) -> None:
        if time.monotonic() - self.last >= 5 or step == self.total:
            self.last = time.monotonic()
            print(f"[train] step {step}/{self.total} loss {loss:.4f}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _progress(total: int):
    if not sys.stderr.isatty() and os.environ.get("SPECGATE_PROGRESS") != "bar":
        return _Lines(total)
    from tqdm import tqdm

    bar = tqdm(total=total, desc="train", unit="step", file=sys.stderr)

    class _Bar:
        def update(self, step: int, loss: float) -> None:
            bar.n = step
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.refresh()

        def close(self) -> None:
            bar.close()

    return _Bar()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        doc = cmd_train(args) if args.cmd == "train" else cmd_eval(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
