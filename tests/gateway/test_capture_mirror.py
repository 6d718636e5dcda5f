"""The capture mirror end to end: the real gateway (uvicorn on loopback, real
Redis) in front of a sim replica (`drafters.sim.server`, a documented
SIMULATION of vLLM whose `return_token_ids` follows vLLM's wire format), the
OpenAI SDK and raw HTTP as clients, and a recording capture target.

The capture target here is `CaptureRecorder`, a SIMULATION of the capture
replica's `/v1/completions` (vLLM with `extract_hidden_states`, tested by
tests/drafters/capture against real vLLM): it records each request's headers
and body and answers as vLLM does to a `max_tokens: 1` completion; the test
can make it answer an error, or hold requests until released.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract import wire
from contract.capture import CAPTURE_PARAMS_KEY, CAPTURE_REQUEST_PREFIX
from drafters.sim.replica import SimReplicaSettings
from drafters.sim.requests import chat_prompt, completion_prompt
from drafters.sim.server import create_app as create_sim_app
from drafters.sim.tokens import output_token_ids
from testbed.fake_openai import answer_lifespan
from tests.gateway.conftest import KEYS, ServerThread, free_port, tenant, wait_for

MODEL = "sim-model"
CHAT = [{"role": "system", "content": "You review code."}, {"role": "user", "content": "Is `x = x + 1` idiomatic?"}]
PROMPT = "def fib(n):\n    return n if n < 2 else"


class CaptureRecorder:
    """SIMULATION of the capture replica's /v1/completions (see the module docstring)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.status = 200
        self.hold = threading.Event()  # set: requests wait until it is cleared
        self.waiting = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        import orjson

        self.waiting += 1
        try:
            while self.hold.is_set():
                await asyncio.sleep(0.01)
        finally:
            self.waiting -= 1
        obj = orjson.loads(body) if body else {}
        self.records.append({"path": scope["path"], "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
                             "body": obj})
        if self.status != 200:
            payload = wire.error_body("capture refused (test control)", "InternalServerError", self.status)
        else:
            payload = wire.completion_body(chat=False, rid="cmpl-x", created=1, model=obj.get("model", ""), text="x",
                                           finish_reason="length", prompt_tokens=len(obj.get("prompt") or ()),
                                           completion_tokens=1)
        data = orjson.dumps(payload)
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


@pytest.fixture
def servers():
    started: list[ServerThread] = []

    def _start(app) -> ServerThread:
        s = ServerThread(app, free_port()).start()
        started.append(s)
        return s

    yield _start
    for s in reversed(started):
        s.stop()


@pytest.fixture
def sim(servers):
    settings = SimReplicaSettings(profile="off", served_model_name=MODEL, time_scale=0.02, default_output_mean=12.0,
                                  name="sim")
    return servers(create_sim_app(settings))


@pytest.fixture
def recorder(servers):
    rec = CaptureRecorder()
    rec.server = servers(rec)
    return rec


OPTED_IN = {"capture": {"fraction": 1.0, "max_per_hour": 10_000}}


@pytest.fixture
def capture_gw(start_gateway, sim, recorder):
    def _start(alpha_capture=OPTED_IN["capture"], beta_capture=None, budget_store_timeout_s=None, **capture):
        tenants = [tenant("alpha", speculation={"capture": alpha_capture}),
                   tenant("beta", **({"speculation": {"capture": beta_capture}} if beta_capture else {}))]
        gateway = {} if budget_store_timeout_s is None else {"budget_store_timeout_s": budget_store_timeout_s}
        return start_gateway([{"url": sim.url, "name": "sim", "profile": "off"}], tenants,
                             capture={"url": recorder.server.url, **capture}, **gateway)
    return _start


_clients: list = []


def client(gw, name: str) -> openai.OpenAI:
    c = openai.OpenAI(base_url=gw.v1(), api_key=KEYS[name], max_retries=0, timeout=60)
    _clients.append(c)
    return c


@pytest.fixture(autouse=True)
def _close_clients(start_gateway):
    yield
    while _clients:
        _clients.pop().close()


