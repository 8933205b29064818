"""Readiness checks for ``/readyz``: PostgreSQL, Redis, the Celery broker and at least one ready worker.

Each check returns ``None`` when healthy or a short reason (no secrets, no stack traces) when not.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection

from events import broadcast
from inference import fleet

BROKER_TIMEOUT_S = 2.0


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


def check_broker() -> str | None:
    from celery import current_app

    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
    except Exception as exc:
        return f"broker unreachable ({type(exc).__name__})"
    return None


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
