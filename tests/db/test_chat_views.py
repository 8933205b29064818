"""Chat page views: rename without reordering, delete answered as JSON, branch switching, older pages."""

import json

import pytest
from django.urls import reverse

from conversations import branches, services
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db


def test_rename_does_not_reorder_the_sidebar(client, alice):
    older = services.conversation_create(owner=alice, title="older")
    services.conversation_create(owner=alice, title="newer")
    client.force_login(alice)
    response = client.post(
        reverse("conversations:rename", args=[older.id]), {"title": "renamed"}, HTTP_ACCEPT="application/json"
    )
    assert response.json() == {"id": older.id, "title": "renamed"}
    assert list(Conversation.objects.filter(owner=alice).values_list("title", flat=True)) == [
        "newer",
        "renamed",
    ]


def test_delete_answers_json_for_the_page_script(client, alice, bob):
    conversation = services.conversation_create(owner=alice)
    client.force_login(bob)
    assert client.post(reverse("conversations:delete", args=[conversation.id])).status_code == 404
    client.force_login(alice)
    response = client.post(
        reverse("conversations:delete", args=[conversation.id]), HTTP_ACCEPT="application/json"
    )
    assert response.json()["deleted"] is True and not Conversation.objects.filter(pk=conversation.pk).exists()


def test_chat_page_renders_the_active_branch_with_switcher_and_config(client, alice):
    c = services.conversation_create(owner=alice, title="t")
    q = services.message_create(conversation=c, role="user", content="question")
    services.message_create(conversation=c, role="assistant", content="first")
    second = services.message_create(conversation=c, role="assistant", content="second", parent=q)
    Message.objects.filter(pk=second.pk).update(duration_ms=1234, completion_tokens=5)
    client.force_login(alice)
    body = client.get(reverse("conversations:detail", args=[c.id])).content.decode()
    assert "second" in body and ">first<" not in body and "2/2" in body and "1.2 s" in body
    config = json.loads(body.split('id="chat-config" type="application/json">')[1].split("</script>")[0])
    assert config["backoff"]["kind"] in ("linear", "exponential")

    switched = client.post(reverse("conversations:branch", args=[c.id]), {"message_id": second.id - 1})
    assert switched.status_code == 200 and "first" in switched.content.decode()
    c.refresh_from_db()
    assert [m.content for m in branches.active_path(conversation=c).messages] == ["question", "first"]


def test_older_messages_page(client, alice):
    c = services.conversation_create(owner=alice)
    for i in range(branches.PATH_PAGE_SIZE + 5):
        services.message_create(conversation=c, role="user", content=f"m{i}")
    client.force_login(alice)
    body = client.get(reverse("conversations:detail", args=[c.id])).content.decode()
    assert 'id="load-older"' in body and ">m4<" not in body
    first_shown = Message.objects.get(conversation=c, content="m5")
    older = client.get(reverse("conversations:messages", args=[c.id]), {"before": first_shown.id})
    assert older["X-Has-Older"] == "0" and ">m0<" in older.content.decode()


def test_favicon_and_friendly_404(client):
    assert client.get("/favicon.ico").status_code in (301, 302)
    response = client.get("/nowhere/")
    assert response.status_code == 404 and "Page not found" in response.content.decode()
