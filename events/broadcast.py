"""The one module that owns channel-layer group names, Redis keys and the shapes of events sent to browsers.

Every delta of a reply goes two ways (the pattern of zulip's ``send_event_on_commit`` plus a replay log):

* to the channel-layer **group** ``chat.message.<id>`` (``channels_redis``), which live WebSocket consumers
  have joined, as ``{"type": "chat.frame", "frame": {...}}``;
* appended to the per-message **Redis stream** ``chatsite:stream:<id>`` (XADD), so that a client that
  reconnects, refreshes or opens a second tab can replay what it missed (``resume``) and continue live.

Frames are the server -> client messages of ``docs/websocket-protocol.md``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import redis
import redis.asyncio as aioredis
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

CANCEL_CHANNEL = "chatsite:cancel"

#: What redis-py raises while Redis is unreachable or restarting (publishers log these and go on).
REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, TimeoutError, OSError)


def message_group(message_id: int) -> str:
    """Channel-layer group of one assistant message's stream."""
    return f"chat.message.{message_id}"


def user_group(user_id: int) -> str:
    """Channel-layer group of every open socket (every tab) of one user: tab sync, and closing a user's
    sockets when their session ends. Events sent to it are ``{"type": "user.event", "frame": {...}}``."""
    return f"chat.user.{user_id}"


def stream_key(message_id: int) -> str:
    """Redis stream holding one message's token frames (fields ``seq``, ``text``) for replay."""
    return f"chatsite:stream:{message_id}"


def progress_key(message_id: int) -> str:
    """Redis key holding the type of the last ``started`` or ``done`` frame published for one message: set
    once the reply left ``queued``, so a socket that just joined its group can tell whether it missed any
    frame (:func:`reply_progressed`)."""
    return f"chatsite:progress:{message_id}"


def lease_key(message_id: int) -> str:
    """Redis key a worker keeps alive (TTL seconds) while it owns a generation, holding its fleet id
    (``host:pid``); gone => worker died."""
    return f"chatsite:lease:{message_id}"


#: Seconds a worker's lease on a reply lives without a refresh (the worker refreshes it every 2 s).
LEASE_TTL_S = 8
#: Seconds a missing lease is looked at again before its reply counts as orphaned: a Redis restart loses
#: every lease, and the live workers' heartbeats (every 2 s) put theirs back within this time.
LEASE_RECHECK_S = 4.5


def lease_alive(message_id: int) -> bool:
    """Whether some worker still holds the lease of ``message_id`` (False once it was killed)."""
    return bool(redis_client().exists(lease_key(message_id)))


def cancel_key(message_id: int) -> str:
    """Redis key set when a user pressed Stop, for workers that have not submitted the request yet."""
    return f"chatsite:cancelled:{message_id}"


# --- frame shapes -------------------------------------------------------------------------------------------


def frame_queued(*, message, user_message_id: int | None, position: int, notice: str = "") -> dict[str, Any]:
    """``queued``: the reply is stored and waiting; ``position`` is its 1-based place in line; ``model`` the
    model that will write it and ``notice`` a sentence for the user (e.g. moved to a lighter model) or ""."""
    conversation = message.conversation
    return {
        "type": "queued",
        "conversation_id": conversation.id,
        "message_id": message.id,
        "user_message_id": user_message_id,
        "position": position,
        "title": conversation.title,
        "omitted_messages": message.omitted_messages,
        "model": message.model_name,
        "notice": notice,
    }


def frame_started(*, message_id: int, omitted_messages: int = 0) -> dict[str, Any]:
    """``started``: a worker claimed the reply; ``omitted_messages`` older turns did not fit its context."""
    return {"type": "started", "message_id": message_id, "omitted_messages": omitted_messages}


def frame_token(*, message_id: int, seq: int, text: str) -> dict[str, Any]:
    """``token``: one text delta; ``seq`` counts 0, 1, 2, ... per reply so clients can drop duplicates."""
    return {"type": "token", "message_id": message_id, "seq": seq, "text": text}


