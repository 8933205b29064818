"""Admission control: whether a new generation may enter the queue, checked before anything is stored.

Refusals carry a protocol error code and, where waiting helps, ``retry_after`` in seconds, so the browser
can show "busy, retrying in N s" and re-send the same frame. Checks, cheapest-to-fix last:
concurrent generations per user, daily token quota, requests per minute (django-ratelimit's fixed
window over the Redis cache), and the depth of the tier's queue (backpressure).
"""

from dataclasses import dataclass

from django.conf import settings
from django_ratelimit.core import get_usage

from billing.selectors import seconds_until_tomorrow, usage_today
from conversations.models import Message
from conversations.selectors import active_generation_count


@dataclass
class AdmissionRefused(Exception):
    """A generation was not admitted. ``code`` is a protocol error code (``busy``, ``rate_limited``,
    ``quota_exceeded``, ``too_many_generations``); ``retry_after`` in seconds or None."""

    code: str
    message: str
    retry_after: float | None = None

    def __str__(self) -> str:
        return self.message


def queue_depth(*, model_name: str) -> int:
    """Generations queued or streaming for one model (all users)."""
    return Message.objects.filter(
        role=Message.Role.ASSISTANT, status__in=Message.ACTIVE_STATUSES, model_name=model_name
    ).count()


def admission_check(*, user) -> None:
    """Raise :class:`AdmissionRefused` unless ``user`` may start one more generation now. Counts one request
    against the user's per-minute rate only when every other check passed."""
    tier = user.tier
    if active_generation_count(user=user) >= tier.max_concurrent_generations:
        raise AdmissionRefused(
            "too_many_generations",
            f"Your plan allows {tier.max_concurrent_generations} reply at a time; wait for the current one.",
            retry_after=settings.ADMISSION_RETRY_AFTER_S,
        )
    if usage_today(user=user)["total_tokens"] >= tier.tokens_per_day:
        raise AdmissionRefused(
            "quota_exceeded",
            f"You have used today's {tier.tokens_per_day} tokens; the quota resets at midnight.",
            retry_after=seconds_until_tomorrow(),
        )
    if queue_depth(model_name=tier.model_name) >= settings.ADMISSION_MAX_QUEUED:
        raise AdmissionRefused(
            "busy", "The service is busy right now.", retry_after=settings.ADMISSION_RETRY_AFTER_S
        )
    usage = get_usage(
        None,
        group="generation",
        key=lambda group, request: f"user:{user.pk}",
        rate=f"{tier.requests_per_minute}/m",
        increment=True,
    )
    if usage and usage["should_limit"]:
        raise AdmissionRefused(
            "rate_limited",
            f"Your plan allows {tier.requests_per_minute} messages per minute.",
            retry_after=max(1, usage["time_left"]),
        )
