"""The storage that holds uploaded files: ``STORAGES["documents"]`` (the local filesystem by default,
S3-compatible object storage with ``DOCUMENTS_STORAGE_BACKEND=s3``; see docs/documents.md)."""

import uuid

from django.core.files.storage import storages
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.functional import LazyObject, empty


class _DocumentStorage(LazyObject):
    """``storages["documents"]``, looked up on first use and again after ``STORAGES`` changes (as Django's
    own ``default_storage``): a FileField resolves a callable storage once, when models load."""

    def _setup(self):
        self._wrapped = storages["documents"]


_storage = _DocumentStorage()


def document_storage():
    """The documents storage (the callable named by ``Document.file``, so migrations do not freeze a
    backend)."""
    return _storage


@receiver(setting_changed)
def _storages_changed(*, setting, **kwargs):
    if setting == "STORAGES":
        _storage._wrapped = empty


def document_path(instance, filename: str) -> str:
    """``u<owner id>/<random hex>.<kind>``: the person's file name never becomes a path (it is kept in
    ``Document.name`` for display)."""
    return f"u{instance.owner_id}/{uuid.uuid4().hex}.{instance.kind}"
