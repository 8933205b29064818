"""Client -> server WebSocket frames (``docs/websocket-protocol.md``), validated with pydantic."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SendFrame(_Frame):
    """Send a user message; ``conversation_id`` None starts a new conversation."""

    type: Literal["send"]
    conversation_id: int | None = None
    content: str


class StopFrame(_Frame):
    """Stop generating a reply (its partial text is kept)."""

    type: Literal["stop"]
    message_id: int


class ResumeFrame(_Frame):
    """Replay a reply's deltas with ``seq > after_seq`` (-1: all), then follow it live."""

    type: Literal["resume"]
    message_id: int
    after_seq: int = Field(default=-1, ge=-1)


class RegenerateFrame(_Frame):
    """Replace the conversation's last reply with a new one."""

    type: Literal["regenerate"]
    conversation_id: int


class EditFrame(_Frame):
    """Edit a sent user message: a sibling branch with ``content`` and a new reply."""

    type: Literal["edit"]
    message_id: int
    content: str


class ContinueFrame(_Frame):
    """Continue the last reply, which stopped at the length limit."""

    type: Literal["continue"]
    message_id: int


AnyClientFrame = SendFrame | StopFrame | ResumeFrame | RegenerateFrame | EditFrame | ContinueFrame
ClientFrame = TypeAdapter(Annotated[AnyClientFrame, Field(discriminator="type")])


def parse_client_frame(data) -> AnyClientFrame:
    """Validate one decoded JSON frame. Raises ``pydantic.ValidationError`` with the offending field."""
    return ClientFrame.validate_python(data)
