"""testbed.report: one spelling of a policy's knobs for the sweeps and `specgate load`."""

from __future__ import annotations

from testbed.report import policy_knobs, policy_label, table


def test_short_and_long_name_the_same_knobs_in_the_same_order():
    policy = {"enabled": True, "max_draft": 2, "min_confidence": 0.3, "max_batch": 4, "preferred_profile": "dspark-b8"}
    assert policy_knobs(policy) == ["max_draft=2", "min_conf=0.30", "max_batch=4", "profile=dspark-b8"]
    assert policy_label(policy) == "on k<=2 conf>=0.30 B<=4 ->dspark-b8"


def test_a_schedule_reads_as_batch_colon_draft_pairs():
    policy = {"enabled": True, "max_draft": 8, "schedule": [[4, 8], [32, 2]]}
    assert policy_knobs(policy) == ["max_draft=8", "schedule=4:8/32:2"]
    assert policy_label(policy) == "on k<=8 S=4:8/32:2"


def test_a_policy_that_does_not_speculate_has_no_knobs():
    assert policy_label({"enabled": False, "max_draft": 4}) == "off"
    assert policy_label({"enabled": True, "max_draft": 0}) == "off"
    assert policy_knobs({"enabled": True, "max_draft": 0, "max_batch": 4}) == []
    assert policy_label({"enabled": True}) == "on"
    assert policy_label(None) == "?"


def test_table_aligns_columns_under_a_rule():
    assert table(["a", "bb"], [["xyz", "1"], ["q", "22"]]).splitlines() == ["a    bb", "---  --", "xyz  1", "q    22"]


def test_a_probe_is_named_after_the_policy():
    off = {"enabled": False, "max_draft": 0, "probe": {"share": 0.05, "schedule": [[6, 8]], "profile": "ngram-k8"}}
    assert policy_label(off) == "off + probe 5% S=6:8"
    held = {"enabled": True, "max_draft": 4, "probe": {"share": 0.1, "schedule": [[1, 0]]}}
    assert policy_label(held) == "on k<=4 + probe 10% S=1:0"
