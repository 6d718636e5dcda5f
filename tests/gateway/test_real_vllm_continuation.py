"""Stream continuation on REAL vLLM CPU servers (tiny random Qwen3, greedy):
a stream whose replica dies mid-way is continued on another replica serving
the same model, and the client (the real openai SDK, or raw SSE where the
`[DONE]` count matters) receives exactly the text of an uninterrupted run.

Replicas: the shared ngram-speculating server (the survivor: ngram
speculation is lossless under greedy decoding, see test_real_vllm.py), and
either a private server that is SIGKILLed or the shared plain server behind
a `CutProxy` (tests/support/cut_proxy.py), which makes "the client got
exactly N events, then the replica's connection died" deterministic however
fast the tiny model decodes. The gateway prefers the victim (tenant alpha's
policy routes to the `off` pool), so every stream starts there.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.gateway.conftest import KEYS, tenant
from tests.support.cut_proxy import CutProxy
from tests.vllm_support.fixtures import (  # noqa: F401  (pytest fixtures)
    plain_server_spec,
    tiny_model_dir,
    vllm_available,
    vllm_log_dir,
    vllm_ngram_server,
    vllm_plain_server,
)
from testbed.vllm_server import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CHAT = [{"role": "user", "content": "Tell me about the quick brown fox. The quick brown fox jumps over the lazy dog."}]
PROMPT = "one two three four one two three four one two"
N = 160  # completion tokens: the break comes after HOLD of them
HOLD = 12
TENANTS = [tenant("alpha", speculation={"enabled": False, "reason": "prefer the off pool"}), tenant("beta")]


def gateway_for(start_gateway, victim_url: str, survivor_url: str):
    return start_gateway([{"url": victim_url, "name": "victim", "profile": "off"}, {"url": survivor_url, "name": "ngram"}],
                         tenants=TENANTS, health_interval_s=30.0)


def sse_data(r: httpx.Response) -> list[str]:
    return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def continued(gw) -> float:
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith('specgate_continuations_total{outcome="continued"}'):
            return float(line.split()[-1])
    return 0.0


def continued_stream(gw, path: str, body: dict, cut: CutProxy) -> tuple[str, list[dict]]:
    """Stream `body` as tenant alpha through the gateway, whose first replica `cut` breaks: (the
    replica that answered first, the events before `[DONE]`), checked to be one whole stream --
    broken once, one `[DONE]`, no error event."""
    with httpx.stream("POST", gw.url + path, json=body, headers={"authorization": f"Bearer {KEYS['alpha']}"},
                      timeout=120) as r:
        replica = r.headers["x-specgate-replica"]
        data = sse_data(r)
    assert cut.holding.is_set()
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    events = [json.loads(d) for d in data[:-1]]
    assert not any("error" in e for e in events)
    return replica, events


@pytest.fixture
def cut_plain(vllm_plain_server):
    port = int(vllm_plain_server.url.rsplit(":", 1)[1])
    proxy = CutProxy(port)
    yield proxy
    proxy.close()


def test_killed_replicas_greedy_chat_stream_continues_token_for_token(start_gateway, vllm_ngram_server, vllm_plain_server,
                                                                     tiny_model_dir, vllm_log_dir):
    """The issue's proof: SIGKILL the replica mid-stream; the client's text equals the uninterrupted run's."""
    model = vllm_plain_server.model
    reference = openai.OpenAI(base_url=vllm_plain_server.base_url, api_key="none", max_retries=0).chat.completions.create(
        model=model, messages=CHAT, max_tokens=N, temperature=0, extra_body={"ignore_eos": True})
    with VllmServer(plain_server_spec(tiny_model_dir, name="victim-continued"), vllm_log_dir) as victim:
        proxy = CutProxy(victim.port)
        try:
            gw = gateway_for(start_gateway, proxy.url, vllm_ngram_server.url)
            via = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0, timeout=120)
            proxy.arm(HOLD, cut=False)  # held until the kill breaks it
            stream = via.chat.completions.create(model=model, messages=CHAT, max_tokens=N, temperature=0, stream=True,
                                                 extra_body={"ignore_eos": True})
            assert stream.response.headers["x-specgate-replica"] == "victim"
            chunks = []
            for chunk in stream:
                chunks.append(chunk)
                if len(chunks) == 1:
                    assert proxy.holding.wait(60), "the stream never reached the break point"
                    victim.kill()
        finally:
            proxy.close()
    assert not victim.alive()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert {c.id for c in chunks} == {chunks[0].id}
    assert all(c.usage is None for c in chunks)  # include_usage off: the gateway's own usage chunk stays out
    assert continued(gw) == 1


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_broken_stream_continues_exactly(start_gateway, vllm_ngram_server, vllm_plain_server, cut_plain, endpoint,
                                         include_usage):
    """Raw SSE: one [DONE], no error event, the uninterrupted text and usage."""
    model = vllm_plain_server.model
    ask = {"model": model, "max_tokens": N, "temperature": 0, "ignore_eos": True}
    ask.update({"messages": CHAT} if endpoint == "chat" else {"prompt": PROMPT})
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    reference = httpx.post(vllm_plain_server.url + path, json=ask, timeout=120).json()
    gw = gateway_for(start_gateway, cut_plain.url, vllm_ngram_server.url)
    cut_plain.arm(HOLD)
    body = {**ask, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    replica, events = continued_stream(gw, path, body, cut_plain)
    assert replica == "victim"
    choices = [e["choices"][0] for e in events if e["choices"]]
    if endpoint == "chat":
        text = "".join(c["delta"].get("content") or "" for c in choices)
        assert text == reference["choices"][0]["message"]["content"]
    else:
        text = "".join(c["text"] for c in choices)
        assert text == reference["choices"][0]["text"]
    assert not any("token_ids" in c or "prompt_token_ids" in c for c in choices)  # injected, stripped
    usage = [e for e in events if e.get("usage")]
    if include_usage:
        assert len(usage) == 1 and usage[0] is events[-1] and usage[0]["choices"] == []
        ref = reference["usage"]
        assert (usage[0]["usage"]["prompt_tokens"], usage[0]["usage"]["completion_tokens"]) == (ref["prompt_tokens"], N)
    else:
        assert usage == []
    assert continued(gw) == 1


def _generated_ids(url: str, body: dict) -> tuple[list[int], str]:
    """A direct greedy stream's generated token ids and text."""
    ids, text = [], ""
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True, "return_token_ids": True},
                      timeout=120) as r:
        for d in sse_data(r):
            if d == "[DONE]":
                break
            choice = json.loads(d)["choices"][0]
            ids += choice.get("token_ids") or []
            text += choice["text"]
    return ids, text


