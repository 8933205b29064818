"""Celery worker processes the drills start (and kill). The drills never signal a process they did not
start: a stack run by honcho (``make run``) ends every process when one dies.

This is also the one definition of a worker subprocess for the test suite (``tests/live_stack.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

READY_LINE = "engine ready"


def stack_queues() -> list[str]:
    """The broker queues the stack's workers consume: one per model the tiers name."""
    from billing.models import Tier
    from inference.registry import queue_for

    return sorted({queue_for(name) for name in Tier.objects.values_list("model_name", flat=True)})


def database_url() -> str:
    """``DATABASE_URL`` of the database this process uses now (under pytest: the test database)."""
    db = settings.DATABASES["default"]
    return (
        f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    )


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child process of the stack (worker, daphne): this process's environment, pointed
    at this process's database, unbuffered output, then ``extra``."""
    return {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1", **extra}


class DrillWorker:
    """``celery worker --pool threads`` subprocess on this process's settings and database."""

    def __init__(
        self,
        name: str,
        log_dir: Path,
        *,
        queues: list[str],
        extra_env: dict[str, str] | None = None,
        python: str | None = None,
    ):
        """``python``: the interpreter to run Celery with (default this one; ``.venv-vllm/bin/python`` for a
        worker with the vLLM backend)."""
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        env = child_env(**(extra_env or {}))
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                python or sys.executable,
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
                ",".join(queues),
                "-n",
                f"{name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel",
                "INFO",
            ],  # fmt: skip
            cwd=settings.BASE_DIR,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 240.0) -> None:
        """Wait until the worker's engine is loaded; raises RuntimeError if it exited, TimeoutError after
        ``timeout`` seconds (each with the end of its log)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"worker {self.name} exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}"
                )
            if READY_LINE in self.log_path.read_text():
                return
            time.sleep(0.3)
        raise TimeoutError(
            f"worker {self.name} not ready after {timeout} s:\n{self.log_path.read_text()[-3000:]}"
        )

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (warm shutdown), SIGKILL after ``timeout`` seconds."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
