"""Keeps this web process's admission figures warm for the users of its open WebSockets.

Admission's inputs are cached ``ADMISSION_LOAD_CACHE_S`` (1 s) per process (:mod:`conversations.load`), and a
user's tier is cached per user. A user who sends less often than that (everyone: the page backs off 10 s or
more after a refusal) missed the cache at every send, and the miss cost a thread hop and a fresh PostgreSQL
connection before the refusal could go out; under load that was most of the refusal time. While this
process has sockets that sent something in the last ``IDLE_S``, one task on its event loop re-reads, on a
worker thread every quarter of ``ADMISSION_LOAD_CACHE_S``, whatever is older than half of it
(:func:`conversations.load.warm`: one query for all those users' tier ids, the fleet and queue figures of
their tiers' models), so a refusal is decided from memory on the event loop. Freshness is unchanged: a
figure is still at most ``ADMISSION_LOAD_CACHE_S`` old when used, and a miss still reads it on the spot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import close_old_connections

from conversations import load

logger = logging.getLogger(__name__)

#: Seconds without a gated frame after which the warmer stops reading (and exits).
IDLE_S = 30.0

_sockets: Counter[int] = Counter()  # user id -> open sockets of this process
_last_activity = 0.0
_task: asyncio.Task | None = None


def socket_opened(user_id: int) -> None:
    """Count an open socket of ``user_id`` (the consumer's ``connect``)."""
    _sockets[user_id] += 1


def socket_closed(user_id: int) -> None:
    """Forget one open socket of ``user_id`` (the consumer's ``disconnect``)."""
    _sockets[user_id] -= 1
    if _sockets[user_id] <= 0:
        del _sockets[user_id]


def note_activity() -> None:
    """A socket of this process asked for admission: keep (or start) warming. Call on the event loop."""
    global _last_activity, _task
    _last_activity = time.monotonic()
    if not settings.ADMISSION_WARM_SOCKETS:
        return
    loop = asyncio.get_running_loop()
    if _task is None or _task.done() or _task.get_loop() is not loop:
        _task = loop.create_task(_run(), name="admission-warmer")


def _warm_once(user_ids: list[int]) -> None:
    try:
        load.warm(user_ids=user_ids)
    finally:
        close_old_connections()  # in this call's own context (see consumers.db_call)


async def _run() -> None:
    while _sockets and time.monotonic() - _last_activity < IDLE_S:
        try:
            await database_sync_to_async(_warm_once, thread_sensitive=False)(list(_sockets))
        except Exception:  # an outage: the consumer's own reads report it; try again next period
            logger.warning("could not warm the admission figures", exc_info=True)
        await asyncio.sleep(max(0.05, settings.ADMISSION_LOAD_CACHE_S / 4))
