"""Readiness checks for ``/readyz``: PostgreSQL, Redis, the Celery broker and at least one ready worker.

Each check returns ``None`` when healthy or a short reason (no secrets, no stack traces) when not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.db import connection

from events import broadcast
from inference import fleet

BROKER_TIMEOUT_S = 2.0
# The broker check answers from a result at most this old (s) and starts a fresh look once it is older.
BROKER_RECHECK_S = 5.0
# A result older than this (s), its refresh hung past BROKER_TIMEOUT_S, fails the check.
BROKER_STALE_S = 20.0


def check_postgres() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return f"database unreachable ({type(exc).__name__})"
    return None


def check_redis() -> str | None:
    try:
        broadcast.redis_client().ping()
    except Exception as exc:
        return f"redis unreachable ({type(exc).__name__})"
    return None


def probe_broker() -> str | None:
    """One look at the Celery broker: a fresh connection, ``BROKER_TIMEOUT_S`` to answer. On a slow broker
    link this takes several round trips (AMQP's handshake is four), which is why ``/readyz`` reads
    :data:`BROKER` instead of calling it."""
    from celery import current_app

    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
    except Exception as exc:
        return f"broker unreachable ({type(exc).__name__})"
    return None


class BackgroundCheck:
    """A readiness check whose answer is refreshed off the probe's path: the first call runs ``probe``
    inline, later calls answer at once with the last result and, once it is ``recheck_s`` old, start one
    refresh on a thread of its own. A result not refreshed for ``stale_s`` (a refresh that hangs) fails.

    Why: the load balancer's health check must answer within its own timeout (``timeout check`` in
    deploy/haproxy/haproxy.cfg) whatever the link to a shared service costs. A check that opened a broker
    connection inline took 0.8-1.8 s on a broker link 100 ms away, so every web node failed its checks at
    once and the balancer cut every open socket (the bed's ``lossy_broker`` drill).

    ``probe``: ``() -> None | reason``; ``clock``: seconds, monotonic."""

    def __init__(self, probe, *, recheck_s: float, stale_s: float, clock=time.monotonic) -> None:
        self.probe, self.recheck_s, self.stale_s, self.clock = probe, recheck_s, stale_s, clock
        self._lock = threading.Lock()
        self._result: str | None = None
        self._at: float | None = None
        self._refreshing = False

    def __call__(self) -> str | None:
        """``None`` when the last look found the service fine, else a short reason."""
        now = self.clock()
        with self._lock:
            first = self._at is None
            start = not first and not self._refreshing and now - self._at >= self.recheck_s
            if start:
                self._refreshing = True
            result, at = self._result, self._at
        if first:
            return self._refresh()
        if start:
            threading.Thread(target=self._refresh, name="readiness-refresh", daemon=True).start()
        if now - at > self.stale_s:
            return f"no answer for {now - at:.0f} s"
        return result

    def _refresh(self) -> str | None:
        try:
            result = self.probe()
        except Exception as exc:  # a probe's own bug reads as a failing check, never as a 500
            result = f"check failed ({type(exc).__name__})"
        with self._lock:
            self._result, self._at, self._refreshing = result, self.clock(), False
        return result

    def forget(self) -> None:
        """Drop the last result: the next call looks again, inline (tests, and after a settings change)."""
        with self._lock:
            self._result, self._at = None, None


BROKER = BackgroundCheck(probe_broker, recheck_s=BROKER_RECHECK_S, stale_s=BROKER_STALE_S)


def check_broker() -> str | None:
    """The broker's last known reachability (:data:`BROKER`): ``None`` or a reason."""
    return BROKER()


def check_workers() -> str | None:
    try:
        workers = fleet.live_workers()
    except Exception as exc:
        return f"fleet status unreadable ({type(exc).__name__})"
    if not any(w.ready and not w.draining for w in workers):
        return "no worker with a ready engine" + (f" ({len(workers)} draining or loading)" if workers else "")
    return None


CHECKS: dict[str, Callable[[], str | None]] = {
    "postgres": check_postgres,
    "redis": check_redis,
    "broker": check_broker,
    "workers": check_workers,
}


def workers_summary() -> list[dict]:
    """Each live worker's identity, backend and health for ``/readyz`` (``[]`` when the fleet is unreadable)."""
    try:
        workers = fleet.live_workers()
    except Exception:
        return []
    return [
        {
            "worker": w.worker_id,
            "model": w.model,
            "backend": w.backend,
            "ready": w.ready and not w.draining,
            "health": w.health,
        }
        for w in workers
    ]


def readiness() -> dict[str, str]:
    """``{check name: "ok" | reason}`` for every check, in order."""
    return {name: (check() or "ok") for name, check in CHECKS.items()}


def vector_store() -> dict | str:
    """Memory's vector store (issue 27): ``{"backend": "pgvector" | "exact", "vectors": n, "pending": n}``,
    or a short reason when it cannot be read."""
    from memory.selectors import store_status

    try:
        return store_status()
    except Exception as exc:
        return f"unreadable ({type(exc).__name__})"
