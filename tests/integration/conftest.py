from tests.live_stack import celery_worker, prepared_model, worker_factory  # noqa: F401
