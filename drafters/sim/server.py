"""HTTP sim replica: the simulated engine behind vLLM's OpenAI-compatible surface, in real time.

Why: the gateway, controller, demo stack and their tests need replicas that
*behave* like vLLM + DSpark on an H100/H200 (latency, batching, acceptance,
/metrics) on a 2-core CPU box.  This server is a SIMULATION: no model runs;
the text it returns is plainly synthetic ("[specgate-sim] lorem ipsum ...").

Surface (what the gateway and controller use):

* ``POST /v1/chat/completions`` and ``POST /v1/completions``, streaming or not.
  Streaming sends one SSE chunk per engine step carrying that step's tokens
  (accepted drafts + bonus), then a final chunk with ``finish_reason``, then
  -- with ``stream_options.include_usage`` -- a usage chunk carrying
  ``usage`` and ``metrics.speculative_decoding``; then ``data: [DONE]``.
  Non-streaming responses carry ``usage`` and ``metrics`` directly.
  ``metrics.speculative_decoding`` (vLLM ``--per-request-spec-decode-metrics
  summary``) is present only on speculative profiles, as in vLLM.
* ``vllm_xargs``: ``specgate_max_draft`` (int >= 0),
  ``specgate_min_confidence`` (float in [0, 1]) and ``specgate_max_batch``
  (int >= 0: no drafting in steps of more requests) change drafting exactly as the
  specgate vLLM extension does (parsed by ``drafters.vllm_ext.knobs``; invalid
  values are logged and ignored; the confidence floor only on ``-av``
  profiles, the only ones with confidences -- advertised knobs follow
  ``drafters.vllm_ext.discovery.advertised_knobs``).  ``specgate_workload`` / ``sim_workload``
  (or header ``x-sim-workload``, or a ``[workload=NAME]`` marker in the
  prompt) picks the acceptance preset the request follows; unknown names fall
  back to the replica's default workload.
* ``GET /v1/models``, ``GET /health``, ``GET /load``, ``GET /metrics``
  (vLLM names and labels ``model_name``, ``engine``; dcgm-exporter GPU gauges
  from the cost model; ``specgate_ext_info{version,knobs} 1``: knobs
  ``max_draft,max_batch,min_confidence`` on ``-av`` profiles, ``max_draft,max_batch`` on other
  DSpark profiles, empty on ``off``).
* Errors are OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``.

Cost: one asyncio task drives the batch (one engine step per iteration, a
sleep for the step's modelled duration x ``time_scale``); request handlers
only wait on an event.  Latency histograms on /metrics are in simulated
seconds (= wall seconds when ``time_scale`` is 1).

Usage::

    from drafters.sim.server import SimReplicaSettings, create_app, run_sim_replica
    app = create_app(SimReplicaSettings(profile="dspark-b8", gpu="h200", model="qwen3-8b"))
    # uvicorn.run(app, host="127.0.0.1", port=8001)   or:
    run_sim_replica(SimReplicaSettings(profile="off"), host="127.0.0.1", port=8002)
    # several replicas in one process / event loop:
    # asyncio.run(serve_sim_replicas([(SimReplicaSettings(profile="dspark-b8", name="a"), 8001),
    #                                 (SimReplicaSettings(profile="off", name="b"), 8002)]))
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
import uuid
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .. import acceptance as acc
from .. import costmodel as cm
from ..vllm_ext.discovery import advertised_knobs
from ..vllm_ext.knobs import parse_knobs
from .engine import EngineConfig, EngineRequest, ReplicaEngine

logger = logging.getLogger("specgate.sim")

SIM_VERSION = "0.1.0-sim"
_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do", "eiusmod",
          "tempor", "incididunt", "ut", "labore", "et", "dolore", "magna", "aliqua")
_MARKER = "[specgate-sim]"
_WORKLOAD_RE = re.compile(r"\[workload=([A-Za-z0-9_\-]+)\]")


@dataclass
class SimReplicaSettings:
    """One sim replica.  ``time_scale`` = wall seconds per simulated second (2.0 = twice as slow)."""

    profile: str = "off"
    gpu: str = "h200"
    model: str = "qwen3-8b"
    served_model_name: str | None = None  # default: the model's HF id, e.g. Qwen/Qwen3-8B
    time_scale: float = 1.0
    default_workload: str = "chat"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    default_output_mean: float = 200.0  # natural output length (lognormal) when the client does not pin it
    seed: int = 0
    engine_label: str = "0"
    name: str = "sim"

    def engine_config(self) -> EngineConfig:
        return EngineConfig(gpu=self.gpu, model=self.model, profile=self.profile, max_num_seqs=self.max_num_seqs,
                            max_num_batched_tokens=self.max_num_batched_tokens, seed=self.seed, name=self.name)

    @property
    def model_name(self) -> str:
        return self.served_model_name or cm.get_model(self.model).hf_id


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param


def error_response(status: int, message: str, type_: str = "BadRequestError", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": status}}, status)


class _Stream:
    """Per-request hand-off between the engine loop and the HTTP handler."""

    __slots__ = ("pending", "event", "done", "emitted")

    def __init__(self) -> None:
        self.pending = 0
        self.event = asyncio.Event()
        self.done = False
        self.emitted = 0


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
                st: _Stream = req.user
                st.pending += n
                st.emitted += n
                st.event.set()
            for req in out.finished:
                self._finish_stream(req)

    @staticmethod
    def _finish_stream(req: EngineRequest) -> None:
        st: _Stream = req.user
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
                            arrival_s=self.now(), user=_Stream(), natural_stop=natural_stop,
                            max_batch=knobs.max_batch)
        self.engine.add_request(req, req.arrival_s)
        self._wake.set()
        return req

    def abort(self, req: EngineRequest) -> None:
        if not req.finished:
            self.engine.abort(req.id, self.now())

    # ---------------------------------------------------------------- helpers
    def resolve_workload(self, xargs: dict | None, header: str | None, text: str) -> str:
        cands = []
        if isinstance(xargs, dict):
            cands += [xargs.get("specgate_workload"), xargs.get("sim_workload")]
        cands.append(header)
        m = _WORKLOAD_RE.search(text or "")
        if m:
            cands.append(m.group(1))
        for c in cands:
            if isinstance(c, str) and c:
                try:
                    acc.get_preset(c, self.engine.config.drafter_family)
                    return c.lower()
                except KeyError:
                    logger.warning("unknown workload %r; using %r", c, self.settings.default_workload)
        return self.settings.default_workload

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


# -------------------------------------------------------------------- text


def synthetic_text(start: int, n: int) -> str:
    """Tokens [start, start+n) of the synthetic output (one word per token; the first is a marker)."""
    words = []
    for i in range(start, start + n):
        words.append(_MARKER if i == 0 else " " + _WORDS[i % len(_WORDS)])
    return "".join(words)


def count_prompt_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ApiError(400, f"messages[{i}] must be an object with a 'role'", param="messages")
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for j, p in enumerate(content):
                text = p.get("text", "") if isinstance(p, dict) else None
                if not isinstance(text, str):
                    raise ApiError(400, f"messages[{i}].content[{j}].text must be a string", param="messages")
                parts.append(text)
        elif content is not None:
            raise ApiError(400, f"messages[{i}].content must be a string or a list of parts", param="messages")
    return "\n".join(parts)


def _int_field(body: dict, name: str, minimum: int = 1) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ApiError(400, f"'{name}' must be an integer >= {minimum}", param=name)
    return v


# -------------------------------------------------------------------- metrics


class _SimCollector:
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
        info = GaugeMetricFamily("specgate_ext_info", "specgate vLLM extension (simulated replica).",
                                 labels=["version", "knobs"])
        prof = eng.profile
        knobs = advertised_knobs("dspark" if prof.speculative else None, prof.adaptive)
        info.add_metric([SIM_VERSION, ",".join(knobs)], 1.0)
        yield info


# -------------------------------------------------------------------- app


def create_app(settings: SimReplicaSettings | None = None) -> FastAPI:
    """FastAPI app of one sim replica; the engine loop runs inside the app's lifespan."""
    settings = settings or SimReplicaSettings()
    sim = SimReplica(settings)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SimCollector(sim))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await sim.start()
        try:
            yield
        finally:
            await sim.stop()

    app = FastAPI(title=f"specgate sim replica ({settings.profile})", lifespan=lifespan)
    app.state.sim = sim

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.type, exc.param)

    @app.exception_handler(Exception)
    async def _any_error(request: Request, exc: Exception):  # never a traceback to the client
        logger.exception("sim replica error")
        return error_response(500, f"internal error: {type(exc).__name__}", "InternalServerError")

    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        typ = "NotFoundError" if exc.status_code == 404 else "BadRequestError"
        return error_response(exc.status_code, str(exc.detail), typ)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return error_response(400, str(exc.errors()[:1]), "BadRequestError")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/load")
    async def load() -> dict:
        return {"server_load": sim.in_flight}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": settings.model_name, "object": "model", "created": sim.created, "owned_by": "vllm",
            "root": settings.model_name, "parent": None, "max_model_len": settings.max_model_len,
            "permission": [],
        }]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    async def _body(request: Request) -> dict:
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ApiError(400, "request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != settings.model_name:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if body.get("n", 1) != 1:
            raise ApiError(400, "only n=1 is supported by the sim replica", param="n")
        so = body.get("stream_options")
        if so is not None and not isinstance(so, dict):
            raise ApiError(400, "'stream_options' must be an object", param="stream_options")
        if so is not None and not body.get("stream"):
            raise ApiError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
        xargs = body.get("vllm_xargs")
        if xargs is not None and not isinstance(xargs, dict):
            raise ApiError(400, "'vllm_xargs' must be an object", param="vllm_xargs")
        return body

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await _body(request)
        text = _messages_text(body.get("messages"))
        max_tokens = _int_field(body, "max_completion_tokens") or _int_field(body, "max_tokens")
        return await _generate(request, body, text, count_prompt_tokens(text) + 4 * len(body["messages"]),
                               max_tokens, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            text, ptoks = prompt, count_prompt_tokens(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            text, ptoks = "", len(prompt)
        else:
            raise ApiError(400, "'prompt' must be a non-empty string or a list of token ids", param="prompt")
        return await _generate(request, body, text, ptoks, _int_field(body, "max_tokens"), chat=False)

    async def _generate(request: Request, body: dict, text: str, prompt_tokens: int, max_tokens: int | None,
                        chat: bool):
        if prompt_tokens >= settings.max_model_len:
            raise ApiError(400, f"This model's maximum context length is {settings.max_model_len} tokens; "
                                f"the prompt has {prompt_tokens}.", param="messages" if chat else "prompt")
        if max_tokens is not None:
            max_tokens = min(max_tokens, settings.max_model_len - prompt_tokens)
        xargs = body.get("vllm_xargs")
        workload = sim.resolve_workload(xargs, request.headers.get("x-sim-workload"), text)
        n_out, natural = sim.natural_output_len(max_tokens, bool(body.get("ignore_eos")))
        req = sim.submit(prompt_tokens, n_out, workload, xargs, natural)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        finish_reason = "stop" if natural else "length"
        stream = bool(body.get("stream"))
        so = body.get("stream_options") or {}
        if not stream:
            sim.in_flight += 1
            try:
                await _wait_done(req)
            finally:
                sim.in_flight -= 1
                sim.abort(req)
            return JSONResponse(_final_body(rid, created, req, chat, finish_reason))
        return StreamingResponse(
            _sse(rid, created, req, chat, finish_reason, bool(so.get("include_usage")),
                 bool(so.get("continuous_usage_stats"))),
            media_type="text/event-stream", headers={"cache-control": "no-cache"})

    async def _wait_done(req: EngineRequest) -> None:
        st: _Stream = req.user
        while not st.done:
            await st.event.wait()
            st.event.clear()

    def _usage(req: EngineRequest, completion: int | None = None) -> dict:
        ct = req.output if completion is None else completion
        return {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + ct, "completion_tokens": ct,
                "prompt_tokens_details": None}

    def _metrics(req: EngineRequest) -> dict | None:
        return {"speculative_decoding": req.spec_summary()} if sim.engine.profile.speculative else None

    def _final_body(rid: str, created: int, req: EngineRequest, chat: bool, finish_reason: str) -> dict:
        content = synthetic_text(0, req.output)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": []},
                      "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish_reason,
                      "stop_reason": None}
        out = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
               "model": settings.model_name, "choices": [choice], "usage": _usage(req)}
        m = _metrics(req)
        if m is not None:
            out["metrics"] = m
        return out

    async def _sse(rid: str, created: int, req: EngineRequest, chat: bool, finish_reason: str, include_usage: bool,
                   continuous: bool) -> AsyncIterator[bytes]:
        # Counted here, not before the response object is built: a client that
        # leaves before the body is first iterated never runs this generator's
        # `finally`, and the count would leak.
        sim.in_flight += 1
        st: _Stream = req.user
        obj = "chat.completion.chunk" if chat else "text_completion"
        model = settings.model_name

        def chunk(choice: dict | None, usage: dict | None = None, extra: dict | None = None) -> bytes:
            d = {"id": rid, "object": obj, "created": created, "model": model,
                 "choices": [choice] if choice is not None else []}
            if usage is not None:
                d["usage"] = usage
            if extra:
                d.update(extra)
            return b"data: " + orjson.dumps(d) + b"\n\n"

        def piece(text: str, fr: str | None) -> dict:
            if chat:
                return {"index": 0, "delta": {"content": text} if fr is None else {}, "logprobs": None,
                        "finish_reason": fr}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": fr, "stop_reason": None}

        sent = 0
        first = True
        try:
            while True:
                await st.event.wait()
                st.event.clear()
                if first and chat:  # like vLLM: the role chunk goes out with the first engine output
                    yield chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}, _usage(req, 0) if continuous else None)
                first = False
                n = st.pending
                st.pending = 0
                if n:
                    yield chunk(piece(synthetic_text(sent, n), None), _usage(req, sent + n) if continuous else None)
                    sent += n
                if st.done:
                    break
            yield chunk(piece("", finish_reason), _usage(req) if continuous else None)
            if include_usage:
                m = _metrics(req)
                yield chunk(None, _usage(req), {"metrics": m} if m is not None else None)
            yield b"data: [DONE]\n\n"
        finally:
            sim.in_flight -= 1
            sim.abort(req)  # no-op when finished; frees the slot when the client went away

    return app


def run_sim_replica(settings: SimReplicaSettings, host: str = "127.0.0.1", port: int = 8000,
                    log_level: str = "warning") -> None:
    """Blocking: serve one sim replica with uvicorn (used by ``specgate sim-replica``)."""
    import uvicorn

    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, access_log=False)


async def serve_sim_replicas(replicas: list[tuple[SimReplicaSettings, int]], host: str = "127.0.0.1",
                             log_level: str = "warning") -> None:
    """Serve several sim replicas from ONE process and event loop (cheapest on a small box).

    Each replica gets its own app, engine and port; returns when all servers stop (Ctrl-C / cancel).
    """
    import uvicorn

    servers = [uvicorn.Server(uvicorn.Config(create_app(s), host=host, port=port, log_level=log_level,
                                             access_log=False)) for s, port in replicas]
    await asyncio.gather(*(srv.serve() for srv in servers))


__all__ = ["SimReplicaSettings", "SimReplica", "create_app", "run_sim_replica", "serve_sim_replicas",
           "synthetic_text", "SIM_VERSION"]
