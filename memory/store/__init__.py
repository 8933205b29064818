"""The vector store, chosen once per database alias at start-up (:func:`store_for`).

``MEMORY_VECTOR_BACKEND``: ``auto`` (pgvector where ``memory_chunkvector`` is installed, else the exact
scan), ``pgvector`` (refuse to start without it) or ``exact``. Both backends implement
:class:`memory.store.base.VectorStore` and are tested behind one table of tests.
"""

from __future__ import annotations

import threading

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from memory.store import pgvector
from memory.store.base import Hit, SearchFilter, VectorStore
from memory.store.exact import ExactStore

__all__ = ["Hit", "SearchFilter", "VectorStore", "store_for", "store_reset", "detect"]

_stores: dict[str, VectorStore] = {}
_lock = threading.Lock()


def detect(using: str = "default") -> VectorStore:
    """Pick the backend for database ``using`` now (one query). Raises ``ImproperlyConfigured`` when
    ``MEMORY_VECTOR_BACKEND=pgvector`` and the database has no pgvector table."""
    wanted = settings.MEMORY_VECTOR_BACKEND
    if wanted == "exact":
        return ExactStore(using)
    if pgvector.is_installed(connections[using]):
        return pgvector.PgVectorStore(using)
    if wanted == "pgvector":
        raise ImproperlyConfigured(
            "MEMORY_VECTOR_BACKEND=pgvector but this database has no pgvector table: "
            "run `manage.py memory_store --install` on a server with the vector extension"
        )
    return ExactStore(using)


def store_for(using: str = "default") -> VectorStore:
    """The store of database ``using``, detected on first use in this process and then kept."""
    store = _stores.get(using)
    if store is None:
        with _lock:
            store = _stores.get(using)
            if store is None:
                store = _stores[using] = detect(using)
    return store


def store_reset() -> None:
    """Forget the detected stores (after ``memory_store --install``, and between tests)."""
    with _lock:
        _stores.clear()
