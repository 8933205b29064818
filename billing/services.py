"""Writes to the usage ledger, the tier table and upgrade requests (quota writes: ``billing/quota.py``)."""

import functools

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.defaults import DEFAULT_TIERS
from billing.models import Tier, UpgradeRequest, UsageRecord


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


#: :func:`usage_record_sql`'s item; ``{table}``: the usage table, ``{source}``: the ``WITH`` item of the reply.
_USAGE_ITEM = """usage AS (
    INSERT INTO {table} (user_id, message_id, model_name, prompt_tokens, completion_tokens, created_at)
    SELECT %(user_id)s, {source}.id, %(model_name)s, %(prompt_tokens)s, %(completion_tokens)s, %(now)s
      FROM {source}
     WHERE %(prompt_tokens)s + %(completion_tokens)s > 0
)"""


@functools.cache
def usage_record_sql(source: str) -> str:
    """A ``WITH`` item (``usage``) that records, as :func:`usage_record_create` does, the usage of the reply whose
    id the earlier item ``source`` returns (none when it returns no row, or when both counts are 0), for a caller
    that stores the reply and its usage in one statement (``conversations.generation_worker``). Named parameters:
    ``user_id``, ``model_name``, ``prompt_tokens``, ``completion_tokens`` (the caller checks they are >= 0) and
    ``now`` (the record's ``created_at``)."""
    return _USAGE_ITEM.format(table=UsageRecord._meta.db_table, source=source)


def tiers_ensure() -> list[Tier]:
    """Create any missing default tier (``free``, ``paid``); existing rows are left as operators edited them."""
    return [
        Tier.objects.get_or_create(name=name, defaults=values)[0] for name, values in DEFAULT_TIERS.items()
    ]


class UpgradeError(Exception):
    """An upgrade request that cannot be filed or decided; the message is meant for the user/admin."""


def upgrade_request_create(*, user, to_tier: Tier, note: str = "") -> tuple[UpgradeRequest, str | None]:
    """File a request to move ``user`` to ``to_tier`` and hand it to the payment provider.

    Returns ``(request, checkout_url_or_None)``. Raises :class:`UpgradeError` when ``to_tier`` is the
    user's own tier or a request is already pending (nothing stored). With an online provider a pending
    request of that provider (a checkout left unpaid) is cancelled instead."""
    from billing.payments import payment_provider

    if to_tier.pk == user.tier_id:
        raise UpgradeError("You are already on this plan.")
    provider = payment_provider()
    with transaction.atomic():
        if provider.name != "manual":
            # A checkout the user left unpaid does not block a new one (paying the old page still works:
            # the webhook syncs whatever subscription Stripe created).
            UpgradeRequest.objects.filter(
                user=user, status=UpgradeRequest.Status.PENDING, provider=provider.name
            ).update(status=UpgradeRequest.Status.CANCELLED, decided_at=timezone.now())
        if UpgradeRequest.objects.filter(user=user, status=UpgradeRequest.Status.PENDING).exists():
            raise UpgradeError("You already have a pending request.")
        try:
            with transaction.atomic():
                request = UpgradeRequest.objects.create(
                    user=user,
                    from_tier_id=user.tier_id,
                    to_tier=to_tier,
                    provider=provider.name,
                    note=note[:500],
                )
        except IntegrityError as exc:  # a concurrent double submit hit the one-pending constraint
            raise UpgradeError("You already have a pending request.") from exc
        url = provider.start(request)
    return request, url


def upgrade_request_approve(*, request: UpgradeRequest, decided_by=None) -> UpgradeRequest:
    """Approve a pending request: the user moves to ``to_tier`` at once. Raises :class:`UpgradeError` when the
    request is no longer pending."""
    with transaction.atomic():
        updated = UpgradeRequest.objects.filter(pk=request.pk, status=UpgradeRequest.Status.PENDING).update(
            status=UpgradeRequest.Status.APPROVED, decided_at=timezone.now(), decided_by=decided_by
        )
        if not updated:
            raise UpgradeError("This request was already decided.")
        request.refresh_from_db()
        user = request.user
        user.tier = request.to_tier
        user.save(update_fields=["tier"])
    return request


def upgrade_request_reject(*, request: UpgradeRequest, decided_by=None) -> UpgradeRequest:
    """Reject a pending request (the user keeps the tier). Raises :class:`UpgradeError` when not pending."""
    updated = UpgradeRequest.objects.filter(pk=request.pk, status=UpgradeRequest.Status.PENDING).update(
        status=UpgradeRequest.Status.REJECTED, decided_at=timezone.now(), decided_by=decided_by
    )
    if not updated:
        raise UpgradeError("This request was already decided.")
    request.refresh_from_db()
    return request


def upgrade_request_cancel(*, user, request_id: int) -> bool:
    """The user withdraws their own pending request; False when there was none to withdraw."""
    return bool(
        UpgradeRequest.objects.filter(pk=request_id, user=user, status=UpgradeRequest.Status.PENDING).update(
            status=UpgradeRequest.Status.CANCELLED, decided_at=timezone.now()
        )
    )
