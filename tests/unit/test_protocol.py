import pytest
from pydantic import ValidationError

from conversations.protocol import (
    MAX_FRAME_BYTES,
    FrameBucket,
    FrameRejected,
    ResumeFrame,
    SendFrame,
    StopFrame,
    decode_text_frame,
    parse_client_frame,
)


def test_valid_frames_parse():
    assert parse_client_frame({"type": "send", "conversation_id": None, "content": "hi"}) == SendFrame(
        type="send", conversation_id=None, content="hi"
    )
    assert isinstance(parse_client_frame({"type": "stop", "message_id": 3}), StopFrame)
    assert parse_client_frame({"type": "resume", "message_id": 3}).after_seq == -1
    assert isinstance(parse_client_frame({"type": "resume", "message_id": 3, "after_seq": 7}), ResumeFrame)


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "dance"},
        {"type": "send"},
        {"type": "send", "content": 5},
        {"type": "stop", "message_id": "3"},
        {"type": "resume", "message_id": 1, "after_seq": -2},
        {"type": "regenerate"},
        {"type": "send", "content": "x", "extra": 1},
    ],
)
def test_invalid_frames_are_rejected(frame):
    with pytest.raises(ValidationError):
        parse_client_frame(frame)


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "send", "content": "a\x00b"},
        {"type": "send", "content": "\ud800"},
        {"type": "send", "content": "x", "client_id": "not-a-uuid"},
        {"type": "stop", "message_id": 0},
        {"type": "stop", "message_id": -5},
        {"type": "stop", "message_id": 2**63},
        {"type": "send", "conversation_id": 2**64, "content": "x"},
    ],
)
def test_hostile_values_are_rejected(frame):
    with pytest.raises(ValidationError):
        parse_client_frame(frame)


def test_client_id_is_normalised_uuid():
    frame = parse_client_frame(
        {"type": "send", "content": "x", "client_id": "4B0F5D2E-8C1A-4F5E-9A57-0E6C1D2B3A4F"}
    )
    assert frame.client_id == "4b0f5d2e-8c1a-4f5e-9a57-0e6c1d2b3a4f"


@pytest.mark.parametrize(
    "text",
    [
        "x" * (MAX_FRAME_BYTES + 1),
        '{"content": "' + "é" * (MAX_FRAME_BYTES // 2) + '"}',  # few characters, too many bytes
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 40 + "1" + "}" * 40,
        "[1]",
        "nope",
    ],
)
def test_decode_refuses_oversized_deep_or_non_object_frames(text):
    with pytest.raises(FrameRejected) as exc:
        decode_text_frame(text)
    assert exc.value.code == "invalid_request"


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = '{"type": "send", "content": "' + "[{" * 1000 + '"}'
    assert decode_text_frame(text)["content"] == "[{" * 1000


def test_frame_bucket_allows_a_burst_then_the_rate():
    now = [0.0]
    bucket = FrameBucket(rate=10, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.1)
    now[0] += 0.1
    assert bucket.take() == 0.0
    assert bucket.take() > 0
