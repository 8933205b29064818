import pytest
from django.contrib.auth.models import AnonymousUser
from django.urls import reverse

from conversations import selectors, services
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(alice):
    return services.conversation_create(owner=alice, title="Trip", system_prompt="Be brief.")


def test_owner_gets_conversation(alice, conversation):
    assert selectors.conversation_get_for_user(user=alice, conversation_id=conversation.id) == conversation


def test_other_user_is_refused(bob, conversation):
    with pytest.raises(selectors.ConversationNotFound):
        selectors.conversation_get_for_user(user=bob, conversation_id=conversation.id)


def test_anonymous_is_refused(conversation):
    with pytest.raises(selectors.ConversationNotFound):
        selectors.conversation_get_for_user(user=AnonymousUser(), conversation_id=conversation.id)


@pytest.mark.parametrize("bad_id", [None, "abc", 10**9])
def test_bad_ids_are_not_found(alice, bad_id):
    with pytest.raises(selectors.ConversationNotFound):
        selectors.conversation_get_for_user(user=alice, conversation_id=bad_id)


def test_message_access_follows_conversation_owner(alice, bob, conversation):
    message = services.message_create(conversation=conversation, role="user", content="hi")
    assert selectors.message_get_for_user(user=alice, message_id=message.id) == message
    with pytest.raises(selectors.MessageNotFound):
        selectors.message_get_for_user(user=bob, message_id=message.id)
    with pytest.raises(selectors.MessageNotFound):
        selectors.message_get_for_user(user=AnonymousUser(), message_id=message.id)


def test_message_create_stores_and_touches_conversation(conversation):
    before = Conversation.objects.get(pk=conversation.pk).updated_at
    message = services.message_create(conversation=conversation, role="user", content="hello")
    assert Message.objects.get(pk=message.pk).content == "hello"
    assert Conversation.objects.get(pk=conversation.pk).updated_at > before


def test_sidebar_lists_only_own_conversations_newest_first(alice, bob):
    first = services.conversation_create(owner=alice, title="first")
    second = services.conversation_create(owner=alice, title="second")
    services.conversation_create(owner=bob, title="bob's")
    services.message_create(conversation=first, role="user", content="bump")
    page = selectors.conversation_page_for_user(user=alice)
    assert [c.title for c in page] == ["first", "second"]
    assert second in page.object_list


def test_sidebar_paginates(alice):
    for i in range(selectors.SIDEBAR_PAGE_SIZE + 3):
        services.conversation_create(owner=alice, title=f"c{i}")
    page1 = selectors.conversation_page_for_user(user=alice)
    page2 = selectors.conversation_page_for_user(user=alice, page_number=2)
    assert len(page1) == selectors.SIDEBAR_PAGE_SIZE and page1.has_next()
    assert len(page2) == 3 and not page2.has_next()


def test_rename_view_renames_and_empty_title_keeps_old(client, alice, conversation):
    client.force_login(alice)
    client.post(reverse("conversations:rename", args=[conversation.id]), {"title": "  Holiday  "})
    assert Conversation.objects.get(pk=conversation.pk).title == "Holiday"
    client.post(reverse("conversations:rename", args=[conversation.id]), {"title": "   "})
    assert Conversation.objects.get(pk=conversation.pk).title == "Holiday"


def test_other_user_cannot_rename_or_delete_or_view(client, bob, conversation):
    client.force_login(bob)
    assert client.get(reverse("conversations:detail", args=[conversation.id])).status_code == 404
    assert (
        client.post(reverse("conversations:rename", args=[conversation.id]), {"title": "x"}).status_code
        == 404
    )
    assert client.post(reverse("conversations:delete", args=[conversation.id])).status_code == 404
    assert Conversation.objects.get(pk=conversation.pk).title == "Trip"


def test_delete_requires_post_and_deletes_messages(client, alice, conversation):
    services.message_create(conversation=conversation, role="user", content="hi")
    client.force_login(alice)
    assert client.get(reverse("conversations:delete", args=[conversation.id])).status_code == 405
    response = client.post(reverse("conversations:delete", args=[conversation.id]))
    assert response.status_code == 302
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()


def test_detail_page_shows_messages_in_order(client, alice, conversation):
    services.message_create(conversation=conversation, role="user", content="one")
    services.message_create(conversation=conversation, role="assistant", content="two")
    client.force_login(alice)
    response = client.get(reverse("conversations:detail", args=[conversation.id]))
    assert response.status_code == 200
    assert [m.content for m in response.context["chat_messages"]] == ["one", "two"]


def test_title_from_content_cuts_long_first_line():
    assert services.title_from_content("Short question\nmore") == "Short question"
    long = "word " * 30
    title = services.title_from_content(long)
    assert len(title) <= services.TITLE_MAX_CHARS + 1 and title.endswith("…")
