"""Admission refusals per tier and reason, counted per minute in Redis so the staff page sees the whole
fleet's web processes (each process's Prometheus counters only see its own)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter

from events import broadcast

logger = logging.getLogger(__name__)
KEY_PREFIX = "chatsite:refusals:"
KEEP_S = 3600
#: Seconds a refusal counted on the event loop (:func:`refusal_note`) waits before it is written to Redis.
NOTE_FLUSH_S = 1.0

# (minute, tier, reason) -> refusals noted on an event loop and not yet written (see refusal_note).
_noted: Counter[tuple[int, str, str]] = Counter()
_noted_lock = threading.Lock()
_flush_loop: asyncio.AbstractEventLoop | None = None  # the loop a flush is scheduled on, if any


def _key(minute: int) -> str:
    return f"{KEY_PREFIX}{minute}"


def _write(counts: dict[tuple[int, str, str], int]) -> None:
    """Add ``{(minute, tier, reason): n}`` to the per-minute hashes in one pipeline. Raises Redis errors."""
    pipe = broadcast.redis_client().pipeline(transaction=False)
    for (minute, tier, reason), n in counts.items():
        pipe.hincrby(_key(minute), f"{tier}|{reason}", n)
        pipe.expire(_key(minute), KEEP_S)
    pipe.execute()


def refusal_record(*, tier: str, reason: str, now: float | None = None) -> None:
    """Count one refusal (``reason``: an ``AdmissionRefused.code``). Never raises: a Redis outage must not
    turn a refusal into a server error."""
    minute = int((now or time.time()) // 60)
    try:
        _write({(minute, tier, reason): 1})
    except Exception:
        logger.warning("could not count a refusal", exc_info=True)


def refusal_note(*, tier: str, reason: str, now: float | None = None) -> None:
    """Count one refusal decided on the event loop (the chat consumer's gate, from memory), without a Redis
    round trip there: the count is kept in this process and written by :func:`refusals_flush` on a worker
    thread within ``NOTE_FLUSH_S``, in the minute it happened. Call on a running event loop; never raises."""
    global _flush_loop
    minute = int((now or time.time()) // 60)
    loop = asyncio.get_running_loop()
    with _noted_lock:
        _noted[(minute, tier, reason)] += 1
        if _flush_loop is not None and not _flush_loop.is_closed():
            return  # a flush is already due on a live loop
        _flush_loop = loop
    loop.call_later(NOTE_FLUSH_S, lambda: loop.run_in_executor(None, refusals_flush))


def refusals_flush() -> int:
    """Write the refusals :func:`refusal_note` kept to Redis (one pipeline); returns how many. On a Redis
    error they are kept for the next flush. Blocking: run it off the event loop. Never raises."""
    global _flush_loop
    with _noted_lock:
        batch = dict(_noted)
        _noted.clear()
        _flush_loop = None
    if not batch:
        return 0
    try:
        _write(batch)
    except Exception:
        logger.warning(
            "could not count %d refusals; kept for the next flush", sum(batch.values()), exc_info=True
        )
        with _noted_lock:
            _noted.update(batch)
        return 0
    return sum(batch.values())


def refusals_recent(*, minutes: int = 15, now: float | None = None) -> dict[tuple[str, str], int]:
    """``{(tier, reason): count}`` over the last ``minutes`` whole minutes including the current one."""
    current = int((now or time.time()) // 60)
    client = broadcast.redis_client()
    pipe = client.pipeline(transaction=False)
    for minute in range(current - minutes + 1, current + 1):
        pipe.hgetall(_key(minute))
    totals: dict[tuple[str, str], int] = {}
    for counts in pipe.execute():
        for field, value in counts.items():
            tier, _, reason = field.decode().partition("|")
            totals[(tier, reason)] = totals.get((tier, reason), 0) + int(value)
    return totals
