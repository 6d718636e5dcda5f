"""Per-tenant DSpark drafter training from captured hidden states (issue 16).

    layers.py    which layer ids to capture so training sees what vLLM serves (pure)
    split.py     deterministic held-out split by sample key (pure)
    dataset.py   store samples -> DSpark inputs (torch)
    model.py     build / warm-start the drafter (speculators)
    loop.py      eager training loop, resumable state, atomic checkpoint (torch)
    evaluate.py  offline teacher-forced acceptance (torch)
    __main__.py  `python -m drafters.training train|eval` (what `specgate drafter ...` runs)
    runner.py    find an interpreter with torch and stream it (no torch; the gateway CLI side)

Importing this package imports nothing heavy: torch is imported by the modules
that need it.
"""
