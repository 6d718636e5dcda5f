"""The HTTP sim replica through real loopback HTTP: the openai SDK, prometheus_client's parser,
specgate's own vLLM metrics parser, and the per-request knobs."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from drafters.sim.server import SimReplicaSettings
from contract.vllm_metrics import parse_vllm_metrics

MODEL = "Qwen/Qwen3-8B"


def _client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="sim", max_retries=0, timeout=30)


def _spec(resp) -> dict:
    return (resp.model_extra or {})["metrics"]["speculative_decoding"]


async def test_chat_non_streaming_openai_sdk(sim_server):
    async with sim_server(SimReplicaSettings(profile="dspark-b8", default_workload="gsm8k")) as (base, sim):
        client = _client(base)
        resp = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Add 2 and 3."}], max_tokens=40,
            extra_body={"ignore_eos": True})
        assert resp.choices[0].message.content.startswith("[specgate-sim]")
        assert resp.choices[0].finish_reason == "length"
        assert resp.usage.completion_tokens == 40 and resp.usage.prompt_tokens > 0
        spec = _spec(resp)
        assert spec["num_spec_steps"] >= 1
        assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"], abs=1e-3)
        # 39 tokens after the prefill token, emitted by spec steps of accepted+1 tokens
        assert spec["num_spec_steps"] + spec["num_accepted_draft_tokens"] >= 39
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        await client.close()


async def test_streaming_one_chunk_per_step_and_usage(sim_server):
    async with sim_server(SimReplicaSettings(profile="dspark-b4", default_workload="gsm8k")) as (base, sim):
        client = _client(base)
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Count."}], max_tokens=60, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        contents, usage_chunk, finish = [], None, None
        async for ch in stream:
            if ch.usage is not None:
                usage_chunk = ch
            for c in ch.choices:
                if c.delta.content:
                    contents.append(c.delta.content)
                if c.finish_reason:
                    finish = c.finish_reason
        assert finish == "length"
        assert usage_chunk is not None and usage_chunk.usage.completion_tokens == 60
        spec = (usage_chunk.model_extra or {})["metrics"]["speculative_decoding"]
        text = "".join(contents)
        assert text.startswith("[specgate-sim]") and len(text.split()) == 60
        tokens_per_chunk = [len(c.split()) for c in contents]
        # The prefill token, then 1 + accepted tokens per verify step (+1 possible plain decode
        # step at the very end, when only one token remains to be drafted).
        steps = spec["num_spec_steps"]
        plain_steps = 60 - 1 - steps - spec["num_accepted_draft_tokens"]
        assert 0 <= plain_steps <= 1
        # One chunk per engine step while the reader keeps up; one that falls behind (a loaded
        # machine) gets the steps it missed merged into one chunk, as from vLLM (seen: 22 tokens).
        assert len(contents) <= 1 + steps + plain_steps
        if len(contents) == 1 + steps + plain_steps:  # nothing merged: each chunk is one step, <= K+1 tokens
            assert max(tokens_per_chunk) <= 5
        # without include_usage there is no usage chunk
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Count."}], max_tokens=5, stream=True)
        seen_usage = False
        async for ch in stream:
            seen_usage |= ch.usage is not None
        assert not seen_usage
        await client.close()


async def test_completions_endpoint(sim_server):
    async with sim_server(SimReplicaSettings(profile="dspark-b8-av")) as (base, sim):
        client = _client(base)
        resp = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20,
                                               extra_body={"ignore_eos": True})
        assert resp.choices[0].text.startswith("[specgate-sim]") and resp.usage.completion_tokens == 20
        assert "speculative_decoding" in resp.model_extra["metrics"]
        pieces = []
        stream = await client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=20, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        final = None
        async for ch in stream:
            if ch.choices:
                pieces.append(ch.choices[0].text)
            if ch.usage:
                final = ch
        assert final.usage.prompt_tokens == 3 and final.usage.completion_tokens == 20
        assert len("".join(pieces).split()) == 20
        await client.close()


async def test_metrics_acceptance_matches_engine(sim_server):
    async with sim_server(SimReplicaSettings(profile="dspark-b8", default_workload="math500")) as (base, sim):
        client = _client(base)
        resps = await asyncio.gather(*[
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"q{i}"}],
                                           max_tokens=50, extra_body={"ignore_eos": True}) for i in range(8)])
        async with httpx.AsyncClient() as h:
            text = (await h.get(base + "/metrics")).text
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        drafts = fams["vllm:spec_decode_num_drafts"].samples[0]
        assert drafts.name == "vllm:spec_decode_num_drafts_total"
        assert drafts.labels == {"model_name": MODEL, "engine": "0"}
        accepted = fams["vllm:spec_decode_num_accepted_tokens"].samples[0].value
        al_prom = 1 + accepted / drafts.value
        assert al_prom == pytest.approx(sim.engine.counters.acceptance_length)
        per_pos = {int(s.labels["position"]): s.value for s in fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples}
        assert sorted(per_pos) == list(range(8)) and sum(per_pos.values()) == accepted
        assert all(per_pos[i] >= per_pos[i + 1] for i in range(7))
        # the same through specgate's parser
        snap = parse_vllm_metrics(text)
        assert 1 + snap.spec_num_accepted_tokens / snap.spec_num_drafts == pytest.approx(al_prom)
        # a DSpark replica without adaptive verification has no confidences: only the draft cap
        assert snap.supports_knobs and snap.ext_knobs == {"max_draft", "max_batch", "schedule"}
        assert snap.iteration_tokens_count == sim.engine.counters.steps
        assert snap.generation_tokens == 8 * 50
        assert snap.gpu_util is not None and snap.dram_active is not None
        # and it equals what the per-request summaries add up to
        steps = sum(_spec(r)["num_spec_steps"] for r in resps)
        acc = sum(_spec(r)["num_accepted_draft_tokens"] for r in resps)
        assert steps == drafts.value and acc == accepted
        assert "vllm:time_to_first_token_seconds" in fams and "vllm:inter_token_latency_seconds" in fams
        await client.close()


async def test_off_profile_has_no_spec_metrics(sim_server):
    async with sim_server(SimReplicaSettings(profile="off")) as (base, sim):
        client = _client(base)
        resp = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=10)
        assert "metrics" not in (resp.model_extra or {})
        async with httpx.AsyncClient() as h:
            text = (await h.get(base + "/metrics")).text
        snap = parse_vllm_metrics(text)
        assert snap.spec_num_drafts is None and snap.generation_tokens == resp.usage.completion_tokens
        await client.close()


async def _run(client, xargs, n=6, max_tokens=48):
    rs = await asyncio.gather(*[
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"k{i}"}],
                                       max_tokens=max_tokens, extra_body={"ignore_eos": True, "vllm_xargs": xargs})
        for i in range(n)])
    return [_spec(r) for r in rs]


async def test_knobs_change_drafting(sim_server):
    async with sim_server(SimReplicaSettings(profile="dspark-b8", default_workload="gsm8k")) as (base, sim):
        client = _client(base)
        per_step = lambda ss: sum(s["num_draft_tokens"] for s in ss) / sum(s["num_spec_steps"] for s in ss)
        stock = await _run(client, None)
        # static b8 drafts min(8, remaining - 1) tokens every step: 8 except near the end of a request
        assert all(s["num_draft_tokens"] <= 8 * s["num_spec_steps"] for s in stock)
        assert per_step(stock) > 6.0
        off = await _run(client, {"specgate_max_draft": 0})
        assert all(s["num_spec_steps"] == 0 and s["num_draft_tokens"] == 0 for s in off)
        capped = await _run(client, {"specgate_max_draft": 2})
        assert all(s["num_draft_tokens"] <= 2 * s["num_spec_steps"] for s in capped)
        assert per_step(capped) > 1.8
        # no confidences without adaptive verification: the floor is ignored (as on real vLLM)
        floored = await _run(client, {"specgate_min_confidence": 0.6})
        assert per_step(floored) > 6.0
        # invalid values are ignored (stock behaviour), never an error
        bad = await _run(client, {"specgate_max_draft": "lots", "specgate_min_confidence": 7})
        assert all(s["num_draft_tokens"] <= 8 * s["num_spec_steps"] for s in bad)
        assert per_step(bad) > 6.0
        await client.close()


async def test_ngram_replica_reports_what_it_simulated(sim_server):
    """On an ngram replica a step without a proposal is no speculation step: the per-request
    summaries, their histograms and the Prometheus counters all add up to what was simulated,
    and a cap truncates the proposals (vLLM's acceptance histogram stops at it)."""
    async with sim_server(SimReplicaSettings(profile="ngram-k8", default_workload="code")) as (base, sim):
        client = _client(base)
        stock = await _run(client, None, n=16, max_tokens=160)
        capped = await _run(client, {"specgate_max_draft": 2}, n=4, max_tokens=160)
        async with httpx.AsyncClient() as h:
            text = (await h.get(base + "/metrics")).text
        snap = parse_vllm_metrics(text)
        assert snap.ext_knobs == {"max_draft", "max_batch", "schedule"}
        for s in stock + capped:
            hist = s["acceptance_histogram"]
            assert len(hist) == 9 and s["num_spec_tokens"] == 8
            assert s["num_spec_steps"] == sum(hist)
            assert s["num_accepted_draft_tokens"] == sum(j * c for j, c in enumerate(hist))
            # 159 tokens after the prefill token: steps with a proposal emit 1 + accepted, the others 1
            plain_steps = 159 - s["num_spec_steps"] - s["num_accepted_draft_tokens"]
            assert plain_steps > s["num_spec_steps"] / 2
        for s in capped:
            assert sum(s["acceptance_histogram"][3:]) == 0 and s["num_draft_tokens"] <= 2 * s["num_spec_steps"]
        steps = sum(s["num_spec_steps"] for s in stock)
        decode_steps = sum(159 - s["num_accepted_draft_tokens"] for s in stock)
        assert 0.25 < steps / decode_steps < 0.55  # the code preset proposes in ~38 % of its steps
        hist = [sum(col) for col in zip(*(s["acceptance_histogram"] for s in stock))]
        assert hist[0] == max(hist) and hist[8] > np.mean(hist[3:6])  # whole or early: a U, not a decaying chain
        both = stock + capped
        assert snap.spec_num_drafts == sum(s["num_spec_steps"] for s in both)
        assert snap.spec_num_draft_tokens == sum(s["num_draft_tokens"] for s in both)
        assert snap.spec_num_accepted_tokens == sum(s["num_accepted_draft_tokens"] for s in both)
        assert sum(snap.spec_accepted_per_pos.values()) == snap.spec_num_accepted_tokens
        assert snap.generation_tokens == 20 * 160
        await client.close()


async def test_confidence_floor_on_adaptive_replica(sim_server):
    async with sim_server(SimReplicaSettings(profile="dspark-b8-av", default_workload="gsm8k")) as (base, sim):
        async with httpx.AsyncClient() as h:
            snap = parse_vllm_metrics((await h.get(base + "/metrics")).text)
        assert snap.ext_knobs == {"max_draft", "max_batch", "schedule", "min_confidence"}
        client = _client(base)
        per_step = lambda ss: sum(s["num_draft_tokens"] for s in ss) / sum(s["num_spec_steps"] for s in ss)
        stock = await _run(client, None)
        strict = await _run(client, {"specgate_min_confidence": 0.6})
        assert per_step(strict) < 0.8 * per_step(stock)
        # acceptance rate rises when only confident drafts are kept
        rate = lambda ss: sum(s["num_accepted_draft_tokens"] for s in ss) / sum(s["num_draft_tokens"] for s in ss)
        assert rate(strict) > rate(stock)
        await client.close()


async def test_errors_are_openai_shaped(sim_server):
    async with sim_server(SimReplicaSettings(profile="dspark-b8")) as (base, sim):
        async with httpx.AsyncClient() as h:
            r = await h.post(base + "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
            assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
            r = await h.post(base + "/v1/chat/completions", json={"model": MODEL})
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
            r = await h.post(base + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                                 "max_tokens": -3})
            assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
            r = await h.post(base + "/v1/completions", json={"model": MODEL, "prompt": ""})
            assert r.status_code == 400
            assert (await h.get(base + "/health")).status_code == 200
        client = _client(base)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=2)
        await client.close()


