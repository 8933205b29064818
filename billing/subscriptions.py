"""A team's tier follows its Stripe subscription: sync a subscription object, apply due downgrades and ended
grace periods, move the members to the tier.

Rules (docs/billing-and-sso.md):

* an active (or trialing) subscription grants its plan's tier at once, including an upgrade;
* a downgrade to a plan of a lower tier keeps the tier already paid for until the end of that period
  (``downgrade_at``), then moves to the lower one;
* a failed payment (``past_due``/``unpaid``) keeps the tier for ``BILLING_GRACE_PERIOD_DAYS`` after the
  failure (``grace_until``), then the team drops to the free tier; a paid invoice ends the grace;
* a canceled (or never paid: ``incomplete``, ``incomplete_expired``) subscription grants nothing.

The members' ``User.tier`` is written here, so open sockets and API keys pick the new tier up as they do
for a tier an admin changes: through ``conversations.load.current_tier``'s short cache.

Out-of-order events cannot regress a subscription: every handler syncs from the subscription as Stripe
returns it now (``billing.stripe_api.subscription_retrieve``), never from an older snapshot in the event.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing.models import FREE_TIER_NAME, Tier
from billing.subscription_models import Plan, StripeCustomer, Subscription

ACTIVE = frozenset({"active", "trialing"})
IN_GRACE = frozenset({"past_due", "unpaid"})


class UnknownCustomer(Exception):
    """A Stripe object names a customer chatsite did not create and carries no ``organization_id``
    metadata: it cannot be attributed to a team."""


def tier_rank(tier: Tier) -> tuple[int, int]:
    """Order of tiers for upgrade/downgrade: queue priority, then tokens per day (higher is more)."""
    return (tier.queue_priority, tier.tokens_per_day)


def from_timestamp(value) -> datetime | None:
    """A Stripe timestamp (seconds since the epoch) as an aware datetime; None stays None."""
    return datetime.fromtimestamp(int(value), tz=UTC) if value else None


def price_id_of(item: dict) -> str:
    """The price of a subscription item: ``price.id``, or ``plan.id`` for objects from the older API."""
    price = item.get("price") or item.get("plan") or {}
    return price.get("id", "") if isinstance(price, dict) else str(price)


def grace_period() -> timedelta:
    return timedelta(days=settings.BILLING_GRACE_PERIOD_DAYS)


def organization_id_for(*, customer_id: str, metadata: dict | None = None) -> int:
    """The team of Stripe customer ``customer_id`` (created by chatsite), else the ``organization_id`` in
    ``metadata``. Raises :class:`UnknownCustomer`."""
    org_id = (
        StripeCustomer.objects.filter(customer_id=customer_id)
        .values_list("organization_id", flat=True)
        .first()
    )
    if org_id is None and (metadata or {}).get("organization_id"):
        org_id = int(metadata["organization_id"])
    if org_id is None:
        raise UnknownCustomer(customer_id)
    return org_id


def _apply_due(sub: Subscription, now: datetime) -> None:
    """A downgrade whose period ended and a grace period that ran out take effect (in memory)."""
    if sub.downgrade_at is not None and sub.downgrade_at <= now:
        sub.tier = sub.downgrade_tier
        sub.downgrade_tier = None
        sub.downgrade_at = None
    if sub.grace_until is not None and sub.grace_until <= now and sub.status in IN_GRACE:
        sub.tier = None


def subscription_sync(*, data: dict, now: datetime | None = None) -> Subscription:
    """Store Stripe subscription object ``data`` (a dict as the API returns it) and move the team's members
    to the tier it grants now (see the module docstring). Concurrent syncs of one subscription serialize on
    its row. Raises :class:`UnknownCustomer`."""
    now = now or timezone.now()
    org_id = organization_id_for(customer_id=data["customer"], metadata=data.get("metadata"))
    items = (data.get("items") or {}).get("data") or []
    plan = (
        Plan.objects.select_related("tier")
        .filter(stripe_price_id__in=[price_id_of(i) for i in items])
        .first()
    )
    plan_item = next((i for i in items if plan and price_id_of(i) == plan.stripe_price_id), {})
    # Newer API versions keep the period on the items, older ones on the subscription.
    period_start = from_timestamp(plan_item.get("current_period_start") or data.get("current_period_start"))
    period_end = from_timestamp(plan_item.get("current_period_end") or data.get("current_period_end"))
    with transaction.atomic():
        Subscription.objects.bulk_create(
            [
                Subscription(
                    organization_id=org_id,
                    stripe_subscription_id=data["id"],
                    stripe_customer_id=data["customer"],
                    status=data["status"],
                )
            ],
            ignore_conflicts=True,
        )
        sub = (
            Subscription.objects.select_for_update(of=("self",))
            .select_related("tier")
            .get(stripe_subscription_id=data["id"])
        )
        _apply_due(sub, now)
        paid_until = sub.current_period_end or period_end or now
        sub.status = data["status"]
        sub.plan = plan
        sub.seats = max(1, int(plan_item.get("quantity") or 1))
        sub.current_period_start = period_start
        sub.current_period_end = period_end
        sub.cancel_at_period_end = bool(data.get("cancel_at_period_end"))
        target = plan.tier if plan else None
        if target is not None and (sub.status in ACTIVE or sub.status in IN_GRACE):
            if sub.tier is not None and tier_rank(target) < tier_rank(sub.tier):
                sub.downgrade_tier = target
                sub.downgrade_at = max(paid_until, now)
            else:
                sub.tier, sub.downgrade_tier, sub.downgrade_at = target, None, None
            if sub.status in ACTIVE:
                sub.grace_until = None
            elif sub.grace_until is None:
                sub.grace_until = now + grace_period()
        else:
            sub.tier, sub.downgrade_tier, sub.downgrade_at, sub.grace_until = None, None, None, None
        _apply_due(sub, now)
        sub.save()
        organization_tier_apply(organization_id=org_id)
    return sub


def subscription_grace_start(*, subscription_id: str, failed_at: datetime) -> bool:
    """A payment of ``subscription_id`` failed at ``failed_at``: the grace period starts then (unless one is
    already running). False when the subscription is not known yet (its sync sets the grace then)."""
    return bool(
        Subscription.objects.filter(stripe_subscription_id=subscription_id, grace_until__isnull=True).update(
            grace_until=failed_at + grace_period()
        )
    )


def subscription_grace_end(*, subscription_id: str) -> None:
    """An invoice of ``subscription_id`` was paid: no grace period runs any more."""
    Subscription.objects.filter(stripe_subscription_id=subscription_id).update(grace_until=None)


def subscriptions_apply_due(*, now: datetime | None = None) -> int:
    """Apply every downgrade whose period has ended and every grace period that ran out (``manage.py
    billing_tick`` runs it each minute). Returns how many subscriptions changed."""
    now = now or timezone.now()
    due = Subscription.objects.filter(
        Q(downgrade_at__lte=now) | Q(grace_until__lte=now, tier__isnull=False, status__in=IN_GRACE)
    ).values_list("pk", flat=True)
    changed = 0
    for pk in list(due):
        with transaction.atomic():
            sub = Subscription.objects.select_for_update().get(pk=pk)
            before = (sub.tier_id, sub.downgrade_at)
            _apply_due(sub, now)
            if (sub.tier_id, sub.downgrade_at) != before:
                sub.save(update_fields=["tier", "downgrade_tier", "downgrade_at", "updated_at"])
                organization_tier_apply(organization_id=sub.organization_id)
                changed += 1
    return changed


def organization_granted(*, organization_id: int) -> Subscription | None:
    """The team's subscription that grants the best tier now, or None (no paid tier)."""
    subs = Subscription.objects.filter(organization_id=organization_id, tier__isnull=False).select_related(
        "tier"
    )
    return max(subs, key=lambda s: tier_rank(s.tier), default=None)


def organization_tier(*, organization_id: int) -> Tier | None:
    """The tier a team's members are on because of its subscriptions: the best granted one, the free tier
    when it has subscriptions but none grants a tier, None when it never subscribed (members keep their
    own tiers)."""
    granted = organization_granted(organization_id=organization_id)
    if granted is not None:
        return granted.tier
    if Subscription.objects.filter(organization_id=organization_id).exists():
        return Tier.objects.get(name=FREE_TIER_NAME)
    return None


def organization_tier_apply(*, organization_id: int) -> int:
    """Move every member of the team to :func:`organization_tier` (nothing for a team that never
    subscribed). Returns how many users changed tier."""
    tier = organization_tier(organization_id=organization_id)
    if tier is None:
        return 0
    return (
        get_user_model()
        .objects.filter(membership__organization_id=organization_id)
        .exclude(tier=tier)
        .update(tier=tier)
    )
