"""WebSocket authentication: the handshake's session and user read as fixed statements, and a PostgreSQL
outage met there turned into an answer instead of a failed handshake.

Channels' ``AuthMiddleware`` reads the session and the user before the consumer runs, through the ORM (two
queries compiled on every handshake) on the one thread that every thread-sensitive ``sync_to_async`` call of
the process shares. :func:`handshake_user` reads them as fixed prepared statements instead, on a thread of
the event loop's pool, its connection closed before it returns (docs/overhead-levers.md, lever 57). What it
decides is what Channels' ``get_user`` decides.

When PostgreSQL is unreachable the read raises, and the browser would see a bare 1006 with no reason. The
middleware catches the outage instead: the scope gets an anonymous user and ``scope["auth_unavailable"]``,
and the consumer accepts the socket, answers an ``unavailable`` error frame and closes with 1013 (try
again later), so the page knows to reconnect (``docs/websocket-protocol.md``, "Connection").
"""

from __future__ import annotations

import functools
import logging

from channels.auth import AuthMiddleware
from channels.db import aclose_old_connections
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from accounts.sessions import hash_matches, keeps_rows
from database.connections import db_call
from database.outages import DB_OUTAGE_ERRORS
from database.sql import fetch_instance, fetch_one

logger = logging.getLogger(__name__)

#: Scope key set (to True) when the session or the user could not be read because PostgreSQL is down.
AUTH_UNAVAILABLE = "auth_unavailable"


class OutageTolerantAuthMiddleware(AuthMiddleware):
    """``AuthMiddleware`` that reads the user with :func:`handshake_user` where the session store keeps rows
    (Django's database engine; other engines: Channels' own ``get_user``), and turns a database outage during
    that read into ``scope["auth_unavailable"] = True`` (user anonymous) instead of an exception."""

    async def resolve_scope(self, scope):
        try:
            store = scope["session"]._wrapped  # Channels' SessionMiddleware (above) put the store there
            if keeps_rows(type(store)):
                scope["user"]._wrapped = await db_call(handshake_user, thread_sensitive=False)(store)
            else:
                try:
                    await super().resolve_scope(scope)  # Channels' lookup, on the shared thread
                finally:
                    await aclose_old_connections()  # the connection it left there, usable or not
        except DB_OUTAGE_ERRORS:
            logger.warning("WebSocket user lookup failed: the database is unavailable", exc_info=True)
            scope["user"]._wrapped = AnonymousUser()
            scope[AUTH_UNAVAILABLE] = True


def handshake_user(store):
    """The user the session ``store`` (a database-backed ``SessionStore``, not loaded yet) signs in, or an
    ``AnonymousUser``: Channels' ``get_user`` with the session row and the user row read as two fixed
    statements (``database.sql``) instead of two ORM queries. The session is loaded into ``store`` as
    ``SessionStore.load`` would (a missing or expired one leaves it empty, with no key), so the consumer reads
    it from memory. A backend path the settings no longer list, an inactive or deleted user, or an auth hash
    that no longer matches the password gives an anonymous user; the last also flushes the session, as
    Channels does. A backend whose ``get_user`` is not ``ModelBackend``'s is asked itself. Raises what the
    driver raises (a database outage)."""
    key = store.session_key
    row = fetch_one(_session_data_sql(type(store)), [key, timezone.now()]) if key else None
    if row is None:
        store._session_key = None  # what SessionStore.load does for a missing or expired session
        store._session_cache = {}
        return AnonymousUser()
    store._session_cache = store.decode(row[0])  # {} when its signature does not verify
    try:
        user_id = get_user_model()._meta.pk.to_python(store[SESSION_KEY])
        backend_path = store[BACKEND_SESSION_KEY]
    except KeyError:
        return AnonymousUser()
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return AnonymousUser()
    backend = load_backend(backend_path)
    if type(backend).get_user is ModelBackend.get_user:
        user = fetch_instance(get_user_model(), "id = %s", [user_id])
        user = user if user is not None and backend.user_can_authenticate(user) else None
    else:
        user = backend.get_user(user_id)
    if user is not None and hasattr(user, "get_session_auth_hash"):
        if not hash_matches(store, user.get_session_auth_hash()):
            store.flush()
            user = None
    return user or AnonymousUser()


@functools.cache
def _session_data_sql(store_class) -> str:
    """A live session's stored data by key (``%s``: the key, then now), for :func:`handshake_user`."""
    meta = store_class.get_model_class()._meta
    return (
        f'SELECT "{meta.get_field("session_data").column}" FROM "{meta.db_table}" '
        f'WHERE "{meta.pk.column}" = %s AND "{meta.get_field("expire_date").column}" > %s'
    )


def auth_middleware_stack(inner):
    """Channels' ``AuthMiddlewareStack`` (cookies, session, user) with :class:`OutageTolerantAuthMiddleware`."""
    return CookieMiddleware(SessionMiddleware(OutageTolerantAuthMiddleware(inner)))
