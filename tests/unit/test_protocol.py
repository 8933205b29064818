import pytest
from pydantic import ValidationError

from conversations.protocol import ResumeFrame, SendFrame, StopFrame, parse_client_frame


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
