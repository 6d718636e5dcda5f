"""/metrics content, tracing spans with traceparent propagation, JSON logs."""

from __future__ import annotations


import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from .conftest import KEYS, backend_requests, run_async, tenant, wait_for


def samples(text):
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_metrics_content(start_backend, start_gateway):
    backend = start_backend(spec=True)
    gw = start_gateway([{"url": backend.url, "name": "r1", "profile": "dspark-b4"}], metrics_top_tenants=1)
    for key in ("alpha", "beta"):
        c = openai.OpenAI(base_url=gw.v1(), api_key=KEYS[key], max_retries=0)
        c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "a b"}], max_tokens=6)
        list(c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "a b"}], max_tokens=6, stream=True))
    httpx.post(gw.url + "/v1/chat/completions", json={}, headers={"authorization": "Bearer nope"})
    s = samples(httpx.get(gw.url + "/metrics").text)
    reqs = {(l["tenant"], l["replica"], l["status"]): v for l, v in s["specgate_requests_total"]}
    assert reqs[("alpha", "r1", "200")] == 2
    assert reqs[("other", "r1", "200")] == 2  # top-N tenants = 1
    assert reqs[("unauthenticated", "none", "401")] == 1
    assert any(v == 2 for l, v in s["specgate_gateway_overhead_seconds_count"] if l["stream"] == "true")
    assert any(v == 2 for l, v in s["specgate_gateway_overhead_seconds_count"] if l["stream"] == "false")
    assert sum(v for _, v in s["specgate_upstream_ttft_seconds_count"]) == 4
    drafted = {l["tenant"]: v for l, v in s["specgate_spec_draft_tokens_total"]}
    accepted = {l["tenant"]: v for l, v in s["specgate_spec_accepted_tokens_total"]}
    # 6 tokens at 2 accepted + 1 bonus per step: 2 steps, 8 drafted, 4 accepted per request.
    assert drafted["alpha"] == 16 and accepted["alpha"] == 8
    assert sum(v for l, v in s["specgate_spec_acceptance_length_sum"] if l["tenant"] == "alpha") == 2 * 3.0
    assert {l["kind"]: v for l, v in s["specgate_tokens_total"] if l["tenant"] == "alpha"} == {"prompt": 4, "completion": 12}
    assert s["specgate_replica_healthy"] == [({"replica": "r1", "profile": "dspark-b4"}, 1.0)]
    assert all(name.startswith("specgate_") for name in s)


def test_tracing_spans_and_traceparent_propagation(start_backend, start_gateway):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    backend = start_backend()
    gw = start_gateway([{"url": backend.url}], tracing={"enabled": True, "exporter": "none"})
    exporter = InMemorySpanExporter()
    gw.state.tracing.add_processor(SimpleSpanProcessor(exporter))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
        headers={"authorization": f"Bearer {KEYS['alpha']}", "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
    )
    assert r.status_code == 200
    upstream_tp = backend_requests(backend)[-1]["headers"]["traceparent"]
    assert upstream_tp.split("-")[1] == trace_id
    assert upstream_tp.split("-")[2] != "00f067aa0ba902b7"  # the gateway's proxy span is the parent
    spans = wait_for(lambda: exporter.get_finished_spans() if len(exporter.get_finished_spans()) >= 4 else None)
    by_name = {s.name: s for s in spans}
    assert {"specgate.request", "auth", "route", "proxy"} <= set(by_name)
    assert all(format(s.context.trace_id, "032x") == trace_id for s in spans)
    assert format(by_name["proxy"].context.span_id, "016x") == upstream_tp.split("-")[2]


def test_traceparent_passes_through_when_tracing_off(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([{"url": backend.url}])
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
        headers={"authorization": f"Bearer {KEYS['alpha']}", "traceparent": tp},
    )
    assert backend_requests(backend)[-1]["headers"]["traceparent"] == tp


