"""Rows stored by fixed SQL (docs/overhead-levers.md, levers 27-28) are the rows the ORM stored: a model's insert
(``database.sql.insert_instance``: a new conversation, a verdict, a reservation) and the rows a message
chain's statement stores with its messages (``message_chain_create(attached=...)``: a send's input verdict
and its reply's quota reservation). ``Model.objects.create``, the replaced code, is the reference."""

import uuid

import pytest
from django.db import IntegrityError, transaction

from billing.models import DailyQuota, QuotaReservation
from billing.quota import quota_day
from conversations import generations
from conversations.models import Conversation, Message
from conversations.services import message_chain_create
from database.sql import insert_instance
from safety.models import ModerationVerdict

pytestmark = pytest.mark.django_db

#: Fields that differ between two stores of the same values by construction.
UNCOMPARED = {"id", "created_at", "updated_at", "message"}


def fields_of(row) -> dict:
    row = type(row).objects.get(pk=row.pk)
    return {f.name: getattr(row, f.attname) for f in row._meta.concrete_fields if f.name not in UNCOMPARED}


def test_a_fixed_insert_stores_what_create_stores_and_returns_a_saved_instance(alice):
    values = {"owner": alice, "title": "Grüße 🙂", "system_prompt": "Be brief.", "client_id": uuid.uuid4()}
    fixed = insert_instance(Conversation(**values))
    assert fixed.pk is not None and not fixed._state.adding and fixed._state.db == "default"
    reference = Conversation.objects.create(**{**values, "client_id": uuid.uuid4()})
    assert {**fields_of(fixed), "client_id": None} == {**fields_of(reference), "client_id": None}
    assert Conversation.objects.get(pk=fixed.pk).created_at is not None  # auto_now_add applied

    verdict = {"user": alice, "tier": "free", "stage": "input", "action": "flag", "categories": ["x"]}
    results = [{"guard": "rules", "score": 0.5}]
    assert fields_of(insert_instance(ModerationVerdict(**verdict, results=results))) == fields_of(
        ModerationVerdict.objects.create(**verdict, results=results)
    )


def test_a_fixed_insert_of_a_taken_unique_value_raises_as_create_does(alice):
    taken = uuid.uuid4()
    insert_instance(Conversation(owner=alice, title="first", client_id=taken))
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_instance(Conversation(owner=alice, title="again", client_id=taken))
    assert Conversation.objects.filter(owner=alice).count() == 1


def test_a_send_stores_its_verdict_and_reservation_with_its_messages_as_the_orm_did(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="Hello there")
    user_message = Message.objects.get(pk=ticket.user_message_id)
    verdict = ModerationVerdict.objects.get(message=user_message)
    reservation = QuotaReservation.objects.get(message=ticket.message)
    quota = DailyQuota.objects.get(user=alice, day=quota_day())
    assert (verdict.stage, verdict.action, verdict.user_id, verdict.tier) == (
        "input",
        "allow",
        alice.pk,
        "free",
    )
    assert (reservation.quota_id, reservation.tokens) == (quota.pk, quota.reserved_tokens)
    # The ORM's rows for the same verdict and reservation (the replaced verdict_record and quota_hold).
    reference_verdict = ModerationVerdict.objects.create(
        **{f: getattr(verdict, f) for f in ("user_id", "tier", "stage", "action", "guard", "categories")},
        results=verdict.results,
        failures=verdict.failures,
        message=user_message,
    )
    assert fields_of(verdict) == fields_of(reference_verdict)


def test_attached_rows_point_at_their_chain_members_and_none_is_left_out(alice):
    conversation = Conversation.objects.create(owner=alice, title="chain")
    verdict = ModerationVerdict(user=alice, stage="input", action="allow")
    quota = DailyQuota.objects.create(user=alice, day=quota_day(), reserved_tokens=50)
    reservation = QuotaReservation(quota=quota, tokens=50)
    turn, reply = message_chain_create(
        conversation=conversation,
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "status": "queued"}],
        parent=None,
        attached=[(verdict, 0), (None, 1), (reservation, -1)],
    )
    assert ModerationVerdict.objects.get(pk=verdict.pk).message_id == turn.pk == verdict.message_id
    assert QuotaReservation.objects.get(pk=reservation.pk).message_id == reply.pk
    assert not verdict._state.adding and not reservation._state.adding


def test_a_row_without_one_key_to_a_message_cannot_be_attached(alice):
    conversation = Conversation.objects.create(owner=alice, title="chain")
    with pytest.raises(ValueError, match="foreign key to Message"):
        message_chain_create(
            conversation=conversation,
            messages=[{"role": "user", "content": "hi"}],
            parent=None,
            attached=[(DailyQuota(user=alice, day=quota_day()), 0)],
        )
