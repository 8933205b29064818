from tests.live_stack import celery_worker, live_server_url, prepared_model, worker_factory  # noqa: F401
