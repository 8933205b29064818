"""Django's HTTP handler for daphne, with the browser middleware's hooks run in place when they do no I/O.

Under ASGI every ``MiddlewareMixin`` hook runs through ``sync_to_async(thread_sensitive=True)``: the request
waits for a thread, the thread runs the hook, the event loop is woken with its result. Django's
``SecurityMiddleware``, ``SessionMiddleware``, ``CommonMiddleware``, ``CsrfViewMiddleware``,
``AuthenticationMiddleware``, ``MessageMiddleware`` and ``XFrameOptionsMiddleware`` cost thirteen such hops
per request, about 1 ms of every response on 2 vCPUs (``/healthz``: 2.7-2.9 ms with them, 1.4-1.6 ms without),
for hooks that mostly only read headers and cookies or set lazy attributes
(docs/overhead-levers.md, lever 35).

:class:`InlineHooksASGIHandler` builds the same chain from the same ``settings.MIDDLEWARE`` (so Django's
deploy checks, which look those classes up by their dotted paths, see the settings they expect), then gives
each of those seven an async path that calls a hook in place unless that hook may touch the database, the
cache or a file: a session that must be saved, messages that must be stored, a CSRF check of an unsafe
request's body, CSRF secrets kept in the session. Those still take their thread hop, as before. The sync
handler (tests' ``Client``, ``manage.py`` tools) is Django's own. ``chatsite.content_security`` does the same for
django-csp's middleware by subclassing it, which works there because no check looks for its path. The same
reasoning sends ``request_started`` in place (``chatsite.request_started``, lever 41).
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.handlers.asgi import ASGIHandler
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware

from chatsite import request_started
from chatsite.in_place_hooks import InPlaceHooks

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class InPlaceSecurityMiddleware(InPlaceHooks, SecurityMiddleware):
    """Both hooks compare settings with the request and set headers."""


class InPlaceSessionMiddleware(InPlaceHooks, SessionMiddleware):
    """The request hook makes a lazy session store; the response hook writes only when the session was
    modified (or ``SESSION_SAVE_EVERY_REQUEST``): then it takes its thread hop."""

    def response_in_place(self, request, response) -> bool:
        session = getattr(request, "session", None)
        return session is None or not (session.modified or settings.SESSION_SAVE_EVERY_REQUEST)


class InPlaceCommonMiddleware(InPlaceHooks, CommonMiddleware):
    """User-agent and slash checks (a URL resolve), and a Content-Length header."""


class InPlaceCsrfViewMiddleware(InPlaceHooks, CsrfViewMiddleware):
    """The secret comes from a cookie unless ``CSRF_USE_SESSIONS`` (a session read: hop). The view hook runs
    in place for a CSRF-exempt view or a safe method (it checks nothing there); an unsafe request's check,
    which may read the form body and renders the failure page, takes its hop (:meth:`aprocess_view`)."""

    def request_in_place(self, request) -> bool:
        return not settings.CSRF_USE_SESSIONS

    def response_in_place(self, request, response) -> bool:
        return not settings.CSRF_USE_SESSIONS

    async def aprocess_view(self, request, callback, callback_args, callback_kwargs):
        if request.method in _SAFE_METHODS or getattr(callback, "csrf_exempt", False):
            return self.process_view(request, callback, callback_args, callback_kwargs)
        return await sync_to_async(self.process_view, thread_sensitive=True)(
            request, callback, callback_args, callback_kwargs
        )


class InPlaceAuthenticationMiddleware(InPlaceHooks, AuthenticationMiddleware):
    """Sets the lazy ``request.user`` and ``request.auser``; the user is read when something asks."""


class InPlaceMessageMiddleware(InPlaceHooks, MessageMiddleware):
    """The request hook makes the lazy storage; the response hook stores (cookie or session) only messages
    that were read or added: then it takes its thread hop."""

    def response_in_place(self, request, response) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is None or not (storage.used or storage.added_new)


class InPlaceXFrameOptionsMiddleware(InPlaceHooks, XFrameOptionsMiddleware):
    """Sets a header."""


#: Django's class -> its in-place twin. Only instances of exactly these classes are switched.
IN_PLACE: dict[type, type] = {
    SecurityMiddleware: InPlaceSecurityMiddleware,
    SessionMiddleware: InPlaceSessionMiddleware,
    CommonMiddleware: InPlaceCommonMiddleware,
    CsrfViewMiddleware: InPlaceCsrfViewMiddleware,
    AuthenticationMiddleware: InPlaceAuthenticationMiddleware,
    MessageMiddleware: InPlaceMessageMiddleware,
    XFrameOptionsMiddleware: InPlaceXFrameOptionsMiddleware,
}


class InlineHooksASGIHandler(ASGIHandler):
    """``ASGIHandler`` whose middleware chain runs the hooks of :data:`IN_PLACE`'s Django classes in place.

    After Django's ``load_middleware(is_async=True)`` builds the chain, it walks it from the outermost
    middleware inwards: through Django's exception wrapper's ``__wrapped__`` to the middleware, then through
    its ``get_response`` (:func:`_next_link`), switches each instance of exactly one of those classes to its twin (a
    subclass: same state, same sync path) and replaces CSRF's adapted ``process_view`` with the twin's
    :meth:`~InPlaceCsrfViewMiddleware.aprocess_view`. ``switched`` lists the classes switched, in chain order
    (tests check that every listed middleware was reached)."""

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async)
        self.switched: list[type] = []
        if not is_async:
            return
        request_started.install()  # Django's receivers of request_started in place too (lever 41)
        switched_ids = set()
        node = self._middleware_chain
        while node is not None:
            node = getattr(node, "__wrapped__", node)  # Django's convert_exception_to_response wrapper
            twin = IN_PLACE.get(type(node))
            if twin is not None:
                self.switched.append(type(node))
                node.__class__ = twin
                switched_ids.add(id(node))
            node = _next_link(node)
        for i, method in enumerate(self._view_middleware):
            # Django adapted a sync process_view as a SyncToAsync of the bound method.
            owner = getattr(getattr(method, "func", None), "__self__", None)
            if owner is not None and id(owner) in switched_ids and hasattr(owner, "aprocess_view"):
                self._view_middleware[i] = owner.aprocess_view


def _next_link(middleware):
    """The handler ``middleware`` calls next: a class middleware's ``get_response`` attribute, or a function
    middleware's closure variable of that name (Django's documented factory pattern, which this project's
    and allauth's follow); None at the chain's end (Django's own ``_get_response_async``)."""
    found = getattr(middleware, "get_response", None)
    if found is not None:
        return found
    code = getattr(middleware, "__code__", None)
    if code is None or "get_response" not in code.co_freevars:
        return None
    return middleware.__closure__[code.co_freevars.index("get_response")].cell_contents
