"""Reads of usage and tiers."""

from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Count, F, Sum
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from billing.models import ModelPrice, UsageRecord


def _usage_since(*, user, since: datetime) -> dict[str, int]:
    totals = UsageRecord.objects.filter(user=user, created_at__gte=since).aggregate(
        prompt_tokens=Coalesce(Sum("prompt_tokens"), 0),
        completion_tokens=Coalesce(Sum("completion_tokens"), 0),
        requests=Count("id"),
    )
    totals["total_tokens"] = totals["prompt_tokens"] + totals["completion_tokens"]
    return totals


def start_of_day(now: datetime | None = None) -> datetime:
    """Midnight (aware, in the current time zone) of ``now``'s day."""
    now = timezone.localtime(now or timezone.now())
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def usage_today(*, user, now: datetime | None = None) -> dict[str, int]:
    """Token usage since local midnight: ``{"prompt_tokens", "completion_tokens", "total_tokens", "requests"}``."""
    return _usage_since(user=user, since=start_of_day(now))


def usage_this_month(*, user, now: datetime | None = None) -> dict[str, int]:
    """Token usage since the first of the current month, same shape as :func:`usage_today`."""
    return _usage_since(user=user, since=start_of_day(now).replace(day=1))


def seconds_until_tomorrow(now: datetime | None = None) -> int:
    """Seconds until the daily token quota resets (next local midnight)."""
    now = now or timezone.now()
    return max(1, int((start_of_day(now) + timedelta(days=1) - now).total_seconds()))


def tier_backoff(*, tier) -> dict[str, float | str]:
    """How the page retries after ``busy``/``rate_limited`` for ``tier``: ``{"kind": "linear"|"exponential",
    "base_s": seconds, "cap_s": seconds}``, from the tier's admin-editable ``backoff_*`` fields. Defaults:
    paid retries every 10 s (linear); free backs off exponentially, ``base_s * 2**attempt`` capped at
    ``cap_s`` (10, 20, 40, 80, 160, 160 ... s). The delay of attempt ``k`` (0-based) is never below the
    server's ``retry_after``; see :func:`backoff_delay_s`."""
    kind = getattr(tier, "backoff_kind", None) or ("linear" if tier.queue_priority > 0 else "exponential")
    base = getattr(tier, "backoff_base_s", None) or 10
    cap = getattr(tier, "backoff_cap_s", None) or (base if kind == "linear" else 160)
    return {"kind": kind, "base_s": base, "cap_s": max(base, cap)}


def backoff_delay_s(policy: dict, attempt: int, retry_after: float | None = None) -> float:
    """Seconds before retry ``attempt`` (0-based) under ``policy`` (from :func:`tier_backoff`), never less
    than the server's ``retry_after``. The page's countdown computes the same."""
    if policy["kind"] == "linear":
        delay = policy["base_s"]
    else:
        delay = min(policy["cap_s"], policy["base_s"] * 2 ** max(0, attempt))
    return max(delay, retry_after or 0)


def _prices() -> dict[str, ModelPrice]:
    return {p.model_name: p for p in ModelPrice.objects.all()}


def _cost(row: dict, prices: dict[str, ModelPrice]) -> Decimal:
    price = prices.get(row["model_name"])
    if price is None:
        return Decimal("0")
    million = Decimal(1_000_000)
    return (
        row["prompt_tokens"] * price.prompt_per_million
        + row["completion_tokens"] * price.completion_per_million
    ) / million


def usage_by_model(*, user=None, since: datetime, until: datetime | None = None, tier=None) -> list[dict]:
    """Usage per model between ``since`` and ``until`` (default now), for one ``user`` or one ``tier`` or
    everyone: ``[{"model_name", "prompt_tokens", "completion_tokens", "total_tokens", "requests", "cost"}]``
    (cost a Decimal in the model's ModelPrice currency; 0 without a price), biggest first."""
    records = UsageRecord.objects.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    if user is not None:
        records = records.filter(user=user)
    if tier is not None:
        records = records.filter(user__tier=tier)
    rows = list(
        records.values("model_name")
        .annotate(
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
            requests=Count("id"),
        )
        .order_by("model_name")
    )
    prices = _prices()
    for row in rows:
        row["total_tokens"] = row["prompt_tokens"] + row["completion_tokens"]
        row["cost"] = _cost(row, prices)
    return sorted(rows, key=lambda r: -r["total_tokens"])


def usage_daily(*, user, days: int = 30, now: datetime | None = None) -> list[dict]:
    """Total tokens per day for the last ``days`` days (oldest first, days without usage included):
    ``[{"day": date, "prompt_tokens", "completion_tokens", "total_tokens"}]``. Days in ``TIME_ZONE``."""
    today = timezone.localdate(now or timezone.now())
    first = today - timedelta(days=days - 1)
    since = start_of_day(timezone.make_aware(datetime.combine(first, datetime.min.time())))
    rows = (
        UsageRecord.objects.filter(user=user, created_at__gte=since)
        .annotate(day=TruncDate("created_at", tzinfo=timezone.get_current_timezone()))
        .values("day")
        .annotate(prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"))
    )
    by_day = {r["day"]: r for r in rows}
    out = []
    for i in range(days):
        day = first + timedelta(days=i)
        r = by_day.get(day, {"prompt_tokens": 0, "completion_tokens": 0})
        out.append(
            {
                "day": day,
                "prompt_tokens": r["prompt_tokens"],
                "completion_tokens": r["completion_tokens"],
                "total_tokens": r["prompt_tokens"] + r["completion_tokens"],
            }
        )
    return out


def usage_per_tier(*, since: datetime, until: datetime, tier=None) -> list[dict]:
    """Usage per tier between two instants: ``[{"tier", "users", "requests", "prompt_tokens",
    "completion_tokens", "total_tokens"}]``, biggest first (tier name; users counted who used any token)."""
    records = UsageRecord.objects.filter(created_at__gte=since, created_at__lt=until)
    if tier is not None:
        records = records.filter(user__tier=tier)
    rows = list(
        records.values(tier=F("user__tier__name")).annotate(
            users=Count("user", distinct=True),
            requests=Count("id"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
        )
    )
    for row in rows:
        row["total_tokens"] = row["prompt_tokens"] + row["completion_tokens"]
    return sorted(rows, key=lambda r: -r["total_tokens"])


def top_users(*, since: datetime, until: datetime, tier=None, limit: int = 10) -> list[dict]:
    """The heaviest users between two instants: ``[{"username", "tier", "requests", "total_tokens"}]``."""
    records = UsageRecord.objects.filter(created_at__gte=since, created_at__lt=until)
    if tier is not None:
        records = records.filter(user__tier=tier)
    return list(
        records.values(username=F("user__username"), tier=F("user__tier__name"))
        .annotate(requests=Count("id"), total_tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
        .order_by("-total_tokens", "username")[:limit]
    )
