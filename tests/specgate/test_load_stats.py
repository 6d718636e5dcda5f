"""`specgate load`'s per-phase figures on hand-made request records: percentiles, TPOT, tok/s by
token arrival, acceptance summed the way vLLM defines it, the policy timeline -- and the stream
parsing that turns what the gateway sends into those records."""

from __future__ import annotations

import pytest

from contract.telemetry import RequestSpecStats
from specgate.load import (
    LoadConfig,
    StreamState,
    parse_stream_line,
    phases,
    record_of,
    switch_phase,
)
from specgate.load_stats import (
    ALL,
    PolicyPoint,
    RequestRecord,
    at_seconds,
    bin_width,
    chunk_tokens,
    draft_cap,
    format_tables,
    phase_stats,
    policy_timeline,
    time_series,
    tokens_between,
    tpot,
)

from testbed.phases import Phase, lay_out  # noqa: E402

PHASES = lay_out([Phase("light", 10.0, rate=1.0), Phase("heavy", 10.0, rate=10.0)])
LIGHT, HEAVY = PHASES


def rec(tenant, sent, chunks, tokens=None, spec=None, status=200, error=None):
    tokens = sum(n for _, n in chunks) if tokens is None else tokens
    return RequestRecord(tenant=tenant, sent_s=sent, status=status, completion_tokens=tokens,
                         token_times=tuple(chunks), spec=spec, error=error)


def test_tpot_is_the_time_between_first_and_last_token_per_later_token():
    assert tpot(1.0, 2.0, 11) == pytest.approx(0.1)
    assert tpot(1.0, 1.0, 1) is None  # one token: no time per *next* token
    assert tpot(None, 2.0, 5) is None
    r = rec("chat", 0.5, [(1.0, 1), (1.5, 4), (2.0, 6)])  # 11 tokens in three chunks
    assert r.ttft_s == pytest.approx(0.5) and r.tpot_s == pytest.approx(0.1)
    failed = rec("chat", 0.5, [(1.0, 3)], status=503)
    assert failed.ttft_s is None and failed.tpot_s is None and not failed.ok


def test_chunk_token_counts_are_exact_when_known_and_spread_when_not():
    assert chunk_tokens([1.0, 2.0], [3, 5], 8) == ((1.0, 3), (2.0, 5))
    spread = chunk_tokens([1.0, 2.0, 3.0], [None, None, None], 8)
    assert [n for _, n in spread] == [3, 3, 2] and sum(n for _, n in spread) == 8
    assert chunk_tokens([], [], 5) == ()


def test_tok_s_counts_tokens_by_arrival_in_each_window_and_the_drain_in_the_last():
    records = [
        rec("chat", 9.0, [(9.5, 10), (10.5, 30)]),  # sent in light, half its tokens arrive in heavy
        rec("code", 12.0, [(12.5, 40), (24.0, 20)]),  # its last chunk arrives in the drain
    ]
    assert tokens_between(records, 0.0, 10.0) == 10 and tokens_between(records, 10.0, 20.0) == 70
    rows = {(s.phase.index, s.tenant): s for s in phase_stats(records, PHASES, ["chat", "code"], end_s=25.0)}
    assert rows[(1, "chat")].tok_s == pytest.approx(1.0)  # 10 tokens / 10 s
    assert rows[(2, "chat")].tok_s == pytest.approx(30 / 15)  # last window: 10 s .. 25 s (drain)
    assert rows[(2, "code")].tokens == 60 and rows[(2, ALL)].tokens == 90
    # Latencies belong to the phase the request was sent in.
    assert rows[(1, "chat")].sent == 1 and rows[(2, "chat")].sent == 0
    assert rows[(2, "chat")].ttft_p50 is None


