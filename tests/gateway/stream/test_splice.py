"""Stream continuation end to end on fake replicas (SIMULATED vLLM, see
testbed/fake_openai.py: deterministic output ids, so a
continued stream must be the uninterrupted one token for token): the real
gateway over loopback HTTP, the real openai SDK as the client. The real-vLLM
tier is tests/gateway/test_real_vllm_continuation.py. At the end, the
rewind to a character boundary against a stub `/detokenize` (the fake's
tokens are whole words)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from contract.store.redis_store import RedisStore
from contract.telemetry import read_all
from gateway.stream.continuation import continuation_body
from gateway.stream.ledger import StreamLedger
from gateway.stream.splice import MAX_REWIND_IDS, _rewind_to_character
from testbed.fake_openai import OUTPUT_BASE, output_text

from ..conftest import KEYS, backend_requests, wait_for

AUTH = {"authorization": f"Bearer {KEYS['alpha']}"}
MSG = [{"role": "user", "content": "a b c"}]


def two(start_backend, start_gateway, die_a: int | None = 4, **gateway):
    a = start_backend(name="a")
    b = start_backend(name="b")
    gw = start_gateway([{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}], **gateway)
    a.fake.control["die_after_chunks"] = die_a  # the stream's replica dies mid-stream
    return a, b, gw


def client(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0, timeout=20)


def metric(gw, text: str) -> bool:
    return text in httpx.get(gw.url + "/metrics").text


@pytest.mark.parametrize("include_usage", [False, True])
def test_broken_chat_stream_is_continued_token_for_token(start_backend, start_gateway, include_usage):
    a, b, gw = two(start_backend, start_gateway)
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = client(gw).chat.completions.create(model="fake-model", messages=MSG, max_tokens=20, stream=True, seed=7,
                                                temperature=0.5, **extra)
    chunks = list(stream)
    assert stream.response.headers["x-specgate-replica"] == "a"
    content = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in content) == output_text(0, 20)
    assert {(c.id, c.created, c.model) for c in chunks} == {(chunks[0].id, chunks[0].created, "fake-model")}
    assert [c.choices[0].finish_reason for c in content].count("length") == 1
    assert content[-1].choices[0].finish_reason == "length"
    assert all("token_ids" not in (c.choices[0].model_extra or {}) for c in content)  # injected, stripped
    usage = [c for c in chunks if c.usage is not None]
    if include_usage:
        assert len(usage) == 1 and usage[0].choices == [] and usage[0] is chunks[-1]
        assert (usage[0].usage.prompt_tokens, usage[0].usage.completion_tokens) == (3, 20)
    else:
        assert usage == []
    # The continuation on b: a token-id prompt (prompt ids + the 3 ids a sent), the rest of max_tokens,
    # the sampling parameters kept.
    cont = backend_requests(b)[-1]
    assert cont["path"] == "/v1/completions"
    body = cont["body"]
    assert body["prompt"][-3:] == [OUTPUT_BASE + i for i in range(3)] and len(body["prompt"]) == 3 + 3
    assert (body["max_tokens"], body["seed"], body["temperature"], body["return_token_ids"]) == (17, 7, 0.5, True)
    assert metric(gw, 'specgate_continuations_total{outcome="continued"} 1.0')
    assert metric(gw, "specgate_continuation_prefill_tokens_total 6.0")


def test_broken_completions_stream_keeps_client_token_ids(start_backend, start_gateway):
    """A client that asked for token ids gets them on every chunk, continuation included."""
    a, b, gw = two(start_backend, start_gateway, die_a=5)
    chunks = list(client(gw).completions.create(model="fake-model", prompt="x y", max_tokens=12, stream=True,
                                                extra_body={"return_token_ids": True}))
    assert "".join(c.choices[0].text for c in chunks) == output_text(0, 12)
    ids = [i for c in chunks for i in c.choices[0].model_extra["token_ids"]]
    assert ids == [OUTPUT_BASE + i for i in range(12)]
    assert chunks[0].choices[0].model_extra["prompt_token_ids"]  # the original prompt's, once
    assert all(not c.choices[0].model_extra.get("prompt_token_ids") for c in chunks[1:])
    assert {c.id for c in chunks} == {chunks[0].id}


def test_continuations_are_bounded_then_the_stream_ends_with_an_error_event(start_backend, start_gateway):
    a, b, gw = two(start_backend, start_gateway, die_a=3)
    b.fake.control["die_after_chunks"] = 3  # b breaks its continuation too, and a (next) its second
    with httpx.stream("POST", gw.url + "/v1/completions", headers=AUTH, timeout=20,
                      json={"model": "fake-model", "prompt": "p", "max_tokens": 50, "stream": True}) as r:
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    assert "error" in json.loads(data[-2])
    text = "".join(json.loads(d)["choices"][0]["text"] for d in data[:-2])
    assert text == output_text(0, 9)  # 3 from a, 3 from b, 3 from a again: nothing lost or repeated
    assert metric(gw, 'specgate_continuations_total{outcome="continued"} 2.0')
    assert metric(gw, 'specgate_continuations_total{outcome="exhausted"} 1.0')


def test_max_continuations_zero_ends_the_stream_with_the_error_event(start_backend, start_gateway):
    a, b, gw = two(start_backend, start_gateway, max_continuations=0)
    with pytest.raises(openai.APIError, match="mid-stream"):
        list(client(gw).chat.completions.create(model="fake-model", messages=MSG, max_tokens=20, stream=True))
    assert not any(r["path"] == "/v1/completions" for r in backend_requests(b))


@pytest.mark.parametrize("extra", [{"n": 2}, {"logprobs": True}, {"presence_penalty": 0.5},
                                   {"response_format": {"type": "json_object"}},
                                   {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}])
def test_a_request_that_cannot_be_continued_exactly_ends_with_the_error_event(start_backend, start_gateway, extra):
    a, b, gw = two(start_backend, start_gateway)
    with httpx.stream("POST", gw.url + "/v1/chat/completions", headers=AUTH, timeout=20,
                      json={"model": "fake-model", "messages": MSG, "max_tokens": 20, "stream": True, **extra}) as r:
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and "mid-stream" in json.loads(data[-2])["error"]["message"]
    assert "return_token_ids" not in backend_requests(a)[-1]["body"]  # not asked for: nothing to continue from
    assert not any(r["path"] == "/v1/completions" for r in backend_requests(b))
    assert metric(gw, 'specgate_continuations_total{outcome="unsupported"} 1.0')


def test_client_leaving_during_a_continuation_cancels_it_upstream(start_backend, start_gateway):
    a, b, gw = two(start_backend, start_gateway)
    b.fake.control["chunk_delay_s"] = 0.2  # a slow continuation
    with httpx.stream("POST", gw.url + "/v1/completions", headers=AUTH, timeout=20,
                      json={"model": "fake-model", "prompt": "p", "max_tokens": 200, "stream": True}) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n >= 12:  # past the splice: b is streaming
                break
    wait_for(lambda: b.fake.stats["cancelled"] == 1, timeout=10)
    assert b.fake.stats["completed"] == 0


def test_no_other_replica_ends_the_stream_with_the_error_event(start_backend, start_gateway):
    a = start_backend(name="a")
    gw = start_gateway([{"url": a.url, "name": "a"}])
    a.fake.control.update(die_after_chunks=3, chunk_delay_s=0.1)
    data = []
    with httpx.stream("POST", gw.url + "/v1/completions", headers=AUTH, timeout=20,
                      json={"model": "fake-model", "prompt": "p", "max_tokens": 20, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                data.append(line[6:])
                # As the health checker marks a dead replica: nowhere left to continue.
                gw.state.registry.get("a").healthy = False
    assert data[-1] == "[DONE]" and "error" in json.loads(data[-2])
    assert metric(gw, 'specgate_continuations_total{outcome="failed"} 1.0')


async def test_a_continued_stream_is_charged_once_and_attributed_per_replica(start_backend, start_gateway, redis_url,
                                                                              redis_prefix):
    a = start_backend(name="a", spec=True)
    b = start_backend(name="b", spec=True)
    gw = start_gateway([{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}])
    a.fake.control["die_after_chunks"] = 4  # role chunk + 3 tokens
    c = openai.AsyncOpenAI(base_url=gw.v1(), api_key=KEYS["beta"], max_retries=0, timeout=20)
    stream = await c.chat.completions.create(model="fake-model", messages=MSG, max_tokens=10, stream=True)
    text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
    await c.close()
    assert text == output_text(0, 10)
    store = RedisStore(redis_url, prefix=redis_prefix)
    try:
        async def rows():
            got = {r.replica: r for r in await read_all(store) if r.tenant == "beta"}
            return got if {"a", "b"} <= set(got) else None

        got = None
        deadline = time.monotonic() + 10
        while got is None and time.monotonic() < deadline:
            got = await rows()
            await asyncio.sleep(0.05)
        assert got is not None, "per-replica telemetry of the continued stream never reached the store"
        # a: the original prompt (3 tokens, once) and the 3 tokens it produced; b: the other 7 and their speculation.
        assert (got["a"].get("prompt_tokens"), got["a"].get("completion_tokens")) == (3, 3)
        assert (got["b"].get("prompt_tokens"), got["b"].get("completion_tokens")) == (0, 7)
        assert not got["a"].get("spec_requests") and got["b"].get("spec_requests") == 1
    finally:
        await store.close()
    assert metric(gw, 'specgate_tokens_total{kind="prompt",tenant="beta"} 3.0')
    assert metric(gw, 'specgate_tokens_total{kind="completion",tenant="beta"} 10.0')


def test_an_engine_error_event_mid_stream_is_continued_not_forwarded(start_backend, start_gateway):
    a, b, gw = two(start_backend, start_gateway, die_a=None)
    a.fake.control["error_after_chunks"] = 5  # role chunk + 4 tokens, then vLLM's in-band engine error
    chunks = list(client(gw).chat.completions.create(model="fake-model", messages=MSG, max_tokens=12, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == output_text(0, 12)
    assert backend_requests(b)[-1]["body"]["prompt"][-4:] == [OUTPUT_BASE + i for i in range(4)]


def test_a_replica_silent_past_the_read_timeout_is_continued_elsewhere(start_backend, start_gateway):
    # 1.5 s, not less: the continuation's replica must not read as silent itself on a machine so
    # loaded that a live process stalls (the full suite beside other vLLM servers failed at 0.4 s).
    a, b, gw = two(start_backend, start_gateway, die_a=None, read_timeout_s=1.5)
    a.fake.control["chunk_delay_s"] = 12.0  # the first event, then silence
    started = time.monotonic()
    chunks = list(client(gw).completions.create(model="fake-model", prompt="p", max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == output_text(0, 10)
    assert time.monotonic() - started < 10  # continued, not waited out
    assert backend_requests(b)[-1]["body"]["prompt"][-1] == OUTPUT_BASE  # a sent token 0 only


class _Detokenized:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self._body = status, body

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _bytes_replica(calls: list[list[int]], status: int = 200):
    """`/detokenize` of a byte-level vocabulary: id i is byte i, decoded as vLLM does (U+FFFD for what makes no character)."""
    async def post(url, body, headers, timeout):
        ids = json.loads(body)["tokens"]
        calls.append(ids)
        return _Detokenized(status, json.dumps({"prompt": bytes(ids).decode("utf-8", "replace")}).encode())
    return post


async def test_a_continuation_starts_after_the_last_whole_character_the_client_has_ids_of():
    euro = list("€".encode())  # three bytes, three ids
    led = StreamLedger()
    led.prompt_ids = [65]
    led.start_part("a")
    led.took([ord("h"), ord("i"), *euro[:2]], "hi")  # the client got "hi" and two of the euro sign's bytes
    calls = []
    assert await _rewind_to_character(_bytes_replica(calls), "u", "m", led, 1.0) == "hi"
    assert led.sent_ids == [ord("h"), ord("i")] and led.replay == euro[:2]
    assert [len(c) for c in calls] == [4, 3, 2]  # longest prefix first: a partial character is a few ids
    body = continuation_body({"model": "m", "prompt": "A", "max_tokens": 10}, "completions", led, None)
    assert body["prompt"] == [65, ord("h"), ord("i")] and body["max_tokens"] == 8


async def test_sent_ids_that_make_no_character_at_all_are_all_generated_again():
    led = StreamLedger()
    led.prompt_ids = [65]
    led.took([0xE2, 0x82], "")
    assert await _rewind_to_character(_bytes_replica([]), "u", "m", led, 1.0) == ""
    assert led.sent_ids == [] and led.replay == [0xE2, 0x82]


async def test_whole_characters_are_not_rewound_and_a_failed_detokenize_is_no_answer():
    led = StreamLedger()
    led.prompt_ids = [65]
    led.took(list("é!".encode()), "é!")
    calls = []
    assert await _rewind_to_character(_bytes_replica(calls), "u", "m", led, 1.0) == "é!"
    assert len(calls) == 1 and led.replay == [] and len(led.sent_ids) == 3
    assert await _rewind_to_character(_bytes_replica([], status=500), "u", "m", led, 1.0) is None


async def test_no_boundary_within_the_rewind_bound_is_no_answer():
    """Bytes that make no character for longer than a character can be: the continuation is not
    attempted (each step back costs a `/detokenize` call), and the ledger is left as it was."""
    led = StreamLedger()
    led.prompt_ids = [65]
    led.took([ord("a"), *[0x80] * (MAX_REWIND_IDS + 1)], "a")  # continuation bytes only: never a character
    calls = []
    assert await _rewind_to_character(_bytes_replica(calls), "u", "m", led, 1.0) is None
    assert len(calls) == MAX_REWIND_IDS + 1 and len(led.sent_ids) == MAX_REWIND_IDS + 2 and led.replay == []
    del led.sent_ids[-1]  # one id fewer: "a" lies within the bound, 16 ids back
    assert await _rewind_to_character(_bytes_replica([]), "u", "m", led, 1.0) == "a"
