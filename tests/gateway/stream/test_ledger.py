"""The stream ledger's pure parts: what the client has not seen of the ids
it was sent, and stop strings across a splice."""

from __future__ import annotations

from gateway.stream.ledger import StopAcrossSplice, StreamLedger, ends_on_character, withheld_text


def test_withheld_text_is_what_the_ids_decode_to_beyond_what_was_sent():
    assert withheld_text("hello wor", "hello ") == "wor"
    assert withheld_text("hullo", "hello") is None


def test_a_character_boundary_is_text_that_does_not_end_in_a_replacement_character():
    assert ends_on_character("héllo") and ends_on_character("")
    assert not ends_on_character("h\ufffd")  # the first byte(s) of a character, or bytes that make none
    assert ends_on_character("\ufffd\ufffdx")  # invalid bytes before a whole character: a boundary after it


def test_rewind_takes_the_ids_of_a_partial_character_back_for_the_continuation():
    led = StreamLedger()
    led.prompt_ids = [1, 2]
    led.start_part("a")
    led.took([10, 11], "ab")
    led.took([12], "")  # the first byte of a three-byte character: its id, no text
    led.start_part("b")  # a continuation, which broke after the second byte
    led.took([13], "")
    led.rewind(2)
    assert led.sent_ids == [10, 11] and led.replay == [12, 13] and led.sent_text == "ab"
    assert [p.tokens for p in led.parts] == [2, 0]  # taken back across parts
    assert led.usage()["completion_tokens"] == 2
    led.start_part("c")  # the next continuation generated the first byte again, then broke
    led.replay.pop(0)  # (what its tap does with an id the client already has)
    led.took([12], "")
    led.rewind(2)
    assert led.sent_ids == [10, 11] and led.replay == [12, 13]  # in front of what is still to come: the client's order
    assert [p.tokens for p in led.parts] == [2, 0, 0]
    led.rewind(2)  # nothing after the boundary: nothing changes
    assert led.sent_ids == [10, 11] and led.replay == [12, 13]


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