def _boundary_stop(url: str, body: dict) -> tuple[str, int, str]:
    """A stop string across the boundary after k generated tokens (k >= HOLD): the last two
    characters of token k's text and the first two of token k+1's, found nowhere earlier.

    Boundaries come per token from the ids (`/detokenize`), not per stream event: a loaded
    machine's vLLM merges many tokens into one event (one CI run got 60 tokens in two). Only
    tokens whose bytes are whole UTF-8 on their own qualify (the random model emits many that
    are not, and the stream holds those back until complete), so the text the client has after
    k tokens is exactly the prefix decoded from the first k ids, checked against the stream."""
    ids, full = _generated_ids(url, body)

    def decode(tokens: list[int]) -> str:
        r = httpx.post(url + "/detokenize", json={"model": body["model"], "tokens": tokens}, timeout=30)
        r.raise_for_status()
        return r.json()["prompt"]

    for k in range(HOLD, len(ids) - 1):
        left, right = decode(ids[k - 1:k]), decode(ids[k:k + 1])
        if not left or not right or "\ufffd" in left + right:
            continue
        upto = decode(ids[:k])
        if not full.startswith(upto) or not upto.endswith(left):
            continue
        candidate = left[-2:] + right[:2]
        if full.find(candidate) == len(upto) - len(left[-2:]):
            return candidate, k, full
    raise AssertionError(f"no boundary-spanning stop string in {len(ids)} tokens of {full!r}")


def test_stop_string_spanning_the_splice_still_stops(start_gateway, vllm_ngram_server, vllm_plain_server, cut_plain):
    """The stop string starts in the last token the client got before the break and ends in the
    continuation's first: vLLM never sees it whole, the gateway must stop there as vLLM would have.

    The break must fall exactly on that token boundary, but on a loaded machine vLLM may merge the
    two tokens into one event (its API server fell behind), and then the relay breaks earlier (the
    continuation then sees the stop string whole, which must be right too). So the stream is run
    until one break lands on the boundary, each run checked, at most five runs."""
    model = vllm_plain_server.model
    base = {"model": model, "prompt": PROMPT, "max_tokens": 60, "temperature": 0, "ignore_eos": True}
    stop, k, full = _boundary_stop(vllm_plain_server.url, base)
    direct = openai.OpenAI(base_url=vllm_plain_server.base_url, api_key="none", max_retries=0)
    sdk_args = {"model": model, "prompt": PROMPT, "max_tokens": 60, "temperature": 0, "extra_body": {"ignore_eos": True}}
    expected = direct.completions.create(**sdk_args, stop=[stop])
    assert expected.choices[0].finish_reason == "stop"
    assert expected.choices[0].text == full[: full.find(stop)]

    gw = gateway_for(start_gateway, cut_plain.url, vllm_ngram_server.url)
    via = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0, timeout=120)
    breaks = []
    for run in range(5):
        cut_plain.arm(k)
        chunks = list(via.completions.create(**sdk_args, stop=[stop], stream=True))
        assert cut_plain.holding.is_set()
        assert "".join(c.choices[0].text for c in chunks) == expected.choices[0].text
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert continued(gw) == run + 1
        breaks.append(cut_plain.held_tokens)
        if cut_plain.held_tokens == k:
            break
    print(f"stop {stop!r} after {k} tokens; breaks after {breaks} tokens")
    assert breaks[-1] == k, f"no break on the boundary after {k} tokens in five runs (breaks after {breaks} tokens)"


