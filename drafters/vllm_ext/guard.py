"""Keep the engine alive whatever the plugin's own code does.

Every piece of specgate logic that runs inside vLLM's step loop goes through
`run_guarded`: an unexpected error (a changed internal in a vLLM release we
did not verify, a request state we did not foresee) is logged once per site
with its traceback and that step runs exactly as stock vLLM would. A plugin
bug must cost speculation control, never the replica.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

logger = logging.getLogger("specgate.vllm_ext")

T = TypeVar("T")
_reported: set[str] = set()


def run_guarded(site: str, fallback: T, fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - see module docstring
        if site not in _reported:
            _reported.add(site)
            logger.exception("specgate: %s failed; the step runs as stock vLLM (logged once)", site)
        return fallback
