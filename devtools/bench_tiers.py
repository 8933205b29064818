"""The tiers the benchmark commands run their users on: the paid tier's model, context and priority, with
limits high enough that only admission control's load decision can refuse a request."""

from __future__ import annotations


def bench_tier(name: str, *, display_name: str, max_tokens: int, admit_max_wait_s: float = 3600):
    """Create or update the :class:`~billing.models.Tier` ``name``: the paid tier's model, context and queue
    priority, ``max_tokens`` reply tokens, 100,000 requests/minute, 10^9 tokens/day, 64 concurrent
    generations, and ``admit_max_wait_s`` seconds of expected wait before ``busy`` (-1: refuse every request
    at the load gate). Returns the tier."""
    from billing.models import Tier

    paid = Tier.objects.get(name="paid")
    tier, _ = Tier.objects.update_or_create(
        name=name,
        defaults=dict(
            display_name=display_name,
            model_name=paid.model_name,
            admit_max_wait_s=admit_max_wait_s,
            requests_per_minute=100_000,
            tokens_per_day=1_000_000_000,
            max_reply_tokens=max_tokens,
            max_context_tokens=paid.max_context_tokens,
            queue_priority=paid.queue_priority,
            max_concurrent_generations=64,
        ),
    )
    return tier
