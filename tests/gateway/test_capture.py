"""Capture decisions (gateway.capture): pure functions of their inputs."""

from __future__ import annotations

import json

import orjson
import pytest

from contract import wire
from contract.policy import CaptureSpec
from gateway.capture import (
    DROPPED_BUDGET,
    DROPPED_QUEUE,
    HOUR_S,
    TOO_LONG,
    HourlyBudget,
    StreamSeen,
    sample_outcome,
    sampled,
    shape_refusal,
    stream_sample,
    strip_token_ids,
    whole_body_ids,
    whole_sample,
)
from gateway.stream.ledger import StreamLedger
from gateway.stream.taps import LedgerTap

URL = "http://capture:8000"


def test_a_tenant_without_capture_is_never_sampled_whatever_the_draw():
    assert not any(sampled(None, URL, d / 100) for d in range(100))


def test_no_target_no_capture():
    assert not sampled(CaptureSpec(fraction=1.0), None, 0.0)
    assert not sampled(CaptureSpec(fraction=1.0), "", 0.0)


def test_fraction_is_the_share_of_draws_below_it():
    spec = CaptureSpec(fraction=0.25)
    draws = [i / 1000 for i in range(1000)]
    assert sum(sampled(spec, URL, d) for d in draws) == 250
    assert all(sampled(CaptureSpec(fraction=1.0), URL, d) for d in draws)
    assert not any(sampled(CaptureSpec(fraction=0.0), URL, d) for d in draws)


@pytest.mark.parametrize("body, endpoint", [
    ({"n": 2}, "chat"), ({"best_of": 3}, "completions"), ({"use_beam_search": True}, "completions"),
    ({"prompt": ["a", "b"]}, "completions"), ({"prompt": "x", "prompt_embeds": "AAAA"}, "completions"),
])
def test_requests_with_more_than_one_output_or_prompt_are_not_captured(body, endpoint):
    assert shape_refusal(body, endpoint) is not None


@pytest.mark.parametrize("body, endpoint", [
    ({"messages": [{"role": "user", "content": "hi"}], "n": 1}, "chat"), ({"prompt": "x"}, "completions"),
    ({"prompt": [1, 2, 3]}, "completions"), ({"prompt": [[1, 2, 3]]}, "completions"),
    ({"prompt": "x", "logprobs": 2, "presence_penalty": 0.5}, "completions"),
])
def test_one_prompt_one_output_can_be_captured(body, endpoint):
    assert shape_refusal(body, endpoint) is None


def test_hourly_budget_is_a_sliding_hour_per_tenant():
    b = HourlyBudget()
    assert all(b.take("a", 3, t) for t in (0.0, 10.0, 20.0))
    assert not b.has_room("a", 3, 30.0) and not b.take("a", 3, 30.0)
    assert b.take("b", 3, 30.0)  # another tenant's budget is its own
    assert not b.has_room("a", 3, HOUR_S - 0.5)  # the first capture is not an hour old yet: still counted
    assert b.has_room("a", 3, HOUR_S)  # ... an hour later it is not
    assert b.take("a", 3, HOUR_S) and not b.take("a", 3, HOUR_S + 1.0)
    assert b.used("a", 2 * HOUR_S + 30) == 0
    assert not HourlyBudget().has_room("a", 0, 0.0)  # max_per_hour 0: never


def test_sample_outcome_order():
    assert sample_outcome(10, 10, True, False) is None
    assert sample_outcome(11, 10, False, True) == TOO_LONG
    assert sample_outcome(5, 10, False, True) == DROPPED_BUDGET
    assert sample_outcome(5, 10, True, True) == DROPPED_QUEUE


def _body(chat: bool, with_ids: bool, finish="length", **kw) -> dict:
    return wire.completion_body(chat=chat, rid="r", created=1, model="m", text="ab", finish_reason=finish,
                                prompt_tokens=3, completion_tokens=2, token_ids=[7, 8] if with_ids else None,
                                prompt_token_ids=[1, 2, 3] if with_ids else None, **kw)


@pytest.mark.parametrize("chat", [True, False])
def test_whole_body_ids_and_sample(chat):
    obj = _body(chat, True)
    assert whole_body_ids(obj, chat) == ([1, 2, 3], [7, 8], "length")
    seen = whole_body_ids(obj, chat)
    assert whole_sample(seen, obj["usage"]) == ([1, 2, 3], [7, 8])
    assert whole_sample(seen, {**obj["usage"], "completion_tokens": 3}) is None  # ids disagree with usage
    assert whole_body_ids(_body(chat, False), chat) is None
    aborted = whole_body_ids(_body(chat, True, finish="abort"), chat)
    assert whole_sample(aborted, obj["usage"]) is None


