"""Writes of documents in the web process: adding a file to a conversation, deleting it. Keyword-only
``<entity>_<verb>`` functions.

A file is checked before anything is stored (:func:`document_add`); its text is then extracted, chunked and
embedded by an embeddings worker (``documents.processing.document_process``, the ``documents.process`` task),
which writes every chunk and vector in one transaction with the ``ready`` state.
"""

from __future__ import annotations

import hashlib
import logging
import unicodedata
from pathlib import PurePosixPath, PureWindowsPath

from celery import current_app
from django.conf import settings
from django.core.files.base import ContentFile
from django.db import transaction

from documents import parsing
from documents.models import Document
from documents.parsing import DocumentRejected, Limits
from documents.progress import frame_document, publish_document, publish_frame
from documents.selectors import document_count
from documents.signals import stored_file_delete
from memory.models import Chunk
from memory.services import chunks_delete_for_source

logger = logging.getLogger(__name__)

PROCESS_TASK = "documents.process"
NAME_MAX_CHARS = 255


def documents_limits() -> Limits:
    """The upload limits from settings (``DOCUMENTS_MAX_*``)."""
    return Limits(
        max_bytes=settings.DOCUMENTS_MAX_BYTES,
        max_pages=settings.DOCUMENTS_MAX_PAGES,
        max_uncompressed_bytes=settings.DOCUMENTS_MAX_UNCOMPRESSED_BYTES,
        max_text_chars=settings.DOCUMENTS_MAX_TEXT_CHARS,
    )


def clean_name(name: str) -> str:
    """The file's own name for display: the last path component (a client may send a path), control
    characters dropped, at most 255 characters; "document" when nothing is left."""
    base = PureWindowsPath(PurePosixPath(name or "").name).name
    base = "".join(c for c in base if unicodedata.category(c)[0] != "C").strip()
    if len(base) > NAME_MAX_CHARS:
        stem, dot, suffix = base.rpartition(".")
        base = (
            (stem[: NAME_MAX_CHARS - len(suffix) - 2] + "…" + dot + suffix)
            if dot and len(suffix) < 16
            else base[:NAME_MAX_CHARS]
        )
    return base or "document"


def document_add(*, user, conversation, name: str, data: bytes) -> Document:
    """Check ``data`` (size, type by content, PDF pages; ``parsing.inspect``), store it through the
    documents storage, record it ``processing`` and queue its processing after commit. ``conversation``
    must be one of ``user``'s (the caller reached it through the conversation access function).

    Raises :class:`~documents.parsing.DocumentRejected` (``too_many_documents`` past
    ``DOCUMENTS_MAX_PER_CONVERSATION``, or any code of ``inspect``); nothing is stored then.
    """
    if conversation.owner_id != user.pk:
        raise ValueError("the conversation is not this user's")
    name = clean_name(name)
    if document_count(conversation_id=conversation.id) >= settings.DOCUMENTS_MAX_PER_CONVERSATION:
        raise DocumentRejected(
            "too_many_documents",
            f"This conversation already has {settings.DOCUMENTS_MAX_PER_CONVERSATION} files, the limit; "
            "delete one first or start a new chat.",
        )
    found = parsing.inspect(data, name=name, limits=documents_limits())
    document = Document(
        owner=user,
        conversation=conversation,
        name=name,
        kind=found.kind,
        content_type=found.content_type,
        size_bytes=len(data),
        pages=found.pages,
        sha256=hashlib.sha256(data).hexdigest(),
        status=Document.Status.PROCESSING,
        stage="queued",
    )
    document.file.save(name, ContentFile(data), save=False)  # the storage picks the path (document_path)
    try:
        with transaction.atomic():
            document.save()
            queue = settings.DOCUMENTS_TASK_QUEUE
            transaction.on_commit(
                lambda: current_app.send_task(PROCESS_TASK, args=[document.id], queue=queue)
            )
            publish_document(document=document)
    except BaseException:
        stored_file_delete(document.file.name)
        raise
    return document


def document_delete(*, document: Document) -> None:
    """Delete a document, its chunks (memory's), their vectors and citations, and (after commit) its stored
    file."""
    frame = frame_document(document=document, deleted=True)  # before the delete clears the pk
    with transaction.atomic():
        chunks_delete_for_source(source_kind=Chunk.Source.DOCUMENT, source_id=document.pk)
        document.delete()
        publish_frame(owner_id=document.owner_id, frame=frame)
