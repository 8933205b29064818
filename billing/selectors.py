"""Reads of usage and tiers."""

from datetime import datetime, timedelta

from django.db.models import Count, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing.models import UsageRecord


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
