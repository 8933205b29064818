"""A reply's question, embedded by the embeddings worker and handed back through Redis.

The reply path (in the chat engine's process) must not run the embedding model, so it sends
``memory.embed_query`` to the ``embeddings.query`` queue with a fresh Redis key and waits on that key
(``BLPOP``) for the float32 bytes. A reply never waits longer than ``timeout_s``: without an answer it goes
on without recall.

Prefetch: a page ``send`` asks for its question's vector before its transaction opens, any other queued
reply once it commits (:func:`question_prefetch`), under a key named for the user and the text
(:func:`question_key`), so the embedding overlaps the send's admission, storage, dispatch and pick-up; the
worker then finds the vector waiting (:func:`question_vector`) instead of paying the round trip before
prefill. Replies asking the same question share the vector: it is read without being taken (``BLMOVE`` of
the one-element list onto itself).
"""

from __future__ import annotations

import hashlib
import logging
import uuid

import numpy as np
import redis
from django.conf import settings

from events import broadcast
from memory.embedding import DIMENSIONS

logger = logging.getLogger(__name__)

#: Seconds an answer stays in Redis when nobody took it (the reply gave up waiting); a prefetched one as
#: long as its ``:asked`` mark, so a reply picked up late still finds the vector it was promised.
ANSWER_TTL_S = 120


def redis_client() -> redis.Redis:
    """The process's Redis client (``events.broadcast``'s, one connection pool per process)."""
    return broadcast.redis_client()


def answer_key() -> str:
    prefix = settings.CACHES.get("default", {}).get("KEY_PREFIX") or "chatsite"
    return f"{prefix}:memory:query:{uuid.uuid4().hex}"


def question_key(*, user_id: int, text: str) -> str:
    """Redis key of ``user_id``'s question ``text`` (its vector, and with ``:asked`` the prefetch's mark)."""
    prefix = settings.CACHES.get("default", {}).get("KEY_PREFIX") or "chatsite"
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    return f"{prefix}:memory:question:{user_id}:{digest}"


def question_prefetch(*, user_id: int, text: str, at_once: bool = False) -> None:
    """Ask the embeddings worker for ``text``'s vector on behalf of ``user_id``'s coming reply (read later by
    :func:`question_vector`): ``at_once``, or after the current transaction commits. Failures are logged,
    never raised (the reply then asks itself)."""
    from django.db import transaction

    from memory.tasks import embed_query

    key = question_key(user_id=user_id, text=text)

    def send() -> None:
        try:
            redis_client().set(f"{key}:asked", 1, ex=ANSWER_TTL_S)
            embed_query.apply_async(args=[key, text], expires=ANSWER_TTL_S)
        except Exception:  # noqa: BLE001 - the reply will ask again itself
            logger.warning("question prefetch for user %s not sent", user_id, exc_info=True)

    if at_once:
        send()
    else:
        transaction.on_commit(send)


def question_vector(*, user_id: int, text: str, timeout_s: float) -> np.ndarray | None:
    """``user_id``'s question ``text`` as a vector: the prefetched one when it was asked for (waiting at most
    ``timeout_s``; left in place for another reply asking the same), else a fresh round trip
    (:func:`question_embed`)."""
    key = question_key(user_id=user_id, text=text)
    try:
        asked = redis_client().exists(f"{key}:asked")
    except Exception:  # noqa: BLE001
        asked = 0
    if not asked:
        return question_embed(text=text, timeout_s=timeout_s)
    try:
        got = redis_client().blmove(key, key, max(timeout_s, 0.01), "RIGHT", "LEFT")
    except Exception:  # noqa: BLE001
        logger.warning("prefetched question unavailable", exc_info=True)
        return None
    if got is None:
        return None
    vector = np.frombuffer(got, dtype="<f4")
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
