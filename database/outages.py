"""Riding out a short PostgreSQL outage on the worker side: retry a write until the database is back.

A reply's final write is the one write whose loss costs the user something (the text was generated, the
tokens were spent), so the worker retries it with capped exponential backoff for up to
``settings.GENERATION_FINISH_RETRY_S`` seconds before giving up. When it gives up, the reply is still
``streaming`` with its text in the Redis replay stream, and the reaper later stores it as ``interrupted``
with that text (``generations.generations_reap_interrupted``): nothing is half-written, because each
write is one transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Errors that mean "the database is unreachable right now", as opposed to a bug or a constraint.
DB_OUTAGE_ERRORS = (OperationalError, InterfaceError)


def with_db_retry(
    fn: Callable[[], T],
    *,
    window_s: float,
    first_delay_s: float = 0.25,
    max_delay_s: float = 4.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``fn()``; while it raises a database outage error (``OperationalError``/``InterfaceError``),
    drop this thread's broken connection and call it again after 0.25, 0.5, 1, 2, 4, 4, ... seconds, for
    at most ``window_s`` seconds in all. Re-raises the last error after that; other errors at once.

    ``fn`` must be one transaction (or idempotent), since a failure may come after a partial attempt."""
    deadline = clock() + window_s
    delay = first_delay_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except DB_OUTAGE_ERRORS as exc:
            if clock() + delay > deadline:
                raise
            logger.warning("database unavailable (attempt %d, retrying in %.2f s): %s", attempt, delay, exc)
        except DatabaseError:
            raise
        try:
            connection.close()
        except DatabaseError:
            pass
        sleep(delay)
        delay = min(delay * 2, max_delay_s)
