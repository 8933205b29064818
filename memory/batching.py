"""Dynamic batching of embedding requests inside the embeddings worker.

Each Celery task thread submits its texts and waits; one thread owns the model and runs it on whatever is
pending, up to ``max_batch`` texts per call, questions (``priority=True``) first. Waiting ``max_wait_s`` for
more requests before a call trades a few milliseconds for fuller batches under load, as the dynamic
batchers of Triton Inference Server and TorchServe do. Knows nothing of Django.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np


@dataclass
class _Request:
    texts: list[str]
    future: Future


class EmbeddingBatcher:
    """``encode``: list[str] -> float32 ``(n, dim)``. :meth:`submit` returns a Future of that array for the
    request's texts. ``on_batch(texts, seconds)`` is called after each model call (metrics)."""

    def __init__(
        self,
        encode: Callable[[list[str]], np.ndarray],
        *,
        max_batch: int = 64,
        max_wait_s: float = 0.005,
        on_batch: Callable[[int, float], None] | None = None,
    ):
        self._encode = encode
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._on_batch = on_batch
        self._urgent: deque[_Request] = deque()
        self._bulk: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="embedding-batcher", daemon=True)
        self._thread.start()

    def submit(self, texts: list[str], *, priority: bool = False) -> Future:
        """Queue ``texts`` for embedding; the Future gives their ``(len(texts), dim)`` array or the error
        the model raised. Raises ``RuntimeError`` after :meth:`stop`."""
        future: Future = Future()
        if not texts:
            future.set_result(self._encode([]))
            return future
        with self._cond:
            if self._stopped:
                raise RuntimeError("the embedding batcher is stopped")
            (self._urgent if priority else self._bulk).append(_Request(list(texts), future))
            self._cond.notify()
        return future

    def pending(self) -> int:
        """Texts waiting for the model."""
        with self._cond:
            return sum(len(r.texts) for r in self._urgent) + sum(len(r.texts) for r in self._bulk)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(5)

    def _take(self) -> list[_Request]:
        """Requests for the next call: every pending question first, then bulk requests while they fit
        (a request is never split; one larger than ``max_batch`` goes alone)."""
        taken: list[_Request] = []
        size = 0
        for queue in (self._urgent, self._bulk):
            while queue and (not taken or size + len(queue[0].texts) <= self.max_batch):
                request = queue.popleft()
                taken.append(request)
                size += len(request.texts)
        return taken

    def _loop(self) -> None:
        import time

        while True:
            with self._cond:
                while not (self._urgent or self._bulk or self._stopped):
                    self._cond.wait()
                if self._stopped and not (self._urgent or self._bulk):
                    return
                if not self._urgent and self.max_wait_s > 0:
                    # Let concurrent submitters join this batch (skipped when a question waits).
                    self._cond.wait_for(
                        lambda: self._urgent or sum(len(r.texts) for r in self._bulk) >= self.max_batch,
                        timeout=self.max_wait_s,
                    )
                requests = self._take()
            texts = [t for r in requests for t in r.texts]
            started = time.perf_counter()
            try:
                vectors = self._encode(texts)
            except Exception as exc:  # noqa: BLE001 - handed to every waiter
                for r in requests:
                    r.future.set_exception(exc)
                continue
            if self._on_batch is not None:
                self._on_batch(len(texts), time.perf_counter() - started)
            offset = 0
            for r in requests:
                r.future.set_result(vectors[offset : offset + len(r.texts)])
                offset += len(r.texts)
