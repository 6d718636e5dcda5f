"""The request body as each replica gets it.

Why the gateway changes it: `stream_options.include_usage` is forced on for
streams, so tokens can be accounted (`strip_usage` says the usage chunk must
not reach a client that did not ask for it); `return_token_ids` is forced on
for streams that can be continued (`continuation`) and for capture
candidates (`ctx.capture`, streaming or not), and stripped again for a
client that did not ask (`client_ids`); and the tenant's speculation knobs
are merged in where the replica honours them. One serialisation per
distinct knob set.
"""

from __future__ import annotations

import orjson

from contract.knobs import merged_xargs

from .request_context import RequestContext
from .stream.continuation import ContinuationRequest, unsupported


class UpstreamBodies:
    """One request's upstream bodies, per replica knob set."""

    __slots__ = ("_cache", "body", "client_ids", "client_xargs", "continuation", "not_continuable", "plain", "policy",
                 "strip_usage")

    def __init__(self, ctx: RequestContext, continuations: int = 0) -> None:
        body = self.body = ctx.body
        self.client_xargs = ctx.client_xargs
        self.policy = ctx.policy
        self.strip_usage = False
        self.continuation: ContinuationRequest | None = None
        self.not_continuable: str | None = None
        client_ids = self.client_ids = body.get("return_token_ids") is True
        if ctx.stream:
            so = body.get("stream_options")
            if not (isinstance(so, dict) and so.get("include_usage") is True):
                body["stream_options"] = so = {**(so if isinstance(so, dict) else {}), "include_usage": True}
                self.strip_usage = True
            if continuations > 0:
                self.not_continuable = unsupported(body, ctx.endpoint)
                if self.not_continuable is None:
                    self.continuation = ContinuationRequest(
                        body=dict(body), chat=ctx.endpoint == "chat", client_ids=client_ids, strip_usage=self.strip_usage,
                        continuous=bool(so.get("continuous_usage_stats")), client_xargs=ctx.client_xargs, policy=ctx.policy,
                    )
                    body["return_token_ids"] = True
        if ctx.capture is not None:
            body["return_token_ids"] = True
        self.plain = orjson.dumps(body)
        self._cache: dict[frozenset[str], bytes] = {}

    def for_replica(self, replica) -> bytes:
        knobs = replica.ext_knobs
        cached = self._cache.get(knobs)
        if cached is None:
            xargs = merged_xargs(self.client_xargs, self.policy, knobs)
            if xargs is self.client_xargs or xargs is None:
                cached = self.plain
            else:
                cached = orjson.dumps({**self.body, "vllm_xargs": xargs})
            self._cache[knobs] = cached
        return cached
