"""Every call chatsite makes to Stripe, through the official ``stripe`` client (pinned in requirements.txt).

One module so the list of calls is easy to audit against the docs (docs/billing-and-sso.md lists which of
them the tests run against ``localstripe``). Objects come back as plain dicts. Errors are the library's
``stripe.StripeError`` subclasses; callers turn them into a message for the user or an HTTP 500 (so Stripe
retries a webhook).
"""

from __future__ import annotations

import stripe
from django.conf import settings


def stripe_client() -> stripe.StripeClient:
    """A client for ``STRIPE_SECRET_KEY``, sent to ``STRIPE_API_BASE`` when set (a local fake in tests)."""
    base = settings.STRIPE_API_BASE
    return stripe.StripeClient(
        settings.STRIPE_SECRET_KEY,
        base_addresses={"api": base} if base else None,
        max_network_retries=2,
    )


def customer_create(*, organization_id: int, email: str, name: str) -> str:
    """A Stripe customer for a team (metadata ``organization_id``); returns its id. Idempotent per team."""
    customer = stripe_client().v1.customers.create(
        params={"email": email, "name": name, "metadata": {"organization_id": str(organization_id)}},
        options={"idempotency_key": f"chatsite-customer-{organization_id}"},
    )
    return customer.id


def checkout_session_create(
    *,
    customer_id: str,
    line_items: list[dict],
    success_url: str,
    cancel_url: str,
    reference: str,
    metadata: dict[str, str],
) -> dict:
    """A Checkout Session in subscription mode; returns ``{"id", "url"}`` (send the user to ``url``)."""
    session = stripe_client().v1.checkout.sessions.create(
        params={
            "mode": "subscription",
            "customer": customer_id,
            "line_items": line_items,
            "success_url": success_url,
            "cancel_url": cancel_url,
            "client_reference_id": reference,
            "metadata": metadata,
            "subscription_data": {"metadata": metadata},
        },
        options={"idempotency_key": f"chatsite-checkout-{reference}"},
    )
    return {"id": session.id, "url": session.url}


def portal_session_create(*, customer_id: str, return_url: str) -> str:
    """A customer portal session (card changes, invoices, cancellation); returns its URL."""
    return (
        stripe_client()
        .v1.billing_portal.sessions.create(params={"customer": customer_id, "return_url": return_url})
        .url
    )


def subscription_retrieve(subscription_id: str) -> dict:
    """The subscription as Stripe has it now."""
    return stripe_client().v1.subscriptions.retrieve(subscription_id).to_dict()


def subscription_change_price(*, subscription_id: str, item_id: str, price_id: str, upgrade: bool) -> dict:
    """Move subscription item ``item_id`` to ``price_id``: an upgrade is prorated and invoiced at once, a
    downgrade is not prorated (chatsite keeps the paid tier until the period ends)."""
    return (
        stripe_client()
        .v1.subscriptions.update(
            subscription_id,
            params={
                "items": [{"id": item_id, "price": price_id}],
                "proration_behavior": "create_prorations" if upgrade else "none",
            },
        )
        .to_dict()
    )


def subscription_set_quantity(*, subscription_id: str, item_id: str, quantity: int) -> dict:
    """Set the seats (quantity) of subscription item ``item_id``, prorated."""
    return (
        stripe_client()
        .v1.subscriptions.update(
            subscription_id,
            params={
                "items": [{"id": item_id, "quantity": quantity}],
                "proration_behavior": "create_prorations",
            },
        )
        .to_dict()
    )


def subscription_cancel_at_period_end(*, subscription_id: str) -> dict:
    """Cancel at the end of the paid period (Stripe then sends ``customer.subscription.deleted``)."""
    return (
        stripe_client()
        .v1.subscriptions.update(subscription_id, params={"cancel_at_period_end": True})
        .to_dict()
    )


def meter_event_create(*, event_name: str, customer_id: str, value: int, identifier: str) -> None:
    """Report ``value`` metered tokens for ``customer_id`` to the billing meter ``event_name``.
    ``identifier`` makes a retried report count once (Stripe deduplicates on it)."""
    stripe_client().v1.billing.meter_events.create(
        params={
            "event_name": event_name,
            "identifier": identifier,
            "payload": {"stripe_customer_id": customer_id, "value": str(value)},
        }
    )


def signature_verify(*, payload: bytes, signature: str) -> None:
    """Check a webhook's ``Stripe-Signature`` header against ``STRIPE_WEBHOOK_SECRET`` (HMAC-SHA256 of
    ``"<t>.<payload>"``, timestamp within ``STRIPE_WEBHOOK_TOLERANCE_S``). Raises
    ``stripe.SignatureVerificationError``."""
    stripe.WebhookSignature.verify_header(
        payload.decode("utf-8"),
        signature,
        settings.STRIPE_WEBHOOK_SECRET,
        tolerance=settings.STRIPE_WEBHOOK_TOLERANCE_S,
    )
