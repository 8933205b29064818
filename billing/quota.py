"""The daily token quota, exact under concurrency: reserve at admission, settle when the reply ends.

Every user has one :class:`~billing.models.DailyQuota` row per quota day. Admission reserves the most a
reply can cost (prompt upper bound + the tier's reply limit) with ONE conditional UPDATE::

    UPDATE billing_dailyquota SET reserved_tokens = reserved_tokens + n
     WHERE user_id = u AND day = d AND used_tokens <= limit + granted_tokens - reserved_tokens - n

(in practice one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` with that clause, which also creates the
day's first row: :func:`_upsert_reserve`). PostgreSQL re-evaluates the WHERE clause on the latest row
version after taking the row lock, so twenty
concurrent admissions of one user serialize on that row and the sum ``used + reserved`` can never pass
``limit + granted`` (the same idea as a bank ledger's "available balance" hold). When the reply ends
(finished, cancelled, failed, interrupted) :func:`quota_settle` deletes its reservation row and moves the
real token count into ``used_tokens``, releasing the rest. Deleting the reservation row is what makes
settlement happen once even when the worker and a reaper race.

**Teams.** A member of an organisation whose subscription grants a tier draws from the organisation's pool
instead (:class:`~billing.models.PoolDailyQuota`: ``tier.tokens_per_day * seats`` per day, shared by all
members). The reservation is then two conditional UPDATEs in one savepoint: the member's own row first
(bounded by the optional per-member ``daily_token_cap``, unbounded otherwise, so it still counts the
member's usage), then the pool row with the same clause as above. Either refusing rolls both back. Every
reservation locks the member row before the pool row, so concurrent members cannot deadlock, and the pool
row serializes them exactly as the user row serializes one user's requests.

The quota day is the date in ``settings.TIME_ZONE`` (UTC by default): every user's quota resets at the
same instant, midnight UTC. A reply settles on the day it was admitted, even if it ends after midnight.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import date

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from billing.models import DailyQuota, PoolDailyQuota, QuotaGrant, QuotaReservation
from billing.subscriptions import organization_granted
from database.sql import fetch_one, instance_from_row


class QuotaExceeded(Exception):
    """The reservation does not fit in what is left of today's quota. ``remaining`` in tokens."""

    def __init__(self, *, remaining: int, needed: int):
        super().__init__(f"{needed} tokens needed, {remaining} left today")
        self.remaining = remaining
        self.needed = needed


@dataclass(frozen=True)
class QuotaStatus:
    """One user's quota day in tokens: ``limit`` (tier), ``granted`` (admin extra), ``used`` (settled),
    ``reserved`` (held by replies still running) and ``remaining = limit + granted - used - reserved``."""

    day: date
    limit: int
    granted: int
    used: int
    reserved: int

    @property
    def remaining(self) -> int:
        return max(0, self.limit + self.granted - self.used - self.reserved)


@dataclass(frozen=True)
class Pool:
    """The shared pool a member draws from: ``limit`` tokens per quota day for organisation
    ``organization_id``, and the member's own ``member_cap`` (None: no cap)."""

    organization_id: int
    limit: int
    member_cap: int | None


#: The user's membership ``(organization_id, daily_token_cap)`` (at most one row: ``Membership.user`` is
#: one-to-one), read on every reservation; a fixed string (``database/sql.py``, lever 19) that admission also
#: reads inside its own statement (``conversations.admission``, lever 28), with ``%(user)s`` the user's id.
MEMBERSHIP_SQL = (
    "SELECT organization_id, daily_token_cap FROM organizations_membership WHERE user_id = %(user)s"
)

#: ``membership`` not read yet (see :func:`pool_for`).
UNREAD = object()


def pool_for(*, user, membership=UNREAD) -> Pool | None:
    """The pool ``user`` draws from, or None (not in a team, or the team has no paid subscription).
    ``membership``: the user's :data:`MEMBERSHIP_SQL` row (or None: no team) when the caller read it already."""
    if membership is UNREAD:
        membership = fetch_one(MEMBERSHIP_SQL, {"user": user.pk})
    if membership is None:
        return None
    organization_id, member_cap = membership
    granted = organization_granted(organization_id=organization_id)
    if granted is None:
        return None
    return Pool(
        organization_id=organization_id,
        limit=granted.tier.tokens_per_day * granted.seats,
        member_cap=member_cap,
    )


