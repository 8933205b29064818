"""Celery task of the embeddings workers (``memory.worker`` discovers it): process one uploaded file.
Thin: parse, call the service with the worker's batching encoder."""

from celery import shared_task
from django.db import InterfaceError, OperationalError


@shared_task(
    name="documents.process",
    acks_late=True,
    ignore_result=True,
    # PostgreSQL unreachable: try again shortly (nothing is indexed before the final transaction).
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=1,
    retry_backoff_max=30,
    max_retries=8,
)
def process(document_id: int) -> str:
    """Extract, chunk, embed and index document ``document_id``; returns its final status."""
    from documents.processing import document_process
    from memory.runtime import encode_bulk

    return document_process(document_id=int(document_id), encode=encode_bulk)
