"""Deferred patching: a patch runs in whichever process imports its module."""

from __future__ import annotations

import sys

from drafters.vllm_ext.lazy import when_imported


def test_patch_runs_after_a_later_import(tmp_path, monkeypatch):
    (tmp_path / "specgate_lazy_probe.py").write_text("VALUE = 1\ndef f():\n    return 'stock'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("specgate_lazy_probe", None)
    seen = []

    def patch(module):
        seen.append(module.VALUE)  # the module body has run
        module.f = lambda: "patched"

    when_imported("specgate_lazy_probe", patch)
    assert seen == []  # nothing imported yet
    import specgate_lazy_probe

    assert seen == [1] and specgate_lazy_probe.f() == "patched"
    assert specgate_lazy_probe.__spec__.loader.get_source("specgate_lazy_probe").startswith("VALUE = 1")
    sys.modules.pop("specgate_lazy_probe", None)


def test_patch_runs_at_once_for_a_loaded_module_and_errors_never_propagate(caplog):
    import json

    calls = []
    when_imported("json", lambda m: calls.append(m is json))
    when_imported("json", lambda m: 1 / 0)  # logged, not raised
    assert calls == [True]
    assert "patching json failed" in caplog.text
