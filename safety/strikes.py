"""The strike policy: after ``SAFETY_STRIKE_LIMIT`` blocked messages (false positives excluded) within
``SAFETY_STRIKE_WINDOW_H`` hours, ``SAFETY_STRIKE_ACTION``: ``suspend`` deactivates the account (its
sessions and API keys stop working: both check ``is_active``), ``tier:<name>`` moves the user to that
(stricter) tier, ``none`` only records."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from billing.models import Tier

logger = logging.getLogger(__name__)


def strikes_count(*, user, window_h: float | None = None) -> int:
    """Blocked verdicts of ``user`` within the last ``window_h`` hours (default the setting), not marked
    false positive."""
    from safety.models import ModerationVerdict

    window_h = settings.SAFETY_STRIKE_WINDOW_H if window_h is None else window_h
    since = timezone.now() - timedelta(hours=window_h)
    return ModerationVerdict.objects.filter(
        user=user, action=ModerationVerdict.Outcome.BLOCK, false_positive=False, created_at__gte=since
    ).count()


def strike_apply(*, user, action: str | None = None, limit: int | None = None) -> str:
    """Apply the strike policy to ``user`` if their strikes reached the limit. Returns what was done:
    ``"suspended"``, ``"tier:<name>"``, or ``""`` (under the limit, strikes off, action ``none``, or the user
    already suspended / on that tier). Raises ``Tier.DoesNotExist`` for a ``tier:<name>`` that is not a tier."""
    action = settings.SAFETY_STRIKE_ACTION if action is None else action
    limit = settings.SAFETY_STRIKE_LIMIT if limit is None else limit
    if limit <= 0 or action == "none" or strikes_count(user=user) < limit:
        return ""
    if action == "suspend":
        if not user.is_active:
            return ""
        user.is_active = False
        user.save(update_fields=["is_active"])
        logger.warning("strike policy: user %s suspended", user.pk)
        return "suspended"
    tier = Tier.objects.get(name=action.removeprefix("tier:"))
    if user.tier_id == tier.pk:
        return ""
    user.tier = tier
    user.save(update_fields=["tier"])
    logger.warning("strike policy: user %s moved to tier %s", user.pk, tier.name)
    return f"tier:{tier.name}"
