"""HTTP sim replica: the simulated engine behind vLLM's OpenAI-compatible surface, in real time.

Why: the gateway, controller, demo stack and their tests need replicas that
*behave* like vLLM + DSpark or ngram speculation on an H100/H200 (latency, batching, acceptance,
/metrics) on a 2-core CPU box.  This server is a SIMULATION: no model runs;
the text it returns is plainly synthetic ("[specgate-sim] lorem ipsum ...").

Surface (what the gateway and controller use):

* ``POST /v1/chat/completions`` and ``POST /v1/completions``, streaming or not,
  in vLLM's wire format as built by ``contract.wire``.  Streaming sends one SSE
  chunk per engine step carrying that step's tokens (accepted drafts + bonus;
  the last one carries ``finish_reason``), then -- with
  ``stream_options.include_usage`` -- the usage chunk carrying ``usage`` and
  ``metrics.speculative_decoding``; then ``data: [DONE]``.  Non-streaming
  responses carry ``usage`` and ``metrics`` directly.
  ``metrics.speculative_decoding`` (vLLM ``--per-request-spec-decode-metrics
  summary``, acceptance histogram included) is present only on speculative
  profiles, as in vLLM.
* Token ids, as vLLM handles them (the gateway's stream continuation needs all
  three): ``/v1/completions`` takes ``prompt`` as token ids (``[ids]`` or
  ``[[ids]]``; several prompts are refused with a 400; an id outside the
  vocabulary is a 400, as on vLLM); ``return_token_ids: true`` adds the
  output's ``token_ids`` to every stream chunk's choice and the prompt's
  ``prompt_token_ids`` once (chat: top level of the role chunk; completions:
  the first chunk's choice), or both to a whole response; ``POST /detokenize``
  ``{"model", "tokens"}`` answers ``{"prompt": text}``.  The ids follow
  ``tokens.py``: output position ``j`` is id ``OUTPUT_TOKEN_BASE + j``
  (100,000 + j) with text ``synthetic_text(j, 1)``, prompt ids are below the
  base, and a token-id prompt ending in output ids continues the output after
  the last one -- so a stream re-issued with its prompt ids + the ids already
  sent (and ``max_tokens`` reduced by them) yields exactly the rest of the
  uninterrupted text, like greedy decoding on a real engine.  (The natural
  stop length stays a fresh random draw per request, within ``max_tokens``,
  like sampling a continuation on vLLM.)  ``stop`` strings are not honoured.
* ``vllm_xargs``: ``specgate_max_draft`` (int >= 0),
  ``specgate_min_confidence`` (float in [0, 1]), ``specgate_max_batch``
  (int >= 0: no drafting in steps of more requests) and ``specgate_schedule``
  (flat [max_batch, max_draft, ...]: a draft length per step batch size) change drafting exactly as the
  specgate vLLM extension does (parsed by ``contract.knobs``; invalid
  values are logged and ignored; the confidence floor only on ``-av``
  profiles, the only ones with confidences -- advertised knobs follow
  ``drafters.vllm_ext.discovery.advertised_knobs``).  ``specgate_workload`` / ``sim_workload``
  (or header ``x-sim-workload``, or a ``[workload=NAME]`` marker in the
  prompt) picks the acceptance preset the request follows; unknown names fall
  back to the replica's default workload.
* ``GET /v1/models``, ``GET /health``, ``GET /load``, ``GET /metrics``
  (vLLM names and labels ``model_name``, ``engine``; dcgm-exporter GPU gauges
  from the cost model; ``specgate_ext_info{version,knobs} 1``: knobs
  ``max_draft,max_batch,schedule,min_confidence`` on ``-av`` profiles, ``max_draft,max_batch,schedule`` on other
  DSpark and ngram profiles, empty on ``off``).
* Errors are vLLM's: ``{"error": {"message", "type", "param", "code"}}``.

Cost: one asyncio task drives the batch (one engine step per iteration, a
sleep for the step's modelled duration x ``time_scale``); request handlers
only wait on an event.  Latency histograms on /metrics are in simulated
seconds (= wall seconds when ``time_scale`` is 1).

Layout (one job per module): ``replica.py`` -- ``SimReplicaSettings`` and the
real-time engine driver ``SimReplica`` with its per-request ``RequestStream``;
``requests.py`` -- request body parsing / validation and vLLM's errors;
``tokens.py`` -- the stand-in tokenizer (token ids, ``synthetic_text``, the
continuation position, the vocabulary); ``metrics.py`` -- the /metrics
collector.  This module is the FastAPI app (routes, streaming hand-off to the
client) and the uvicorn entry points; the names above stay importable from
here.

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
import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import generate_latest

from contract import wire
from .engine import EngineRequest
from .metrics import SIM_VERSION, sim_registry
from .replica import RequestStream, SimReplica, SimReplicaSettings
from .requests import (ApiError, Prompt, chat_prompt, completion_prompt, detokenize_tokens, error_response,
                       fit_context, parse_body, return_token_ids)
from .tokens import OUTPUT_TOKEN_BASE, detokenize, output_token_ids, synthetic_text

logger = logging.getLogger("specgate.sim")


# -------------------------------------------------------------------- app


def create_app(settings: SimReplicaSettings | None = None) -> FastAPI:
    """FastAPI app of one sim replica; the engine loop runs inside the app's lifespan."""
    settings = settings or SimReplicaSettings()
    sim = SimReplica(settings)
    registry = sim_registry(sim)

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
        return JSONResponse(wire.http_error_body(exc.status_code, str(exc.detail)), exc.status_code)

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
        return wire.model_list(settings.model_name, sim.created, settings.max_model_len)

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = parse_body(await request.body(), settings.model_name)
        return await _generate(request, body, chat_prompt(body), chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = parse_body(await request.body(), settings.model_name)
        return await _generate(request, body, completion_prompt(body, settings.max_model_len), chat=False)

    @app.post("/detokenize")
    async def detokenize_(request: Request):
        body = parse_body(await request.body(), settings.model_name)
        return {"prompt": detokenize(detokenize_tokens(body, settings.max_model_len))}

    async def _generate(request: Request, body: dict, prompt: Prompt, chat: bool):
        with_ids = return_token_ids(body)
        max_tokens = fit_context(prompt.tokens, prompt.max_tokens, settings.max_model_len, chat)
        xargs = body.get("vllm_xargs")
        workload = sim.resolve_workload(xargs, request.headers.get("x-sim-workload"), prompt.text)
        n_out, natural = sim.natural_output_len(max_tokens, bool(body.get("ignore_eos")))
        req = sim.submit(prompt.tokens, n_out, workload, xargs, natural)
        rid = wire.response_id(chat, request.headers.get("x-request-id"))
        created = wire.created_now()
        finish_reason = "stop" if natural else "length"
        start = prompt.start
        if not body.get("stream"):
            sim.in_flight += 1
            try:
                await _wait_done(req)
            finally:
                sim.in_flight -= 1
                sim.abort(req)
            return JSONResponse(wire.completion_body(
                chat=chat, rid=rid, created=created, model=settings.model_name,
                text=synthetic_text(start, req.output), finish_reason=finish_reason, prompt_tokens=req.prompt_tokens,
                completion_tokens=req.output, spec=_spec(req),
                token_ids=output_token_ids(start, req.output) if with_ids else None,
                prompt_token_ids=prompt.token_ids() if with_ids else None))
        include_usage, continuous = wire.stream_usage_flags(body.get("stream_options"))
        return StreamingResponse(_sse(rid, created, req, chat, finish_reason, include_usage, continuous, start,
                                      prompt if with_ids else None),
                                 media_type=wire.SSE_CONTENT_TYPE, headers={"cache-control": "no-cache"})

    async def _wait_done(req: EngineRequest) -> None:
        st: RequestStream = req.user
        while not st.done:
            await st.event.wait()
            st.event.clear()

    def _spec(req: EngineRequest) -> dict | None:
        if not sim.engine.profile.speculative:
            return None
        return wire.spec_decoding(req.user.hist, req.draft_tokens, sim.engine.profile.num_speculative_tokens)

    async def _sse(rid: str, created: int, req: EngineRequest, chat: bool, finish_reason: str, include_usage: bool,
                   continuous: bool, start: int, ids_of: Prompt | None) -> AsyncIterator[bytes]:
        # Counted here, not before the response object is built: a client that
        # leaves before the body is first iterated never runs this generator's
        # `finally`, and the count would leak.
        sim.in_flight += 1
        st: RequestStream = req.user
        model = settings.model_name
        counts = (lambda n: (req.prompt_tokens, n)) if continuous else (lambda n: None)
        # return_token_ids: the prompt's ids once (chat: the role chunk; completions: the first chunk's choice),
        # each chunk's output ids on its choice
        prompt_ids = ids_of.token_ids() if ids_of is not None else None
        sent = 0
        first = True
        try:
            while True:
                await st.event.wait()
                st.event.clear()
                if first and chat:  # like vLLM: the role chunk goes out with the first engine output
                    yield wire.sse(wire.role_chunk(rid, created, model, usage_counts=counts(0),
                                                   prompt_token_ids=prompt_ids))
                    prompt_ids = None
                first = False
                n, done = st.pending, st.done
                st.pending = 0
                if n or done:  # like vLLM: finish_reason rides on the last output's chunk
                    pos = start + sent
                    sent += n
                    yield wire.sse(wire.content_chunk(
                        rid, created, model, synthetic_text(pos, n), chat=chat,
                        finish_reason=finish_reason if done else None, usage_counts=counts(sent),
                        token_ids=output_token_ids(pos, n) if ids_of is not None else None,
                        prompt_token_ids=prompt_ids))
                    prompt_ids = None
                if done:
                    break
            if include_usage:
                yield wire.sse(wire.usage_chunk(rid, created, model, req.prompt_tokens, req.output, chat=chat,
                                                spec=_spec(req)))
            yield wire.DONE
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
           "synthetic_text", "OUTPUT_TOKEN_BASE", "SIM_VERSION"]
