"""The reply-stream side of the chat consumer: joining a reply's channel-layer group, catching a socket up
on what it missed (``queued``, ``started`` and replayed tokens, or ``done``) and forwarding live frames
without duplicates. :class:`ReplyStreamMixin` is mixed into ``conversations.consumers.ChatConsumer``, whose
``connect`` sets the attributes it uses (``user``, ``watching``, ``caught_up``, ``own_changes``,
``sent_at``, ``client_ttft``, ``reply_traces``, ``ended``).
"""

import contextlib
import time
from dataclasses import dataclass

from conversations import generations, reply_control, reply_dispatch
from database.connections import db_call
from events import broadcast
from observability import metrics, tracing


@dataclass
class CaughtUp:
    """What a catch-up (:meth:`ChatConsumer.send_state` for a reply this socket had just joined the group
    of) sent of the reply: ``started`` and the tokens up to ``last_seq``, or its ``done`` frame. The live
    frames published between the join and the catch-up's read are still on their way to this socket and
    :meth:`covers` tells which of them it already has.

    A reply is claimed once (``generation_start``: ``queued -> streaming``, and nothing moves it back; the
    reaper re-dispatches only replies never claimed, and a redelivered task finds its reply claimed and
    skips it), so it has one ``started`` and one run of seqs 0, 1, 2, ...: a live ``started`` after the
    catch-up's is the same one, never a restart."""

    last_seq: int = -1
    done: dict | None = None

    def covers(self, frame: dict) -> bool:
        """Whether this socket already got live ``frame`` (of the same reply) from the catch-up."""
        if self.done is not None:
            # The stored end holds everything published before it; only a later state is new (a worker
            # the reaper took for dead finishing an ``interrupted`` reply after all).
            return frame["type"] != "done" or frame == self.done
        if frame["type"] == "started":
            return True
        return frame["type"] == "token" and frame["seq"] <= self.last_seq


