"""Prometheus metrics of memory (same registry and naming as ``observability/metrics.py``).

* embeddings worker: chunks embedded (throughput: ``rate()``), batch sizes and model-call seconds, texts
  waiting in the batcher, and the broker's depth of the two embeddings queues (read at scrape time);
* reply path: retrieval latency, chunks recalled per reply;
* index size per backend (read at scrape time from the database by the embeddings worker).
"""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

logger = logging.getLogger(__name__)

EMBEDDED_CHUNKS = Counter("chatsite:embedding_chunks", "Texts embedded (chunks and questions).", ["kind"])
EMBED_BATCH_SIZE = Histogram(
    "chatsite:embedding_batch_size", "Texts per embedding model call.", buckets=(1, 2, 4, 8, 16, 32, 64, 128)
)
EMBED_BATCH_SECONDS = Histogram(
    "chatsite:embedding_batch_seconds",
    "Seconds per embedding model call.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
RETRIEVAL_SECONDS = Histogram(
    "chatsite:retrieval_seconds",
    "Seconds a reply spent on recall: question embedding plus vector search.",
    ["backend"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
RECALL_HITS = Histogram(
    "chatsite:retrieval_hits", "Chunks recalled into one reply's context.", buckets=(0, 1, 2, 3, 4, 6, 8, 12)
)


def observe_batch(size: int, seconds: float) -> None:
    EMBED_BATCH_SIZE.observe(size)
    EMBED_BATCH_SECONDS.observe(seconds)


class EmbeddingsCollector:
    """Gauges read at scrape time: broker depth of the embeddings queues, texts in the batcher, vectors
    in the store. ``queue_depths()`` -> {queue: messages}; ``batcher_pending()`` -> int;
    ``index_size()`` -> (backend name, vectors)."""

    def __init__(self, *, queue_depths, batcher_pending, index_size):
        self._queue_depths = queue_depths
        self._batcher_pending = batcher_pending
        self._index_size = index_size

    def collect(self):
        depth = GaugeMetricFamily(
            "chatsite:embedding_queue_depth", "Tasks waiting in an embeddings broker queue.", labels=["queue"]
        )
        try:
            for queue, messages in self._queue_depths().items():
                depth.add_metric([queue], messages)
        except Exception:  # noqa: BLE001 - a scrape never fails for a broker hiccup
            logger.warning("embeddings queue depth unavailable", exc_info=True)
        yield depth
        pending = GaugeMetricFamily("chatsite:embedding_pending_texts", "Texts waiting for the model.")
        pending.add_metric([], self._batcher_pending())
        yield pending
        size = GaugeMetricFamily("chatsite:vector_index_size", "Vectors in the store.", labels=["backend"])
        try:
            backend, vectors = self._index_size()
            size.add_metric([backend], vectors)
        except Exception:  # noqa: BLE001
            logger.warning("vector index size unavailable", exc_info=True)
        yield size


def register_embeddings_collector(collector: EmbeddingsCollector, *, registry=REGISTRY) -> None:
    registry.register(collector)
