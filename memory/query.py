"""A reply's question, embedded by the embeddings worker and handed back through Redis.

The reply path (in the chat engine's process) must not run the embedding model, so it sends
``memory.embed_query`` to the ``embeddings.query`` queue with a fresh Redis key and waits on that key
(``BLPOP``) for the float32 bytes. A reply never waits longer than ``timeout_s``: without an answer it goes
on without recall.

Prefetch: when a reply is queued, its question is sent at once (:func:`question_prefetch`, after commit)
under a key named for the reply, so the embedding overlaps the reply's dispatch and queue wait; the worker
then finds the vector waiting (:func:`question_vector`) instead of paying the round trip before prefill.
"""

from __future__ import annotations

import logging
import uuid

import numpy as np
import redis
from django.conf import settings

from events import broadcast
from memory.embedding import DIMENSIONS

logger = logging.getLogger(__name__)

#: Seconds an answer stays in Redis when nobody took it (the reply gave up waiting).
ANSWER_TTL_S = 30


def redis_client() -> redis.Redis:
    """The process's Redis client (``events.broadcast``'s, one connection pool per process)."""
    return broadcast.redis_client()


def answer_key() -> str:
    prefix = settings.CACHES.get("default", {}).get("KEY_PREFIX") or "chatsite"
    return f"{prefix}:memory:query:{uuid.uuid4().hex}"


def reply_key(reply_id: int) -> str:
    prefix = settings.CACHES.get("default", {}).get("KEY_PREFIX") or "chatsite"
    return f"{prefix}:memory:reply-question:{reply_id}"


def question_prefetch(*, reply_id: int, text: str) -> None:
    """After the current transaction commits, ask the embeddings worker for ``text``'s vector on behalf of
    reply ``reply_id`` (read later by :func:`question_vector`). Failures are logged, never raised."""
    from django.db import transaction

    from memory.tasks import embed_query

    key = reply_key(reply_id)

    def send() -> None:
        try:
            redis_client().set(f"{key}:asked", 1, ex=ANSWER_TTL_S * 4)
            embed_query.apply_async(args=[key, text], expires=ANSWER_TTL_S * 4)
        except Exception:  # noqa: BLE001 - the reply will ask again itself
            logger.warning("question prefetch for reply %s not sent", reply_id, exc_info=True)

    transaction.on_commit(send)


def question_vector(*, reply_id: int, text: str, timeout_s: float) -> np.ndarray | None:
    """The question's vector for reply ``reply_id``: the prefetched one when it was asked for (waiting at
    most ``timeout_s``), else a fresh round trip (:func:`question_embed`)."""
    key = reply_key(reply_id)
    try:
        asked = redis_client().delete(f"{key}:asked")
    except Exception:  # noqa: BLE001
        asked = 0
    if not asked:
        return question_embed(text=text, timeout_s=timeout_s)
    try:
        got = redis_client().blpop([key], timeout=max(timeout_s, 0.01))
    except Exception:  # noqa: BLE001
        logger.warning("prefetched question unavailable", exc_info=True)
        return None
    if got is None:
        return None
    vector = np.frombuffer(got[1], dtype="<f4")
    return vector if vector.shape == (DIMENSIONS,) else None


def question_embed(*, text: str, timeout_s: float) -> np.ndarray | None:
    """float32 ``(384,)`` unit vector of ``text`` from the embeddings worker, or None when none answered
    within ``timeout_s`` seconds (worker down or busy) or the broker is unreachable."""
    from memory.tasks import embed_query

    key = answer_key()
    try:
        # expires: a question nobody took in time is dropped by the worker instead of embedded for nobody.
        embed_query.apply_async(args=[key, text], expires=max(timeout_s, 1.0))
        got = redis_client().blpop([key], timeout=max(timeout_s, 0.01))
    except Exception:  # noqa: BLE001 - recall is an extra; the reply goes on without it
        logger.warning("question embedding unavailable", exc_info=True)
        return None
    if got is None:
        logger.info("no question embedding within %.2f s; replying without recall", timeout_s)
        return None
    vector = np.frombuffer(got[1], dtype="<f4")
    return vector if vector.shape == (DIMENSIONS,) else None


def question_answer(*, key: str, vector: np.ndarray) -> None:
    """Worker side: hand ``vector`` (float32 (384,)) to the waiting reply."""
    client = redis_client()
    pipe = client.pipeline()
    pipe.rpush(key, np.asarray(vector, dtype="<f4").tobytes())
    pipe.expire(key, ANSWER_TTL_S)
    pipe.execute()
