"""The reply-creating services' lock order (``conversations/generations.py``): each reads a stored conversation
with its row lock first, then checks that no reply of it is active, then reserves the quota. Services racing
on one conversation queue for that lock: one reply is stored, the others are refused as busy, and no two of
them ever hold each other's lock (PostgreSQL would abort one with a deadlock error)."""

import threading
import time

import pytest
from django.db import connection, transaction

from billing.models import DailyQuota, QuotaReservation, Tier
from conversations import generation_worker, generations
from conversations.models import Conversation, Message


def _answered_conversation(user) -> tuple[int, int]:
    """A conversation of ``user`` with one finished exchange: (its id, the user message's id)."""
    ticket = generations.reply_request(user=user, conversation_id=None, content="hi")
    started = generation_worker.generation_start(message_id=ticket.message.id)
    generation_worker.generation_finish(
        message=started, status="completed", text="hello", finish_reason="stop"
    )
    return ticket.message.conversation_id, ticket.user_message_id


@pytest.mark.django_db(transaction=True)
def test_sends_an_edit_and_a_regeneration_racing_on_one_conversation_store_one_reply_without_deadlock(
    make_user, redis_clean
):
    carol = make_user("carol", tier="paid")
    Tier.objects.filter(name="paid").update(max_concurrent_generations=100, requests_per_minute=1000)
    conversation_id, user_message_id = _answered_conversation(carol)
    calls = {
        "send 1": lambda user: generations.reply_request(
            user=user, conversation_id=conversation_id, content="a"
        ),
        "send 2": lambda user: generations.reply_request(
            user=user, conversation_id=conversation_id, content="b"
        ),
        "regenerate": lambda user: generations.reply_regenerate(user=user, conversation_id=conversation_id),
        "edit": lambda user: generations.reply_edit(
            user=user, message_id=user_message_id, content="hi again"
        ),
    }
    results: dict[str, object] = {}
    locked, release = threading.Event(), threading.Event()

    def hold_the_lock():
        # Every service must queue behind this lock; once it goes, they all run at once.
        with transaction.atomic():
            Conversation.objects.select_for_update().get(pk=conversation_id)
            locked.set()
            release.wait(10)
        connection.close()

    def one(name: str):
        from accounts.models import User

        user = User.objects.select_related("tier").get(pk=carol.pk)
        try:
            results[name] = calls[name](user)
        except Exception as exc:  # a deadlock would surface here as a database error
            results[name] = exc
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert locked.wait(10)
    threads = [threading.Thread(target=one, args=(name,)) for name in calls]
    for t in threads:
        t.start()
    time.sleep(0.5)  # all four wait on the conversation's row lock now
    release.set()
    for t in [holder, *threads]:
        t.join(30)

    served = [name for name, r in results.items() if isinstance(r, generations.ReplyTicket)]
    refused = {name: r for name, r in results.items() if isinstance(r, generations.GenerationError)}
    assert len(served) == 1, results
    assert set(refused) == set(calls) - set(served), results
    assert {r.code for r in refused.values()} == {"too_many_generations"}
    queued = Message.objects.filter(conversation_id=conversation_id, role="assistant", status="queued")
    assert queued.count() == 1
    row = DailyQuota.objects.get(user=carol)
    reservation = QuotaReservation.objects.get(quota=row)  # only the served reply holds a reservation
    assert reservation.message_id == queued.get().id and row.reserved_tokens == reservation.tokens