def quota_day(now=None) -> date:
    """Today's quota day: the date in ``settings.TIME_ZONE`` (UTC unless the operator set another zone)."""
    return timezone.localdate(now or timezone.now())


def _ensure_row(*, user_id: int, day: date) -> None:
    # INSERT ... ON CONFLICT DO NOTHING: two first requests of the day cannot both create the row.
    DailyQuota.objects.bulk_create([DailyQuota(user_id=user_id, day=day)], ignore_conflicts=True)


def _ensure_pool_row(*, organization_id: int, day: date) -> None:
    PoolDailyQuota.objects.bulk_create(
        [PoolDailyQuota(organization_id=organization_id, day=day)], ignore_conflicts=True
    )


def _status(row, *, day: date, limit: int) -> QuotaStatus:
    return QuotaStatus(
        day=day,
        limit=limit,
        granted=row.granted_tokens if row else 0,
        used=row.used_tokens if row else 0,
        reserved=row.reserved_tokens if row else 0,
    )


def quota_status(*, user, day: date | None = None) -> QuotaStatus:
    """The user's quota for ``day`` (default today); an untouched day reads as all zeros. For a member of
    a paying team: the pool's figures, or the member's cap when that leaves less."""
    day = day or quota_day()
    row = DailyQuota.objects.filter(user=user, day=day).first()
    pool = pool_for(user=user)
    if pool is None:
        return _status(row, day=day, limit=user.tier.tokens_per_day)
    pooled = _status(
        PoolDailyQuota.objects.filter(organization_id=pool.organization_id, day=day).first(),
        day=day,
        limit=pool.limit,
    )
    if pool.member_cap is not None:
        capped = _status(row, day=day, limit=pool.member_cap)
        if capped.remaining < pooled.remaining:
            return capped
    return pooled


def quota_reserve(*, user, tokens: int, day: date | None = None, membership=UNREAD) -> DailyQuota:
    """Hold ``tokens`` (> 0) of ``user``'s quota for ``day`` (default today). Returns the ledger row.
    ``membership``: as for :func:`pool_for`, when the caller read it already.

    Raises :class:`QuotaExceeded` (nothing held) when ``used + reserved + tokens`` would pass the tier's
    ``tokens_per_day`` plus today's grants. Call it inside the transaction that stores the reply, then
    :func:`quota_hold_row`'s row with the stored message: a rollback releases everything.
    """
    if tokens <= 0:
        raise ValueError("a reservation holds at least one token")
    day = day or quota_day()
    pool = pool_for(user=user, membership=membership)
    if pool is not None:
        return _pool_reserve(user=user, pool=pool, tokens=tokens, day=day)
    limit = user.tier.tokens_per_day
    if tokens <= limit:  # a new day's row can hold it: the upsert creates or updates the row in one statement
        row = _upsert_reserve(user_id=user.pk, day=day, limit=limit, tokens=tokens)
        if row is not None:
            return row
    else:  # only a grant can make room: the row must exist first
        _ensure_row(user_id=user.pk, day=day)
        if DailyQuota.objects.filter(
            user_id=user.pk,
            day=day,
            used_tokens__lte=limit + F("granted_tokens") - F("reserved_tokens") - tokens,
        ).update(reserved_tokens=F("reserved_tokens") + tokens):
            return DailyQuota.objects.get(user_id=user.pk, day=day)
    # Refused; the row exists either way (the upsert's conflict branch refused, or _ensure_row made it).
    row = DailyQuota.objects.get(user_id=user.pk, day=day)
    raise QuotaExceeded(remaining=_status(row, day=day, limit=limit).remaining, needed=tokens)


