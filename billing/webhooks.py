"""Stripe webhook events: each one handled once, in any order.

:func:`event_handle` stores the event id in the same transaction that applies it (``StripeEvent``, unique),
so a replay of an event already handled is a no-op, and a handling that fails stores nothing (HTTP 500:
Stripe retries it). Subscription state always comes from Stripe's current object
(:func:`billing.stripe_api.subscription_retrieve`), never from the event's snapshot, so an older event
arriving late (``created`` after ``updated``) cannot undo a newer one.

What each event does:

* ``checkout.session.completed``: links the Stripe customer to the team, marks the upgrade request
  approved, syncs the new subscription (members get the plan's tier at once).
* ``customer.subscription.created`` / ``.updated`` / ``.deleted``: sync the subscription (upgrade at once,
  downgrade at the period's end, cancellation to the free tier).
* ``invoice.paid`` (and ``invoice.payment_succeeded``, which older API versions and the test fake send):
  store the invoice for the usage page, end a grace period, sync the subscription.
* ``invoice.payment_failed``: store the invoice, start the grace period (``BILLING_GRACE_PERIOD_DAYS``
  from the failure), sync the subscription.

Other event types are acknowledged and ignored.
"""

from __future__ import annotations

import json
import logging

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing import stripe_api
from billing.models import UpgradeRequest
from billing.subscription_models import Invoice, StripeCustomer, StripeEvent, Subscription
from billing.subscriptions import (
    UnknownCustomer,
    from_timestamp,
    organization_id_for,
    subscription_grace_end,
    subscription_grace_start,
    subscription_sync,
)

logger = logging.getLogger(__name__)


class InvalidEvent(ValueError):
    """The body is not a Stripe event (not JSON, or no id/type/data.object)."""


def event_parse(*, payload: bytes, signature: str) -> dict:
    """Verify ``signature`` (the ``Stripe-Signature`` header) and parse the body. Raises
    ``stripe.SignatureVerificationError`` (forged, stale or unsigned) or :class:`InvalidEvent`."""
    stripe_api.signature_verify(payload=payload, signature=signature)
    try:
        event = json.loads(payload)
        event["data"]["object"], event["id"], event["type"]  # noqa: B018 (shape check)
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidEvent("not a Stripe event") from exc
    return event


def _subscription_refresh(subscription_id: str) -> Subscription:
    return subscription_sync(data=stripe_api.subscription_retrieve(subscription_id))


def _invoice_subscription_id(invoice: dict) -> str:
    """The subscription of an invoice: ``parent.subscription_details.subscription`` in newer API versions,
    ``subscription`` in older ones ("" when none)."""
    details = ((invoice.get("parent") or {}).get("subscription_details") or {}).get("subscription")
    sub = details or invoice.get("subscription") or ""
    return sub if isinstance(sub, str) else sub.get("id", "")


def _invoice_store(invoice: dict) -> None:
    org_id = organization_id_for(customer_id=invoice["customer"], metadata=invoice.get("metadata"))
    sub_id = _invoice_subscription_id(invoice)
    Invoice.objects.update_or_create(
        stripe_invoice_id=invoice["id"],
        defaults={
            "organization_id": org_id,
            "subscription": Subscription.objects.filter(stripe_subscription_id=sub_id).first()
            if sub_id
            else None,
            "number": invoice.get("number") or "",
            "status": invoice.get("status") or "",
            "amount_due": invoice.get("amount_due") or 0,
            "amount_paid": invoice.get("amount_paid") or 0,
            "currency": invoice.get("currency") or "usd",
            "hosted_invoice_url": invoice.get("hosted_invoice_url") or "",
            "created": from_timestamp(invoice.get("created")) or timezone.now(),
        },
    )


def on_checkout_completed(obj: dict, event: dict) -> None:
    if obj.get("mode") not in (None, "subscription"):
        return
    metadata = obj.get("metadata") or {}
    org_id = organization_id_for(customer_id=obj["customer"], metadata=metadata)
    StripeCustomer.objects.get_or_create(organization_id=org_id, defaults={"customer_id": obj["customer"]})
    if obj.get("client_reference_id"):
        UpgradeRequest.objects.filter(
            provider="stripe", provider_reference=obj["id"], status=UpgradeRequest.Status.PENDING
        ).update(status=UpgradeRequest.Status.APPROVED, decided_at=timezone.now())
    if obj.get("subscription"):
        sub = obj["subscription"]
        _subscription_refresh(sub if isinstance(sub, str) else sub["id"])


def on_subscription_event(obj: dict, event: dict) -> None:
    organization_id_for(
        customer_id=obj["customer"], metadata=obj.get("metadata")
    )  # ours? before calling Stripe
    _subscription_refresh(obj["id"])


def on_invoice_paid(obj: dict, event: dict) -> None:
    _invoice_store(obj)
    sub_id = _invoice_subscription_id(obj)
    if sub_id:
        subscription_grace_end(subscription_id=sub_id)
        _subscription_refresh(sub_id)


def on_invoice_payment_failed(obj: dict, event: dict) -> None:
    _invoice_store(obj)
    sub_id = _invoice_subscription_id(obj)
    if sub_id:
        subscription_grace_start(
            subscription_id=sub_id, failed_at=from_timestamp(event.get("created")) or timezone.now()
        )
        _subscription_refresh(sub_id)


HANDLERS = {
    "checkout.session.completed": on_checkout_completed,
    "customer.subscription.created": on_subscription_event,
    "customer.subscription.updated": on_subscription_event,
    "customer.subscription.deleted": on_subscription_event,
    "invoice.paid": on_invoice_paid,
    "invoice.payment_succeeded": on_invoice_paid,
    "invoice.payment_failed": on_invoice_payment_failed,
}


def event_handle(*, event: dict) -> str:
    """Apply one verified event. Returns ``"handled"``, ``"duplicate"`` (this event id was handled before:
    nothing done), ``"ignored"`` (a type chatsite does not use) or ``"not_ours"`` (a customer chatsite did
    not create, e.g. another product on the same Stripe account: nothing stored, not retried). Raises
    whatever else the handler raises (a Stripe API error): nothing is stored then, Stripe retries."""
    handler = HANDLERS.get(event["type"])
    if handler is None:
        return "ignored"
    try:
        with transaction.atomic():
            try:
                with transaction.atomic():
                    StripeEvent.objects.create(
                        event_id=event["id"],
                        type=event["type"],
                        created=from_timestamp(event.get("created")) or timezone.now(),
                    )
            except IntegrityError:
                return "duplicate"
            handler(event["data"]["object"], event)
    except UnknownCustomer as exc:
        logger.info(
            "stripe event %s (%s) names customer %s, not one of ours", event["id"], event["type"], exc
        )
        return "not_ours"
    logger.info("stripe event %s (%s) handled", event["id"], event["type"])
    return "handled"
