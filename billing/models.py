"""Plans (tiers) and the token usage ledger."""

from django.conf import settings
from django.db import models


class Tier(models.Model):
    """What differs between plans: model, limits, reply length and queue priority.

    Units: ``requests_per_minute`` in requests/minute per user, ``tokens_per_day`` in prompt + completion
    tokens per user per quota day (``billing.quota.quota_day``: the date in ``settings.TIME_ZONE``, UTC by default), ``max_reply_tokens`` / ``max_context_tokens`` in model tokens.
    ``queue_priority``: higher is delivered first by the broker's priority queue and admitted first by
    the engine (capped to ``INFERENCE_QUEUE_MAX_PRIORITY``). Its model's queue is ``inference.<model_name>``.
    """

    name = models.SlugField(max_length=32, unique=True)
    display_name = models.CharField(max_length=64)
    model_name = models.CharField(max_length=100)
    requests_per_minute = models.PositiveIntegerField()
    tokens_per_day = models.PositiveIntegerField()
    max_reply_tokens = models.PositiveIntegerField()
    max_context_tokens = models.PositiveIntegerField()
    queue_priority = models.IntegerField(default=0)
    max_concurrent_generations = models.PositiveIntegerField(default=1)
    # Admission control on the fleet's expected wait (conversations/load.py), in seconds.
    admit_max_wait_s = models.FloatField(
        default=30.0,
        help_text="New requests of this tier are refused ('busy') while the expected wait is above this.",
    )
    degrade_to_model = models.CharField(
        max_length=100,
        blank=True,
        default="",
        help_text="Registered model this tier moves to while its own model's expected wait is above "
        "degrade_after_wait_s (blank: never).",
    )
    degrade_after_wait_s = models.FloatField(
        default=10.0, help_text="Expected wait (s) on the tier's model above which it uses degrade_to_model."
    )
    # The page's automatic retry after busy/rate_limited (billing.selectors.tier_backoff).
    backoff_kind = models.CharField(
        max_length=16, choices=[("linear", "linear"), ("exponential", "exponential")], default="exponential"
    )
    backoff_base_s = models.PositiveIntegerField(default=10)
    backoff_cap_s = models.PositiveIntegerField(default=160)
    # Memory (issue 27, docs/memory.md): tokens of key facts and recalled passages added to each reply's context.
    memory_budget_tokens = models.PositiveIntegerField(
        default=256,
        help_text="Tokens of key facts and recalled passages each reply's context may hold (0: none).",
    )

    class Meta:
        ordering = ["queue_priority", "name"]

    def __str__(self) -> str:
        return self.display_name or self.name


FREE_TIER_NAME = "free"


def default_tier_id() -> int:
    """Primary key of the ``free`` tier, the tier of every new user. Raises ``Tier.DoesNotExist`` when the
    data migration has not run."""
    return Tier.objects.only("id").get(name=FREE_TIER_NAME).id


class UsageRecord(models.Model):
    """One generation's token usage, the unit of billing. Written once, when the reply ends."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_records")
    message = models.ForeignKey(
        "conversations.Message",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="usage_records",
    )
    model_name = models.CharField(max_length=100)
    prompt_tokens = models.PositiveIntegerField()
    completion_tokens = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["user", "created_at"], name="usage_user_created_idx")]

    def __str__(self) -> str:
        return f"{self.user_id}: {self.prompt_tokens}+{self.completion_tokens} ({self.model_name})"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class DailyQuota(models.Model):
    """One user's token ledger for one quota day: the row that makes the daily quota exact under concurrency.

    ``reserved_tokens`` are held by admitted replies that have not ended (prompt upper bound + reply limit
    each), ``used_tokens`` are settled real counts, ``granted_tokens`` extra allowance an admin gave for this
    day. Admission reserves with one conditional UPDATE (``used + reserved + n <= limit + granted``), so
    concurrent requests can never overshoot; see ``billing/quota.py``.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="daily_quotas")
    day = models.DateField()
    used_tokens = models.PositiveIntegerField(default=0)
    reserved_tokens = models.PositiveIntegerField(default=0)
    granted_tokens = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-day"]
        constraints = [models.UniqueConstraint(fields=["user", "day"], name="daily_quota_user_day_uniq")]

    def __str__(self) -> str:
        return f"{self.user_id} {self.day}: {self.used_tokens}+{self.reserved_tokens} reserved"


class QuotaReservation(models.Model):
    """Tokens held for one admitted reply until it ends; deleted when settled (so settlement happens once)."""

    message = models.OneToOneField(
        "conversations.Message", on_delete=models.CASCADE, related_name="quota_reservation"
    )
    quota = models.ForeignKey(DailyQuota, on_delete=models.CASCADE, related_name="reservations")
    # The organisation pool's row the same tokens are held on, for a member of a subscribed team.
    pool = models.ForeignKey(
        "billing.PoolDailyQuota", null=True, blank=True, on_delete=models.CASCADE, related_name="reservations"
    )
    tokens = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.tokens} tokens for message {self.message_id}"


class QuotaGrant(models.Model):
    """Extra tokens an admin granted a user for one quota day (audit trail of ``DailyQuota.granted_tokens``)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="quota_grants")
    day = models.DateField()
    tokens = models.PositiveIntegerField()
    reason = models.CharField(max_length=200, blank=True, default="")
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"+{self.tokens} for {self.user_id} on {self.day}"


class ModelPrice(models.Model):
    """What one registered model's tokens cost, for the usage page and ``usage_report`` (per million tokens)."""

    model_name = models.CharField(max_length=100, unique=True)
    prompt_per_million = models.DecimalField(max_digits=10, decimal_places=4, default=0)
    completion_per_million = models.DecimalField(max_digits=10, decimal_places=4, default=0)
    currency = models.CharField(max_length=3, default="USD")

    def __str__(self) -> str:
        return self.model_name


class UpgradeRequest(models.Model):
    """A user's request to move to another tier, handled by a payment provider (``billing/payments.py``).
    The built-in provider is manual: an admin approves or rejects it; no card is ever charged here."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        CANCELLED = "cancelled"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="upgrade_requests"
    )
    from_tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="+")
    to_tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="+")
    provider = models.CharField(max_length=32, default="manual")
    provider_reference = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    note = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One open request per user: a double click never files two.
            models.UniqueConstraint(
                fields=["user"], condition=models.Q(status="pending"), name="upgrade_one_pending_per_user"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user_id}: {self.from_tier_id} -> {self.to_tier_id} ({self.status})"


# Plans, subscriptions, invoices, webhook events and the team pool ledger (issue 32), registered in this app.
from billing.subscription_models import (  # noqa: E402,F401
    Invoice,
    Plan,
    PoolDailyQuota,
    StripeCustomer,
    StripeEvent,
    Subscription,
)
