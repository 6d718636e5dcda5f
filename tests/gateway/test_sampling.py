"""The sampling fields' parse-time checks: each bad value is the OpenAI 400
naming its field; edge values and unknown fields pass untouched."""

import orjson
import pytest

from gateway.errors import GatewayError
from gateway.stages import parse_body

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMP = {"model": "m", "prompt": "hi"}

BAD = [
    ("chat", "temperature", "hot"),
    ("chat", "temperature", 2.01),
    ("chat", "temperature", -0.1),
    ("chat", "temperature", True),
    ("chat", "top_p", 1.5),
    ("chat", "top_p", "1"),
    ("chat", "presence_penalty", -2.5),
    ("chat", "frequency_penalty", 3),
    ("chat", "max_tokens", -1),
    ("chat", "max_tokens", 0),
    ("chat", "max_tokens", "x"),
    ("chat", "max_tokens", 1e12),
    ("chat", "max_tokens", 2**40),
    ("chat", "max_tokens", True),
    ("chat", "max_tokens", 3.5),
    ("chat", "max_completion_tokens", 0),
    ("chat", "n", 1000),
    ("chat", "n", 0),
    ("chat", "n", "2"),
    ("chat", "stream", "yes"),
    ("chat", "stop", 5),
    ("chat", "stop", ["a", 1]),
    ("chat", "stop", ["a", "b", "c", "d", "e"]),
    ("chat", "seed", 1.5),
    ("chat", "seed", "1"),
    ("chat", "logprobs", 3),
    ("chat", "top_logprobs", 21),
    ("chat", "top_logprobs", -1),
    ("completions", "logprobs", True),
    ("completions", "logprobs", 6),
    ("completions", "max_tokens", -1),
]

GOOD = [
    ("chat", {"temperature": 0, "top_p": 1, "presence_penalty": -2, "frequency_penalty": 2.0}),
    ("chat", {"temperature": 2, "top_p": 0.0, "max_tokens": 1, "n": 128, "seed": -5}),
    ("chat", {"max_completion_tokens": 4096, "stream": False, "stop": ["a", "b", "c", "d"]}),
    ("chat", {"stop": "\n", "logprobs": True, "top_logprobs": 20}),
    ("chat", {"temperature": None, "max_tokens": None, "stop": None, "n": None}),
    ("chat", {"unknown_field": "anything", "repetition_penalty": 99, "top_k": -1}),
    ("completions", {"logprobs": 0, "max_tokens": 16, "stop": []}),
    ("completions", {"logprobs": 5, "echo": True}),
]


def _raw(kind, extra):
    return orjson.dumps({**(CHAT if kind == "chat" else COMP), **extra})


@pytest.mark.parametrize("kind,field,value", BAD)
def test_bad_field_is_openai_400_naming_it(kind, field, value):
    with pytest.raises(GatewayError) as ei:
        parse_body(_raw(kind, {field: value}), kind)
    exc = ei.value
    assert exc.status == 400 and exc.param == field
    err = orjson.loads(exc.body())["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field and err["code"] == "invalid_value"
    assert field in err["message"]


@pytest.mark.parametrize("kind,extra", GOOD)
def test_edge_values_and_unknown_fields_pass_untouched(kind, extra):
    body = parse_body(_raw(kind, extra), kind)
    for k, v in extra.items():
        assert body[k] == v


def _replica(name, cards, healthy=True):
    from gateway.replicas import ReplicaState
    from gateway.sampling import context_lengths

    r = ReplicaState(name=name, url=f"http://{name}", profile=None, healthy=healthy)
    r.model_cards = cards
    r.models = frozenset(c["id"] for c in cards)
    r.context_lengths = context_lengths(cards)
    return r


def test_context_lengths_keep_only_usable_cards():
    from gateway.sampling import context_lengths

    cards = [{"id": "a", "max_model_len": 4096}, {"id": "b"}, {"id": "c", "max_model_len": "8k"}, {"id": "d", "max_model_len": 0}]
    assert context_lengths(cards) == {"a": 4096}


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_a_limit_past_the_longest_context_is_the_openai_400(key):
    from gateway.sampling import check_fits_context

    # Two replicas serve `m` with different contexts: the longer one counts
    # (routing may pick it); a third serves another model with a longer one.
    replicas = [
        _replica("short", [{"id": "m", "max_model_len": 2048}]),
        _replica("long", [{"id": "m", "max_model_len": 4096}], healthy=False),
        _replica("other", [{"id": "x", "max_model_len": 100_000}]),
    ]
    check_fits_context({key: 4096}, "m", replicas)  # equal: vLLM serves it, clamped to what the prompt leaves
    check_fits_context({key: None, "max_tokens": None}, "m", replicas)
    with pytest.raises(GatewayError) as ei:
        check_fits_context({key: 4097}, "m", replicas)
    err = orjson.loads(ei.value.body())["error"]
    assert ei.value.status == 400 and err["param"] == key and err["code"] == "invalid_value"
    assert err["type"] == "invalid_request_error" and "4096" in err["message"] and "4097" in err["message"]


def test_without_a_known_context_the_replica_judges():
    from gateway.sampling import check_fits_context

    check_fits_context({"max_tokens": 10**9}, "m", [_replica("r", [{"id": "m"}])])
    check_fits_context({"max_tokens": 10**9}, "m", [])
