"""contract.wire: vLLM's OpenAI wire format.

Three layers of checks:
* what the OpenAI Python SDK parses (`ChatCompletion`, `ChatCompletionChunk`,
  `Completion`, `CompletionUsage`) from bodies, chunks and whole SSE streams;
* where vLLM puts `usage` and `metrics.speculative_decoding` (final usage chunk
  only when streaming) and how the summary metrics derive from the histogram;
* (vllm tier) byte-level agreement with vLLM 0.32's own pydantic models, built
  as vLLM's serving code builds them, in `.venv-vllm`: every key we emit has
  vLLM's value and order, and every key we leave out is one vLLM sends as null.
"""

from __future__ import annotations

import json
import subprocess

import orjson
import pytest
from openai._models import construct_type
from openai.types import Completion, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from contract import wire

RID, CREATED, MODEL = "chatcmpl-0123456789abcdef", 1700000000, "Qwen/Qwen3-8B"
CRID = "cmpl-0123456789abcdef"
HIST, NDRAFT, K = [1, 0, 2, 3, 0], 20, 4  # 6 verify steps, 13 accepted drafts
PIDS, OIDS = [151644, 872, 198], [9707, 1879, 13]  # return_token_ids: prompt ids, output ids


def _spec() -> dict:
    return wire.spec_decoding(HIST, NDRAFT, K)


def _events(payload: bytes) -> list[bytes]:
    """`data:` payloads of an SSE byte stream, in order."""
    assert payload.endswith(b"\n\n")
    out = []
    for event in payload.split(b"\n\n")[:-1]:
        assert event.startswith(b"data: ") and b"\n" not in event
        out.append(event[len(b"data: "):])
    return out


def _chat_stream(include_usage: bool, continuous: bool = False, spec: dict | None = None) -> bytes:
    counts = (lambda n: (7, n)) if continuous else (lambda n: None)
    parts = [wire.role_chunk(RID, CREATED, MODEL, usage_counts=counts(0)),
             wire.content_chunk(RID, CREATED, MODEL, "Hello", chat=True, usage_counts=counts(1)),
             wire.content_chunk(RID, CREATED, MODEL, " world", chat=True, finish_reason="length", usage_counts=counts(3))]
    if include_usage:
        parts.append(wire.usage_chunk(RID, CREATED, MODEL, 7, 3, chat=True, spec=spec))
    return b"".join(map(wire.sse, parts)) + wire.DONE


# -------------------------------------------------------------------- ids, usage, metrics


def test_response_ids_follow_vllm():
    rid = wire.response_id(chat=True)
    assert rid.startswith("chatcmpl-") and len(rid) == len("chatcmpl-") + 16
    int(rid.removeprefix("chatcmpl-"), 16)
    assert wire.response_id(chat=False).startswith("cmpl-")
    assert wire.response_id(True) != wire.response_id(True)
    assert wire.response_id(False, "req-42") == "cmpl-req-42"  # X-Request-Id wins, as on vLLM


def test_usage_parses_and_keeps_vllm_key_order():
    u = wire.usage(11, 5)
    assert list(u) == ["prompt_tokens", "total_tokens", "completion_tokens"]
    parsed = CompletionUsage.model_validate(u)
    assert (parsed.prompt_tokens, parsed.completion_tokens, parsed.total_tokens) == (11, 5, 16)


def test_spec_decoding_summary_derives_from_histogram():
    s = _spec()
    assert list(s) == ["mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram", "num_spec_steps",
                       "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens"]
    assert s["num_spec_steps"] == 6 and s["num_accepted_draft_tokens"] == 0 + 0 + 2 * 2 + 3 * 3 == 13
    assert s["mean_acceptance_length"] == 1.0 + 13 / 6 and s["draft_acceptance_rate"] == 13 / 20
    assert s["num_spec_tokens"] == K and s["acceptance_histogram"] == HIST
    # padded to num_spec_tokens + 1; no steps: vLLM's neutral values
    z = wire.spec_decoding([], 0, 3)
    assert z["acceptance_histogram"] == [0, 0, 0, 0] and z["num_spec_steps"] == 0
    assert z["mean_acceptance_length"] == 1.0 and z["draft_acceptance_rate"] == 0.0
    assert wire.metrics(None) is None and wire.metrics(s) == {"speculative_decoding": s}


