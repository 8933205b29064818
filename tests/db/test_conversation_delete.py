"""Deleting a conversation whose reply is still queued or streaming (``conversations.services.conversation_delete``):
the reply's quota reservation is released with the deletion, its worker is asked to cancel once the deletion is
committed, and the worker's final write of a reply that is gone charges what it generated instead of failing."""

import pytest
from django.db import IntegrityError

from accounts.services import ACTIVE_REPLY_STATUSES, account_delete
from billing.models import DailyQuota, QuotaReservation, UsageRecord
from billing.quota import quota_status
from conversations import generation_worker, generations, services
from conversations.models import Conversation, Message
from documents.retrieval import Cited, citations_record
from events import broadcast
from tests.conftest import broker_take

pytestmark = pytest.mark.django_db

QUEUE = "inference.smollm2-135m-instruct"


def queued_reply(user):
    ticket = generations.reply_request(user=user, conversation_id=None, content="Tell me a long story")
    broker_take(QUEUE)
    return ticket.message


def delete(message, capture):
    with capture(execute=True):
        services.conversation_delete(conversation=Conversation.objects.get(pk=message.conversation_id))


def test_deleting_a_queued_reply_releases_its_reservation_and_its_task_skips_it(
    alice, redis_clean, django_capture_on_commit_callbacks
):
    message = queued_reply(alice)
    assert quota_status(user=alice).reserved > 0

    delete(message, django_capture_on_commit_callbacks)

    status = quota_status(user=alice)
    assert (status.reserved, status.used) == (0, 0)
    assert not QuotaReservation.objects.exists() and not Message.objects.filter(pk=message.pk).exists()
    assert broadcast.cancel_requested(message.id)  # asked after the commit
    assert generation_worker.generation_start(message_id=message.id) is None  # the task arrives: skipped


def test_a_reply_deleted_while_streaming_is_charged_what_it_generated(
    alice, redis_clean, django_capture_on_commit_callbacks
):
    claimed = generation_worker.generation_start(message_id=queued_reply(alice).id)
    generation_worker.generation_set_context(message=claimed, omitted=0, prompt_tokens=12)
    assert Message.objects.get(pk=claimed.pk).prompt_tokens == 12

    delete(claimed, django_capture_on_commit_callbacks)
    assert broadcast.cancel_requested(claimed.id)
    assert quota_status(user=alice).reserved == 0
    # The cancel reaches the worker after its first delta: recording the context writes nothing, raises nothing.
    generation_worker.generation_set_context(message=claimed, omitted=0, prompt_tokens=12)

    with django_capture_on_commit_callbacks(execute=False) as published:
        ended = generation_worker.generation_finish(
            message=claimed,
            status=Message.Status.CANCELLED,
            text="Once upon",
            finish_reason="cancelled",
            prompt_tokens=12,
            completion_tokens=3,
        )

    assert (ended.status, ended.content) == (Message.Status.CANCELLED, "Once upon")
    assert len(published) == 1  # `done`, for a client still following the reply
    status = quota_status(user=alice)
    assert (status.reserved, status.used) == (0, 15)
    record = UsageRecord.objects.get(user=alice)
    assert (record.message_id, record.prompt_tokens, record.completion_tokens) == (None, 12, 3)
    assert not Message.objects.filter(pk=claimed.pk).exists()


def test_a_reply_that_ended_before_the_deletion_is_charged_once(
    alice, redis_clean, django_capture_on_commit_callbacks
):
    claimed = generation_worker.generation_start(message_id=queued_reply(alice).id)
    generation_worker.generation_finish(
        message=claimed,
        status=Message.Status.COMPLETED,
        text="The end.",
        prompt_tokens=12,
        completion_tokens=4,
    )

    delete(claimed, django_capture_on_commit_callbacks)

    assert not broadcast.cancel_requested(claimed.id)  # nothing was active
    status = quota_status(user=alice)
    assert (status.reserved, status.used) == (0, 16)
    assert UsageRecord.objects.get(user=alice).message_id is None  # the link cleared, the counts kept


def test_a_reply_whose_account_was_deleted_is_cancelled_and_ends_without_charging_anyone(
    alice, redis_clean, django_capture_on_commit_callbacks
):
    claimed = generation_worker.generation_start(message_id=queued_reply(alice).id)
    with django_capture_on_commit_callbacks(execute=True):
        account_delete(user=alice)
    assert broadcast.cancel_requested(claimed.id)

    ended = generation_worker.generation_finish(
        message=claimed, status=Message.Status.COMPLETED, text="Hi", prompt_tokens=12, completion_tokens=2
    )

    assert ended.status == Message.Status.COMPLETED
    assert not UsageRecord.objects.exists() and not DailyQuota.objects.exists()


@pytest.mark.django_db(transaction=True)  # the foreign keys are deferred: checked when the insert commits
def test_citations_of_a_reply_deleted_meanwhile_record_nothing_and_other_refusals_still_raise(
    alice, redis_clean, django_capture_on_commit_callbacks
):
    claimed = generation_worker.generation_start(message_id=queued_reply(alice).id)
    unknown_chunk = [Cited(marker=1, chunk_id=10**9, score=0.5)]
    with pytest.raises(IntegrityError):  # the reply exists: the refusal is the chunk's, not a deletion
        citations_record(reply_id=claimed.id, cited=unknown_chunk)

    delete(claimed, django_capture_on_commit_callbacks)

    assert citations_record(reply_id=claimed.id, cited=unknown_chunk) == []


def test_accounts_names_the_active_statuses_that_conversations_defines():
    assert set(ACTIVE_REPLY_STATUSES) == set(Message.ACTIVE_STATUSES)
