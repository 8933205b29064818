import pytest
from django.urls import reverse

from accounts.models import User
from billing.models import Tier

pytestmark = pytest.mark.django_db


def test_new_user_joins_free_tier(alice):
    assert alice.tier.name == "free"


def test_signup_creates_user_logs_in_and_lands_on_empty_chat(client):
    response = client.post(
        reverse("accounts:signup"),
        {
            "username": "carol",
            "email": "carol@example.com",
            "password1": "Very-secret-42",
            "password2": "Very-secret-42",
        },
    )
    assert response.status_code == 302
    assert response.url == reverse("conversations:new")
    user = User.objects.get(username="carol")
    assert user.tier.name == "free"
    assert user.email == "carol@example.com"
    page = client.get(response.url)
    assert page.status_code == 200
    assert list(page.context["conversations"]) == []
    assert page.context["conversation"] is None


def test_signup_with_mismatched_passwords_is_refused_and_stores_nothing(client):
    response = client.post(
        reverse("accounts:signup"),
        {
            "username": "carol",
            "email": "carol@example.com",
            "password1": "Very-secret-42",
            "password2": "other-42x",
        },
    )
    assert response.status_code == 400
    assert response.context["form"].errors
    assert not User.objects.filter(username="carol").exists()


def test_login_page_is_served_and_login_redirects_to_chat(client, alice):
    assert client.get(reverse("accounts:login")).status_code == 200
    response = client.post(reverse("accounts:login"), {"username": "alice", "password": "pw-Secret-123"})
    assert response.status_code == 302
    assert response.url == reverse("conversations:new")


def test_login_with_wrong_password_stays_on_login_page(client, alice):
    response = client.post(reverse("accounts:login"), {"username": "alice", "password": "wrong"})
    assert response.status_code == 200
    assert "_auth_user_id" not in client.session


def test_logout_requires_post_and_logs_out(client, alice):
    client.force_login(alice)
    response = client.post(reverse("accounts:logout"))
    assert response.status_code == 302
    assert "_auth_user_id" not in client.session


def test_chat_page_requires_login(client):
    response = client.get(reverse("conversations:new"))
    assert response.status_code == 302
    assert reverse("accounts:login") in response.url


def test_profile_shows_tier_and_usage(client, alice):
    client.force_login(alice)
    response = client.get(reverse("accounts:profile"))
    assert response.status_code == 200
    assert response.context["tier"] == Tier.objects.get(name="free")
    assert response.context["usage_today"]["total_tokens"] == 0


def test_sessions_current_checks_many_sessions_as_session_is_current_does(alice, make_user):
    """The warmer's bulk check agrees with the per-frame one: a live session, a flushed one, one of a user
    whose password changed, one of a deactivated user, and a key that names another user."""
    from django.test import Client

    from accounts.sessions import session_is_current, sessions_current

    def session_of(user):
        client = Client()
        client.force_login(user)
        return client, client.session.session_key

    bob, carol = make_user("bob"), make_user("carol")
    _, live = session_of(alice)
    flushed_client, flushed = session_of(alice)
    flushed_client.session.flush()
    _, changed = session_of(bob)
    bob.set_password("a-new-Secret-456")
    bob.save()
    _, deactivated = session_of(carol)
    carol.is_active = False
    carol.save()
    pairs = [
        (live, alice.pk),
        (flushed, alice.pk),
        (changed, bob.pk),
        (deactivated, carol.pk),
        (live, bob.pk),
    ]
    assert sessions_current(pairs=pairs) == {(live, alice.pk)}
    assert {p for p in pairs if session_is_current(session_key=p[0], user_id=p[1])} == {(live, alice.pk)}


def test_a_repeated_session_pass_decodes_and_hashes_only_what_changed(alice, make_user, monkeypatch):
    """The warmer's pass twice a second (lever 55): rows unchanged since the last pass are neither decoded nor
    hashed again, and a change between passes (a password, a session written anew, a deactivation, a log-out)
    is seen by the next pass as a fresh check sees it."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth.models import AbstractBaseUser
    from django.test import Client

    from accounts.sessions import session_is_current, sessions_current

    def session_of(user):
        client = Client()
        client.force_login(user)
        return client, client.session.session_key

    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    calls = {"decode": 0, "hash": 0}
    decode, auth_hash = store_class.decode, AbstractBaseUser.get_session_auth_hash

    def counted_decode(self, raw):
        calls["decode"] += 1
        return decode(self, raw)

    def counted_hash(self):
        calls["hash"] += 1
        return auth_hash(self)

    monkeypatch.setattr(store_class, "decode", counted_decode)
    monkeypatch.setattr(AbstractBaseUser, "get_session_auth_hash", counted_hash)
    bob, carol, dave = make_user("bob"), make_user("carol"), make_user("dave")
    _, a = session_of(alice)
    _, b = session_of(bob)
    _, c = session_of(carol)
    d_client, d = session_of(dave)
    pairs = [(a, alice.pk), (b, bob.pk), (c, carol.pk), (d, dave.pk)]

    def fresh():
        return {p for p in pairs if session_is_current(session_key=p[0], user_id=p[1])}

    assert sessions_current(pairs=pairs) == set(pairs)
    calls.update(decode=0, hash=0)
    assert sessions_current(pairs=pairs) == set(pairs)
    assert calls == {"decode": 0, "hash": 0}

    bob.set_password("a-new-Secret-456")
    bob.save()
    carol.is_active = False
    carol.save()
    d_client.logout()  # dave's session row is gone
    session = store_class(session_key=a)  # alice's session rewritten to name another user
    session["_auth_user_id"] = str(bob.pk)
    session.save()
    calls.update(decode=0, hash=0)
    current = sessions_current(pairs=pairs)
    assert calls["decode"] == 1  # alice's rewritten row only; bob's and carol's rows did not change
    assert current == fresh() == set()
