"""The browser middleware that the bearer-key API (``/v1/``) can skip: Django's common URL handling, log-in
(``request.user``) and flash messages.

They serve cookies and browser URLs; a ``/v1/`` request carries an API key instead (``api/auth.py``), so they
do nothing for it but cost time: under ASGI each ``MiddlewareMixin`` hook runs through
``sync_to_async(thread_sensitive=True)`` (Django's ``MiddlewareMixin.__acall__``), one thread hop per hook,
five per request for these three. Sessions and CSRF would be five more (the ``/v1/`` views are CSRF-exempt
and read no session), but Django's deploy checks look for those two by their dotted paths (security.W003,
and the session cookie checks), so they stay as they are. ``GET /v1/models`` in-process with
``AsyncClient``: docs/overhead.md, lever 17.

:func:`browser_only` wraps a middleware class so that it runs for every request except ``/v1/`` ones;
``settings.MIDDLEWARE`` names the wrapped classes below (subclasses of Django's, so the admin's checks still
find them). Every other request (pages, the history API ``/api/``, the admin, health checks) goes through
them unchanged, and the security headers (``SecurityMiddleware``, ``XFrameOptionsMiddleware``, the
Content-Security-Policy) stay on every response.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.contrib.auth.middleware import AuthenticationMiddleware as _AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware as _MessageMiddleware
from django.middleware.common import CommonMiddleware as _CommonMiddleware

#: Paths served to API-key clients only (the OpenAI-compatible API).
API_PREFIX = "/v1/"


def is_api_request(request) -> bool:
    """Whether ``request`` is for the bearer-key API (its path starts with :data:`API_PREFIX`)."""
    return request.path_info.startswith(API_PREFIX)


def browser_only(middleware_class: type) -> type:
    """A middleware class (sync and async capable as ``middleware_class`` is) that runs
    ``middleware_class`` for every request but an API one (:func:`is_api_request`), which goes straight on to
    the rest of the chain. The wrapped class's ``process_view``, ``process_exception`` and
    ``process_template_response`` hooks, which Django's handler calls itself, are passed on the same way:
    in an async chain as coroutines, so an API request skips them without a thread hop, while any other
    request runs them through ``sync_to_async(thread_sensitive=True)`` as Django's handler would."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.inner = middleware_class(get_response)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        for hook in HOOKS:  # per instance: the handler adapts each hook to its chain's mode
            if hasattr(self.inner, hook):
                setattr(self, hook, _passed_on(getattr(self.inner, hook), hook, is_async=self.is_async))

    def __call__(self, request):
        if self.is_async:
            return self.__acall__(request)
        return self.get_response(request) if is_api_request(request) else self.inner(request)

    async def __acall__(self, request):
        if is_api_request(request):
            return await self.get_response(request)
        return await self.inner(request)

    return type(
        middleware_class.__name__,
        (middleware_class,),  # a subclass, for checks such as the admin's (none of its own code runs)
        {
            "__init__": __init__,
            "__call__": __call__,
            "__acall__": __acall__,
            "__doc__": f"``{middleware_class.__module__}.{middleware_class.__qualname__}``, skipped for /v1/.",
            "sync_capable": getattr(middleware_class, "sync_capable", True),
            "async_capable": getattr(middleware_class, "async_capable", False),
        },
    )


#: The hooks Django's handler calls on a middleware itself (not through its ``__call__``).
HOOKS = ("process_view", "process_exception", "process_template_response")


def _passed_on(inner_hook, hook: str, *, is_async: bool):
    """``inner_hook`` for a request other than an API one; for an API one what a missing hook would give:
    None (``process_view``, ``process_exception``) or the response unchanged (``process_template_response``)."""

    def skipped(args):
        return args[-1] if hook == "process_template_response" else None

    if is_async:

        async def async_hook(request, *args):
            if is_api_request(request):
                return skipped(args)
            if iscoroutinefunction(inner_hook):
                return await inner_hook(request, *args)
            return await sync_to_async(inner_hook, thread_sensitive=True)(request, *args)

        return async_hook

    def sync_hook(request, *args):
        return skipped(args) if is_api_request(request) else inner_hook(request, *args)

    return sync_hook


CommonMiddleware = browser_only(_CommonMiddleware)
AuthenticationMiddleware = browser_only(_AuthenticationMiddleware)
MessageMiddleware = browser_only(_MessageMiddleware)
