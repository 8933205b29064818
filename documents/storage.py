"""The storage that holds uploaded files: ``STORAGES["documents"]`` (the local filesystem by default,
S3-compatible object storage with ``DOCUMENTS_STORAGE_BACKEND=s3``; see docs/documents.md)."""

import uuid

from django.core.files.storage import Storage, storages


def document_storage() -> Storage:
    """The documents storage, looked up when used (a callable, so migrations do not freeze a backend and
    tests may swap ``STORAGES``)."""
    return storages["documents"]


def document_path(instance, filename: str) -> str:
    """``u<owner id>/<random hex>.<kind>``: the person's file name never becomes a path (it is kept in
    ``Document.name`` for display)."""
    return f"u{instance.owner_id}/{uuid.uuid4().hex}.{instance.kind}"