def frame_done(*, message) -> dict[str, Any]:
    """The final frame of a reply, built from the stored message (the source of truth)."""
    return {
        "type": "done",
        "message_id": message.id,
        "status": message.status,
        "finish_reason": message.finish_reason or None,
        "content": message.content,
        "usage": {
            "prompt_tokens": message.prompt_tokens or 0,
            "completion_tokens": message.completion_tokens or 0,
        },
        "ttft_ms": message.ttft_ms,
        "duration_ms": message.duration_ms,
        "error": message.error or None,
        "omitted_messages": message.omitted_messages,
    }


def frame_conversation(*, kind: str, conversation_id: int, title: str = "") -> dict[str, Any]:
    """``conversation`` (to the user's group, every tab): ``kind`` is ``messages`` (new messages or another
    branch shown: reload the path), ``renamed`` (new ``title``) or ``deleted``."""
    return {"type": "conversation", "kind": kind, "conversation_id": conversation_id, "title": title}


def frame_error(
    *,
    code: str,
    message: str,
    retry_after: float | None = None,
    message_id: int | None = None,
    conversation_id: int | None = None,
) -> dict[str, Any]:
    """``error``: ``code`` from the protocol; ``retry_after`` seconds where waiting helps. A
    ``content_policy`` error also names the stored blocked message (``message_id``) and its
    ``conversation_id``."""
    frame = {
        "type": "error",
        "code": code,
        "message": message,
        "retry_after": retry_after,
        "message_id": message_id,
    }
    if conversation_id is not None:
        frame["conversation_id"] = conversation_id
    return frame


# --- publishing (sync callers: services, Celery task threads) ------------------------------------------------

_redis_lock = threading.Lock()
_redis_client: redis.Redis | None = None


def redis_client() -> redis.Redis:
    """Process-wide synchronous Redis client (thread-safe connection pool) on ``settings.REDIS_URL``."""
    global _redis_client
    with _redis_lock:
        if _redis_client is None:
            _redis_client = redis.Redis.from_url(settings.REDIS_URL)
        return _redis_client


class _LayerLoop:
    """One event loop thread per process for channel-layer sends from sync threads.

    ``async_to_sync`` would build a fresh loop (and fresh Redis connections) per call from a Celery thread;
    a single long-lived loop keeps ``channels_redis``'s connection pool warm. Each send waits for its
    result so frames of one message leave in order.
    """

    def __init__(self):
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coro, timeout: float = 10.0):
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._loop.run_forever, name="channel-layer-loop", daemon=True
                ).start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)


_layer_loop = _LayerLoop()


def _group_send(message_id: int, frame: dict[str, Any]) -> None:
    layer = get_channel_layer()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        _layer_loop.run(layer.group_send(message_group(message_id), {"type": "chat.frame", "frame": frame}))
        return
    raise RuntimeError("publish() is for sync code; await layer.group_send in async code")


def _pubsub_group_channel(group: str) -> str | None:
    """The Redis pub/sub channel that carries ``group`` when the channel layer is channels_redis' pub/sub
    layer on ``REDIS_URL`` alone (one shard: the deployed configuration), else None. channels_redis 4.3
    names it ``<prefix>__group__<group>`` (``RedisPubSubLoopLayer._get_group_channel_name``);
    ``tests/db/test_publish.py`` checks that a consumer in the group receives what is published there."""
    layers = settings.CHANNEL_LAYERS.get("default", {})
    config = layers.get("CONFIG", {})
    if not layers.get("BACKEND", "").endswith(".RedisPubSubChannelLayer"):
        return None
    if list(config.get("hosts") or []) != [settings.REDIS_URL]:
        return None
    return f"{config.get('prefix', 'asgi')}__group__{group}"


def publish(message_id: int, frame: dict[str, Any]) -> None:
    """Send a frame to everyone watching ``message_id`` now. Tokens also go to the replay stream, and
    ``started`` / ``done`` mark the reply's progress key; both are written before the group send, which
    :func:`reply_progressed` relies on.

    On the deployed pub/sub channel layer this is one Redis round trip from the calling thread: the writes
    and the group's ``PUBLISH`` (the frame serialized as the layer does) in one pipeline, which Redis runs
    in order. Before, the group send hopped onto this process's channel-layer loop thread and back and was a
    round trip of its own: three thread hand-offs per delta, each waiting for the GIL beside the engine's
    loop (docs/overhead-levers.md, lever 14). Other layers keep the hop."""
    pipe, channel = _frame_pipeline(message_id, frame)
    if len(pipe):
        pipe.execute()
    if channel is None:
        _group_send(message_id, frame)