def capture_metrics(gw) -> dict[tuple, float]:
    text = httpx.get(gw.url + "/metrics").text
    out: dict[tuple, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("specgate_capture"):
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def outcome(gw, tenant_: str, name: str) -> float:
    return capture_metrics(gw).get(("specgate_capture_requests_total", ("outcome", name), ("tenant", tenant_)), 0.0)


def expected_prompt_ids(chat: bool, body: dict) -> list[int]:
    """The sim replica's own tokenization of the request (its `return_token_ids` answer)."""
    return chat_prompt(body).token_ids() if chat else completion_prompt(body, 32768).token_ids()


def check_record(rec: dict, tenant_: str, prompt_ids: list[int], completion_ids: list[int]) -> None:
    body = rec["body"]
    assert rec["path"] == "/v1/completions"
    assert rec["headers"]["x-request-id"].startswith(CAPTURE_REQUEST_PREFIX)
    assert body["prompt"] == prompt_ids + completion_ids
    assert body["max_tokens"] == 1 and body["model"] == MODEL
    assert body["kv_transfer_params"][CAPTURE_PARAMS_KEY] == {"tenant": tenant_, "prompt_tokens": len(prompt_ids)}


def _one(c: openai.OpenAI, chat: bool, stream: bool, max_tokens: int = 8, **extra):
    """One request through the SDK: (request body, text, usage, client-visible extras of the choices)."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, **extra}
    if chat:
        body["messages"] = CHAT
    else:
        body["prompt"] = PROMPT
    kwargs = {k: v for k, v in body.items() if k not in ("model", "messages", "prompt", "max_tokens")}
    api = c.chat.completions if chat else c.completions
    common = dict(model=MODEL, max_tokens=max_tokens, extra_body=kwargs or None)
    common.update({"messages": CHAT} if chat else {"prompt": PROMPT})
    if not stream:
        r = api.create(**common)
        choice = r.choices[0]
        text = choice.message.content if chat else choice.text
        extras = [set((choice.model_extra or {})) | set(r.model_extra or {})]
        return body, text, r.usage, extras
    chunks = list(api.create(**common, stream=True, stream_options={"include_usage": True}))
    text = "".join((ch.choices[0].delta.content or "") if chat else ch.choices[0].text for ch in chunks if ch.choices)
    usage = chunks[-1].usage
    extras = [set((ch.choices[0].model_extra or {}) if ch.choices else {}) | set(ch.model_extra or {}) for ch in chunks]
    return body, text, usage, extras


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_opted_in_requests_reach_the_capture_target_with_the_replicas_token_ids(capture_gw, recorder, chat, stream):
    gw = capture_gw()
    c = client(gw, "alpha")
    sent = []
    for _ in range(4):
        body, text, usage, extras = _one(c, chat, stream)
        assert not any({"token_ids", "prompt_token_ids"} & e for e in extras)  # the injected ids never reach the client
        completion_ids = output_token_ids(0, usage.completion_tokens)  # the sim's output ids are its positions
        prompt_ids = expected_prompt_ids(chat, body)
        assert usage.prompt_tokens == len(prompt_ids)
        sent.append((prompt_ids, completion_ids))
    wait_for(lambda: len(recorder.records) == 4, timeout=20)
    # Two capture workers: the captures may reach the target in any order.
    by_ids = {tuple(p + c_): (p, c_) for p, c_ in sent}
    assert sorted(tuple(r["body"]["prompt"]) for r in recorder.records) == sorted(tuple(p + c_) for p, c_ in sent)
    for rec in recorder.records:
        check_record(rec, "alpha", *by_ids[tuple(rec["body"]["prompt"])])
    assert outcome(gw, "alpha", "sent") == 4
    tokens = sum(len(p) + len(c_) for p, c_ in sent)
    assert capture_metrics(gw)[("specgate_capture_tokens_total", ("tenant", "alpha"))] == tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_client_that_asked_for_token_ids_keeps_them_and_the_capture_has_the_same(capture_gw, recorder, stream):
    gw = capture_gw()
    headers = {"authorization": f"Bearer {KEYS['alpha']}"}
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "return_token_ids": True, "stream": stream}
    r = httpx.post(gw.url + "/v1/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200
    if stream:
        objs = [wire_obj for wire_obj in _sse_objects(r.content) if wire_obj.get("choices")]
        prompt_ids = objs[0]["choices"][0]["prompt_token_ids"]
        completion_ids = [t for o in objs for t in o["choices"][0]["token_ids"]]
    else:
        choice = r.json()["choices"][0]
        prompt_ids, completion_ids = choice["prompt_token_ids"], choice["token_ids"]
    wait_for(lambda: len(recorder.records) == 1, timeout=20)
    check_record(recorder.records[0], "alpha", prompt_ids, completion_ids)


def _sse_objects(data: bytes) -> list[dict]:
    import orjson

    return [orjson.loads(e[6:]) for e in data.split(b"\n\n") if e.startswith(b"data: {")]


def test_a_tenant_that_did_not_opt_in_is_never_captured(capture_gw, recorder):
    gw = capture_gw()  # alpha at fraction 1.0, beta without `capture`
    beta = client(gw, "beta")
    for i in range(30):
        _one(beta, chat=bool(i % 2), stream=bool(i % 3 == 0), max_tokens=4)
    alpha = client(gw, "alpha")
    _one(alpha, chat=False, stream=False, max_tokens=4)
    wait_for(lambda: len(recorder.records) == 1, timeout=20)  # the capture path works: alpha's one request arrived
    assert all(rec["body"]["kv_transfer_params"][CAPTURE_PARAMS_KEY]["tenant"] == "alpha" for rec in recorder.records)
    assert not any(("tenant", "beta") in k for k in capture_metrics(gw))  # not even counted as dropped
    assert len(recorder.records) == 1


_VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|[0-9]+)')


def _normalised(data: bytes) -> bytes:
    return _VOLATILE.sub(rb'"\1":0', data)


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("extra", [{}, {"presence_penalty": 0.5}], ids=["continuable", "not-continuable"])
def test_a_captured_response_is_byte_for_byte_the_uncaptured_one(start_gateway, start_backend, sim, recorder, endpoint,
                                                                   stream, extra):
    """Same request as the captured tenant (alpha) and as one without capture
    (beta): identical bytes but for the response id and timestamp. With a
    presence penalty the stream cannot be continued, so only capture asks for
    token ids there. Streams come from the fake backend (tests/support: one
    event per token, always the same events), because the sim replica's
    events follow its engine steps and so vary from run to run."""
    if stream:
        url, model = start_backend(tokens=7).url, "fake-model"
    else:
        url, model = sim.url, MODEL
    gw = start_gateway([{"url": url, "name": "r", "profile": "off"}], [tenant("alpha", speculation=OPTED_IN), tenant("beta")],
                       capture={"url": recorder.server.url})
    body = {"model": model, "max_tokens": 7, "ignore_eos": True, "stream": stream, **extra}
    body.update({"messages": CHAT} if "chat" in endpoint else {"prompt": PROMPT})
    out = {}
    for name in ("alpha", "beta"):
        r = httpx.post(gw.url + endpoint, json=body, headers={"authorization": f"Bearer {KEYS[name]}"}, timeout=30)
        assert r.status_code == 200
        out[name] = _normalised(r.content)
    assert out["alpha"] == out["beta"]
    assert b"token_ids" not in out["alpha"]
    wait_for(lambda: len(recorder.records) == 1, timeout=20)
    assert recorder.records[0]["body"]["kv_transfer_params"][CAPTURE_PARAMS_KEY]["tenant"] == "alpha"


def test_max_per_hour_caps_captures_and_counts_the_rest(capture_gw, recorder):
    gw = capture_gw(alpha_capture={"fraction": 1.0, "max_per_hour": 3})
    c = client(gw, "alpha")
    texts = [_one(c, chat=False, stream=bool(i % 2), max_tokens=4)[1] for i in range(7)]
    assert all(texts)
    wait_for(lambda: outcome(gw, "alpha", "sent") == 3, timeout=20)
    assert outcome(gw, "alpha", "dropped_budget") == 4
    assert len(recorder.records) == 3


def test_max_per_hour_holds_across_gateway_instances_sharing_redis(capture_gw, recorder):
    # Two instances (one Redis): the budget is the tenant's, not each instance's,
    # which is also what keeps a restarted instance from starting a fresh hour.
    # The shared window needs the store up: while it is down each instance's own
    # window is the bound (fail open, by design). A starved machine once answered a
    # Redis call in over 0.5 s, the default `budget_store_timeout_s`, and the store
    # counted as down for 4 s (4 captures, one CI-like run), so the instances here
    # give the store the time a loaded machine takes.
    spec = {"fraction": 1.0, "max_per_hour": 3}
    gws = [capture_gw(alpha_capture=spec, budget_store_timeout_s=10.0) for _ in range(2)]
    for i in range(4):
        for gw in gws:
            assert _one(client(gw, "alpha"), chat=False, stream=bool(i % 2), max_tokens=4)[1]
    wait_for(lambda: sum(outcome(gw, "alpha", "sent") + outcome(gw, "alpha", "dropped_budget") for gw in gws) == 8,
             timeout=20)
    assert sum(outcome(gw, "alpha", "sent") for gw in gws) == 3 and len(recorder.records) == 3
    assert all(outcome(gw, "alpha", "sent") <= 3 for gw in gws)


def test_a_full_queue_drops_and_counts_and_the_responses_do_not_wait(capture_gw, recorder):
    recorder.hold.set()  # the capture replica takes the first capture and does not answer
    gw = capture_gw(queue_size=1, concurrency=1)
    c = client(gw, "alpha")
    for i in range(5):
        _, text, usage, _ = _one(c, chat=bool(i % 2), stream=bool(i % 3), max_tokens=4)
        assert text and usage.completion_tokens > 0  # every response complete while captures are parked
        if i == 0:
            wait_for(lambda: recorder.waiting == 1, timeout=20)  # the worker holds capture 1; the queue is empty
    assert outcome(gw, "alpha", "dropped_queue") == 3  # capture 2 waits in the queue, 3-5 find it full
    assert capture_metrics(gw)[("specgate_capture_queue_depth",)] == 1
    recorder.hold.clear()
    wait_for(lambda: outcome(gw, "alpha", "sent") == 2, timeout=20)
    assert capture_metrics(gw)[("specgate_capture_queue_depth",)] == 0


def test_capture_target_errors_and_timeouts_are_counted_failed_and_responses_unaffected(capture_gw, recorder):
    gw = capture_gw(timeout_s=0.5)
    c = client(gw, "alpha")
    recorder.status = 500
    for i in range(2):
        assert _one(c, chat=bool(i), stream=bool(i), max_tokens=4)[1]
    wait_for(lambda: outcome(gw, "alpha", "failed") == 2, timeout=20)
    recorder.status = 200
    recorder.hold.set()  # slower than capture.timeout_s
    for i in range(2):
        assert _one(c, chat=bool(i), stream=not i, max_tokens=4)[1]
    wait_for(lambda: outcome(gw, "alpha", "failed") == 4, timeout=20)
    recorder.hold.clear()
    assert outcome(gw, "alpha", "sent") == 0


def test_capture_target_down_is_counted_failed(start_gateway, sim):
    dead = f"http://127.0.0.1:{free_port()}"
    gw = start_gateway([{"url": sim.url, "name": "sim", "profile": "off"}],
                       [tenant("alpha", speculation=OPTED_IN), tenant("beta")], capture={"url": dead, "timeout_s": 2.0})
    c = client(gw, "alpha")
    for i in range(3):
        assert _one(c, chat=bool(i % 2), stream=bool(i % 2), max_tokens=4)[1]
    wait_for(lambda: outcome(gw, "alpha", "failed") == 3, timeout=20)


def test_too_long_requests_are_not_captured(capture_gw, recorder):
    gw = capture_gw(max_tokens_per_sample=20)
    c = client(gw, "alpha")
    body, _, usage, _ = _one(c, chat=False, stream=False, max_tokens=4, ignore_eos=True)
    _one(c, chat=False, stream=True, max_tokens=30, ignore_eos=True)  # prompt + 30 > 20
    wait_for(lambda: outcome(gw, "alpha", "too_long") == 1, timeout=20)
    wait_for(lambda: len(recorder.records) == 1, timeout=20)
    check_record(recorder.records[0], "alpha", expected_prompt_ids(False, body), output_token_ids(0, usage.completion_tokens))


def test_refused_and_several_output_requests_are_not_captured(capture_gw, recorder):
    gw = capture_gw()
    c = client(gw, "alpha")
    with pytest.raises(openai.BadRequestError):  # the sim replica refuses n=2 (and would not be captured: n > 1)
        c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=2)
    with pytest.raises(openai.BadRequestError):  # a replica's error is relayed, never captured
        c.completions.create(model=MODEL, prompt=[10**9], max_tokens=4)
    _one(c, chat=False, stream=False, max_tokens=4)
    wait_for(lambda: outcome(gw, "alpha", "sent") == 1, timeout=20)
    assert len(recorder.records) == 1 and sum(v for k, v in capture_metrics(gw).items()
                                              if k[0] == "specgate_capture_requests_total") == 1


def test_no_capture_target_no_capture(start_gateway, sim):
    gw = start_gateway([{"url": sim.url, "name": "sim", "profile": "off"}], [tenant("alpha", speculation=OPTED_IN)])
    assert gw.state.capture is None
    assert _one(client(gw, "alpha"), chat=True, stream=True)[1]
    assert not any(k[0] == "specgate_capture_requests_total" for k in capture_metrics(gw))


def _counts(metrics) -> dict[str, float]:
    return {s.labels["outcome"]: s.value for fam in text_string_to_metric_families(metrics.render().decode())
            if fam.name == "specgate_capture_requests" for s in fam.samples if s.name.endswith("_total")}


async def test_shutdown_drains_the_queue_then_cancels_and_counts_what_was_left(recorder):
    from contract.capture import CaptureTarget
    from gateway.capture import CapturePlan
    from gateway.capture_mirror import CaptureMirror
    from gateway.metrics import GatewayMetrics

    plan = CapturePlan("alpha", "alpha", MODEL, 100)
    metrics = GatewayMetrics()
    mirror = CaptureMirror(CaptureTarget(url=recorder.server.url, queue_size=4, concurrency=1), metrics)
    mirror.start()
    for i in range(3):
        mirror.finished(plan, ([1, 2, i], [3]))
    await mirror.stop()  # an answering target: the queue is drained before the workers stop
    assert _counts(metrics) == {"sent": 3.0} and len(recorder.records) == 3

    recorder.hold.set()  # a target that does not answer: the drain ends, the rest is counted
    metrics = GatewayMetrics()
    mirror = CaptureMirror(CaptureTarget(url=recorder.server.url, queue_size=4, concurrency=1), metrics)
    mirror.start()
    try:
        for i in range(3):
            mirror.finished(plan, ([1, 2, i], [3]))
        for _ in range(400):
            if recorder.waiting == 1:
                break
            await asyncio.sleep(0.05)
        await mirror.stop(drain_s=0.2)
    finally:
        recorder.hold.clear()
    assert _counts(metrics) == {"failed": 1.0, "dropped_queue": 2.0}
    assert mirror.queue.qsize() == 0


async def test_the_fleet_window_counts_each_capture_once_and_fails_open_while_the_store_is_down(redis_url, redis_prefix):
    from contract.store.redis_store import RedisStore
    from gateway.budget_guard import BudgetGuard
    from gateway.capture_mirror import FleetCaptureBudget

    store = RedisStore(redis_url, prefix=redis_prefix)
    budget = FleetCaptureBudget(BudgetGuard(store, timeout_s=0.5))
    assert [await budget("alpha", 2) for _ in range(3)] == [True, True, False]
    assert await budget("beta", 2)  # per tenant
    await store.close()
    dead = RedisStore(f"redis://127.0.0.1:{free_port()}/0", prefix=redis_prefix)  # nothing listens there
    down = FleetCaptureBudget(BudgetGuard(dead, timeout_s=0.5))
    assert await down("alpha", 2) and await down("alpha", 2) and await down("alpha", 2)  # each instance's own window bounds it
    await dead.close()
