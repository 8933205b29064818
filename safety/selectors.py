"""Reads of the safety app: the review queue and the moderation report."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from django.db.models import QuerySet
from django.utils import timezone

from safety.models import ModerationVerdict


def review_queue() -> QuerySet[ModerationVerdict]:
    """Flagged and blocked verdicts, newest first, with their user and message."""
    return ModerationVerdict.objects.filter(
        action__in=[ModerationVerdict.Outcome.FLAG, ModerationVerdict.Outcome.BLOCK]
    ).select_related("user", "message")


def verdict_summary(*, days: float = 7.0) -> dict:
    """Verdicts of the last ``days`` days: ``{"total", "by_action": {action: n}, "by_tier": {tier:
    {action: n}}, "by_category": {(stage, category): {action: n}}, "false_positives": n, "failures": n}``."""
    since = timezone.now() - timedelta(days=days)
    rows = ModerationVerdict.objects.filter(created_at__gte=since).values_list(
        "tier", "stage", "action", "categories", "false_positive", "failures"
    )
    by_action: Counter = Counter()
    by_tier: dict[str, Counter] = {}
    by_category: dict[tuple[str, str], Counter] = {}
    false_positives = failures = total = 0
    for tier, stage, action, categories, false_positive, failed in rows.iterator():
        total += 1
        by_action[action] += 1
        by_tier.setdefault(tier or "-", Counter())[action] += 1
        for category in categories or []:
            by_category.setdefault((stage, category), Counter())[action] += 1
        false_positives += bool(false_positive)
        failures += failed
    return {
        "total": total,
        "by_action": dict(by_action),
        "by_tier": {k: dict(v) for k, v in sorted(by_tier.items())},
        "by_category": {k: dict(v) for k, v in sorted(by_category.items())},
        "false_positives": false_positives,
        "failures": failures,
    }
