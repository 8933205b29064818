"""Incremental detokenization (UTF-8 safety) and stop-string hold-back, with the real tokenizer."""

from __future__ import annotations

import pytest

from inference.engine.detokenizer import (
    IncrementalDetokenizer,
    OutputProcessor,
    StopStringFilter,
    make_decode_fn,
)

TEXTS = [
    "plain ascii text, nothing special",
    "emoji 🎉🔥👋🏽👨‍👩‍👧 in a row",
    "中文和日本語のテキスト、한국어도",
    "accents: café, naïve, Ærøskøbing — “quotes”",
]


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_decode_never_emits_partial_characters(tokenizer, text):
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(make_decode_fn(tokenizer))
    deltas = [detok.add(t) for t in ids]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text == tokenizer.decode(ids)


def test_flush_releases_incomplete_character_at_end(tokenizer):
    ids = tokenizer.encode("ok 🎉")
    partial = ids[:-1]  # cut inside the emoji's bytes
    detok = IncrementalDetokenizer(make_decode_fn(tokenizer))
    streamed = "".join(detok.add(t) for t in partial)
    assert "\ufffd" not in streamed
    assert streamed + detok.flush() == tokenizer.decode(partial)


def test_stop_filter_holds_back_possible_prefix_and_cuts():
    f = StopStringFilter(["END", "\n\n"])
    assert f.push("hello E") == ("hello ", False)
    assert f.push("N") == ("", False)
    assert f.push("D and more") == ("", True)
    assert f.text == "hello "


def test_stop_filter_releases_false_alarm():
    f = StopStringFilter(["END"])
    assert f.push("an EN") == ("an ", False)
    assert f.push("gine") == ("ENgine", False)
    assert f.push(" E") == (" ", False)
    assert f.flush() == "E"
    assert f.text == "an ENgine E"


def test_stop_filter_earliest_match_wins_across_stops():
    f = StopStringFilter(["world", "lo w"])
    assert f.push("hello world") == ("hel", True)


def test_output_processor_stop_spanning_tokens(tokenizer):
    text = "The answer is 42.\nUser: next question"
    proc = OutputProcessor(make_decode_fn(tokenizer), ["\nUser:"])
    out, stopped = "", False
    for t in tokenizer.encode(text):
        delta, stopped = proc.add_token(t)
        out += delta
        assert "\n" not in out  # the stop string's first char is never leaked
        if stopped:
            break
    assert stopped and out == "The answer is 42." == proc.text
