"""A fast, local OpenAI-compatible backend: a documented *simulation* of a
vLLM replica, used as the upstream by the gateway's own tests and by the
gateway overhead bench (`bench/gateway_overhead.py`); the real-vLLM tier
covers real replicas.  For a replica that also models latency, batching and
acceptance, see the sim replica (`drafters/sim/server.py`).

What it imitates, on purpose (the wire format is vLLM's, built by
`contract.wire`, the same builders the sim replica uses):
* `/v1/chat/completions` and `/v1/completions`, streaming (SSE: role chunk,
  one chunk per token, `finish_reason` on the last one, the usage-only chunk
  with `choices: []` when `stream_options.include_usage` is set,
  `data: [DONE]`) and non-streaming; `finish_reason` is `length`, or `stop`
  when the `stop_after` control ends the completion early;
* vLLM's `--per-request-spec-decode-metrics summary`: `metrics.speculative_decoding`
  in the non-streaming body and in the final usage chunk (only when
  `stream_options.include_usage` is set, like vLLM), derived deterministically
  from the completion length and, with `knobs`, the per-request
  `vllm_xargs.specgate_max_draft` (0: zero steps, as on vLLM): each verify step
  accepts `accepted_per_step` of `draft_k` drafts plus the bonus token;
* vLLM's `return_token_ids` and token-id prompts, so the gateway's stream
  continuation can be tested: the prompt's ids (`prompt_token_ids`, once)
  and each chunk's `token_ids`, in vLLM's places; output token `i` is
  " tok{i}" with id `OUTPUT_BASE + i`, a text prompt's words get ids below
  it, and a token-id prompt whose tail holds output ids continues the output
  after them -- deterministic like greedy decoding, so a continued stream is
  token for token the uninterrupted one. `/detokenize` decodes ids;
* `/health`, `/v1/models`, `/metrics` (vLLM gauge names, and optionally the
  specgate extension's `specgate_ext_info{knobs="max_draft,min_confidence"}`, or the
  knobs `FakeBackend(knobs="...")` names).

Test controls (never part of the OpenAI surface): `POST /_fake/control` with
`{"fail_next": n, "fail_status": 500, "die_after_chunks": k, "error_after_chunks": k, "delay_s": x,
"chunk_delay_s": y, "linger_s": z, "stop_after": n, "healthy": bool, "frozen": bool,
"stalled": bool}` (`error_after_chunks`: after k events, an engine error event
and `[DONE]`, as vLLM sends when its engine fails mid-stream; `linger_s`: keep a finished stream's connection open that
long after `[DONE]`, as a replica may before its server closes it; `frozen`:
every request but the controls waits unanswered, as a SIGSTOPped process
would; `stalled`: completions are taken in and counted as running but make
no progress while /health and /metrics still answer, as an engine stuck
behind a live API server would; `/metrics` carries
`vllm:generation_tokens_total`), `GET /_fake/requests` (recent upstream
request bodies and headers as received), `GET /_fake/stats` (requests,
completed, cancelled = client went away before the response finished).

Run (from the repository root):
`python -m testbed.fake_openai --port 8001 [--spec] [--knobs]`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import time
from typing import Any

import orjson

from contract import wire
from drafters.sim.tokens import OUTPUT_TOKEN_BASE, output_start, output_token_ids


# The token-id scheme is the sim replica's (drafters.sim.tokens): output position j is id
# OUTPUT_BASE + j, and a token-id prompt ending in output ids continues after them. Only the
# text differs: " tok{j}", which a test can read at a glance.
OUTPUT_BASE = OUTPUT_TOKEN_BASE


def output_text(start: int, n: int) -> str:
    """The text of output tokens [start, start + n)."""
    return "".join(f" tok{i}" for i in range(start, start + n))



async def answer_lifespan(receive, send) -> None:
    """Answer an ASGI server's lifespan protocol for an app with nothing to start or stop
    (uvicorn otherwise logs that the app does not support lifespan)."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return

class _Die(Exception):
    """Raised mid-response to make the server drop the connection."""