# In the prompts' text, not in the tiny model's output (checked): a continuation that saw them would stop.
PROMPT_ONLY_STOPS = ["three", "quick"]


def _decode(url: str, model: str, tokens: list[int]) -> str:
    r = httpx.post(url + "/detokenize", json={"model": model, "tokens": tokens}, timeout=30)
    r.raise_for_status()
    return r.json()["prompt"]


def _inside_a_character(url: str, model: str, ids: list[int]) -> set[int]:
    """Every k after which the first k ids end inside a character (or in bytes that make none yet): their
    text ends in U+FFFD, with some text before it (what the client has). The random model emits such byte
    tokens in runs."""
    texts = {k: _decode(url, model, ids[:k]) for k in range(1, len(ids))}
    return {k for k, text in texts.items() if text.endswith("\ufffd") and text.rstrip("\ufffd")}


def _longest_run_middle(ks: set[int]) -> int:
    runs: list[list[int]] = []
    for k in sorted(ks):
        if runs and runs[-1][-1] == k - 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    run = max(runs, key=len)
    return run[len(run) // 2]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_break_inside_a_character_continues_exactly(start_gateway, vllm_ngram_server, vllm_plain_server, cut_plain,
                                                      endpoint):
    """The break falls inside a multi-byte character: the client has the ids of a character it has no
    text of. vLLM primes a request's detokenizer with its whole prompt and cuts the prompt's text off
    only when that prompt ends on a character, so a continuation whose prompt ends there first emits
    the text of its whole prompt -- and finds stop strings in it (both shown directly first). Via the
    gateway (which continues from the last character boundary) the text is the uninterrupted run's,
    and stop strings that occur only in the prompt stop nothing. The break must land inside a
    character; a loaded machine may merge events and move it (see the stop-string test), so the stream
    is run until one does, each run checked, at most five runs."""
    model, url = vllm_plain_server.model, vllm_plain_server.url
    chat = endpoint == "chat"
    ask = {"model": model, "max_tokens": 60, "temperature": 0, "ignore_eos": True, "stop": PROMPT_ONLY_STOPS}
    ask.update({"messages": CHAT} if chat else {"prompt": PROMPT})
    path = "/v1/chat/completions" if chat else "/v1/completions"
    reference = httpx.post(url + path, json={**ask, "return_token_ids": True}, timeout=120).json()
    choice = reference["choices"][0]
    expected = choice["message"]["content"] if chat else choice["text"]
    assert choice["finish_reason"] == "length"  # the stop strings are the prompt's only
    prompt_ids = reference["prompt_token_ids"] if chat else choice["prompt_token_ids"]
    ids = choice["token_ids"]
    inside = _inside_a_character(url, model, ids)
    assert inside, f"the greedy output never ends inside a character: {expected!r}"
    k = _longest_run_middle(inside)

    # What vLLM does with the sent ids as the prompt (the cause): the whole prompt's text first, stop strings found in it.
    naive = {"model": model, "prompt": prompt_ids + ids[:k], "max_tokens": 60 - k, "temperature": 0, "ignore_eos": True}
    leaked = httpx.post(url + "/v1/completions", json=naive, timeout=120).json()["choices"][0]["text"]
    assert (CHAT[0]["content"] if chat else PROMPT) in leaked, f"vLLM no longer emits the prompt's text here: {leaked!r}"
    stopped = httpx.post(url + "/v1/completions", json={**naive, "stop": PROMPT_ONLY_STOPS}, timeout=120).json()
    assert stopped["choices"][0]["finish_reason"] == "stop"

    gw = gateway_for(start_gateway, cut_plain.url, vllm_ngram_server.url)
    breaks = []
    for run in range(5):
        cut_plain.arm(k)
        _, events = continued_stream(gw, path, {**ask, "stream": True}, cut_plain)
        choices = [e["choices"][0] for e in events if e["choices"]]
        text = "".join((c["delta"].get("content") or "") if chat else c["text"] for c in choices)
        assert text == expected
        assert choices[-1]["finish_reason"] == "length"
        assert continued(gw) == run + 1
        breaks.append(cut_plain.held_tokens)
        if cut_plain.held_tokens in inside:
            break
    print(f"{endpoint}: break inside a character after {k} tokens; breaks after {breaks} tokens")
    assert breaks[-1] in inside, f"no break inside a character in five runs (breaks after {breaks} tokens, inside: {sorted(inside)})"
