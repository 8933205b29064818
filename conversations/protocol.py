"""Client -> server WebSocket frames (``docs/websocket-protocol.md``), validated with pydantic.

Besides the frame shapes this module holds the limits every frame is checked against before it reaches a
service: :data:`MAX_FRAME_BYTES` (checked on the raw text, before JSON parsing), ids within PostgreSQL's
``bigint`` range, and text free of NUL characters and lone surrogates (PostgreSQL refuses both in ``text``).
"""

import json
import time
import uuid
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

#: Largest text frame the consumer parses, in UTF-8 bytes (64 KiB: a 16,000-character message needs at most
#: ~64 KB of JSON). Larger frames get ``invalid_request``; daphne itself drops frames over its own
#: ``--websocket-max-message-size`` (1 MiB) with close code 1009.
MAX_FRAME_BYTES = 64 * 1024
#: Largest JSON nesting depth accepted; the protocol needs 2 (a frame object holding scalars).
MAX_JSON_DEPTH = 32
#: Ids are PostgreSQL ``bigint`` primary keys.
MAX_ID = 2**63 - 1


class FrameRejected(ValueError):
    """A frame refused before validation; ``code`` is the protocol error code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _clean_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must not contain lone surrogates (invalid Unicode)") from None
    return value


def _uuid_text(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ValueError("must be a UUID") from None


Text = Annotated[str, AfterValidator(_clean_text)]
Id = Annotated[int, Field(ge=1, le=MAX_ID)]
#: A registered model's name as the page lists it ("" = the tier's routing); which names a user may pick is
#: checked against their tier by admission control (``model_not_found``), not here.
ModelName = Annotated[str, Field(max_length=100), AfterValidator(_clean_text)]
ClientId = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_uuid_text)]


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SendFrame(_Frame):
    """Send a user message; ``conversation_id`` None starts a new conversation. ``client_id`` (a UUID the
    page chooses per message) makes a resend idempotent: the same id answers with the stored ticket.
    ``model``: the model picked on the page for this conversation ("" = the tier's routing; left out =
    keep the conversation's choice). ``resend``: true when the page sends a keyed message again because the
    connection dropped before the server answered; such a frame is never refused from the cached load
    figures, since the first one may have been stored and must then be answered with its ticket."""

    type: Literal["send"]
    conversation_id: Id | None = None
    content: Text
    client_id: ClientId | None = None
    model: ModelName | None = None
    resend: bool = False


class StopFrame(_Frame):
    """Stop generating a reply (its partial text is kept)."""

    type: Literal["stop"]
    message_id: Id


class ResumeFrame(_Frame):
    """Replay a reply's deltas with ``seq > after_seq`` (-1: all), then follow it live."""

    type: Literal["resume"]
    message_id: Id
    after_seq: int = Field(default=-1, ge=-1, le=MAX_ID)


class RegenerateFrame(_Frame):
    """Answer the last user message again (the old reply is kept as a sibling); ``model`` as for ``send``."""

    type: Literal["regenerate"]
    conversation_id: Id
    model: ModelName | None = None


class EditFrame(_Frame):
    """Edit a sent user message: a sibling branch with ``content`` and a new reply; ``model`` as for
    ``send``."""

    type: Literal["edit"]
    message_id: Id
    content: Text
    model: ModelName | None = None


class ContinueFrame(_Frame):
    """Continue the last reply, which stopped at the length limit."""

    type: Literal["continue"]
    message_id: Id


AnyClientFrame = SendFrame | StopFrame | ResumeFrame | RegenerateFrame | EditFrame | ContinueFrame
ClientFrame = TypeAdapter(Annotated[AnyClientFrame, Field(discriminator="type")])


def parse_client_frame(data) -> AnyClientFrame:
    """Validate one decoded JSON frame. Raises ``pydantic.ValidationError`` with the offending field."""
    return ClientFrame.validate_python(data)


def _depth_exceeds(text: str, limit: int) -> bool:
    # Bracket depth counted outside JSON strings: linear and allocation-free, so a 100,000-level document
    # never reaches json.loads (whose C scanner would raise RecursionError, or worse).
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def decode_text_frame(text: str) -> dict:
    """Decode one text frame into a JSON object, enforcing the size and nesting limits.

    Raises :class:`FrameRejected` with code ``invalid_request`` (over :data:`MAX_FRAME_BYTES` UTF-8 bytes,
    not JSON, nested deeper than :data:`MAX_JSON_DEPTH`, not an object).
    """
    if len(text) > MAX_FRAME_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
        raise FrameRejected("invalid_request", f"Frames are limited to {MAX_FRAME_BYTES} bytes.")
    if _depth_exceeds(text, MAX_JSON_DEPTH):
        raise FrameRejected("invalid_request", f"Frames may nest at most {MAX_JSON_DEPTH} levels deep.")
    try:
        content = json.loads(text)
    except (ValueError, RecursionError):
        raise FrameRejected("invalid_request", "Frames must be JSON.") from None
    if not isinstance(content, dict):
        raise FrameRejected("invalid_request", "Frames must be JSON objects.")
    return content


class FrameBucket:
    """Token bucket limiting one socket's frames: ``rate`` frames/s sustained, ``burst`` at once.
    ``take()`` returns 0.0 when a frame may pass, else the seconds until one may."""

    def __init__(self, *, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.stamp = clock()

    def take(self) -> float:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


def parse_text_frame(text: str) -> AnyClientFrame:
    """One WebSocket text frame to a validated client frame: :func:`decode_text_frame` then
    :func:`parse_client_frame`. Every refusal is a :class:`FrameRejected` (code ``invalid_request``) whose
    message names the offending field; no other exception leaves this function for any input (a fuzz target
    in tests/unit/test_protocol_fuzz.py holds it to that)."""
    data = decode_text_frame(text)
    try:
        return parse_client_frame(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "frame"
        raise FrameRejected("invalid_request", f"Invalid frame: {where}: {error['msg']}") from None
