"""Exact scan on stock PostgreSQL: read one user's float16 vectors, score them with numpy.

Every search is exact (no recall loss) and touches only rows with ``user_id = %s`` (through the
``memchunk_user_kind_idx`` index), so its cost grows with that user's chunks, not with the whole table:
~768 bytes a chunk are read per search. Figures in docs/memory.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from django.db import connections

from memory.store.base import NO_FILTER, Hit, SearchFilter, from_stored, to_stored, top_k


class ExactStore:
    """The fallback backend: vectors live only in ``memory_chunk.embedding``."""

    name = "exact"

    def __init__(self, using: str = "default"):
        self.using = using

    def add(self, *, rows: Sequence[tuple[int, int, np.ndarray]]) -> None:
        if not rows:
            return
        with connections[self.using].cursor() as cursor:
            cursor.executemany(
                "UPDATE memory_chunk SET embedding = %s WHERE id = %s",
                [(to_stored(vector), chunk_id) for chunk_id, _user_id, vector in rows],
            )

    def search(
        self,
        *,
        user_id: int,
        vector: np.ndarray,
        k: int,
        min_score: float = -1.0,
        flt: SearchFilter = NO_FILTER,
    ) -> list[Hit]:
        where, params = flt.where("c")
        sql = "SELECT c.id, c.embedding FROM memory_chunk c WHERE c.user_id = %s AND c.embedding IS NOT NULL"
        if where:
            sql += " AND " + where
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, [user_id, *params])
            rows = cursor.fetchall()
        if not rows:
            return []
        ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
        matrix = from_stored([row[1] for row in rows])
        scores = matrix @ np.asarray(vector, dtype=np.float32)
        return top_k(ids, scores, k=k, min_score=min_score)

    def size(self, *, user_id: int | None = None) -> int:
        sql = "SELECT count(*) FROM memory_chunk WHERE embedding IS NOT NULL"
        params: list = []
        if user_id is not None:
            sql += " AND user_id = %s"
            params.append(user_id)
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.fetchone()[0])
