"""The memory page and its forms: owner-only access, stored state after each action."""

import pytest
from django.urls import reverse

from conversations.models import Conversation, Message
from memory import services
from memory.models import Chunk, Memory
from memory.selectors import account_memory_enabled

pytestmark = pytest.mark.django_db


def turn(user, text="My cat is Biscuit."):
    conv = Conversation.objects.create(owner=user, title="Pets")
    reply = Message.objects.create(conversation=conv, role="assistant", content="Nice.")
    chunks = services.turn_index(
        user_id=user.pk, conversation_id=conv.pk, reply_id=reply.pk, question=text, reply="Nice."
    )
    return conv, chunks


def test_anonymous_visitors_are_sent_to_log_in(client):
    response = client.get(reverse("memory:page"))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert client.post(reverse("memory:add"), {"text": "x"}).status_code == 302
    assert not Memory.objects.exists()


def test_page_lists_the_users_own_facts_and_counts_remembered_passages(client, alice, bob):
    services.memory_create(user_id=alice.pk, text="I am vegetarian")
    services.memory_create(user_id=bob.pk, text="Bob's secret")
    turn(alice)
    client.force_login(alice)

    body = client.get(reverse("memory:page")).content.decode()

    assert "I am vegetarian" in body and "Bob&#x27;s secret" not in body and "Bob's secret" not in body
    assert "1 passage from 1 conversation" in body
    assert "Turn memory off" in body


def test_facts_are_added_edited_and_deleted_and_bad_input_is_refused(client, alice):
    client.force_login(alice)
    assert client.post(reverse("memory:add"), {"text": "I live in Oslo"}).status_code == 302
    memory = Memory.objects.get(user=alice)
    assert (
        client.post(reverse("memory:edit", args=[memory.pk]), {"text": "I live in Bergen"}).status_code == 302
    )
    memory.refresh_from_db()
    assert memory.text == "I live in Bergen"

    refused = client.post(reverse("memory:add"), {"text": "x" * 501})
    assert refused.status_code == 400 and "at most 500" in refused.content.decode()
    assert client.post(reverse("memory:delete", args=[memory.pk])).status_code == 302
    assert not Memory.objects.filter(user=alice).exists()


def test_another_users_fact_or_passage_is_not_found(client, alice, bob):
    memory = services.memory_create(user_id=bob.pk, text="Bob's fact")
    _conv, chunks = turn(bob)
    client.force_login(alice)

    assert client.post(reverse("memory:edit", args=[memory.pk]), {"text": "mine"}).status_code == 404
    assert client.post(reverse("memory:delete", args=[memory.pk])).status_code == 404
    assert client.post(reverse("memory:chunk_forget", args=[chunks[0].pk])).status_code == 404
    assert Memory.objects.get(pk=memory.pk).text == "Bob's fact"
    assert Chunk.objects.filter(pk=chunks[0].pk).exists()


def test_switch_and_forgetting_change_what_is_stored(client, alice):
    conv, chunks = turn(alice)
    client.force_login(alice)

    response = client.post(reverse("memory:chunk_forget", args=[chunks[0].pk]), {"next": f"/chat/{conv.pk}/"})
    assert response.status_code == 302 and response["Location"] == f"/chat/{conv.pk}/"
    assert not Chunk.objects.filter(pk=chunks[0].pk).exists()
    evil = client.post(
        reverse("memory:chunk_forget", args=[turn(alice)[1][0].pk]), {"next": "https://evil.example/"}
    )
    assert evil["Location"] == reverse("memory:page")

    turn(alice)
    client.post(reverse("memory:forget_all"))
    assert not Chunk.objects.filter(user=alice).exists()

    client.post(reverse("memory:switch"), {"enabled": "off"})
    assert not account_memory_enabled(user_id=alice.pk)
    assert turn(alice)[1] == []
    client.post(reverse("memory:switch"), {"enabled": "on"})
    assert account_memory_enabled(user_id=alice.pk)


def test_the_export_carries_the_users_key_facts_and_switch(client, alice, bob):
    services.memory_create(user_id=alice.pk, text="I am vegetarian")
    services.memory_create(user_id=bob.pk, text="Bob's fact")
    services.account_memory_set(user_id=alice.pk, enabled=False)
    client.force_login(alice)

    document = client.get(reverse("conversations:export_all"), {"format": "json"}).json()

    assert document["memory"]["enabled"] is False
    assert [m["text"] for m in document["memory"]["memories"]] == ["I am vegetarian"]


def test_readyz_and_fleet_show_the_vector_store(client, alice):
    from operations.management.commands.fleet import Command

    turn(alice)  # one chunk, not embedded yet
    body = client.get("/readyz").json()
    assert body["vector_store"]["backend"] == "exact"
    assert body["vector_store"]["pending"] == 1 and body["vector_store"]["vectors"] == 0
    assert Command.vector_store_summary(body["vector_store"]) == (
        "vector store: exact, 0 vectors, 1 chunks awaiting embedding"
    )


def test_the_conversation_switch_is_the_owners_and_forgets_its_turns(client, alice, bob):
    conv, chunks = turn(alice)
    client.force_login(bob)
    assert client.post(reverse("conversations:memory", args=[conv.pk]), {"enabled": "off"}).status_code == 404
    assert Chunk.objects.filter(conversation=conv).exists()

    client.force_login(alice)
    page = client.get(reverse("conversations:detail", args=[conv.pk])).content.decode()
    assert "Keep this conversation out of memory" in page
    client.post(reverse("conversations:memory", args=[conv.pk]), {"enabled": "off"})
    assert not Chunk.objects.filter(conversation=conv).exists()
    assert (
        "Let memory use this conversation"
        in client.get(reverse("conversations:detail", args=[conv.pk])).content.decode()
    )
