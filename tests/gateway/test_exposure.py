"""What the gateway exposes (issue 13, item 6): the OpenAPI document and
/docs, /metrics behind a token or on its own listener, tenant labels off,
503 `no_healthy_replica` versus 404 `model_not_found`, and /v1/models with
replicas that are down."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testbed.procs import free_port

from .conftest import KEYS

AUTH = {"authorization": f"Bearer {KEYS['alpha']}"}
CHAT = {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 2}


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def chat(gw, model: str, **extra) -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions", json={"model": model, **CHAT, **extra}, headers=AUTH)


def asgi_get(app, path: str, headers: dict | None = None) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            return await c.get(path, headers=headers or {})

    return asyncio.run(go())


def asgi_post(app, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            return await c.post(path, json=body, headers=headers or {})

    return asyncio.run(go())


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if code is not None:
        assert err["code"] == code
    return err


# -- OpenAPI and /docs -------------------------------------------------------
def test_openapi_documents_both_completion_endpoints(start_backend, start_gateway):
    gw = start_gateway([{"url": start_backend().url}])
    doc = httpx.get(gw.url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for path, model, required in [
        ("/v1/chat/completions", "ChatCompletionRequest", "messages"),
        ("/v1/completions", "CompletionRequest", "prompt"),
    ]:
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}
        assert set(schemas[model]["required"]) == {"model", required}
        assert schemas[model]["additionalProperties"] is True  # unknown fields pass through
        assert {"application/json", "text/event-stream"} <= set(op["responses"]["200"]["content"])
        for status in ("400", "401", "404", "408", "413", "429", "431", "503", "504"):
            assert op["responses"][status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert {"/v1/models", "/health", "/ready", "/metrics"} <= set(doc["paths"])
    assert set(schemas["ErrorDetail"]["properties"]) == {"message", "type", "param", "code"}


def test_docs_served_and_switchable(start_backend, start_gateway):
    backend = start_backend()
    on = start_gateway([{"url": backend.url}])
    r = httpx.get(on.url + "/docs")
    assert r.status_code == 200 and "swagger" in r.text.lower()
    off = start_gateway([{"url": backend.url}], docs=False)
    assert_openai_error(httpx.get(off.url + "/docs"), 404)
    assert httpx.get(off.url + "/openapi.json").status_code == 200


def test_documentation_routes_do_not_parse_the_body(start_backend, start_gateway):
    """Requests that reach the router (not the fast lane) are handed to the same
    hot endpoint, raw: its own 401, not a FastAPI validation error."""
    from fastapi import FastAPI

    gw = start_gateway([{"url": start_backend().url}])

    async def past_the_fast_lane(scope, receive, send):
        await FastAPI.__call__(gw.app, scope, receive, send)

    r = asgi_post(past_the_fast_lane, "/v1/chat/completions", {"model": "fake-model", **CHAT})
    assert_openai_error(r, 401, "invalid_api_key")
    r = asgi_post(past_the_fast_lane, "/v1/completions", {"unexpected": True}, headers={"authorization": "Bearer nope"})
    assert_openai_error(r, 401, "invalid_api_key")


# -- /metrics ---------------------------------------------------------------
def test_metrics_token(start_backend, start_gateway):
    gw = start_gateway([{"url": start_backend().url}], metrics_token="scrape-secret")
    r = httpx.get(gw.url + "/metrics")
    assert_openai_error(r, 401, "invalid_metrics_token")
    assert r.headers["www-authenticate"] == "Bearer"
    assert_openai_error(httpx.get(gw.url + "/metrics", headers={"authorization": "Bearer scrape-secre"}), 401)
    assert_openai_error(httpx.get(gw.url + "/metrics", headers={"authorization": "Basic scrape-secret"}), 401)
    assert_openai_error(httpx.get(gw.url + "/metrics", headers=AUTH), 401)  # a tenant key is not the token
    r = httpx.get(gw.url + "/metrics", headers={"authorization": "Bearer scrape-secret"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "specgate_replica_healthy" in r.text


def test_metrics_port_moves_metrics_off_the_main_app(start_backend, start_gateway):
    gw = start_gateway([{"url": start_backend().url}], metrics_port=free_port(), metrics_token="tok")
    assert_openai_error(httpx.get(gw.url + "/metrics"), 404)
    assert "/metrics" not in httpx.get(gw.url + "/openapi.json").json()["paths"]
    metrics_app = gw.app.state.metrics_app
    assert_openai_error(asgi_get(metrics_app, "/metrics"), 401, "invalid_metrics_token")
    r = asgi_get(metrics_app, "/metrics", {"authorization": "Bearer tok"})
    assert r.status_code == 200 and "specgate_replica_healthy" in r.text
    assert_openai_error(asgi_get(metrics_app, "/health"), 404)


def test_no_response_names_the_server_software(start_backend, start_gateway):
    """uvicorn's `server: uvicorn` is off: no header names a library (nor the
    replica's own `server`, which the relay drops)."""
    port = free_port()
    gw = start_gateway([{"url": start_backend().url}], metrics_port=port)
    responses = [
        chat(gw, "fake-model"),
        chat(gw, "no-such-model"),
        httpx.get(gw.url + "/health"),
        httpx.get(f"http://127.0.0.1:{port}/metrics"),
    ]
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json={"model": "fake-model", **CHAT, "stream": True}, headers=AUTH) as r:
        r.read()
        responses.append(r)
    assert [r.status_code for r in responses] == [200, 404, 200, 200, 200]
    for r in responses:
        assert "server" not in r.headers, r.headers


