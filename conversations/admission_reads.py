"""Admission's one read of the user (``conversations.admission.admission_check``), and the quota reservation it
carries.

One statement reads how many of the user's replies are active (the concurrency check), the user's team
membership (whose pool a reservation draws from) and, for a chat send, the replies queued ahead of the new one
(its place in line): levers 28 and 30 in docs/overhead-levers.md, three statements before. Inside the
transaction that stores the reply, the same statement also reserves the reply's quota for a user in no team
(``billing.quota.CARRIED_RESERVE_SQL``, a ``WITH`` item; lever 48): the upsert was a round trip of its own.
A refusal by the checks that follow the read (concurrency, the per-minute rate) raises inside that transaction,
whose rollback releases the reservation with everything else.
"""

from __future__ import annotations

from functools import cache

from billing.quota import CARRIED_RESERVE_COLUMNS, CARRIED_RESERVE_SQL, MEMBERSHIP_SQL
from conversations.selectors import (
    ACTIVE_REPLIES_SQL,
    PLACE_IN_LINE_SQL,
    active_replies_params,
    place_in_line_params,
)
from database.sql import fetch_one

#: ``(organization_id, daily_token_cap)`` of a team member, None for a user in no team.
Membership = tuple[int, int | None] | None


@cache
def _user_reads_sql(*, place_in_line: bool, reserve: bool) -> str:
    """The one statement: the user's active replies and team membership, each the fixed statement its owner runs
    alone (``conversations.selectors``, ``billing.quota``), then with ``place_in_line`` the replies queued
    ahead, then with ``reserve`` the carried reservation's columns."""
    extra = f", ({PLACE_IN_LINE_SQL})" if place_in_line else ""
    if not reserve:
        return f"""
SELECT ({ACTIVE_REPLIES_SQL}), mb.organization_id, mb.daily_token_cap{extra}
  FROM (SELECT 1) AS one LEFT JOIN ({MEMBERSHIP_SQL}) AS mb ON true
"""
    return f"""
WITH {CARRIED_RESERVE_SQL}
SELECT ({ACTIVE_REPLIES_SQL}), mb.organization_id, mb.daily_token_cap{extra}, r.*
  FROM (SELECT 1) AS one LEFT JOIN ({MEMBERSHIP_SQL}) AS mb ON true LEFT JOIN reserve AS r ON true
"""


def user_admission_reads(
    *, user, place_in_line_of: str | None = None, reserve: dict | None = None
) -> tuple[int, Membership, int | None, tuple | None]:
    """``(active replies, membership, queued ahead, reserved)`` of ``user`` in one statement (docs/overhead.md,
    levers 28, 30 and 48; four before): how many of the user's replies are queued or streaming
    (``selectors.active_generation_count``); the user's team membership ``(organization_id,
    daily_token_cap)`` or None, which ``quota_reserve`` takes instead of reading it again; for
    ``place_in_line_of`` (a model name), how many replies of that model are queued ahead of a new reply of
    the user's tier (``reply_dispatch.queue_position`` of a reply not stored yet, less one), else None; and,
    with ``reserve`` (``billing.quota.carried_reserve_params``), the carried reservation's row
    (``CARRIED_RESERVE_COLUMNS`` values, all None when it reserved nothing: a refusal, or a team member;
    ``billing.quota.carried_reserve_outcome`` reads it), else None. With ``reserve`` it must run inside the
    transaction that stores the reply. Raises what the driver raises."""
    params = {**active_replies_params(user), "user": user.pk}
    if place_in_line_of is not None:
        params |= place_in_line_params(model_name=place_in_line_of, priority=user.tier.queue_priority)
    if reserve is not None:
        params |= reserve
    row = fetch_one(
        _user_reads_sql(place_in_line=place_in_line_of is not None, reserve=reserve is not None), params
    )
    active, organization_id, cap, *rest = row
    ahead = rest.pop(0) if place_in_line_of is not None else None
    reserved = tuple(rest) if reserve is not None else None
    assert reserved is None or len(reserved) == CARRIED_RESERVE_COLUMNS
    return active, None if organization_id is None else (organization_id, cap), ahead, reserved
