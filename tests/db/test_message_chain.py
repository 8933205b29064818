"""The one-statement chain insert (``conversations/message_chain.py``, docs/overhead-levers.md lever 20) stores what
the ORM's inserts and pointer updates it replaced store: every field of every message, the branch pointers
and the conversation's leaf, for a send's pair, an API request's turns and reply, a new branch and a root.
The ORM writes below are the replaced code, kept here as the reference."""

import uuid

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from conversations.models import Conversation, Message
from conversations.services import (
    APPEND,
    conversation_create,
    conversation_new,
    message_chain_create,
    message_create,
)

pytestmark = pytest.mark.django_db

#: Fields whose values differ between two stores of the same messages by construction.
UNCOMPARED = {"id", "conversation", "parent", "active_child", "created_at", "updated_at"}


def reference_chain(*, conversation, messages, parent_id, moves_leaf=True) -> list[Message]:
    """The replaced ORM writes: an INSERT per message, then each parent's pointer and the leaf."""
    stored = []
    for values in messages:
        message = Message.objects.create(conversation=conversation, parent_id=parent_id, **values)
        if parent_id is not None:
            Message.objects.filter(pk=parent_id).update(active_child=message)
        parent_id = message.pk
        stored.append(message)
    if moves_leaf:
        Conversation.objects.filter(pk=conversation.pk).update(
            active_leaf=stored[-1], updated_at=timezone.now()
        )
    return stored


def shape(messages: list[Message]) -> list[dict]:
    """Each stored message's fields as read back, with the pointers as positions in the chain (None: outside
    it) so two chains with different ids compare."""
    rows = [Message.objects.get(pk=m.pk) for m in messages]
    position = {m.pk: k for k, m in enumerate(rows)}
    out = []
    for row in rows:
        fields = {
            f.name: getattr(row, f.attname) for f in Message._meta.concrete_fields if f.name not in UNCOMPARED
        }
        fields["parent"] = position.get(row.parent_id, "outside" if row.parent_id else None)
        fields["active_child"] = position.get(row.active_child_id, "outside" if row.active_child_id else None)
        out.append(fields)
    return out


PAIR = [
    {"role": "user", "content": "Grüße — 你好 🙂", "client_id": uuid.UUID(int=7)},
    {"role": "assistant", "content": "", "status": "queued", "model_name": "smollm2-135m-instruct"},
]
API_CHAIN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "And then?"},
    {
        "role": "assistant",
        "status": "queued",
        "model_name": "m",
        "sampling": {"temperature": 0.2, "stop": ["\n"], "max_tokens": 8},
        "api_user": "end-user-7",
        "api_metadata": {"k": "v"},
    },
]


@pytest.fixture
def two_conversations(alice):
    """Two conversations of alice, each holding the same two finished messages."""
    pair = []
    for title in ("chain", "reference"):
        conversation = Conversation.objects.create(owner=alice, title=title)
        first = Message.objects.create(conversation=conversation, role="user", content="Hello")
        second = Message.objects.create(
            conversation=conversation, parent=first, role="assistant", content="Hi"
        )
        Message.objects.filter(pk=first.pk).update(active_child=second)
        Conversation.objects.filter(pk=conversation.pk).update(active_leaf=second)
        conversation.refresh_from_db()
        pair.append(conversation)
    return pair


@pytest.mark.parametrize("messages", [PAIR, API_CHAIN, PAIR[:1]], ids=["send-pair", "api-chain", "one"])
@pytest.mark.parametrize("where", ["append", "root", "branch"])
def test_a_chain_stores_what_the_orm_writes_stored(two_conversations, messages, where):
    chained, reference = two_conversations

    def parent_in(conversation):
        leaf = Message.objects.get(pk=conversation.active_leaf_id)
        return {"append": APPEND, "root": None, "branch": leaf.parent}[where]

    with transaction.atomic():
        stored = message_chain_create(conversation=chained, messages=messages, parent=parent_in(chained))
    parent = parent_in(reference)
    expected = reference_chain(
        conversation=reference,
        messages=messages,
        parent_id=reference.active_leaf_id if parent is APPEND else getattr(parent, "pk", None),
    )

    assert shape(stored) == shape(expected)
    chained.refresh_from_db()
    reference.refresh_from_db()
    assert chained.active_leaf_id == stored[-1].pk and reference.active_leaf_id == expected[-1].pk
    # The pointer into the chain from outside it (the parent's active_child) moved the same way.
    old = Message.objects.filter(conversation=chained).exclude(pk__in=[m.pk for m in stored]).order_by("id")
    old_reference = Message.objects.filter(conversation=reference).exclude(pk__in=[m.pk for m in expected])
    assert [m.active_child_id in {s.pk for s in stored} for m in old] == [
        m.active_child_id in {e.pk for e in expected} for m in old_reference.order_by("id")
    ]
    # The returned objects are the stored rows, saved, in chain order (ids rising, so the page's order by
    # created_at then id keeps it).
    assert [m.pk for m in stored] == sorted(m.pk for m in stored)
    for returned in stored:
        row = Message.objects.get(pk=returned.pk)
        assert not returned._state.adding
        assert (returned.parent_id, returned.active_child_id, returned.created_at) == (
            row.parent_id,
            row.active_child_id,
            row.created_at,
        )
    assert [m.created_at for m in stored] == sorted(m.created_at for m in stored)


