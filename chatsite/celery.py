"""The Celery app, configured from Django settings (``CELERY_*``).

GPU workers are started with ``celery -A chatsite worker --pool threads`` so that one process hosts one
inference engine and many task threads share its continuous batch (see ``inference/worker.py``; its Celery
signals are wired in ``inference/worker_signals.py``).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")

app = Celery("chatsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # each app's tasks.py: conversations.tasks holds the reply task
# The worker's lifecycle handlers (engine load at start, draining, shutdown): inference/worker_signals.py.
app.autodiscover_tasks(related_name="worker_signals")
