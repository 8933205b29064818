"""Reads of documents, their chunks and the citations of replies. Every read by a person goes through a
``*_get_for_user`` function, which refuses other users' rows (404, indistinguishable from a missing one)."""

from __future__ import annotations

from collections import defaultdict

from django.http import Http404

from documents.models import Document

MAX_PK = 2**63 - 1


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