def test_a_chain_left_off_the_leaf_leaves_the_conversation_row_alone(two_conversations):
    chained, _ = two_conversations
    before = Conversation.objects.get(pk=chained.pk)
    with transaction.atomic():
        (message,) = message_chain_create(
            conversation=chained, messages=[{"role": "user", "content": "x"}], moves_leaf=False
        )
    after = Conversation.objects.get(pk=chained.pk)
    assert (after.active_leaf_id, after.updated_at) == (before.active_leaf_id, before.updated_at)
    assert chained.active_leaf_id == message.pk  # in memory, for the reply that follows
    assert Message.objects.get(pk=before.active_leaf_id).active_child_id == message.pk


def test_a_taken_client_id_raises_integrity_error_and_stores_nothing(two_conversations):
    chained, _ = two_conversations
    key = uuid.uuid4()
    message_create(conversation=chained, role="user", content="first", client_id=key)
    rows = list(Message.objects.filter(conversation=chained).values_list("id", "active_child_id"))
    leaf = Conversation.objects.get(pk=chained.pk).active_leaf_id

    with pytest.raises(IntegrityError), transaction.atomic():
        message_chain_create(
            conversation=chained, messages=[{"role": "user", "content": "again", "client_id": key}, PAIR[1]]
        )

    assert list(Message.objects.filter(conversation=chained).values_list("id", "active_child_id")) == rows
    assert Conversation.objects.get(pk=chained.pk).active_leaf_id == leaf


def test_an_empty_chain_is_refused(two_conversations):
    with pytest.raises(ValueError, match="at least one message"):
        message_chain_create(conversation=two_conversations[0], messages=[])


def test_a_chain_of_a_field_the_model_lacks_is_refused_before_any_write(two_conversations):
    chained, _ = two_conversations
    count = Message.objects.count()
    with pytest.raises(TypeError), transaction.atomic():
        message_chain_create(
            conversation=chained, messages=[{"role": "user", "content": "x", "colour": "red"}]
        )
    assert Message.objects.count() == count


@pytest.mark.parametrize("messages", [PAIR, API_CHAIN], ids=["send-pair", "api-chain"])
def test_a_chain_that_starts_a_conversation_stores_what_conversation_create_stored(alice, messages):
    """Lever 47: the conversation's row comes from the chain's statement, as ``conversation_create`` (an
    insert of its own) stored it, with the chain's last message as its leaf."""
    key = uuid.uuid4()
    reference = conversation_create(owner=alice, title="  New chat ", client_id=uuid.uuid4())
    reference_messages = reference_chain(conversation=reference, messages=messages, parent_id=None)
    new = conversation_new(owner=alice, title="  New chat ", client_id=key)

    with transaction.atomic():
        stored = message_chain_create(
            conversation=new, messages=messages, parent=None, conversation_locked=True
        )

    row = Conversation.objects.get(pk=new.pk)
    reference.refresh_from_db()
    compared = [
        f.attname
        for f in Conversation._meta.concrete_fields
        if f.name not in UNCOMPARED | {"client_id", "active_leaf"}
    ]
    assert [getattr(row, f) for f in compared] == [getattr(reference, f) for f in compared]
    assert (row.owner_id, row.title, row.client_id, row.active_leaf_id) == (
        alice.pk,
        "New chat",
        key,
        stored[-1].pk,
    )
    assert not new._state.adding and new.active_leaf_id == stored[-1].pk
    assert shape(stored) == shape(reference_messages)
    assert all(m.conversation_id == new.pk and m.conversation is new for m in stored)
    assert row.created_at <= stored[0].created_at


def test_a_new_conversation_with_a_taken_client_id_stores_nothing(alice):
    key = uuid.uuid4()
    conversation_create(owner=alice, title="first", client_id=key)
    conversations, messages = Conversation.objects.count(), Message.objects.count()

    with pytest.raises(IntegrityError), transaction.atomic():
        message_chain_create(
            conversation=conversation_new(owner=alice, title="again", client_id=key),
            messages=PAIR,
            parent=None,
            conversation_locked=True,
        )

    assert (Conversation.objects.count(), Message.objects.count()) == (conversations, messages)


def test_a_new_conversation_chain_under_a_parent_is_refused(two_conversations, alice):
    parent = Message.objects.filter(conversation=two_conversations[0]).first()
    with pytest.raises(ValueError, match="no parent"), transaction.atomic():
        message_chain_create(
            conversation=conversation_new(owner=alice), messages=PAIR, parent=parent, conversation_locked=True
        )
