"""Local development (``make run``): the same defaults as ``.env.example`` — DEBUG off unless asked for
(``DEBUG=true`` shows Django's technical error pages), static files with hashed names from
``collectstatic`` (whitenoise's manifest storage, as in production)."""

from .base import *  # noqa: F401,F403
from .base import DOCUMENTS_STORAGE, env

DEBUG = env.bool("DEBUG", default=False)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    "documents": DOCUMENTS_STORAGE,
}
# With DEBUG on, serve static/ straight from the source tree (no collectstatic needed after an edit).
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG
