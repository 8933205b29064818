"""Reading an uploaded file within the size limit, for the page's and the API's upload views.

Django keeps reading an upload of any size (into memory, then a temporary file) before a view can look at
it. :func:`upload_limit` installs :class:`CappedUploadHandler` first, so reading stops a little past the limit,
and refuses a request whose ``Content-Length`` already says it is too large without reading its body
(:func:`upload_limit`, then :func:`upload_take`). The view must not have touched ``request.POST``/``request.FILES`` before (for the page: ``csrf_exempt``
outside and ``csrf_protect`` inside, as Django's upload-handler docs show).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.files.uploadhandler import FileUploadHandler, StopUpload

from documents.parsing import DocumentRejected

#: Room for the multipart envelope (boundaries, headers, a CSRF token field) around the file itself.
ENVELOPE_BYTES = 64 * 1024


class CappedUploadHandler(FileUploadHandler):
    """Passes file data on to the next handlers until ``max_bytes`` of one file have arrived, then stops
    the upload (the rest of the body is drained, the file is dropped) and marks the request
    ``upload_too_large``."""

    def __init__(self, request, *, max_bytes: int):
        super().__init__(request)
        self.max_bytes = max_bytes
        self.received = 0

    def new_file(self, *args, **kwargs):
        self.received = 0
        super().new_file(*args, **kwargs)

    def receive_data_chunk(self, raw_data, start):
        self.received += len(raw_data)
        if self.received > self.max_bytes:
            self.request.upload_too_large = True
            raise StopUpload(connection_reset=False)
        return raw_data

    def file_complete(self, file_size):
        return None  # the next handler (memory or temporary file) builds the UploadedFile


@dataclass(frozen=True)
class Upload:
    """A received file: the name the client gave and its bytes."""

    name: str
    data: bytes


def _too_large(max_bytes: int) -> DocumentRejected:
    return DocumentRejected(
        "too_large", f"The file is larger than {max_bytes / (1024 * 1024):.1f} MiB, the limit for files."
    )


def upload_limit(request, *, max_bytes: int) -> None:
    """Refuse a body whose ``Content-Length`` is over ``max_bytes`` (plus the multipart envelope) before
    reading it, and cap what is read of each file. Call before anything reads ``request.POST``/``FILES``.
    Raises :class:`DocumentRejected` ``too_large``."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > max_bytes + ENVELOPE_BYTES:
        raise _too_large(max_bytes)
    request.upload_handlers.insert(0, CappedUploadHandler(request, max_bytes=max_bytes))


def upload_take(request, *, field: str = "file", max_bytes: int) -> Upload:
    """The single file in multipart field ``field`` (after :func:`upload_limit`). Raises
    :class:`DocumentRejected` (``too_large``, ``empty`` when no file was sent, ``too_many_files``)."""
    files = request.FILES.getlist(field)
    if getattr(request, "upload_too_large", False):
        raise _too_large(max_bytes)
    if not files:
        raise DocumentRejected("empty", f"No file was sent (multipart field '{field}').")
    if len(files) > 1:
        raise DocumentRejected("too_many_files", "Send one file per request.")
    uploaded = files[0]
    try:
        data = uploaded.read()
    finally:
        uploaded.close()
    if len(data) > max_bytes:  # a handler list without the cap (defence in depth)
        raise _too_large(max_bytes)
    return Upload(name=uploaded.name or "", data=data)


#: HTTP status of each refusal code (anything else: 400).
STATUS_BY_CODE = {"too_large": 413, "unsupported_type": 415, "too_many_documents": 409}


def status_for(rejected: DocumentRejected) -> int:
    """The HTTP status that answers ``rejected``."""
    return STATUS_BY_CODE.get(rejected.code, 400)
