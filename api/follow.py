"""Following one reply's frames from an async view: the channel-layer group ``chat.message.<id>`` (joined
before the generation is dispatched, so no frame is missed), with a database check whenever the stream
has been quiet for a while (a worker that died, or a reply that ended while nobody listened)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async

from conversations import broadcast
from conversations.models import Message

#: Seconds without a frame after which the stored reply is looked at.
IDLE_CHECK_S = 5.0


class ReplyLost(Exception):
    """The reply is gone from the database without a ``done`` frame having been seen."""


def _stored_done_frame(message_id: int) -> dict[str, Any] | None:
    """``done`` frame from the stored reply when it has ended; None while active; raises ReplyLost."""
    message = Message.objects.filter(pk=message_id).first()
    if message is None:
        raise ReplyLost(f"reply {message_id} no longer exists")
    if message.is_active:
        return None
    return broadcast.frame_done(message=message)


async def reply_frames(layer, channel: str, message_id: int) -> AsyncIterator[dict[str, Any]]:
    """Yield ``token`` frames of ``message_id`` once each, in ``seq`` order, then its ``done`` frame; the
    caller has added ``channel`` to ``broadcast.message_group(message_id)``. When tokens were missed, the
    ``done`` frame's ``content`` still holds the whole text."""
    last_seq = -1
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(layer.receive(channel))
            # Not wait_for: cancelling a channel-layer receive on every timeout could drop a buffered frame.
            done, _ = await asyncio.wait({pending}, timeout=IDLE_CHECK_S)
            if not done:
                frame = await sync_to_async(_stored_done_frame)(message_id)
                if frame is not None:
                    yield frame
                    return
                continue
            event, pending = pending.result(), None
            frame = event.get("frame") or {}
            if frame.get("type") == "token" and frame.get("seq", -1) > last_seq:
                last_seq = frame["seq"]
                yield frame
            elif frame.get("type") == "done":
                yield frame
                return
    finally:
        if pending is not None:
            pending.cancel()
