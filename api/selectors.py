"""Reads of API keys, and the one place a bearer key becomes a user."""

from django.http import Http404
from django.utils import timezone

from api.models import ApiKey
from api.services import KEY_PREFIX, hash_key

#: ``last_used_at`` is a key's last use to this many seconds: a key used again sooner is not written again
#: (one UPDATE and commit less on nearly every API request; the keys page shows it to the minute).
LAST_USED_RESOLUTION_S = 60


def api_key_user(*, raw_key: str):
    """The active user that ``raw_key`` (``cs-...``) belongs to, or None for an unknown or revoked key or an
    inactive user. Records ``last_used_at`` to :data:`LAST_USED_RESOLUTION_S` (a side effect kept here so
    every caller records it)."""
    if not raw_key or not raw_key.startswith(KEY_PREFIX) or len(raw_key) > 200:
        return None
    try:
        api_key = ApiKey.objects.select_related("user__tier").get(
            key_hash=hash_key(raw_key), revoked_at__isnull=True
        )
    except ApiKey.DoesNotExist:
        return None
    if not api_key.user.is_active:
        return None
    now = timezone.now()
    last = api_key.last_used_at
    if last is None or (now - last).total_seconds() >= LAST_USED_RESOLUTION_S:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
    return api_key.user


def api_keys_for_user(*, user) -> list[ApiKey]:
    """``user``'s keys, newest first, revoked ones included."""
    return list(ApiKey.objects.filter(user=user).order_by("-created_at", "-id"))


def api_key_get_for_user(*, user, key_id) -> ApiKey:
    """One of ``user``'s keys; raises Http404 for another user's key or a bad id."""
    try:
        return ApiKey.objects.get(pk=int(key_id), user=user)
    except (ApiKey.DoesNotExist, TypeError, ValueError) as exc:
        raise Http404("API key not found") from exc
