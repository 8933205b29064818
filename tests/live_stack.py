"""Live-stack fixtures for the integration and browser layers: real Celery worker processes (``--pool threads``)
hosting the real default model, and a real daphne server, against the test PostgreSQL and Redis databases."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from devtools.drills.processes import DrillWorker, child_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def prepared_model():
    """The default model converted into MODEL_CACHE_DIR (once; ~20 s the first time)."""
    from inference.engine import prepare_model
    from inference.registry import model_spec

    return prepare_model(model_spec(), settings.MODEL_CACHE_DIR)


#: What a child process of the test stack needs on top of this process's environment.
TEST_CHILD_ENV = {"DJANGO_SETTINGS_MODULE": "chatsite.settings.test", "HF_HUB_OFFLINE": "1"}


def stack_env() -> dict[str, str]:
    """Environment for a child process of the stack: test settings, pointed at the test database."""
    return child_env(**TEST_CHILD_ENV)


@pytest.fixture(scope="session")
def worker_factory(django_db_setup, prepared_model, tmp_path_factory):
    """``worker_factory(name, queues, env=None)`` -> a ready
    :class:`~devtools.drills.processes.DrillWorker` (``queues``: comma-separated; ``env``: extra
    environment variables); all are stopped at session end."""
    started = []

    def start(
        name: str = "itest",
        queues: str = f"inference.{settings.INFERENCE_DEFAULT_MODEL}",
        env: dict | None = None,
    ) -> DrillWorker:
        worker = DrillWorker(
            name,
            tmp_path_factory.mktemp("worker"),
            queues=queues.split(","),
            extra_env={**TEST_CHILD_ENV, **(env or {})},
        )
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def celery_worker(worker_factory):
    """One long-lived worker shared by the integration tests that do not kill it."""
    return worker_factory("shared")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until something listens on 127.0.0.1:``port``; raises RuntimeError if ``proc`` exited first,
    TimeoutError after ``timeout`` seconds."""
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


@contextlib.contextmanager
def daphne_server(log_path: Path, port: int | None = None, **extra_env: str):
    """A daphne process serving ``chatsite.asgi`` on ``port`` (default: a free one), with the stack's
    environment and ``extra_env``; yields its base URL, SIGTERMs it on exit."""
    port = port or free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"],
        cwd=ROOT,
        env={**stack_env(), **extra_env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        try:
            wait_port(port, proc)
        except RuntimeError as exc:
            raise RuntimeError(f"daphne exited:\n{log_path.read_text()[-3000:]}") from exc
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        log.close()


@pytest.fixture(scope="session")
def live_server_url(django_db_setup, tmp_path_factory):
    """A real daphne process serving ``chatsite.asgi`` on a free port; yields its base URL."""
    with daphne_server(tmp_path_factory.mktemp("daphne") / "daphne.log") as url:
        yield url


def purge_queue(name: str) -> None:
    """Drop messages an earlier run left in a broker queue (their ids would name this run's rows)."""
    from celery import current_app
    from kombu import Queue

    from inference.registry import queue_options

    with current_app.connection_for_write() as conn:
        bound = Queue(name, **queue_options(name))(conn.default_channel)
        bound.declare()
        bound.purge()


@pytest.fixture
def private_model(make_user, redis_clean):
    """``private_model(name)`` -> its queue: routes every tier's replies to ``name`` (a model alias of the
    default weights, test settings), whose broker queue only this test's workers consume, emptied first."""
    from django.db import close_old_connections

    from billing.models import Tier

    def route(name: str) -> str:
        close_old_connections()  # a database drill may have ended this thread's session
        make_user("drill-owner")  # tiers exist
        Tier.objects.update(model_name=name)
        purge_queue(f"inference.{name}")
        return f"inference.{name}"

    return route


@pytest.fixture
def drill_workers(prepared_model, tmp_path):
    """``drill_workers(name, queue, **env)`` -> a ready worker consuming only ``queue``, serving and
    announcing its model (an alias of the default weights), so admission control sees it live; stopped at
    the end of the test."""
    started = []

    def start(name, queue, **extra_env):
        model = queue.removeprefix("inference.")
        worker = DrillWorker(
            name,
            tmp_path,
            queues=[queue],
            extra_env={**TEST_CHILD_ENV, "INFERENCE_DEFAULT_MODEL": model, **extra_env},
        )
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def private_redis():
    """A Redis server of this test's own (the machine's Redis is shared), restartable with data loss:
    yields ``(port, restart)``; ``restart()`` kills it, waits 1 s and starts it again, empty."""
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
