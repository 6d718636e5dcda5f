"""contract/profiles.py: the one parser of speculation profile labels."""

import pytest

from contract.profiles import (
    ADAPTIVE_METHODS,
    BLOCK_SIZES,
    LABEL_PATTERNS,
    METHODS,
    OFF,
    PROFILE_LABELS,
    Profile,
    all_profiles,
    is_profile_label,
    parse_profile,
    profiles_of,
    supports_adaptive_verification,
    supports_knobs,
)

EXPECTED_LABELS = (
    "off",
    "ngram-k2", "ngram-k4", "ngram-k8",
    "eagle3-k2", "eagle3-k4", "eagle3-k8",
    "dflash-b4", "dflash-b8", "dflash-b16",
    "dspark-b4", "dspark-b4-av", "dspark-b8", "dspark-b8-av", "dspark-b16", "dspark-b16-av",
)  # fmt: skip


def test_every_label_round_trips():
    assert PROFILE_LABELS == EXPECTED_LABELS
    for label in PROFILE_LABELS:
        p = parse_profile(label)
        assert p.label == label
        assert parse_profile(label.upper()) == p
        assert Profile(block_size=p.block_size, adaptive=p.adaptive, method=p.method) == p
    assert [p.label for p in all_profiles()] == list(PROFILE_LABELS)
    assert {p.method for p in all_profiles()} == set(METHODS)
    assert [p.label for p in profiles_of("ngram")] == ["ngram-k2", "ngram-k4", "ngram-k8"]
    assert profiles_of("off") == [OFF]


def test_label_patterns_are_short_and_readable():
    assert LABEL_PATTERNS == "off, ngram-k{2,4,8}, eagle3-k{2,4,8}, dflash-b{4,8,16}, dspark-b{4,8,16}[-av]"


@pytest.mark.parametrize("label, method, n, adaptive", [
    ("ngram-k4", "ngram", 4, False),
    ("eagle3-k8", "eagle3", 8, False),
    ("dflash-b16", "dflash", 16, False),
    ("dspark-b8-av", "dspark", 8, True),
    (" OFF ", "off", 0, False),
    ("none", "off", 0, False),
])
def test_parse_fields(label, method, n, adaptive):
    p = parse_profile(label)
    assert (p.method, p.block_size, p.num_speculative_tokens, p.adaptive) == (method, n, n, adaptive)
    assert p.speculative == (method != "off")


def test_dspark_profiles_stay_as_they_were():
    """The controller and the cost model read `.block_size` / `.adaptive`; DSpark is the default method."""
    p = parse_profile("dspark-b8-av")
    assert p == Profile(block_size=8, adaptive=True) == Profile(8, True)
    assert p.method == "dspark" and p.speculative and p.num_speculative_tokens == 8
    assert parse_profile(" OFF ") is OFF and not OFF.speculative and OFF.method == "off" and OFF == Profile()
    assert BLOCK_SIZES == (4, 8, 16)


def test_capabilities_per_method():
    by = {p.label: p for p in all_profiles()}
    # per-request max_draft / max_batch: every speculative method (the plugin cuts in the scheduler)
    assert all(supports_knobs(m) for m in METHODS if m != "off") and not supports_knobs("off")
    assert by["ngram-k4"].knobs == by["eagle3-k4"].knobs == by["dflash-b8"].knobs == ("max_draft", "max_batch", "schedule")
    assert by["dspark-b8"].knobs == ("max_draft", "max_batch", "schedule")
    assert by["dspark-b8-av"].knobs == ("max_draft", "max_batch", "schedule", "min_confidence")
    assert OFF.knobs == ()
    # adaptive verification: DSpark only in vLLM 0.32/0.33
    assert ADAPTIVE_METHODS == {"dspark"}
    assert [m for m in METHODS if supports_adaptive_verification(m)] == ["dspark"]
    assert by["dspark-b4"].supports_adaptive_verification and not by["dflash-b4"].supports_adaptive_verification
    # drafter checkpoint and model runner
    assert [m for m in METHODS if Profile(block_size=4 if m != "off" else 0, method=m).needs_drafter] == [
        "eagle3", "dflash", "dspark"]
    assert {p.method: p.model_runner for p in all_profiles()} == {
        "off": None, "ngram": "v1", "eagle3": "v1", "dflash": "v1", "dspark": "v2"}


@pytest.mark.parametrize("bad, hint", [
    ("", None),
    ("dspark", "dspark labels: dspark-b4, dspark-b4-av"),
    ("dspark-b7", "dspark labels:"),
    ("dspark-b32", "dspark-b16-av"),
    ("dspark-b8-xx", "dspark labels:"),
    ("off-av", None),
    ("eagle3", "eagle3 labels: eagle3-k2, eagle3-k4, eagle3-k8"),
    ("eagle3-b8", "eagle3 labels:"),
    ("eagle3-k8-av", "-av (adaptive verification) is available only for dspark"),
    ("ngram-k3", "ngram labels: ngram-k2, ngram-k4, ngram-k8"),
    ("ngram-k4-av", "-av (adaptive verification) is available only for dspark"),
    ("dflash-k8", "dflash labels: dflash-b4, dflash-b8, dflash-b16"),
    ("dflash-b8-av", "-av (adaptive verification) is available only for dspark"),
    ("medusa-k4", None),
    (None, None),
])
def test_parse_rejects_with_the_accepted_labels(bad, hint):
    with pytest.raises(ValueError, match="expected one of") as exc:
        parse_profile(bad)
    message = str(exc.value)
    assert LABEL_PATTERNS in message and "unknown speculation profile" in message
    if hint:
        assert hint in message
    assert len(message) < 300  # a pattern list, not every label
    assert not is_profile_label(bad)


@pytest.mark.parametrize("kwargs", [
    dict(block_size=4, method="medusa"),
    dict(block_size=0, method="ngram"),
    dict(block_size=4, method="off"),
    dict(block_size=8, adaptive=True, method="dflash"),
])
def test_inconsistent_profiles_are_refused(kwargs):
    with pytest.raises(ValueError):
        Profile(**kwargs)
