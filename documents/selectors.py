"""Reads of documents, their chunks and the citations of replies. Every read by a person goes through a
``*_get_for_user`` function, which refuses other users' rows (404, indistinguishable from a missing one)."""

from __future__ import annotations

from collections import defaultdict

from django.http import Http404

from documents.models import Citation, Document
from memory.models import Chunk

MAX_PK = 2**63 - 1
#: Characters of a passage shown on a citation chip's hover title (the chip opens the whole passage).
EXCERPT_CHARS = 160


class DocumentNotFound(Http404):
    """The document (or chunk) does not exist or belongs to someone else."""


def _pk(value) -> int:
    pk = int(value)
    if not 1 <= pk <= MAX_PK:
        raise ValueError("id out of range")
    return pk


def document_get_for_user(*, user, document_id) -> Document:
    """The document with this id if ``user`` owns it. Raises :class:`DocumentNotFound` otherwise (also for an
    anonymous user or a malformed id)."""
    if user is None or not user.is_authenticated:
        raise DocumentNotFound("document not found")
    try:
        return Document.objects.get(pk=_pk(document_id), owner=user)
    except (Document.DoesNotExist, TypeError, ValueError) as exc:
        raise DocumentNotFound("document not found") from exc


def passage_get_for_user(*, user, chunk_id) -> dict:
    """A passage of one of ``user``'s documents: ``{"chunk_id", "document_id", "name", "page", "ordinal",
    "text"}``. Raises :class:`DocumentNotFound` for a missing id, another user's chunk, or a chunk that is
    not a document's (a recalled turn)."""
    if user is None or not user.is_authenticated:
        raise DocumentNotFound("passage not found")
    try:
        chunk = Chunk.objects.get(pk=_pk(chunk_id), user=user, source_kind=Chunk.Source.DOCUMENT)
        document = Document.objects.get(pk=chunk.source_id, owner=user)
    except (Chunk.DoesNotExist, Document.DoesNotExist, TypeError, ValueError) as exc:
        raise DocumentNotFound("passage not found") from exc
    return {
        "chunk_id": chunk.pk,
        "document_id": document.pk,
        "name": document.name,
        "page": _page(chunk),
        "ordinal": chunk.ordinal,
        "text": chunk.text,
    }


def _page(chunk: Chunk) -> int | None:
    return chunk.meta.get("page") if isinstance(chunk.meta, dict) else None


def document_list(*, conversation_id: int) -> list[Document]:
    """The documents of a conversation (the caller has checked access), oldest first."""
    return list(Document.objects.filter(conversation_id=conversation_id).order_by("created_at", "id"))


def document_count(*, conversation_id: int) -> int:
    """Documents of a conversation that count against the per-conversation limit (failed ones do not)."""
    return (
        Document.objects.filter(conversation_id=conversation_id)
        .exclude(status=Document.Status.FAILED)
        .count()
    )


def citations_for_messages(*, message_ids) -> dict[int, list[dict]]:
    """``{message id: [citation, ...]}`` in marker order, for those of ``message_ids`` that cite passages.
    A citation: ``{"marker", "chunk_id", "document_id", "name", "page", "excerpt", "score"}``."""
    rows = list(
        Citation.objects.filter(message_id__in=list(message_ids))
        .select_related("chunk")
        .order_by("message_id", "marker")
    )
    names = dict(Document.objects.filter(pk__in={c.chunk.source_id for c in rows}).values_list("pk", "name"))
    out: dict[int, list[dict]] = defaultdict(list)
    for citation in rows:
        chunk = citation.chunk
        text = chunk.text
        out[citation.message_id].append(
            {
                "marker": citation.marker,
                "chunk_id": chunk.pk,
                "document_id": chunk.source_id,
                "name": names.get(chunk.source_id, "a removed file"),
                "page": _page(chunk),
                "excerpt": text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1].rstrip() + "…",
                "score": round(citation.score, 3),
            }
        )
    return dict(out)


def document_names_for_conversations(*, conversation_ids) -> dict[int, list[dict]]:
    """``{conversation id: [{"name", "kind", "size_bytes", "pages", "status", "created_at"}]}`` for exports
    (file names and facts, not their text)."""
    out: dict[int, list[dict]] = defaultdict(list)
    rows = Document.objects.filter(conversation_id__in=list(conversation_ids)).order_by("created_at", "id")
    for d in rows:
        out[d.conversation_id].append(
            {
                "name": d.name,
                "kind": d.kind,
                "size_bytes": d.size_bytes,
                "pages": d.pages,
                "status": d.status,
                "created_at": d.created_at.isoformat(),
            }
        )
    return dict(out)
