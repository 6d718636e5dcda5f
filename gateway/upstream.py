"""Upstream HTTP client: pooled keep-alive connections to the replicas.

Two interchangeable implementations behind one small interface:

* `AiohttpUpstream` (default): aiohttp's client, measured by
  `bench/gateway_overhead.py` at a fraction of httpx's per-request CPU on one
  core, which is what the gateway's throughput target needs;
* `HttpxUpstream`: httpx, kept selectable (`upstream_client: httpx`) so the
  bench can show the difference in one run.

Both raise `UpstreamConnectError` for failures before response headers that
are safe to fail over (connect refused/reset, pooled connection closed), and
`UpstreamTimeout` when the replica does not answer in time. The deadline for
response headers is the caller's (`post(..., headers_timeout_s)`): a stream's
headers come at once, a non-streaming response's only with its end.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Protocol

import aiohttp
import httpx
import yarl

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"content-length",
        b"date",
        b"server",
        b"proxy-connection",
        b"upgrade",
        b"te",
        b"trailer",
    }
)


class UpstreamConnectError(Exception):
    pass


class UpstreamTimeout(Exception):
    pass


class UpstreamBroken(Exception):
    """The replica's response body ended abnormally (connection lost mid-body)."""


class UpstreamResponse(Protocol):
    status: int
    headers: list[tuple[bytes, bytes]]

    async def read(self) -> bytes: ...
    def chunks(self) -> AsyncIterator[bytes]: ...  # the body's reads, none empty
    def release(self) -> None: ...
    def abort(self) -> None: ...


class Upstream(Protocol):
    async def post(self, url: str, body: bytes, headers: dict[str, str], headers_timeout_s: float) -> UpstreamResponse: ...
    async def close(self) -> None: ...


async def read_whole(resp: UpstreamResponse) -> bytes:
    """A whole response body; the connection goes back to the pool, or is
    closed if reading failed (or was cancelled) part-way."""
    try:
        data = await resp.read()
    except BaseException:
        resp.abort()
        raise
    resp.release()
    return data


# -- aiohttp ----------------------------------------------------------------
class _AiohttpResponse:
    __slots__ = ("_resp", "status", "headers")

    def __init__(self, resp) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = [(k.lower(), v) for k, v in resp.raw_headers if k.lower() not in HOP_BY_HOP]

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except asyncio.TimeoutError as exc:
            raise UpstreamTimeout("replica stopped sending") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamBroken(str(exc) or type(exc).__name__) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        content = self._resp.content
        try:
            while True:
                data = await content.readany()
                if not data:
                    break
                yield data
        except asyncio.TimeoutError as exc:
            raise UpstreamTimeout("replica stopped sending") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamBroken(str(exc) or type(exc).__name__) from exc

    def release(self) -> None:
        self._resp.release()

    def abort(self) -> None:
        self._resp.close()  # closes the connection: the replica sees the disconnect


class AiohttpUpstream:
    def __init__(self, pool_size: int, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float) -> None:
        self._connector = aiohttp.TCPConnector(limit=pool_size, limit_per_host=pool_size, keepalive_timeout=keepalive_s, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=self._connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            cookie_jar=aiohttp.DummyCookieJar(),  # replicas set no cookies; skip the jar's per-request work
        )
        self._urls: dict[str, yarl.URL] = {}  # parsed once per replica endpoint, not per request

    async def post(self, url: str, body: bytes, headers: dict[str, str], headers_timeout_s: float) -> _AiohttpResponse:
        parsed = self._urls.get(url)
        if parsed is None:
            if len(self._urls) > 1024:
                self._urls.clear()
            parsed = self._urls[url] = yarl.URL(url)
        try:
            async with asyncio.timeout(headers_timeout_s):
                resp = await self._session.post(parsed, data=body, headers=headers, allow_redirects=False)
        except aiohttp.ConnectionTimeoutError as exc:
            raise UpstreamConnectError(f"connect timeout: {exc}") from exc
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise UpstreamTimeout("replica did not answer in time") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamConnectError(str(exc) or type(exc).__name__) from exc
        except OSError as exc:
            raise UpstreamConnectError(str(exc)) from exc
        return _AiohttpResponse(resp)

    async def close(self) -> None:
        await self._session.close()


# -- httpx ------------------------------------------------------------------
class _HttpxResponse:
    def __init__(self, resp) -> None:
        self._resp = resp
        self.status = resp.status_code
        self.headers = [(k.lower(), v) for k, v in resp.headers.raw if k.lower() not in HOP_BY_HOP]

    async def read(self) -> bytes:
        try:
            return await self._resp.aread()
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout("replica stopped sending") from exc
        except httpx.HTTPError as exc:
            raise UpstreamBroken(str(exc) or type(exc).__name__) from exc
        finally:
            await self._resp.aclose()

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._resp.aiter_raw():
                if data:  # (the relay reads b"" as the body's end)
                    yield data
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout("replica stopped sending") from exc
        except httpx.HTTPError as exc:
            raise UpstreamBroken(str(exc) or type(exc).__name__) from exc

    def release(self) -> None:
        asyncio.ensure_future(self._resp.aclose())

    def abort(self) -> None:
        asyncio.ensure_future(self._resp.aclose())


class HttpxUpstream:
    def __init__(self, pool_size: int, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float) -> None:
        self._client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size, keepalive_expiry=keepalive_s),
            timeout=httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=read_timeout_s, pool=connect_timeout_s),
        )

    async def post(self, url: str, body: bytes, headers: dict[str, str], headers_timeout_s: float) -> _HttpxResponse:
        request = self._client.build_request("POST", url, content=body, headers=headers)
        try:
            async with asyncio.timeout(headers_timeout_s):
                resp = await self._client.send(request, stream=True)
        except httpx.ConnectTimeout as exc:
            raise UpstreamConnectError(f"connect timeout: {exc}") from exc
        except (TimeoutError, asyncio.TimeoutError, httpx.TimeoutException) as exc:
            raise UpstreamTimeout("replica did not answer in time") from exc
        except httpx.TransportError as exc:
            raise UpstreamConnectError(str(exc) or type(exc).__name__) from exc
        return _HttpxResponse(resp)

    async def close(self) -> None:
        await self._client.aclose()


def create_upstream(kind: str, pool_size: int, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float) -> Upstream:
    cls = HttpxUpstream if kind == "httpx" else AiohttpUpstream
    return cls(pool_size, connect_timeout_s, read_timeout_s, keepalive_s)
