import pytest
from django.urls import reverse

from billing.models import Tier
from conversations import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, make_user):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


@pytest.mark.parametrize(
    "name",
    [
        "admin:accounts_user_changelist",
        "admin:billing_tier_changelist",
        "admin:billing_usagerecord_changelist",
        "admin:conversations_conversation_changelist",
        "admin:conversations_message_changelist",
    ],
)
def test_admin_changelists_load(admin_client, name):
    assert admin_client.get(reverse(name)).status_code == 200


def test_admin_user_search_and_tier_filter(admin_client, alice):
    response = admin_client.get(
        reverse("admin:accounts_user_changelist"), {"q": "alice", "tier__id__exact": alice.tier_id}
    )
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == [alice]


def test_admin_conversation_page_shows_messages_inline(admin_client, alice):
    conversation = services.conversation_create(owner=alice, title="t")
    services.message_create(conversation=conversation, role="user", content="inline me")
    response = admin_client.get(reverse("admin:conversations_conversation_change", args=[conversation.id]))
    assert response.status_code == 200
    assert b"inline me" in response.content


def test_admin_changes_a_users_tier(admin_client, alice):
    paid = Tier.objects.get(name="paid")
    url = reverse("admin:accounts_user_change", args=[alice.id])
    form = admin_client.get(url).context["adminform"].form
    data = {
        k: v for k, v in form.initial.items() if v is not None and k not in ("groups", "user_permissions")
    }
    data.update(
        tier=paid.id,
        date_joined_0=alice.date_joined.strftime("%Y-%m-%d"),
        date_joined_1=alice.date_joined.strftime("%H:%M:%S"),
        last_login_0="",
        last_login_1="",
    )
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    alice.refresh_from_db()
    assert alice.tier == paid