async def test_client_disconnect_frees_the_slot(sim_server):
    async with sim_server(SimReplicaSettings(profile="off", time_scale=2.0)) as (base, sim):
        async with httpx.AsyncClient() as h:
            async with h.stream("POST", base + "/v1/chat/completions",
                                json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                      "max_tokens": 5000, "ignore_eos": True, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:") and "lorem" in line:
                        break
            for _ in range(100):
                if sim.engine.num_running == 0:
                    break
                await asyncio.sleep(0.05)
        assert sim.engine.num_running == 0 and sim.engine.counters.request_success.get("abort") == 1


async def test_several_replicas_in_one_event_loop():
    from drafters.sim.server import serve_sim_replicas
    from testbed.procs import free_port

    ports = [free_port(), free_port()]
    settings = [SimReplicaSettings(profile="dspark-b8", name="a"), SimReplicaSettings(profile="off", name="b")]
    task = asyncio.create_task(serve_sim_replicas(list(zip(settings, ports))))
    try:
        async with httpx.AsyncClient() as h:
            for _ in range(200):
                try:
                    codes = [(await h.get(f"http://127.0.0.1:{p}/health")).status_code for p in ports]
                    if codes == [200, 200]:
                        break
                except httpx.HTTPError:
                    await asyncio.sleep(0.02)
            texts = [(await h.get(f"http://127.0.0.1:{p}/metrics")).text for p in ports]
        assert parse_vllm_metrics(texts[0]).ext_knobs == {"max_draft", "max_batch", "schedule"}
        assert parse_vllm_metrics(texts[1]).ext_knobs == frozenset()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