def test_phase_rows_cover_every_tenant_with_latency_percentiles():
    records = [rec("chat", 1.0 + i, [(1.1 + i + j * 0.01, 1) for j in range(11)]) for i in range(5)]
    records.append(rec("chat", 7.0, [], status=429))
    rows = phase_stats(records, PHASES, ["chat", "batch"], end_s=20.0)
    assert [(s.phase.index, s.tenant) for s in rows] == [
        (1, "chat"), (1, "batch"), (1, ALL), (2, "chat"), (2, "batch"), (2, ALL)]
    chat = rows[0]
    assert (chat.sent, chat.ok) == (6, 5)
    assert chat.ttft_p50 == pytest.approx(0.1) and chat.ttft_p99 == pytest.approx(0.1)
    assert chat.tpot_p50 == pytest.approx(0.01)
    assert rows[1].sent == 0 and rows[1].tok_s == 0.0


def test_acceptance_adds_counts_across_requests_as_vllm_defines_it():
    a = rec("code", 1.0, [(1.2, 20)],
            spec=RequestSpecStats(num_spec_steps=10, num_draft_tokens=80, num_accepted_draft_tokens=30))
    b = rec("code", 2.0, [(2.2, 10)],
            spec=RequestSpecStats(num_spec_steps=5, num_draft_tokens=40, num_accepted_draft_tokens=0))
    off = rec("code", 3.0, [(3.2, 10)])  # an `off` replica sends no speculative metrics
    s = phase_stats([a, b, off], PHASES, ["code"], end_s=20.0)[0]
    assert (s.spec_requests, s.steps, s.drafted, s.accepted) == (2, 15, 120, 30)
    assert s.mean_acceptance_length == pytest.approx(1 + 30 / 15)  # not the mean of 4.0 and 1.0
    assert s.acceptance_rate == pytest.approx(0.25)
    empty = phase_stats([off], PHASES, ["code"], end_s=20.0)[0]
    assert empty.mean_acceptance_length is None and empty.acceptance_rate is None


def test_time_series_bins_tokens_latency_and_acceptance():
    records = [
        rec("chat", 0.2, [(0.5, 4), (1.5, 6)],
            spec=RequestSpecStats(num_spec_steps=5, num_draft_tokens=20, num_accepted_draft_tokens=5)),
        rec("code", 1.1, [(1.6, 10)]),
    ]
    s = time_series(records, ["chat", "code"], end_s=2.0, bin_s=1.0)
    assert s.starts == [0.0, 1.0]
    assert s.tok_s["chat"] == [4.0, 6.0] and s.tok_s[ALL] == [4.0, 16.0]
    assert s.ttft_p50["chat"] == [pytest.approx(0.3), None] and s.ttft_p50["code"] == [None, pytest.approx(0.5)]
    assert s.acceptance_length["chat"] == [None, 2.0]  # filed at completion (t=1.5)
    assert bin_width(120) == 2.5 and bin_width(6) == 0.5


def test_policy_timeline_starts_from_the_policy_in_force_and_follows_changes():
    t0 = 1_000_000.0
    initial = {"chat": {"enabled": True, "max_draft": None}, "*": {"enabled": True}}
    switches = [
        {"tenant": "chat", "at": t0 + 30, "policy": {"enabled": True, "max_draft": 4}},
        {"tenant": "chat", "at": "1970-01-12T13:46:50.000Z", "policy": {"enabled": False, "max_draft": 0}},  # t0+10
    ]
    tl = policy_timeline(initial, switches, t0)
    assert tl["chat"] == [PolicyPoint(0.0, True, None), PolicyPoint(10.0, False, 0), PolicyPoint(30.0, True, 4)]
    assert [draft_cap(p, full=8) for p in tl["chat"]] == [8, 0, 4]
    assert tl["*"] == [PolicyPoint(0.0, True, None)]


def test_decision_times_are_read_as_epoch_seconds_or_iso_utc():
    assert at_seconds(12.5) == 12.5
    assert at_seconds("1970-01-01T00:00:12.500Z") == pytest.approx(12.5)
    assert at_seconds("soon") is None and at_seconds(None) is None and at_seconds(True) is None


