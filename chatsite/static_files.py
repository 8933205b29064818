"""WhiteNoise in an all-async middleware chain.

WhiteNoise's middleware (6.12) is sync-only. One sync-only middleware makes Django run the whole chain in a
thread and reach the async views through ``async_to_sync``; when a client goes away, Django cancels the
request's task, but the cancellation stops at that thread hop and never reaches the view, so an API
completion whose client left with its request ran on for nobody (found by a fresh-clone run of
``tests/integration/test_openai_api.py::test_hang_up_with_the_request_leaves_nothing_generating``). This
subclass looks files up the same way (a dictionary lookup, or the finders when autorefreshing) and is
async-capable, so the chain stays async end to end and cancellation reaches the view."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from whitenoise.middleware import WhiteNoiseMiddleware


class AsyncWhiteNoiseMiddleware(WhiteNoiseMiddleware):
    """``whitenoise.middleware.WhiteNoiseMiddleware`` that runs in async mode under ASGI (and sync under
    WSGI): a static file is served the same way; anything else goes to the next handler unchanged."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None, settings=None):
        kwargs = {} if settings is None else {"settings": settings}
        super().__init__(get_response, **kwargs)
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.async_mode:
            return self._acall(request)
        return super().__call__(request)

    def _static_file(self, request):
        if self.autorefresh:
            return self.find_file(request.path_info)
        return self.files.get(request.path_info)

    async def _acall(self, request):
        static_file = self._static_file(request)
        if static_file is not None:
            return self.serve(static_file, request)
        return await self.get_response(request)
