"""Exact scan on stock PostgreSQL: one user's float16 vectors scored with numpy.

Every search is exact (no recall loss) and touches only rows with ``user_id = %s``, so its cost grows with
that user's chunks, not with the whole table. Reading ~768 bytes per chunk on every search costs ~15 ms per
10k chunks, so each process keeps the float32 matrix of its most recent users (LRU, at most
``MEMORY_EXACT_CACHE_MB``) with the chunks' filter columns, and checks it on every search against the
database with one index-only query: the count, largest id and sum of ids of the user's embedded chunks.
Unchanged, the cached matrix is used (scored on one BLAS thread, see
:func:`_one_blas_thread`); grown by new chunks only, just those are read; otherwise it is read
again whole (one ``array_agg``/``string_agg`` row, not one Python row per chunk). The hits are loaded from
the database afterwards (``selectors.chunks_for_hits``), so a chunk deleted meanwhile is never returned.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import connections
from threadpoolctl import ThreadpoolController

from memory.embedding import DIMENSIONS
from memory.store.base import NO_FILTER, STORED_DTYPE, Hit, SearchFilter, to_stored, top_k

_KINDS = {"turn": 0, "document": 1}

_blas: ThreadpoolController | None = None


def _one_blas_thread():
    """A context in which numpy's BLAS uses one thread. A 10k x 384 matrix-vector product takes ~0.2 ms on
    one thread but ~28 ms with OpenBLAS's default of one thread per core on a busy 2-core machine (thread
    hand-offs while the chat engine holds the cores)."""
    global _blas
    if _blas is None:
        _blas = ThreadpoolController()
    return _blas.limit(limits=1, user_api="blas")


@dataclass
class _UserVectors:
    """One user's embedded chunks: ids ascending, with the columns filters need; ``key`` = (count, max id,
    sum of ids) when read."""

    key: tuple[int, int, int]
    ids: np.ndarray  # int64 (n,)
    message_ids: np.ndarray  # int64, -1 for none
    conversation_ids: np.ndarray  # int64, -1 for none
    kinds: np.ndarray  # int8, _KINDS codes
    source_ids: np.ndarray  # int64
    matrix: np.ndarray  # float32 (n, 384)

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes + 33 * len(self.ids)

    def extend(self, other: _UserVectors) -> _UserVectors:
        return _UserVectors(
            key=other.key,
            ids=np.concatenate([self.ids, other.ids]),
            message_ids=np.concatenate([self.message_ids, other.message_ids]),
            conversation_ids=np.concatenate([self.conversation_ids, other.conversation_ids]),
            kinds=np.concatenate([self.kinds, other.kinds]),
            source_ids=np.concatenate([self.source_ids, other.source_ids]),
            matrix=np.concatenate([self.matrix, other.matrix]),
        )

    def mask(self, flt: SearchFilter) -> np.ndarray | None:
        """Rows ``flt`` keeps, or None for all (same meaning as ``SearchFilter.where``)."""
        keep = None

        def narrow(cond):
            nonlocal keep
            keep = cond if keep is None else keep & cond

        if flt.source_kinds:
            narrow(np.isin(self.kinds, [_KINDS.get(k, -1) for k in flt.source_kinds]))
        if flt.conversation_id is not None:
            narrow(self.conversation_ids == flt.conversation_id)
        if flt.exclude_message_ids:
            narrow(~np.isin(self.message_ids, list(flt.exclude_message_ids)))
        if flt.exclude_conversation_ids:
            narrow(~np.isin(self.conversation_ids, list(flt.exclude_conversation_ids)))
        wanted = list(flt.sources) + ([flt.source] if flt.source else [])
        if wanted:
            any_source = np.zeros(len(self.ids), dtype=bool)
            for kind, source_id in wanted:
                any_source |= (self.kinds == _KINDS.get(kind, -1)) & (self.source_ids == source_id)
            narrow(any_source)
        return keep


class ExactStore:
    """The fallback backend: vectors live only in ``memory_chunk.embedding``."""

    name = "exact"

    def __init__(self, using: str = "default"):
        self.using = using
        self._cache: OrderedDict[int, _UserVectors] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, *, rows: Sequence[tuple[int, int, np.ndarray]]) -> None:
        if not rows:
            return
        with connections[self.using].cursor() as cursor:
            cursor.executemany(
                "UPDATE memory_chunk SET embedding = %s WHERE id = %s",
                [(to_stored(vector), chunk_id) for chunk_id, _user_id, vector in rows],
            )

    def _read(self, user_id: int, key: tuple[int, int, int], after_id: int = 0) -> _UserVectors:
        with connections[self.using].cursor() as cursor:
            cursor.execute(
                "SELECT array_agg(id ORDER BY id), array_agg(coalesce(message_id, -1) ORDER BY id),"
                " array_agg(coalesce(conversation_id, -1) ORDER BY id), array_agg(source_kind ORDER BY id),"
                " array_agg(source_id ORDER BY id), string_agg(embedding, ''::bytea ORDER BY id)"
                " FROM memory_chunk WHERE user_id = %s AND embedding IS NOT NULL AND id > %s",
                [user_id, after_id],
            )
            ids, messages, conversations, kinds, sources, blob = cursor.fetchone()
        if not ids:
            empty = np.zeros(0, dtype=np.int64)
            return _UserVectors(
                key, empty, empty, empty, np.zeros(0, np.int8), empty, np.zeros((0, DIMENSIONS), np.float32)
            )
        return _UserVectors(
            key=key,
            ids=np.asarray(ids, dtype=np.int64),
            message_ids=np.asarray(messages, dtype=np.int64),
            conversation_ids=np.asarray(conversations, dtype=np.int64),
            kinds=np.asarray([_KINDS.get(k, -1) for k in kinds], dtype=np.int8),
            source_ids=np.asarray(sources, dtype=np.int64),
            matrix=np.frombuffer(bytes(blob), dtype=STORED_DTYPE).reshape(-1, DIMENSIONS).astype(np.float32),
        )

    def _vectors(self, user_id: int) -> _UserVectors:
        with connections[self.using].cursor() as cursor:
            # Index-only over memchunk_user_embedded_idx.
            cursor.execute(
                "SELECT count(*), coalesce(max(id), 0), coalesce(sum(id), 0) FROM memory_chunk"
                " WHERE user_id = %s AND embedding IS NOT NULL",
                [user_id],
            )
            key = tuple(int(v) for v in cursor.fetchone())
        with self._lock:
            cached = self._cache.get(user_id)
        if cached is not None and cached.key == key:
            found = cached
        elif cached is not None and key[1] > cached.key[1]:
            newer = self._read(user_id, key, after_id=cached.key[1])
            added_sum = int(newer.ids.sum()) if len(newer.ids) else 0
            only_added = (cached.key[0] + len(newer.ids), cached.key[2] + added_sum) == (key[0], key[2])
            found = cached.extend(newer) if only_added else self._read(user_id, key)
        else:
            found = self._read(user_id, key)
        self._remember(user_id, found)
        return found

    def _remember(self, user_id: int, vectors: _UserVectors) -> None:
        limit = settings.MEMORY_EXACT_CACHE_MB * 1024 * 1024
        with self._lock:
            self._cache[user_id] = vectors
            self._cache.move_to_end(user_id)
            total = sum(v.nbytes for v in self._cache.values())
            while total > limit and self._cache:
                _uid, dropped = self._cache.popitem(last=False)
                total -= dropped.nbytes

    def search(
        self,
        *,
        user_id: int,
        vector: np.ndarray,
        k: int,
        min_score: float = -1.0,
        flt: SearchFilter = NO_FILTER,
    ) -> list[Hit]:
        vectors = self._vectors(user_id)
        if not len(vectors.ids):
            return []
        with _one_blas_thread():
            scores = vectors.matrix @ np.asarray(vector, dtype=np.float32)
        keep = vectors.mask(flt)
        ids = vectors.ids
        if keep is not None:
            ids, scores = ids[keep], scores[keep]
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
