"""The API key read every ``/v1`` and ``/api`` request makes (``api.selectors._active_key``: the key, its user
and the user's tier in one fixed statement, docs/overhead-levers.md lever 26) loads what the queryset it replaced
loaded (``ApiKey.objects.select_related("user__tier").get(...)``, kept here as the reference) and refuses what
it refused."""

import pytest
from django.contrib.auth import get_user_model

from api.models import ApiKey
from api.selectors import _active_key, api_key_user
from api.services import api_key_create, api_key_revoke, hash_key
from billing.models import Tier

pytestmark = pytest.mark.django_db


def reference(key_hash: str) -> ApiKey | None:
    try:
        return ApiKey.objects.select_related("user__tier").get(key_hash=key_hash, revoked_at__isnull=True)
    except ApiKey.DoesNotExist:
        return None


def fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def test_a_key_is_read_with_its_user_and_tier_as_the_queryset_read_them(alice, django_assert_num_queries):
    Tier.objects.filter(pk=alice.tier_id).update(display_name="Plus", requests_per_minute=7)
    api_key, raw = api_key_create(user=alice, name="laptop")
    expected = reference(hash_key(raw))
    with django_assert_num_queries(1):
        got = _active_key(key_hash=hash_key(raw))
    with django_assert_num_queries(0):  # the user and the tier came with it
        assert fields(got) == fields(expected)
        assert fields(got.user) == fields(expected.user)
        assert fields(got.user.tier) == fields(expected.user.tier)
    assert got.user.tier.requests_per_minute == 7
    assert got._state.adding is False and got.user._state.db == "default"


def test_unknown_and_revoked_keys_are_not_read(alice, bob):
    _, raw = api_key_create(user=alice)
    assert _active_key(key_hash=hash_key("cs-unknown_key")) is None
    assert reference(hash_key("cs-unknown_key")) is None
    revoked, revoked_raw = api_key_create(user=bob)
    api_key_revoke(api_key=revoked)
    assert _active_key(key_hash=hash_key(revoked_raw)) is None
    assert reference(hash_key(revoked_raw)) is None
    assert _active_key(key_hash=hash_key(raw)).user_id == alice.pk


def test_the_request_user_is_refused_when_inactive_and_its_last_use_is_recorded(alice):
    api_key, raw = api_key_create(user=alice)
    user = api_key_user(raw_key=raw)
    assert user.pk == alice.pk and user.tier.pk == alice.tier_id
    api_key.refresh_from_db()
    assert api_key.last_used_at is not None  # written at the first use
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)
    assert api_key_user(raw_key=raw) is None