def test_access_log_is_json_without_keys_or_prompts(start_backend, start_gateway, capfd):
    backend = start_backend()
    gw = start_gateway([{"url": backend.url}], [tenant("alpha")], access_log=True)
    secret_prompt = "my-very-secret-prompt-text"
    httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": secret_prompt}], "max_tokens": 1},
        headers={"authorization": f"Bearer {KEYS['alpha']}"},
    )
    httpx.post(gw.url + "/v1/chat/completions", json={"model": "x"}, headers={"authorization": "Bearer sk-leaked-key"})
    import orjson

    seen: list[str] = []

    def both_logged():
        seen.append(capfd.readouterr().err)
        text = "".join(seen)
        return text if text.count('"msg":"request"') >= 2 else None

    err = wait_for(both_logged, timeout=15)
    lines = [orjson.loads(l) for l in err.splitlines() if l.startswith("{")]
    access = [l for l in lines if l.get("logger") == "specgate.gateway.access"]
    assert {a["status"] for a in access} == {200, 401}
    assert access[0]["tenant"] == "alpha"
    assert secret_prompt not in err and KEYS["alpha"] not in err and "sk-leaked-key" not in err


def test_per_tenant_speculation_gauges_follow_the_published_policy_and_responses(start_backend, start_gateway):
    """Redis-backed gateway: the per-tenant gauges show the policy the gateway
    applies (published by a controller through the store) and the acceptance
    length its responses' metrics.speculative_decoding report."""
    from contract.policy import SpeculationPolicy, publish_policies
    from contract.store import create_store

    backend = start_backend(spec=True)
    gw = start_gateway([{"url": backend.url, "name": "r1", "profile": "dspark-b4"}])
    s = samples(httpx.get(gw.url + "/metrics").text)
    # Before any policy: every served tenant speculates with no cap; no acceptance measured yet.
    assert {l["tenant"]: v for l, v in s["specgate_tenant_speculation_enabled"]} == {"alpha": 1, "beta": 1}
    assert {l["tenant"]: v for l, v in s["specgate_tenant_speculation_max_draft"]} == {"alpha": -1, "beta": -1}
    assert "specgate_tenant_acceptance_length" not in s

    settings = gw.state.settings

    async def publish():
        store = create_store(settings.redis_url, settings.redis_prefix)
        try:
            await publish_policies(store, {"alpha": SpeculationPolicy(max_draft=4), "beta": SpeculationPolicy(enabled=False, max_draft=0)})
        finally:
            await store.close()

    run_async(publish())
    wait_for(lambda: gw.state.policies.version >= 1, 5)
    c = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0)
    for _ in range(2):
        c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "a b"}], max_tokens=6)
    s = samples(httpx.get(gw.url + "/metrics").text)
    assert {l["tenant"]: v for l, v in s["specgate_tenant_speculation_enabled"]} == {"alpha": 1, "beta": 0}
    assert {l["tenant"]: v for l, v in s["specgate_tenant_speculation_max_draft"]} == {"alpha": 4, "beta": 0}
    # The fake replica accepts 2 drafts per step: 3 tokens per verification step.
    assert s["specgate_tenant_acceptance_length"] == [({"tenant": "alpha"}, 3.0)]


def test_per_tenant_gauges_name_no_tenant_with_tenant_labels_off(start_backend, start_gateway):
    backend = start_backend(spec=True)
    gw = start_gateway([{"url": backend.url, "name": "r1"}], metrics_tenant_labels=False)
    text = httpx.get(gw.url + "/metrics").text
    assert "specgate_tenant_speculation_enabled{" not in text and 'tenant="alpha"' not in text


def test_decayed_acceptance_forgets_old_responses():
    from gateway.metrics import DecayedAcceptance

    now = [0.0]
    acc = DecayedAcceptance(half_life_s=10.0, clock=lambda: now[0])
    assert acc.value("t") is None
    acc.add("t", accepted=30, steps=10)  # AL 4
    assert acc.value("t") == 4.0
    now[0] = 100.0  # ten half-lives later the old responses weigh ~0.1 %
    acc.add("t", accepted=0, steps=10)  # AL 1
    assert 1.0 < acc.value("t") < 1.01
