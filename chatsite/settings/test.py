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
from .base import CHANNEL_LAYERS, DATABASES, env  # noqa: E402

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
REDIS_URL = env("TEST_REDIS_URL", default="redis://127.0.0.1:6379/9")
CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] = [REDIS_URL]
CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = "chatsite-test"
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "chatsite-test",
    }
}
CELERY_BROKER_URL = env("TEST_CELERY_BROKER_URL", default="amqp://guest:guest@127.0.0.1:5672//")
DATABASES["default"]["CONN_MAX_AGE"] = 0
WHITENOISE_USE_FINDERS = True  # serve static/ without collectstatic in the live-stack tests
# Worker metrics on a free port (published in the fleet status): parallel test runs never collide.
METRICS_WORKER_PORT = 0
