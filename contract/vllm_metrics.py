"""Parse a replica's Prometheus exposition (vLLM's `/metrics`, plus the
simulator's dcgm-style gauges and the specgate extension's info gauge) into
one snapshot that both the gateway (load for routing) and the controller
(acceptance, regime) consume.

Parsing uses prometheus_client's own text parser; values are summed across
the `engine` label (data-parallel engines behind one API server) and across
`model_name` (one served model per replica in practice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class StepCell:
    """Sums over the engine steps of one cell, as the specgate extension times them in the
    worker (drafters/vllm_ext/step_timing.py): cells are (batch, tokens, drafting), batch and
    forward tokens bucketed to the next power of two, drafting 1 when the step's draft length
    K > 0 (the drafter runs after it; where no K=0 skip is in force it runs at K=0 too, and the
    controller reads such a cell as drafting: controller.estimators.passes_run). sums / steps
    are exact per-step means, idle time excluded."""

    steps: float = 0.0
    seconds: float = 0.0
    requests: float = 0.0  # scheduled requests, summed over the steps
    tokens: float = 0.0  # forward tokens (prefill, decode and drafts)
    draft_tokens: float = 0.0  # drafted tokens verified

    def minus(self, old: "StepCell") -> "StepCell":
        return StepCell(*(max(0.0, a - b) for a, b in zip(self.values(), old.values())))

    def plus(self, other: "StepCell") -> "StepCell":
        return StepCell(*(a + b for a, b in zip(self.values(), other.values())))

    def values(self) -> tuple[float, ...]:
        return self.steps, self.seconds, self.requests, self.tokens, self.draft_tokens


# The extension's counter families on a replica's /metrics -> the StepCell field each sums
# (one definition: the plugin exports these names, the snapshot reads them).
ENGINE_STEP_FAMILIES: dict[str, str] = {
    "specgate_engine_steps": "steps",
    "specgate_engine_step_seconds": "seconds",
    "specgate_engine_step_requests": "requests",
    "specgate_engine_step_tokens": "tokens",
    "specgate_engine_step_draft_tokens": "draft_tokens",
}
STEP_CELL_LABELS = ("batch", "tokens", "drafting")
StepCellKey = tuple[int, int, int]


def power_of_two_bound(n: float) -> int:
    """PURE: the smallest power of two >= n (1 for n <= 1): a cell's bound."""
    return 1 if n <= 1 else 1 << math.ceil(math.log2(n) - 1e-12)


def step_cell_key(requests: int, tokens: int, drafting: bool) -> StepCellKey:
    """PURE: the cell a step of `requests` scheduled requests and `tokens` forward tokens falls in."""
    return power_of_two_bound(requests), power_of_two_bound(tokens), int(drafting)


def add_step(cells: dict[StepCellKey, StepCell], requests: int, tokens: int, draft_tokens: int, drafting: bool,
             seconds: float) -> None:
    """Count one engine step into its cell (the plugin's table and the simulator keep cells alike)."""
    key = step_cell_key(requests, tokens, drafting)
    old = cells.get(key) or StepCell()
    cells[key] = StepCell(old.steps + 1, old.seconds + seconds, old.requests + requests, old.tokens + tokens,
                          old.draft_tokens + draft_tokens)


ENGINE_STEP_HELP: dict[str, str] = {
    "steps": "engine steps, by cell (batch and forward tokens bucketed to powers of two; "
             "drafting: the step's draft length K > 0)",
    "seconds": "seconds those steps took (from the previous busy step's end, else their schedule(), "
               "to the end of update_from_output())",
    "requests": "scheduled requests summed over those steps",
    "tokens": "forward tokens (prefill, decode and drafts) summed over those steps",
    "draft_tokens": "drafted tokens verified, summed over those steps",
}  # fmt: skip


def step_families(cells: dict[StepCellKey, StepCell]) -> list:
    """The exposition of `cells` as counter families (what a replica with the extension serves,
    and the simulated replicas too); none while there is no cell."""
    from prometheus_client.core import CounterMetricFamily

    if not cells:
        return []
    families = {attr: CounterMetricFamily(name, ENGINE_STEP_HELP[attr], labels=list(STEP_CELL_LABELS))
                for name, attr in ENGINE_STEP_FAMILIES.items()}  # fmt: skip
    for key, cell in sorted(cells.items()):
        labels = [str(v) for v in key]
        for attr, family in families.items():
            family.add_metric(labels, float(getattr(cell, attr)))
    return list(families.values())


@dataclass
class VllmMetricsSnapshot:
    num_requests_running: float = 0.0
    num_requests_waiting: float = 0.0
    kv_cache_usage_perc: float = 0.0
    # Counters (cumulative; consumers differentiate them).
    spec_num_drafts: float | None = None
    spec_num_draft_tokens: float | None = None
    spec_num_accepted_tokens: float | None = None
    spec_accepted_per_pos: dict[int, float] = field(default_factory=dict)
    iteration_tokens_sum: float | None = None  # sum of tokens over all engine steps
    iteration_tokens_count: float | None = None  # number of engine steps
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    # Prompt tokens the engine computed itself (`prompt_tokens_by_source`,
    # source=local_compute: prefix-cache hits excluded); None when not exported.
    prompt_tokens_computed: float | None = None
    # GPU gauges (dcgm-exporter names), when the endpoint carries them.
    gpu_util: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    # specgate vLLM extension discovery.
    ext_version: str | None = None
    ext_knobs: frozenset[str] = frozenset()
    # Fixes of vLLM itself the plugin put in force in the replica's workers
    # (drafters/vllm_ext/expand_fix.py): which replicas run on a patched engine.
    # None: the replica reports no engine fixes at all (no label: a simulated or older replica).
    ext_engine_fixes: frozenset[str] | None = None
    # Engine steps timed by the extension, per (batch, tokens, drafting) cell (cumulative);
    # empty on a replica without it.
    engine_steps: dict[StepCellKey, StepCell] = field(default_factory=dict)
    model_names: frozenset[str] = frozenset()

    @property
    def supports_knobs(self) -> bool:
        return "max_draft" in self.ext_knobs


