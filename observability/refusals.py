"""Admission refusals per tier and reason, counted per minute in Redis so the staff page sees the whole
fleet's web processes (each process's Prometheus counters only see its own)."""

from __future__ import annotations

import logging
import time

from conversations import broadcast

logger = logging.getLogger(__name__)
KEY_PREFIX = "chatsite:refusals:"
KEEP_S = 3600


def _key(minute: int) -> str:
    return f"{KEY_PREFIX}{minute}"


def refusal_record(*, tier: str, reason: str, now: float | None = None) -> None:
    """Count one refusal (``reason``: an ``AdmissionRefused.code``). Never raises: a Redis outage must not
    turn a refusal into a server error."""
    minute = int((now or time.time()) // 60)
    try:
        pipe = broadcast.redis_client().pipeline(transaction=False)
        pipe.hincrby(_key(minute), f"{tier}|{reason}", 1)
        pipe.expire(_key(minute), KEEP_S)
        pipe.execute()
    except Exception:
        logger.warning("could not count a refusal", exc_info=True)


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