#: The reservation's conflict branch under the module docstring's clause, and the row it returns: shared by
#: :func:`_upsert_reserve` and :data:`CARRIED_RESERVE_SQL`.
_RESERVE_ON_CONFLICT = """
ON CONFLICT (user_id, day) DO UPDATE SET reserved_tokens = q.reserved_tokens + EXCLUDED.reserved_tokens
 WHERE q.used_tokens <= %(limit)s + q.granted_tokens - q.reserved_tokens - %(tokens)s
RETURNING q.id, q.user_id, q.day, q.used_tokens, q.reserved_tokens, q.granted_tokens"""

_UPSERT_RESERVE = f"""
INSERT INTO {DailyQuota._meta.db_table} AS q (user_id, day, used_tokens, reserved_tokens, granted_tokens)
VALUES (%(user)s, %(day)s, 0, %(tokens)s, 0){_RESERVE_ON_CONFLICT}
"""

#: :func:`_upsert_reserve`'s upsert as a ``WITH`` item named ``reserve``, for another statement to carry
#: (admission's read of the user, ``conversations.admission_reads``: one round trip less per admitted reply,
#: docs/overhead-levers.md lever 48). It reserves only for a user in no team (a member draws from the pool:
#: :func:`quota_reserve`); parameters ``%(user)s``, ``%(day)s``, ``%(limit)s``, ``%(tokens)s``
#: (:func:`carried_reserve_params`); it returns a row of :data:`CARRIED_RESERVE_COLUMNS` columns when it
#: reserved, none when it refused or the user is a member (:func:`carried_reserve_outcome` tells them apart).
CARRIED_RESERVE_SQL = f"""reserve AS (
INSERT INTO {DailyQuota._meta.db_table} AS q (user_id, day, used_tokens, reserved_tokens, granted_tokens)
SELECT %(user)s, %(day)s, 0, %(tokens)s, 0
 WHERE NOT EXISTS (SELECT 1 FROM organizations_membership WHERE user_id = %(user)s){_RESERVE_ON_CONFLICT})"""
CARRIED_RESERVE_COLUMNS = 6


def carried_reserve_params(*, user, tokens: int, day: date | None = None) -> dict | None:
    """:data:`CARRIED_RESERVE_SQL`'s parameters for reserving ``tokens`` of ``user``'s quota on ``day``
    (default today), or None when the carried upsert cannot decide it: ``tokens`` above the tier's daily
    limit, where only a grant makes room (:func:`quota_reserve` handles that). Raises ``ValueError`` for
    ``tokens`` <= 0."""
    if tokens <= 0:
        raise ValueError("a reservation holds at least one token")
    limit = user.tier.tokens_per_day
    if tokens > limit:
        return None
    return {"user": user.pk, "day": day or quota_day(), "limit": limit, "tokens": tokens}


def carried_reserve_outcome(*, user, params: dict, membership, row: tuple) -> DailyQuota:
    """What :func:`quota_reserve` returns or raises, from :data:`CARRIED_RESERVE_SQL` run with ``params`` in
    the caller's statement (inside the transaction that stores the reply). ``membership``: the user's
    :data:`MEMBERSHIP_SQL` row read in the same statement (None: no team); ``row``: the statement's
    :data:`CARRIED_RESERVE_COLUMNS` columns (all None when the item returned no row). A member's
    reservation is made here by :func:`quota_reserve` (the item left it alone). Raises
    :class:`QuotaExceeded` when the item refused (the row exists then: the upsert's conflict branch)."""
    tokens, day = params["tokens"], params["day"]
    if membership is not None:
        return quota_reserve(user=user, tokens=tokens, day=day, membership=membership)
    if row[0] is not None:
        return instance_from_row(DailyQuota, _CARRIED_FIELDS, row)
    current = DailyQuota.objects.get(user_id=user.pk, day=day)
    raise QuotaExceeded(remaining=_status(current, day=day, limit=params["limit"]).remaining, needed=tokens)


_CARRIED_FIELDS = tuple(
    DailyQuota._meta.get_field(name)
    for name in ("id", "user", "day", "used_tokens", "reserved_tokens", "granted_tokens")
)


