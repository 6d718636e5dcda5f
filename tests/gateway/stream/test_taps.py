"""The relay's taps on recorded vLLM 0.32 streams: what the client is sent
of each read (the ids and usage chunk the gateway injected stripped), and
the ledger they keep."""

from __future__ import annotations

import orjson
import pytest

from gateway.stream import taps
from gateway.stream.ledger import StreamLedger
from gateway.stream.taps import LedgerTap


def sse(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_ledger_tap_records_ids_and_strips_them_for_the_client():
    led = StreamLedger()
    tap = LedgerTap(strip_usage=True, strip_ids=True, chat=True, ledger=led)
    role = {"id": "c1", "object": "chat.completion.chunk", "created": 5, "model": "m", "prompt_token_ids": [1, 2],
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]}
    tok = {"id": "c1", "object": "chat.completion.chunk", "created": 5, "model": "m",
           "choices": [{"index": 0, "delta": {"content": " hi"}, "logprobs": None, "finish_reason": None, "token_ids": [42]}]}
    empty = {"id": "c1", "object": "chat.completion.chunk", "created": 5, "model": "m",
             "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": None, "token_ids": [43]}]}
    usage = {"id": "c1", "object": "chat.completion.chunk", "created": 5, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}}
    raw = sse(role) + sse(tok) + sse(empty) + sse(usage) + b"data: [DONE]\n\n"
    out = tap.feed(raw[:37]) + tap.feed(raw[37:])
    events = [e for e in out.split(b"\n\n") if e]
    assert [orjson.loads(e[6:]) for e in events[:-1]] == [
        {**{k: v for k, v in role.items() if k != "prompt_token_ids"}},
        {**tok, "choices": [{k: v for k, v in tok["choices"][0].items() if k != "token_ids"}]},
    ]  # the empty delta existed only for its ids; the usage chunk was asked for by the gateway
    assert events[-1] == b"data: [DONE]" and tap.saw_done
    assert tap.ledger_so_far() is led
    assert (led.id, led.created, led.model, led.prompt_ids, led.sent_ids, led.sent_text) == ("c1", 5, "m", [1, 2], [42, 43], " hi")
    assert tap.usage == usage["usage"]


# Events as vLLM 0.32 (CPU) wrote them with return_token_ids (recorded from a
# real server): the role chunk, token chunks (an escaped control character,
# non-ASCII text, an escaped quote), the final chunk, usage.
VLLM_CHAT = [
    b'data: {"id":"chatcmpl-9fd3","object":"chat.completion.chunk","created":1796184802,"model":"tiny-qwen3","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,501,201],"prompt_text":null}',
    b'data: {"id":"chatcmpl-9fd3","object":"chat.completion.chunk","created":1796184802,"model":"tiny-qwen3","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":null,"token_ids":[258]}]}',
    b'data: {"id":"chatcmpl-9fd3","object":"chat.completion.chunk","created":1796184802,"model":"tiny-qwen3","choices":[{"index":0,"delta":{"content":"\xef\xbf\xbd_\xc3\xa9"},"logprobs":null,"finish_reason":null,"token_ids":[65,66]}]}',
    b'data: {"id":"chatcmpl-9fd3","object":"chat.completion.chunk","created":1796184802,"model":"tiny-qwen3","choices":[{"index":0,"delta":{"content":"a\\u0006\\\\n"},"logprobs":null,"finish_reason":null,"token_ids":[22]}]}',
    b'data: {"id":"chatcmpl-9fd3","object":"chat.completion.chunk","created":1796184802,"model":"tiny-qwen3","choices":[{"index":0,"delta":{"content":"say \\"hi\\""},"logprobs":null,"finish_reason":null,"token_ids":[23]}]}',
    b'data: {"id":"chatcmpl-9fd3","object":"chat.completion.chunk","created":1796184802,"model":"tiny-qwen3","choices":[{"index":0,"delta":{"content":"\\u0006"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[197]}]}',
    b'data: {"id":"chatcmpl-9fd3","object":"chat.completion.chunk","created":1796184802,"model":"tiny-qwen3","choices":[],"usage":{"prompt_tokens":3,"total_tokens":8,"completion_tokens":5},"system_fingerprint":"vllm-0.32.0-62fcfad7"}',
    b"data: [DONE]",
]
VLLM_COMPLETIONS = [
    b'data: {"id":"cmpl-9b6c","object":"text_completion","created":1796184765,"model":"tiny-qwen3","choices":[{"index":0,"text":" user","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[74,308,535,259],"token_ids":[503]}]}',
    b'data: {"id":"cmpl-9b6c","object":"text_completion","created":1796184765,"model":"tiny-qwen3","choices":[{"index":0,"text":"World","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":[598]}]}',
    b'data: {"id":"cmpl-9b6c","object":"text_completion","created":1796184765,"model":"tiny-qwen3","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":[228,229]}]}',
    b'data: {"id":"cmpl-9b6c","object":"text_completion","created":1796184765,"model":"tiny-qwen3","choices":[{"index":0,"text":"\xef\xbf\xbdgh","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":[290]}]}',
    b'data: {"id":"cmpl-9b6c","object":"text_completion","created":1796184765,"model":"tiny-qwen3","choices":[],"usage":{"prompt_tokens":4,"total_tokens":9,"completion_tokens":5},"system_fingerprint":"vllm-0.32.0-62fcfad7"}',
    b"data: [DONE]",
]


