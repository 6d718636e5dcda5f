"""Read the plugin's drafter call counters from a vLLM server log (test helper).

A server started with `SPECGATE_VLLM_EXT_DEBUG_DRAFTER=1` (drafters/vllm_ext/
draft_skip.py) logs, after every real propose call of its DFlash/DSpark
drafter, one line with the CUMULATIVE number of real `forward` calls of the
draft nn.Module (the query pass) and of `precompute_and_store_context_kv` (the
context pass):

    specgate-debug drafter: runner=v2 k=0 skipped=1 forwards=12 context_passes=40 proposes=38

`window(server, fn)` runs fn and returns the per-step deltas of the lines the
server logged meanwhile (one `Step` per propose call, i.e. per engine step).
The tests send one request (or one concurrent group) at a time, so every step
in a window belongs to it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

ENV = {"SPECGATE_VLLM_EXT_DEBUG_DRAFTER": "1"}
LINE = re.compile(
    r"specgate-debug drafter: runner=(?P<runner>\w+) k=(?P<k>\S+) skipped=(?P<skipped>\d) "
    r"forwards=(?P<forwards>\d+) context_passes=(?P<context>\d+) proposes=(?P<proposes>\d+)"
)


@dataclass(frozen=True)
class Step:
    runner: str
    k: int | None
    skipped: bool
    forwards: int  # drafter forward calls in this step
    context_passes: int  # context K/V passes in this step


def _lines(text: str) -> list[re.Match]:
    return list(LINE.finditer(text))


def _read(server) -> str:
    return server.log_path.read_text(errors="replace")


def _settled(server, timeout_s: float = 10.0) -> str:
    """The log once no new counter line arrived for 0.5 s (the last step's line
    is written before the response leaves the engine; this only absorbs
    buffering)."""
    deadline = time.monotonic() + timeout_s
    text = _read(server)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        again = _read(server)
        if len(_lines(again)) == len(_lines(text)):
            return again
        text = again
    return text


def window(server, fn: Callable[[], Any]) -> tuple[Any, list[Step]]:
    before = _lines(_settled(server))
    result = fn()
    after = _lines(_settled(server))
    assert len(after) >= len(before), "server log shrank"
    prev = before[-1] if before else None
    steps = []
    for m in after[len(before) :]:
        p_fwd = int(prev["forwards"]) if prev else 0
        p_ctx = int(prev["context"]) if prev else 0
        steps.append(
            Step(
                runner=m["runner"],
                k=None if m["k"] == "None" else int(m["k"]),
                skipped=m["skipped"] == "1",
                forwards=int(m["forwards"]) - p_fwd,
                context_passes=int(m["context"]) - p_ctx,
            )
        )
        prev = m
    return result, steps


def assert_k0_steps_skip_the_drafter(steps: list[Step]) -> None:
    """Per step: K=0 -> no drafter forward, one context pass; K>0 -> at least one forward."""
    assert steps, "no drafter counter lines: is SPECGATE_VLLM_EXT_DEBUG_DRAFTER=1 set on the server?"
    for step in steps:
        if step.k == 0:
            assert step.skipped and step.forwards == 0 and step.context_passes == 1, step
        else:
            assert not step.skipped and step.forwards >= 1 and step.context_passes == 1, step