def publish_started(message_id: int, frame: dict[str, Any], *, lease_holder: str) -> bool:
    """:func:`publish` of a reply's ``started`` frame that also takes the reply's lease for ``lease_holder``
    (a worker's fleet id, :func:`lease_key`, ``LEASE_TTL_S``) and reads whether Stop was pressed before the
    engine had the request (:func:`cancel_requested`), all in the same pipeline: one Redis round trip where
    the worker made three, the lease's before the engine got the request (docs/overhead-levers.md, lever 44).
    Returns whether a cancel was requested. Raises what redis-py raises when Redis is unreachable (nothing
    was written then, or only part; the worker's lease heartbeat, every 2 s, takes the lease once Redis is
    back)."""
    pipe, channel = _frame_pipeline(message_id, frame)
    pipe.set(lease_key(message_id), lease_holder, ex=LEASE_TTL_S)
    pipe.exists(cancel_key(message_id))
    cancelled = bool(pipe.execute()[-1])
    if channel is None:
        _group_send(message_id, frame)
    return cancelled


def publish_many(frames: list[tuple[int, dict[str, Any]]]) -> None:
    """:func:`publish` of each ``(message_id, frame)`` in order, all in one pipeline: one Redis round trip for a
    whole engine step's deltas, where :func:`publish` makes one per delta (``conversations.delta_publisher``).
    Raises what redis-py raises when Redis is unreachable (then none, or only some, were written)."""
    pipe = redis_client().pipeline(transaction=False)
    channels = [_frame_commands(pipe, message_id, frame) for message_id, frame in frames]
    if len(pipe):
        pipe.execute()
    for (message_id, frame), channel in zip(frames, channels, strict=True):
        if channel is None:
            _group_send(message_id, frame)


def _frame_pipeline(message_id: int, frame: dict[str, Any]):
    """``(pipeline, channel)``: a non-transactional pipeline holding :func:`publish`'s writes for ``frame`` and,
    on the deployed pub/sub layer, its group's ``PUBLISH``; ``channel`` is None on other layers, whose group
    send the caller makes after executing the pipeline."""
    pipe = redis_client().pipeline(transaction=False)
    return pipe, _frame_commands(pipe, message_id, frame)


def _frame_commands(pipe, message_id: int, frame: dict[str, Any]) -> str | None:
    """Queue :func:`publish`'s writes for ``frame`` on ``pipe``; returns the pub/sub channel its group's
    ``PUBLISH`` went to, or None on other layers (the caller's group send follows the execute)."""
    kind = frame["type"]
    if kind == "token":
        key = stream_key(message_id)
        pipe.xadd(key, {"seq": frame["seq"], "text": frame["text"]})
        pipe.expire(key, settings.STREAM_REPLAY_TTL_S)
    elif kind in ("started", "done"):
        pipe.set(progress_key(message_id), kind, ex=settings.STREAM_REPLAY_TTL_S)
    channel = _pubsub_group_channel(message_group(message_id))
    if channel is not None:
        pipe.publish(channel, get_channel_layer().serialize({"type": "chat.frame", "frame": frame}))
    return channel


def publish_to_user(user_id: int, frame: dict[str, Any], *, session: str = "") -> None:
    """Send ``frame`` to every open socket of ``user_id`` (sync callers). A frame of type ``session_ended``
    closes those sockets (4401, after forwarding it). ``session`` narrows that: an
    ``accounts.sessions.session_fingerprint`` closes that session's sockets and those whose session is no
    longer valid; ``"verify"`` only those whose session is no longer valid.

    On the deployed pub/sub channel layer the group's ``PUBLISH`` (the event serialized as the layer does) goes
    out from the calling thread, one Redis round trip, as :func:`publish` sends a reply's frames (lever 14);
    through this process's channel-layer loop it was two thread hand-offs more, about 0.3 ms of wall and 0.2 ms
    of CPU per call on an Intel Xeon (Ice Lake), paid by every send after its commit (docs/overhead-levers.md,
    lever 45). Other layers keep the hop."""
    layer = get_channel_layer()
    event = {"type": "user.event", "frame": frame, "session": session}
    channel = _pubsub_group_channel(user_group(user_id))
    if channel is not None:
        redis_client().publish(channel, layer.serialize(event))
        return
    _layer_loop.run(layer.group_send(user_group(user_id), event))