class ReplyStreamMixin:
    """Reply-stream methods of the chat consumer (see the module docstring)."""

    #: ``time.time_ns()`` when the frame being handled was received and when it passed validation.
    frame_ns: tuple[int, int] = (0, 0)

    @contextlib.contextmanager
    def send_span(self, conversation_id: int | None):
        """The root span ``chat.send`` of a reply's trace, begun when its frame was received, with the
        frame's validation as its first child (the stages of ``devtools/reply_stages.py``)."""
        received_ns, validated_ns = self.frame_ns
        with tracing.span("chat.send", start_ns=received_ns or None, conversation_id=conversation_id or 0):
            tracing.record_span("ws.validate", received_ns, validated_ns)
            self.send_trace = tracing.current_context()
            yield

    def note_sent(self, message_id: int, started: float) -> None:
        """Remember when (``perf_counter``) the frame that queued ``message_id`` came in, and its trace, until
        its first token frame goes out (:meth:`observe_overhead`, the ``ws.first_token`` span)."""
        self.sent_at[message_id] = started
        if getattr(self, "send_trace", None) is not None:
            self.reply_traces[message_id] = self.send_trace

    async def send_state(self, message, *, after_seq: int) -> CaughtUp | None:
        """Bring the page up to date on ``message``: ``done`` when finished, ``queued`` when waiting, else
        ``started`` and the tokens with ``seq > after_seq`` from the replay stream. Returns what it sent of
        the reply's stream (None for a queued reply)."""
        if not message.is_active:
            done = broadcast.frame_done(message=message)
            await self.send_reply_frame(done)
            return CaughtUp(done=done)
        if message.status == message.Status.QUEUED:
            position = await db_call(reply_dispatch.queue_position)(message=message)
            await self.send_json(
                broadcast.frame_queued(message=message, user_message_id=None, position=position)
            )
            return None
        await self.send_reply_frame(
            broadcast.frame_started(message_id=message.id, omitted_messages=message.omitted_messages)
        )
        sent = CaughtUp(last_seq=after_seq)
        for token in await broadcast.replay_tokens(message.id, after_seq=after_seq):
            await self.send_reply_frame(token)
            sent.last_seq = token["seq"]
        return sent

    async def handle_resume(self, frame):
        """``resume``: one read (access checked by the selector) answers a reply that ended for good with its
        ``done``, without joining its group. A reply still in flight (or ``interrupted``, which a late worker
        may still finish) joins its group first and is read again after the join, so a frame published in
        between reaches this socket both live and in the replay: what the replay sent is remembered
        (:class:`CaughtUp`) and :meth:`chat_frame` drops those live copies, as after a ``send``'s catch-up.
        Off Channels' shared database thread, as a send: a flood of resumes on one socket does not queue
        behind every socket's database work (docs/overhead.md)."""
        read = db_call(reply_control.reply_for_resume, thread_sensitive=False)
        message = await read(user=self.user, message_id=frame.message_id)
        if not (message.is_active or message.status == message.Status.INTERRUPTED):
            await self.send_state(message, after_seq=frame.after_seq)
            return
        await self.watch(frame.message_id)
        message = await read(user=self.user, message_id=frame.message_id)
        sent = await self.send_state(message, after_seq=frame.after_seq)
        if sent is not None:
            self.caught_up[frame.message_id] = sent

    async def watch_ticket(self, ticket: "generations.ReplyTicket"):
        """Follow the reply of an admitted ``send``/``regenerate``/``edit``/``continue``: join its group,
        answer ``queued``, then catch up on what was published before the join."""
        message = ticket.message
        if not ticket.duplicate:  # a resend stored nothing, so published nothing
            self.own_changes[message.conversation_id] += 1
        await self.watch(message.id)
        fields = dict(
            message=message,
            user_message_id=ticket.user_message_id,
            position=ticket.position,
            notice=ticket.notice,
        )
        if type(message).conversation.is_cached(message):  # the service's own objects: no read, no hop
            frame = broadcast.frame_queued(**fields)
        else:  # a resend's stored ticket: its conversation is read
            frame = await db_call(broadcast.frame_queued)(**fields)
        await self.send_json(frame)
        # The task was dispatched when the service committed, before this socket joined the group: a fast
        # worker may already have sent started and tokens (or done), which never reach this socket live; a
        # resend's reply may have ended long ago. One Redis read tells, without the database, when nothing
        # was missed (the common case).
        if message.status != message.Status.QUEUED or await broadcast.reply_progressed(message.id):
            await self.catch_up(message.id)

    async def catch_up(self, message_id: int):
        """Send what this socket, which has joined the reply's group, missed of ``message_id`` (what
        ``resume`` from seq -1 sends: ``started`` and the replayed tokens, or ``done``), and remember it so
        that :meth:`chat_frame` drops the live frames it covered."""
        message = await db_call(reply_control.reply_for_resume)(user=self.user, message_id=message_id)
        if message.status != message.Status.QUEUED:
            self.caught_up[message_id] = await self.send_state(message, after_seq=-1)

    async def watch(self, message_id: int):
        if message_id not in self.watching:
            await self.channel_layer.group_add(broadcast.message_group(message_id), self.channel_name)
            self.watching.add(message_id)

    async def chat_frame(self, event):
        """Channel-layer handler: forward a published frame to the browser, unless a catch-up already sent
        it (see :class:`CaughtUp`)."""
        if self.ended:
            return
        received_ns = time.time_ns()
        frame = event["frame"]
        caught_up = self.caught_up.get(frame.get("message_id"))
        if caught_up is not None and caught_up.covers(frame):
            return
        await self.send_reply_frame(frame, received_ns=received_ns)

    async def send_reply_frame(self, frame, *, received_ns: int | None = None):
        """Send a frame of a reply's stream (``started``, ``token``, ``done``), live or replayed;
        ``received_ns``: when the channel layer delivered it (``time.time_ns()``), None for a replay."""
        received_ns = received_ns or time.time_ns()
        await self.send_json(frame)
        if frame.get("type") == "token" and frame.get("message_id") in self.reply_traces:
            # The last two stages of the reply's trace: received by this consumer, sent to the socket.
            parent = self.reply_traces.pop(frame["message_id"])
            tracing.record_span("ws.first_token", received_ns, time.time_ns(), parent=parent)
        self.observe_overhead(frame)

    def observe_overhead(self, frame):
        """Pipeline overhead = client-visible TTFT (send frame in -> first token frame out on this socket)
        minus the engine's TTFT, which the done frame brings."""
        message_id = frame.get("message_id")
        if frame.get("type") == "token" and message_id in self.sent_at:
            self.client_ttft[message_id] = time.perf_counter() - self.sent_at.pop(message_id)
        elif frame.get("type") == "done":
            self.sent_at.pop(message_id, None)
            self.reply_traces.pop(message_id, None)
            client_ttft = self.client_ttft.pop(message_id, None)
            if client_ttft is not None and frame.get("ttft_ms") is not None:
                metrics.PIPELINE_OVERHEAD.observe(max(0.0, client_ttft - frame["ttft_ms"] / 1000))
