"""The worker's one publisher thread for every reply's deltas (``conversations.delta_publisher``, lever 50 in
``docs/overhead-levers.md``): the deltas several replies delivered in one engine step leave in one Redis round
trip; a delta at which a moderation check is due, and every later one, goes through the reply's own thread,
which checks and publishes it and hands the reply back; every reply's replay stream holds its deltas in order.
Real Redis, the deployed pub/sub channel layer and a real engine over a tiny random-weight Llama."""

import threading

import pytest
from django.db import connection

from billing.models import Tier
from conversations import delta_publisher, generations
from conversations.delta_publisher import PUBLISHER, DeltaPublisher, ReplyFeed
from conversations.models import Message
from conversations.reply_runner import run_generation
from events import broadcast
from inference.engine import SamplingParams, TokenEvent
from inference.worker import WorkerHost
from observability.metrics import ReplyTimer
from safety.streaming import OutputMonitor
from tests.db.conftest import finished_streams, wait_idle

pytestmark = pytest.mark.django_db


def _replay(message_id: int) -> list[tuple[int, str]]:
    entries = broadcast.redis_client().xrange(broadcast.stream_key(message_id))
    return [(int(fields[b"seq"]), fields[b"text"].decode()) for _id, fields in entries]


def _feed(handle, message_id, tier, every_tokens):
    monitor = OutputMonitor(tier=tier, every_tokens=every_tokens)
    timer = ReplyTimer(model="tiny", tier=tier.name)
    return ReplyFeed(handle, message_id=message_id, monitor=monitor, timer=timer)


def test_the_deltas_of_several_replies_leave_in_one_round_trip(
    alice, redis_clean, engine, redis_log, settings
):
    settings.SAFETY_GUARDS = ["tests.safety_guards.PhraseGuard"]
    handles = finished_streams(engine, 3, tokens=6)
    feeds = [_feed(h, 9001 + i, alice.tier, every_tokens=1000) for i, h in enumerate(handles)]
    del redis_log[:]

    DeltaPublisher().publish_round(feeds)

    pipelines = [names for kind, names in redis_log if kind == "pipeline"]
    assert len(pipelines) == 1 and [kind for kind, _ in redis_log] == ["pipeline"]
    deltas = pipelines[0].count("XADD")
    assert deltas >= 3 and pipelines[0] == ["XADD", "EXPIRE", "PUBLISH"] * deltas
    for feed in feeds:
        assert list(feed.signals()) == ["first"]  # then the finish, passed on after the round trip
        assert feed.final.finish_reason == "length"
        replay = _replay(feed.message_id)
        assert [seq for seq, _ in replay] == list(range(len(replay)))
        assert "".join(text for _, text in replay) == feed.final.text
        assert feed.first_publish is not None and feed.monitor.checks == 0


def test_a_delta_due_for_a_check_and_every_later_one_go_through_the_reply_thread(
    alice,
    redis_clean,
    engine,
    redis_log,
    settings,
):
    settings.SAFETY_GUARDS = ["tests.safety_guards.PhraseGuard"]
    (handle,) = finished_streams(engine, 1, tokens=8)
    feed = _feed(handle, 9100, alice.tier, every_tokens=3)
    del redis_log[:]

    DeltaPublisher().publish_round([feed])

    # The deltas before the one that makes 3 tokens were published by the round; none after it.
    (first_round,) = [names for kind, names in redis_log if kind == "pipeline"]
    by_publisher = first_round.count("XADD")
    assert 1 <= by_publisher < 8
    assert feed.owner != PUBLISHER
    assert len(_replay(feed.message_id)) == by_publisher

    # The reply's thread hears of the round's first publish, then checks and publishes the rest itself.
    assert list(feed.signals()) == ["first"]
    replay = _replay(feed.message_id)
    assert [seq for seq, _ in replay] == list(range(len(replay))) and len(replay) > by_publisher
    assert "".join(text for _, text in replay) == feed.final.text
    assert feed.monitor.checks >= 1
    assert feed.owner == PUBLISHER  # caught up: handed back


def test_a_check_that_blocks_cuts_the_reply_and_publishes_nothing_after_it(
    alice, redis_clean, engine, settings
):
    settings.SAFETY_GUARDS = ["tests.safety_guards.OutputAlwaysGuard"]
    (handle,) = finished_streams(engine, 1, tokens=8)
    feed = _feed(handle, 9200, alice.tier, every_tokens=3)

    DeltaPublisher().publish_round([feed])
    published = len(_replay(feed.message_id))
    list(feed.signals())

    assert feed.blocked is not None and feed.blocked.blocked
    assert len(_replay(feed.message_id)) == published  # the due delta and the later ones: never published
    assert feed.owner != PUBLISHER


def test_the_engine_wakes_the_publisher_and_it_drains_what_came_before_the_follow(alice, redis_clean, engine):
    (handle,) = finished_streams(engine, 1, tokens=5)  # all delivered before the publisher follows it
    monitor = OutputMonitor(tier=alice.tier, every_tokens=1000)
    feed = delta_publisher.follow(
        handle, message_id=9300, monitor=monitor, timer=ReplyTimer(model="t", tier="free")
    )
    assert list(feed.signals()) == ["first"]
    assert "".join(text for _, text in _replay(9300)) == feed.final.text


@pytest.mark.django_db(
    transaction=True
)  # the replies run on threads of their own, with connections of their own
def test_replies_decoding_together_stream_every_delta_in_order_with_checks_due(
    alice, redis_clean, engine, settings
):
    """Through the task's own entry point on several threads at once: the publisher thread, the reply threads'
    checks and the hand-backs interleave for real; every reply's replay stream is its stored text, in order."""
    settings.SAFETY_GUARDS = ["tests.safety_guards.PhraseGuard"]
    settings.SAFETY_OUTPUT_CHECK_EVERY_TOKENS = 2
    Tier.objects.filter(pk=alice.tier_id).update(max_reply_tokens=20, max_concurrent_generations=4)
    tickets = [
        generations.reply_request(user=alice, conversation_id=None, content=f"Tell me story {i}.")
        for i in range(4)
    ]
    host = WorkerHost(engine)
    results = {}

    def run(message_id):
        try:
            results[message_id] = run_generation(message_id=message_id, host=host)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(t.message.id,)) for t in tickets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    for ticket in tickets:
        reply = Message.objects.get(pk=ticket.message.id)
        assert results[reply.id] == reply.status == "completed"
        replay = _replay(reply.id)
        assert [seq for seq, _ in replay] == list(range(len(replay)))
        assert "".join(text for _, text in replay) == reply.content


def test_the_engine_handle_drains_without_blocking_and_wakes_its_follower(engine):
    woken = []
    handle = engine.submit([1, 2, 3], SamplingParams(temperature=0, max_new_tokens=4))
    handle.set_waker(lambda: woken.append(1))
    wait_idle(engine)
    events = handle.drain()
    assert events and isinstance(events[0], TokenEvent) and events[-1].finish_reason == "length"
    assert woken  # the engine's thread called it
    assert handle.drain() == [] and handle.finished
