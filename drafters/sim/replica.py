"""One sim replica's real-time driver: its settings, its engine loop, and the per-request hand-off.

Why a module of its own: the HTTP surface (``server.py``) and the engine
(``engine.py``) meet here.  ``SimReplica`` owns a ``ReplicaEngine`` and one
asyncio task that runs it in real time (one engine step per iteration, then a
sleep until the step's modelled end x ``time_scale``); request handlers only
submit a request and wait on its ``RequestStream``, which the loop fills with
each step's emitted tokens and the request's acceptance histogram.  Keeping
this apart from the FastAPI app lets the app stay a thin wire-format layer and
lets the driver be read (and tested through ``app.state.sim``) on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque

import numpy as np
from pydantic import field_validator

from .. import costmodel as cm
from contract.knobs import parse_knobs
from contract.settings import SimSettings
from .engine import EngineConfig, EngineRequest, ReplicaEngine
from .engine_types import simulated_profile
from .requests import resolve_workload

logger = logging.getLogger("specgate.sim")


class SimReplicaSettings(SimSettings):
    """One sim replica: the `sim` section of the settings tree (shared
    defaults: GPU, model, time scale, engine limits) plus what is this
    replica's own. ``time_scale`` = wall seconds per simulated second."""

    profile: str = "off"
    served_model_name: str | None = None  # default: the model's HF id, e.g. Qwen/Qwen3-8B
    engine_label: str = "0"
    name: str = "sim"

    @field_validator("profile", mode="before")
    @classmethod
    def _profile(cls, value):
        if value is False:  # YAML reads an unquoted `off` as false
            return "off"
        return simulated_profile(value).label  # unknown or unsimulated labels are refused here

    def engine_config(self) -> EngineConfig:
        return EngineConfig(gpu=self.gpu, model=self.model, profile=self.profile, max_num_seqs=self.max_num_seqs,
                            max_num_batched_tokens=self.max_num_batched_tokens, seed=self.seed, name=self.name)

    @property
    def model_name(self) -> str:
        return self.served_model_name or cm.get_model(self.model).hf_id


class RequestStream:
    """Per-request hand-off between the engine loop and the HTTP handler, plus the
    request's acceptance histogram (vLLM's ``acceptance_histogram``)."""

    __slots__ = ("pending", "event", "done", "emitted", "hist", "steps", "accepted")

    def __init__(self, num_spec_tokens: int) -> None:
        self.pending = 0
        self.event = asyncio.Event()
        self.done = False
        self.emitted = 0
        self.hist = [0] * (num_spec_tokens + 1)
        self.steps = 0
        self.accepted = 0

    def observe(self, req: EngineRequest) -> None:
        """Record the verify step(s) the engine ran for ``req`` since the last call."""
        d = req.spec_steps - self.steps
        if d <= 0:
            return
        a = req.accepted_tokens - self.accepted
        self.steps, self.accepted = req.spec_steps, req.accepted_tokens
        if a >= len(self.hist):
            self.hist += [0] * (a + 1 - len(self.hist))
        self.hist[a] += 1
        self.hist[0] += d - 1  # one engine step is at most one verify step per request; kept consistent anyway


class SimReplica:
    """Engine + real-time driver + metrics for one sim replica (``app.state.sim``)."""

    def __init__(self, settings: SimReplicaSettings):
        self.settings = settings
        self.engine = ReplicaEngine(settings.engine_config())
        self.rng = np.random.default_rng(settings.seed + 17)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._t0 = time.monotonic()
        self._busy: deque[tuple[float, float]] = deque()  # (end_sim_s, duration_s) of recent steps
        self._ids = itertools.count(1)
        self.in_flight = 0
        self.created = int(time.time())

    # ---------------------------------------------------------------- clock
    def now(self) -> float:
        """Simulated seconds since start."""
        return (time.monotonic() - self._t0) / self.settings.time_scale

    # ---------------------------------------------------------------- loop
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"sim-engine-{self.settings.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
            self._task = None

    async def _run(self) -> None:
        scale = self.settings.time_scale
        while True:
            if not self.engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            start = self.now()
            try:
                out = self.engine.step(start)
            except Exception:  # never let one bad step kill the replica loop
                logger.exception("sim engine step failed; dropping the running batch")
                for r in list(self.engine.running) + list(self.engine.waiting):
                    self.engine.abort(r.id, start)
                    self._finish_stream(r)
                continue
            if out.batch == 0:
                await asyncio.sleep(0.001 * scale)
                continue
            self._busy.append((out.end_s, out.duration_s))
            while self._busy and self._busy[0][0] < start - 2.0:  # keep ~2 s for the GPU_UTIL window
                self._busy.popleft()
            # Sleep until the step's modelled end (absolute deadline: loop overhead does not accumulate).
            delay = out.end_s * scale - (time.monotonic() - self._t0)
            if delay > 0:
                await asyncio.sleep(delay)
            for req, n in out.emissions:
                st: RequestStream = req.user
                st.observe(req)
                st.pending += n
                st.emitted += n
                st.event.set()
            for req in out.finished:
                self._finish_stream(req)

    @staticmethod
    def _finish_stream(req: EngineRequest) -> None:
        st: RequestStream = req.user
        if st is not None:
            st.done = True
            st.event.set()

    def submit(self, prompt_tokens: int, max_tokens: int, workload: str, knobs_xargs: dict | None,
               natural_stop: bool = False) -> EngineRequest:
        knobs = parse_knobs(knobs_xargs)
        for err in knobs.errors:
            logger.warning("ignoring invalid knob: %s", err)
        if knobs.min_confidence is not None and not self.engine.profile.adaptive:
            logger.warning("ignoring specgate_min_confidence on profile %s: no confidences without adaptive "
                           "verification", self.engine.profile.label)
        req = EngineRequest(f"sim-{next(self._ids)}", prompt_tokens, max_tokens, workload,
                            max_draft=knobs.max_draft, min_confidence=knobs.min_confidence,
                            arrival_s=self.now(), user=RequestStream(self.engine.profile.num_speculative_tokens),
                            natural_stop=natural_stop,
                            max_batch=knobs.max_batch, schedule=knobs.schedule)
        self.engine.add_request(req, req.arrival_s)
        self._wake.set()
        return req

    def abort(self, req: EngineRequest) -> None:
        if not req.finished:
            self.engine.abort(req.id, self.now())

    # ---------------------------------------------------------------- helpers
    def resolve_workload(self, xargs: dict | None, header: str | None, text: str) -> str:
        return resolve_workload(xargs, header, text, self.engine.config.drafter_family, self.settings.default_workload)
    def natural_output_len(self, max_tokens: int | None, ignore_eos: bool) -> tuple[int, bool]:
        """(tokens to generate, stopped naturally?)."""
        cap = max_tokens if max_tokens is not None else self.settings.max_model_len
        if ignore_eos and max_tokens is not None:
            return max_tokens, False
        mean = self.settings.default_output_mean
        natural = int(max(1, round(self.rng.lognormal(np.log(mean) - 0.125, 0.5))))
        if natural < cap:
            return natural, True
        return cap, False

    def busy_fraction(self, window_s: float = 1.0) -> float:
        now = self.now()
        while self._busy and self._busy[0][0] < now - window_s:
            self._busy.popleft()
        return min(1.0, sum(d for _, d in self._busy) / window_s)


__all__ = ["SimReplicaSettings", "SimReplica", "RequestStream"]
