"""API keys with the real database: creation, hashing, revocation, inactive users, the keys page, the admin,
``manage.py create_api_key``, and that a key only ever reaches its own user's conversations."""

import hashlib
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.urls import reverse

from api.models import ApiKey
from api.selectors import api_key_user
from api.services import api_key_create, api_key_revoke
from conversations.models import Conversation

pytestmark = pytest.mark.django_db


def test_key_is_stored_as_sha256_only_with_visible_prefix(alice):
    api_key, raw = api_key_create(user=alice, name="laptop")
    assert raw.startswith(f"cs-{api_key.prefix}_") and len(raw) >= 50
    stored = ApiKey.objects.get(pk=api_key.pk)
    assert stored.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in str([getattr(stored, f.attname) for f in ApiKey._meta.fields])
    assert api_key_user(raw_key=raw) == alice
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at is not None


def test_last_used_is_written_at_most_once_a_minute(alice, django_assert_num_queries):
    api_key, raw = api_key_create(user=alice)
    api_key_user(raw_key=raw)
    first = ApiKey.objects.get(pk=api_key.pk).last_used_at
    with django_assert_num_queries(1):  # the lookup only: used again within the minute
        assert api_key_user(raw_key=raw) == alice
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at == first
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=first - timedelta(seconds=61))
    with django_assert_num_queries(2):  # a minute later it is written again
        assert api_key_user(raw_key=raw) == alice
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at > first


def test_two_keys_never_collide_and_wrong_keys_fail(alice):
    _, first = api_key_create(user=alice)
    _, second = api_key_create(user=alice)
    assert first != second
    assert api_key_user(raw_key=first[:-1] + ("A" if first[-1] != "A" else "B")) is None
    assert api_key_user(raw_key="") is None and api_key_user(raw_key="sk-not-ours") is None


def test_revoked_key_and_inactive_or_deleted_user_fail_at_once(alice, bob):
    api_key, raw = api_key_create(user=alice)
    api_key_revoke(api_key=api_key)
    assert api_key_user(raw_key=raw) is None
    assert ApiKey.objects.get(pk=api_key.pk).revoked_at is not None

    _, bob_raw = api_key_create(user=bob)
    bob.is_active = False
    bob.save(update_fields=["is_active"])
    assert api_key_user(raw_key=bob_raw) is None
    bob.delete()
    assert api_key_user(raw_key=bob_raw) is None and not ApiKey.objects.filter(user_id=bob.pk).exists()


def test_revoked_key_gets_401_on_v1(client, alice):
    api_key, raw = api_key_create(user=alice)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    assert client.get("/v1/models", **auth).status_code == 200
    api_key_revoke(api_key=api_key)
    response = client.get("/v1/models", **auth)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_another_users_key_never_reaches_your_conversations(client, alice, bob):
    mine = Conversation.objects.create(owner=alice, title="alice's secret")
    _, bob_raw = api_key_create(user=bob)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {bob_raw}"}
    assert client.get("/api/conversations", **auth).json()["items"] == []
    assert client.get(f"/api/conversations/{mine.id}", **auth).status_code == 404
    response = client.patch(
        f"/api/conversations/{mine.id}", {"title": "pwned"}, content_type="application/json", **auth
    )
    assert response.status_code == 404
    assert client.delete(f"/api/conversations/{mine.id}", **auth).status_code == 404
    mine.refresh_from_db()
    assert mine.title == "alice's secret"


def test_keys_page_shows_secret_once_then_only_prefix_and_revokes(client, alice, bob):
    client.force_login(alice)
    response = client.post(reverse("api:keys"), {"name": "laptop"})
    assert response.status_code == 200
    raw = response.context["new_key"]
    assert raw in response.content.decode() and response["Cache-Control"] == "no-store"
    api_key = ApiKey.objects.get(user=alice)
    page = client.get(reverse("api:keys")).content.decode()
    assert raw not in page and f"cs-{api_key.prefix}_" in page and "laptop" in page

    bob_key, _ = api_key_create(user=bob)
    assert client.post(reverse("api:key-revoke", args=[bob_key.id])).status_code == 404
    assert ApiKey.objects.get(pk=bob_key.pk).revoked_at is None
    assert client.post(reverse("api:key-revoke", args=[api_key.id])).status_code == 302
    assert api_key_user(raw_key=raw) is None


def test_keys_page_needs_login(client):
    assert client.get(reverse("api:keys")).status_code == 302


def test_admin_creates_key_and_shows_secret_once(admin_client, alice):
    response = admin_client.post(
        reverse("admin:api_apikey_add"), {"user": alice.pk, "name": "ops"}, follow=True
    )
    assert response.status_code == 200
    api_key = ApiKey.objects.get(user=alice)
    shown = [str(m) for m in response.context["messages"]]
    raw = next(word for m in shown for word in m.split() if word.startswith("cs-"))
    assert api_key_user(raw_key=raw) == alice and api_key.name == "ops"


def test_create_api_key_command_prints_a_working_key(alice, capsys):
    call_command("create_api_key", "alice", "--name", "ci")
    raw = capsys.readouterr().out.strip()
    assert api_key_user(raw_key=raw) == alice
    assert ApiKey.objects.get(user=alice).name == "ci"
