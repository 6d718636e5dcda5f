"""Token accounting for streams: include_usage injected upstream, stripped for
clients that did not ask, kept for those that did; telemetry recorded."""

from __future__ import annotations

import openai

from contract.telemetry import read_all
from contract.store.redis_store import RedisStore

from .conftest import KEYS, backend_requests


def test_include_usage_injected_and_stripped(start_backend, start_gateway):
    backend = start_backend(spec=True)
    gw = start_gateway([{"url": backend.url, "name": "r1"}])
    c = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0)
    chunks = list(c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "a b c"}], max_tokens=3, stream=True))
    assert backend_requests(backend)[-1]["body"]["stream_options"] == {"include_usage": True}
    assert all(ch.usage is None for ch in chunks)
    assert all(ch.choices for ch in chunks)  # no usage-only (choices=[]) chunk reached the client


def test_client_requested_usage_is_kept(start_backend, start_gateway):
    backend = start_backend(spec=True)
    gw = start_gateway([{"url": backend.url, "name": "r1"}])
    c = openai.OpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0)
    chunks = list(
        c.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "a b c"}], max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 3
    assert chunks[-1].model_extra["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0


async def test_stream_usage_and_spec_telemetry_recorded(start_backend, start_gateway, redis_url, redis_prefix):
    backend = start_backend(spec=True, draft_k=4, accepted_per_step=2)
    gw = start_gateway([{"url": backend.url, "name": "r1"}])
    c = openai.AsyncOpenAI(base_url=gw.v1(), api_key=KEYS["alpha"], max_retries=0)
    stream = await c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "a b c"}], max_tokens=9, stream=True)
    async for _ in stream:
        pass
    await c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "a"}], max_tokens=6)
    await c.close()
    store = RedisStore(redis_url, prefix=redis_prefix)
    try:
        async def counters():
            rows = {(t.tenant, t.replica): t for t in await read_all(store)}
            row = rows.get(("alpha", "r1"))
            return row if row and row.get("requests") == 2 else None

        import asyncio

        row = None
        for _ in range(300):
            row = await counters()
            if row:
                break
            await asyncio.sleep(0.05)
        assert row is not None
        assert row.get("completion_tokens") == 15
        assert row.get("prompt_tokens") == 3 + 1
        # 9 tokens at 2 accepted + 1 bonus per step -> 3 steps; 6 tokens -> 2 steps.
        assert row.get("num_spec_steps") == 5
        assert row.get("num_accepted_draft_tokens") == 15 - 5
        assert row.get("num_draft_tokens") == 5 * 4
        assert row.acceptance_length == 1 + 10 / 5
    finally:
        await store.close()
