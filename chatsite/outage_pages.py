"""HTTP answers while PostgreSQL is unreachable: 503 with ``Retry-After`` instead of a 500.

A view that cannot reach the database raises ``OperationalError``/``InterfaceError``
(``database.outages.DB_OUTAGE_ERRORS``); this middleware answers it as what it is, a short outage: a page
that says the service is briefly unavailable and reloads itself after ``Retry-After`` seconds (a
``<meta http-equiv="refresh">``, which the Content-Security-Policy allows), OpenAI's error shape under
``/v1/`` (code ``unavailable``; OpenAI clients retry a 503 by themselves), ``{"detail": ...}`` under
``/api/``, and ``{"error": ...}`` for a page script asking for JSON. The outage is logged at WARNING, once
per request, without the traceback of every page view. The chat socket's answer to the same outage is the
``unavailable`` frame and close code 1013 (``docs/websocket-protocol.md``).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.utils.deprecation import MiddlewareMixin

from database.outages import DB_OUTAGE_ERRORS

logger = logging.getLogger(__name__)

MESSAGE = "The service is briefly unavailable. Try again in a few seconds."


def outage_response(request) -> HttpResponse:
    """The 503 answer to ``request`` during a database outage, shaped for the caller."""
    retry_after = settings.ADMISSION_RETRY_AFTER_S
    path = request.path_info
    if path.startswith("/v1/"):
        error = {"message": MESSAGE, "type": "server_error", "param": None, "code": "unavailable"}
        response = JsonResponse({"error": error}, status=503)
    elif path.startswith("/api/"):
        response = JsonResponse({"detail": MESSAGE}, status=503)
    elif request.headers.get("Accept", "").startswith("application/json"):
        response = JsonResponse({"error": MESSAGE}, status=503)
    else:
        # Rendered without the request: its context processors would read the user from the database.
        response = HttpResponse(render_to_string("503.html", {"retry_after": retry_after}), status=503)
    response["Retry-After"] = str(retry_after)
    response["Cache-Control"] = "no-store"
    return response


class DatabaseOutageMiddleware(MiddlewareMixin):
    """Turns a view's database-outage error into :func:`outage_response` (sync and async capable; the
    hook runs only when a view raised)."""

    def process_exception(self, request, exception):
        if not isinstance(exception, DB_OUTAGE_ERRORS):
            return None
        logger.warning(
            "database unavailable: %s %s answered 503 (%s)", request.method, request.path, exception
        )
        return outage_response(request)
