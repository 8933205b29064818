"""Fault drills as tests over real processes: daphne, Celery workers with the real model, PostgreSQL,
Redis, RabbitMQ (``conversations/drills``; ``manage.py drills`` runs more trials of the same code).

Each drill's replies go to a model name of its own (an alias of the default weights registered in the test
settings), whose broker queue only the drill's workers consume and announce, so the session's shared worker
never serves (or hides) them.
"""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections

from billing.models import Tier
from conversations.drills import faults
from conversations.drills.processes import DrillWorker
from tests.live_stack import ROOT, free_port, stack_env

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + "/ws/chat/"


def purge_queue(name: str) -> None:
    """Drop messages an earlier run left in a drill's broker queue (their ids would name this run's rows)."""
    from celery import current_app
    from kombu import Queue

    from inference.registry import queue_options

    with current_app.connection_for_write() as conn:
        bound = Queue(name, **queue_options(name))(conn.default_channel)
        bound.declare()
        bound.purge()


@pytest.fixture
def private_model(make_user, redis_clean):
    """Route the tiers' (and so the drill tier's) replies to a model name of this test's own, with an empty
    queue and no replay streams left by earlier runs (ids restart with each test database)."""

    def route(name: str) -> str:
        close_old_connections()  # a database drill may have ended this thread's session
        make_user("drill-owner")  # tiers exist
        Tier.objects.update(model_name=name)
        purge_queue(f"inference.{name}")
        return f"inference.{name}"

    return route


@pytest.fixture
def drill_workers(prepared_model, tmp_path):
    started = []

    def start(name, queue, **extra_env):
        # The worker serves and announces the drill's model (an alias of the default weights, test settings),
        # so admission control sees it live.
        model = queue.removeprefix("inference.")
        worker = DrillWorker(
            name, tmp_path, queues=[queue], extra_env={"INFERENCE_DEFAULT_MODEL": model, **extra_env}
        )
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listening on {port}")


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


@pytest.fixture
def private_redis():
    """A Redis server of this test's own (the machine's Redis is shared), restartable with data loss."""
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    state = {}

    def start():
        state["proc"] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
        wait_port(port, state["proc"])

    def restart():
        state["proc"].kill()
        state["proc"].wait(10)
        time.sleep(1.0)  # clients see the outage, not just a blip
        start()

    start()
    yield port, restart
    state["proc"].kill()
    state["proc"].wait(10)


@pytest.mark.asyncio
async def test_redis_restart_mid_stream_recovers_without_restarting_anything(
    private_redis, private_model, drill_workers, tmp_path
):
    port, restart = private_redis
    redis_url = f"redis://127.0.0.1:{port}/0"
    queue = await sync_to_async(private_model)("redisdrill")
    await asyncio.to_thread(drill_workers, "redis-1", queue, TEST_REDIS_URL=redis_url)
    web_port = free_port()
    env = dict(stack_env(), TEST_REDIS_URL=redis_url)
    log = open(tmp_path / "daphne.log", "w")
    daphne = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port), "chatsite.asgi:application"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        await asyncio.to_thread(wait_port, web_port, daphne)
        base = f"http://127.0.0.1:{web_port}"
        result = await faults.redis_restart(url=ws_url(base), origin=base, command=restart)
    finally:
        os.killpg(daphne.pid, signal.SIGTERM)
        daphne.wait(20)
        log.close()
    assert result.held, (result.failures, result.notes, (tmp_path / "daphne.log").read_text()[-3000:])
    assert result.recovery_s[0] < 30
