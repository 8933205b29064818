"""Reads for the staff fleet page and ``manage.py fleet``: reply latency and throughput from stored replies."""

from __future__ import annotations

import math
from datetime import timedelta

from django.db.models import Count
from django.utils import timezone

from conversations.models import Message


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def reply_stats(*, minutes: int = 15) -> dict:
    """Replies finished in the last ``minutes``: ``count``, ``ttft_p50_ms``, ``ttft_p99_ms`` (engine TTFT),
    ``tokens_per_s`` (completion tokens / window seconds). A reply counts once it has an engine TTFT."""
    since = timezone.now() - timedelta(minutes=minutes)
    finished = Message.objects.filter(
        role=Message.Role.ASSISTANT, updated_at__gte=since, ttft_ms__isnull=False
    )
    rows = list(finished.values_list("ttft_ms", "completion_tokens")[:100_000])
    ttfts = [t for t, _ in rows if t is not None]
    tokens = sum(c or 0 for _, c in rows)
    return {
        "minutes": minutes,
        "count": len(rows),
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "tokens_per_s": round(tokens / (minutes * 60), 2),
    }


def active_replies_by_status() -> dict[str, int]:
    """``{"queued": n, "streaming": n}`` across the fleet."""
    counts = dict(
        Message.objects.filter(role=Message.Role.ASSISTANT, status__in=Message.ACTIVE_STATUSES)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    return {status: counts.get(status, 0) for status in Message.ACTIVE_STATUSES}


def queued_by_tier() -> dict[str, int]:
    """Queued replies per tier name (queue depth as the product sees it)."""
    return dict(
        Message.objects.filter(role=Message.Role.ASSISTANT, status=Message.Status.QUEUED)
        .values_list("conversation__owner__tier__name")
        .annotate(n=Count("id"))
        .values_list("conversation__owner__tier__name", "n")
    )


def slowest_replies(*, minutes: int = 15, limit: int = 10) -> list[Message]:
    """The finished replies of the last ``minutes`` with the longest engine TTFT + duration, slowest first."""
    since = timezone.now() - timedelta(minutes=minutes)
    return list(
        Message.objects.filter(role=Message.Role.ASSISTANT, updated_at__gte=since, duration_ms__isnull=False)
        .select_related("conversation__owner__tier")
        .order_by("-duration_ms", "-id")[:limit]
    )
