"""Processing an uploaded file in the embeddings worker: extract its text, chunk it with overlap, embed the
chunks, and index them (memory's chunk store and vector store), with progress for the page.

Nothing half-indexed is ever visible: the embedding runs first, outside any transaction, and then the chunks,
their vectors and the document's ``ready`` state are written in one transaction. A file that fails (cannot
be read, has no text, has too much text, an internal error) ends ``failed`` with its reason, no chunk, and no
stored bytes. A worker that dies mid-way leaves the document ``processing`` and its task unacknowledged, so
the broker hands it to another worker (``acks_late``), which starts over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from documents import parsing
from documents.models import Document
from documents.parsing import DocumentRejected, Section
from documents.progress import publish_document
from documents.services import documents_limits
from documents.signals import stored_file_delete
from memory.chunking import TextPiece, chunk_text
from memory.models import Chunk
from memory.services import chunks_create, chunks_embed

logger = logging.getLogger(__name__)

#: Seconds between two progress writes/frames of one file (the last step of each stage is always sent).
PROGRESS_INTERVAL_S = 0.25
#: Chunks per embedding request: the progress bar moves once per request; the worker's batcher still
#: fills its model calls from every waiting request.
EMBED_STEP = 32

Encode = Callable[[list[str]], np.ndarray]


class _Progress:
    """Writes ``stage``/``progress_*`` and sends the ``document`` frame, at most every
    ``PROGRESS_INTERVAL_S`` (always at a stage's first and last step)."""

    def __init__(self, document: Document):
        self.document = document
        self.last = 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        d = self.document
        if stage == d.stage and 0 < done < total and now - self.last < PROGRESS_INTERVAL_S:
            return
        self.last = now
        d.stage, d.progress_done, d.progress_total = stage, done, total
        if Document.objects.filter(pk=d.pk, status=Document.Status.PROCESSING).update(
            stage=stage, progress_done=done, progress_total=total, updated_at=timezone.now()
        ):
            publish_document(document=d, on_commit=False)


def pieces_of(sections: list[Section]) -> tuple[list[TextPiece], list[dict]]:
    """Chunks of every section (memory's token-window chunker, ``DOCUMENTS_CHUNK_TOKENS`` with
    ``DOCUMENTS_CHUNK_OVERLAP_TOKENS`` overlap) and their metas (``{"page": n}`` for PDF pages): a chunk
    never spans two pages, so each citation names one."""
    pieces: list[TextPiece] = []
    metas: list[dict] = []
    for section in sections:
        for piece in chunk_text(
            section.text,
            max_tokens=settings.DOCUMENTS_CHUNK_TOKENS,
            overlap_tokens=settings.DOCUMENTS_CHUNK_OVERLAP_TOKENS,
        ):
            pieces.append(piece)
            metas.append({"page": section.page} if section.page is not None else {})
    return pieces, metas


def document_process(*, document_id: int, encode: Encode) -> str:
    """Extract, chunk, embed (``encode``: list[str] -> float32 ``(n, 384)``) and index one ``processing``
    document. Returns its final status, or ``"skipped"`` when it is not processing (deleted meanwhile, or a
    redelivered task of a finished one)."""
    document = Document.objects.filter(pk=document_id, status=Document.Status.PROCESSING).first()
    if document is None:
        return "skipped"
    started = time.monotonic()
    progress = _Progress(document)
    try:
        with document.file.open("rb") as handle:
            data = handle.read()
        pages = document.pages or 1
        progress("extracting", 0, pages)
        sections = parsing.extract(
            data,
            kind=document.kind,
            limits=documents_limits(),
            on_page=lambda done, total: progress("extracting", done, total),
        )
        progress("extracting", pages, pages)
        pieces, metas = pieces_of(sections)
        if not pieces:
            raise DocumentRejected("empty", "The file has no text.")
        progress("embedding", 0, len(pieces))
        parts = []
        for start in range(0, len(pieces), EMBED_STEP):
            batch = [p.text for p in pieces[start : start + EMBED_STEP]]
            parts.append(np.asarray(encode(batch), dtype=np.float32))
            progress("embedding", min(start + EMBED_STEP, len(pieces)), len(pieces))
        vectors = np.concatenate(parts)
        return _index(document, pieces, metas, vectors, started)
    except DocumentRejected as exc:
        return _fail(document, str(exc))
    except Exception:
        logger.exception("processing document %s failed", document_id)
        return _fail(
            document, "The file could not be processed because of an internal error; remove it and try again."
        )


def _locked(document: Document) -> Document | None:
    return (
        Document.objects.select_for_update().filter(pk=document.pk, status=Document.Status.PROCESSING).first()
    )


def _index(document: Document, pieces, metas, vectors: np.ndarray, started: float) -> str:
    with transaction.atomic():
        locked = _locked(document)
        if locked is None:  # deleted (or failed) while it was being processed: index nothing
            return "skipped"
        chunks = chunks_create(
            user_id=locked.owner_id,
            source_kind=Chunk.Source.DOCUMENT,
            source_id=locked.pk,
            pieces=pieces,
            conversation_id=locked.conversation_id,
            metas=metas,
            embed=False,
        )
        # The vectors were computed above in chunk order; chunks_embed stores them (both store backends).
        by_pk = {c.pk: i for i, c in enumerate(chunks)}
        stored = chunks_embed(
            chunk_ids=list(by_pk),
            encode=lambda _texts: vectors[[by_pk[pk] for pk in sorted(by_pk)]],
        )
        if stored != len(chunks):
            raise RuntimeError(f"stored {stored} of {len(chunks)} chunk vectors")
        locked.status = Document.Status.READY
        locked.stage = ""
        locked.chunk_count = len(chunks)
        locked.progress_done = locked.progress_total = len(chunks)
        locked.process_ms = int((time.monotonic() - started) * 1000)
        locked.error = ""
        locked.save(
            update_fields=[
                "status",
                "stage",
                "chunk_count",
                "progress_done",
                "progress_total",
                "process_ms",
                "error",
                "updated_at",
            ]
        )
        publish_document(document=locked)
    return locked.status


def _fail(document: Document, error: str) -> str:
    with transaction.atomic():
        locked = _locked(document)
        if locked is None:
            return "skipped"
        name = locked.file.name
        locked.status = Document.Status.FAILED
        locked.stage = ""
        locked.error = error
        locked.file = ""
        locked.save(update_fields=["status", "stage", "error", "file", "updated_at"])
        # Nothing was indexed (that happens only with ``ready``, in one transaction); drop the bytes too.
        transaction.on_commit(lambda: stored_file_delete(name))
        publish_document(document=locked)
    return Document.Status.FAILED