def publish_to_user_on_commit(user_id: int, frame: dict[str, Any]) -> None:
    """:func:`publish_to_user` once the surrounding transaction commits."""
    transaction.on_commit(lambda: publish_to_user(user_id, frame))


def publish_on_commit(message_id: int, frame: dict[str, Any]) -> None:
    """:func:`publish` once the surrounding transaction commits (immediately outside one). Robust: the
    stored state is what counts, so a Redis outage at that moment is logged, not raised (a tab that
    missed the frame gets it from the database on ``resume``)."""
    transaction.on_commit(lambda: publish(message_id, frame), robust=True)


def request_cancel(message_id: int) -> None:
    """Ask whichever worker runs ``message_id`` to stop it (pub/sub), and leave a flag for one that has not
    submitted it to its engine yet."""
    client = redis_client()
    client.set(cancel_key(message_id), 1, ex=settings.STREAM_REPLAY_TTL_S)
    client.publish(CANCEL_CHANNEL, str(message_id))


def request_cancel_on_commit(message_ids: list[int]) -> None:
    """:func:`request_cancel` for each of ``message_ids`` once the surrounding transaction commits (at once
    outside one): the replies of a deleted conversation or account. Robust as :func:`publish_on_commit` is: Redis
    unreachable then is logged, not raised, and those replies run to their end."""
    for message_id in message_ids:
        transaction.on_commit(lambda message_id=message_id: request_cancel(message_id), robust=True)


def stream_text(message_id: int) -> str:
    """The text streamed so far for ``message_id`` (concatenated replay stream), "" when none."""
    return "".join(fields[b"text"].decode() for _id, fields in redis_client().xrange(stream_key(message_id)))


def stream_discard(message_id: int) -> None:
    """Delete the replay stream of ``message_id``: a reply the content policy blocked must not be replayed
    to a tab that resumes after a refresh."""
    redis_client().delete(stream_key(message_id))


def cancel_requested(message_id: int) -> bool:
    """Whether Stop was pressed for ``message_id`` (flag kept ``STREAM_REPLAY_TTL_S`` seconds)."""
    return bool(redis_client().exists(cancel_key(message_id)))


# --- replay (async caller: the WebSocket consumer) ----------------------------------------------------------

_async_clients: dict[int, aioredis.Redis] = {}


def _async_redis() -> aioredis.Redis:
    loop_id = id(asyncio.get_running_loop())
    client = _async_clients.get(loop_id)
    if client is None:
        client = _async_clients[loop_id] = aioredis.Redis.from_url(settings.REDIS_URL)
    return client


async def replay_tokens(message_id: int, *, after_seq: int) -> list[dict[str, Any]]:
    """Token frames of ``message_id`` with ``seq > after_seq``, in order, from the replay stream."""
    entries = await _async_redis().xrange(stream_key(message_id))
    frames = []
    for _entry_id, fields in entries:
        seq = int(fields[b"seq"])
        if seq > after_seq:
            frames.append(frame_token(message_id=message_id, seq=seq, text=fields[b"text"].decode()))
    return frames


async def reply_progress(message_id: int) -> str | None:
    """The last of ``started`` and ``done`` published for ``message_id`` (within the last
    ``STREAM_REPLAY_TTL_S`` seconds), or None when neither was. Each is marked before its group send and
    every token follows ``started``, so a follower that joined the reply's group and then reads None has missed
    no frame (all of them reach it live), and one that reads a kind finds what it missed in the replay stream
    or, after ``done``, in the database (``api.follow.reply_frames``). One Redis read, no database."""
    kind = await _async_redis().get(progress_key(message_id))
    return kind.decode() if kind is not None else None


async def reply_progressed(message_id: int) -> bool:
    """Whether a ``started`` or ``done`` frame of ``message_id`` has been published: :func:`reply_progress`
    is not None (a socket that joined late and reads False has missed no frame)."""
    return await reply_progress(message_id) is not None
