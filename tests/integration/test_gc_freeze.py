"""A real GPU worker, once its model is loaded, has frozen the heap start-up built out of the garbage
collector's full collections, and exports the count and the full collections' pauses on its scrape endpoint
(observability/gc_pauses.py; docs/overhead-levers.md, lever 38)."""

import pytest
from channels.db import database_sync_to_async

from tests.integration.test_observability import fleet_status, scrape, value

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


async def test_a_gpu_worker_freezes_its_heap_once_its_model_is_loaded(celery_worker):
    worker = await database_sync_to_async(fleet_status)("shared")
    samples = scrape(f"http://127.0.0.1:{worker.metrics_port}/metrics")
    # The model's modules and weights' Python objects, Django, the guard chain: hundreds of thousands.
    assert value(samples, "chatsite:gc_frozen_objects") > 200_000
    assert ("chatsite:gc_full_collection_seconds_count", ()) in samples