def test_tenant_labels_off(start_backend, start_gateway):
    gw = start_gateway([{"url": start_backend().url}], metrics_tenant_labels=False)
    assert chat(gw, "fake-model").status_code == 200
    text = httpx.get(gw.url + "/metrics").text
    tenants = {
        s.labels["tenant"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if "tenant" in s.labels
    }
    assert tenants == {"other"}
    assert "alpha" not in text


# -- 503 no_healthy_replica versus 404 model_not_found -----------------------
def test_configured_model_with_its_replica_down_is_503(start_gateway):
    gw = start_gateway([{"url": dead_url(), "model": "fake-model"}])
    err = assert_openai_error(chat(gw, "fake-model"), 503, "no_healthy_replica")
    assert "fake-model" in err["message"]


def test_no_replica_healthy_at_all_is_503_not_404(start_gateway):
    gw = start_gateway([{"url": dead_url()}])  # model never learned
    r = chat(gw, "fake-model")
    err = assert_openai_error(r, 503, "no_healthy_replica")
    assert "cannot tell" in err["message"]
    assert int(r.headers["retry-after"]) >= 1


def test_unknown_model_is_404_only_while_replicas_are_healthy(start_backend, start_gateway):
    gw = start_gateway([{"url": start_backend().url}, {"url": dead_url(), "model": "down-model"}])
    assert_openai_error(chat(gw, "nope"), 404, "model_not_found")
    assert_openai_error(chat(gw, "down-model"), 503, "no_healthy_replica")
    assert chat(gw, "fake-model").status_code == 200


def test_models_learned_from_a_replica_that_went_down_are_503_and_listed(start_backend, start_gateway):
    up, later_down = start_backend(), start_backend(model="other-model")
    gw = start_gateway([{"url": up.url, "name": "up"}, {"url": later_down.url, "name": "gone"}])
    gw.state.registry.get("gone").healthy = False  # what the health check does after its fail threshold
    assert_openai_error(chat(gw, "other-model"), 503, "no_healthy_replica")
    assert_openai_error(chat(gw, "nope"), 404, "model_not_found")
    ids = [m["id"] for m in httpx.get(gw.url + "/v1/models", headers=AUTH).json()["data"]]
    assert ids == ["fake-model", "other-model"]


def test_models_lists_configured_models_of_down_replicas(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([{"url": dead_url(), "model": "down-model"}, {"url": backend.url}])
    r = httpx.get(gw.url + "/v1/models", headers=AUTH)
    assert r.status_code == 200
    data = r.json()["data"]
    assert [m["id"] for m in data] == ["fake-model", "down-model"]  # healthy replicas' cards first
    assert data[0]["owned_by"] == "vllm" and data[1]["owned_by"] == "specgate"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_pass_through_is_unchanged_by_the_documented_routes(start_backend, start_gateway, path):
    from .conftest import backend_requests

    backend = start_backend()
    gw = start_gateway([{"url": backend.url}])
    body = {"model": "fake-model", "max_tokens": 2, "x_unknown": {"nested": [1, 2]}, "guided_json": {"type": "object"}}
    body.update({"messages": [{"role": "user", "content": "hi", "x_part": 1}]} if "chat" in path else {"prompt": "hi"})
    assert httpx.post(gw.url + path, json=body, headers=AUTH).status_code == 200
    assert backend_requests(backend)[-1]["body"] == body