def _client_event(event: bytes) -> bytes | None:
    """What the client gets of one recorded event (the parser's answer): ids
    popped and re-serialised, the gateway's usage chunk dropped."""
    if event == b"data: [DONE]":
        return event
    obj = orjson.loads(event[6:])
    if obj["choices"] == []:
        return None
    obj.pop("prompt_token_ids", None)
    obj["choices"][0].pop("prompt_token_ids", None)
    obj["choices"][0].pop("token_ids", None)
    return b"data: " + orjson.dumps(obj)


def _reads(raw: bytes, how: str) -> list[bytes]:
    if how == "per event":
        return [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    if how == "whole":
        return [raw]
    if how == "tokens in one read":  # what a busy gateway reads: several token chunks at once
        events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
        return [events[0], b"".join(events[1:-3]), *events[-3:]]
    return [raw[i:i + 97] for i in range(0, len(raw), 97)]


@pytest.mark.parametrize("how", ["per event", "tokens in one read", "97-byte reads", "whole"])
@pytest.mark.parametrize("chat,events", [(True, VLLM_CHAT), (False, VLLM_COMPLETIONS)], ids=["chat", "completions"])
@pytest.mark.parametrize("strip_ids", [True, False])
def test_ledger_tap_relays_and_records_vllm_streams_as_parsing_each_event_would(monkeypatch, chat, events, strip_ids, how):
    raw = b"".join(e + b"\n\n" for e in events)
    parsed = [0]
    real_payload = taps.payload

    def counting_payload(event):
        parsed[0] += 1
        return real_payload(event)

    monkeypatch.setattr(taps, "payload", counting_payload)
    led = StreamLedger()
    tap = LedgerTap(strip_usage=True, strip_ids=strip_ids, chat=chat, ledger=led)
    out = b"".join(tap.feed(r) for r in _reads(raw, how))
    parsed_while_relaying = parsed[0]

    if strip_ids:
        expected = [c for c in map(_client_event, events) if c is not None]
    else:
        expected = [e for e in events if b'"choices":[]' not in e]
    assert [e for e in out.split(b"\n\n") if e] == expected
    assert tap.saw_done and tap.usage == orjson.loads(events[-2][6:])["usage"] and tap.events == len(events)
    choices = [orjson.loads(e[6:]) for e in events[:-2]]
    first = choices[0] if chat else choices[0]["choices"][0]
    settled = tap.ledger_so_far()
    assert settled is led
    assert led.id == choices[0]["id"] and led.prompt_ids == first["prompt_token_ids"]
    assert led.sent_ids == [i for c in choices for i in c["choices"][0].get("token_ids", [])]
    assert led.sent_text == "".join((c["choices"][0]["delta"].get("content") if chat else c["choices"][0]["text"]) for c in choices)
    assert led.finish_reason == "length" and led.why_not() is None
    # Only the first chunk (the prompt's ids), usage and [DONE] were parsed to relay
    # them; the token chunks, the last included, were cut off their bytes, however read.
    # (With the ids kept, a first chunk read alone has nothing to cut: relayed as it is.)
    assert parsed_while_relaying == 3 if strip_ids else 2 <= parsed_while_relaying <= 3
    assert tap.ledger_so_far().sent_ids == led.sent_ids  # settling twice records nothing twice


def test_ledger_tap_keeps_a_bounded_backlog_of_unparsed_events():
    head = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[7],"token_ids":[1]}]}\n\n'
    tok = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"b","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":[2]}]}\n\n'
    tap = LedgerTap(strip_usage=False, strip_ids=True, chat=False, ledger=StreamLedger())
    tap.feed(head)
    n = 3 * taps.MAX_UNREAD_BYTES // len(tok)
    for _ in range(n):
        assert tap.feed(tok) == tok.replace(b',"prompt_token_ids":null,"token_ids":[2]', b"")
        assert tap._unread_bytes <= taps.MAX_UNREAD_BYTES
    assert len(tap.ledger.sent_ids) > n // 2  # settled in batches along the way
    assert tap.ledger_so_far().sent_ids == [1] + [2] * n and tap.ledger.sent_text == "a" + "b" * n


