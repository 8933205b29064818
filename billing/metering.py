"""Metered tokens: a team's tokens above its plan's included amount, reported to Stripe as meter events.

For each subscription whose plan has a ``meter_event_name`` and that grants a tier now, the tokens used in
the current billing period are the team pool's settled tokens (``PoolDailyQuota.used_tokens``) on the quota
days from the period's first day to today; the overage is what passes ``included_tokens_per_period``. Only
the growth since the last report is sent, with an identifier built from the period and the new total, so a
report retried after a crash is counted once by Stripe. A new period starts the count again.

Granularity: quota days (``TIME_ZONE``), so a period that starts mid-day counts that whole day.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from billing import stripe_api
from billing.subscription_models import PoolDailyQuota, Subscription

logger = logging.getLogger(__name__)


def period_tokens(*, subscription: Subscription) -> int:
    """Tokens the team settled in ``subscription``'s current period (quota days since its first day)."""
    if subscription.current_period_start is None:
        return 0
    first_day = timezone.localdate(subscription.current_period_start)
    total = PoolDailyQuota.objects.filter(
        organization_id=subscription.organization_id, day__gte=first_day
    ).aggregate(total=Sum("used_tokens"))["total"]
    return int(total or 0)


def overage_report(*, subscription: Subscription) -> int:
    """Report ``subscription``'s new overage tokens to Stripe; returns the tokens reported now (0: none
    due). Raises ``stripe.StripeError`` (nothing recorded: the next run reports them)."""
    plan = subscription.plan
    if plan is None or not plan.is_metered or subscription.tier_id is None:
        return 0
    with transaction.atomic():
        sub = Subscription.objects.select_for_update().get(pk=subscription.pk)
        if sub.reported_period_start != sub.current_period_start:
            sub.reported_period_start, sub.reported_tokens = sub.current_period_start, 0
        overage = max(0, period_tokens(subscription=sub) - plan.included_tokens_per_period)
        delta = overage - sub.reported_tokens
        if delta <= 0:
            sub.save(update_fields=["reported_period_start", "reported_tokens"])
            return 0
        period = int(sub.current_period_start.timestamp()) if sub.current_period_start else 0
        stripe_api.meter_event_create(
            event_name=plan.meter_event_name,
            customer_id=sub.stripe_customer_id,
            value=delta,
            identifier=f"{sub.stripe_subscription_id}-{period}-{overage}",
        )
        sub.reported_tokens = overage
        sub.save(update_fields=["reported_period_start", "reported_tokens"])
    logger.info("reported %d metered tokens for %s", delta, sub.stripe_subscription_id)
    return delta


def overage_report_all() -> int:
    """:func:`overage_report` for every metered subscription that grants a tier; returns tokens reported.
    A Stripe error on one subscription is logged and the others still report."""
    reported = 0
    subs = (
        Subscription.objects.filter(tier__isnull=False)
        .exclude(plan__meter_event_name="")
        .select_related("plan")
    )
    for sub in subs:
        try:
            reported += overage_report(subscription=sub)
        except Exception:
            logger.warning("could not report metered usage of %s", sub.stripe_subscription_id, exc_info=True)
    return reported