class FakeBackend:
    def __init__(
        self,
        name: str = "fake",
        model: str = "fake-model",
        tokens: int = 8,
        spec: bool = False,
        knobs: bool | str = False,
        draft_k: int = 4,
        accepted_per_step: int = 2,
        record: int = 200,
    ) -> None:
        self.name = name
        self.model = model
        self.tokens = tokens
        self.spec = spec
        self.knobs = knobs  # True: advertise "max_draft,min_confidence"; a string: advertise those knobs
        self.draft_k = draft_k
        self.accepted_per_step = accepted_per_step
        self.control: dict[str, Any] = {"fail_next": 0, "fail_status": 500, "die_after_chunks": None, "error_after_chunks": None, "delay_s": 0.0, "chunk_delay_s": 0.0, "linger_s": 0.0, "healthy": True, "frozen": False, "stalled": False}
        self.recorded: collections.deque = collections.deque(maxlen=record)
        self.stats = {"requests": 0, "completed": 0, "cancelled": 0}
        self.running = 0
        self.generated = 0
        self._created = int(time.time())

    # -- ASGI ---------------------------------------------------------
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        path = scope["path"]
        method = scope["method"]
        while self.control["frozen"] and not path.startswith("/_fake/"):
            await asyncio.sleep(0.02)
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            await self._completion(scope, receive, send, chat=path == "/v1/chat/completions")
        elif method == "POST" and path == "/detokenize":
            body = orjson.loads(await _body(receive) or b"{}")
            ids = body.get("tokens") or []
            await _json(send, {"prompt": "".join(f" tok{i - OUTPUT_BASE}" if i >= OUTPUT_BASE else f" w{i}" for i in ids)})
        elif path == "/health":
            await _json(send, {} if self.control["healthy"] else {"error": "unhealthy"}, 200 if self.control["healthy"] else 503)
        elif path == "/v1/models":
            await _json(send, wire.model_list(self.model, self._created, 4096))
        elif path == "/metrics":
            await _text(send, self._metrics())
        elif path == "/_fake/control" and method == "POST":
            body = orjson.loads(await _body(receive) or b"{}")
            self.control.update(body)
            await _json(send, self.control)
        elif path == "/_fake/requests":
            await _json(send, list(self.recorded))
        elif path == "/_fake/stats":
            await _json(send, {**self.stats, "running": self.running})
        else:
            await _json(send, wire.http_error_body(404), 404)

    def _metrics(self) -> str:
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} {float(self.running)}',
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{engine="0",model_name="{self.model}"}} 0.0',
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="{self.model}"}} 0.0',
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f'vllm:generation_tokens_total{{engine="0",model_name="{self.model}"}} {float(self.generated)}',
        ]
        if self.knobs:
            lines += [
                "# HELP specgate_ext_info specgate vLLM extension",
                "# TYPE specgate_ext_info gauge",
                f'specgate_ext_info{{version="fake",knobs="{self.advertised_knobs}"}} 1.0',
            ]
        return "\n".join(lines) + "\n"

    @property
    def advertised_knobs(self) -> str:
        return self.knobs if isinstance(self.knobs, str) else "max_draft,min_confidence"

    async def _completion(self, scope, receive, send, chat: bool) -> None:
        raw = await _body(receive)
        self.stats["requests"] += 1
        try:
            req = orjson.loads(raw)
        except orjson.JSONDecodeError:
            await _json(send, wire.error_body("bad json"), 400)
            return
        headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"]}
        self.recorded.append({"path": scope["path"], "body": req, "headers": headers})
        ctl = self.control
        if ctl["fail_next"] > 0:
            ctl["fail_next"] -= 1
            status = int(ctl["fail_status"])
            await _json(send, wire.error_body(f"injected failure {status}", "InternalServerError", status), status)
            return
        if req.get("model") != self.model:
            await _json(send, wire.model_not_found_body(req.get("model"), self.model), 404)
            return
        self.running += 1
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            while ctl["stalled"]:
                done, _ = await asyncio.wait({watcher}, timeout=0.02)
                if done:
                    self.stats["cancelled"] += 1
                    return
            if ctl["delay_s"]:
                done, _ = await asyncio.wait({watcher}, timeout=float(ctl["delay_s"]))
                if done:
                    self.stats["cancelled"] += 1
                    return
            # Deterministic ids (`chatcmpl-<name>-<n>`) and `created` (server start), unlike vLLM, so that
            # tests can compare responses byte for byte; a client's X-Request-Id is honoured as on vLLM.
            rid = wire.response_id(chat, headers.get("x-request-id") or f"{self.name}-{self.stats['requests']}")
            if req.get("stream"):
                await self._stream(req, chat, rid, send, watcher)
            else:
                await _json(send, self._whole(req, chat, rid))
                self.stats["completed"] += 1
        finally:
            self.running -= 1
            watcher.cancel()

    # -- content --------------------------------------------------------
    def _n_tokens(self, req: dict) -> tuple[int, str]:
        """(completion tokens, finish_reason)."""
        start = self._start(req)
        mt = req.get("max_completion_tokens") or req.get("max_tokens")
        n = max(1, min(int(mt), 256)) if isinstance(mt, int) and mt > 0 else self.tokens
        stop = self.control.get("stop_after")  # an "EOS" at this output position, before max_tokens
        if stop and int(stop) < start + n:
            return max(1, int(stop) - start), "stop"
        return n, "length"

    def _prompt_ids(self, req: dict, chat: bool) -> list[int]:
        p = req.get("prompt")
        if not chat and isinstance(p, list) and p and all(isinstance(i, int) for i in p):
            return p
        if chat:
            text = " ".join(m.get("content", "") if isinstance(m.get("content"), str) else "" for m in req.get("messages", []))
        else:
            text = p if isinstance(p, str) else " ".join(map(str, p or []))
        return [1 + sum(w.encode()) % 997 for w in text.split()] or [1]

    def _prompt_tokens(self, req: dict, chat: bool) -> int:
        return len(self._prompt_ids(req, chat))

    def _start(self, req: dict) -> int:
        """Where the output starts: after the output tokens a token-id prompt ends with."""
        p = req.get("prompt")
        return output_start(p) if isinstance(p, list) and p and all(isinstance(i, int) for i in p) else 0

    def _spec(self, req: dict, n: int) -> dict | None:
        """`metrics.speculative_decoding` for n completion tokens (None: not a speculative replica)."""
        if not self.spec:
            return None
        k = self.draft_k
        xargs = req.get("vllm_xargs") or {}
        if self.knobs and isinstance(xargs.get("specgate_max_draft"), int):
            k = max(0, min(k, xargs["specgate_max_draft"]))
        hist = [0] * (self.draft_k + 1)
        if k == 0:
            return wire.spec_decoding(hist, 0, self.draft_k)
        acc = min(k, self.accepted_per_step)
        steps = math.ceil(n / (acc + 1))
        # every step accepts `acc` drafts except the last, which accepts what is left
        hist[acc] += steps - 1
        hist[(n - steps) - (steps - 1) * acc] += 1
        return wire.spec_decoding(hist, steps * k, self.draft_k)

    def _whole(self, req: dict, chat: bool, rid: str) -> dict:
        n, finish = self._n_tokens(req)
        self.generated += n
        return wire.completion_body(
            chat=chat, rid=rid, created=self._created, model=self.model, text=output_text(self._start(req), n),
            finish_reason=finish, prompt_tokens=self._prompt_tokens(req, chat), completion_tokens=n, spec=self._spec(req, n))

    async def _stream(self, req: dict, chat: bool, rid: str, send, watcher: asyncio.Future) -> None:
        n, finish = self._n_tokens(req)
        start = self._start(req)
        ids = req.get("return_token_ids") is True
        prompt_ids = self._prompt_ids(req, chat) if ids else None
        created, model = self._created, self.model
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", wire.SSE_CONTENT_TYPE.encode())]})
        events: list[dict] = []
        if chat:
            events.append(wire.role_chunk(rid, created, model, prompt_token_ids=prompt_ids))
        self.generated += n
        for i in range(start, start + n):
            last = i == start + n - 1
            events.append(wire.content_chunk(
                rid, created, model, f" tok{i}", chat=chat, finish_reason=finish if last else None,
                token_ids=output_token_ids(i, 1) if ids else None,
                prompt_token_ids=prompt_ids if ids and not chat and i == start else None))
        include_usage, _ = wire.stream_usage_flags(req.get("stream_options"))
        if include_usage:
            events.append(wire.usage_chunk(rid, created, model, self._prompt_tokens(req, chat), n, chat=chat, spec=self._spec(req, n)))
        die = self.control["die_after_chunks"]
        fail = self.control["error_after_chunks"]
        delay = float(self.control["chunk_delay_s"] or 0)
        linger = float(self.control["linger_s"] or 0)
        if fail is not None:
            events[fail:] = [wire.error_body("engine core failed (test control)", "InternalServerError", 500)]
        if not delay and die is None:
            payload = b"".join(map(wire.sse, events)) + wire.DONE
            await send({"type": "http.response.body", "body": payload, "more_body": linger > 0})
            if linger:
                await asyncio.wait({watcher}, timeout=linger)
                await send({"type": "http.response.body", "body": b""})
            self.stats["completed"] += 1
            return
        for i, e in enumerate(events):
            if die is not None and i >= die:
                raise _Die("fake backend dies mid-stream (test control)")
            await send({"type": "http.response.body", "body": wire.sse(e), "more_body": True})
            while self.control["frozen"]:
                await asyncio.sleep(0.02)
            if delay:
                done, _ = await asyncio.wait({watcher}, timeout=delay)
                if done:
                    self.stats["cancelled"] += 1
                    return
        await send({"type": "http.response.body", "body": wire.DONE})
        self.stats["completed"] += 1


async def _disconnected(receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def _body(receive) -> bytes:
    parts = []
    while True:
        msg = await receive()
        parts.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(parts)


async def _json(send, obj: Any, status: int = 200) -> None:
    body = orjson.dumps(obj)
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _text(send, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain; version=0.0.4"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--name", default="fake")
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--tokens", type=int, default=8, help="completion tokens when max_tokens is absent")
    parser.add_argument("--spec", action="store_true", help="emit metrics.speculative_decoding")
    parser.add_argument("--knobs", action="store_true", help="advertise specgate_ext_info knobs and honour them")
    args = parser.parse_args()
    import uvicorn

    backend = FakeBackend(name=args.name, model=args.model, tokens=args.tokens, spec=args.spec, knobs=args.knobs)
    uvicorn.run(backend, host=args.host, port=args.port, loop="uvloop", http="httptools", access_log=False, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
