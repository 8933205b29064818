"""The async path of a ``MiddlewareMixin`` that runs its hooks in place (:class:`InPlaceHooks`), for the
hooks that do no I/O: Django's browser middleware under daphne (``chatsite.asgi_handler``, which decides per
hook) and django-csp's (``chatsite.content_security``). Imports nothing of Django's, so settings may import
the modules that use it."""

from __future__ import annotations

from asgiref.sync import sync_to_async


class InPlaceHooks:
    """The async path of a ``MiddlewareMixin`` (mixed in before it): each hook called in place when
    :meth:`request_in_place` / :meth:`response_in_place` say it does no I/O, else on the request's sync
    thread as ``MiddlewareMixin.__acall__`` does. Either way the hook, its result and its exceptions are the
    same; only the thread differs."""

    def request_in_place(self, request) -> bool:
        return True

    def response_in_place(self, request, response) -> bool:
        return True

    async def __acall__(self, request):
        response = None
        if hasattr(self, "process_request"):
            if self.request_in_place(request):
                response = self.process_request(request)
            else:
                response = await sync_to_async(self.process_request, thread_sensitive=True)(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            if self.response_in_place(request, response):
                response = self.process_response(request, response)
            else:
                response = await sync_to_async(self.process_response, thread_sensitive=True)(
                    request, response
                )
        return response
