"""The Content-Security-Policy header (django-csp), set by a middleware that stays async under ASGI.

django-csp's ``CSPMiddleware`` is a ``MiddlewareMixin``: under ASGI it runs its request and response hooks
through ``sync_to_async(thread_sensitive=True)``, i.e. two hops per request onto the one thread every sync
view shares. Both hooks only build a string, so this subclass calls them in place
(``chatsite.in_place_hooks``; the policy itself is ``settings.CONTENT_SECURITY_POLICY``, built by
:func:`content_security_policy`; docs/security.md).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from csp.constants import NONE, SELF
from csp.middleware import CSPMiddleware

from chatsite.in_place_hooks import InPlaceHooks


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``; ``""`` for an empty or relative one."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def content_security_policy(*, connect_src: list[str], form_action: list[str] = ()) -> dict:
    """django-csp's ``CONTENT_SECURITY_POLICY`` setting: scripts, styles, fonts and fetches only from this
    origin (CSP 3's ``'self'`` covers the same-origin ``ws:``/``wss:`` chat socket) plus ``connect_src``,
    no inline script or style, no plugins, no framing, ``<base>`` only to this origin, and forms only to
    this origin plus ``form_action`` (browsers apply ``form-action`` to the redirects after a form is sent,
    so the payment provider's checkout and the identity provider's log-in, which a form of ours redirects
    to, must be named there)."""
    return {
        "DIRECTIVES": {
            "default-src": [SELF],
            "script-src": [SELF],
            "style-src": [SELF],
            "img-src": [SELF, "data:"],  # data: the admin's and the API docs' inline SVG icons
            "font-src": [SELF],
            "connect-src": [SELF, *connect_src],
            "object-src": [NONE],
            "base-uri": [SELF],
            "form-action": [SELF, *form_action],
            "frame-ancestors": [NONE],
        }
    }


class AsyncCSPMiddleware(InPlaceHooks, CSPMiddleware):
    """``csp.middleware.CSPMiddleware`` without the thread hops in async mode (both hooks in place, as
    ``chatsite.asgi_handler`` runs Django's own); the same header either way."""
