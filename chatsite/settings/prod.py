"""Production: refuses to start without SECRET_KEY and ALLOWED_HOSTS; HTTPS-only cookies and HSTS.

``manage.py check --deploy`` is clean with these settings (see tests/db/test_settings.py).
"""

from .base import *  # noqa: F401,F403
from .base import DOCUMENTS_STORAGE, env

DEBUG = False
SECRET_KEY = env("SECRET_KEY")  # no default: ImproperlyConfigured when missing
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS")  # no default
if not ALLOWED_HOSTS:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("ALLOWED_HOSTS must name at least one host in production")

SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
SECURE_CONTENT_TYPE_NOSNIFF = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    "documents": DOCUMENTS_STORAGE,
}
