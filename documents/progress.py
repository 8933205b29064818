"""The ``document`` frame: a document's state, sent to every open tab of its owner (the user's channel-layer
group) when it is added, moves through processing, ends ready or failed, or is deleted."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from documents.models import Document
from events import broadcast

logger = logging.getLogger(__name__)


def document_dict(document: Document) -> dict[str, Any]:
    """The public shape of a document (page, API, frames). ``progress`` is 0..1 over the current stage."""
    total = document.progress_total
    return {
        "id": document.id,
        "conversation_id": document.conversation_id,
        "name": document.name,
        "kind": document.kind,
        "content_type": document.content_type,
        "size_bytes": document.size_bytes,
        "pages": document.pages,
        "status": document.status,
        "stage": document.stage if document.status == Document.Status.PROCESSING else "",
        "progress_done": document.progress_done,
        "progress_total": total,
        "progress": round(document.progress_done / total, 3) if total else 0.0,
        "chunk_count": document.chunk_count,
        "error": document.error,
        "created_at": document.created_at.isoformat() if document.created_at else None,
    }


def frame_document(*, document: Document, deleted: bool = False) -> dict[str, Any]:
    """``document``: ``{"type": "document", "deleted": bool, "document": document_dict}``."""
    return {"type": "document", "deleted": deleted, "document": document_dict(document)}


def publish_document(*, document: Document, deleted: bool = False, on_commit: bool = True) -> None:
    """Send the document's frame to its owner's tabs (after commit by default). A Redis outage is logged by
    the publisher, not raised: the page re-reads the list on reload."""
    publish_frame(
        owner_id=document.owner_id,
        frame=frame_document(document=document, deleted=deleted),
        on_commit=on_commit,
    )


def publish_frame(*, owner_id: int, frame: dict[str, Any], on_commit: bool = True) -> None:
    """Send ``frame`` to the tabs of user ``owner_id`` (after commit by default)."""
    if on_commit:
        transaction.on_commit(lambda: _send(owner_id, frame), robust=True)
    else:
        _send(owner_id, frame)


def _send(owner_id: int, frame: dict[str, Any]) -> None:
    try:
        broadcast.publish_to_user(owner_id, frame)
    except Exception:  # Redis down: the stored state is what counts
        logger.warning("could not send a document frame to user %s", owner_id, exc_info=True)
