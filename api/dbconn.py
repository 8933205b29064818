"""Closing a request's database connections when it ends, for views served by daphne (ASGI).

Under ASGI each request runs its sync code in a thread of its own (asgiref's ThreadSensitiveContext), so a
persistent connection (``CONN_MAX_AGE`` > 0) is not reused by the next request but left open until garbage
collection: ~one PostgreSQL connection per request (Django ticket #33497). The API's views close theirs.
"""

import functools

from django.db import connections


def close_request_connections() -> None:
    """Close this thread's initialized connections, except one inside a transaction (a test's wrapper)."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


def closes_connections(view):
    """Decorator for a sync view: close its thread's connections once it has answered."""

    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        try:
            return view(*args, **kwargs)
        finally:
            close_request_connections()

    return wrapper
