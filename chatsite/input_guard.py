"""Refuse HTTP input that PostgreSQL cannot store, before any view runs.

A NUL character (``%00`` in a form or query string, ``\\u0000`` in JSON) or a lone surrogate (``\\ud800``
in JSON) in a field that reaches a ``text`` column made the write fail inside the view as a server error (a
conversation renamed to a title holding NUL answered 500). This middleware checks every query parameter, form
field name and value (multipart ones in bodies up to 256 KiB: larger ones are uploads) and JSON string (keys
too; any body that parses as JSON) of every request, and answers 400 naming the field, so nothing is written
and every form and JSON endpoint is covered, including later ones. File contents are the receiving view's to
check (``conversations.archive`` refuses such an import; the documents app such a file).

The answer takes the shape the caller expects: OpenAI's error object under ``/v1/``, django-ninja's
``{"detail": ...}`` under ``/api/``, ``{"error": ...}`` for a page script asking for JSON, else a page.
"""

from __future__ import annotations

import json
import logging
import re
from io import BytesIO

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.files.uploadhandler import MemoryFileUploadHandler
from django.http import HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParser, MultiPartParserError
from django.http.request import UnreadablePostError
from django.template.loader import render_to_string

from database.storable_text import first_unstorable, text_problem

logger = logging.getLogger(__name__)

#: What an unstorable string looks like in raw JSON: ``\u0000`` or a ``\uD800``-``\uDFFF`` escape (a
#: surrogate; a correct pair decodes to one storable character, and the decoded check decides). A raw NUL
#: byte is no concern: it makes the document invalid JSON, which the view refuses.
_JSON_SUSPECT = re.compile(rb"\\u0000|\\u[dD][89a-fA-F]")
_BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")
#: Multipart bodies up to this size (bytes) are forms to check; larger ones are uploads (see _multipart_field).
MULTIPART_CHECK_MAX_BYTES = 256 * 1024
#: Bodies (not multipart) up to this size (bytes) are checked on the event loop; larger ones on a thread.
INLINE_CHECK_MAX_BYTES = 64 * 1024


def _in_pairs(pairs) -> tuple[str, str] | None:
    for key, values in pairs:
        problem = text_problem(key)
        if problem:
            return "<field name>", problem
        for value in values:
            problem = text_problem(value)
            if problem:
                return key, problem
    return None


def _multipart_field(request) -> tuple[str, str] | None:
    """The page's scripts post ``FormData`` (multipart), so small multipart bodies are checked, on a copy:
    ``request.POST`` stays unparsed, for an upload view installs its own upload handlers (a size cap) before
    it reads the body. Larger bodies are uploads, left to their views: Django's parser drops non-printable
    characters from file names and Django form fields refuse NUL."""
    if int(request.META.get("CONTENT_LENGTH") or 0) > MULTIPART_CHECK_MAX_BYTES:
        return None
    try:
        parser = MultiPartParser(
            request.META, BytesIO(request.body), [MemoryFileUploadHandler(request)], request.encoding
        )
        fields, _files = parser.parse()
    except (RequestDataTooBig, SuspiciousOperation, MultiPartParserError, UnreadablePostError, OSError):
        return None
    return _in_pairs(fields.lists())


def unstorable_field(request) -> tuple[str, str] | None:
    """``(field, reason)`` for the first input of ``request`` that PostgreSQL could not store, else None.
    ``field``: a query or form field name, a JSON path (``messages[0].content``) or ``path``. Bodies Django cannot read (too big, malformed) are left to the view, which refuses them."""
    problem = text_problem(request.path_info)
    if problem:
        return "path", problem
    found = _in_pairs(request.GET.lists())
    if found or request.method not in _BODY_METHODS:
        return found
    content_type = request.content_type or ""
    if content_type == "multipart/form-data":
        return _multipart_field(request)
    try:
        if content_type == "application/x-www-form-urlencoded":
            found = _in_pairs(request.POST.lists())
            if found:
                return found
        # Any other body is checked as JSON when it parses as JSON, whatever its Content-Type says: the /v1
        # views parse the body regardless (a client that forgot the header, as curl -d does, still reaches
        # them), and a real urlencoded form does not parse as JSON.
        raw = request.body
        if not _JSON_SUSPECT.search(raw):
            return None
        try:
            return first_unstorable(json.loads(raw))
        except (ValueError, RecursionError):
            return None  # not JSON: the view says so
    except (RequestDataTooBig, SuspiciousOperation, MultiPartParserError, UnreadablePostError, OSError):
        return None
    return None


def refusal(request, field: str, problem: str) -> HttpResponse:
    """The 400 answer for ``field`` holding unstorable text, shaped for the caller (module docstring)."""
    message = f"'{field}' {problem}, which cannot be stored. Nothing was changed."
    path = request.path_info
    if path.startswith("/v1/"):
        body = {"message": message, "type": "invalid_request_error", "param": field, "code": "invalid_value"}
        return JsonResponse({"error": body}, status=400)
    if path.startswith("/api/"):
        return JsonResponse({"detail": message}, status=400)
    if request.headers.get("Accept", "").startswith("application/json"):
        return JsonResponse({"error": message}, status=400)
    # Rendered without the request: no context processor, so no database read for a refused request.
    return HttpResponse(render_to_string("400.html", {"message": message}), status=400)


def _checked_on_a_thread(request) -> bool:
    """In async mode, whether the check goes to a thread: a multipart body (a parse), or any body over
    ``INLINE_CHECK_MAX_BYTES`` (a bigger read and scan). A small body is in memory (Django spools a request
    body to disk only past ``FILE_UPLOAD_MAX_MEMORY_SIZE``), and its check is a regular-expression scan, so it
    runs in place: an API request's thread hop less (docs/overhead-levers.md, lever 35)."""
    if request.method not in _BODY_METHODS:
        return False
    if (request.content_type or "") == "multipart/form-data":
        return True
    return int(request.META.get("CONTENT_LENGTH") or 0) > INLINE_CHECK_MAX_BYTES


def input_guard_middleware(get_response):
    """Sync and async capable; in async mode a large or multipart body is read and checked on a thread
    (:func:`_checked_on_a_thread`)."""

    def check(request) -> HttpResponse | None:
        found = unstorable_field(request)
        if found is None:
            return None
        logger.warning("refused a request: %s %s", found[0], found[1])
        return refusal(request, *found)

    if iscoroutinefunction(get_response):

        async def middleware(request):
            if _checked_on_a_thread(request):
                refused = await sync_to_async(check, thread_sensitive=False)(request)
            else:
                refused = check(request)
            return refused or await get_response(request)

        markcoroutinefunction(middleware)
        return middleware

    def middleware(request):
        return check(request) or get_response(request)

    return middleware


input_guard_middleware.sync_capable = True
input_guard_middleware.async_capable = True
