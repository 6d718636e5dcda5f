"""The pure half of stream continuation: which requests can be continued,
the continuation request, and the continuation's output in the client's
shape."""

from __future__ import annotations

import inspect
import re

import orjson
import pytest

from gateway.stream import continuation, shape
from gateway.stream.continuation import ContinuationTap, continuation_body, max_tokens_left, unsupported
from gateway.stream.ledger import StreamLedger


@pytest.mark.parametrize("body,endpoint", [
    ({"messages": [], "temperature": 0.7, "seed": 1, "stop": ["x"]}, "chat"),
    ({"messages": [], "tools": [{"type": "function"}], "tool_choice": "none"}, "chat"),
    ({"messages": [], "n": 1, "logprobs": False, "frequency_penalty": 0.0}, "chat"),
    ({"prompt": "x", "response_format": {"type": "text"}}, "completions"),
    ({"prompt": [1, 2, 3]}, "completions"),
    ({"prompt": ["one prompt"]}, "completions"),
])
def test_continuable(body, endpoint):
    assert unsupported(body, endpoint) is None


@pytest.mark.parametrize("body,endpoint,why", [
    ({"messages": [], "n": 2}, "chat", "more than one"),
    ({"prompt": "x", "best_of": 3}, "completions", "more than one"),
    ({"messages": [], "logprobs": True}, "chat", "logprobs"),
    ({"prompt": "x", "logprobs": 0}, "completions", "logprobs"),
    ({"prompt": "x", "echo": True}, "completions", "echo"),
    ({"messages": [], "response_format": {"type": "json_schema", "json_schema": {}}}, "chat", "structured"),
    ({"prompt": "x", "structured_outputs": {"regex": "a+"}}, "completions", "structured"),
    ({"messages": [], "tools": [{"type": "function"}]}, "chat", "tool"),
    ({"messages": [], "presence_penalty": 0.3}, "chat", "penalty"),
    ({"prompt": ["a", "b"]}, "completions", "several prompts"),
    ({"prompt": "x", "suffix": "y"}, "completions", "suffix"),
])
def test_not_continuable(body, endpoint, why):
    assert why in unsupported(body, endpoint)


def test_the_fast_path_knows_every_field_a_rule_reads():
    """`unsupported` skips the rules for a body with none of `_RULE_FIELDS`:
    a rule reading a field missing from that set would never run."""
    source = (inspect.getsource(continuation._ruled_out) + inspect.getsource(continuation._structured)
              + inspect.getsource(shape.one_prompt_one_output))  # the rule continuation shares with capture
    read = set(re.findall(r'body\.get\("(\w+)"', source)) | set(continuation._GUIDED)
    assert read - {"prompt"} <= continuation._RULE_FIELDS
    assert len(read) > 20  # the pattern still finds the rules' reads


@pytest.mark.parametrize("field", sorted(continuation._RULE_FIELDS))
def test_a_body_with_a_rule_field_gets_the_rules(field, monkeypatch):
    seen = []
    monkeypatch.setattr(continuation, "_ruled_out", lambda body, endpoint: seen.append(field) or "ruled")
    assert unsupported({"messages": [], field: None}, "chat") == "ruled" and seen == [field]


def ledger(prompt, sent, text="") -> StreamLedger:
    led = StreamLedger()
    led.prompt_ids = prompt
    led.took(sent, text)
    return led


