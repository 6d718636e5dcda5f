"""Keep the engine alive whatever the plugin's own code does.

Every piece of specgate logic that runs inside vLLM's step loop goes through
`run_guarded`: an unexpected error (a changed internal in a vLLM release we
did not verify, a request state we did not foresee) is logged once per site
with its traceback and that step runs exactly as stock vLLM would. A plugin
bug must cost speculation control, never the replica.
"""

from __future__ import annotations

import functools
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


def patch_once(cls: type, mark: str, wrappers: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]]) -> bool:
    """Replace methods of `cls` by wrappers of the originals, once.

    `wrappers` maps a method name to a function that takes the original and
    returns its replacement (which keeps the original's name and docstring).
    The mark lives in the class's own `__dict__`, so a subclass of a patched
    class is not mistaken for patched, and installing twice (the plugin is
    loaded by every vLLM process, sometimes twice in one) wraps nothing
    twice. Returns whether it patched.
    """


    if cls.__dict__.get(mark):
        return False
    for name, make in wrappers.items():
        original = getattr(cls, name)
        setattr(cls, name, functools.wraps(original)(make(original)))
    setattr(cls, mark, True)
    return True
