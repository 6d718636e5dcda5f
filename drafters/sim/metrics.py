"""The sim replica's Prometheus /metrics: vLLM's names, dcgm-exporter's GPU gauges, ``specgate_ext_info``.

Why a module of its own: what a sim replica exposes on /metrics is a contract
with the gateway and the controller (they scrape it exactly as they scrape a
real vLLM replica), and it is a translation of the engine's counters
(``counters.py``) into metric families -- no HTTP handling, no engine loop.

Families (labels ``model_name``, ``engine``): ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, the
``vllm:prompt_tokens`` / ``vllm:generation_tokens`` / ``vllm:num_preemptions``
/ ``vllm:request_success{finished_reason}`` counters, the
``vllm:spec_decode_*`` counters (speculative profiles only, as in vLLM), the
latency / iteration-token histograms (simulated seconds); dcgm-exporter GPU
gauges from the cost model (labels ``gpu``, ``modelName``, ``Hostname``); and
``specgate_ext_info{version,knobs,engine_fixes} 1`` with the knobs the specgate vLLM
extension would advertise for the replica's profile and the K=0 drafter skip
it would report (``ReplicaEngine.engine_fixes``), and the extension's
engine-timed step counters (``specgate_engine_step*_total{batch,tokens,drafting}``,
drafters/vllm_ext/step_timing.py), each simulated step in its cell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from contract.vllm_metrics import step_families

from .. import costmodel as cm
from ..vllm_ext.discovery import advertised_knobs

if TYPE_CHECKING:
    from .replica import SimReplica

SIM_VERSION = "0.1.0-sim"


class SimCollector:
    """Renders one ``SimReplica``'s state as vLLM / dcgm-exporter metric families on every scrape."""

    def __init__(self, sim: SimReplica):
        self.sim = sim

    def collect(self):
        sim, eng, s = self.sim, self.sim.engine, self.sim.settings
        labels = ["model_name", "engine"]
        lv = [s.model_name, s.engine_label]
        c = eng.counters

        def gauge(name, doc, value):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(lv, value)
            return g

        def counter(name, doc, value):
            m = CounterMetricFamily(name, doc, labels=labels)
            m.add_metric(lv, value)
            return m

        def hist(name, doc, h):
            m = HistogramMetricFamily(name, doc, labels=labels)
            m.add_metric(lv, h.cumulative(), h.sum)
            return m

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", eng.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", eng.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", eng.kv_usage)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", c.generation_tokens)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", c.num_preemptions)
        rs = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                 labels=labels + ["finished_reason"])
        for reason in ("stop", "length", "abort"):
            rs.add_metric(lv + [reason], c.request_success.get(reason, 0))
        yield rs
        if eng.profile.speculative:
            yield counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", c.num_drafts)
            yield counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", c.num_draft_tokens)
            yield counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", c.num_accepted_tokens)
            pp = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                     "Accepted tokens per draft position.", labels=labels + ["position"])
            for pos in range(eng.profile.num_speculative_tokens):
                pp.add_metric(lv + [str(pos)], float(c.accepted_per_pos[pos]))
            yield pp
        yield hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", c.iteration_tokens)
        yield hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", c.ttft)
        yield hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", c.itl)
        yield hist("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds.", c.tpot)
        yield hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", c.e2e)
        busy = sim.busy_fraction()
        gauges = cm.dcgm_gauges(eng.last_cost if busy > 0 else None, busy)
        dl = ["gpu", "modelName", "Hostname"]
        dv = ["0", f"NVIDIA {s.gpu.upper()} (simulated)", s.name]
        for name, value in gauges.items():
            g = GaugeMetricFamily(name, f"{name} (simulated from the cost model)", labels=dl)
            g.add_metric(dv, value)
            yield g
        yield from step_families(c.step_cells)
        info = GaugeMetricFamily("specgate_ext_info", "specgate vLLM extension (simulated replica).",
                                 labels=["version", "knobs", "engine_fixes"])
        prof = eng.profile
        knobs = advertised_knobs(prof.method if prof.speculative else None, prof.adaptive)
        info.add_metric([SIM_VERSION, ",".join(knobs), ",".join(sorted(eng.engine_fixes()))], 1.0)
        yield info


def sim_registry(sim: SimReplica) -> CollectorRegistry:
    """A fresh registry holding only ``sim``'s collector (one per app: replicas in one process never mix)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SimCollector(sim))
    return registry


__all__ = ["SIM_VERSION", "SimCollector", "sim_registry"]
