"""An admitted free reply is served under continuous paid load (priority ageing), through the product path:
admission and storage by ``generations.reply_request``, the worker adapter ``run_generation`` (what the Celery
task runs) submitting with the tier's ``queue_priority``, and a real engine configured from settings
(``inference.registry.engine_config``: ``INFERENCE_MAX_NUM_SEQS``, ``INFERENCE_PRIORITY_AGEING_S``) over a
tiny random-weight Llama. Real PostgreSQL and Redis; client threads stand in for the worker's task threads.

Paid clients keep more replies in the engine than it has slots, so paid requests are always waiting. The
bound (docs/tiers-under-load.md): a claimed free (priority 0) request outranks every paid (10) request
arriving more than ``10 x INFERENCE_PRIORITY_AGEING_S`` after it, so it starts at the latest once the requests
already waiting ahead of it then have started, and completes while the paid stream goes on. With ageing off it is starved
for as long as the paid stream lasts (the contrast that shows the test can fail).
"""

import math
import threading
import time
from dataclasses import dataclass

import pytest
from django.db import connection

from billing.models import Tier
from conversations import generations
from conversations.models import Message
from conversations.reply_runner import run_generation
from inference.engine import LLMEngine
from inference.registry import engine_config
from inference.worker import WorkerHost
from safety.policies import policy_cache_clear
from tests.db.tiny_model import tiny_loaded_model

pytestmark = pytest.mark.django_db(transaction=True)

AGEING_S = 0.25
MAX_NUM_SEQS = 2
#: More paid clients than engine slots: PAID_CLIENTS - MAX_NUM_SEQS paid requests wait at any time.
PAID_CLIENTS = 12
#: Priority levels a free request climbs to outrank new paid ones (paid 10 - free 0).
PRIORITY_GAP = 10
REPLY_TOKENS = 16


@dataclass
class Served:
    tier: str
    message_id: int
    requested: float  # time.monotonic() before reply_request
    finished: float  # after run_generation returned
    status: str


