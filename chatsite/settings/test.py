"""Test settings: real PostgreSQL and Redis (a separate Redis database), fast password hashing."""

import os

# Model names of the fault drills' own (tests/integration/test_drills.py) and of the page tests that must see a
# reply stay queued (tests/browser/test_chat_controls.py): aliases of the default weights, each with a queue
# that the shared test worker never consumes.
os.environ.setdefault(
    "INFERENCE_MODEL_ALIASES",
    ",".join(
        f"{name}=smollm2-135m-instruct"
        for name in (
            "killdrill",
            "dbdrill",
            "redisdrill",
            "loaddrill",
            "page-own",
            "page-light",
            "safetydrill",
        )
    ),
)

from .base import *  # noqa: E402,F401,F403
from .base import BASE_DIR, CACHE_POOL_CLASS, CACHES, CHANNEL_LAYERS, DATABASES, env  # noqa: E402

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Uploaded documents: always the local filesystem, in a directory of their own (the live-stack tests' daphne and
# workers are other processes and must see the same files). The S3 backend is tested with moto's fake S3.
DOCUMENTS_ROOT = env("TEST_DOCUMENTS_ROOT", default=str(BASE_DIR / "var" / "test-documents"))
DOCUMENTS_STORAGE = {
    "BACKEND": "django.core.files.storage.FileSystemStorage",
    "OPTIONS": {"location": DOCUMENTS_ROOT, "base_url": None},
}
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "documents": DOCUMENTS_STORAGE,
}
REDIS_URL = env("TEST_REDIS_URL", default="redis://127.0.0.1:6379/9")
CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] = [REDIS_URL]
CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = "chatsite-test"
CACHES = {
    "default": {
        "BACKEND": CACHES["default"]["BACKEND"],
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "chatsite-test",
        "OPTIONS": {"pool_class": CACHE_POOL_CLASS},
    }
}
CELERY_BROKER_URL = env("TEST_CELERY_BROKER_URL", default="amqp://guest:guest@127.0.0.1:5672//")
# Celery reads CELERY_BROKER_URL from the environment before the settings: a stack's own broker, exported or
# from .env, would otherwise take the tests' tasks (and a running worker of that stack would consume them).
os.environ["CELERY_BROKER_URL"] = CELERY_BROKER_URL
DATABASES["default"]["CONN_MAX_AGE"] = 0
# No connection pool in tests: each test's connection lives in its transaction, and a pool's idle connections
# would keep the test database from being dropped at the end (tests/unit/test_db_pool.py checks the pool).
DATABASES["default"].get("OPTIONS", {}).pop("pool", None)
WHITENOISE_USE_FINDERS = True  # serve static/ without collectstatic in the live-stack tests
# Worker metrics on a free port (published in the fleet status): parallel test runs never collide.
METRICS_WORKER_PORT = 0

# A PostgreSQL with the pgvector extension for the vector-store tests (tests/db/test_memory_store.py): the
# socket directory of the server scripts/pgvector_server.py starts (scripts/test.sh exports it). Unset, the
# pgvector half of those tests is skipped and says why.
TEST_PGVECTOR_SOCKET_DIR = env("TEST_PGVECTOR_SOCKET_DIR", default="")
if TEST_PGVECTOR_SOCKET_DIR:
    DATABASES["pgvector"] = {
        **DATABASES["default"],
        "HOST": TEST_PGVECTOR_SOCKET_DIR,
        "PORT": "",
        "USER": "postgres",
        "PASSWORD": "",
        "NAME": f"{DATABASES['default']['NAME']}_pgvector",
        "TEST": {"NAME": f"test_{DATABASES['default']['NAME']}_pgvector"},
    }
