"""Share links: snapshot, public read-only page, noindex, revocation, owner-only management."""

import pytest
from django.urls import reverse

from conversations import services, sharing
from conversations.models import SharedLink

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(alice):
    c = services.conversation_create(owner=alice, title="Shared trip")
    services.message_create(conversation=c, role="user", content="Plan a trip")
    services.message_create(conversation=c, role="assistant", content="Go to Lisbon")
    return c


def test_share_link_shows_a_snapshot_to_anyone_and_never_later_messages(client, alice, conversation):
    client.force_login(alice)
    response = client.post(reverse("conversations:share", args=[conversation.id]))
    assert response.status_code == 302
    link = SharedLink.objects.get(conversation=conversation)
    assert len(link.token) >= 32
    services.message_create(conversation=conversation, role="user", content="A later secret")
    client.logout()
    page = client.get(f"/s/{link.token}/")
    body = page.content.decode()
    assert page.status_code == 200 and "Go to Lisbon" in body and "A later secret" not in body
    assert page["X-Robots-Tag"].startswith("noindex") and 'name="robots" content="noindex' in body


def test_revoked_link_stops_working(client, alice, conversation):
    link = sharing.share_create(conversation=conversation)
    client.force_login(alice)
    assert client.post(reverse("conversations:share_revoke", args=[link.id])).status_code == 302
    client.logout()
    assert client.get(f"/s/{link.token}/").status_code == 404
    link.refresh_from_db()
    assert link.revoked_at is not None


def test_only_the_owner_can_share_or_revoke(client, bob, conversation):
    link = sharing.share_create(conversation=conversation)
    client.force_login(bob)
    assert client.post(reverse("conversations:share", args=[conversation.id])).status_code == 404
    assert client.post(reverse("conversations:share_revoke", args=[link.id])).status_code == 404
    link.refresh_from_db()
    assert link.revoked_at is None and SharedLink.objects.count() == 1


def test_unknown_token_is_not_found(client):
    assert client.get("/s/not-a-token/").status_code == 404
