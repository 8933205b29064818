"""Paid plans through Stripe: the plans on sale, each team's Stripe customer and subscriptions, the invoices,
the webhook events already handled, and the organisation token pool's daily ledger.

Imported by ``billing/models.py`` so Django registers them in the ``billing`` app. A subscription belongs
to an organisation (``organizations.Organization``), never to a single user: a person paying alone gets a
team of one.
"""

from django.db import models

from billing.models import Tier


class Plan(models.Model):
    """A Stripe price a team can subscribe to, and the tier its members get.

    ``stripe_price_id``: the licensed (per seat) price; the subscription's quantity is the number of seats
    and the team's daily token pool is ``tier.tokens_per_day * seats``. Metering (optional): with a
    ``meter_event_name``, tokens used in a billing period above ``included_tokens_per_period`` are reported
    to Stripe as meter events (``billing/metering.py``) and ``metered_price_id`` (the price attached to that
    meter) is added to the checkout.
    """

    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="plans")
    display_name = models.CharField(max_length=64)
    stripe_price_id = models.CharField(max_length=100, unique=True)
    included_tokens_per_period = models.PositiveBigIntegerField(default=0)
    meter_event_name = models.CharField(max_length=100, blank=True, default="")
    metered_price_id = models.CharField(max_length=100, blank=True, default="")
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["tier__queue_priority", "display_name"]

    def __str__(self) -> str:
        return self.display_name

    @property
    def is_metered(self) -> bool:
        return bool(self.meter_event_name)


class StripeCustomer(models.Model):
    """The Stripe customer of a team (created before its first checkout, so every event names a known
    customer whatever order the events arrive in)."""

    organization = models.OneToOneField(
        "organizations.Organization", on_delete=models.CASCADE, related_name="stripe_customer"
    )
    customer_id = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.customer_id


class Subscription(models.Model):
    """A team's Stripe subscription as last synced from Stripe, and the tier it grants now.

    ``tier``: the tier the members are on because of this subscription (None: none, they are on free).
    Upgrades apply at once; a downgrade keeps the paid-for tier until ``downgrade_at`` (the end of the period
    already paid), then ``downgrade_tier``. After a failed payment the tier stays until ``grace_until``
    (``BILLING_GRACE_PERIOD_DAYS``), then drops to free unless an invoice was paid meanwhile.
    ``reported_tokens``: metered tokens already reported to Stripe for the period starting
    ``reported_period_start``.
    """

    organization = models.ForeignKey(
        "organizations.Organization", on_delete=models.CASCADE, related_name="subscriptions"
    )
    stripe_subscription_id = models.CharField(max_length=100, unique=True)
    stripe_customer_id = models.CharField(max_length=100)
    plan = models.ForeignKey(Plan, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=32)
    seats = models.PositiveIntegerField(default=1)
    current_period_start = models.DateTimeField(null=True, blank=True)
    current_period_end = models.DateTimeField(null=True, blank=True)
    cancel_at_period_end = models.BooleanField(default=False)
    tier = models.ForeignKey(Tier, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    downgrade_tier = models.ForeignKey(
        Tier, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    downgrade_at = models.DateTimeField(null=True, blank=True)
    grace_until = models.DateTimeField(null=True, blank=True)
    reported_tokens = models.PositiveBigIntegerField(default=0)
    reported_period_start = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.stripe_subscription_id} ({self.status})"


class Invoice(models.Model):
    """A Stripe invoice of a team, as the last ``invoice.*`` event left it. Amounts in the currency's
    smallest unit (cents)."""

    organization = models.ForeignKey(
        "organizations.Organization", on_delete=models.CASCADE, related_name="invoices"
    )
    subscription = models.ForeignKey(
        Subscription, null=True, blank=True, on_delete=models.SET_NULL, related_name="invoices"
    )
    stripe_invoice_id = models.CharField(max_length=100, unique=True)
    number = models.CharField(max_length=100, blank=True, default="")
    status = models.CharField(max_length=32)
    amount_due = models.BigIntegerField(default=0)
    amount_paid = models.BigIntegerField(default=0)
    currency = models.CharField(max_length=3, default="usd")
    hosted_invoice_url = models.URLField(max_length=500, blank=True, default="")
    created = models.DateTimeField()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.stripe_invoice_id} ({self.status})"


class StripeEvent(models.Model):
    """A webhook event already handled: its id is unique, so a replayed or concurrently redelivered event is
    a no-op. Stored in the transaction that applies the event: a failed handling stores nothing and
    Stripe's retry handles it again."""

    event_id = models.CharField(max_length=100, unique=True)
    type = models.CharField(max_length=100)
    created = models.DateTimeField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"{self.event_id} {self.type}"


class PoolDailyQuota(models.Model):
    """An organisation's shared token pool for one quota day: the team counterpart of
    :class:`~billing.models.DailyQuota`, written only by ``billing/quota.py`` with the same conditional
    UPDATE, so concurrent replies of many members never overshoot the pool."""

    organization = models.ForeignKey(
        "organizations.Organization", on_delete=models.CASCADE, related_name="pool_quotas"
    )
    day = models.DateField()
    used_tokens = models.PositiveBigIntegerField(default=0)
    reserved_tokens = models.PositiveBigIntegerField(default=0)
    granted_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-day"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "day"], name="pool_quota_org_day_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.organization_id} {self.day}: {self.used_tokens}+{self.reserved_tokens} reserved"
