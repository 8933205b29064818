"""Writes of API keys (keyword-only, ``<entity>_<verb>``)."""

import hashlib
import secrets

from django.utils import timezone

from api.models import ApiKey

KEY_PREFIX = "cs-"


def hash_key(raw_key: str) -> str:
    """Hex SHA-256 of a full key string (what is stored and looked up)."""
    return hashlib.sha256(raw_key.encode()).hexdigest()


def api_key_create(*, user, name: str = "") -> tuple[ApiKey, str]:
    """A new key for ``user``. Returns ``(api_key, raw_key)``; ``raw_key`` (``cs-<8 hex>_<43 chars>``, 256
    random bits after the prefix) is never stored and cannot be shown again."""
    prefix = secrets.token_hex(4)
    raw_key = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    api_key = ApiKey.objects.create(
        user=user, name=name.strip()[:100], prefix=prefix, key_hash=hash_key(raw_key)
    )
    return api_key, raw_key


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Revoke a key now (idempotent); the next request with it gets 401."""
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key
