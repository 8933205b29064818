"""A socket's session check (``accounts.sessions.session_is_current``) reads the session row and the user in one
fixed statement (docs/overhead-levers.md, lever 24). It must answer what the two reads it replaced answered (Django's
session store, then the user row: kept here as the reference) for every way a session stops signing a user
in, in one statement."""

from datetime import timedelta
from importlib import import_module

import pytest
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.sessions.models import Session
from django.utils import timezone

from accounts.sessions import _names_user, _signs_in, session_cookie_for, session_is_current


def reference(*, session_key, user_id) -> bool:
    """The check as it was: the session store's read, then the user row through the ORM."""
    if not session_key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    if not _names_user(store, user_id):
        return False
    return _signs_in(store, get_user_model().objects.filter(pk=user_id).first())


def key_of(user) -> str:
    return session_cookie_for(user).split("=", 1)[1]


def _rewrite(key, **changes):
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    data = store.load()
    for name, value in changes.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = value
    Session.objects.filter(session_key=key).update(session_data=store.encode(data))


def _sessions(key):
    return Session.objects.filter(session_key=key)


def _logged_out(alice, bob, key):
    _sessions(key).delete()  # log-out flushes the row
    return key, alice.pk


def _expired(alice, bob, key):
    _sessions(key).update(expire_date=timezone.now() - timedelta(seconds=1))
    return key, alice.pk


def _password_changed(alice, bob, key):
    alice.set_password("a new one")
    alice.save()
    return key, alice.pk


def _deactivated(alice, bob, key):
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)
    return key, alice.pk


def _user_deleted(alice, bob, key):
    get_user_model().objects.filter(pk=alice.pk).delete()
    return key, alice.pk


def _tampered(alice, bob, key):
    _sessions(key).update(session_data="tampered:data")
    return key, alice.pk


def _rewritten(**changes):
    def arrange(alice, bob, key):
        _rewrite(key, **{name: (value(bob) if callable(value) else value) for name, value in changes.items()})
        return key, alice.pk

    return arrange


#: case -> (arrange(alice, bob, alice's session key) -> (session_key, user_id) to check, expected answer)
CASES = {
    "current": (lambda alice, bob, key: (key, alice.pk), True),
    "another user's id": (lambda alice, bob, key: (key, bob.pk), False),
    "a user id that does not exist": (lambda alice, bob, key: (key, 10**9), False),
    "no key": (lambda alice, bob, key: ("", alice.pk), False),
    "an unknown key": (lambda alice, bob, key: ("x" * 32, alice.pk), False),
    "logged out (row flushed)": (_logged_out, False),
    "expired": (_expired, False),
    "password changed": (_password_changed, False),
    "deactivated": (_deactivated, False),
    "user deleted": (_user_deleted, False),
    "data that does not verify": (_tampered, False),
    "no backend in the session": (_rewritten(_auth_user_backend=None), False),
    "no auth hash in the session": (_rewritten(_auth_user_hash=None), False),
    "another user's session": (_rewritten(**{SESSION_KEY: lambda bob: str(bob.pk)}), False),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", list(CASES))
def test_it_answers_what_the_store_and_user_reads_answered(case, alice, bob, django_assert_num_queries):
    arrange, expected = CASES[case]
    session_key, user_id = arrange(alice, bob, key_of(alice))
    assert reference(session_key=session_key, user_id=user_id) is expected
    with django_assert_num_queries(0 if not session_key else 1):
        assert session_is_current(session_key=session_key, user_id=user_id) is expected
