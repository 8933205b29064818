"""Writes to the usage ledger and the tier table."""

from billing.defaults import DEFAULT_TIERS
from billing.models import Tier, UsageRecord


def usage_record_create(
    *, user, message, model_name: str, prompt_tokens: int, completion_tokens: int
) -> UsageRecord:
    """Record one generation's token usage (counts in model tokens; both must be >= 0)."""
    if prompt_tokens < 0 or completion_tokens < 0:
        raise ValueError("token counts must be non-negative")
    return UsageRecord.objects.create(
        user=user,
        message=message,
        model_name=model_name,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )


def tiers_ensure() -> list[Tier]:
    """Create any missing default tier (``free``, ``paid``); existing rows are left as operators edited them."""
    return [
        Tier.objects.get_or_create(name=name, defaults=values)[0] for name, values in DEFAULT_TIERS.items()
    ]
