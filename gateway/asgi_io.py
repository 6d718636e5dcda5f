"""ASGI plumbing of the request path: read the body, send an OpenAI-shaped
error, and watch `receive` for the client going away."""

from __future__ import annotations

import asyncio

from .errors import GatewayError

_JSON = b"application/json"


class ClientGone(Exception):
    """The client disconnected while its request body was being read."""


async def send_error(send, err: GatewayError, extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = err.body()
    headers = [(b"content-type", _JSON), (b"content-length", str(len(body)).encode())]
    headers += err.headers
    if extra_headers:
        headers += extra_headers
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive, limit: int, content_length: int | None) -> bytes:
    if content_length is not None and content_length > limit:
        raise GatewayError(413, f"Request body of {content_length} bytes exceeds the limit of {limit} bytes.", code="request_too_large")
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise GatewayError(413, f"Request body exceeds the limit of {limit} bytes.", code="request_too_large")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def watch_disconnect(receive) -> asyncio.Task:
    """From now on a client disconnect cancels the current task (which closes
    the upstream connection, so the replica aborts the request)."""
    return asyncio.ensure_future(_watch(receive, asyncio.current_task()))


async def _watch(receive, task: asyncio.Task) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return
