"""The branch tree: parent pointers, active children, the active path, and replies built on branches."""

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from conversations import branches, generation_worker, generations, selectors, services
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db


def finish(ticket, text):
    message = generation_worker.generation_start(message_id=ticket.message.id)
    return generation_worker.generation_finish(
        message=message, status="completed", text=text, finish_reason="stop"
    )


def path_contents(conversation):
    conversation.refresh_from_db()
    return [m.content for m in branches.active_path(conversation=conversation).messages]


def test_message_create_without_parent_appends_to_the_active_leaf(alice):
    conversation = services.conversation_create(owner=alice)
    a = services.message_create(conversation=conversation, role="user", content="a")
    b = services.message_create(conversation=conversation, role="assistant", content="b")
    assert (a.parent_id, b.parent_id) == (None, a.id)
    a.refresh_from_db()
    conversation.refresh_from_db()
    assert a.active_child_id == b.id and conversation.active_leaf_id == b.id
    assert path_contents(conversation) == ["a", "b"]


def test_message_create_in_a_locked_conversation_follows_the_leaf_read_under_the_lock_and_takes_no_second_lock(
    alice,
):
    conversation = services.conversation_create(owner=alice)
    a = services.message_create(conversation=conversation, role="user", content="a")
    with transaction.atomic():
        locked = selectors.conversation_get_for_user(
            user=alice, conversation_id=conversation.id, for_update=True
        )
        with CaptureQueriesContext(connection) as queries:
            b = services.message_create(
                conversation=locked, role="assistant", content="b", conversation_locked=True
            )
            c = services.message_create(
                conversation=locked, role="assistant", content="c", parent=a, conversation_locked=True
            )
    assert not [q for q in queries.captured_queries if "FOR UPDATE" in q["sql"]]
    a.refresh_from_db()
    conversation.refresh_from_db()
    assert (b.parent_id, c.parent_id) == (a.id, a.id)  # b followed the leaf read under the lock
    assert (a.active_child_id, conversation.active_leaf_id) == (c.id, c.id)
    assert path_contents(conversation) == ["a", "c"]


def test_edit_creates_a_sibling_branch_and_switching_back_restores_the_old_one(alice, redis_clean):
    first = generations.reply_request(user=alice, conversation_id=None, content="q1")
    finish(first, "r1")
    conversation = Conversation.objects.get(pk=first.message.conversation_id)
    second = generations.reply_request(user=alice, conversation_id=conversation.id, content="q2")
    finish(second, "r2")

    edited = generations.reply_edit(user=alice, message_id=second.user_message_id, content="q2 edited")
    finish(edited, "r2'")
    assert path_contents(conversation) == ["q1", "r1", "q2 edited", "r2'"]
    edited_user = Message.objects.get(pk=edited.user_message_id)
    assert edited_user.parent_id == Message.objects.get(pk=second.user_message_id).parent_id

    # ‹ 1/2 ›: flip back to the original question; its reply comes back with it.
    conversation.refresh_from_db()
    page = branches.active_path(conversation=conversation)
    shown = page.messages[2]
    assert (shown.sibling_index, shown.sibling_count) == (2, 2)
    leaf = branches.branch_switch(
        conversation=conversation, message=Message.objects.get(pk=second.user_message_id)
    )
    assert leaf.content == "r2"
    assert path_contents(conversation) == ["q1", "r1", "q2", "r2"]
    # ...and forward again: the edited branch's own reply is remembered.
    branches.branch_switch(conversation=conversation, message=edited_user)
    assert path_contents(conversation) == ["q1", "r1", "q2 edited", "r2'"]


