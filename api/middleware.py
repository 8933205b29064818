"""``x-request-id`` on every response: the caller's own id when it sent a sane one, else a new one.
``request.request_id`` holds it (and ``request.received_ns`` the moment it came in, ns since the epoch), and it is the ``request_id`` field of every log record written while the
request is handled (``observability.logs.log_context``; carried by sync_to_async threads and, through the
generation task's headers, into the worker's records of the reply)."""

import re
import time
import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from observability.logs import log_context

HEADER = "x-request-id"
_SANE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_for(request) -> str:
    """The caller's ``X-Request-Id`` if it is 1-128 characters of ``[A-Za-z0-9._:-]``, else ``req_<hex>``."""
    given = request.headers.get(HEADER, "")
    return given if _SANE.match(given) else f"req_{uuid.uuid4().hex}"


def request_id_middleware(get_response):
    """Sync and async capable middleware (async views such as the SSE stream stay async)."""
    if iscoroutinefunction(get_response):

        async def middleware(request):
            request.request_id = request_id_for(request)
            request.received_ns = time.time_ns()  # the first stage of an API reply's trace (docs/overhead.md)
            with log_context(request_id=request.request_id):
                response = await get_response(request)
            response[HEADER] = request.request_id
            return response

        markcoroutinefunction(middleware)
        return middleware

    def middleware(request):
        request.request_id = request_id_for(request)
        request.received_ns = time.time_ns()
        with log_context(request_id=request.request_id):
            response = get_response(request)
        response[HEADER] = request.request_id
        return response

    return middleware


request_id_middleware.sync_capable = True
request_id_middleware.async_capable = True
