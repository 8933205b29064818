"""Django's ``request_started`` signal sent in place under ASGI when its receivers are Django's own two, which
can do nothing there (lever 41, docs/overhead-levers.md).

``ASGIHandler.handle`` sends ``request_started`` with ``asend`` before it builds the request, and ``asend`` runs
the signal's sync receivers behind ``sync_to_async(thread_sensitive=True)``. Inside the ``ThreadSensitiveContext``
that Django opens for every request, that hop starts the request's own executor thread: a new thread per
request, then the event loop woken with the result, about 1 ms between daphne handing over the body and the
outermost middleware on 2 vCPUs (Intel Xeon family 6 model 207, 2026-12-05), on the critical path of every
API request. Django's receivers there are ``reset_queries`` and ``close_old_connections``: both act only on the
database connections of the thread they run in, and that new thread holds none yet. The event loop's thread holds
none either (Django refuses a connection in an async context), so run in place they do the same nothing
without the hop. Any other receiver, or any async one, makes :func:`install`'s ``asend`` fall back to Django's.
The connections a request's thread-sensitive hops open are still closed by ``request_finished``, which this
leaves alone.
"""

from __future__ import annotations

from django.core import signals
from django.db import close_old_connections, reset_queries

#: Sync receivers that touch only the calling thread's already-open database connections.
IN_PLACE_RECEIVERS = frozenset({close_old_connections, reset_queries})


def install() -> None:
    """Give ``signals.request_started`` an ``asend`` that calls the receivers in place when they are all in
    :data:`IN_PLACE_RECEIVERS`, else awaits Django's own ``asend``. Idempotent; ``send`` (the sync handler,
    the test client) is unchanged. Returns the same ``[(receiver, response), ...]`` list as Django's."""
    signal = signals.request_started
    if getattr(signal.asend, "in_place", False):
        return
    djangos_asend = signal.asend

    async def asend(sender, **named):
        if not signal.receivers:
            return []
        sync_receivers, async_receivers = signal._live_receivers(sender)
        if async_receivers or not all(r in IN_PLACE_RECEIVERS for r in sync_receivers):
            return await djangos_asend(sender, **named)
        return [(r, r(signal=signal, sender=sender, **named)) for r in sync_receivers]

    asend.in_place = True
    signal.asend = asend
