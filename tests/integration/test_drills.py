"""Fault drills as tests over real processes: daphne, Celery workers with the real model, PostgreSQL,
Redis, RabbitMQ (``devtools/drills``; ``manage.py drills`` runs more trials of the same code).

Each drill's replies go to a model name of its own (an alias of the default weights registered in the test
settings), whose broker queue only the drill's workers consume and announce, so the session's shared worker
never serves (or hides) them.
"""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from devtools.drills import faults
from tests.live_stack import daphne_server

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + "/ws/chat/"


@pytest.mark.asyncio
async def test_worker_sigkill_mid_stream_loses_and_strands_nothing(
    live_server_url, private_model, drill_workers, celery_worker
):
    # celery_worker (serving another queue) is the live worker whose reaper settles the killed reply.
    queue = await sync_to_async(private_model)("killdrill")
    # Two workers: the survivor serves the reply sent 0.1 s after the kill while the victim restarts.
    workers = list(
        await asyncio.gather(
            asyncio.to_thread(drill_workers, "kill-1", queue),
            asyncio.to_thread(drill_workers, "kill-2", queue),
        )
    )
    result = await faults.worker_kill(
        url=ws_url(live_server_url),
        origin=live_server_url,
        workers=workers,
        restart=lambda victim: drill_workers(f"{victim.name}-r", queue),
        trials=1,
    )
    assert result.trials == 1, result.notes
    # Held: the killed reply ended (interrupted with its text, or regenerated) and the reply sent 0.1 s after
    # the kill was served by the restarted worker, each within 60 s; nothing queued/streaming 60 s after.
    assert result.held, (result.failures, result.notes)


def test_postgresql_outage_answers_unavailable_and_keeps_the_reply(
    live_server_url, private_model, drill_workers
):
    # Sync test: the outage ends this thread's database session too, which must be closed before teardown.
    queue = private_model("dbdrill")
    drill_workers("db-1", queue)
    try:
        result = asyncio.run(
            faults.db_outage(url=ws_url(live_server_url), origin=live_server_url, outage_s=10)
        )
    finally:
        faults.database_restore(settings.DATABASES["default"]["NAME"])
        connections.close_all()
    assert result.held, (result.failures, result.notes)
    assert result.recovery_s[0] < 10


@pytest.mark.asyncio
async def test_overload_burst_every_send_answered_every_reply_final(
    live_server_url, private_model, drill_workers
):
    queue = await sync_to_async(private_model)("loaddrill")
    await asyncio.to_thread(drill_workers, "load-1", queue)
    result = await faults.overload(
        url=ws_url(live_server_url),
        origin=live_server_url,
        sends=60,
        clients=15,
        max_reply_tokens=4,
        timeout=300,
    )
    assert result.held, (result.failures, result.notes)


@pytest.mark.asyncio
async def test_transport_closes_oversized_and_non_utf8_frames_with_a_code(live_server_url, make_user):
    cookies = await sync_to_async(faults.drill_users)(1, max_reply_tokens=4, prefix="drill-close")
    url = ws_url(live_server_url)
    assert await faults.close_code_after(url, live_server_url, cookies[0], b"x" * (2 * 1024 * 1024)) == 1009
    assert await faults.close_code_after(url, live_server_url, cookies[0], b'{"type": "\xff"}') == 1007


@pytest.mark.asyncio
async def test_redis_restart_mid_stream_recovers_without_restarting_anything(
    private_redis, private_model, drill_workers, tmp_path
):
    port, restart = private_redis
    redis_url = f"redis://127.0.0.1:{port}/0"
    queue = await sync_to_async(private_model)("redisdrill")
    await asyncio.to_thread(drill_workers, "redis-1", queue, TEST_REDIS_URL=redis_url)
    with daphne_server(tmp_path / "daphne.log", TEST_REDIS_URL=redis_url) as base:
        result = await faults.redis_restart(url=ws_url(base), origin=base, command=restart)
    assert result.held, (result.failures, result.notes, (tmp_path / "daphne.log").read_text()[-3000:])
    assert result.recovery_s[0] < 30
