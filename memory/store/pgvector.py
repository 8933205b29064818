"""pgvector: an HNSW index (cosine distance) in PostgreSQL, where the server has the ``vector`` extension.

The vectors are kept in their own table, ``memory_chunkvector`` (created by :func:`install`, from the
migration or ``manage.py memory_store --install``), keyed by the chunk's pk with ``ON DELETE CASCADE``, so
deleting a chunk (or its conversation, message or user) deletes its vector too. ``user_id`` is repeated
there so a search filters on it before joining. Since pgvector 0.8 an HNSW scan with a filter goes on
until it has ``k`` rows that pass (``hnsw.iterative_scan``); older releases may return fewer.

Index and extension: https://github.com/pgvector/pgvector (HNSW: Malkov & Yashunin, 2018).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from django.conf import settings
from django.db import connections, transaction
from pgvector import Vector

from memory.embedding import DIMENSIONS
from memory.store.base import NO_FILTER, Hit, SearchFilter

logger = logging.getLogger(__name__)

TABLE = "memory_chunkvector"
# m / ef_construction: pgvector's defaults. ef_search (MEMORY_HNSW_EF_SEARCH, 100; pgvector's default is 40)
# trades latency for recall: see docs/memory.md for both at 1k-100k chunks.
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64


def extension_version(connection) -> str | None:
    """Installed ``vector`` extension version in this database, or None."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cursor.fetchone()
    return row[0] if row else None


def is_installed(connection) -> bool:
    """True when the extension and ``memory_chunkvector`` both exist."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [TABLE])
        has_table = cursor.fetchone()[0]
    return bool(has_table) and extension_version(connection) is not None


def install(connection) -> bool:
    """Create the extension (where the server offers it and we may), the vector table and its HNSW index,
    and copy in the vectors already stored. Returns False, changing nothing, where the server has no
    ``vector`` extension or refuses to create it (e.g. no privilege)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        if cursor.fetchone() is None:
            return False
    try:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS vector")
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLE} ("
                " chunk_id bigint PRIMARY KEY REFERENCES memory_chunk(id) ON DELETE CASCADE,"
                " user_id bigint NOT NULL,"
                f" embedding vector({DIMENSIONS}) NOT NULL)"
            )
            cursor.execute(f"CREATE INDEX IF NOT EXISTS {TABLE}_user_idx ON {TABLE} (user_id)")
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS {TABLE}_hnsw_idx ON {TABLE} USING hnsw (embedding vector_cosine_ops)"
                f" WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION})"
            )
    except Exception as exc:  # noqa: BLE001 - any refusal leaves the exact store in charge
        logger.warning("pgvector not installed: %s", exc)
        return False
    # The float16 bytes are the source of truth: index the vectors stored before the extension was there.
    backfill(connection)
    return True


def backfill(connection, *, batch: int = 2000) -> int:
    """Index every embedded chunk that has no vector row yet; returns how many were added."""
    from memory.store.base import from_stored

    added = 0
    store = PgVectorStore(connection.alias)
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT c.id, c.user_id, c.embedding FROM memory_chunk c LEFT JOIN {TABLE} v ON v.chunk_id = c.id"
                " WHERE c.embedding IS NOT NULL AND v.chunk_id IS NULL ORDER BY c.id LIMIT %s",
                [batch],
            )
            rows = cursor.fetchall()
        if not rows:
            return added
        vectors = from_stored([row[2] for row in rows])
        store.add_index_rows([(row[0], row[1], vectors[i]) for i, row in enumerate(rows)])
        added += len(rows)


class PgVectorStore:
    """The pgvector backend: vectors in ``memory_chunk.embedding`` (float16, the source of truth) and in
    ``memory_chunkvector`` (``vector(384)``, HNSW-indexed)."""

    name = "pgvector"

    def __init__(self, using: str = "default"):
        self.using = using
        self._iterative: bool | None = None

    def add(self, *, rows: Sequence[tuple[int, int, np.ndarray]]) -> None:
        from memory.store.exact import ExactStore

        if not rows:
            return
        with transaction.atomic(using=self.using):
            ExactStore(self.using).add(rows=rows)
            self.add_index_rows(rows)

    def add_index_rows(self, rows: Sequence[tuple[int, int, np.ndarray]]) -> None:
        with connections[self.using].cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {TABLE} (chunk_id, user_id, embedding) VALUES (%s, %s, %s::vector)"
                " ON CONFLICT (chunk_id) DO UPDATE SET embedding = EXCLUDED.embedding",
                [(chunk_id, user_id, _text(vector)) for chunk_id, user_id, vector in rows],
            )

    def _iterative_scan(self) -> bool:
        if self._iterative is None:
            version = extension_version(connections[self.using]) or "0"
            self._iterative = tuple(int(p) for p in version.split(".")[:2]) >= (0, 8)
        return self._iterative

    def search(
        self,
        *,
        user_id: int,
        vector: np.ndarray,
        k: int,
        min_score: float = -1.0,
        flt: SearchFilter = NO_FILTER,
    ) -> list[Hit]:
        if k <= 0:
            return []
        where, params = flt.where("c")
        query = _text(vector)
        sql = (
            f"SELECT v.chunk_id, 1 - (v.embedding <=> %s::vector) FROM {TABLE} v"
            " JOIN memory_chunk c ON c.id = v.chunk_id WHERE v.user_id = %s"
            + (" AND " + where if where else "")
            + " ORDER BY v.embedding <=> %s::vector LIMIT %s"
        )
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            # SET LOCAL: these last for this transaction only, never leak to a pooled connection.
            cursor.execute(f"SET LOCAL hnsw.ef_search = {max(int(settings.MEMORY_HNSW_EF_SEARCH), k)}")
            if self._iterative_scan():
                cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            cursor.execute(sql, [query, user_id, *params, query, k])
            rows = cursor.fetchall()
        # relaxed_order may return rows slightly out of order: sort them again.
        hits = sorted((Hit(int(cid), float(score)) for cid, score in rows), key=lambda h: -h.score)
        return [hit for hit in hits if hit.score >= min_score]

    def size(self, *, user_id: int | None = None) -> int:
        sql = f"SELECT count(*) FROM {TABLE}"
        params: list = []
        if user_id is not None:
            sql += " WHERE user_id = %s"
            params.append(user_id)
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.fetchone()[0])


def _text(vector: np.ndarray) -> str:
    """pgvector's text form of a vector ('[0.1,0.2,...]'), through the pgvector package."""
    return Vector(np.asarray(vector, dtype=np.float32)).to_text()
