"""The chat WebSocket consumer (``/ws/chat/``): validates frames, calls services, forwards events.

Each browser tab joins the channel-layer group of every reply it watches; generation does not depend on
the socket, so closing the tab loses nothing and ``resume`` picks the stream up again.
"""

import json
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404
from pydantic import ValidationError

from conversations import admission, broadcast, generations, load
from conversations.admission import AdmissionRefused
from conversations.protocol import RegenerateFrame, ResumeFrame, SendFrame, StopFrame, parse_client_frame
from conversations.selectors import message_get_for_user

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401


class ChatConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/chat/``: one per browser tab. Frames in ``docs/websocket-protocol.md``; anonymous sockets are
    accepted and closed with 4401 so the page stops reconnecting."""

    async def connect(self):
        self.user = self.scope.get("user")
        self.watching: set[int] = set()
        # Accept, then close with an application code: a refused handshake reaches the browser as 1006,
        # which the page would treat as a network error and retry forever.
        await self.accept()
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.user_group = broadcast.user_group(self.user.pk)
        await self.channel_layer.group_add(self.user_group, self.channel_name)

    async def disconnect(self, code):
        if getattr(self, "user_group", None):
            await self.channel_layer.group_discard(self.user_group, self.channel_name)
        for message_id in getattr(self, "watching", ()):
            await self.channel_layer.group_discard(broadcast.message_group(message_id), self.channel_name)

    async def decode_json(self, text_data):
        try:
            return json.loads(text_data)
        except ValueError:
            return None

    async def receive_json(self, content, **kwargs):
        try:
            frame = parse_client_frame(content)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "frame"
            await self.send_error("invalid_request", f"Invalid frame: {where}: {error['msg']}")
            return
        try:
            if isinstance(frame, SendFrame):
                await self.handle_send(frame)
            elif isinstance(frame, RegenerateFrame):
                await self.handle_regenerate(frame)
            elif isinstance(frame, StopFrame):
                await self.handle_stop(frame)
            elif isinstance(frame, ResumeFrame):
                await self.handle_resume(frame)
        except AdmissionRefused as exc:
            await self.send_error(exc.code, exc.message, retry_after=exc.retry_after)
        except generations.GenerationError as exc:
            await self.send_error(exc.code, str(exc))
        except Http404 as exc:
            await self.send_error("not_found", str(exc) or "Not found.")

    async def admission_gate(self):
        # Refuse under overload in milliseconds: from the 1 s cache right here on the event loop, else on a
        # worker thread (thread_sensitive=False: not queued behind other clients' database work).
        try:
            with load.cached_only():
                admission.load_gate_for_user(user=self.user)
            return
        except load.CacheMiss:
            pass
        await database_sync_to_async(admission.load_gate_for_user, thread_sensitive=False)(user=self.user)

    async def handle_send(self, frame: SendFrame):
        await self.admission_gate()
        ticket = await database_sync_to_async(generations.reply_request)(
            user=self.user, conversation_id=frame.conversation_id, content=frame.content
        )
        await self.watch_ticket(ticket)

    async def handle_regenerate(self, frame: RegenerateFrame):
        await self.admission_gate()
        ticket = await database_sync_to_async(generations.reply_regenerate)(
            user=self.user, conversation_id=frame.conversation_id
        )
        await self.watch_ticket(ticket)

    async def handle_stop(self, frame: StopFrame):
        await database_sync_to_async(generations.reply_cancel)(user=self.user, message_id=frame.message_id)

    async def handle_resume(self, frame: ResumeFrame):
        # Join the group before reading the message: a frame published in between arrives live, and the
        # browser drops seqs it already has.
        await self.watch(frame.message_id, check_access=True)
        message = await database_sync_to_async(generations.reply_for_resume)(
            user=self.user, message_id=frame.message_id
        )
        if not message.is_active:
            await self.send_json(broadcast.frame_done(message=message))
            return
        if message.status == message.Status.QUEUED:
            position = await database_sync_to_async(generations.queue_position)(message=message)
            await self.send_json(
                broadcast.frame_queued(message=message, user_message_id=None, position=position)
            )
            return
        await self.send_json(
            broadcast.frame_started(message_id=message.id, omitted_messages=message.omitted_messages)
        )
        for token in await broadcast.replay_tokens(message.id, after_seq=frame.after_seq):
            await self.send_json(token)

    async def watch_ticket(self, ticket: "generations.ReplyTicket"):
        await self.watch(ticket.message.id)
        frame = await database_sync_to_async(broadcast.frame_queued)(
            message=ticket.message,
            user_message_id=ticket.user_message_id,
            position=ticket.position,
            notice=ticket.notice,
        )
        await self.send_json(frame)

    async def watch(self, message_id: int, *, check_access: bool = False):
        if check_access:
            await database_sync_to_async(message_get_for_user)(user=self.user, message_id=message_id)
        if message_id not in self.watching:
            await self.channel_layer.group_add(broadcast.message_group(message_id), self.channel_name)
            self.watching.add(message_id)

    async def chat_frame(self, event):
        """Channel-layer handler: forward a published frame to the browser."""
        await self.send_json(event["frame"])

    async def user_event(self, event):
        """Channel-layer handler for the user's group: forward the frame; ``session_ended`` also closes."""
        await self.send_json(event["frame"])
        if event["frame"].get("type") == "session_ended":
            await self.close(code=CLOSE_UNAUTHENTICATED)

    async def send_error(self, code: str, message: str, *, retry_after=None, message_id=None):
        await self.send_json(
            broadcast.frame_error(code=code, message=message, retry_after=retry_after, message_id=message_id)
        )

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        if text_data is None:
            await self.send_error("invalid_request", "Frames must be JSON text.")
            return
        content = await self.decode_json(text_data)
        if not isinstance(content, dict):
            await self.send_error("invalid_request", "Frames must be JSON objects.")
            return
        await self.receive_json(content, **kwargs)