@pytest.mark.parametrize("read", [
    # two choices: the ids of the first are not at the event's end (the parser strips
    # the first choice's only: a stream of n > 1 is never continued)
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"token_ids":[1]},{"index":1,"delta":{"content":"b"},"logprobs":null,"finish_reason":null,"token_ids":[2]}]}\n\n',
    # ids withheld (null): nothing to cut, the event is forwarded as the parser leaves it
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n',
    # an event spread over two data lines
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},\ndata: "logprobs":null,"finish_reason":null,"token_ids":[1]}]}\n\n',
])
def test_reads_the_byte_path_cannot_cut_exactly_go_through_the_parser(read):
    parser = LedgerTap(strip_usage=False, strip_ids=True, chat=True, ledger=StreamLedger())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(taps, "cut_token_ids", lambda *args: None)  # every event parsed
        expected = parser.feed(read)
    assert expected != read or b'"token_ids":null' in read  # the parser did change it (or had nothing to cut)
    tap = LedgerTap(strip_usage=False, strip_ids=True, chat=True, ledger=StreamLedger())
    assert tap.feed(read) == expected
    assert tap.ledger_so_far().sent_text == parser.ledger_so_far().sent_text == "a"


_CHAT_TOKENS = b"".join(e + b"\n\n" for e in VLLM_CHAT[1:6])
_TEXT_TOKENS = b"".join(e + b"\n\n" for e in VLLM_COMPLETIONS[1:4])


