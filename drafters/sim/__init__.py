"""Simulated vLLM replicas (no GPU): engine model, discrete-event simulator, HTTP sim replica.

Everything here is a *simulation* driven by ``drafters.costmodel`` and
``drafters.acceptance``; see docs/drafters.md for what it reproduces and its limits.
"""

from .des import RequestRecord, SimReport, Simulation, TimelinePoint, run_closed_loop
from .engine import EngineConfig, EngineCounters, EngineRequest, ReplicaEngine, StepOutcome, lookup_k_table, vllm_batch_k_table
from .policy import Admission, BasePolicy, ClusterView, ModelOraclePolicy, Policy, ReplicaView, StaticPolicy
from .trace import (ClosedLoopSource, OpenLoopSource, RequestSampler, TenantSpec, TraceRequest,
                    piecewise_poisson_trace, poisson_trace)

__all__ = [
    "Simulation", "SimReport", "RequestRecord", "TimelinePoint", "run_closed_loop",
    "EngineConfig", "EngineCounters", "EngineRequest", "ReplicaEngine", "StepOutcome", "lookup_k_table",
    "vllm_batch_k_table", "Admission", "BasePolicy", "ClusterView", "ModelOraclePolicy", "Policy", "ReplicaView",
    "StaticPolicy", "ClosedLoopSource", "OpenLoopSource", "RequestSampler", "TenantSpec", "TraceRequest",
    "piecewise_poisson_trace", "poisson_trace",
]
