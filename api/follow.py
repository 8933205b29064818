"""Following one reply's frames from an async view: the channel-layer group ``chat.message.<id>``, joined once
the reply is stored and its task sent (the frames published before the join are caught up from the reply's
replay stream and progress key, as the chat page's socket does), with a database check whenever the stream
has been quiet for a while (a worker that died, or a reply that ended while nobody listened); and letting
go of it (:class:`ReplySubscription`), which cancels the generation when its client left before its end."""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async

from conversations.completions import completion_cancel
from conversations.models import Message
from database.connections import close_request_connections
from events import broadcast
from events.layer_reader import release_channel
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
    caller has added ``channel`` to ``broadcast.message_group(message_id)``, possibly after the reply's first
    frames were published (its task is sent at the commit, the join follows: docs/overhead-levers.md, lever
    33). Those are caught up first: the tokens from the replay stream, or the stored ``done`` frame of a reply
    that already ended; a live frame the catch-up covered is dropped by its ``seq``. Every frame is written to
    the replay stream or the progress key before it is published (``broadcast.publish``), so whatever was
    published before the join is found there. When tokens were missed, the ``done`` frame's ``content`` still
    holds the whole text."""
    last_seq = -1
    pending: asyncio.Future | None = None
    try:
        progress = await broadcast.reply_progress(message_id)
        if progress == "done":
            frame = await sync_to_async(_stored_done_frame)(message_id)
            if frame is not None:
                yield frame
                return
        elif progress is not None:  # started: its tokens so far, then live frames after them
            for frame in await broadcast.replay_tokens(message_id, after_seq=-1):
                last_seq = frame["seq"]
                yield frame
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
            pending.cancel()  # the layer drops the channel as its receive is cancelled
        else:  # the reply ended (or its last frame was yielded): nothing receives on the channel again
            await release_channel(layer, channel)


class _State:
    """A subscription's flags, shared with its finalizer: ``ended`` (the reply's end was seen) and
    ``closed`` (let go already; set once, under ``lock``)."""

    __slots__ = ("closed", "ended", "lock")

    def __init__(self) -> None:
        self.ended = False
        self.closed = False
        self.lock = threading.Lock()


def _let_go(state: _State, layer, channel: str, user, message_id: int, request_id: str) -> None:
    """Cancel the reply unless it ended, leave its group, close this thread's connections; once per state."""
    with state.lock:
        if state.closed:
            return
        state.closed = True
    with log_context(request_id=request_id, user_id=user.pk, message_id=message_id):
        if not state.ended:
            logger.info("client went away before the reply ended: cancelling it")
            try:
                completion_cancel(user=user, message_id=message_id)
            except Exception:  # the reply may already be gone; the request is ending either way
                logger.warning("could not cancel the reply", exc_info=True)
        try:
            async_to_sync(layer.group_discard)(broadcast.message_group(message_id), channel)
        except Exception:  # the group membership expires on its own
            logger.warning("could not leave the reply's group", exc_info=True)
        close_request_connections()


def _let_go_in_thread(state: _State, *args) -> None:
    # Called by the garbage collector, possibly on the event loop: never block it with database work.
    if not state.closed:
        threading.Thread(target=_let_go, args=(state, *args), name="reply-let-go", daemon=True).start()


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
        # Shared with the finalizer below, which must not hold the subscription itself.
        self._state = _State()
        # Safety net: Django cancels a request whose client went away, and when that lands in the middleware
        # after the view returned, the response (and this subscription) is dropped without being closed. The
        # reply must not run on for nobody, so a subscription collected unclosed lets go in a thread.
        self._finalizer = weakref.finalize(
            self, _let_go_in_thread, self._state, layer, channel, user, message_id, request_id
        )
        self._finalizer.atexit = False

    @property
    def ended(self) -> bool:
        """Whether the view saw the reply's end (then closing does not cancel it)."""
        return self._state.ended

    @ended.setter
    def ended(self, value: bool) -> None:
        self._state.ended = value

    @property
    def _closed(self) -> bool:
        return self._state.closed

    def close(self) -> None:
        """Let go of the reply (sync; run it in a thread, not on the event loop). Never raises."""
        _let_go(self._state, self.layer, self.channel, self.user, self.message_id, self.request_id)

    async def aclose(self) -> None:
        """:meth:`close` from the event loop, shielded: it runs to its end even while the calling task is
        being cancelled (the client went away)."""
        if not self._closed:
            await asyncio.shield(sync_to_async(self.close)())
