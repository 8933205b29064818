"""A document's stored file leaves with its row, whichever way the row goes (the file's own delete, its
conversation's, the account's): ``post_delete`` fires for cascaded rows too. The storage delete runs after
commit, so a rolled-back delete keeps the file."""

import logging

from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from documents.models import Document
from documents.storage import document_storage

logger = logging.getLogger(__name__)


def stored_file_delete(name: str) -> None:
    """Delete ``name`` from the documents storage; a failure is logged, not raised (the row is gone)."""
    if not name:
        return
    try:
        document_storage().delete(name)
    except Exception:
        logger.exception("could not delete stored document file %s", name)


@receiver(post_delete, sender=Document)
def _document_deleted(sender, instance: Document, **kwargs) -> None:
    name = instance.file.name
    transaction.on_commit(lambda: stored_file_delete(name))
