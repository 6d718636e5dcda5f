"""What `specgate load` observed, reduced to per-phase figures and time series.

Why a module of its own: the load tool's point is to show what the controller's switches *gained*
(throughput, latency, acceptance in each phase of the workload), and those numbers must be
exactly what the tool observed -- so the arithmetic lives here as pure functions over plain
request records, tested on hand-made records, while `specgate.load` does the I/O and
`specgate.report` the drawing.

Definitions (also printed under the table and in the report):

* output tok/s (phase, tenant): completion tokens *received* during the phase's window, divided
  by the window's length. A token's time is the arrival of the stream chunk that carried it
  (chunks carry `token_ids`, so the count per chunk is exact); the last phase's window runs on
  until the last response has finished, so no token goes uncounted.
* TTFT: send -> first chunk carrying a token. TPOT: (last token time - first token time) /
  (completion tokens - 1), per request (undefined for one-token responses). Latencies and
  speculation figures of a phase are over the requests *sent* during it.
* speculation: summed from each response's `metrics.speculative_decoding` (vLLM's
  `--per-request-spec-decode-metrics summary`, in a stream's final usage chunk); mean acceptance
  length = 1 + accepted / verification steps (vLLM's own definition), acceptance rate = accepted /
  drafted. Requests served by a replica without speculation carry no such metrics and count only
  in "spec reqs".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Sequence

from contract.telemetry import RequestSpecStats
from testbed.phases import Phase, phase_at
from testbed.stats import percentile  # the convention the benches share

ALL = "all"  # the row / series that sums every tenant


@dataclass(frozen=True)
class RequestRecord:
    """One request as the load tool saw it; times in seconds since the run's start."""

    tenant: str
    sent_s: float
    status: int | None  # HTTP status; None: the request failed in transport
    completion_tokens: int = 0
    token_times: tuple[tuple[float, int], ...] = ()  # (chunk arrival, tokens in that chunk)
    spec: RequestSpecStats | None = None  # read as the gateway reads it; None: no speculation summary
    replica: str | None = None  # x-specgate-replica
    error: str | None = None  # transport error or error event in the stream

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def first_token_s(self) -> float | None:
        return self.token_times[0][0] if self.token_times else None

    @property
    def last_token_s(self) -> float | None:
        return self.token_times[-1][0] if self.token_times else None

    @property
    def ttft_s(self) -> float | None:
        first = self.first_token_s
        return first - self.sent_s if self.ok and first is not None else None

    @property
    def tpot_s(self) -> float | None:
        return tpot(self.first_token_s, self.last_token_s, self.completion_tokens) if self.ok else None


def tpot(first_s: float | None, last_s: float | None, completion_tokens: int) -> float | None:
    """Time per output token after the first: (last - first) / (tokens - 1); None when undefined."""
    if first_s is None or last_s is None or completion_tokens < 2:
        return None
    return (last_s - first_s) / (completion_tokens - 1)


def chunk_tokens(chunk_times: Sequence[float], per_chunk: Sequence[int | None], completion_tokens: int
                 ) -> tuple[tuple[float, int], ...]:
    """(time, tokens) per chunk. Where a chunk's count is unknown (a replica that does not send
    `token_ids`), the response's `usage.completion_tokens` is spread evenly over its chunks:
    totals stay exact, only the timing inside one response is approximate."""
    if not chunk_times:
        return ()
    if all(n is not None for n in per_chunk) and len(per_chunk) == len(chunk_times):
        return tuple((t, int(n)) for t, n in zip(chunk_times, per_chunk))
    base, extra = divmod(max(completion_tokens, 0), len(chunk_times))
    return tuple((t, base + (1 if i < extra else 0)) for i, t in enumerate(chunk_times))


def tokens_between(records: Iterable[RequestRecord], start_s: float, end_s: float) -> int:
    """Completion tokens whose chunk arrived in [start_s, end_s)."""
    return sum(n for r in records for t, n in r.token_times if start_s <= t < end_s)


@dataclass(frozen=True)
class PhaseTenantStats:
    phase: Phase
    tenant: str  # or ALL
    sent: int
    ok: int
    tokens: int  # received in the phase's window
    window_s: float
    ttft_p50: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p99: float | None
    spec_requests: int  # ok requests that carried metrics.speculative_decoding
    steps: int
    drafted: int
    accepted: int

    @property
    def tok_s(self) -> float:
        return self.tokens / self.window_s if self.window_s > 0 else 0.0

    @property
    def mean_acceptance_length(self) -> float | None:
        """vLLM's definition: 1 + accepted draft tokens per verification step."""
        return 1.0 + self.accepted / self.steps if self.steps > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted > 0 else None


