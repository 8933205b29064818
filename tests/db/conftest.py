"""Database-layer fixtures: a published idle fleet, so admission control finds a live worker.

Admission refuses every request with ``no_workers`` when no worker has published its status (see
``conversations/load.py``). Database-layer tests run no worker process, so every test here gets one idle
worker status per registered model written to the test Redis through the real ``inference.fleet.publish``
path (a long TTL instead of the 1 s refresh). Tests of the fleet or of admission under load opt out with
``@pytest.mark.real_fleet`` and publish what they need themselves.
"""

import json
import logging
import threading
from dataclasses import asdict

import pytest
import redis


def wait_idle(engine) -> None:
    """Wait until ``engine`` (the module's ``engine`` fixture) has no request waiting or running, then for its
    last step's events and step listeners, which run after the counts drop."""
    while engine.load().running or engine.load().waiting:
        threading.Event().wait(0.01)
    threading.Event().wait(0.05)


def finished_streams(engine, count: int, tokens: int):
    """``count`` requests of ``tokens`` tokens each on ``engine``, generated to the end (:func:`wait_idle`): every
    event waits in its handle. Returns the handles."""
    from inference.engine import SamplingParams

    handles = [
        engine.submit([1, 2, 3, 4 + i], SamplingParams(temperature=0, max_new_tokens=tokens))
        for i in range(count)
    ]
    wait_idle(engine)
    return handles


def fake_worker(model: str, *, index: int = 0, **load):
    """A :class:`~inference.fleet.WorkerStatus` of a ready worker serving ``model`` with ``load`` figures."""
    from inference import fleet

    load.setdefault("max_num_seqs", 32)
    return fleet.WorkerStatus(
        worker_id=f"test-fleet-{model}:{index}",
        host="test-fleet",
        pid=index,
        model=model,
        ready=True,
        **load,
    )


def publish_worker(status, *, ttl_s: int = 300) -> None:
    """Publish ``status`` like a worker does, with a TTL long enough for a slow test."""
    import time

    from conversations import load
    from events import broadcast
    from inference import fleet

    status.updated_at = time.time()
    broadcast.redis_client().set(fleet.status_key(status.worker_id), json.dumps(asdict(status)), ex=ttl_s)
    load.forget_reads()


def clear_fleet() -> None:
    from conversations import load
    from events import broadcast
    from inference import fleet, rollout

    client = broadcast.redis_client()
    keys = list(client.scan_iter(match=f"{fleet.KEY_PREFIX}*", count=1000))
    if keys:
        client.delete(*keys)
    load.clear_cache()
    rollout.forget_rollouts()  # a rollout row cached from another test's rolled-back transaction


@pytest.fixture(autouse=True)
def idle_fleet(request):
    """One idle worker per registered model (unless the test is marked ``real_fleet``)."""
    if "redis_clean" in request.fixturenames:
        request.getfixturevalue("redis_clean")  # it empties chatsite:* keys: let it run first
    if request.node.get_closest_marker("real_fleet"):
        clear_fleet()
        yield
        clear_fleet()
        return
    from django.conf import settings

    clear_fleet()
    for model in settings.INFERENCE_MODELS:
        publish_worker(fake_worker(model))
    yield
    clear_fleet()


class LogRecords(logging.Handler):
    """Collects records with the log-context fields set (``request_id``, ``message_id``, ``user_id``,
    ``trace_id``), as the configured console handler sees them."""

    def __init__(self):
        from observability.logs import ContextFilter

        super().__init__(logging.DEBUG)
        self.addFilter(ContextFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def api_logs():
    """The records the ``api`` package logs at INFO and above during the test."""
    handler = LogRecords()
    logger = logging.getLogger("api")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(previous)


@pytest.fixture(scope="module")
def engine():
    """A started engine over the tiny random-weight Llama (``tests/db/tiny_model.py``), 4 sequences, one CPU
    thread, shared by a module's tests: what ``WorkerHost(engine)`` and ``run_generation`` run replies on."""
    from inference.engine import EngineConfig, LLMEngine
    from tests.db.tiny_model import tiny_loaded_model

    engine = LLMEngine(tiny_loaded_model(), EngineConfig(max_num_seqs=4, device="cpu", num_threads=1))
    engine.start()
    yield engine
    engine.shutdown()


@pytest.fixture
def redis_log(monkeypatch):
    """Every Redis command the process sends, in order: ``("cmd", name)`` for one on its own, ``("pipeline",
    [names])`` for a pipeline's batch."""
    log = []
    command, execute = redis.Redis.execute_command, redis.client.Pipeline.execute

    def logged_command(self, *args, **options):
        if not isinstance(self, redis.client.Pipeline):
            log.append(("cmd", str(args[0]).upper()))
        return command(self, *args, **options)

    def logged_execute(self, *args, **kwargs):
        log.append(("pipeline", [str(c[0][0]).upper() for c in self.command_stack]))
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "execute_command", logged_command)
    monkeypatch.setattr(redis.client.Pipeline, "execute", logged_execute)
    return log
