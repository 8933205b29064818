import os

from tests.live_stack import celery_worker, live_server_url, prepared_model, worker_factory  # noqa: F401

# Playwright's sync API keeps an event loop in the test thread; the test's own ORM calls are plain
# blocking queries between browser steps, so Django's async-safety guard does not apply to them.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