def _stats(phase: Phase, tenant: str, sent: list[RequestRecord], received: list[RequestRecord],
           window: tuple[float, float]) -> PhaseTenantStats:
    ok = [r for r in sent if r.ok]
    spec = [r.spec for r in ok if r.spec is not None]
    return PhaseTenantStats(
        phase=phase, tenant=tenant, sent=len(sent), ok=len(ok),
        tokens=tokens_between(received, *window), window_s=window[1] - window[0],
        ttft_p50=percentile((r.ttft_s for r in ok), 50), ttft_p99=percentile((r.ttft_s for r in ok), 99),
        tpot_p50=percentile((r.tpot_s for r in ok), 50), tpot_p99=percentile((r.tpot_s for r in ok), 99),
        spec_requests=len(spec), steps=sum(s.num_spec_steps or 0 for s in spec),
        drafted=sum(s.num_draft_tokens or 0 for s in spec), accepted=sum(s.num_accepted_draft_tokens or 0 for s in spec),
    )


def phase_windows(phases: Sequence[Phase], end_s: float) -> list[tuple[float, float]]:
    """Each phase's window for token counting; the last one runs to `end_s` (the drain) if later."""
    return [(p.start_s, max(p.end_s, end_s) if i == len(phases) - 1 else p.end_s) for i, p in enumerate(phases)]


def phase_stats(records: Sequence[RequestRecord], phases: Sequence[Phase], tenants: Sequence[str],
                end_s: float) -> list[PhaseTenantStats]:
    """One row per (phase, tenant) in the given order, plus an ALL row per phase (every record,
    including tenants not listed)."""
    rows = []
    for phase, window in zip(phases, phase_windows(phases, end_s)):
        in_phase = [r for r in records if phase_at(r.sent_s, phases) is phase]
        for tenant in tenants:
            rows.append(_stats(phase, tenant, [r for r in in_phase if r.tenant == tenant],
                               [r for r in records if r.tenant == tenant], window))
        rows.append(_stats(phase, ALL, in_phase, list(records), window))
    return rows


# ---------------------------------------------------------------- time series (for the report)


@dataclass(frozen=True)
class Series:
    """Per-bin values per tenant (and ALL for throughput); None where a bin has no data."""

    bin_s: float
    starts: list[float]
    tok_s: dict[str, list[float]]
    ttft_p50: dict[str, list[float | None]]
    ttft_p99: dict[str, list[float | None]]
    tpot_p50: dict[str, list[float | None]]
    acceptance_length: dict[str, list[float | None]]


def bin_width(duration_s: float, target_bins: int = 48) -> float:
    """A readable bin: about `target_bins` over the run, at least half a second."""
    return max(0.5, round(duration_s / target_bins * 2) / 2)