def test_phases_number_the_step_pattern_and_switches_fall_into_them():
    ps = phases(LoadConfig(rps=30, duration_s=90, light_fraction=0.1))
    assert [(p.label, p.start_s, p.end_s, p.rate) for p in ps] == [
        ("1 light", 0.0, 30.0, 3.0), ("2 heavy", 30.0, 60.0, 30.0), ("3 light", 60.0, 90.0, 3.0)]
    assert [p.label for p in phases(LoadConfig(pattern="constant", duration_s=5))] == ["1 constant"]
    assert [switch_phase({"at": 100.0 + t}, 100.0, ps) for t in (-5, 10, 45, 89, 120)] == [1, 1, 2, 3, 3]


def test_printed_table_has_a_row_per_tenant_and_phase_and_the_switches():
    records = [rec("chat", 1.0, [(1.5, 5)]), rec("code", 12.0, [(12.5, 5)])]
    rows = phase_stats(records, PHASES, ["chat", "code"], end_s=20.0)
    lines = format_tables(rows, PHASES, 20.0, {2: ["[t= +12.0s] tenant chat speculation OFF <- k full->0"]})
    text = "\n".join(lines)
    assert "phase 1 light" in text and "phase 2 heavy" in text
    assert sum(1 for line in lines if line.strip().startswith(("chat ", "code ", "all "))) == 6
    assert "policy changes in this phase: none" in text and "k full->0" in text


def _sse(obj) -> str:
    import json

    return "data: " + json.dumps(obj)


def test_a_gateway_stream_becomes_a_record():
    st = StreamState()
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": [1, 2]}
    for t, line in [
        (0.30, _sse(role)),
        (0.30, ""),
        (0.31, _sse({"choices": [{"index": 0, "delta": {"content": "Hi"}, "token_ids": [5, 6, 7]}]})),
        (0.40, _sse({"choices": [{"index": 0, "delta": {"content": "!"}, "token_ids": [8], "finish_reason": "stop"}]})),
        (0.41, _sse({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6},
                     "metrics": {"speculative_decoding": {"mean_acceptance_length": 2.0, "num_spec_steps": 2,
                                                          "num_draft_tokens": 16, "num_accepted_draft_tokens": 2}}})),
        (0.42, "data: [DONE]"),
    ]:
        parse_stream_line(line, t, st)
    r = record_of("chat", 0.1, 200, st, replica="sim-dspark-b8-1")
    assert r.ok and r.completion_tokens == 4 and r.token_times == ((0.31, 3), (0.40, 1))
    assert r.ttft_s == pytest.approx(0.21) and r.tpot_s == pytest.approx(0.03)
    assert (r.spec.num_spec_steps, r.spec.num_draft_tokens, r.spec.num_accepted_draft_tokens) == (2, 16, 2)
    assert r.replica == "sim-dspark-b8-1"


def test_a_stream_without_metrics_or_ids_and_a_broken_one():
    st = StreamState()
    parse_stream_line(_sse({"choices": [{"delta": {"content": "a"}}]}), 1.0, st)
    parse_stream_line(_sse({"choices": [{"delta": {"content": "b"}}]}), 2.0, st)
    parse_stream_line(_sse({"choices": [], "usage": {"completion_tokens": 6}}), 2.0, st)
    parse_stream_line("data: [DONE]", 2.0, st)
    r = record_of("batch", 0.0, 200, st)
    assert r.spec is None and r.token_times == ((1.0, 3), (2.0, 3))
    broken = StreamState()
    parse_stream_line(_sse({"error": {"message": "replica went away", "code": 502}}), 1.0, broken)
    assert record_of("batch", 0.0, 200, broken).error == "replica went away"
    cut = StreamState()
    parse_stream_line(_sse({"choices": [{"delta": {"content": "a"}, "token_ids": [1]}]}), 1.0, cut)
    assert not record_of("batch", 0.0, 200, cut).ok  # no usage chunk, no [DONE]: ended early