def _upsert_reserve(*, user_id: int, day: date, limit: int, tokens: int) -> DailyQuota | None:
    """Reserve ``tokens`` (at most ``limit``, so a new day's row holds them) in ONE statement: create the
    day's row holding them, or add them to the existing row under the module docstring's clause. On a
    conflict PostgreSQL locks the existing row and evaluates the clause on its latest version, as the
    conditional UPDATE does. Returns the updated row, or None when the clause refused (the row exists).
    One round trip instead of three (insert-if-missing, update, read; docs/overhead-levers.md, lever 16)."""
    params = {"user": user_id, "day": day, "limit": limit, "tokens": tokens}
    return next(iter(DailyQuota.objects.raw(_UPSERT_RESERVE, params)), None)


def _pool_reserve(*, user, pool: Pool, tokens: int, day: date) -> DailyQuota:
    """:func:`quota_reserve` for a team member: member row (cap), then pool row, in one savepoint. The
    returned member row carries ``pool_quota_id`` for :func:`quota_hold_row`."""
    _ensure_row(user_id=user.pk, day=day)
    _ensure_pool_row(organization_id=pool.organization_id, day=day)
    with transaction.atomic():
        member = DailyQuota.objects.filter(user_id=user.pk, day=day)
        if pool.member_cap is not None:
            member = member.filter(
                used_tokens__lte=pool.member_cap + F("granted_tokens") - F("reserved_tokens") - tokens
            )
        if not member.update(reserved_tokens=F("reserved_tokens") + tokens):
            raise QuotaExceeded(remaining=quota_status(user=user, day=day).remaining, needed=tokens)
        pooled = PoolDailyQuota.objects.filter(
            organization_id=pool.organization_id,
            day=day,
            used_tokens__lte=pool.limit + F("granted_tokens") - F("reserved_tokens") - tokens,
        ).update(reserved_tokens=F("reserved_tokens") + tokens)
        if not pooled:
            row = PoolDailyQuota.objects.get(organization_id=pool.organization_id, day=day)
            raise QuotaExceeded(remaining=_status(row, day=day, limit=pool.limit).remaining, needed=tokens)
    row = DailyQuota.objects.get(user_id=user.pk, day=day)
    row.pool_quota_id = PoolDailyQuota.objects.values_list("pk", flat=True).get(
        organization_id=pool.organization_id, day=day
    )
    return row


def quota_hold_row(*, quota: DailyQuota, tokens: int) -> QuotaReservation:
    """The unsaved :class:`QuotaReservation` of a reservation made by :func:`quota_reserve`, its reply not set
    yet: for a caller that stores it with the reply in one statement (``conversations.message_chain``,
    docs/overhead-levers.md lever 28): a rollback of that transaction releases the reservation too."""
    return QuotaReservation(quota=quota, pool_id=getattr(quota, "pool_quota_id", None), tokens=tokens)


def quota_settle(*, message, used_tokens: int, user=None) -> bool:
    """Release ``message``'s reservation and charge ``used_tokens`` (prompt + completion, >= 0) instead.

    Returns True when a reservation was settled. A reply with no reservation (admitted outside a
    transaction, or already settled and then finished late) charges ``used_tokens`` to today's row of
    ``user`` (default: the conversation's owner) so usage is never lost. Idempotent for a reservation.

    A reservation is settled in one statement (:func:`settle_sql`'s items: the reservation's ``DELETE ...
    RETURNING`` feeding the user's and the pool's ``UPDATE``), one round trip where the ORM made five, six for a
    team's member (a savepoint, the row's ``SELECT ... FOR UPDATE``, the quota row's update and the pool's, the
    delete, the savepoint's release; docs/overhead-levers.md, lever 51), run as a prepared statement
    (``database.sql.fetch_one``). The ``DELETE`` locks the row as the ``FOR UPDATE`` did, so a concurrent settle
    of the same reply waits, then finds no reservation and charges its tokens as usage, as before.
    """
    if used_tokens < 0:
        raise ValueError("token counts must be non-negative")
    (settled,) = fetch_one(_settle_sql(), {"message_id": message.pk, "used_tokens": used_tokens})
    if settled:
        return True
    if used_tokens:
        quota_charge_unreserved(
            user=user if user is not None else message.conversation.owner, tokens=used_tokens
        )
    return False


