"""The upstream HTTP clients' connection pool, against a real HTTP server
over loopback."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from contract.settings import UPSTREAM_KEEPALIVE_S, GatewaySettings
from gateway.upstream import create_upstream, read_whole


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
async def test_an_idle_upstream_connection_is_dropped_after_the_keep_alive_not_reused(kind):
    """A replica closes an idle connection after its own keep-alive (vLLM: 5 s).
    A pooled connection reused at that moment fails the request, which then
    waits out a retry backoff (seen as 25-50 ms p99 outliers at 10 req/s). So
    the pool drops idle connections first: reused while fresh, a new
    connection once idle longer than `upstream_keepalive_s`."""
    client_ports: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        client_ports.append(request.transport.get_extra_info("peername")[1])
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app, keepalive_timeout=60)  # the server would keep it: the pool decides
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/completions"
    upstream = create_upstream(kind, 4, 2.0, 5.0, keepalive_s=0.3)
    try:
        for pause in (0.0, 0.05, 0.8):
            await asyncio.sleep(pause)
            resp = await upstream.post(url, b"{}", {"content-type": "application/json"}, 5.0)
            assert await read_whole(resp) == b'{"ok": true}'
    finally:
        await upstream.close()
        await runner.cleanup()
    assert client_ports[0] == client_ports[1] != client_ports[2]


def test_the_default_keep_alive_is_below_vllms():
    vllm_keep_alive_s = 5  # vllm.envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE's default (vLLM 0.32-0.33)
    assert GatewaySettings().upstream_keepalive_s == UPSTREAM_KEEPALIVE_S < vllm_keep_alive_s
