"""Writes of the safety app: verdict records and staff review."""

from __future__ import annotations

from django.utils import timezone

from database.sql import insert_instance
from database.storable_text import storable_text
from safety.chain import Verdict
from safety.models import ModerationVerdict
from safety.strikes import strike_apply


def verdict_row(
    *, verdict: Verdict, user, message_id: int | None = None, text: str = ""
) -> ModerationVerdict:
    """The unsaved :class:`ModerationVerdict` row of ``verdict`` for ``user``'s message ``message_id``, as
    :func:`verdict_record` stores it; for a caller that stores it with its message in one statement
    (``conversations.message_chain``, docs/overhead-levers.md lever 28), which only an allowed or flagged verdict
    may be (a block also applies the strike policy: :func:`verdict_record`)."""
    return ModerationVerdict(
        text=storable_text(text) if verdict.flagged else "",
        user=user,
        message_id=message_id,
        tier=verdict.tier,
        stage=verdict.stage,
        action=verdict.action,
        guard=verdict.guard,
        categories=verdict.categories,
        results=verdict.results,
        failures=verdict.failures,
    )


def verdict_record(
    *, verdict: Verdict, user, message_id: int | None = None, text: str = ""
) -> ModerationVerdict:
    """Store ``verdict`` for ``user``'s message ``message_id`` (None when there is no stored message) and,
    after a block, apply the strike policy (:func:`safety.strikes.strike_apply`). ``text`` (the text
    judged) is kept only for a flagged or blocked verdict, for staff review. Call it inside the transaction
    that stores the message, so a verdict never outlives a rolled-back message."""
    # A fixed insert (docs/overhead-levers.md, lever 27): every reply stores one.
    row = insert_instance(verdict_row(verdict=verdict, user=user, message_id=message_id, text=text))
    if verdict.blocked and user is not None:
        outcome = strike_apply(user=user)
        if outcome:
            row.strike_outcome = outcome
            row.save(update_fields=["strike_outcome"])
    return row


def verdict_mark_false_positive(*, verdict: ModerationVerdict, reviewer, false_positive: bool = True) -> None:
    """A reviewer's judgement: a false positive no longer counts as a strike."""
    verdict.false_positive = false_positive
    verdict.reviewed_at = timezone.now()
    verdict.reviewed_by = reviewer
    verdict.save(update_fields=["false_positive", "reviewed_at", "reviewed_by"])
