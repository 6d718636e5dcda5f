"""Token ids on the sim replica, through real loopback HTTP: prompts given as token ids,
`return_token_ids` in vLLM's format, `/detokenize`, and the property the gateway's stream
continuation relies on -- a request re-issued with its prompt ids + the ids already sent
produces exactly the rest of the uninterrupted text, on any replica."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from drafters.sim import tokens
from drafters.sim.requests import ApiError, chat_prompt, completion_prompt
from drafters.sim.server import OUTPUT_TOKEN_BASE, SimReplicaSettings, synthetic_text

MODEL = "Qwen/Qwen3-8B"
BASE = OUTPUT_TOKEN_BASE


async def _events(h: httpx.AsyncClient, url: str, body: dict) -> list[dict]:
    """The `data:` JSON objects of one SSE response, in order; asserts it ends with [DONE]."""
    out, done = [], False
    async with h.stream("POST", url, json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: "):]
            if payload == "[DONE]":
                done = True
                continue
            out.append(orjson.loads(payload))
    assert done
    return out


def _text(events: list[dict], chat: bool) -> str:
    key = (lambda c: c["delta"].get("content") or "") if chat else (lambda c: c["text"])
    return "".join(key(c) for e in events for c in e["choices"])


def _ids(events: list[dict]) -> list[int]:
    return [t for e in events for c in e["choices"] for t in c.get("token_ids", [])]


# -------------------------------------------------------------------- the stand-in tokenizer


def test_token_scheme_is_deterministic_and_counts_like_the_prompt_tokens():
    text = "Once upon a time, in a land far away"
    ids = tokens.text_token_ids(text)
    assert len(ids) == tokens.count_prompt_tokens(text) and all(0 <= i < BASE for i in ids)
    assert ids == tokens.text_token_ids(text) and ids != tokens.text_token_ids(text.upper())
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]}
    p = chat_prompt(body)
    assert len(p.token_ids()) == p.tokens and all(i < BASE for i in p.token_ids())
    c = completion_prompt({"prompt": text}, 4096)
    assert c.token_ids() == ids and c.tokens == len(ids) and c.start == 0
    # output ids are positions; text is one synthetic word per position
    assert tokens.output_token_ids(3, 2) == [BASE + 3, BASE + 4]
    assert tokens.detokenize(tokens.output_token_ids(0, 7)) == synthetic_text(0, 7)
    assert tokens.detokenize(tokens.output_token_ids(5, 9)) == synthetic_text(5, 9)
    assert tokens.detokenize([0, 27]) == "aaaaaabb"  # prompt ids: a 4-letter code each
    # a token-id prompt continues after its last id when that is an output id
    assert tokens.output_start([7, 8, BASE, BASE + 1, BASE + 2]) == 3
    assert tokens.output_start([7, 8]) == 0 and tokens.output_start([BASE + 41, 9]) == 0
    for form in ([1, 2, BASE, BASE + 1], [[1, 2, BASE, BASE + 1]]):
        p = completion_prompt({"prompt": form, "max_tokens": 5}, 4096)
        assert (p.tokens, p.start, p.max_tokens, p.text) == (4, 2, 5, "")


def test_prompt_token_ids_outside_the_vocabulary_are_refused():
    assert tokens.vocab_size(4096) == BASE + 4096
    assert completion_prompt({"prompt": [BASE + 4095]}, 4096).start == 4096
    for bad in ([BASE + 4096], [1, -1], [[3, 2 ** 40]]):
        with pytest.raises(ApiError) as e:
            completion_prompt({"prompt": bad}, 4096)
        assert e.value.status == 400 and e.value.param == "prompt" and "out of vocabulary" in e.value.message
    for bad in ([], [[1], [2]], [1, "2"], [True], ["a", "b"]):
        with pytest.raises(ApiError) as e:
            completion_prompt({"prompt": bad}, 4096)
        assert e.value.status == 400 and e.value.param == "prompt"


# -------------------------------------------------------------------- continuation


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
async def test_continuation_from_prompt_and_sent_ids_reproduces_the_uninterrupted_text(sim_server, chat):
    """What the gateway does when a stream breaks: /v1/completions on ANOTHER replica with the
    original prompt ids + the ids already sent, max_tokens reduced by them -> the rest, token-exact."""
    n = 60
    first = SimReplicaSettings(profile="dspark-b8", default_workload="gsm8k", name="a", seed=1)
    other = SimReplicaSettings(profile="off", name="b", seed=7)
    async with sim_server(first) as (base_a, _), sim_server(other) as (base_b, _), httpx.AsyncClient(timeout=30) as h:
        body: dict = {"model": MODEL, "max_tokens": n, "ignore_eos": True, "stream": True, "return_token_ids": True,
                      "stream_options": {"include_usage": True}}
        if chat:
            body["messages"] = [{"role": "user", "content": "Count to sixty, please."}]
            url = base_a + "/v1/chat/completions"
        else:
            body["prompt"] = "Count to sixty, please."
            url = base_a + "/v1/completions"
        whole = await _events(h, url, body)
        text, ids = _text(whole, chat), _ids(whole)
        assert text == synthetic_text(0, n) and ids == list(range(BASE, BASE + n))
        prompt_ids = whole[0]["prompt_token_ids"] if chat else whole[0]["choices"][0]["prompt_token_ids"]
        assert len(prompt_ids) == whole[-1]["usage"]["prompt_tokens"]
        # break after a few chunks (mid-stream, at a chunk boundary, as the gateway sees it)
        content = [e for e in whole if e["choices"] and e["choices"][0].get("token_ids")]
        cut = content[: len(content) // 2]
        sent_ids, sent_text = _ids(cut), _text(cut, chat)
        m = len(sent_ids)
        assert 0 < m < n
        prompt = prompt_ids + sent_ids
        cont = await _events(h, base_b + "/v1/completions", {
            "model": MODEL, "prompt": prompt, "max_tokens": n - m, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True})
        assert sent_text + _text(cont, False) == text  # byte-identical to the uninterrupted stream
        assert sent_ids + _ids(cont) == ids
        assert cont[0]["choices"][0]["prompt_token_ids"] == prompt
        assert cont[-1]["usage"] == {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n - m,
                                     "completion_tokens": n - m}
        assert cont[-2]["choices"][0]["finish_reason"] == "length"
        # the same, non-streaming and as [[ids]], on the first replica again
        r = await h.post(base_a + "/v1/completions", json={"model": MODEL, "prompt": [prompt], "max_tokens": n - m,
                                                            "ignore_eos": True, "return_token_ids": True})
        choice = r.json()["choices"][0]
        assert sent_text + choice["text"] == text and sent_ids + choice["token_ids"] == ids


async def test_continuation_without_ignore_eos_stays_within_the_reduced_max_tokens(sim_server):
    async with sim_server(SimReplicaSettings(profile="off", default_output_mean=30.0)) as (base, _):
        async with httpx.AsyncClient(timeout=30) as h:
            prompt = [11, 12, 13] + tokens.output_token_ids(0, 20)
            for _ in range(6):
                r = (await h.post(base + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 25,
                                                                   "return_token_ids": True})).json()
                choice, used = r["choices"][0], r["usage"]["completion_tokens"]
                assert 1 <= used <= 25 and choice["finish_reason"] in ("stop", "length")
                assert choice["text"] == synthetic_text(20, used)  # a prefix of the uninterrupted text
                assert choice["token_ids"] == tokens.output_token_ids(20, used)


# -------------------------------------------------------------------- return_token_ids, vLLM's format


async def test_return_token_ids_in_chat_and_completion_streams(sim_server):
    async with sim_server(SimReplicaSettings(profile="dspark-b4")) as (base, _), httpx.AsyncClient(timeout=30) as h:
        common = {"model": MODEL, "max_tokens": 30, "ignore_eos": True, "stream": True, "return_token_ids": True,
                  "stream_options": {"include_usage": True}}
        ev = await _events(h, base + "/v1/chat/completions",
                           {**common, "messages": [{"role": "user", "content": "Tell me something."}]})
        role, rest, usage = ev[0], ev[1:-1], ev[-1]
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert "token_ids" not in role["choices"][0]  # as vLLM: the role chunk carries no output ids
        assert list(role)[-1] == "prompt_token_ids" and len(role["prompt_token_ids"]) == usage["usage"]["prompt_tokens"]
        for e in rest:
            c = e["choices"][0]
            assert "prompt_token_ids" not in e and "prompt_token_ids" not in c
            assert list(c)[-1] == "token_ids"
            assert tokens.detokenize(c["token_ids"]) == c["delta"]["content"]
        assert _ids(rest) == tokens.output_token_ids(0, 30) and usage["choices"] == []
        assert "token_ids" not in usage and "prompt_token_ids" not in usage

        ev = await _events(h, base + "/v1/completions", {**common, "prompt": "Tell me something."})
        chunks = ev[:-1]
        assert chunks[0]["choices"][0]["prompt_token_ids"] == tokens.text_token_ids("Tell me something.")
        assert all("prompt_token_ids" not in e["choices"][0] for e in chunks[1:])
        assert list(chunks[0]["choices"][0])[-2:] == ["prompt_token_ids", "token_ids"]
        assert _ids(chunks) == tokens.output_token_ids(0, 30) and _text(chunks, False) == synthetic_text(0, 30)

        # without return_token_ids: nothing added, anywhere
        for path, extra in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                            ("/v1/completions", {"prompt": [5, 6, BASE + 3]})):
            body = {**common, **extra}
            del body["return_token_ids"]
            for e in await _events(h, base + path, body):
                assert "prompt_token_ids" not in e
                assert all("token_ids" not in c and "prompt_token_ids" not in c for c in e["choices"])


async def test_return_token_ids_in_whole_responses(sim_server):
    async with sim_server(SimReplicaSettings(profile="dspark-b8")) as (base, _), httpx.AsyncClient(timeout=30) as h:
        common = {"model": MODEL, "max_tokens": 12, "ignore_eos": True, "return_token_ids": True}
        chat = (await h.post(base + "/v1/chat/completions",
                             json={**common, "messages": [{"role": "user", "content": "Hello there"}]})).json()
        assert list(chat)[list(chat).index("usage") + 1] == "prompt_token_ids"
        assert len(chat["prompt_token_ids"]) == chat["usage"]["prompt_tokens"]
        assert chat["choices"][0]["token_ids"] == tokens.output_token_ids(0, 12)
        assert "prompt_token_ids" not in chat["choices"][0]
        comp = (await h.post(base + "/v1/completions", json={**common, "prompt": [9, 8, 7]})).json()
        c = comp["choices"][0]
        assert list(c)[-2:] == ["token_ids", "prompt_token_ids"] and "prompt_token_ids" not in comp
        assert c["prompt_token_ids"] == [9, 8, 7] and c["token_ids"] == tokens.output_token_ids(0, 12)
        assert comp["usage"]["prompt_tokens"] == 3 and c["text"] == synthetic_text(0, 12)
        # the SDK still parses it; the ids ride along as extras
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="sim", max_retries=0, timeout=30)
        resp = await client.completions.create(model=MODEL, prompt=[9, 8, 7], max_tokens=4,
                                               extra_body={"ignore_eos": True, "return_token_ids": True})
        assert resp.choices[0].model_extra["token_ids"] == tokens.output_token_ids(0, 4)
        plain = (await h.post(base + "/v1/completions", json={**common, "prompt": "x", "return_token_ids": False})).json()
        assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain["choices"][0]
        r = await h.post(base + "/v1/completions", json={**common, "prompt": "x", "return_token_ids": "yes"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "return_token_ids"
        await client.close()


# -------------------------------------------------------------------- /detokenize and invalid ids


async def test_detokenize_and_invalid_token_ids(sim_server):
    async with sim_server(SimReplicaSettings(profile="off", max_model_len=4096)) as (base, _):
        async with httpx.AsyncClient(timeout=30) as h:
            r = await h.post(base + "/detokenize", json={"model": MODEL, "tokens": tokens.output_token_ids(4, 5)})
            assert r.status_code == 200 and r.json() == {"prompt": synthetic_text(4, 5)}
            r = await h.post(base + "/detokenize", json={"tokens": [0, 1, BASE]})
            assert r.json() == {"prompt": "aaaaaaab[specgate-sim]"}
            assert (await h.post(base + "/detokenize", json={"tokens": []})).json() == {"prompt": ""}
            r = await h.post(base + "/detokenize", json={"model": "other", "tokens": [1]})
            assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
            for bad, param in (([BASE + 4096], "tokens"), ([-3], "tokens"), ("12", "tokens"), ([1.5], "tokens")):
                r = await h.post(base + "/detokenize", json={"model": MODEL, "tokens": bad})
                err = r.json()["error"]
                assert r.status_code == 400 and err["code"] == 400 and err["param"] == param, r.text
            r = await h.post(base + "/detokenize", json={"tokens": [BASE + 4096]})
            assert r.json()["error"]["message"] == f"Token id {BASE + 4096} is out of vocabulary"
            # a token-id prompt with an unknown id: 400, as vLLM answers
            r = await h.post(base + "/v1/completions", json={"model": MODEL, "prompt": [1, 2, 10 ** 9]})
            assert r.status_code == 400 and r.json()["error"] == {
                "message": f"Token id {10 ** 9} is out of vocabulary", "type": "BadRequestError", "param": "prompt",
                "code": 400}
            r = await h.post(base + "/v1/completions", json={"model": MODEL, "prompt": [[1, 2], [3]]})
            assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
