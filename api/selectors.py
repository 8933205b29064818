"""Reads of API keys, and the one place a bearer key becomes a user."""

import functools

from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import Http404
from django.utils import timezone

from api.models import ApiKey
from api.services import KEY_PREFIX, hash_key
from billing.models import Tier
from database.sql import fetch_one, instances_from_row, select_list

#: ``last_used_at`` is a key's last use to this many seconds: a key used again sooner is not written again
#: (one UPDATE and commit less on nearly every API request; the keys page shows it to the minute).
LAST_USED_RESOLUTION_S = 60


def api_key_user(*, raw_key: str):
    """The active user that ``raw_key`` (``cs-...``) belongs to, or None for an unknown or revoked key or an
    inactive user. Records ``last_used_at`` to :data:`LAST_USED_RESOLUTION_S` (a side effect kept here so
    every caller records it)."""
    if not raw_key or not raw_key.startswith(KEY_PREFIX) or len(raw_key) > 200:
        return None
    api_key = _active_key(key_hash=hash_key(raw_key))
    if api_key is None:
        return None
    if not api_key.user.is_active:
        return None
    now = timezone.now()
    last = api_key.last_used_at
    if last is None or (now - last).total_seconds() >= LAST_USED_RESOLUTION_S:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
    return api_key.user


def _active_key(*, key_hash: str) -> ApiKey | None:
    """The unrevoked key with ``key_hash``, its user and the user's tier loaded with it (what
    ``ApiKey.objects.select_related("user__tier").get(...)`` loads), or None. One fixed statement, prepared
    once per connection (``database/sql.py``; docs/overhead-levers.md, lever 26): every API request reads it, and the
    queryset's three-table join was compiled afresh each time."""
    sql, row_fields = _key_statement(settings.MEMORY_ENABLED)
    row = fetch_one(sql, {"key_hash": key_hash})
    if row is None:
        return None
    values = iter(row)
    api_key, user, tier = instances_from_row(row_fields, values)
    user.tier = tier
    # Whether a completion in a new conversation would read its question's vector, read with the key (lever 40):
    # conversations.recall.question_prefetch takes it instead of asking PostgreSQL again before admission.
    user.question_vector_wanted = bool(next(values))
    api_key.user = user
    return api_key


@functools.cache
def _key_statement(memory_enabled: bool) -> tuple[str, tuple[tuple[type, tuple], ...]]:
    """``(sql, ((model, its concrete fields), ...))`` of :func:`_active_key`: the key, its user and the tier,
    in the order the statement returns their columns, then whether the user's reply in a new conversation
    would read its question's vector (``conversations.recall.new_conversation_vector_wanted_sql``, false for a
    tier without memory). Built once per process and ``MEMORY_ENABLED``."""
    from conversations.recall import new_conversation_vector_wanted_sql

    user_model = get_user_model()
    columns, row_fields = select_list((("k", ApiKey), ("u", user_model), ("t", Tier)))
    key_table, user_table, tier_table = (model._meta.db_table for model, _ in row_fields)
    key_user = ApiKey._meta.get_field("user").column
    user_tier = user_model._meta.get_field("tier").column
    user_id = f'u."{user_model._meta.pk.column}"'
    wanted = new_conversation_vector_wanted_sql(user_id) if memory_enabled else "false"
    columns += f', CASE WHEN t."memory_budget_tokens" > 0 THEN {wanted} ELSE false END'
    sql = (
        f'SELECT {columns} FROM "{key_table}" k'
        f' JOIN "{user_table}" u ON u."{user_model._meta.pk.column}" = k."{key_user}"'
        f' JOIN "{tier_table}" t ON t."{Tier._meta.pk.column}" = u."{user_tier}"'
        f' WHERE k."key_hash" = %(key_hash)s AND k."revoked_at" IS NULL'
    )
    return sql, row_fields


def api_keys_for_user(*, user) -> list[ApiKey]:
    """``user``'s keys, newest first, revoked ones included."""
    return list(ApiKey.objects.filter(user=user).order_by("-created_at", "-id"))


def api_key_get_for_user(*, user, key_id) -> ApiKey:
    """One of ``user``'s keys; raises Http404 for another user's key or a bad id."""
    try:
        return ApiKey.objects.get(pk=int(key_id), user=user)
    except (ApiKey.DoesNotExist, TypeError, ValueError) as exc:
        raise Http404("API key not found") from exc
