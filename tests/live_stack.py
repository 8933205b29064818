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

ROOT = Path(__file__).resolve().parents[1]
WORKER_READY_LINE = "engine ready"


@pytest.fixture(scope="session")
def prepared_model():
    """The default model converted into MODEL_CACHE_DIR (once; ~20 s the first time)."""
    from inference.engine import prepare_model
    from inference.registry import model_spec

    return prepare_model(model_spec(), settings.MODEL_CACHE_DIR)


def stack_env(db_name: str) -> dict[str, str]:
    """Environment for a child process of the stack: test settings, pointed at the test database."""
    env = dict(os.environ)
    db = settings.DATABASES["default"]
    env.update(
        DJANGO_SETTINGS_MODULE="chatsite.settings.test",
        DATABASE_URL=f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db_name}",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


class WorkerProcess:
    """A ``celery worker`` subprocess; ``kill()`` sends SIGKILL as a crash would."""

    def __init__(self, log_path: Path, db_name: str, name: str, queues: str):
        env = stack_env(db_name)
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "chatsite",
                "worker",
                "--pool",
                "threads",
                "--concurrency",
                "8",
                "--prefetch-multiplier",
                "1",
                "-Q",
                queues,
                "-n",
                f"{name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel",
                "INFO",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"worker exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}"
                )
            if WORKER_READY_LINE in self.log_path.read_text():
                return
            time.sleep(0.3)
        raise TimeoutError(f"worker not ready after {timeout} s:\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


@pytest.fixture(scope="session")
def worker_factory(django_db_setup, prepared_model, tmp_path_factory):
    """``worker_factory(name, queues)`` -> a ready :class:`WorkerProcess`; all are stopped at session end."""
    started = []

    def start(
        name: str = "itest", queues: str = f"inference.{settings.INFERENCE_DEFAULT_MODEL}"
    ) -> WorkerProcess:
        log = tmp_path_factory.mktemp("worker") / f"{name}.log"
        worker = WorkerProcess(log, settings.DATABASES["default"]["NAME"], name, queues)
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
        env=stack_env(settings.DATABASES["default"]["NAME"]),
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
