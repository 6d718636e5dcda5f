"""Schemathesis hooks for `test_schemathesis.py` (loaded through
`SCHEMATHESIS_HOOKS`): completion bodies name a model the test gateway knows
(served, configured-but-down, unknown) so generated requests reach the
budget, routing and relay stages instead of stopping at the model check."""

from __future__ import annotations

import schemathesis
from hypothesis import strategies as st

MODELS = ("fake-model", "fake-model", "no-such-model")
COMPLETIONS = ("/v1/chat/completions", "/v1/completions")


@schemathesis.hook
def flatmap_body(context, body):
    op = context.operation
    if op is None or op.path not in COMPLETIONS or not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return st.just(body)
    return st.sampled_from(MODELS).map(lambda model: {**body, "model": model})
