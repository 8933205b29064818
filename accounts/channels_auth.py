"""WebSocket authentication that survives a PostgreSQL outage.

Channels' ``AuthMiddleware`` reads the session and the user before the consumer runs; when PostgreSQL is
unreachable that read raises, the handshake fails, and the browser sees a bare 1006 with no reason. This
middleware catches the outage instead: the scope gets an anonymous user and ``scope["auth_unavailable"]``,
and the consumer accepts the socket, answers an ``unavailable`` error frame and closes with 1013 (try
again later), so the page knows to reconnect (``docs/websocket-protocol.md``, "Connection").
"""

from __future__ import annotations

import logging

from channels.auth import AuthMiddleware
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.contrib.auth.models import AnonymousUser

from database.outages import DB_OUTAGE_ERRORS

logger = logging.getLogger(__name__)

#: Scope key set (to True) when the session or the user could not be read because PostgreSQL is down.
AUTH_UNAVAILABLE = "auth_unavailable"


class OutageTolerantAuthMiddleware(AuthMiddleware):
    """``AuthMiddleware`` that turns a database outage during the user lookup into
    ``scope["auth_unavailable"] = True`` (user anonymous) instead of an exception."""

    async def resolve_scope(self, scope):
        try:
            await super().resolve_scope(scope)
        except DB_OUTAGE_ERRORS:
            logger.warning("WebSocket user lookup failed: the database is unavailable", exc_info=True)
            scope["user"]._wrapped = AnonymousUser()
            scope[AUTH_UNAVAILABLE] = True


def auth_middleware_stack(inner):
    """Channels' ``AuthMiddlewareStack`` (cookies, session, user) with :class:`OutageTolerantAuthMiddleware`."""
    return CookieMiddleware(SessionMiddleware(OutageTolerantAuthMiddleware(inner)))
