"""Lever 48 (docs/overhead-levers.md): a reply's quota reservation rides in admission's read of the user
(``conversations/admission_reads.py``, ``billing.quota.CARRIED_RESERVE_SQL``). It holds what the upsert of its own
held, a refusal after the read releases it with the transaction, a full quota refuses with what is left, and a
reservation above the daily limit (which only a grant makes room for) still takes the old path."""

import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from billing.models import DailyQuota, QuotaReservation, Tier
from billing.quota import quota_day
from conversations import generations
from conversations.admission import AdmissionRefused, admission_check
from conversations.models import Message
from tests.conftest import broker_take

pytestmark = pytest.mark.django_db

QUEUE = "inference.smollm2-135m-instruct"


def send(user, content="Hello"):
    return generations.reply_request(
        user=user, conversation_id=None, content=content, client_id=uuid.uuid4(), resend=False
    )


def test_a_send_reserves_its_quota_in_admissions_read(alice, redis_clean):
    with CaptureQueriesContext(connection) as queries:
        ticket = send(alice)
    broker_take(QUEUE)
    quota_writes = [q["sql"] for q in queries.captured_queries if "billing_dailyquota" in q["sql"]]
    assert len(quota_writes) == 1 and "reserve AS (" in quota_writes[0]  # one statement: the read carries it
    held = QuotaReservation.objects.get(message=ticket.message)
    row = DailyQuota.objects.get(user=alice, day=quota_day())
    assert (row.reserved_tokens, row.used_tokens) == (held.tokens, 0) and held.tokens > 0
    assert held.quota_id == row.pk

    Message.objects.filter(pk=ticket.message.pk).update(status=Message.Status.COMPLETED)  # not settled
    second = send(alice, "Again")  # the day's row exists now: the upsert's conflict branch adds to it
    broker_take(QUEUE)
    row.refresh_from_db()
    assert row.reserved_tokens == held.tokens + QuotaReservation.objects.get(message=second.message).tokens


def test_a_refusal_after_the_read_releases_the_carried_reservation(alice, redis_clean):
    send(alice)  # queued: the free tier allows one reply at a time
    broker_take(QUEUE)
    before = DailyQuota.objects.get(user=alice, day=quota_day()).reserved_tokens

    with pytest.raises(AdmissionRefused) as refused:
        send(alice, "And another")

    assert refused.value.code == "too_many_generations"
    assert DailyQuota.objects.get(user=alice, day=quota_day()).reserved_tokens == before
    assert Message.objects.filter(conversation__owner=alice).count() == 2  # nothing of the refused send


def test_a_full_quota_refuses_with_what_is_left_and_holds_nothing(alice, redis_clean):
    limit = alice.tier.tokens_per_day
    DailyQuota.objects.create(user=alice, day=quota_day(), used_tokens=limit - 50)

    with pytest.raises(AdmissionRefused) as refused:
        send(alice)

    assert refused.value.code == "quota_exceeded" and "50 of today's quota are left" in refused.value.message
    row = DailyQuota.objects.get(user=alice, day=quota_day())
    assert (row.used_tokens, row.reserved_tokens) == (limit - 50, 0)
    assert not Message.objects.filter(conversation__owner=alice).exists()


def test_a_reservation_above_the_daily_limit_is_made_room_for_by_a_grant_only(alice, redis_clean):
    Tier.objects.filter(pk=alice.tier_id).update(tokens_per_day=100)
    alice.tier.refresh_from_db()
    with pytest.raises(AdmissionRefused), transaction.atomic():
        admission_check(user=alice, prompt_tokens_bound=200)
    DailyQuota.objects.update_or_create(user=alice, day=quota_day(), defaults={"granted_tokens": 1000})

    with transaction.atomic():
        admission = admission_check(user=alice, prompt_tokens_bound=200)
        assert admission.quota.reserved_tokens == admission.reserved_tokens > 100
        transaction.set_rollback(True)
