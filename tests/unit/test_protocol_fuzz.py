"""Fuzz target for the WebSocket frame parser (``conversations.protocol.parse_text_frame``), run in every
test run with hypothesis: for any input, bytes decoded as the socket would pass them on, arbitrary Unicode
(lone surrogates included), any JSON document, or a frame shaped like a real one with hostile values, the
parser either returns a valid frame or raises ``FrameRejected``; nothing else escapes, and what it returns
is safe to store (ids in ``bigint`` range, text free of NUL and lone surrogates).

Deterministic (``derandomize``) so a run is the same everywhere; the example counts (about 5,500 inputs in all)
exercise every frame type's fields in seconds on two cores."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conversations.protocol import MAX_ID, FrameRejected, parse_text_frame
from database.storable_text import text_problem


def fuzz(examples: int):
    return settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


FRAME_TYPES = ["send", "stop", "resume", "regenerate", "edit", "continue", "hello", ""]
FIELDS = ["type", "conversation_id", "content", "client_id", "model", "resend", "message_id", "after_seq"]

any_char = st.characters(codec=None, categories=None)  # every code point, lone surrogates included
any_text = st.text(any_char, max_size=200)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | any_text
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(any_text, inner, max_size=5),
    max_leaves=20,
)
hostile_values = (
    json_scalars
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([MAX_ID, MAX_ID + 1, 0, -1, "", "\x00", "\ud800", "1e400", 1e308, "NaN"])
    | st.uuids().map(str)
    | json_values
)
shaped_frames = st.fixed_dictionaries(
    {"type": st.sampled_from(FRAME_TYPES)},
    optional={name: hostile_values for name in FIELDS[1:]},
)


def check(text: str) -> None:
    try:
        frame = parse_text_frame(text)
    except FrameRejected as exc:
        assert exc.code == "invalid_request" and str(exc)
        return
    for name, value in frame.model_dump().items():
        if isinstance(value, str):
            assert text_problem(value) is None, (name, value)
        if isinstance(value, int) and not isinstance(value, bool) and name.endswith("_id"):
            assert 1 <= value <= MAX_ID, (name, value)


@fuzz(2000)
@given(st.binary(max_size=512))
def test_any_bytes_are_parsed_or_rejected(raw):
    # Invalid UTF-8 becomes lone surrogates, the worst text a str can hold.
    check(raw.decode("utf-8", errors="surrogateescape"))


@fuzz(2000)
@given(any_text)
def test_any_unicode_text_is_parsed_or_rejected(text):
    check(text)


@fuzz(500)
@given(json_values, st.booleans())
def test_any_json_document_is_parsed_or_rejected(value, ascii_only):
    check(json.dumps(value, ensure_ascii=ascii_only))


@fuzz(1000)
@given(shaped_frames, st.booleans())
def test_frames_shaped_like_real_ones_with_hostile_values_are_parsed_or_rejected(frame, ascii_only):
    check(json.dumps(frame, ensure_ascii=ascii_only))


def test_the_fuzzer_reaches_valid_frames():
    """The target is not vacuous: well-formed frames parse."""
    assert parse_text_frame('{"type": "send", "content": "hi"}').content == "hi"
    assert parse_text_frame('{"type": "stop", "message_id": 5}').message_id == 5