@pytest.mark.parametrize("odd", [
    b'data: {"id":"c","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[9]}]}\n\n',  # dropped
    b'data: {"id":"c","choices":[{"index":0,"delta":null,"logprobs":null,"finish_reason":null,"token_ids":[9]}]}\n\n',
    b'data: {"error":{"message":"engine died","code":500}}\n\n',
    b'data: {"error":{"message":"engine died","code":500},"prompt_token_ids":[4]}\n\n',  # read as a first chunk
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":1}}\n\n',
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null,"token_ids":[9]}],"prompt_token_ids":[4]}\n\n',
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null,"token_ids": [9]}]}\n\n',
    b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}\n\n',
    (b'data: {"id":"c","prompt_token_ids":null,"choices":[{"index":0,"delta":{"content":"x"},"text":"x","logprobs":null,'
     b'"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":[9]}]}\n\n'),
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"data: {[DONE] \\"usage\\""},"logprobs":null,"finish_reason":null,"token_ids":[9]}]}\n\n',
    b": a comment line\n\n",
    b'data:{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null,"token_ids":[9]}]}\n\n',
    b"\n\n",  # an empty event
    b'event: token\ndata: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null,"token_ids":[9]}]}\n\n',
    b"data: [DONE]\n\n",
], ids=["empty delta", "null delta", "error", "error with prompt ids", "usage in a chunk", "prompt ids", "spaced ids", "usage chunk",
        "prompt ids elsewhere", "markers in text", "comment", "no space",
        "empty event", "event field", "done"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("strip_ids", [True, False])
@pytest.mark.parametrize("hold_errors", [True, False])
def test_an_odd_event_among_token_chunks_gets_what_parsing_every_event_gives(odd, chat, strip_ids, hold_errors):
    """However a read mixes token chunks and other events, the one-pass cut
    forwards and counts exactly what the parser does event by event."""
    tokens = _CHAT_TOKENS if chat else _TEXT_TOKENS
    read = tokens + odd + tokens

    def relay(tap, reads):
        return b"".join(tap.feed(r) for r in reads), tap

    one_per_read = [e + b"\n\n" for e in read.split(b"\n\n") if e]
    if odd == b"\n\n":  # the split above loses the empty event: read it on its own
        one_per_read.append(odd)
    for reads in ([read[:1000], read[1000:]], [odd + tokens, tokens], one_per_read):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(taps, "cut_token_ids", lambda *args: None)
            expected, parser = relay(LedgerTap(False, strip_ids, chat, StreamLedger(), hold_errors), reads)
        out, tap = relay(LedgerTap(False, strip_ids, chat, StreamLedger(), hold_errors), reads)
        assert out == expected
        assert (tap.events, tap.error, tap.usage, tap.saw_done) == (parser.events, parser.error, parser.usage, parser.saw_done)
        assert tap.ledger_so_far().sent_ids == parser.ledger_so_far().sent_ids
    assert taps.cut_token_ids(tokens, chat, strip_ids)[1] == tokens.count(b"\n\n")  # token chunks alone take the cut


def test_ledger_tap_notes_an_engine_error_event_instead_of_forwarding_it():
    tap = LedgerTap(strip_usage=False, strip_ids=False, chat=False, ledger=StreamLedger())
    assert tap.feed(sse({"error": {"message": "engine died", "code": 500}})) == b""
    assert tap.error["error"]["message"] == "engine died"


@pytest.mark.parametrize("hold_errors", [True, False])
def test_the_ledger_ends_where_a_held_engine_error_ended_the_stream(hold_errors):
    error = b'data: {"error":{"message":"engine died","code":500}}\n\n'
    first, token, late = VLLM_COMPLETIONS[0] + b"\n\n", VLLM_COMPLETIONS[1] + b"\n\n", VLLM_COMPLETIONS[2] + b"\n\n"
    tap = LedgerTap(strip_usage=False, strip_ids=True, chat=False, ledger=StreamLedger(), hold_errors=hold_errors)
    out = tap.feed(first + token + error + late) + tap.feed(late)
    openai_error = b'data: {"error":{"message":"engine died","type":"server_error","param":null,"code":null}}\n\n'
    assert tap.error is not None and (openai_error in out) is not hold_errors and error not in out
    assert tap.ledger_so_far().sent_ids == ([503, 598] if hold_errors else [503, 598, 228, 229, 228, 229])


# An engine's in-stream error as vLLM writes it, in both layouts it has used.
VLLM_STREAM_ERRORS = [
    {"error": {"object": "error", "message": "engine overloaded", "type": "InternalServerError", "param": None, "code": 500}},
    {"error": {"message": "bad logits", "type": "BadRequestError", "param": "logit_bias", "code": 400}},
]
OPENAI_STREAM_ERRORS = [
    {"error": {"message": "engine overloaded", "type": "server_error", "param": None, "code": None}},
    {"error": {"message": "bad logits", "type": "invalid_request_error", "param": "logit_bias", "code": None}},
]


@pytest.mark.parametrize("make_tap", [
    lambda: taps.StreamTap(strip_usage=False),
    lambda: LedgerTap(strip_usage=False, strip_ids=True, chat=True, ledger=StreamLedger(), hold_errors=False),
], ids=["StreamTap", "LedgerTap-not-held"])
@pytest.mark.parametrize("engine,expected", list(zip(VLLM_STREAM_ERRORS, OPENAI_STREAM_ERRORS)))
def test_engine_error_event_relayed_in_openai_shape(make_tap, engine, expected):
    tap = make_tap()
    tok = {"id": "c1", "object": "chat.completion.chunk", "created": 5, "model": "m",
           "choices": [{"index": 0, "delta": {"content": " hi"}, "logprobs": None, "finish_reason": None}]}
    out = tap.feed(sse(tok)) + tap.feed(sse(engine) + b"data: [DONE]\n\n")
    events = [e for e in out.split(b"\n\n") if e]
    assert orjson.loads(events[0][6:]) == tok  # choice chunks untouched
    assert orjson.loads(events[1][6:]) == expected
    assert events[2] == b"data: [DONE]"


def test_stream_tap_leaves_text_mentioning_error_alone():
    tap = taps.StreamTap(strip_usage=False)
    tok = {"id": "c1", "choices": [{"index": 0, "delta": {"content": '{"error": 1}'}}]}
    assert tap.feed(sse(tok)) == sse(tok)
