"""Plans (tiers) and the token usage ledger."""

from django.conf import settings
from django.db import models


class Tier(models.Model):
    """What differs between plans: model, limits, reply length and queue priority.

    Units: ``requests_per_minute`` in requests/minute per user, ``tokens_per_day`` in prompt + completion
    tokens per user per UTC day, ``max_reply_tokens`` / ``max_context_tokens`` in model tokens.
    ``queue_priority``: higher is admitted first by the engine. ``queue_name``: the Celery queue its
    generations are routed to.
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
    queue_name = models.CharField(max_length=64)

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
