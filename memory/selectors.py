"""Reads of memory: switches, key facts, searches and what each reply recalled. Every read of chunks takes
the user's id and filters on it, in the store and again when rows are loaded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from django.conf import settings

from memory.models import AccountMemory, Chunk, ConversationMemory, Memory, Recall
from memory.store import Hit, SearchFilter, store_for
from memory.store.base import NO_FILTER


def memory_enabled_for(*, user_id: int, conversation_id: int | None = None) -> bool:
    """True unless memory is off site-wide (``MEMORY_ENABLED``), for the account, or for the conversation."""
    if not settings.MEMORY_ENABLED:
        return False
    if AccountMemory.objects.filter(user_id=user_id, enabled=False).exists():
        return False
    if conversation_id is not None:
        return not ConversationMemory.objects.filter(conversation_id=conversation_id, enabled=False).exists()
    return True


def account_memory_enabled(*, user_id: int) -> bool:
    return not AccountMemory.objects.filter(user_id=user_id, enabled=False).exists()


def conversation_memory_enabled(*, conversation_id: int) -> bool:
    return not ConversationMemory.objects.filter(conversation_id=conversation_id, enabled=False).exists()


def memories_for_user(*, user_id: int) -> list[Memory]:
    """The user's key facts, newest first."""
    return list(Memory.objects.filter(user_id=user_id))


@dataclass(frozen=True)
class FoundChunk:
    """A search result with its row: ``score`` is the cosine similarity to the question."""

    chunk: Chunk
    score: float


def chunks_search(
    *,
    user_id: int,
    vector: np.ndarray,
    k: int,
    min_score: float = -1.0,
    flt: SearchFilter = NO_FILTER,
    using: str = "default",
) -> list[FoundChunk]:
    """Top ``k`` of ``user_id``'s chunks by cosine similarity to ``vector`` (float32 (384,), unit length),
    at least ``min_score``, best first, with their rows (and conversations) loaded."""
    hits = store_for(using).search(user_id=user_id, vector=vector, k=k, min_score=min_score, flt=flt)
    return chunks_for_hits(user_id=user_id, hits=hits, using=using)


def chunks_for_hits(*, user_id: int, hits: Sequence[Hit], using: str = "default") -> list[FoundChunk]:
    rows = (
        Chunk.objects.using(using)
        .select_related("conversation")
        .filter(user_id=user_id, pk__in=[h.chunk_id for h in hits])
    )
    by_id = {c.pk: c for c in rows}
    return [FoundChunk(by_id[h.chunk_id], h.score) for h in hits if h.chunk_id in by_id]


def chunks_for_source(*, user_id: int, source_kind: str, source_id: int) -> list[Chunk]:
    """One source's chunks in order (e.g. a document's passages)."""
    return list(
        Chunk.objects.filter(user_id=user_id, source_kind=source_kind, source_id=source_id).order_by(
            "ordinal"
        )
    )


def chunks_pending(*, limit: int | None = None) -> list[int]:
    """Ids of chunks not embedded yet (oldest first)."""
    qs = Chunk.objects.filter(embedding__isnull=True).order_by("pk").values_list("pk", flat=True)
    return list(qs[:limit] if limit else qs)


@dataclass(frozen=True)
class RecalledView:
    """What the page shows under a reply: one recalled chunk and where it came from."""

    chunk_id: int
    text: str
    score: float
    conversation_id: int | None
    conversation_title: str


def recalls_for_replies(*, user_id: int, reply_ids: Sequence[int]) -> dict[int, list[RecalledView]]:
    """{reply id: [recalled chunk, ...] in rank order} for the user's own replies."""
    result: dict[int, list[RecalledView]] = {}
    recalls = (
        Recall.objects.filter(reply_id__in=list(reply_ids), chunk__user_id=user_id)
        .select_related("chunk__conversation")
        .order_by("reply_id", "rank")
    )
    for r in recalls:
        conv = r.chunk.conversation
        result.setdefault(r.reply_id, []).append(
            RecalledView(
                chunk_id=r.chunk_id,
                text=r.chunk.text,
                score=r.score,
                conversation_id=conv.pk if conv else None,
                conversation_title=(conv.title or f"Conversation {conv.pk}") if conv else "",
            )
        )
    return result


def memory_export(*, user_id: int) -> dict:
    """The user's memory for their data export: key facts and switches (vectors are derived data and are
    rebuilt from the conversations, so they are not exported)."""
    return {
        "enabled": account_memory_enabled(user_id=user_id),
        "memories": [
            {"text": m.text, "created_at": m.created_at.isoformat(), "updated_at": m.updated_at.isoformat()}
            for m in memories_for_user(user_id=user_id)
        ],
    }


def store_status(*, using: str = "default") -> dict:
    """For /readyz and ``manage.py fleet``: the vector backend and its size, and chunks awaiting embedding."""
    store = store_for(using)
    return {
        "backend": store.name,
        "vectors": store.size(),
        "pending": Chunk.objects.using(using).filter(embedding__isnull=True).count(),
    }