def test_regenerate_adds_a_sibling_reply_and_context_follows_the_active_branch_only(alice, redis_clean):
    first = generations.reply_request(user=alice, conversation_id=None, content="question")
    finish(first, "answer one")
    conversation = Conversation.objects.get(pk=first.message.conversation_id)
    regen = generations.reply_regenerate(user=alice, conversation_id=conversation.id)
    finish(regen, "answer two")
    assert Message.objects.filter(conversation=conversation, role="assistant").count() == 2
    conversation.refresh_from_db()
    page = branches.active_path(conversation=conversation)
    assert [m.content for m in page.messages] == ["question", "answer two"]
    assert (page.messages[1].sibling_index, page.messages[1].sibling_count) == (2, 2)

    follow = generations.reply_request(user=alice, conversation_id=conversation.id, content="more")
    _system, turns, _ids = generation_worker.generation_branch(message=follow.message)
    assert [t["content"] for t in turns] == ["question", "answer two", "more"]  # never "answer one"


def test_continue_follows_a_reply_cut_at_the_length_limit(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="long story")
    message = generation_worker.generation_start(message_id=ticket.message.id)
    generation_worker.generation_finish(
        message=message, status="completed", text="Once upon", finish_reason="length"
    )
    cont = generations.reply_continue(user=alice, message_id=message.id)
    assert cont.message.parent_id == message.id and cont.message.status == "queued"
    _system, turns, _ids = generation_worker.generation_branch(message=cont.message)
    assert turns[-1] == {"role": "assistant", "content": "Once upon"}


def test_continue_is_refused_for_a_reply_that_ended_normally(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    done = finish(ticket, "hello")
    with pytest.raises(generations.GenerationError):
        generations.reply_continue(user=alice, message_id=done.id)
    assert Message.objects.count() == 2


def test_edit_of_someone_elses_message_is_not_found(alice, bob, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="mine")
    finish(ticket, "ok")
    with pytest.raises(selectors.MessageNotFound):
        generations.reply_edit(user=bob, message_id=ticket.user_message_id, content="hijack")
    assert Message.objects.count() == 2


def test_message_too_long_for_the_plan_is_refused_with_the_limit_in_tokens_and_words(alice, redis_clean):
    alice.tier.max_context_tokens = 64
    alice.tier.max_reply_tokens = 32
    alice.tier.save()
    with pytest.raises(generations.GenerationError) as exc:
        generations.reply_request(user=alice, conversation_id=None, content="word " * 200)
    assert exc.value.code == "context_too_long"
    assert "tokens" in str(exc.value) and "words" in str(exc.value)
    assert Message.objects.count() == 0 and Conversation.objects.count() == 0


def test_active_path_is_one_query_with_siblings_and_pages_older_messages(alice):
    conversation = services.conversation_create(owner=alice)
    for i in range(25):
        services.message_create(
            conversation=conversation, role="user" if i % 2 == 0 else "assistant", content=str(i)
        )
    conversation.refresh_from_db()
    with CaptureQueriesContext(connection) as queries:
        page = branches.active_path(conversation=conversation, limit=10)
    assert len(queries) == 1
    assert [m.content for m in page.messages] == [str(i) for i in range(15, 25)] and page.has_older
    older = branches.active_path(conversation=conversation, before=page.messages[0], limit=10)
    assert [m.content for m in older.messages] == [str(i) for i in range(5, 15)] and older.has_older
    oldest = branches.active_path(conversation=conversation, before=older.messages[0], limit=10)
    assert [m.content for m in oldest.messages] == [str(i) for i in range(5)] and not oldest.has_older


def test_linear_migration_links_existing_messages(alice):
    """The data migration's SQL on messages stored without tree links (as before the migration)."""
    from importlib import import_module

    migration = import_module("conversations.migrations.0006_link_existing_messages_linearly")
    conversation = services.conversation_create(owner=alice)
    ids = [
        services.message_create(conversation=conversation, role="user", content=str(i)).id for i in range(4)
    ]
    Message.objects.filter(pk__in=ids).update(parent=None, active_child=None)
    Conversation.objects.filter(pk=conversation.pk).update(active_leaf=None)
    with connection.cursor() as cursor:
        for sql in migration.FORWARD:
            cursor.execute(sql)
    conversation.refresh_from_db()
    assert conversation.active_leaf_id == ids[-1]
    assert list(Message.objects.filter(pk__in=ids).order_by("id").values_list("parent_id", flat=True)) == [
        None,
        *ids[:-1],
    ]
    assert path_contents(conversation) == ["0", "1", "2", "3"]