class Traffic:
    """Client threads that send through ``reply_request`` and run their reply like a worker task thread."""

    def __init__(self, host: WorkerHost):
        self.host = host
        self.stop = threading.Event()
        self.served: list[Served] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _one(self, user, content: str, started: dict | None = None) -> None:
        requested = time.monotonic()
        ticket = generations.reply_request(user=user, conversation_id=None, content=content)
        if started is not None:
            started["message_id"] = ticket.message.id
        status = run_generation(message_id=ticket.message.id, host=self.host)
        with self._lock:
            self.served.append(Served(user.tier.name, ticket.message.id, requested, time.monotonic(), status))

    def _thread(self, body) -> threading.Thread:
        def run():
            try:
                body()
            except BaseException as exc:  # reported by the test, not lost in a thread
                self.errors.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def paid_stream(self, user) -> None:
        def loop():
            while not self.stop.is_set():
                self._one(user, "Tell me a long story about a paid request.")

        self._thread(loop)

    def free_reply(self, user) -> dict:
        """Send one free reply in its own thread; the returned dict gets ``message_id`` once it is stored."""
        started: dict = {}
        self._thread(lambda: self._one(user, "Am I served too?", started))
        return started

    def finish(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(60)
        assert not self.errors, self.errors

    def of(self, message_id: int) -> Served | None:
        with self._lock:
            return next((s for s in self.served if s.message_id == message_id), None)

    def paid(self) -> list[Served]:
        with self._lock:
            return [s for s in self.served if s.tier == "paid"]


@pytest.fixture
def start_traffic(settings, make_user, redis_clean):
    """``start_traffic(ageing_s)``: paid load (``PAID_CLIENTS`` clients) on a worker whose engine has
    ``MAX_NUM_SEQS`` slots and ``INFERENCE_PRIORITY_AGEING_S=ageing_s``; returns ``(traffic, engine,
    free_user)`` once paid requests are waiting in the engine."""
    running = []

    def start(ageing_s: float):
        settings.INFERENCE_MAX_NUM_SEQS = MAX_NUM_SEQS
        settings.INFERENCE_PRIORITY_AGEING_S = ageing_s
        settings.INFERENCE_DEVICE = "cpu"
        settings.INFERENCE_NUM_THREADS = 1
        settings.INFERENCE_ADAPTIVE_THREADS = False
        # The tiny random-weight model's text is random: now and then the output chain's profanity classifier
        # blocked a reply (status "blocked"), which says nothing about the scheduling these tests are about.
        settings.SAFETY_MODERATE_OUTPUT = False
        policy_cache_clear()  # a tier's policy read by an earlier test would still carry the setting
        engine = LLMEngine(tiny_loaded_model(), engine_config())
        assert (engine.config.max_num_seqs, engine.config.priority_ageing_s) == (
            MAX_NUM_SEQS,
            ageing_s or None,
        )
        engine.start()
        make_user("filler")  # creates the default tiers
        Tier.objects.update(
            max_reply_tokens=REPLY_TOKENS,
            requests_per_minute=100_000,
            max_concurrent_generations=PAID_CLIENTS,
        )
        # One user per paid client, as many paid users would be (one user's requests serialize on its quota row).
        paid = [make_user(f"paid{i}", tier="paid") for i in range(PAID_CLIENTS)]
        free = make_user("fred")
        assert paid[0].tier.queue_priority - free.tier.queue_priority == PRIORITY_GAP
        traffic = Traffic(WorkerHost(engine))
        running.append((traffic, engine))
        for user in paid:
            traffic.paid_stream(user)
        _wait_for(
            lambda: engine.load().waiting >= PAID_CLIENTS - MAX_NUM_SEQS and len(traffic.paid()) >= 4, 60
        )
        return traffic, engine, free

    yield start
    for traffic, engine in running:
        try:
            traffic.finish()
        finally:
            engine.shutdown()


def _wait_for(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _bound_s(served: list[Served]) -> float:
    """The longest a claimed free reply may take to complete under this paid load (s): outranking new paid
    requests takes ``PRIORITY_GAP x AGEING_S``; then the paid requests already waiting (at most
    ``PAID_CLIENTS - MAX_NUM_SEQS``) start as slots free up, one slot per longest decode phase of these
    replies; then the free reply runs itself. x 1.5 and + 1 s of slack for a busy 2-core box."""
    replies = Message.objects.filter(pk__in=[s.message_id for s in served], status="completed")
    slot_s = max((m.duration_ms - m.ttft_ms) / 1000 for m in replies)
    rounds = math.ceil((PAID_CLIENTS - MAX_NUM_SEQS) / MAX_NUM_SEQS) + 1 + 1
    return PRIORITY_GAP * AGEING_S + rounds * slot_s * 1.5 + 1.0


def test_an_admitted_free_reply_completes_within_the_bound_while_paid_replies_keep_arriving(start_traffic):
    traffic, engine, free = start_traffic(AGEING_S)
    sent = traffic.free_reply(free)
    _wait_for(lambda: traffic.of(sent.get("message_id", -1)) is not None, 120)
    served = traffic.of(sent["message_id"])
    assert not traffic.stop.is_set() and served.status == "completed"
    waited_s = served.finished - served.requested

    # The paid stream went on throughout: paid requests sent after the free one were served before it
    # finished, and paid replies keep being served after it.
    overtook = [p for p in traffic.paid() if p.requested > served.requested and p.finished < served.finished]
    assert len(overtook) >= MAX_NUM_SEQS
    _wait_for(lambda: len([p for p in traffic.paid() if p.requested > served.finished]) >= MAX_NUM_SEQS, 60)

    bound_s = _bound_s(traffic.paid() + [served])
    print(f"free reply waited {waited_s:.2f} s (bound {bound_s:.2f} s); {len(overtook)} paid overtook it")
    assert waited_s <= bound_s, (waited_s, bound_s)


def test_without_ageing_the_free_reply_is_starved_until_the_paid_stream_stops(start_traffic):
    traffic, engine, free = start_traffic(0)  # INFERENCE_PRIORITY_AGEING_S=0: strict priority
    sent = traffic.free_reply(free)
    _wait_for(lambda: "message_id" in sent, 60)
    request_id = f"msg-{sent['message_id']}"
    _wait_for(lambda: engine.queue_position(request_id) is not None, 60)
    paid_before = len(traffic.paid())
    window_end = time.monotonic() + _bound_s(traffic.paid())  # the bound that ageing keeps (test above)
    while time.monotonic() < window_end:
        assert engine.queue_position(request_id) is not None, "the free request left the waiting queue"
        time.sleep(0.02)
    assert len(traffic.paid()) - paid_before >= 2 * MAX_NUM_SEQS  # paid replies were served meanwhile
    traffic.stop.set()  # the paid stream ends: the free reply is served, nothing is lost
    _wait_for(lambda: traffic.of(sent["message_id"]) is not None, 120)
    assert traffic.of(sent["message_id"]).status == "completed"
