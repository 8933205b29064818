"""Keeps this web process's admission figures, and its sockets' session checks, warm for its open WebSockets
and its recent API clients.

Admission's inputs are cached ``ADMISSION_LOAD_CACHE_S`` (1 s) per process (:mod:`conversations.load`), and a
user's tier is cached per user. A user who sends less often than that (everyone: the page backs off 10 s or more
after a refusal) missed the cache at every send, and each frame's session check read PostgreSQL; under load those
reads, each on a fresh connection and queued for a thread, were most of the refusal time. While this process has
sockets, or API clients (:func:`api_request_seen`), that asked for admission in the last ``IDLE_S``, one task on
its event loop runs, on a thread of its own every quarter of ``ADMISSION_LOAD_CACHE_S``, a pass that re-reads what
is older than half of it: :func:`conversations.load.warm` (one query for all those users' tier ids, then the fleet
and queue figures of their tiers' models), :func:`accounts.sessions.sessions_current` (every open socket's session
in two queries) and :func:`conversations.recall.new_conversation_wanted_warm` (whether a send of theirs that starts
a conversation will read its question's vector, one query; lever 46). So a refusal is decided, and its socket's
session known valid, from memory on the event loop. Freshness is unchanged: a figure is at most
``ADMISSION_LOAD_CACHE_S`` old when used, and a miss still reads it on the spot. A frame whose session a pass found
current within that time (a ``send`` included) reads no session of its own; otherwise it checks on the spot
(docs/overhead-levers.md, lever 16).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings

from accounts.sessions import sessions_current
from conversations import load, recall
from database.connections import db_call

logger = logging.getLogger(__name__)

#: Seconds without a gated frame after which the warmer stops reading (and exits).
IDLE_S = 30.0

_sockets: Counter[tuple[str | None, int]] = (
    Counter()
)  # (session key, user id) -> open sockets of this process
_verified: dict[tuple[str | None, int], float] = {}  # -> monotonic time its session was last found current
_api_users: dict[int, float] = {}  # user id -> monotonic time of its last API completion through this process
_sessions_read_at = float("-inf")
_last_activity = float("-inf")
_task: asyncio.Task | None = None
TASK_NAME = "admission-warmer"  # the warming task's name on the event loop (asyncio.Task.get_name)
# Its own thread: a pass never queues behind the sockets' database calls in the loop's default executor.
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=TASK_NAME)


def socket_opened(*, session_key: str | None, user_id: int) -> None:
    """Count an open socket (the consumer's ``connect``)."""
    _sockets[(session_key, user_id)] += 1


def socket_closed(*, session_key: str | None, user_id: int) -> None:
    """Forget one open socket (the consumer's ``disconnect``)."""
    pair = (session_key, user_id)
    _sockets[pair] -= 1
    if _sockets[pair] <= 0:
        del _sockets[pair]
        _verified.pop(pair, None)


def session_verified(*, session_key: str | None, user_id: int) -> bool:
    """Whether a pass found this socket's session current less than ``ADMISSION_LOAD_CACHE_S`` ago."""
    at = _verified.get((session_key, user_id))
    return at is not None and time.monotonic() - at < settings.ADMISSION_LOAD_CACHE_S


def note_activity() -> None:
    """A socket (or an API client, :func:`api_request_seen`) of this process asked for admission: keep (or
    start) warming. Call on the event loop."""
    global _last_activity, _task
    _last_activity = time.monotonic()
    if not settings.ADMISSION_WARM_SOCKETS:
        return
    loop = asyncio.get_running_loop()
    if _task is None or _task.done() or _task.get_loop() is not loop:
        _task = loop.create_task(_run(), name=TASK_NAME)


def api_request_seen(*, user_id: int) -> None:
    """An API completion of ``user_id`` went through this process: keep that user's admission figures warm
    for ``IDLE_S``, as an open socket's, and start warming. Call on the event loop.

    Without it every API completion that came more than ``ADMISSION_LOAD_CACHE_S`` after the last read
    refreshed the figures inline before its admission: the fleet's status keys (a Redis ``SCAN`` and
    ``MGET``) and the queue counts (one aggregate), about 2 ms at one client, paid by about every other
    request (docs/overhead-levers.md, lever 39)."""
    now = time.monotonic()
    for seen, at in list(_api_users.items()):  # forgotten here, on the loop, where the dict is written
        if now - at >= IDLE_S:
            del _api_users[seen]
    _api_users[user_id] = now
    note_activity()


def _api_users_recent(now: float) -> set[int]:
    """The users of API completions in the last ``IDLE_S`` (read from the warmer's thread)."""
    return {user_id for user_id, at in list(_api_users.items()) if now - at < IDLE_S}


def warm_once() -> None:
    """One pass: the admission figures of the open sockets' users and of recent API clients, the sockets'
    users' answer to "would a new conversation read its question's vector", and, when older than half
    ``ADMISSION_LOAD_CACHE_S``, every open socket's session."""
    global _sessions_read_at
    pairs = list(_sockets)
    socket_users = {user_id for _, user_id in pairs}
    load.warm(user_ids=socket_users | _api_users_recent(time.monotonic()))
    # Whether a send that starts a conversation will read its question's vector (lever 46; the API's key read
    # says so itself, lever 40).
    recall.new_conversation_wanted_warm(user_ids=socket_users)
    started = time.monotonic()
    if started - _sessions_read_at >= settings.ADMISSION_LOAD_CACHE_S / 2:
        current = sessions_current(pairs=pairs)
        if current is not None:
            for pair in pairs:
                if pair in current:
                    _verified[pair] = started
                else:
                    _verified.pop(pair, None)
            _sessions_read_at = started


async def _run() -> None:
    warm = db_call(warm_once, thread_sensitive=False, executor=_executor)
    while (_sockets or _api_users) and time.monotonic() - _last_activity < IDLE_S:
        try:
            await warm()
        except Exception:  # an outage: the consumer's own reads report it; try again next period
            logger.warning("could not warm the admission figures", exc_info=True)
        await asyncio.sleep(max(0.05, settings.ADMISSION_LOAD_CACHE_S / 4))
