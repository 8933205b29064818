"""The Content-Security-Policy header (django-csp), set by a middleware that stays async under ASGI.

django-csp's ``CSPMiddleware`` is a ``MiddlewareMixin``: under ASGI it runs its request and response hooks
through ``sync_to_async(thread_sensitive=True)``, i.e. two hops per request onto the one thread every sync
view shares. Both hooks only build a string, so this subclass calls them in place (the policy itself is
``settings.CONTENT_SECURITY_POLICY``, documented in docs/security.md).
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware


class AsyncCSPMiddleware(CSPMiddleware):
    """``csp.middleware.CSPMiddleware`` without the thread hops in async mode; the same header either way."""

    async def __acall__(self, request):
        self.process_request(request)
        response = await self.get_response(request)
        return self.process_response(request, response)