_GAUGES = {
    "vllm:num_requests_running": "num_requests_running",
    "vllm:num_requests_waiting": "num_requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage_perc",  # pre-0.10 name
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
}
_COUNTERS = {
    "vllm:spec_decode_num_drafts": "spec_num_drafts",
    "vllm:spec_decode_num_draft_tokens": "spec_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "spec_num_accepted_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prompt_tokens": "prompt_tokens",
}


# Every family the snapshot reads (prefixes of their sample names).
_READ = tuple(
    sorted(
        {
            *_GAUGES,
            *_COUNTERS,
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "vllm:prompt_tokens_by_source",
            "vllm:iteration_tokens_total",
            "specgate_ext_info",
            *ENGINE_STEP_FAMILIES,
        }
    )
)


def relevant_lines(text: str) -> str:
    """The exposition cut down to the families the snapshot reads (with
    their HELP/TYPE lines), histogram buckets dropped (only `_sum`/`_count`
    are read). Why: a replica's /metrics is mostly latency histograms, and
    parsing all of it on the gateway's event loop every scrape, for every
    replica, showed as ~25 ms/s of stalls in the soak's /health latency."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) > 2 and parts[2].startswith(_READ):
                out.append(line)
        elif line.startswith(_READ) and not line.split("{", 1)[0].split(" ", 1)[0].endswith("_bucket"):
            out.append(line)
    out.append("")
    return "\n".join(out)


def parse_vllm_metrics(text: str) -> VllmMetricsSnapshot:
    snap = VllmMetricsSnapshot()
    models: set[str] = set()
    sums: dict[str, float] = {}
    cells: dict[StepCellKey, dict[str, float]] = {}
    text = relevant_lines(text)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if not math.isfinite(value):
                continue  # NaN/Inf are legal in the exposition (DCGM emits them); never let one poison an estimate
            if "model_name" in labels:
                models.add(labels["model_name"])
            if family.name in _GAUGES and name == family.name:
                attr = _GAUGES[family.name]
                sums[attr] = sums.get(attr, 0.0) + value
            elif family.name in _COUNTERS and name == family.name + "_total":
                attr = _COUNTERS[family.name]
                sums[attr] = sums.get(attr, 0.0) + value
            elif family.name == "vllm:spec_decode_num_accepted_tokens_per_pos" and name.endswith("_total"):
                pos = int(labels.get("position", 0))
                snap.spec_accepted_per_pos[pos] = snap.spec_accepted_per_pos.get(pos, 0.0) + value
            elif family.name == "vllm:prompt_tokens_by_source" and name.endswith("_total"):
                if labels.get("source") == "local_compute":
                    sums["prompt_tokens_computed"] = sums.get("prompt_tokens_computed", 0.0) + value
            elif family.name == "vllm:iteration_tokens_total":
                if name.endswith("_sum"):
                    sums["iteration_tokens_sum"] = sums.get("iteration_tokens_sum", 0.0) + value
                elif name.endswith("_count"):
                    sums["iteration_tokens_count"] = sums.get("iteration_tokens_count", 0.0) + value
            elif family.name in ENGINE_STEP_FAMILIES and name == family.name + "_total":
                try:
                    key = tuple(int(labels[k]) for k in STEP_CELL_LABELS)
                except (KeyError, ValueError):
                    continue
                cell = cells.setdefault(key, {})  # type: ignore[arg-type]
                attr = ENGINE_STEP_FAMILIES[family.name]
                cell[attr] = cell.get(attr, 0.0) + value
            elif family.name == "specgate_ext_info" and name == "specgate_ext_info" and value > 0:
                snap.ext_version = labels.get("version")
                snap.ext_knobs = frozenset(k for k in labels.get("knobs", "").split(",") if k)
                if "engine_fixes" in labels:
                    snap.ext_engine_fixes = frozenset(f for f in labels["engine_fixes"].split(",") if f)
    # GPU gauges are averaged over devices rather than summed.
    for attr in ("gpu_util", "sm_active", "tensor_active", "dram_active"):
        if attr in sums:
            count = _count_samples(text, attr)
            sums[attr] = sums[attr] / max(count, 1)
    for attr, value in sums.items():
        setattr(snap, attr, value)
    snap.engine_steps = {key: StepCell(**fields) for key, fields in cells.items()}
    snap.model_names = frozenset(models)
    return snap


def _count_samples(text: str, attr: str) -> int:
    name = next(k for k, v in _GAUGES.items() if v == attr)
    return sum(1 for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


async def fetch_metrics(client: httpx.AsyncClient, url: str, timeout_s: float = 2.0) -> VllmMetricsSnapshot | None:
    """GET `<url>/metrics` and parse it; None when unreachable or unparsable."""
    try:
        resp = await client.get(url.rstrip("/") + "/metrics", timeout=timeout_s)
        if resp.status_code != 200:
            return None
        return parse_vllm_metrics(resp.text)
    except (httpx.HTTPError, ValueError):
        return None
