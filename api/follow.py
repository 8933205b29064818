"""Following one reply's frames from an async view: the channel-layer group ``chat.message.<id>`` (joined
before the generation is dispatched, so no frame is missed), with a database check whenever the stream
has been quiet for a while (a worker that died, or a reply that ended while nobody listened); and letting
go of it (:class:`ReplySubscription`), which cancels the generation when its client left before its end."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async

from api.dbconn import close_request_connections
from conversations import broadcast
from conversations.completions import completion_cancel
from conversations.models import Message
from observability.logs import log_context

logger = logging.getLogger(__name__)

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


class ReplySubscription:
    """A view's hold on one queued reply: the channel ``channel`` in the reply's group, and the duty to
    cancel the generation if the client goes away before the reply ended.

    The view sets ``ended`` once it has seen the reply's ``done`` frame (or lost the reply). Closing the
    subscription (:meth:`close` in a thread, :meth:`aclose` on the event loop; once, whichever comes first)
    cancels the reply unless it ended (``completion_cancel``: a queued reply ends at once, a streaming one
    within one engine step, its usage recorded by the worker), leaves the group and closes the request's
    database connections. Django calls :meth:`close` when it closes a streaming response whose body holds
    this subscription, even when the body was never iterated (client gone while the headers were sent).
    """

    def __init__(self, *, layer, channel: str, user, message_id: int, request_id: str = ""):
        self.layer, self.channel, self.user, self.message_id = layer, channel, user, message_id
        self.request_id = request_id
        self.ended = False
        self._closed = False
        self._lock = threading.Lock()

    def close(self) -> None:
        """Let go of the reply (sync; run it in a thread, not on the event loop). Never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with log_context(request_id=self.request_id, user_id=self.user.pk, message_id=self.message_id):
            if not self.ended:
                logger.info("client went away before the reply ended: cancelling it")
                try:
                    completion_cancel(user=self.user, message_id=self.message_id)
                except Exception:  # the reply may already be gone; the request is ending either way
                    logger.warning("could not cancel the reply", exc_info=True)
            try:
                async_to_sync(self.layer.group_discard)(
                    broadcast.message_group(self.message_id), self.channel
                )
            except Exception:  # the group membership expires on its own
                logger.warning("could not leave the reply's group", exc_info=True)
            close_request_connections()

    async def aclose(self) -> None:
        """:meth:`close` from the event loop, shielded: it runs to its end even while the calling task is
        being cancelled (the client went away)."""
        if not self._closed:
            await asyncio.shield(sync_to_async(self.close)())
