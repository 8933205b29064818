"""The embeddings worker's model and batcher: one of each per process, made on first use (the worker makes
them at start-up, ``memory/worker.py``). Only the embeddings worker, tests and benchmarks call this."""

from __future__ import annotations

import threading

from django.conf import settings

from memory import metrics
from memory.batching import EmbeddingBatcher

_batcher: EmbeddingBatcher | None = None
_lock = threading.Lock()


def get_batcher() -> EmbeddingBatcher:
    """This process's batcher around the packaged all-MiniLM-L6-v2 (loads it on first call, ~4 s)."""
    global _batcher
    with _lock:
        if _batcher is None:
            from memory.embedding import Embedder

            embedder = Embedder(num_threads=settings.EMBEDDINGS_NUM_THREADS or None)
            _batcher = EmbeddingBatcher(
                embedder.encode,
                max_batch=settings.EMBEDDINGS_MAX_BATCH,
                max_wait_s=settings.EMBEDDINGS_BATCH_WAIT_S,
                on_batch=metrics.observe_batch,
            )
        return _batcher


def encode_bulk(texts: list[str]):
    """Embed chunk texts through the batcher (float32 ``(n, 384)``), counted as chunks."""
    vectors = get_batcher().submit(texts).result()
    metrics.EMBEDDED_CHUNKS.labels("chunk").inc(len(texts))
    return vectors
