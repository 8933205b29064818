"""Closing database connections under ASGI: a sync view's when it has answered, and an async caller's
(the chat consumer, the admission warmer) inside each database call.

Under ASGI each request runs its sync code in a thread of its own (asgiref's ThreadSensitiveContext), so a
persistent connection (``CONN_MAX_AGE`` > 0) is not reused by the next request but left open until garbage
collection: ~one PostgreSQL connection per request (Django ticket #33497). The API's views close theirs
(:func:`closes_connections`, :func:`close_request_connections`); async code calls the database through
:func:`db_call`.
"""

from __future__ import annotations

import functools

from channels.db import database_sync_to_async
from django.db import close_old_connections, connections


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


def db_call(func, *, thread_sensitive: bool = True, executor=None):
    """``database_sync_to_async(func)`` whose database connections are closed (``CONN_MAX_AGE`` 0) before it
    returns, inside ``func``'s own thread and context: with asgiref 3.13 a connection opened in the call
    is not visible to the wrapper's own ``close_old_connections`` (it runs outside the call's context) and
    was closed only by Channels' per-message hop, which ``ChatConsumer.dispatch`` drops. ``executor``: a
    thread pool of the caller's own (with ``thread_sensitive=False``), e.g. the warmer's single thread."""

    @functools.wraps(func)
    def call(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        finally:
            close_old_connections()

    return database_sync_to_async(call, thread_sensitive=thread_sensitive, executor=executor)
