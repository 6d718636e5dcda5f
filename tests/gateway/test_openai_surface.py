"""The OpenAI surface through the gateway, with the real openai SDK as client."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import KEYS, backend_requests


@pytest.fixture
def gw(start_backend, start_gateway):
    backend = start_backend(name="r1", spec=True)
    gateway = start_gateway([{"url": backend.url, "name": "r1", "profile": "dspark-b8"}])
    return gateway, backend


def client(gateway, key="alpha", **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1(), api_key=KEYS[key], max_retries=0, timeout=10, **kw)


def test_chat_and_completions_non_streaming_sync(gw):
    gateway, _ = gw
    c = client(gateway)
    chat = c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hello"}], max_tokens=5)
    assert chat.choices[0].message.content == " tok0 tok1 tok2 tok3 tok4"
    assert chat.usage.completion_tokens == 5
    comp = c.completions.create(model="fake-model", prompt="once upon", max_tokens=3)
    assert comp.choices[0].text == " tok0 tok1 tok2"
    assert comp.usage.prompt_tokens == 2


async def test_chat_async_and_streaming(gw):
    gateway, _ = gw
    c = openai.AsyncOpenAI(base_url=gateway.v1(), api_key=KEYS["alpha"], max_retries=0, timeout=10)
    chat = await c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.choices[0].finish_reason == "length"
    stream = await c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert text == " tok0 tok1 tok2 tok3"
    await c.close()


def test_completions_streaming_sync(gw):
    gateway, _ = gw
    stream = client(gateway).completions.create(model="fake-model", prompt="x", max_tokens=3, stream=True)
    chunks = list(stream)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == " tok0 tok1 tok2"
    assert all(ch.usage is None for ch in chunks)  # the usage chunk the gateway asked for is stripped


def test_models_is_union_over_healthy_replicas(start_backend, start_gateway):
    a = start_backend(name="a", model="model-a")
    b = start_backend(name="b", model="model-b")
    gateway = start_gateway([{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}])
    ids = sorted(m.id for m in client(gateway).models.list())
    assert ids == ["model-a", "model-b"]


def test_unknown_fields_pass_through_untouched(gw):
    gateway, backend = gw
    client(gateway).chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        extra_body={"min_p": 0.05, "chat_template_kwargs": {"enable_thinking": False}, "vllm_xargs": {"custom": "v"}, "top_k": 7},
    )
    body = backend_requests(backend)[-1]["body"]
    assert body["min_p"] == 0.05
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["vllm_xargs"] == {"custom": "v"}
    assert body["top_k"] == 7
    headers = backend_requests(backend)[-1]["headers"]
    assert "authorization" not in headers  # tenant keys never reach replicas


def test_response_is_byte_faithful_and_carries_overhead_header(gw):
    gateway, backend = gw
    payload = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    via = httpx.post(gateway.url + "/v1/chat/completions", json=payload, headers={"authorization": f"Bearer {KEYS['alpha']}"})
    direct = httpx.post(backend.url + "/v1/chat/completions", json=payload)
    assert via.status_code == 200
    strip = lambda b: b.replace(b"r1-1", b"X").replace(b"r1-2", b"X")  # request counters in ids
    assert strip(via.content) == strip(direct.content)
    assert float(via.headers["x-specgate-overhead-ms"]) >= 0
    assert via.headers["x-specgate-replica"] == "r1"


def test_auth_errors(gw):
    gateway, _ = gw
    with pytest.raises(openai.AuthenticationError) as exc:
        openai.OpenAI(base_url=gateway.v1(), api_key="sk-wrong", max_retries=0).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "x"}]
        )
    assert exc.value.status_code == 401
    assert exc.value.body["code"] == "invalid_api_key"
    r = httpx.post(gateway.url + "/v1/chat/completions", json={"model": "fake-model", "messages": []})
    assert r.status_code == 401
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(gateway.url + "/v1/models").status_code == 401


@pytest.mark.parametrize(
    "raw, param",
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "fake-model", "messages": "hi"}', "messages"),
        (b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
    ],
)
def test_bad_bodies_are_400(gw, raw, param):
    gateway, _ = gw
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=raw,
        headers={"authorization": f"Bearer {KEYS['alpha']}", "content-type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["param"] == param


def test_unknown_model_is_404(gw):
    gateway, _ = gw
    with pytest.raises(openai.NotFoundError) as exc:
        client(gateway).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["param"] == "model"


def test_body_too_large_is_413(start_backend, start_gateway):
    backend = start_backend()
    gateway = start_gateway([{"url": backend.url}], max_body_bytes=2048)
    big = "word " * 2000
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": big}]},
        headers={"authorization": f"Bearer {KEYS['alpha']}"},
    )
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_no_healthy_replica_is_503(start_gateway):
    from testbed.procs import free_port

    gateway = start_gateway([{"url": f"http://127.0.0.1:{free_port()}", "model": "fake-model"}])
    with pytest.raises(openai.InternalServerError) as exc:
        client(gateway).chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])
    assert exc.value.status_code == 503


def test_upstream_timeout_is_504(start_backend, start_gateway):
    backend = start_backend()
    backend.fake.control["delay_s"] = 3.0
    gateway = start_gateway([{"url": backend.url}], first_byte_timeout_s=0.3, response_timeout_s=0.3)
    for stream in (False, True):  # streams: until headers; non-streaming: the whole response
        with pytest.raises(openai.APIStatusError) as exc:
            client(gateway).chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}], stream=stream)
        assert exc.value.status_code == 504
        assert exc.value.body["code"] == "upstream_timeout"


def test_unknown_path_is_openai_shaped_404(gw):
    gateway, _ = gw
    r = httpx.get(gateway.url + "/v1/nothing")
    assert r.status_code == 404
    assert "error" in r.json()
