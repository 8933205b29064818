"""The daily token quota: reserved at admission, settled at the end, exact under concurrency."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from billing.models import DailyQuota, QuotaGrant, QuotaReservation, Tier, UsageRecord
from billing.quota import QuotaExceeded, quota_day, quota_grant, quota_reserve, quota_settle, quota_status
from conversations import generation_worker, generations, reaper, reply_control
from conversations.admission import AdmissionRefused
from conversations.models import Message

LIMIT = 10_000


def near_limit_tier(*, used: int, user):
    Tier.objects.filter(name="paid").update(
        tokens_per_day=LIMIT,
        max_reply_tokens=100,
        max_context_tokens=1000,
        max_concurrent_generations=100,
        requests_per_minute=1000,
    )
    user.refresh_from_db()
    DailyQuota.objects.create(user=user, day=quota_day(), used_tokens=used)


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_requests_near_the_limit_never_pass_the_quota(make_user, redis_clean):
    carol = make_user("carol", tier="paid")
    near_limit_tier(used=LIMIT - 1000, user=carol)
    # Each new one-word conversation reserves prompt bound (2 bytes + 64 + 8 * 2 template tokens) + 100.
    per_request = 2 + 64 + 16 + 100
    results: list[object] = []
    barrier = threading.Barrier(20)

    def one(i: int):
        from accounts.models import User

        user = User.objects.select_related("tier").get(pk=carol.pk)
        barrier.wait()
        try:
            results.append(generations.reply_request(user=user, conversation_id=None, content=f"{i:02d}"))
        except AdmissionRefused as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    admitted = [r for r in results if isinstance(r, generations.ReplyTicket)]
    refused = [r for r in results if isinstance(r, AdmissionRefused)]
    assert len(admitted) == 1000 // per_request == 5
    assert len(refused) == 15 and {r.code for r in refused} == {"quota_exceeded"}
    row = DailyQuota.objects.get(user=carol)
    assert row.used_tokens + row.reserved_tokens <= LIMIT
    assert (
        row.reserved_tokens
        == 5 * per_request
        == QuotaReservation.objects.filter(quota=row).count() * per_request
    )
    assert Message.objects.filter(role="assistant", status="queued").count() == 5

    # Each reply ends using 150 of its 182 reserved tokens: the rest is released, usage stays under quota.
    for ticket in admitted:
        message = generation_worker.generation_start(message_id=ticket.message.id)
        generation_worker.generation_finish(
            message=message, status="completed", text="ok", prompt_tokens=50, completion_tokens=100
        )
    row.refresh_from_db()
    assert (row.reserved_tokens, row.used_tokens) == (0, LIMIT - 1000 + 5 * 150)
    assert not QuotaReservation.objects.exists()
    assert sum(u.total_tokens for u in UsageRecord.objects.filter(user=carol)) == 5 * 150


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_first_requests_of_the_day_create_one_row_and_never_pass_the_quota(make_user):
    """The reservation's upsert (billing.quota._upsert_reserve) on a day with no row yet: the first insert
    wins, the others take the conflict branch on that row, whose clause still holds the limit."""
    carol = make_user("carol", tier="paid")
    Tier.objects.filter(name="paid").update(tokens_per_day=1000)
    results: list[object] = []
    barrier = threading.Barrier(20)

    def one():
        from accounts.models import User

        user = User.objects.select_related("tier").get(pk=carol.pk)
        barrier.wait()
        try:
            with transaction.atomic():
                results.append(quota_reserve(user=user, tokens=300))
        except QuotaExceeded as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    refused = [r for r in results if isinstance(r, QuotaExceeded)]
    assert len(results) == 20 and len(refused) == 17, results
    assert {r.remaining for r in refused} == {100}
    row = DailyQuota.objects.get(user=carol)
    assert (row.reserved_tokens, row.used_tokens) == (900, 0)
    assert all(r.pk == row.pk and r.user_id == carol.pk for r in results if isinstance(r, DailyQuota))


@pytest.mark.django_db
def test_a_reservation_above_the_daily_limit_fits_only_in_what_a_grant_added(alice):
    """A reservation larger than the tier's whole day cannot create the day's row; it fits an existing row
    whose grant makes room (the conditional UPDATE's path), and nothing is held when it does not."""
    Tier.objects.filter(name="free").update(tokens_per_day=100)
    alice.refresh_from_db()
    with pytest.raises(QuotaExceeded) as refused, transaction.atomic():
        quota_reserve(user=alice, tokens=150)
    assert refused.value.remaining == 100
    assert quota_status(user=alice).reserved == 0
    quota_grant(user=alice, tokens=100, reason="support ticket")
    with transaction.atomic():
        row = quota_reserve(user=alice, tokens=150)
    assert (row.reserved_tokens, quota_status(user=alice).remaining) == (150, 50)


@pytest.mark.django_db
def test_cancel_of_a_queued_reply_releases_its_reservation(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    assert quota_status(user=alice).reserved > 0
    reply_control.reply_cancel(user=alice, message_id=ticket.message.id)
    status = quota_status(user=alice)
    assert (status.reserved, status.used) == (0, 0)
    assert not QuotaReservation.objects.exists()


@pytest.mark.django_db
def test_failed_and_interrupted_replies_settle(alice, bob, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    message = generation_worker.generation_start(message_id=ticket.message.id)
    generation_worker.generation_finish(message=message, status="failed", text="", error="boom")
    assert (quota_status(user=alice).reserved, quota_status(user=alice).used) == (0, 0)

    ticket = generations.reply_request(user=bob, conversation_id=None, content="hi")
    generation_worker.generation_start(message_id=ticket.message.id)
    Message.objects.filter(pk=ticket.message.id).update(updated_at=datetime.now(UTC) - timedelta(minutes=5))
    assert reaper.generations_reap_interrupted(is_alive=lambda _: False) == [ticket.message.id]
    assert quota_status(user=bob).reserved == 0
    # The worker was only slow: its late finish charges the real count once.
    message = Message.objects.get(pk=ticket.message.id)
    generation_worker.generation_finish(
        message=message, status="completed", text="late", prompt_tokens=10, completion_tokens=5
    )
    assert quota_status(user=bob).used == 15


@pytest.mark.django_db
def test_settlement_happens_once(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    assert quota_settle(message=ticket.message, used_tokens=30) is True
    assert quota_settle(message=ticket.message, used_tokens=30) is False  # no reservation: charged as usage
    assert quota_status(user=alice).used == 60 and quota_status(user=alice).reserved == 0


@pytest.mark.django_db
def test_a_replys_final_write_stores_the_reply_its_usage_and_its_settle_in_one_statement(alice, redis_clean):
    """The reply's ``UPDATE``, its usage ``INSERT`` and the reservation's settle (one ``DELETE ... RETURNING``
    feeding the quota rows' updates, lever 51) are one statement (lever 52): no savepoint of the settle's own,
    no ``SELECT ... FOR UPDATE`` of the reservation; the reply, the usage and the ledger end as before."""
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    message = generation_worker.generation_start(message_id=ticket.message.id)
    assert quota_status(user=alice).reserved > 0
    with CaptureQueriesContext(connection) as queries:
        generation_worker.generation_finish(
            message=message, status="completed", text="ok", prompt_tokens=10, completion_tokens=5
        )
    sql = [q["sql"] for q in queries.captured_queries]
    touched = [q for q in sql if "billing_quotareservation" in q or "billing_usagerecord" in q]
    assert len(touched) == 1, touched
    statement = touched[0].lstrip()
    assert statement.startswith("WITH final AS") and "billing_dailyquota" in statement
    # The final write's own transaction (a savepoint inside the test's), then the one statement (memory, on
    # here, indexes the turn after it).
    assert [q.split()[0] for q in sql[:2]] == ["SAVEPOINT", "WITH"], sql
    status = quota_status(user=alice)
    assert (status.used, status.reserved) == (15, 0)
    assert not QuotaReservation.objects.filter(message_id=message.id).exists()
    assert UsageRecord.objects.get(message_id=message.id).completion_tokens == 5
    stored = Message.objects.get(pk=message.id)
    assert (stored.status, stored.content, stored.prompt_tokens) == ("completed", "ok", 10)


@pytest.mark.django_db
def test_a_final_write_with_no_reservation_left_charges_the_day_and_a_late_one_writes_nothing(
    alice, redis_clean
):
    """A reply whose reservation is gone (settled by a Stop) still charges its tokens to the day when its final
    write stores it; a second final write of an ended reply stores nothing: no usage, no charge."""
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    message = generation_worker.generation_start(message_id=ticket.message.id)
    QuotaReservation.objects.filter(message_id=message.id).delete()
    DailyQuota.objects.filter(user=alice).update(reserved_tokens=0)
    generation_worker.generation_finish(
        message=message, status="completed", text="ok", prompt_tokens=7, completion_tokens=3
    )
    assert (quota_status(user=alice).used, quota_status(user=alice).reserved) == (10, 0)
    again = generation_worker.generation_start(message_id=ticket.message.id)
    assert again is None
    generation_worker.generation_finish(message=message, status="failed", text="", prompt_tokens=4)
    assert quota_status(user=alice).used == 10
    assert UsageRecord.objects.filter(message_id=message.id).count() == 1
    assert Message.objects.get(pk=message.id).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_settle_racing_another_for_the_same_reply_charges_its_tokens_as_usage(alice, redis_clean):
    """Two settles of one reply at once (a Stop and the worker's final write): the second waits for the first's
    row lock, then finds no reservation and charges its tokens as usage; the reservation is released once."""
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    first_holds_the_row, results = threading.Event(), {}

    def first():
        try:
            with transaction.atomic():
                results["first"] = quota_settle(message=ticket.message, used_tokens=30)
                first_holds_the_row.set()
                second_started.wait(5)
        finally:
            connection.close()

    def second():
        first_holds_the_row.wait(5)
        second_started.set()
        try:
            results["second"] = quota_settle(message=ticket.message, used_tokens=20)
        finally:
            connection.close()

    second_started = threading.Event()
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"first": True, "second": False}
    status = quota_status(user=alice)
    assert (status.used, status.reserved) == (50, 0)
    assert not QuotaReservation.objects.exists()


@pytest.mark.django_db
def test_admin_grant_admits_a_user_over_quota_for_that_day_only(alice, redis_clean):
    DailyQuota.objects.create(user=alice, day=quota_day(), used_tokens=alice.tier.tokens_per_day)
    with pytest.raises(AdmissionRefused) as refused:
        generations.reply_request(user=alice, conversation_id=None, content="hi")
    assert refused.value.code == "quota_exceeded"
    quota_grant(user=alice, tokens=5000, reason="support ticket")
    assert (
        generations.reply_request(user=alice, conversation_id=None, content="hi").message.status == "queued"
    )
    assert QuotaGrant.objects.get(user=alice).tokens == 5000
    tomorrow = quota_day() + timedelta(days=1)
    assert quota_status(user=alice, day=tomorrow).granted == 0


def test_quota_day_is_the_date_in_the_configured_zone(settings):
    late_utc = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)
    settings.TIME_ZONE = "UTC"
    assert quota_day(late_utc).isoformat() == "2026-03-01"
    settings.TIME_ZONE = "Asia/Tokyo"
    assert quota_day(late_utc).isoformat() == "2026-03-02"
