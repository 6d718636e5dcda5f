"""What one closed-loop worker sends: a pure function of (seed, tenant, worker number).

Why: bench/real_ab.py drives its two sides "with the same load" and judges their
ratio. Drawn from one generator shared by all workers, in the order requests
happen to finish, the two sides' prompts part after the first completion, and on
the CPU bed a greedy request's ngram acceptance -- so its speed -- is set mostly
by its prompt: one replica under one greedy and one temperature-1 client read
18-67 tok/s in consecutive 10-s windows (2026-12-06). Each worker drawing from a
generator of its own, seeded by who it is, sends the same sequence on both sides
(common random numbers), so the prompts' effect cancels in the ratio instead of
widening its interval. Workers are numbered per tenant in the order the load
creates them, which is the same on both sides (the phases set the pool sizes).

What stays random between the sides: the order in which requests share steps,
and a sampled tenant's text (the engine draws its tokens; a per-request `seed`
would fix them, at the price of per-request generators in every step that the
measured deployment does not pay).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORDS = (
    "the a gateway replica token draft verify accept reject speculation tenant budget request response stream "
    "chunk model server latency queue batch cache prefix policy controller router metric counter window limit "
    "quick brown fox jumps over lazy dog one two three four five red green blue cat bird fish tree river city road"
).split()  # noqa: SIM905


def prompt(rng: random.Random) -> str:
    """A short varied prompt; the random model's greedy continuation falls into cycles."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))


@dataclass(frozen=True)
class StreamRequest:
    prompt: str
    max_tokens: int


class WorkerStream:
    """The requests of worker `number` of `tenant` in a load seeded `seed`, in order.

    The first asks for a random length in 1..max_tokens (requests of equal length
    started together finish together, and on a lockstep engine stay in phase);
    every later one for `max_tokens`."""

    def __init__(self, seed: int, tenant: str, number: int, max_tokens: int) -> None:
        self.rng = random.Random(f"{seed}/{tenant}/{number}")  # a str seed hashes alike in every process
        self.max_tokens = max_tokens
        self.sent = 0

    def next(self) -> StreamRequest:
        length = self.rng.randint(1, self.max_tokens) if self.sent == 0 else self.max_tokens
        self.sent += 1
        return StreamRequest(prompt(self.rng), length)
