"""What a worker asks Redis for when a reply starts (``conversations.reply_runner``, lever 44 in
``docs/overhead-levers.md``): nothing between the claim and the engine's submit, then one pipeline with the
``started`` frame, the reply's lease and the Stop flag's read; the lease is held while the reply generates and
released after; a Stop pressed before the engine had the request still cancels it. Real PostgreSQL and Redis,
a real engine over a tiny random-weight Llama (no Celery: ``run_generation`` is what the task calls)."""

import pytest

from billing.models import Tier
from conversations import generations
from conversations.models import Message
from conversations.reply_runner import run_generation
from events import broadcast
from inference.worker import WorkerHost

pytestmark = pytest.mark.django_db


def _submit_spy(engine, monkeypatch, log, reply_id):
    seen = {}
    submit = engine.submit

    def spied(*args, **kwargs):
        log.append(("submit", None))
        seen["lease_at_submit"] = broadcast.redis_client().exists(broadcast.lease_key(reply_id))
        return submit(*args, **kwargs)

    monkeypatch.setattr(engine, "submit", spied)
    return seen


def test_a_reply_takes_its_lease_with_its_started_frame_in_one_round_trip_after_the_submit(
    alice, redis_clean, engine, monkeypatch, redis_log
):
    Tier.objects.filter(pk=alice.tier_id).update(max_reply_tokens=4)
    ticket = generations.reply_request(user=alice, conversation_id=None, content="Count to ten.")
    reply_id = ticket.message.id
    seen = _submit_spy(engine, monkeypatch, redis_log, reply_id)
    host = WorkerHost(engine)
    held = []
    publish, publish_many = broadcast.publish, broadcast.publish_many

    def publish_and_look(message_id, frame):  # a delta handed to the reply's thread (a check was due)
        held.append(broadcast.redis_client().get(broadcast.lease_key(message_id)))
        publish(message_id, frame)

    def publish_many_and_look(frames):  # the publisher thread's deltas: is the lease held meanwhile?
        held.extend(broadcast.redis_client().get(broadcast.lease_key(message_id)) for message_id, _ in frames)
        publish_many(frames)

    monkeypatch.setattr(broadcast, "publish", publish_and_look)
    monkeypatch.setattr(broadcast, "publish_many", publish_many_and_look)
    del redis_log[:]

    assert run_generation(message_id=reply_id, host=host) == "completed"

    submit_at = redis_log.index(("submit", None))
    assert not seen["lease_at_submit"]
    assert redis_log[:submit_at] == []  # nothing between the claim and the submit
    kind, names = redis_log[submit_at + 2]  # after the spy's own EXISTS
    assert kind == "pipeline"
    assert names == ["SET", "PUBLISH", "SET", "EXISTS"]  # progress, the frame, the lease, the Stop flag
    assert held and set(held) == {host.worker_id.encode()}
    assert not broadcast.redis_client().exists(broadcast.lease_key(reply_id))  # released at the end


def test_a_stop_pressed_before_the_engine_had_the_request_cancels_it(alice, redis_clean, engine):
    Tier.objects.filter(pk=alice.tier_id).update(max_reply_tokens=64)
    ticket = generations.reply_request(user=alice, conversation_id=None, content="Count to ten.")
    broadcast.request_cancel(ticket.message.id)

    assert run_generation(message_id=ticket.message.id, host=WorkerHost(engine)) == Message.Status.CANCELLED
    assert Message.objects.get(pk=ticket.message.id).status == Message.Status.CANCELLED
