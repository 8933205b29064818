"""The vector store interface both backends implement, and what they share.

A store keeps the vectors of :class:`memory.models.Chunk` rows and answers top-k cosine searches over ONE
user's rows: ``user_id`` is a required argument of every search, so no query can reach another user's
chunks. The float16 bytes in ``memory_chunk.embedding`` are the source of truth; a backend may keep an index
beside them (pgvector's table) and rebuild it from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from memory.embedding import DIMENSIONS

#: Stored vector element type: float16 halves the bytes of float32 with no measurable loss in cosine
#: ranking for unit vectors of this size (|error| < 1e-3 per similarity).
STORED_DTYPE = np.dtype("<f2")


@dataclass(frozen=True)
class Hit:
    """A search result: the chunk's pk and its cosine similarity to the query (-1..1, higher is closer)."""

    chunk_id: int
    score: float


@dataclass(frozen=True)
class SearchFilter:
    """Which of the user's chunks a search may return (all of them by default).

    ``source_kinds``: only these kinds; ``conversation_id``: only chunks of this conversation;
    ``exclude_message_ids``: never these messages' chunks (the turns already inside the sliding window);
    ``source``: only the chunks of this ``(kind, id)`` source (one document)."""

    source_kinds: tuple[str, ...] = ()
    conversation_id: int | None = None
    exclude_message_ids: tuple[int, ...] = ()
    exclude_conversation_ids: tuple[int, ...] = ()
    source: tuple[str, int] | None = None
    sources: tuple[tuple[str, int], ...] = field(default=())

    def where(self, alias: str = "c") -> tuple[str, list]:
        """SQL conditions on ``memory_chunk`` (as ``alias``) and their parameters, "" when none."""
        parts: list[str] = []
        params: list = []
        if self.source_kinds:
            parts.append(f"{alias}.source_kind = ANY(%s)")
            params.append(list(self.source_kinds))
        if self.conversation_id is not None:
            parts.append(f"{alias}.conversation_id = %s")
            params.append(self.conversation_id)
        if self.exclude_message_ids:
            parts.append(f"({alias}.message_id IS NULL OR NOT ({alias}.message_id = ANY(%s)))")
            params.append(list(self.exclude_message_ids))
        if self.exclude_conversation_ids:
            parts.append(f"({alias}.conversation_id IS NULL OR NOT ({alias}.conversation_id = ANY(%s)))")
            params.append(list(self.exclude_conversation_ids))
        wanted = list(self.sources) + ([self.source] if self.source else [])
        if wanted:
            parts.append(
                "("
                + " OR ".join(f"({alias}.source_kind = %s AND {alias}.source_id = %s)" for _ in wanted)
                + ")"
            )
            for kind, source_id in wanted:
                params.extend([kind, source_id])
        return (" AND ".join(parts), params)


#: The default filter: every chunk of the user.
NO_FILTER = SearchFilter()


class VectorStore(Protocol):
    """What the rest of memory uses. ``name``: "pgvector" or "exact" (shown by /readyz and ``fleet``)."""

    name: str
    using: str

    def add(self, *, rows: Sequence[tuple[int, int, np.ndarray]]) -> None:
        """Store vectors for existing chunk rows: ``(chunk_id, user_id, vector float32 (384,))`` each."""

    def search(
        self,
        *,
        user_id: int,
        vector: np.ndarray,
        k: int,
        min_score: float = -1.0,
        flt: SearchFilter = NO_FILTER,
    ) -> list[Hit]:
        """Up to ``k`` of ``user_id``'s embedded chunks with cosine similarity >= ``min_score``, best first."""

    def size(self, *, user_id: int | None = None) -> int:
        """Vectors held (one user's, or all)."""


def to_stored(vector: np.ndarray) -> bytes:
    """float32 (384,) -> the stored float16 bytes. Raises ``ValueError`` on a wrong shape."""
    vector = np.asarray(vector, dtype=np.float32)
    if vector.shape != (DIMENSIONS,):
        raise ValueError(f"expected a ({DIMENSIONS},) vector, got {vector.shape}")
    return vector.astype(STORED_DTYPE).tobytes()


def from_stored(blobs: Sequence[bytes | memoryview]) -> np.ndarray:
    """Stored float16 bytes of n chunks -> float32 matrix ``(n, 384)``."""
    if not blobs:
        return np.zeros((0, DIMENSIONS), dtype=np.float32)
    joined = b"".join(blobs)
    return np.frombuffer(joined, dtype=STORED_DTYPE).reshape(-1, DIMENSIONS).astype(np.float32)


def top_k(ids: np.ndarray, scores: np.ndarray, *, k: int, min_score: float) -> list[Hit]:
    """The ``k`` best of ``scores`` (aligned with ``ids``) at or above ``min_score``, best first."""
    if k <= 0 or scores.size == 0:
        return []
    if scores.size > k:
        keep = np.argpartition(-scores, k - 1)[:k]
    else:
        keep = np.arange(scores.size)
    keep = keep[np.argsort(-scores[keep], kind="stable")]
    return [Hit(int(ids[i]), float(scores[i])) for i in keep if scores[i] >= min_score]