@pytest.mark.parametrize("chat", [True, False])
def test_strip_leaves_out_what_a_replica_that_omits_unset_fields_never_sent(chat):
    """The sim replica (contract.wire) leaves unset fields out: the stripped body is byte-identical to the body without ids."""
    with_ids = json.dumps(_body(chat, True, spec=wire.spec_decoding([1, 2, 1e-5], 8, 2)), separators=(",", ":")).encode()
    without = json.dumps(_body(chat, False, spec=wire.spec_decoding([1, 2, 1e-5], 8, 2)), separators=(",", ":")).encode()
    assert strip_token_ids(with_ids) == without


def _vllm_like(chat: bool, ids: bool) -> bytes:
    """A body shaped as vLLM's `model_dump()` (every field, unset ones null), serialised as Starlette's JSONResponse does."""
    choice = {"index": 0, "text": "a \"token_ids\":[1] b", "logprobs": None, "finish_reason": "stop", "stop_reason": None,
              "token_ids": [5, 6] if ids else None, "prompt_logprobs": None, "prompt_token_ids": [1, 2] if ids else None,
              "routed_experts": None}
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": "é ,\"token_ids\":[9]"}, "logprobs": None,
                  "finish_reason": "stop", "stop_reason": None, "token_ids": [5, 6] if ids else None, "routed_experts": None}
    body = {"id": "x", "object": "o", "created": 1, "model": "m", "choices": [choice], "service_tier": None,
            "system_fingerprint": None, "usage": {"prompt_tokens": 2, "total_tokens": 4, "completion_tokens": 2}}
    if chat:
        body |= {"prompt_logprobs": None, "prompt_token_ids": [1, 2] if ids else None}
    body |= {"kv_transfer_params": None, "metrics": {"x": -9.5367431640625e-07}}
    return json.dumps(body, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


@pytest.mark.parametrize("chat", [True, False])
def test_strip_writes_null_where_vllm_writes_null_and_never_touches_text(chat):
    assert strip_token_ids(_vllm_like(chat, True)) == _vllm_like(chat, False)


def _sse(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _stream(chat: bool, finish: str = "stop") -> bytes:
    events = [wire.role_chunk("r", 1, "m", prompt_token_ids=[1, 2, 3])] if chat else []
    events.append(wire.content_chunk("r", 1, "m", "a", chat=chat, token_ids=[7],
                                     prompt_token_ids=None if chat else [1, 2, 3]))
    events.append(wire.content_chunk("r", 1, "m", "b", chat=chat, token_ids=[8], finish_reason=finish))
    events.append(wire.usage_chunk("r", 1, "m", 3, 2, chat=chat))
    return b"".join(map(_sse, events)) + wire.DONE


@pytest.mark.parametrize("chat", [True, False])
def test_stream_sample_reads_the_ledger_of_a_whole_stream(chat):
    ledger = StreamLedger()
    ledger.start_part("r1")
    tap = LedgerTap(False, True, chat, ledger, hold_errors=False)
    out = tap.feed(_stream(chat))
    assert b"token_ids" not in out  # stripped for the client
    seen = StreamSeen(tap, broken=False)
    usage = wire.usage(3, 2)
    assert stream_sample(seen, usage, continued=False) == ([1, 2, 3], [7, 8])
    assert stream_sample(seen, usage, continued=True) is None
    seen = StreamSeen(tap, broken=True)
    assert stream_sample(seen, usage, continued=False) is None


def test_stream_sample_needs_done_and_a_captured_finish():
    for stream, finish in ((_stream(False)[: -len(wire.DONE)], "stop"), (_stream(False, "abort"), "abort")):
        ledger = StreamLedger()
        ledger.start_part("r1")
        tap = LedgerTap(False, True, False, ledger, hold_errors=False)
        tap.feed(stream)
        assert stream_sample(StreamSeen(tap, broken=False), wire.usage(3, 2), False) is None


def test_ledger_tap_without_hold_forwards_an_engine_error_event_and_what_follows():
    ledger = StreamLedger()
    tap = LedgerTap(False, False, False, ledger, hold_errors=False)
    err = _sse(wire.error_body("engine failed", "InternalServerError", 500))
    out = tap.feed(_sse(wire.content_chunk("r", 1, "m", "a", chat=False, token_ids=[7])) + err + wire.DONE)
    # The engine's event is relayed in OpenAI's shape (message kept, code a string or null).
    relayed = _sse({"error": {"message": "engine failed", "type": "server_error", "param": None, "code": None}})
    assert relayed in out and err not in out
    assert out.endswith(wire.DONE) and tap.error is not None and tap.saw_done