def quota_charge_unreserved(*, user, tokens: int) -> None:
    """Charge ``tokens`` (>= 0) used by a reply that had no reservation left to settle to today's row of ``user``
    (and the team pool's), creating the rows when missing: the fallback of :func:`quota_settle` and of a final
    write that settles in its own statement (:func:`settle_sql`). Nothing for 0 tokens."""
    if tokens:
        with transaction.atomic():
            _add_to_day(user=user, day=quota_day(), field="used_tokens", tokens=tokens)


#: The settle's ``WITH`` items (``released``, ``own``, ``pooled``); named parameters ``%(used_tokens)s`` and
#: whatever ``{message_id}`` (an SQL expression for the reply's id) uses. Every data-modifying part of a ``WITH``
#: runs to completion whether or not the final ``SELECT`` reads it, in an order PostgreSQL does not promise, so
#: the pool's update reads the member's (``FROM own``): the member row is locked before the pool row, as
#: admission locks them, and concurrent members cannot deadlock.
_SETTLE_ITEMS = """released AS (
    DELETE FROM {reservation} WHERE message_id = {message_id} RETURNING quota_id, pool_id, tokens
), own AS (
    UPDATE {quota} AS q
       SET reserved_tokens = q.reserved_tokens - r.tokens, used_tokens = q.used_tokens + %(used_tokens)s
      FROM released AS r WHERE q.id = r.quota_id RETURNING r.pool_id, r.tokens
), pooled AS (
    UPDATE {pool} AS p
       SET reserved_tokens = p.reserved_tokens - o.tokens, used_tokens = p.used_tokens + %(used_tokens)s
      FROM own AS o WHERE p.id = o.pool_id
)"""


@functools.cache
def settle_sql(message_id: str) -> str:
    """The ``WITH`` items that settle a reply's reservation, for a statement of the caller's that begins
    ``WITH`` them (or puts them after its own items) and reads ``SELECT count(*) FROM released`` (1: a
    reservation was settled; 0: none was left, charge with :func:`quota_charge_unreserved`). ``message_id``:
    an SQL expression for the reply's id (``"%(message_id)s"``, or a subquery on an earlier item); the tokens
    used bind as ``%(used_tokens)s``. Sources: PostgreSQL's "Data-Modifying Statements in WITH"."""
    return _SETTLE_ITEMS.format(
        reservation=QuotaReservation._meta.db_table,
        quota=DailyQuota._meta.db_table,
        pool=PoolDailyQuota._meta.db_table,
        message_id=message_id,
    )


@functools.cache
def _settle_sql() -> str:
    """:func:`quota_settle`'s statement; parameters ``message_id`` and ``used_tokens``."""
    return f"WITH {settle_sql('%(message_id)s')}\nSELECT count(*) FROM released"


def _add_to_day(*, user, day: date, field: str, tokens: int) -> None:
    """Add ``tokens`` to ``field`` (``used_tokens`` or ``granted_tokens``) of ``user``'s row for ``day`` and, for a
    member of a paying team, of the team pool's row, creating either row when missing. Call inside a transaction."""
    _ensure_row(user_id=user.pk, day=day)
    DailyQuota.objects.filter(user_id=user.pk, day=day).update(**{field: F(field) + tokens})
    pool = pool_for(user=user)
    if pool is not None:
        _ensure_pool_row(organization_id=pool.organization_id, day=day)
        PoolDailyQuota.objects.filter(organization_id=pool.organization_id, day=day).update(
            **{field: F(field) + tokens}
        )


def quota_grant(
    *, user, tokens: int, day: date | None = None, reason: str = "", granted_by=None
) -> QuotaGrant:
    """Give ``user`` ``tokens`` (> 0) extra for one quota day (default today); recorded as a QuotaGrant.
    For a member of a paying team the grant raises both the member's cap and the team's pool that day."""
    if tokens <= 0:
        raise ValueError("a grant adds at least one token")
    day = day or quota_day()
    with transaction.atomic():
        _add_to_day(user=user, day=day, field="granted_tokens", tokens=tokens)
        return QuotaGrant.objects.create(
            user=user, day=day, tokens=tokens, reason=reason, granted_by=granted_by
        )
