"""Live-stack fixtures for the integration and browser layers: real Celery worker processes (``--pool threads``)
hosting the real default model, and a real daphne server, against the test PostgreSQL and Redis databases."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from conversations.drills.processes import DrillWorker, child_env

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
    :class:`~conversations.drills.processes.DrillWorker` (``queues``: comma-separated; ``env``: extra
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


@pytest.fixture(scope="session")
def live_server_url(django_db_setup, tmp_path_factory):
    """A real daphne process serving ``chatsite.asgi`` on a free port; yields its base URL."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("daphne") / "daphne.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"],
        cwd=ROOT,
        env=stack_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited:\n{log_path.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(20)
    log.close()
