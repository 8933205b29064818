"""Database work from async code (the chat consumer, the admission warmer) that closes its own connections."""

from __future__ import annotations

import functools

from channels.db import database_sync_to_async
from django.db import close_old_connections


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