def time_series(records: Sequence[RequestRecord], tenants: Sequence[str], end_s: float, bin_s: float) -> Series:
    """Throughput by token arrival; TTFT/TPOT by send time; acceptance length by completion time
    (accepted / steps summed over the requests that finished in the bin)."""
    n = max(1, math.ceil(end_s / bin_s))
    starts = [i * bin_s for i in range(n)]

    def idx(t: float) -> int:
        return min(max(int(t // bin_s), 0), n - 1)

    tok = {t: [0.0] * n for t in (*tenants, ALL)}
    lat: dict[str, list[list[float]]] = {t: [[] for _ in range(n)] for t in tenants}
    tp: dict[str, list[list[float]]] = {t: [[] for _ in range(n)] for t in tenants}
    acc: dict[str, list[list[int]]] = {t: [[0, 0] for _ in range(n)] for t in tenants}  # [accepted, steps]
    for r in records:
        for t, k in r.token_times:
            tok[ALL][idx(t)] += k / bin_s
            if r.tenant in tok:
                tok[r.tenant][idx(t)] += k / bin_s
        if r.tenant not in lat or not r.ok:
            continue
        if r.ttft_s is not None:
            lat[r.tenant][idx(r.sent_s)].append(r.ttft_s)
        if r.tpot_s is not None:
            tp[r.tenant][idx(r.sent_s)].append(r.tpot_s)
        if r.spec is not None and r.last_token_s is not None:
            cell = acc[r.tenant][idx(r.last_token_s)]
            cell[0] += r.spec.num_accepted_draft_tokens or 0
            cell[1] += r.spec.num_spec_steps or 0
    return Series(
        bin_s=bin_s, starts=starts, tok_s=tok,
        ttft_p50={t: [percentile(c, 50) for c in cells] for t, cells in lat.items()},
        ttft_p99={t: [percentile(c, 99) for c in cells] for t, cells in lat.items()},
        tpot_p50={t: [percentile(c, 50) for c in cells] for t, cells in tp.items()},
        acceptance_length={t: [1.0 + a / s if s > 0 else None for a, s in cells] for t, cells in acc.items()},
    )


# ---------------------------------------------------------------- policy over time


def at_seconds(at: Any) -> float | None:
    """A decision's `at` as epoch seconds: the store keeps epoch seconds, the admin API may answer
    ISO-8601 UTC (`2026-12-01T08:30:12.345Z`); anything else is None."""
    if isinstance(at, bool):
        return None
    if isinstance(at, (int, float)):
        return float(at)
    if isinstance(at, str):
        try:
            return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class PolicyPoint:
    at_s: float
    enabled: bool
    max_draft: int | None  # None with enabled = no cap (the replica's full block)


def policy_timeline(initial: dict[str, dict], switches: Sequence[dict], t0_wall: float
                    ) -> dict[str, list[PolicyPoint]]:
    """Each tenant's policy as steps: the policy in force at the start (admin API), then every
    published change from the decision history (`at` is wall-clock; `t0_wall` is the run's start)."""
    out: dict[str, list[PolicyPoint]] = {}
    for tenant, p in initial.items():
        out[tenant] = [PolicyPoint(0.0, bool(p.get("enabled", True)), p.get("max_draft"))]
    for d in sorted(switches, key=lambda d: at_seconds(d.get("at")) or 0.0):
        p = d.get("policy") or {}
        at = at_seconds(d.get("at"))
        if at is None:
            continue
        out.setdefault(str(d.get("tenant")), []).append(
            PolicyPoint(max(at - t0_wall, 0.0), bool(p.get("enabled", True)), p.get("max_draft")))
    return out


def draft_cap(point: PolicyPoint, full: int) -> int:
    """The cap as a number for plotting: 0 = off, `full` = no cap."""
    if not point.enabled:
        return 0
    return full if point.max_draft is None else int(point.max_draft)


# ---------------------------------------------------------------- text table


def _ms(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x * 1000:.{digits}f}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


TABLE_HEADER = (f"  {'tenant':<8} {'ok/sent':>9} {'out tok/s':>9} {'TTFT p50/p99 ms':>16} {'TPOT p50/p99 ms':>16} "
                f"{'spec reqs':>9} {'mean acc len':>12} {'drafted':>8} {'accepted':>8}")

LEGEND = ("  out tok/s: tokens received in the phase / its length; TTFT, TPOT (= (last - first token time) / "
          "(tokens - 1)) and speculation: requests sent in the phase; spec reqs: ok responses carrying "
          "metrics.speculative_decoding; mean acc len = 1 + accepted / verification steps")


def format_row(s: PhaseTenantStats) -> str:
    return (f"  {s.tenant:<8} {f'{s.ok}/{s.sent}':>9} {s.tok_s:>9.1f} "
            f"{_ms(s.ttft_p50) + '/' + _ms(s.ttft_p99):>16} {_ms(s.tpot_p50, 1) + '/' + _ms(s.tpot_p99, 1):>16} "
            f"{s.spec_requests:>9} {_num(s.mean_acceptance_length, '.2f'):>12} {s.drafted:>8} {s.accepted:>8}")


def format_phase_header(phase: Phase, window: tuple[float, float]) -> str:
    return (f"phase {phase.label}: t={phase.start_s:.1f}-{phase.end_s:.1f}s, offered {phase.rate:g} req/s"
            + (f" (tokens counted to t={window[1]:.1f}s, the drain)" if window[1] > phase.end_s else ""))


def format_tables(rows: Sequence[PhaseTenantStats], phases: Sequence[Phase], end_s: float,
                  switch_lines: dict[int, list[str]] | None = None) -> list[str]:
    """The per-phase, per-tenant table, with the phase's policy changes under it."""
    lines = []
    for phase, window in zip(phases, phase_windows(phases, end_s)):
        lines.append(format_phase_header(phase, window))
        lines.append(TABLE_HEADER)
        lines.extend(format_row(s) for s in rows if s.phase is phase)
        changes = (switch_lines or {}).get(phase.index, [])
        lines.append(f"  policy changes in this phase: {len(changes) or 'none'}")
        lines.extend("  " + c for c in changes)
    lines.append(LEGEND)
    return lines
