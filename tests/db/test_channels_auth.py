"""The WebSocket handshake's user lookup (``accounts.channels_auth.handshake_user``, lever 57): the session and
the user as two fixed statements, deciding what Channels' own ``get_user`` decides."""

from datetime import timedelta
from importlib import import_module

import pytest
from channels.auth import get_user as channels_get_user
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.channels_auth import handshake_user

pytestmark = pytest.mark.django_db


def _store(key):
    return import_module(settings.SESSION_ENGINE).SessionStore(key)


def _session_of(user) -> tuple[Client, str]:
    client = Client()
    client.force_login(user)
    return client, client.session.session_key


def _who(user) -> int | None:
    return user.pk if user.is_authenticated else None


def test_the_handshake_reads_the_session_and_the_user_in_two_fixed_statements(alice):
    _, key = _session_of(alice)
    store = _store(key)
    with CaptureQueriesContext(connection) as queries:
        user = handshake_user(store)
        assert store[SESSION_KEY] == str(alice.pk)  # the session is loaded into the store: no third read
    assert _who(user) == alice.pk and user.tier_id == alice.tier_id
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == 2
    assert statements[0].startswith('SELECT "session_data" FROM "django_session" WHERE "session_key" = ')
    # Not the ORM's compiled reads ("django_session"."session_key", ... and "accounts_user"."id", ...).
    assert '"django_session"."' not in statements[0]
    assert statements[1].startswith('SELECT "id", ') and f'."{alice._meta.pk.column}"' not in statements[1]


def _change_password(user, key):
    user.set_password("a-new-Secret-456")
    user.save()


def _deactivate(user, key):
    user.is_active = False
    user.save()


def _expire(user, key):
    Session.objects.filter(pk=key).update(expire_date=timezone.now() - timedelta(seconds=1))


def _name_an_unlisted_backend(user, key):
    session = _store(key)
    session[BACKEND_SESSION_KEY] = "some.removed.Backend"
    session.save()


def _tamper(user, key):
    Session.objects.filter(pk=key).update(session_data="not-a-signed-session")


def test_the_handshake_decides_as_channels_get_user_does(alice, make_user):
    """A live session signs its user in; a logged-out, expired, tampered or unknown session, one whose user changed
    the password, was deactivated or deleted, or one naming a backend no longer listed, signs in nobody."""
    spoil = {
        "logged out": lambda user, key: Session.objects.filter(pk=key).delete(),
        "password changed": _change_password,
        "deactivated": _deactivate,
        "deleted": lambda user, key: user.delete(),
        "expired": _expire,
        "unlisted backend": _name_an_unlisted_backend,
        "tampered": _tamper,
    }
    _, live = _session_of(alice)
    keys = [live]
    for name, change in spoil.items():
        user = make_user(name.replace(" ", "-"))
        _, key = _session_of(user)
        change(user, key)
        keys.append(key)
    keys += [None, "no-such-key"]

    ours = [_who(handshake_user(_store(key))) for key in keys]
    assert ours == [alice.pk] + [None] * (len(keys) - 1)
    # Channels' lookup on fresh stores, run in this thread (its database_sync_to_async wrapper would run it on
    # another connection, outside the test's transaction).
    assert [_who(channels_get_user.func({"session": _store(key)})) for key in keys] == ours


def test_a_session_whose_password_changed_is_flushed_as_channels_flushes_it(alice):
    _, key = _session_of(alice)
    alice.set_password("a-new-Secret-456")
    alice.save()
    store = _store(key)
    assert not handshake_user(store).is_authenticated
    assert not Session.objects.filter(pk=key).exists() and store.session_key is None


def test_an_expired_session_leaves_the_store_empty_as_loading_it_would(alice):
    _, key = _session_of(alice)
    Session.objects.filter(pk=key).update(expire_date=timezone.now() - timedelta(seconds=1))
    ours, django_loaded = _store(key), _store(key)
    handshake_user(ours)
    assert dict(ours.items()) == dict(django_loaded.items()) == {}
    assert ours.session_key is None and django_loaded.session_key is None


@pytest.mark.django_db(transaction=True)
async def test_a_session_engine_without_rows_still_goes_through_channels_lookup(alice, settings):
    """A store that keeps no rows (signed cookies) cannot be read by the fixed statements: Channels' own
    ``get_user`` signs its user in."""
    from asgiref.sync import sync_to_async
    from channels.auth import UserLazyObject
    from django.utils.functional import LazyObject

    from accounts.channels_auth import OutageTolerantAuthMiddleware

    settings.SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
    store = _store(None)
    store[SESSION_KEY] = str(alice.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = await sync_to_async(alice.get_session_auth_hash)()
    session = LazyObject()
    session._wrapped = store
    scope = {"session": session, "user": UserLazyObject()}
    await OutageTolerantAuthMiddleware(None).resolve_scope(scope)
    assert scope["user"]._wrapped.pk == alice.pk and "auth_unavailable" not in scope