def test_stream_usage_flags_follow_vllm():
    assert wire.stream_usage_flags(None) == (False, False)
    assert wire.stream_usage_flags({"include_usage": True}) == (True, False)
    assert wire.stream_usage_flags({"include_usage": True, "continuous_usage_stats": True}) == (True, True)
    assert wire.stream_usage_flags({"continuous_usage_stats": True}) == (False, False)  # only with include_usage


# -------------------------------------------------------------------- non-streaming bodies


@pytest.mark.parametrize("spec", [None, "spec"])
def test_chat_body_parses_as_chat_completion(spec):
    s = _spec() if spec else None
    body = wire.completion_body(chat=True, rid=RID, created=CREATED, model=MODEL, text="Hi there", finish_reason="stop",
                                prompt_tokens=9, completion_tokens=2, spec=s)
    resp = ChatCompletion.model_validate(orjson.loads(orjson.dumps(body)))
    assert resp.object == "chat.completion" and resp.id == RID and resp.created == CREATED and resp.model == MODEL
    assert resp.choices[0].message.role == "assistant" and resp.choices[0].message.content == "Hi there"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens == 9 and resp.usage.completion_tokens == 2 and resp.usage.total_tokens == 11
    extra = resp.model_extra or {}
    if s is None:
        assert "metrics" not in extra
    else:
        assert extra["metrics"] == {"speculative_decoding": s}


def test_completion_body_parses_as_completion():
    body = wire.completion_body(chat=False, rid=CRID, created=CREATED, model=MODEL, text=" once", finish_reason="length",
                                prompt_tokens=3, completion_tokens=1, spec=_spec())
    resp = Completion.model_validate(orjson.loads(orjson.dumps(body)))
    assert resp.object == "text_completion" and resp.choices[0].text == " once"
    assert resp.choices[0].finish_reason == "length" and resp.usage.total_tokens == 4
    assert resp.model_extra["metrics"]["speculative_decoding"]["num_spec_steps"] == 6


# -------------------------------------------------------------------- streams


def test_chat_stream_parses_chunk_by_chunk_and_puts_metrics_only_in_the_usage_chunk():
    chunks = [ChatCompletionChunk.model_validate(orjson.loads(e)) for e in _events(_chat_stream(True, spec=_spec()))[:-1]]
    assert _events(_chat_stream(True))[-1] == b"[DONE]"
    assert all(c.object == "chat.completion.chunk" and c.id == RID and c.created == CREATED for c in chunks)
    role, final = chunks[0], chunks[-1]
    assert role.choices[0].delta.role == "assistant" and role.choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == "Hello world"
    # finish_reason rides on the last content chunk (no extra empty chunk), like vLLM
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None, None, "length"]
    assert final.choices == [] and final.usage.completion_tokens == 3 and final.usage.prompt_tokens == 7
    assert final.model_extra["metrics"]["speculative_decoding"] == _spec()
    for c in chunks[:-1]:
        assert c.usage is None and "metrics" not in (c.model_extra or {})


def test_no_usage_chunk_without_include_usage():
    events = _events(_chat_stream(False))
    assert events[-1] == b"[DONE]"
    for e in events[:-1]:
        obj = orjson.loads(e)
        assert obj["choices"] and "usage" not in obj and "metrics" not in obj


