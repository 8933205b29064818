"""Sessions that really end: log-out, a password change, deactivation or deletion close the user's open
WebSockets, and a socket whose session is no longer valid refuses further frames.

The closing goes through the per-user channel-layer group (``events.broadcast.user_group``): every
change below publishes ``{"type": "session_ended", "reason": ...}`` to it after commit. Each socket then
closes (4401) as :func:`end_sessions` says: log-out closes that session's sockets (other browsers stay
signed in), a password change closes those whose session it invalidated (:func:`session_is_current`), a
deactivation or deletion closes them all.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from importlib import import_module

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_delete, pre_save
from django.dispatch import receiver
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from database.sql import fetch_one
from events import broadcast

logger = logging.getLogger(__name__)


def session_cookie_for(user) -> str:
    """A new signed-in session for ``user`` (the session store of ``SESSION_ENGINE``, as a log-in through
    ``ModelBackend`` would write it); returns the ``Cookie`` header value ``"<SESSION_COOKIE_NAME>=<key>"``.
    For the load and drill commands, which sign in many users without their passwords."""
    session = import_module(settings.SESSION_ENGINE).SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}"


def session_fingerprint(session_key: str | None) -> str:
    """A digest naming a session in channel-layer events without spreading its key ("" for none)."""
    return hashlib.sha256(session_key.encode()).hexdigest()[:32] if session_key else ""


def session_is_current(*, session_key: str | None, user_id: int) -> bool:
    """Whether the session ``session_key`` still signs in ``user_id``: the session exists and has not expired
    (not flushed by log-out), names that user, the user exists and is active, and the session's auth hash
    matches the user's current password (Django's session verification).

    With database sessions (Django's default engine) the session row and the user's ``is_active`` and
    ``password`` are one fixed statement (``database.sql.fetch_one``; docs/overhead-levers.md, lever 24): it runs on
    every frame of a socket the admission warmer has not verified, a send included. Other engines: the
    session store's own read, then the user row."""
    if not session_key:
        return False
    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    if not keeps_rows(store_class):
        store = store_class(session_key)
        if not _names_user(store, user_id):
            return False
        return _signs_in(store, get_user_model().objects.filter(pk=user_id).first())
    row = fetch_one(
        _session_and_user_sql(store_class), {"key": session_key, "user": user_id, "now": timezone.now()}
    )
    if row is None:  # no such session, or expired
        return False
    session_data, is_active, password = row
    session = store_class().decode(session_data)  # {} when its signature does not verify
    if not _names_user(session, user_id):
        return False
    user = None if is_active is None else get_user_model()(pk=user_id, is_active=is_active, password=password)
    return _signs_in(session, user)


def keeps_rows(store_class) -> bool:
    """Whether the session store ``store_class`` keeps its sessions as rows of a model (Django's database
    engine and the engines built on it), which the fixed statements here can read."""
    return hasattr(store_class, "get_model_class")


@functools.cache
def _session_and_user_sql(store_class) -> str:
    """The session row's data, with the user's ``is_active`` and ``password`` (NULL when the user is gone),
    for :func:`session_is_current`: built once per session model."""
    session = store_class.get_model_class()._meta
    user = get_user_model()._meta
    column = user.get_field
    return (
        f'SELECT s."{session.get_field("session_data").column}", u."{column("is_active").column}", '
        f'u."{column("password").column}" FROM "{session.db_table}" s '
        f'LEFT JOIN "{user.db_table}" u ON u."{user.pk.column}" = %(user)s '
        f'WHERE s."{session.pk.column}" = %(key)s AND s."{session.get_field("expire_date").column}" > %(now)s'
    )


def _names_user(session, user_id: int) -> bool:
    """Whether ``session`` (a session store or its decoded dict) was written by a log-in of ``user_id``."""
    return str(session.get(SESSION_KEY)) == str(user_id) and bool(session.get(BACKEND_SESSION_KEY))


def _signs_in(session, user) -> bool:
    """Whether ``user`` (None: gone) is active and ``session``'s auth hash matches its current password."""
    return user is not None and user.is_active and hash_matches(session, user.get_session_auth_hash())


def hash_matches(session, auth_hash: str) -> bool:
    """Whether ``session`` carries ``auth_hash`` (a user's ``get_session_auth_hash()``)."""
    session_hash = session.get(HASH_SESSION_KEY)
    return bool(session_hash) and constant_time_compare(session_hash, auth_hash)


#: What the last :func:`sessions_current` pass worked out, reused by the next for rows that did not change:
#: session key -> (its stored data, that data decoded); (user id, password hash) -> the session auth hash.
_decoded: dict[str, tuple[str, dict]] = {}
_auth_hashes: dict[tuple[int, str], str] = {}


def sessions_current(*, pairs) -> set[tuple[str, int]] | None:
    """The ``(session_key, user_id)`` pairs of ``pairs`` whose session still signs in that user, by the same
    rules as :func:`session_is_current`, in two queries for all of them (one on the sessions, one on the
    users). None when ``SESSION_ENGINE`` keeps no session rows in the database (cache or cookie sessions):
    the caller checks each session on its own then.

    The admission warmer calls it for every open socket of the process twice a second. A session whose stored
    data is the same string as at the last call is not decoded again (a signature check and a JSON parse), and a
    user whose password hash is the same is not hashed again (an HMAC): both are pure functions of what the
    queries read, so the answer is the one a fresh decode gives (docs/overhead-levers.md, lever 55). What the
    call did not see is forgotten. Called from one thread at a time (the warmer's)."""
    global _decoded, _auth_hashes
    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    if not keeps_rows(store_class):
        return None
    keys = {key for key, _ in pairs if key}
    rows = store_class.get_model_class().objects.filter(session_key__in=keys, expire_date__gt=timezone.now())
    decoded, data = {}, {}
    for key, raw in rows.values_list("session_key", "session_data"):
        known = _decoded.get(key)
        decoded[key] = known if known is not None and known[0] == raw else (raw, store_class().decode(raw))
        data[key] = decoded[key][1]
    User = get_user_model()
    users = User.objects.filter(pk__in={uid for _, uid in pairs}).values_list("pk", "is_active", "password")
    hashes, active_hash = {}, {}  # user id -> its auth hash while it is active
    for pk, is_active, password in users:
        if is_active:
            known = _auth_hashes.get((pk, password))
            hashes[(pk, password)] = known or User(pk=pk, password=password).get_session_auth_hash()
            active_hash[pk] = hashes[(pk, password)]
    _decoded, _auth_hashes = decoded, hashes
    current = set()
    for key, user_id in pairs:
        session, auth_hash = data.get(key), active_hash.get(user_id)
        if (
            session is not None
            and auth_hash
            and _names_user(session, user_id)
            and hash_matches(session, auth_hash)
        ):
            current.add((key, user_id))
    return current


#: ``end_sessions(session=VERIFY)``: close only the sockets whose session is no longer valid.
VERIFY = "verify"


def end_sessions(*, user_id: int, reason: str, session_key: str | None = None, verify: bool = False) -> None:
    """Tell the user's sockets (after commit) that sessions ended. With neither ``session_key`` nor
    ``verify`` every socket of the user closes (deactivation, deletion); ``session_key`` closes that
    session's sockets (log-out, before its store is even flushed) plus any whose session is invalid;
    ``verify`` closes only sockets whose session is invalid (password change: the changing session stays).
    Never raises: an unreachable channel layer must not fail a log-out."""
    named = VERIFY if verify else session_fingerprint(session_key)

    def send():
        try:
            broadcast.publish_to_user(user_id, {"type": "session_ended", "reason": reason}, session=named)
        except Exception:
            logger.warning("could not tell user %s's sockets that a session ended", user_id, exc_info=True)

    from django.db import transaction

    transaction.on_commit(send)


@receiver(user_logged_out)
def _on_logout(sender, request, user, **kwargs):
    if user is not None:
        session_key = getattr(getattr(request, "session", None), "session_key", None)
        end_sessions(user_id=user.pk, reason="logged_out", session_key=session_key)


@receiver(pre_save, sender=settings.AUTH_USER_MODEL)
def _on_user_change(sender, instance, raw=False, update_fields=None, **kwargs):
    if raw or instance.pk is None:
        return
    if update_fields is not None and not {"password", "is_active"} & set(update_fields):
        return
    before = sender.objects.filter(pk=instance.pk).values("password", "is_active").first()
    if before is None:
        return
    if before["is_active"] and not instance.is_active:
        end_sessions(user_id=instance.pk, reason="deactivated")
    elif before["password"] != instance.password:
        end_sessions(user_id=instance.pk, reason="password_changed", verify=True)


@receiver(post_delete, sender=settings.AUTH_USER_MODEL)
def _on_user_delete(sender, instance, **kwargs):
    end_sessions(user_id=instance.pk, reason="deleted")
