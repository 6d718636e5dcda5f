"""The stream ledger's pure parts: what the client has not seen of the ids
it was sent, and stop strings across a splice."""

from __future__ import annotations

from gateway.stream.ledger import StopAcrossSplice, withheld_text


def test_withheld_text_is_what_the_ids_decode_to_beyond_what_was_sent():
    assert withheld_text("hello wor", "hello ") == "wor"
    assert withheld_text("hello \ufffd", "hello ") == ""  # an incomplete character comes whole from the continuation
    assert withheld_text("hullo", "hello") is None


def test_stop_string_across_the_splice_ends_the_stream_where_vllm_would():
    stop = StopAcrossSplice(["STOP"], include=False, sent_text="abc S", withheld="T")
    assert stop.feed("O") == ("", None)  # could still be the start of STOP: held back
    assert stop.feed("Pxyz") == ("", "STOP")  # "S" was sent before the break: nothing more


def test_stop_string_found_after_the_splice_keeps_the_text_before_it():
    stop = StopAcrossSplice(["<end>", "##"], include=False, sent_text="abc", withheld="")
    out = []
    for piece in ["de", "f <e", "nd> more"]:
        text, hit = stop.feed(piece)
        out.append(text)
        if hit:
            break
    assert "".join(out) == "def " and hit == "<end>"


def test_stop_string_included_in_the_output_when_asked():
    stop = StopAcrossSplice(["##"], include=True, sent_text="x#", withheld="")
    assert stop.feed("#tail") == ("#", "##")


def test_no_stop_string_releases_everything_at_the_end():
    stop = StopAcrossSplice(["STOP"], include=False, sent_text="", withheld="ab")
    text, hit = stop.feed("cdef")
    assert (text, hit) == ("abc", None)
    assert stop.flush() == "def"
