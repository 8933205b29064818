"""The chat WebSocket consumer (``/ws/chat/``): validates frames, calls services, forwards events.

Each browser tab joins the channel-layer group of every reply it watches; generation does not depend on
the socket, so closing the tab loses nothing and ``resume`` picks the stream up again.

Every frame is answered: limits (size, nesting, rate) and validation come before any service call, a
frame from a socket whose session ended closes it (4401), and an outage of PostgreSQL or Redis answers
``unavailable`` instead of dropping the socket; a socket opened during such an outage is answered
``unavailable`` and closed with 1013, try again later (``docs/websocket-protocol.md``).
"""

import contextlib
import logging
import time
from collections import Counter

import redis
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.utils import await_many_dispatch
from django.conf import settings
from django.db import DatabaseError
from django.http import Http404

from accounts.channels_auth import AUTH_UNAVAILABLE
from accounts.sessions import session_fingerprint, session_is_current
from conversations import generations, load, load_warmer, moderation, reply_control
from conversations.admission import AdmissionRefused
from conversations.consumer_admission import AdmissionGateMixin, SessionEnded
from conversations.protocol import (
    ContinueFrame,
    EditFrame,
    FrameBucket,
    FrameRejected,
    RegenerateFrame,
    ResumeFrame,
    SendFrame,
    StopFrame,
    parse_text_frame,
)
from conversations.reply_stream import CaughtUp, ReplyStreamMixin
from database.connections import db_call
from events import broadcast
from events.layer_reader import keep_layer_listening
from observability import metrics
from observability.logs import log_context, new_request_id

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
#: RFC 6455 / IANA "Try Again Later": a backing service is down; the page reconnects with back-off.
CLOSE_TRY_AGAIN_LATER = 1013
#: Errors meaning a backing service (PostgreSQL, Redis) is unreachable, answered ``unavailable``.
OUTAGE_ERRORS = (DatabaseError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


class ChatConsumer(AdmissionGateMixin, ReplyStreamMixin, AsyncJsonWebsocketConsumer):
    """``/ws/chat/``: one per browser tab. Frames in ``docs/websocket-protocol.md``; anonymous sockets are
    accepted and closed with 4401 so the page stops reconnecting."""

    async def __call__(self, scope, receive, send):
        """Channels' loop, except when the pub/sub channel layer cannot subscribe this socket's channel
        (its Redis is down, before any handler ran): the socket is served without a layer so that
        :meth:`connect` answers ``unavailable`` and closes with 1013, as for an outage met later."""
        try:
            await super().__call__(scope, receive, send)
        except OUTAGE_ERRORS:
            if hasattr(self, "channel_name"):
                raise
            logger.warning("no channel for a new socket: the channel layer is down", exc_info=True)
            self.channel_layer, self.base_send = None, send
            with contextlib.suppress(StopConsumer):
                await await_many_dispatch([receive], self.dispatch)

    async def connect(self):
        self.user = self.scope.get("user")
        self.watching: set[int] = set()
        # Replies this socket was caught up on after joining their group late: live frames to drop.
        self.caught_up: dict[int, CaughtUp] = {}
        # Conversations this socket itself just changed: its own tab-sync echo is dropped (one per ticket).
        self.own_changes: Counter[int] = Counter()
        self.ended = False
        self.session_key, self.session_fp = None, ""
        self.bucket = FrameBucket(rate=settings.WS_FRAMES_PER_S, burst=settings.WS_FRAME_BURST)
        # message id -> perf_counter at its send frame, until its first token frame goes out (pipeline
        # overhead metric), then the client-visible TTFT until the done frame brings the engine's.
        self.sent_at: dict[int, float] = {}
        self.pending: int | None = None  # load.note_pending token of the frame being handled
        self.session_deferred = False  # the frame's session check runs in its service's thread
        self.client_ttft, self.reply_traces = {}, {}  # message id -> s; -> its trace (reply_stream.py)
        metrics.WS_OPEN.inc()
        self.counted_open = True
        # Accept, then close with an application code: a refused handshake reaches the browser as 1006,
        # which the page would treat as a network error and retry forever.
        await self.accept()
        if self.channel_layer is None or self.scope.get(AUTH_UNAVAILABLE):  # Redis or PostgreSQL down
            await self.close_unavailable()
            return
        if self.user is None or not self.user.is_authenticated:
            self.ended = True
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        self.session_fp = session_fingerprint(self.session_key)
        try:
            # Once per process: the frames of sockets opened later are not held back (events/layer_reader.py).
            await keep_layer_listening(self.channel_layer)
            await self.channel_layer.group_add(broadcast.user_group(self.user.pk), self.channel_name)
        except OUTAGE_ERRORS:  # Redis is down
            logger.warning("could not join the user's channel-layer group", exc_info=True)
            await self.close_unavailable()
            return
        self.user_group = broadcast.user_group(self.user.pk)
        self.warmed = {"session_key": self.session_key, "user_id": self.user.pk}
        load_warmer.socket_opened(**self.warmed)
        # The handshake just read the user row: its tier decides this socket's first frames from memory.
        load.note_user_tier(user_id=self.user.pk, tier_id=self.user.tier_id)
        load_warmer.note_activity()

    async def close_unavailable(self):
        """Answer ``unavailable`` and close with 1013 (try again later); later frames are ignored."""
        self.ended = True
        await self.send_error(
            "unavailable",
            "The service is briefly unavailable. Reconnecting in a few seconds.",
            retry_after=settings.ADMISSION_RETRY_AFTER_S,
        )
        await self.close(code=CLOSE_TRY_AGAIN_LATER)

    async def disconnect(self, code):
        if getattr(self, "counted_open", False):
            metrics.WS_OPEN.dec()
            self.counted_open = False
        if getattr(self, "warmed", None):
            load_warmer.socket_closed(**self.warmed)
            self.warmed = None
        try:
            if getattr(self, "user_group", None):
                await self.channel_layer.group_discard(self.user_group, self.channel_name)
            for message_id in getattr(self, "watching", ()):
                await self.channel_layer.group_discard(broadcast.message_group(message_id), self.channel_name)
        except OUTAGE_ERRORS:  # Redis is down: its group memberships expire on their own
            logger.warning("could not leave channel-layer groups on disconnect", exc_info=True)

    async def dispatch(self, message):
        """Channels' ``dispatch`` without its per-message ``aclose_old_connections()`` hop (the handshake's user
        lookup closes its own connection: ``accounts.channels_auth``, lever 57): since channels 4.2 that hop
        onto the one thread shared by every thread-sensitive ``sync_to_async`` call of the process runs
        before *each* handler, i.e. before every frame in and every channel-layer event (each streamed
        token of each watched reply). Under load a frame waited there behind the other sockets' hops and
        database work before ``receive`` even ran (p50 66 ms, p99 564 ms; docs/tiers-under-load.md, "Overload"). This
        consumer's own database calls close their connections themselves (:func:`db_call`)."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        if self.ended:
            return
        user_id = self.user.pk if self.user is not None and self.user.is_authenticated else None
        with log_context(request_id=new_request_id(), user_id=user_id):
            await self._receive(text_data)

    async def _receive(self, text_data):
        started = time.perf_counter()
        received_ns = time.time_ns()  # wall clock: the reply's stages are joined across processes
        wait = self.bucket.take()
        if wait:
            metrics.observe_ws_frame("in", None)
            await self.send_error(
                "rate_limited", "Too many frames on this connection; slow down.", retry_after=round(wait, 2)
            )
            return
        if text_data is None:
            metrics.observe_ws_frame("in", None)
            await self.send_error("invalid_request", "Frames must be JSON text.")
            return
        try:
            frame = parse_text_frame(text_data)
        except FrameRejected as exc:  # the only refusal it raises, for any input (fuzzed in the unit layer)
            metrics.observe_ws_frame("in", None)
            await self.send_error(exc.code, str(exc))
            return
        metrics.observe_ws_frame("in", {"type": frame.type})
        self.frame_ns = (received_ns, time.time_ns())  # received, validated (stages of a reply's trace)
        try:
            await self._handle_frame(frame, started)
        finally:
            load.clear_pending(self.pending)  # the service did not run (it clears it when it does)
            self.pending = None

    async def _handle_frame(self, frame, started: float):
        try:
            refused = self.refusal_from_memory(frame)
            # The warmer found this socket's session current less than ADMISSION_LOAD_CACHE_S ago: the frame
            # needs no session read of its own (the same staleness bound as the admission figures; a log-out
            # closes the session's sockets at once anyway; docs/overhead-levers.md, lever 16).
            verified = load_warmer.session_verified(session_key=self.session_key, user_id=self.user.pk)
            if refused is not None:
                # Decided from cached figures on the event loop, nothing stored: answered before any thread
                # hop. Unless the warmer verified the session just now, the check below still runs and
                # closes the socket if the session ended.
                await self.send_error(refused.code, refused.message, retry_after=refused.retry_after)
                metrics.WS_REFUSAL.labels("memory").observe(time.perf_counter() - started)
                if verified:
                    return
            # Let through the cached gate: its service's thread checks the session first (one hop for both).
            self.session_deferred = refused is None and self.pending is not None and not verified
            # Off Channels' shared database thread: a frame does not queue behind other sockets' writes.
            if not (verified or self.session_deferred) and not await db_call(
                session_is_current, thread_sensitive=False
            )(session_key=self.session_key, user_id=self.user.pk):
                await self.end_session("expired")
                return
            if refused is None:
                await self.dispatch_frame(frame)
        except SessionEnded:
            await self.end_session("expired")
        except AdmissionRefused as exc:
            await self.send_error(exc.code, exc.message, retry_after=exc.retry_after)
            metrics.WS_REFUSAL.labels("read").observe(time.perf_counter() - started)
        except generations.GenerationError as exc:
            await self.send_error(exc.code, str(exc))
        except moderation.ContentBlocked as exc:  # stored as blocked; the page keeps it with a notice
            await self.send_json(exc.frame())
        except Http404 as exc:
            await self.send_error("not_found", str(exc) or "Not found.")
        except OUTAGE_ERRORS:
            logger.warning("frame %s failed: a backing service is unavailable", frame.type, exc_info=True)
            await self.send_error(
                "unavailable",
                "The service is briefly unavailable. Try again in a few seconds.",
                retry_after=settings.ADMISSION_RETRY_AFTER_S,
            )
        except Exception:
            logger.exception("frame %s failed", frame.type)
            await self.send_error("internal_error", "Something went wrong; nothing was stored.")

    async def dispatch_frame(self, frame):
        if isinstance(frame, (SendFrame, RegenerateFrame, EditFrame, ContinueFrame)):
            await self.refresh_tier()
        if isinstance(frame, SendFrame):
            await self.handle_send(frame)
        elif isinstance(frame, RegenerateFrame):
            await self.handle_regenerate(frame)
        elif isinstance(frame, StopFrame):
            await self.handle_stop(frame)
        elif isinstance(frame, ResumeFrame):
            await self.handle_resume(frame)
        elif isinstance(frame, EditFrame):
            await self.watch_ticket(
                await db_call(generations.reply_edit)(
                    user=self.user, message_id=frame.message_id, content=frame.content, model=frame.model
                )
            )
        elif isinstance(frame, ContinueFrame):
            await self.watch_ticket(
                await db_call(generations.reply_continue)(user=self.user, message_id=frame.message_id)
            )

    async def handle_send(self, frame: SendFrame):
        started = time.perf_counter()
        # A resend may be answered from its stored ticket first; a frame the cached gate already let through
        # (pending) is not gated twice.
        if not (frame.resend and frame.client_id) and self.pending is None:
            await self.admission_gate(frame.model)
        # The root span of the reply's trace; the Celery task carries its context to the worker. On the
        # reply-service threads, neither Channels' shared database thread nor the default pool that other
        # frames' reads use: a late refusal (the service's exact admission) does not queue behind other
        # sockets' writes, nor does any other frame behind a burst of sends; concurrent requests are safe in
        # PostgreSQL (conditional quota UPDATE, unique client_id, tests/db/test_consumer_hardening.py).
        with self.send_span(frame.conversation_id):
            service = self.admitting(generations.reply_request, check_session=self.session_deferred)
            ticket = await self.service_call(service)(
                user=self.user,
                conversation_id=frame.conversation_id,
                content=frame.content,
                client_id=frame.client_id,
                model=frame.model,
                resend=frame.resend,
            )
        if not ticket.duplicate:
            self.note_sent(ticket.message.id, started)
        await self.watch_ticket(ticket)

    async def handle_regenerate(self, frame: RegenerateFrame):
        if self.pending is None:
            await self.admission_gate(frame.model)
        service = self.admitting(generations.reply_regenerate, check_session=self.session_deferred)
        ticket = await self.service_call(service)(
            user=self.user, conversation_id=frame.conversation_id, model=frame.model
        )
        await self.watch_ticket(ticket)

    async def handle_stop(self, frame: StopFrame):
        await db_call(reply_control.reply_cancel)(user=self.user, message_id=frame.message_id)

    async def send_json(self, content, close=False):
        metrics.observe_ws_frame("out", content)
        await super().send_json(content, close=close)

    async def user_event(self, event):
        """Channel-layer handler for the user's group: forward the frame. ``session_ended`` closes this
        socket (4401): always when the event names no session, else when it names this socket's session
        or this socket's session is no longer valid (``accounts.sessions.end_sessions``). A tab-sync
        ``conversation`` frame caused by this socket's own request is not echoed back to it."""
        frame = event["frame"]
        if frame.get("type") == "conversation" and frame.get("kind") == "messages":
            cid = frame.get("conversation_id")
            if self.own_changes[cid] > 0:
                self.own_changes[cid] -= 1
                return
        if frame.get("type") != "session_ended":
            await self.send_json(frame)
            return
        named = event.get("session") or ""
        ours = not named or named == self.session_fp
        if not ours:
            try:
                ours = not await db_call(session_is_current)(
                    session_key=self.session_key, user_id=self.user.pk
                )
            except OUTAGE_ERRORS:
                ours = True  # cannot tell: fail closed; the page reconnects and signs in again if valid
        if ours:
            await self.end_session(frame.get("reason", "ended"))

    async def end_session(self, reason: str):
        """Tell the page its session ended and close with 4401; later frames are ignored."""
        self.ended = True
        await self.send_json({"type": "session_ended", "reason": reason})
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def send_error(self, code: str, message: str, *, retry_after=None, message_id=None):
        await self.send_json(
            broadcast.frame_error(code=code, message=message, retry_after=retry_after, message_id=message_id)
        )
