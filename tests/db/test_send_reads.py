"""The send path's fixed-SQL reads (``database/sql.py``, docs/overhead-levers.md lever 19) answer what the ORM's
querysets they replaced answer, on a mix of tiers, models, roles and statuses: the place in line, a
conversation's totals and a user's active replies. The querysets below are the replaced code, kept here as
the reference."""

import pytest
from django.db.models import Count, Func, IntegerField, Q, Sum

from conversations.admission import NO_MESSAGES, conversation_totals
from conversations.models import Conversation, Message
from conversations.reply_dispatch import queue_position
from conversations.selectors import active_generation_count

pytestmark = pytest.mark.django_db

MODELS = ("model-a", "model-b")
STATUSES = ("queued", "streaming", "completed", "cancelled", "queued")


def reference_position(message: Message) -> int:
    priority = message.conversation.owner.tier.queue_priority
    ahead = Message.objects.filter(
        role=Message.Role.ASSISTANT, status=Message.Status.QUEUED, model_name=message.model_name
    )
    return ahead.filter(
        Q(conversation__owner__tier__queue_priority__gt=priority)
        | Q(conversation__owner__tier__queue_priority=priority, id__lte=message.id)
    ).count()


def reference_totals(conversation: Conversation) -> tuple[int, int, int]:
    totals = conversation.messages.aggregate(
        content_bytes=Sum(
            Func("content", function="octet_length", output_field=IntegerField()),
            filter=Q(role__in=[Message.Role.USER, Message.Role.ASSISTANT]),
        ),
        messages=Count("id"),
        active=Count("id", filter=Q(role=Message.Role.ASSISTANT, status__in=Message.ACTIVE_STATUSES)),
    )
    return totals["content_bytes"] or 0, totals["messages"], totals["active"]


@pytest.fixture
def mixed(make_user):
    """Three users on two tiers (paid ranks above free), each with two conversations holding user, system and
    assistant messages (multi-byte content included) over two models and every status; one conversation is
    empty."""
    users = [make_user("free1"), make_user("paid1", tier="paid"), make_user("free2")]
    empty = Conversation.objects.create(owner=users[0], title="empty")
    step = 0
    for user in users:
        for c in range(2):
            conversation = Conversation.objects.create(owner=user, title=f"{user.username}-{c}")
            parent = None
            for turn in range(4):
                step += 1
                parent = Message.objects.create(
                    conversation=conversation, parent=parent, role="user", content=f"frage {step} — größer"
                )
                if turn == 0:
                    Message.objects.create(
                        conversation=conversation, role="system", content="be brief " * step
                    )
                parent = Message.objects.create(
                    conversation=conversation,
                    parent=parent,
                    role="assistant",
                    content="antwort ✓" * (step % 3),
                    status=STATUSES[step % len(STATUSES)],
                    model_name=MODELS[step % 2],
                )
    return users, empty


def test_place_in_line_matches_the_querysets_it_replaced(mixed):
    queued = Message.objects.filter(role="assistant", status="queued").select_related(
        "conversation__owner__tier"
    )
    assert queued.count() >= 6
    positions = {m.id: queue_position(message=m) for m in queued}
    assert positions == {m.id: reference_position(m) for m in queued}
    assert sorted(positions.values()) != [1] * len(positions)  # the mix puts replies behind others


def test_conversation_totals_match_the_aggregate_they_replaced(mixed):
    users, empty = mixed
    for conversation in [empty, *Conversation.objects.exclude(pk=empty.pk)]:
        totals = conversation_totals(conversation=conversation)
        assert (totals.content_bytes, totals.messages, totals.active_replies) == reference_totals(
            conversation
        )
    assert conversation_totals(conversation=empty) == NO_MESSAGES


def test_active_replies_match_the_count_they_replaced(mixed):
    users, _ = mixed
    counts = [active_generation_count(user=user) for user in users]
    assert counts == [
        Message.objects.filter(
            conversation__owner=user, role="assistant", status__in=Message.ACTIVE_STATUSES
        ).count()
        for user in users
    ]
    assert sum(counts) > 0


def test_admission_reads_the_active_replies_and_the_membership_in_one_statement(
    mixed, make_user, django_assert_num_queries
):
    from billing.quota import MEMBERSHIP_SQL
    from conversations.admission_reads import user_admission_reads
    from database.sql import fetch_one
    from organizations.models import Membership
    from organizations.services import organization_create

    users, _ = mixed
    team = organization_create(name="acme", owner=make_user("owner"))
    Membership.objects.create(organization=team, user=users[1], daily_token_cap=500)
    for user in users:
        assert user.tier is not None  # loaded, as admission's user has it (refresh_tier)
        for place_in_line_of in (None, *MODELS):
            with django_assert_num_queries(1):
                active, membership, _, _ = user_admission_reads(user=user, place_in_line_of=place_in_line_of)
            assert active == active_generation_count(user=user)
            assert membership == fetch_one(MEMBERSHIP_SQL, {"user": user.pk})  # the read it replaced
    assert user_admission_reads(user=users[1])[1] == (team.pk, 500)
    assert user_admission_reads(user=users[0])[1] is None


def test_admission_reads_the_place_in_line_a_reply_stored_next_gets(mixed):
    """Lever 30: the replies queued ahead, read in admission's statement before the reply is stored, are its
    place in line less one, as the place-in-line read after the insert counts it (and the replaced queryset)."""
    from conversations.admission_reads import user_admission_reads

    users, _ = mixed
    seen = set()
    for user in users:
        conversation = Conversation.objects.filter(owner=user).exclude(title="empty").first()
        for model in MODELS:
            _, _, ahead, _ = user_admission_reads(user=user, place_in_line_of=model)
            assert user_admission_reads(user=user)[2] is None  # not asked for: not read
            reply = Message.objects.create(
                conversation=conversation, role="assistant", status="queued", model_name=model
            )
            reply = Message.objects.select_related("conversation__owner__tier").get(pk=reply.pk)
            assert ahead + 1 == queue_position(message=reply) == reference_position(reply)
            seen.add(ahead)
            reply.delete()
    assert len(seen) > 1  # tiers and models put the new reply at different places