def test_continuation_body_is_the_token_prompt_and_the_rest_of_the_budget():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10, "max_tokens": 99,
            "min_tokens": 4, "temperature": 0.9, "top_p": 0.5, "seed": 3, "stop": ["END"], "logit_bias": {"5": 1.0},
            "stream_options": {"include_usage": False}, "tools": None, "return_token_ids": True}
    out = continuation_body(body, "chat", ledger([1, 2], [7, 8, 9]), {"specgate_max_draft": 2})
    assert out == {"model": "m", "prompt": [1, 2, 7, 8, 9], "temperature": 0.9, "top_p": 0.5, "seed": 3, "stop": ["END"],
                   "logit_bias": {"5": 1.0}, "max_tokens": 7, "min_tokens": 1, "vllm_xargs": {"specgate_max_draft": 2},
                   "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}


def test_max_tokens_left_follows_each_endpoints_default():
    assert max_tokens_left({}, "completions", 5) == 11  # vLLM's completions default is 16
    assert max_tokens_left({"max_tokens": None}, "completions", 5) is None
    assert max_tokens_left({}, "chat", 5) is None  # chat: what fits in the context
    assert max_tokens_left({"max_tokens": 8}, "chat", 5) == 3
    assert continuation_body({"model": "m"}, "chat", ledger([1], [2]), None)["max_tokens"] is None


def sse(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_continuation_tap_rewrites_completion_chunks_into_the_clients_chat_stream():
    led = ledger([1], [100], " a")
    led.id, led.created, led.model = "chatcmpl-x", 9, "m"
    tap = ContinuationTap(led, chat=True, client_ids=False, continuous=False, stop=None)
    cont = {"id": "cmpl-y", "object": "text_completion", "created": 11, "model": "m",
            "choices": [{"index": 0, "text": " b", "logprobs": None, "finish_reason": None, "stop_reason": None,
                         "prompt_token_ids": [1, 100], "token_ids": [101]}]}
    last = {**cont, "choices": [{**cont["choices"][0], "text": " c", "finish_reason": "length", "token_ids": [102]}]}
    usage = {"id": "cmpl-y", "object": "text_completion", "created": 11, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}}
    out = tap.feed(sse(cont) + sse(last) + sse(usage) + b"data: [DONE]\n\n")
    events = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert events == [
        {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 9, "model": "m",
         "choices": [{"index": 0, "delta": {"content": " b"}, "logprobs": None, "finish_reason": None}]},
        {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 9, "model": "m",
         "choices": [{"index": 0, "delta": {"content": " c"}, "logprobs": None, "finish_reason": "length", "stop_reason": None}]},
    ]
    assert tap.done and tap.saw_done and led.sent_ids == [100, 101, 102] and led.sent_text == " a b c"
    assert led.usage() == {"prompt_tokens": 1, "total_tokens": 4, "completion_tokens": 3}


def replayed_chunk(ids, text, finish=None):
    return {"id": "cmpl-y", "object": "text_completion", "created": 11, "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                         "token_ids": ids}]}


def rewound_ledger() -> StreamLedger:
    """The client got ids 100..102 and the text of 100 only: 101, 102 are the first bytes of a character."""
    led = ledger([1], [100, 101, 102], " a")
    led.id, led.created, led.model = "cmpl-x", 9, "m"
    led.rewind(1)
    return led


def test_ids_generated_again_after_a_rewind_are_not_sent_twice():
    led = rewound_ledger()
    tap = ContinuationTap(led, chat=False, client_ids=True, continuous=False, stop=None)
    out = tap.feed(sse(replayed_chunk([101], "")) + sse(replayed_chunk([102, 103], "é")) + sse(replayed_chunk([104], "b", "length")))
    events = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert [(e["choices"][0]["text"], e["choices"][0]["token_ids"]) for e in events] == [("é", [103]), ("b", [104])]
    assert led.sent_ids == [100, 101, 102, 103, 104] and led.replay == [] and led.sent_text == " aéb"
    assert tap.error is None and tap.done


def test_a_continuation_that_samples_other_ids_than_the_client_got_cannot_go_on():
    led = rewound_ledger()
    tap = ContinuationTap(led, chat=False, client_ids=True, continuous=False, stop=None)
    assert tap.feed(sse(replayed_chunk([101, 7], "x")) + sse(replayed_chunk([8], "y"))) == b""
    assert tap.error is not None and "partial character" in led.why_not()
    assert led.sent_ids == [100]  # nothing of it taken


def test_a_client_without_ids_gets_whatever_the_continuation_samples():
    led = rewound_ledger()
    tap = ContinuationTap(led, chat=True, client_ids=False, continuous=False, stop=None)
    out = tap.feed(sse(replayed_chunk([201, 202], "ü")))  # other bytes: the client never saw the first ones
    assert orjson.loads(out[6:])["choices"][0]["delta"] == {"content": "ü"}
    assert led.sent_ids == [100, 201, 202] and led.replay == [] and tap.error is None