def test_continuous_usage_on_every_chunk_but_metrics_still_only_at_the_end():
    chunks = [ChatCompletionChunk.model_validate(orjson.loads(e)) for e in _events(_chat_stream(True, True, _spec()))[:-1]]
    assert [c.usage.completion_tokens for c in chunks] == [0, 1, 3, 3]
    assert [c.usage.total_tokens for c in chunks] == [7, 8, 10, 10]
    assert ["metrics" in (c.model_extra or {}) for c in chunks] == [False, False, False, True]


def test_completion_stream_parses_as_completion_chunks():
    parts = [wire.content_chunk(CRID, CREATED, MODEL, t, chat=False, finish_reason=fr)
             for t, fr in ((" a", None), (" b", None), (" c", "stop"))]
    parts.append(wire.usage_chunk(CRID, CREATED, MODEL, 2, 3, chat=False, spec=_spec()))
    events = _events(b"".join(map(wire.sse, parts)) + wire.DONE)
    assert events[-1] == b"[DONE]"
    # The SDK types `Completion.choices[].finish_reason` as non-null, yet vLLM (and OpenAI) stream null
    # until the last chunk: the client parses leniently (construct_type, its default), strict
    # validation holds for the finish and usage chunks.
    chunks = [construct_type(type_=Completion, value=orjson.loads(e)) for e in events[:-1]]
    for e in events[2:-1]:
        Completion.model_validate(orjson.loads(e))
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == " a b c"
    assert chunks[2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 5
    assert chunks[-1].model_extra["metrics"]["speculative_decoding"]["num_draft_tokens"] == NDRAFT


def test_sse_framing_and_done_line():
    assert wire.sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert wire.DONE == b"data: [DONE]\n\n"
    assert wire.SSE_CONTENT_TYPE.startswith("text/event-stream")


# -------------------------------------------------------------------- errors, models


def test_error_bodies():
    e = wire.error_body("bad", "BadRequestError", 400, "messages")
    assert e == {"error": {"message": "bad", "type": "BadRequestError", "param": "messages", "code": 400}}
    nf = wire.model_not_found_body("other", MODEL)["error"]
    assert nf["type"] == "NotFoundError" and nf["param"] == "model" and nf["code"] == 404
    assert nf["message"].startswith("The model `other` does not exist.")
    assert wire.http_error_body(404) == {"error": {"message": "Not Found", "type": "Not Found", "param": None, "code": 404}}


def test_model_list_parses():
    from openai.types import Model

    ml = wire.model_list(MODEL, CREATED, 4096)
    m = Model.model_validate(ml["data"][0])
    assert ml["object"] == "list" and m.id == MODEL and m.owned_by == "vllm" and m.created == CREATED
    assert ml["data"][0]["max_model_len"] == 4096


# -------------------------------------------------------------------- against vLLM's own models

# Built the way vLLM 0.32's serving code builds them (entrypoints/openai/*/serving.py), dumped with its options.
_VLLM_REFERENCE = r"""
import json, sys
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionResponse, ChatCompletionResponseChoice, ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse, ChatMessage)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionResponse, CompletionResponseChoice, CompletionResponseStreamChoice, CompletionStreamResponse)
from vllm.entrypoints.serve.engine.protocol import (
    ErrorInfo, ErrorResponse, ModelCard, ModelList, ModelPermission, UsageInfo)
from vllm.entrypoints.generate.base.protocol import DeltaMessage, PerRequestMetrics, SpeculativeDecodingMetrics
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

a = json.loads(sys.argv[1])
RID, CRID, CREATED, MODEL, K, HIST, NDRAFT = a["RID"], a["CRID"], a["CREATED"], a["MODEL"], a["K"], a["HIST"], a["NDRAFT"]
sd = RequestSpecDecodeMetrics.new(K)
for j, n in enumerate(HIST):
    for _ in range(n):
        sd.observe(0, j)
sd.num_draft_tokens = NDRAFT
def spec():
    m = PerRequestMetrics()
    m.speculative_decoding = SpeculativeDecodingMetrics(**sd.to_dict())
    return m
out = {"spec": sd.to_dict()}
U = lambda p, c, **kw: UsageInfo(prompt_tokens=p, completion_tokens=c, total_tokens=p + c, **kw)
ch = lambda choices, **kw: ChatCompletionStreamResponse(id=RID, object="chat.completion.chunk", created=CREATED,
                                                         choices=choices, model=MODEL, **kw)
role = ch([ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(role="assistant", content=""),
                                              logprobs=None, finish_reason=None)], prompt_token_ids=None, prompt_text=None)
out["role_chunk"] = role.model_dump_json(exclude_unset=True)
role.usage = U(7, 0, completion_tokens_details=None)
out["role_chunk_continuous"] = role.model_dump_json(exclude_unset=True)
mid = ch([ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(content="Hello"), logprobs=None,
                                             finish_reason=None, token_ids=None)])
out["chat_chunk"] = mid.model_dump_json(exclude_unset=True)
mid.usage = U(7, 1, completion_tokens_details=None)
out["chat_chunk_continuous"] = mid.model_dump_json(exclude_unset=True)
out["chat_finish_chunk"] = ch([ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(content=" world"),
    logprobs=None, finish_reason="length", stop_reason=None, token_ids=None)]).model_dump_json(exclude_unset=True)
fu = U(7, 3, completion_tokens_details=None)
fu.prompt_tokens_details = None
out["chat_usage_chunk"] = ch([], usage=fu, system_fingerprint=None, metrics=spec()).model_dump_json(
    exclude_unset=True, exclude_none=True)
cc = lambda text, fr: CompletionStreamResponse(id=CRID, object="text_completion", created=CREATED, model=MODEL,
    choices=[CompletionResponseStreamChoice(index=0, text=text, logprobs=None, finish_reason=fr, stop_reason=None,
                                            prompt_token_ids=None, token_ids=None)])
out["completion_chunk"] = cc(" a", None).model_dump_json(exclude_unset=True)
c2 = cc(" c", "stop")
c2.usage = U(2, 3)
out["completion_finish_chunk_continuous"] = c2.model_dump_json(exclude_unset=True)
out["completion_usage_chunk"] = CompletionStreamResponse(id=CRID, created=CREATED, model=MODEL, choices=[],
    usage=U(2, 3), system_fingerprint=None, metrics=spec()).model_dump_json(exclude_unset=False, exclude_none=True)
bu = U(9, 2, completion_tokens_details=None)
bu.prompt_tokens_details = None
out["chat_body"] = ChatCompletionResponse(id=RID, created=CREATED, model=MODEL, choices=[ChatCompletionResponseChoice(
    index=0, message=ChatMessage(role="assistant", reasoning=None, content="Hi there"), logprobs=None,
    finish_reason="stop", stop_reason=None, token_ids=None, routed_experts=None)], usage=bu, system_fingerprint=None,
    prompt_logprobs=None, prompt_token_ids=None, prompt_text=None, kv_transfer_params=None, ec_transfer_params=None,
    metrics=spec()).model_dump()
cu = U(3, 1)
cu.prompt_tokens_details = None
out["completion_body"] = CompletionResponse(id=CRID, created=CREATED, model=MODEL, choices=[CompletionResponseChoice(
    index=0, text=" once", logprobs=None, finish_reason="length", stop_reason=None, prompt_logprobs=None,
    prompt_token_ids=None, token_ids=None, routed_experts=None)], usage=cu, system_fingerprint=None,
    kv_transfer_params=None, ec_transfer_params=None, metrics=spec()).model_dump()
# return_token_ids: the prompt's ids once (chat: top level of the role chunk; completions: the first
# chunk's choice), each output's ids on its choice; in whole responses, on the choice (chat: prompt ids top level)
PIDS, OIDS = a["PIDS"], a["OIDS"]
out["role_chunk_ids"] = ch([ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(role="assistant",
    content=""), logprobs=None, finish_reason=None)], prompt_token_ids=PIDS, prompt_text=None).model_dump_json(
    exclude_unset=True)
out["chat_chunk_ids"] = ch([ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(content="Hello"),
    logprobs=None, finish_reason=None, token_ids=OIDS[:1])]).model_dump_json(exclude_unset=True)
out["chat_finish_chunk_ids"] = ch([ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(content=" world"),
    logprobs=None, finish_reason="length", stop_reason=None, token_ids=OIDS[1:])]).model_dump_json(exclude_unset=True)
cci = lambda text, fr, pids, oids: CompletionStreamResponse(id=CRID, object="text_completion", created=CREATED,
    model=MODEL, choices=[CompletionResponseStreamChoice(index=0, text=text, logprobs=None, finish_reason=fr,
    stop_reason=None, prompt_token_ids=pids, token_ids=oids)]).model_dump_json(exclude_unset=True)
out["completion_first_chunk_ids"] = cci(" a", None, PIDS, OIDS[:1])
out["completion_finish_chunk_ids"] = cci(" b", "length", None, OIDS[1:])
out["chat_body_ids"] = ChatCompletionResponse(id=RID, created=CREATED, model=MODEL, choices=[ChatCompletionResponseChoice(
    index=0, message=ChatMessage(role="assistant", reasoning=None, content="Hi there"), logprobs=None,
    finish_reason="stop", stop_reason=None, token_ids=OIDS, routed_experts=None)], usage=bu, system_fingerprint=None,
    prompt_logprobs=None, prompt_token_ids=PIDS, prompt_text=None, kv_transfer_params=None, ec_transfer_params=None,
    metrics=spec()).model_dump()
out["completion_body_ids"] = CompletionResponse(id=CRID, created=CREATED, model=MODEL, choices=[CompletionResponseChoice(
    index=0, text=" once", logprobs=None, finish_reason="length", stop_reason=None, prompt_logprobs=None,
    prompt_token_ids=PIDS, token_ids=OIDS, routed_experts=None)], usage=cu, system_fingerprint=None,
    kv_transfer_params=None, ec_transfer_params=None, metrics=spec()).model_dump()
out["error"] = ErrorResponse(error=ErrorInfo(message="bad", type="BadRequestError", code=400, param="messages")).model_dump()
out["models"] = ModelList(data=[ModelCard(id=MODEL, created=CREATED, max_model_len=4096, root=MODEL,
    permission=[ModelPermission(id="modelperm-x", created=CREATED)])]).model_dump()
print(json.dumps(out))
"""


def _same_as_vllm(ours, theirs, path="$"):
    """Our value equals vLLM's, with the same key order; keys we leave out are ones vLLM sends as null."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), path
        missing = set(ours) - set(theirs)
        assert not missing, f"{path}: keys vLLM does not send: {missing}"
        assert list(ours) == [k for k in theirs if k in ours], f"{path}: key order {list(ours)} vs {list(theirs)}"
        for k, v in theirs.items():
            if k in ours:
                _same_as_vllm(ours[k], v, f"{path}.{k}")
            else:
                assert v is None, f"{path}.{k}: left out but vLLM sends {v!r}"
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), path
        for i, (o, t) in enumerate(zip(ours, theirs)):
            _same_as_vllm(o, t, f"{path}[{i}]")
    else:
        assert ours == theirs and type(ours) is type(theirs), f"{path}: {ours!r} != {theirs!r}"


@pytest.mark.vllm
def test_matches_vllm_protocol_models():
    from testbed import vllm_env

    reason = vllm_env.unavailable_reason()
    if reason:
        if vllm_env.required():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    args = {"RID": RID, "CRID": CRID, "CREATED": CREATED, "MODEL": MODEL, "K": K, "HIST": HIST, "NDRAFT": NDRAFT,
            "PIDS": PIDS, "OIDS": OIDS}
    proc = subprocess.run([str(vllm_env.python()), "-c", _VLLM_REFERENCE, json.dumps(args)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = json.loads(proc.stdout.strip().splitlines()[-1])
    spec = _spec()
    _same_as_vllm(spec, ref["spec"])
    ours = {
        "role_chunk": wire.role_chunk(RID, CREATED, MODEL),
        "role_chunk_continuous": wire.role_chunk(RID, CREATED, MODEL, usage_counts=(7, 0)),
        "chat_chunk": wire.content_chunk(RID, CREATED, MODEL, "Hello", chat=True),
        "chat_chunk_continuous": wire.content_chunk(RID, CREATED, MODEL, "Hello", chat=True, usage_counts=(7, 1)),
        "chat_finish_chunk": wire.content_chunk(RID, CREATED, MODEL, " world", chat=True, finish_reason="length"),
        "chat_usage_chunk": wire.usage_chunk(RID, CREATED, MODEL, 7, 3, chat=True, spec=spec),
        "completion_chunk": wire.content_chunk(CRID, CREATED, MODEL, " a", chat=False),
        "completion_finish_chunk_continuous": wire.content_chunk(CRID, CREATED, MODEL, " c", chat=False,
                                                                 finish_reason="stop", usage_counts=(2, 3)),
        "completion_usage_chunk": wire.usage_chunk(CRID, CREATED, MODEL, 2, 3, chat=False, spec=spec),
        "role_chunk_ids": wire.role_chunk(RID, CREATED, MODEL, prompt_token_ids=PIDS),
        "chat_chunk_ids": wire.content_chunk(RID, CREATED, MODEL, "Hello", chat=True, token_ids=OIDS[:1]),
        "chat_finish_chunk_ids": wire.content_chunk(RID, CREATED, MODEL, " world", chat=True, finish_reason="length",
                                                    token_ids=OIDS[1:]),
        "completion_first_chunk_ids": wire.content_chunk(CRID, CREATED, MODEL, " a", chat=False, token_ids=OIDS[:1],
                                                         prompt_token_ids=PIDS),
        "completion_finish_chunk_ids": wire.content_chunk(CRID, CREATED, MODEL, " b", chat=False,
                                                          finish_reason="length", token_ids=OIDS[1:]),
    }
    for name, obj in ours.items():
        theirs = json.loads(ref[name])
        _same_as_vllm(obj, theirs, name)
        if name.endswith("usage_chunk"):  # the final chunk has no nulls to leave out: byte-identical
            assert wire.sse(obj) == b"data: " + ref[name].encode() + b"\n\n"
    _same_as_vllm(wire.completion_body(chat=True, rid=RID, created=CREATED, model=MODEL, text="Hi there",
                                       finish_reason="stop", prompt_tokens=9, completion_tokens=2, spec=spec),
                  ref["chat_body"], "chat_body")
    _same_as_vllm(wire.completion_body(chat=False, rid=CRID, created=CREATED, model=MODEL, text=" once",
                                       finish_reason="length", prompt_tokens=3, completion_tokens=1, spec=spec),
                  ref["completion_body"], "completion_body")
    _same_as_vllm(wire.completion_body(chat=True, rid=RID, created=CREATED, model=MODEL, text="Hi there",
                                       finish_reason="stop", prompt_tokens=9, completion_tokens=2, spec=spec,
                                       token_ids=OIDS, prompt_token_ids=PIDS),
                  ref["chat_body_ids"], "chat_body_ids")
    _same_as_vllm(wire.completion_body(chat=False, rid=CRID, created=CREATED, model=MODEL, text=" once",
                                       finish_reason="length", prompt_tokens=3, completion_tokens=1, spec=spec,
                                       token_ids=OIDS, prompt_token_ids=PIDS),
                  ref["completion_body_ids"], "completion_body_ids")
    _same_as_vllm(wire.error_body("bad", "BadRequestError", 400, "messages"), ref["error"], "error")
    models = wire.model_list(MODEL, CREATED, 4096)
    models["data"][0]["permission"][0]["id"] = "modelperm-x"
    _same_as_vllm(models, ref["models"], "models")
