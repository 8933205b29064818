"""The queued-reply reaper: queued replies that no broker message may deliver are dispatched again, more
rarely as they age, and a duplicate delivery generates nothing twice (the ``queued -> streaming`` claim)."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from conversations import generation_worker, generations, reaper
from conversations.models import Message

pytestmark = pytest.mark.django_db


def queued_reply(user, *, age_s=0.0, dispatched_s_ago=0.0):
    ticket = generations.reply_request(user=user, conversation_id=None, content="hello")
    now = timezone.now()
    Message.objects.filter(pk=ticket.message.id).update(
        created_at=now - timedelta(seconds=age_s), updated_at=now - timedelta(seconds=dispatched_s_ago)
    )
    return ticket.message.id


def test_a_reply_queued_too_long_is_dispatched_again_once_per_period(
    alice, redis_clean, django_capture_on_commit_callbacks
):
    fresh = queued_reply(alice)
    assert reaper.generations_redispatch_queued(after_s=20) == []
    Message.objects.filter(pk=fresh).update(status=Message.Status.CANCELLED)
    stale = queued_reply(alice, age_s=30, dispatched_s_ago=30)
    with django_capture_on_commit_callbacks(execute=False) as dispatched:
        assert reaper.generations_redispatch_queued(after_s=20) == [stale]
    assert len(dispatched) == 1  # one task sent, on commit
    assert (timezone.now() - Message.objects.get(pk=stale).updated_at).total_seconds() < 5
    assert reaper.generations_redispatch_queued(after_s=20) == []  # not again within the period
    assert Message.objects.get(pk=stale).status == Message.Status.QUEUED


def test_a_long_waiting_reply_is_dispatched_again_ever_more_rarely(alice, redis_clean):
    waiting = queued_reply(alice, age_s=600, dispatched_s_ago=100)  # 100 s < half its age: leave it
    assert reaper.generations_redispatch_queued(after_s=20) == []
    Message.objects.filter(pk=waiting).update(updated_at=timezone.now() - timedelta(seconds=301))
    assert reaper.generations_redispatch_queued(after_s=20) == [waiting]


def test_only_queued_replies_are_dispatched_again(alice, bob, redis_clean):
    streaming = queued_reply(alice, age_s=60, dispatched_s_ago=60)
    generation_worker.generation_start(message_id=streaming)
    Message.objects.filter(pk=streaming).update(updated_at=timezone.now() - timedelta(seconds=60))
    done = queued_reply(bob, age_s=60, dispatched_s_ago=60)
    Message.objects.filter(pk=done).update(status=Message.Status.COMPLETED)
    assert reaper.generations_redispatch_queued(after_s=20) == []


def test_duplicate_deliveries_generate_once(alice, redis_clean):
    message_id = queued_reply(alice, age_s=60, dispatched_s_ago=60)
    assert reaper.generations_redispatch_queued(after_s=20) == [message_id]
    # The original message and the re-dispatched one both arrive: only one claim succeeds.
    claims = [generation_worker.generation_start(message_id=message_id) for _ in range(2)]
    assert claims[0] is not None and claims[1] is None
    assert Message.objects.get(pk=message_id).status == Message.Status.STREAMING


def test_reap_command_also_redispatches(alice, redis_clean, settings):
    settings.QUEUED_REDISPATCH_S = 20
    message_id = queued_reply(alice, age_s=60, dispatched_s_ago=60)
    from io import StringIO

    out = StringIO()
    call_command("reap_interrupted", stdout=out)
    assert f"re-dispatched 1 queued reply(ies): [{message_id}]" in out.getvalue()
