"""A failure inside the plugin's step-loop code costs speculation control, never the engine."""

from __future__ import annotations

import logging

from drafters.vllm_ext import guard


def test_failure_returns_fallback_and_logs_once(caplog, monkeypatch):
    monkeypatch.setattr(guard, "_reported", set())
    monkeypatch.setattr(guard.logger, "propagate", True)

    def broken(x):
        raise KeyError(x)

    with caplog.at_level(logging.ERROR, logger="specgate.vllm_ext"):
        assert guard.run_guarded("site-a", "stock", broken, 1) == "stock"
        assert guard.run_guarded("site-a", "stock", broken, 2) == "stock"
    assert sum("site-a failed" in r.getMessage() for r in caplog.records) == 1


def test_success_passes_the_result_through():
    assert guard.run_guarded("site-b", None, lambda a, b: a + b, 2, 3) == 5


def test_patch_once_wraps_once_keeps_names_and_leaves_subclasses_unmarked():
    from drafters.vllm_ext.guard import patch_once

    class Base:
        def step(self, x):
            """Stock step."""
            return x

    calls = []

    def wrap(orig):
        def step(self, x):
            calls.append(x)
            return orig(self, x) + 1

        return step

    assert patch_once(Base, "_marked", {"step": wrap}) is True
    assert patch_once(Base, "_marked", {"step": wrap}) is False  # a second install wraps nothing
    assert Base().step(1) == 2 and calls == [1]
    assert Base.step.__name__ == "step" and Base.step.__doc__ == "Stock step."

    class Child(Base):
        pass

    assert "_marked" not in Child.__dict__  # its own patch would still apply
