"""Celery tasks of the embeddings worker (queues ``embeddings`` and ``embeddings.query``). Thin: parse,
call the service or the batcher."""

from celery import shared_task
from django.db import InterfaceError, OperationalError


@shared_task(
    name="memory.embed_chunks",
    acks_late=True,
    ignore_result=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=1,
    retry_backoff_max=30,
    max_retries=8,
)
def embed_chunks(chunk_ids: list[int]) -> int:
    """Embed and store these chunks (those deleted meanwhile are skipped); returns how many."""
    from memory.runtime import encode_bulk
    from memory.services import chunks_embed

    return chunks_embed(chunk_ids=[int(i) for i in chunk_ids], encode=encode_bulk)


@shared_task(name="memory.embed_query", ignore_result=True)
def embed_query(answer_key: str, text: str) -> None:
    """Embed one question ahead of the batch and push the vector to Redis key ``answer_key``."""
    from memory import metrics
    from memory.query import question_answer
    from memory.runtime import get_batcher

    vector = get_batcher().submit([text], priority=True).result()[0]
    metrics.EMBEDDED_CHUNKS.labels("question").inc()
    question_answer(key=answer_key, vector=vector)
