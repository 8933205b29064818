"""``conversation_get_for_user`` reads its row with fixed SQL (``database.sql.fetch_instance``,
docs/overhead-levers.md lever 22). It must load what the queryset it replaced loaded
(``Conversation.objects.get(pk=..., owner=user, stored=True)``, kept here as the reference), refuse what it
refused, and with ``for_update`` hold the row lock until the caller's transaction ends."""

import threading
import uuid

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import OperationalError, connection, transaction

from conversations.models import Conversation, Message
from conversations.selectors import ConversationNotFound, conversation_get_for_user

FIELDS = [f.attname for f in Conversation._meta.concrete_fields]


@pytest.fixture
def stored(alice):
    """A conversation with every field set: multi-byte text, a chosen model, a leaf, a client id."""
    conversation = Conversation.objects.create(
        owner=alice,
        title="Grüße — 你好",
        system_prompt='Be brief. "quoted" \\ back',
        model_name="smollm2-135m-instruct",
        client_id=uuid.uuid4(),
    )
    leaf = Message.objects.create(conversation=conversation, role="user", content="hi")
    Conversation.objects.filter(pk=conversation.pk).update(active_leaf=leaf)
    return Conversation.objects.get(pk=conversation.pk)


@pytest.mark.django_db
@pytest.mark.parametrize("for_update", [False, True])
def test_it_loads_what_the_queryset_loaded(alice, stored, for_update, django_assert_num_queries):
    reference = Conversation.objects.get(pk=stored.pk, owner=alice, stored=True)
    with transaction.atomic(), django_assert_num_queries(1):
        read = conversation_get_for_user(user=alice, conversation_id=str(stored.pk), for_update=for_update)
        owner = read.owner  # set from ``user``: no query
    assert {f: getattr(read, f) for f in FIELDS} == {f: getattr(reference, f) for f in FIELDS}
    assert isinstance(read.client_id, uuid.UUID) and read.active_leaf_id is not None
    assert owner is alice and not read._state.adding and read._state.db == "default"
    read.title = "renamed"
    read.save(update_fields=["title"])  # an instance the ORM can save, as a queryset's is
    assert Conversation.objects.get(pk=stored.pk).title == "renamed"


@pytest.mark.django_db
@pytest.mark.parametrize("for_update", [False, True])
def test_it_refuses_what_the_queryset_refused(alice, bob, stored, for_update):
    unstored = Conversation.objects.create(owner=alice, title="api", stored=False)
    cases = [
        (bob, stored.pk),  # another user's
        (alice, unstored.pk),  # an API completion sent without store
        (alice, stored.pk + 10_000),  # no such id
        (alice, "12abc"),
        (alice, None),
        (alice, 0),
        (alice, 2**63),  # beyond bigint
        (AnonymousUser(), stored.pk),
        (None, stored.pk),
    ]
    for user, conversation_id in cases:
        with transaction.atomic(), pytest.raises(ConversationNotFound):
            conversation_get_for_user(user=user, conversation_id=conversation_id, for_update=for_update)
    assert Conversation.objects.filter(pk__in=[stored.pk, unstored.pk]).count() == 2


def _locked_elsewhere(pk: int) -> bool:
    """Whether another connection finds the conversation's row locked (``FOR UPDATE NOWAIT``)."""
    result = []

    def probe():
        try:
            with transaction.atomic():
                list(Conversation.objects.select_for_update(nowait=True).filter(pk=pk))
            result.append(False)
        except OperationalError:
            result.append(True)
        finally:
            connection.close()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(10)
    return result[0]


@pytest.mark.django_db(transaction=True)
def test_for_update_holds_the_row_lock_until_the_transaction_ends(alice, stored):
    with transaction.atomic():
        conversation_get_for_user(user=alice, conversation_id=stored.pk)
        assert not _locked_elsewhere(stored.pk)
        conversation_get_for_user(user=alice, conversation_id=stored.pk, for_update=True)
        assert _locked_elsewhere(stored.pk)
    assert not _locked_elsewhere(stored.pk)
