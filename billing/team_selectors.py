"""Reads for the team page and the usage page: a team's plan, period and invoices, usage per member."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Sum
from django.db.models.functions import Coalesce

from billing.models import UsageRecord
from billing.subscription_models import Invoice, Subscription
from billing.subscriptions import organization_granted


def team_subscription(*, organization_id: int) -> Subscription | None:
    """The team's subscription to show: the one granting a tier, else the most recent one."""
    return organization_granted(organization_id=organization_id) or (
        Subscription.objects.filter(organization_id=organization_id).select_related("plan", "tier").first()
    )


def team_invoices(*, organization_id: int, limit: int = 12) -> list[Invoice]:
    """The team's latest invoices, newest first."""
    return list(Invoice.objects.filter(organization_id=organization_id)[:limit])


def usage_per_member(*, organization_id: int, since: datetime) -> list[dict]:
    """Tokens per current member since ``since``: ``[{"user_id", "username", "total_tokens", "requests"}]``,
    heaviest first (members without usage included, with 0)."""
    from organizations.models import Membership

    members = Membership.objects.filter(organization_id=organization_id).select_related("user")
    usage = {
        row["user_id"]: row
        for row in UsageRecord.objects.filter(
            user__membership__organization_id=organization_id, created_at__gte=since
        )
        .values("user_id")
        .annotate(
            prompt=Coalesce(Sum("prompt_tokens"), 0),
            completion=Coalesce(Sum("completion_tokens"), 0),
            requests=Count("id"),
        )
    }
    rows = []
    for m in members:
        u = usage.get(m.user_id, {"prompt": 0, "completion": 0, "requests": 0})
        rows.append(
            {
                "user_id": m.user_id,
                "username": m.user.get_username(),
                "role": m.role,
                "daily_token_cap": m.daily_token_cap,
                "total_tokens": u["prompt"] + u["completion"],
                "requests": u["requests"],
            }
        )
    return sorted(rows, key=lambda r: (-r["total_tokens"], r["username"]))
